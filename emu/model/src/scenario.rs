//! Prints a schedule as a test for emu-proto's packet-level harness (`tests/rc_pair.rs`), which
//! replays it with `Pair::replay`: the same set-up as [`crate::system`], every datagram held,
//! then the choices one by one.

use std::fmt::Write as _;

use crate::config::{Config, Op, Recvs, Side};
use crate::explore::Violation;
use crate::system::{
    Choice, RECV_WR_BASE, System, atomic_add, atomic_init, atomic_swap, imm_of, pattern,
};

fn node(side: Side) -> &'static str {
    match side {
        Side::A => "a",
        Side::B => "b",
    }
}

/// The scenario as Rust source for `rc_pair.rs`. Two-pair configurations are printed too,
/// but the harness has one QP per node, so they need a second QP there first.
pub fn render(cfg: &Config, v: &Violation) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "/// Found by emu-model, configuration `{}`:", cfg.name);
    let _ = writeln!(s, "/// {}", v.message);
    if cfg.pairs > 1 {
        let _ = writeln!(
            s,
            "/// (two QP pairs: pair 1 needs a second QP in the harness)"
        );
    }
    let _ = writeln!(s, "#[test]");
    let _ = writeln!(s, "fn model_{}() {{", cfg.name.replace('-', "_"));
    let _ = writeln!(
        s,
        "    let mut p = Pair::with(Opts {{ mtu: Mtu::{:?}, timeout: {}, retry_cnt: {}, rnr_retry: {}, \
         min_rnr_timer: {}, max_rd_atomic: {m}, max_dest_rd_atomic: {m}, ..Opts::default() }});",
        cfg.mtu,
        cfg.timeout,
        cfg.retry_cnt,
        cfg.rnr_retry,
        cfg.min_rnr_timer,
        m = cfg.max_rd_atomic
    );
    let slot = cfg.slot();
    for (k, wr) in cfg.wrs.iter().enumerate() {
        let (l, r) = (slot * k as u64, slot * k as u64 + slot / 2);
        let (me, peer) = (node(wr.from), node(wr.from.peer()));
        match wr.op {
            Op::Read => {
                let _ = writeln!(
                    s,
                    "    let mr = p.{peer}.mr; p.{peer}.write(&mr, {r:#x}, &{:?});",
                    pattern(k, cfg.len)
                );
            }
            Op::FetchAdd | Op::CmpSwap => {
                let _ = writeln!(
                    s,
                    "    let mr = p.{peer}.mr; p.{peer}.write(&mr, {r:#x}, &{:#x}u64.to_ne_bytes());",
                    atomic_init(k)
                );
            }
            Op::Send | Op::Write | Op::WriteImm => {
                let _ = writeln!(
                    s,
                    "    let mr = p.{me}.mr; p.{me}.write(&mr, {l:#x}, &{:?});",
                    pattern(k, cfg.len)
                );
            }
        }
    }
    if cfg.recvs == Recvs::Posted {
        for side in [Side::A, Side::B] {
            for pair in 0..cfg.pairs {
                for k in System::recv_list(cfg, side, pair) {
                    let _ = writeln!(s, "    {}", post_recv(cfg, side, k));
                }
            }
        }
    }
    for (k, wr) in cfg.wrs.iter().enumerate() {
        let (l, r) = (slot * k as u64, cfg.target(k));
        let peer = node(wr.from.peer());
        let ra = format!("remote_addr: p.{peer}.va({r:#x}), rkey: p.{peer}.mr.rkey");
        let op = match wr.op {
            Op::Send => "SendOp::Send".to_string(),
            Op::Write => format!("SendOp::RdmaWrite {{ {ra} }}"),
            Op::WriteImm => format!("SendOp::RdmaWriteWithImm {{ {ra}, imm: {:#x} }}", imm_of(k)),
            Op::Read => format!("SendOp::RdmaRead {{ {ra} }}"),
            Op::FetchAdd => format!(
                "SendOp::AtomicFetchAndAdd {{ {ra}, add: {:#x} }}",
                atomic_add(k)
            ),
            Op::CmpSwap => format!(
                "SendOp::AtomicCmpAndSwp {{ {ra}, compare: {:#x}, swap: {:#x} }}",
                atomic_init(k),
                atomic_swap(k)
            ),
        };
        let _ = writeln!(
            s,
            "    let sge = [p.{me}.at({l:#x}, {len})]; p.post_{me}(&[SendWr::new({k}, {op}, &sge)]);",
            me = node(wr.from),
            len = cfg.len_of(wr.op)
        );
    }
    let _ = writeln!(s, "    p.set_filter(|_| Action::Hold);");
    let _ = writeln!(s, "    p.transmit();");
    let _ = writeln!(s, "    p.replay(&[");
    let mut posted = [vec![0usize; cfg.pairs], vec![0usize; cfg.pairs]];
    for c in &v.schedule {
        let line = match *c {
            Choice::Deliver(i) => format!("Step::Deliver({i})"),
            Choice::Drop(i) => format!("Step::Drop({i})"),
            Choice::Duplicate(i) => format!("Step::Duplicate({i})"),
            Choice::Fire => "Step::Fire".to_string(),
            Choice::PostRecv { side, pair } => {
                let list = System::recv_list(cfg, side, pair);
                let n = &mut posted[side.index()][pair];
                let k = list.get(*n).copied().unwrap_or(usize::MAX);
                *n += 1;
                let (wr_id, off) = (RECV_WR_BASE + k as u64, slot * k as u64 + slot / 2);
                format!(
                    "Step::PostRecv(Side::{side:?}, {wr_id}, {off:#x}, {})",
                    cfg.len
                )
            }
        };
        let _ = writeln!(s, "        {line},");
    }
    let _ = writeln!(s, "    ]);");
    let _ = writeln!(
        s,
        "    // Assert here what the violation above says should have held."
    );
    let _ = writeln!(s, "}}");
    s
}

fn post_recv(cfg: &Config, side: Side, k: usize) -> String {
    let slot = cfg.slot();
    format!(
        "p.{n}.post_recv({}, &[p.{n}.at({:#x}, {})]);",
        RECV_WR_BASE + k as u64,
        slot * k as u64 + slot / 2,
        cfg.len,
        n = node(side)
    )
}

/// One line per datagram: direction, opcode, PSN and acknowledgement syndrome.
pub fn datagram(d: &crate::system::Datagram) -> String {
    use emu_proto::wire::{Packet, PacketRepr};
    let dir = match d.from {
        Side::A => "a→b",
        Side::B => "b→a",
    };
    match Packet::new_checked(d.bytes.as_slice()).and_then(|p| PacketRepr::parse(&p)) {
        Ok(p) => {
            let aeth = p
                .aeth
                .map(|a| format!(" {:?} msn {}", a.syndrome, a.msn))
                .unwrap_or_default();
            format!(
                "{dir} {:?} psn {:#x}{aeth}",
                p.bth.opcode,
                p.bth.psn.value()
            )
        }
        Err(e) => format!("{dir} unparsable: {e:?}"),
    }
}

/// Replays `schedule` from the initial state and narrates it: each choice, what it acted on,
/// then the flight, the completions and the QP states after it.
pub fn narrate(cfg: &Config, schedule: &[Choice]) -> String {
    let mut s = String::new();
    let mut sys = match System::new(cfg) {
        Ok(sys) => sys,
        Err(e) => return e,
    };
    let show = |s: &mut String, sys: &System| {
        for (i, d) in sys.flight.iter().enumerate() {
            let _ = writeln!(s, "      [{i}] {}", datagram(d));
        }
        for side in [Side::A, Side::B] {
            let n = &sys.nodes[side.index()];
            for pair in 0..cfg.pairs {
                let wcs: Vec<String> = n.send_wcs[pair]
                    .iter()
                    .chain(&n.recv_wcs[pair])
                    .map(|w| format!("{}:{:?}", w.wr_id, w.status))
                    .collect();
                let _ = writeln!(
                    s,
                    "      {side:?}{pair} {:?} wcs [{}]",
                    n.qp_state(pair),
                    wcs.join(", ")
                );
            }
        }
    };
    let _ = writeln!(s, "initial");
    show(&mut s, &sys);
    for (n, c) in schedule.iter().enumerate() {
        let what = match *c {
            Choice::Deliver(i) | Choice::Drop(i) | Choice::Duplicate(i) => {
                sys.flight.get(i).map(datagram).unwrap_or_default()
            }
            _ => String::new(),
        };
        let _ = writeln!(s, "{n}: {c:?} {what}");
        if let Err(e) = sys.step(cfg, *c) {
            let _ = writeln!(s, "   error: {e}");
            break;
        }
        show(&mut s, &sys);
    }
    s
}
