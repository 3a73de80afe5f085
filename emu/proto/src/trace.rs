//! The engine's `tracing` events: the packet summary of `pkt.tx`/`pkt.rx` and the span of a
//! device. Field and `kind` names are listed in `emu-trace`'s `kind` module; the ladder reads
//! them. Nothing here runs unless a subscriber enables the event.
//!
//! What it is not: no subscriber, no formatting of its own beyond the opcode name.

use std::net::SocketAddr;

use crate::wire::{BTH_LEN, Bth, Opcode};

/// `kind` of a packet the engine built.
pub(crate) const PKT_TX: &str = "pkt.tx";
/// `kind` of a packet the engine took in.
pub(crate) const PKT_RX: &str = "pkt.rx";

/// The opcode's IBTA name, or `0xNN` for a byte with no RC name (UD, UC, CNP).
pub fn opcode_label(op: Opcode) -> String {
    match op {
        Opcode::Unknown(b) if b == crate::ud::SEND_ONLY => "UD_SEND_ONLY".to_owned(),
        Opcode::Unknown(b) if b == crate::ud::SEND_ONLY_WITH_IMMEDIATE => {
            "UD_SEND_ONLY_WITH_IMMEDIATE".to_owned()
        }
        Opcode::Unknown(b) => format!("{b:#04x}"),
        op => op.name().to_owned(),
    }
}

/// One `debug` event for the RoCEv2 UDP payload `bytes` of kind `kind` ([`PKT_TX`] towards
/// `peer`, [`PKT_RX`] from it): opcode, PSN, destination QP, AckReq, AETH syndrome, length.
#[inline]
pub(crate) fn packet(kind: &'static str, bytes: &[u8], peer: SocketAddr) {
    if tracing::level_enabled!(tracing::Level::DEBUG) {
        packet_event(kind, bytes, peer);
    }
}

#[inline(never)]
fn packet_event(kind: &'static str, bytes: &[u8], peer: SocketAddr) {
    let Ok(bth) = Bth::new_checked(bytes) else {
        tracing::debug!(kind, len = bytes.len(), peer = %peer, "packet without a BTH");
        return;
    };
    let op = bth.opcode();
    let syndrome = op
        .ext_headers()
        .filter(|h| h.aeth)
        .and_then(|_| bytes.get(BTH_LEN).copied());
    tracing::debug!(
        kind,
        opcode = %opcode_label(op),
        psn = bth.psn().value(),
        dqp = bth.dest_qp(),
        ackreq = bth.ack_req(),
        syndrome,
        len = bytes.len(),
        peer = %peer,
    );
}
