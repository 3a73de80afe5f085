//! What the requester (`rc/requester.rs`) checks before it sends a WQE and what it counts as it
//! sends (issue 17 item 2): the local SGE checks at the edges of an MR (rc-transport.md §7.4,
//! §3.9), and the per-QP counters of packets and payload bytes sent.
//!
//! The wire delivers everything (b answers as a responder does); the tests look at a's packets,
//! completions and counters.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{ALL_ACCESS, Dir, Node, Pair};
use verbs_api::{SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion};

/// The path MTU of the default options.
const MTU: u64 = 256;

/// (wr_id, status, opcode, byte_len) of completions.
fn brief(wcs: &[WorkCompletion]) -> Vec<(u64, WcStatus, WcOpcode, u32)> {
    wcs.iter()
        .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
        .collect()
}

/// a SENDs one message gathered from `sges` (b has a receive WQE for it) and runs the pair
/// until idle; returns a's send completions and how many packets a sent.
fn send_from(p: &mut Pair, sges: &[Sge]) -> (Vec<(u64, WcStatus, WcOpcode, u32)>, usize) {
    let r = p.b.at(0, 4096);
    p.b.post_recv(7, &[r]);
    let mark = p.trace.len();
    p.post_a(&[SendWr::new(1, SendOp::Send, sges)]);
    assert!(p.run_until_idle());
    (brief(&p.a.send_wcs()), p.seen_since(mark, Dir::AtoB).len())
}

/// An SGE that ends exactly at the end of its MR is inside it: the message goes and its bytes
/// arrive. One that ends a byte past the end, or starts a byte before the MR, fails the WQE with
/// LOC_PROT_ERR before any packet goes — even the packets whose bytes are inside (§7.4: the
/// whole SGE is checked against the MR when the WQE starts).
#[test]
fn sge_must_lie_inside_its_mr() {
    let mut p = Pair::new();
    let mr = p.a.reg(4096, ALL_ACCESS);
    let data: Vec<u8> = (0..600u32).map(|i| i as u8).collect();
    p.a.write(&mr, 4096 - 600, &data);
    let at_end = Node::sge(&mr, 4096 - 600, 600);
    assert_eq!(
        send_from(&mut p, &[at_end]),
        (vec![(1, WcStatus::Success, WcOpcode::Send, 600)], 3)
    );
    assert_eq!(p.b.read(&p.b.mr, 0, 600), data);

    for (n, sge) in [
        Node::sge(&mr, 4096 - 599, 600),
        Sge {
            addr: mr.iova - 1,
            ..Node::sge(&mr, 0, 600)
        },
    ]
    .into_iter()
    .enumerate()
    {
        let mut p = Pair::new();
        let mr2 = p.a.reg(4096, ALL_ACCESS);
        assert_eq!(mr2.lkey, mr.lkey);
        assert_eq!(
            send_from(&mut p, &[sge]),
            (vec![(1, WcStatus::LocProtErr, WcOpcode::Send, 0)], 0),
            "case {n}"
        );
    }
}

/// An SGE of length 0 names no bytes: its key is not checked, and the message is gathered from
/// the others.
#[test]
fn empty_sge_with_an_unknown_key_is_ignored() {
    let mut p = Pair::new();
    p.a.write(&p.a.mr, 0, b"hello");
    let empty = Sge {
        addr: 0,
        length: 0,
        lkey: 0x00ff_ff00,
    };
    let sges = [empty, p.a.at(0, 5), empty];
    assert_eq!(
        send_from(&mut p, &sges),
        (vec![(1, WcStatus::Success, WcOpcode::Send, 5)], 1)
    );
    assert_eq!(p.b.read(&p.b.mr, 0, 5), b"hello");
}

/// `sent_pkts` counts every request packet and `sent_bytes` their payload: a 600-byte SEND is
/// three packets and 600 bytes, a 300-byte WRITE two packets and 300 bytes, a READ request one
/// packet and no payload bytes.
#[test]
fn sent_counters_count_packets_and_payload_bytes() {
    let mut p = Pair::new();
    let r = p.b.at(0, 4096);
    p.b.post_recv(7, &[r]);
    let (va, rkey) = (p.b.va(8192), p.b.mr.rkey);
    let (s600, s300, dst) = (
        [p.a.at(0, 600)],
        [p.a.at(0, 300)],
        [p.a.at(1024, 2 * MTU as u32)],
    );
    let wrs = [
        SendWr::new(1, SendOp::Send, &s600),
        SendWr::new(
            2,
            SendOp::RdmaWrite {
                remote_addr: va,
                rkey,
            },
            &s300,
        ),
        SendWr::new(
            3,
            SendOp::RdmaRead {
                remote_addr: va,
                rkey,
            },
            &dst,
        ),
    ];
    p.post_a(&wrs);
    assert!(p.run_until_idle());
    assert_eq!(
        brief(&p.a.send_wcs()),
        [
            (1, WcStatus::Success, WcOpcode::Send, 600),
            (2, WcStatus::Success, WcOpcode::RdmaWrite, 300),
            (3, WcStatus::Success, WcOpcode::RdmaRead, 512),
        ]
    );
    assert_eq!(p.seen(Dir::AtoB).len(), 6);
    let a = p.a.stats();
    assert_eq!((a.sent_pkts, a.sent_bytes), (6, 900));
}

/// A request packet that does not fit the buffer the caller of `poll_transmit` offers cannot
/// be built: nothing is sent, the packet counts as dropped and its WQE fails with
/// LOC_QP_OP_ERR, which moves the QP to ERR.
#[test]
fn request_that_does_not_fit_the_transmit_buffer_fails_its_wqe() {
    let mut p = Pair::new();
    let s = [p.a.at(0, 200)];
    p.post_a(&[SendWr::new(1, SendOp::Send, &s)]);
    let mut small = [0u8; 64];
    let now = p.now;
    assert!(p.a.hca.poll_transmit(now, &p.a.mem, &mut small).is_none());
    assert_eq!(
        brief(&p.a.send_wcs()),
        [(1, WcStatus::LocQpOpErr, WcOpcode::Send, 0)]
    );
    assert_eq!(p.a.state(), verbs_api::QpState::Err);
    let a = p.a.stats();
    assert_eq!((a.dropped, a.sent_pkts), (1, 0));
}

/// A SEND with invalidate of two packets is SEND_FIRST then SEND_LAST_WITH_INVALIDATE carrying
/// the R_Key in its IETH (rc-transport.md §3.1: the IETH rides on the last packet only).
#[test]
fn multi_packet_send_with_invalidate_ends_with_its_own_opcode() {
    let mut p = Pair::new();
    p.set_filter(|_| common::Action::Drop);
    let s = [p.a.at(0, 300)];
    let op = SendOp::SendWithInv {
        invalidate_rkey: 0x1234_5678,
    };
    p.post_a(&[SendWr::new(1, op, &s)]);
    assert!(p.flush());
    let ops: Vec<_> = p.seen(Dir::AtoB).iter().map(|s| (s.op, s.psn)).collect();
    let first = p.opts.a_psn;
    assert_eq!(
        ops,
        [
            (emu_proto::wire::Opcode::SendFirst, first),
            (emu_proto::wire::Opcode::SendLastWithInvalidate, first + 1),
        ]
    );
}
