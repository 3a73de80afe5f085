//! Behaviour tests of the injector and of plan files.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod injector;
mod plan;

use emu_proto::Instant;
use emu_proto::wire::{Opcode, Psn};

use crate::{DatagramMeta, NodeId};

const A: NodeId = NodeId(1);
const B: NodeId = NodeId(2);
const C: NodeId = NodeId(3);
const D: NodeId = NodeId(4);

/// A 64-byte SEND_ONLY from `src` to `dst`, QPN 0x11, PSN 0.
fn meta(src: NodeId, dst: NodeId) -> DatagramMeta {
    DatagramMeta {
        src,
        dst,
        dest_qpn: 0x11,
        opcode: Opcode::SendOnly,
        psn: Psn::new(0),
        aeth_syndrome: None,
        len: 64,
    }
}

fn ns(n: u64) -> Instant {
    Instant::from_nanos(n)
}
