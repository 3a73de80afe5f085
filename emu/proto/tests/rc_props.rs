//! Property tests of the RC engine (issue 4, item 9): random sequences of every operation
//! (SEND ± imm, WRITE ± imm, READ, CMP_SWAP, FETCH_ADD; 0..=3 MTUs; random SGE splits, inline,
//! fences, unsignaled WRs) posted in batches on both QPs of a connected pair, under seeded random
//! loss, duplication and reordering of packets in both directions, in virtual time.
//!
//! * `lossy_network_completes_everything_exactly_once`: with a fault rate inside the retry budget
//!   (`retry_cnt` 7, small `timeout`), every signaled WR completes exactly once, in posting order,
//!   with SUCCESS; received data, written memory, read-back buffers and atomic results equal a
//!   reference model; both QPs end in RTS with no timer armed (rc-transport.md §2–§4).
//! * `partition_fails_one_wr_and_flushes_the_rest`: the same, but the network partitions for
//!   good at a random step: each QP reports SUCCESS for a prefix of its signaled WRs, then
//!   RETRY_EXC_ERR for exactly one WR and WR_FLUSH_ERR for every later one (signaled or not);
//!   nothing succeeds after the error and no WR is lost silently (§3.9, §6.1, §6.3).
//!
//! Fixed seeds and bounded case counts: deterministic, ~10 s in a debug build.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::cell::Cell;
use std::rc::Rc;

use common::{Action, Node, Opts, Pair, Side};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError};
use verbs_api::{QpState, Recovery, SendFlags, SendOp, SendWr, Sge, WcFlags, WcOpcode, WcStatus};

/// Deterministic 64-bit generator (SplitMix64) for layouts and fault decisions.
#[derive(Clone, Debug)]
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// True with probability `permille` / 1000.
    fn chance(&mut self, permille: u64) -> bool {
        self.below(1000) < permille
    }
}

// ---- memory layout of each node's 64 KiB MR ----------------------------------------------

/// Constant source bytes: gathered by SEND/WRITE, read by the peer's READs.
const SRC: u64 = 0;
const SRC_LEN: u64 = 16 * 1024;
/// Targets of the peer's WRITEs.
const WTGT: u64 = 16 * 1024;
/// Local destinations: receive buffers and READ destinations.
const DEST: u64 = 32 * 1024;
/// Atomic result slots (8 bytes each).
const SLOTS: u64 = 56 * 1024;
/// The two words the peer's atomics operate on.
const WORDS: u64 = 60 * 1024;

const MTU: u32 = 256;

/// One generated operation (the layout is derived from `seed`).
#[derive(Clone, Debug)]
struct OpSpec {
    from_b: bool,
    kind: u8,
    len: u32,
    signaled: bool,
    seed: u64,
}

fn op_spec() -> impl Strategy<Value = OpSpec> {
    (
        prop::bool::weighted(0.35),
        0u8..7,
        prop_oneof![1 => Just(0u32), 2 => 1u32..=MTU, 3 => (MTU + 1)..=3 * MTU],
        prop::bool::weighted(0.85),
        any::<u64>(),
    )
        .prop_map(|(from_b, kind, len, signaled, seed)| OpSpec {
            from_b,
            kind,
            len,
            signaled,
            seed,
        })
}

/// What a WR must produce.
#[derive(Clone, Debug)]
struct Planned {
    from: Side,
    wr_id: u64,
    op: SendOp,
    signaled: bool,
    flags: SendFlags,
    gather: Vec<Sge>,
    inline: Vec<u8>,
    /// Bytes the WR moves (8 for atomics).
    len: u32,
    /// The message (SEND/WRITE payload, or the bytes a READ must fetch).
    msg: Vec<u8>,
    /// READ: the local pieces (node memory, offset, length) the data must land in.
    read_dest: Vec<(u64, u32)>,
    /// WRITE: offset in the peer's MR that must hold `msg`.
    write_target: Option<u64>,
    /// Atomics: (result slot offset, expected original value).
    atomic: Option<(u64, u64)>,
    /// Consumes a receive WQE at the peer.
    recv: Option<RecvPlan>,
}

/// A receive WQE a WR consumes: (recv wr_id, immediate data, its SGE pieces (offset, length)).
type RecvPlan = (u64, Option<u32>, Vec<(u64, u32)>);

/// Per-node allocation cursors.
#[derive(Debug)]
struct Cursors {
    wtgt: u64,
    dest: u64,
    slot: u64,
    /// Model of this node's two atomic words (changed by the peer's atomics).
    words: [u64; 2],
    recv_id: u64,
}

impl Cursors {
    fn new() -> Cursors {
        Cursors {
            wtgt: WTGT,
            dest: DEST,
            slot: SLOTS,
            words: [0; 2],
            recv_id: 0,
        }
    }

    fn dest(&mut self, len: u32) -> u64 {
        let at = self.dest;
        self.dest += u64::from(len) + 8;
        assert!(self.dest <= SLOTS);
        at
    }
}

/// Splits `len` into 1..=3 pieces (zero-length pieces allowed).
fn split(len: u32, rng: &mut Mix) -> Vec<u32> {
    let k = 1 + rng.below(3) as usize;
    let mut cuts: Vec<u32> = (1..k)
        .map(|_| rng.below(u64::from(len) + 1) as u32)
        .collect();
    cuts.sort_unstable();
    let mut out = Vec::with_capacity(k);
    let mut prev = 0;
    for c in cuts.into_iter().chain([len]) {
        out.push(c - prev);
        prev = c;
    }
    out
}

fn source(side: Side) -> Vec<u8> {
    let seed: u8 = if side == Side::A { 11 } else { 97 };
    (0..SRC_LEN as usize)
        .map(|i| (i as u8).wrapping_mul(seed).wrapping_add((i >> 8) as u8))
        .collect()
}

/// Turns the generated specs into WRs, receive WQEs and expectations.
fn plan(p: &Pair, specs: &[OpSpec]) -> Vec<Planned> {
    let mut cur = [Cursors::new(), Cursors::new()];
    let srcs = [source(Side::A), source(Side::B)];
    let mut out = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let (from, me, peer) = if spec.from_b {
            (Side::B, 1, 0)
        } else {
            (Side::A, 0, 1)
        };
        let (my_mr, peer_mr) = match from {
            Side::A => (p.a.mr, p.b.mr),
            Side::B => (p.b.mr, p.a.mr),
        };
        let mut rng = Mix(spec.seed);
        let wr_id = 1000 + i as u64;
        let imm = rng.next() as u32;
        let mut flags = if spec.signaled {
            SendFlags::SIGNALED
        } else {
            SendFlags::empty()
        };
        if rng.chance(100) {
            flags |= SendFlags::FENCE;
        }
        if rng.chance(50) {
            flags |= SendFlags::SOLICITED;
        }
        let len = spec.len;
        // Gather pieces from the constant source region.
        let pieces = split(len, &mut rng);
        let mut gather = Vec::new();
        let mut msg = Vec::new();
        for &pl in &pieces {
            let off = rng.below(SRC_LEN - u64::from(pl) + 1);
            gather.push(Node::sge(&my_mr, SRC + off, pl));
            msg.extend_from_slice(&srcs[me][off as usize..off as usize + pl as usize]);
        }
        let mut planned = Planned {
            from,
            wr_id,
            op: SendOp::Send,
            signaled: spec.signaled,
            flags,
            gather,
            inline: Vec::new(),
            len,
            msg,
            read_dest: Vec::new(),
            write_target: None,
            atomic: None,
            recv: None,
        };
        let inline_ok = len <= p.opts.cap.max_inline_data && rng.chance(250);
        match spec.kind {
            0 | 1 => {
                planned.op = if spec.kind == 0 {
                    SendOp::Send
                } else {
                    SendOp::SendWithImm { imm }
                };
                let extra = rng.below(17) as u32;
                let rpieces: Vec<(u64, u32)> = split(len + extra, &mut rng)
                    .into_iter()
                    .map(|pl| (cur[peer].dest(pl), pl))
                    .collect();
                cur[peer].recv_id += 1;
                let rid = cur[peer].recv_id;
                planned.recv = Some((rid, planned.op.imm(), rpieces));
            }
            2 | 3 => {
                let target = cur[peer].wtgt;
                cur[peer].wtgt += u64::from(len) + 8;
                assert!(cur[peer].wtgt <= DEST);
                planned.write_target = Some(target);
                planned.op = if spec.kind == 2 {
                    SendOp::RdmaWrite {
                        remote_addr: peer_mr.iova + target,
                        rkey: peer_mr.rkey,
                    }
                } else {
                    cur[peer].recv_id += 1;
                    let rid = cur[peer].recv_id;
                    planned.recv = Some((rid, Some(imm), Vec::new()));
                    SendOp::RdmaWriteWithImm {
                        remote_addr: peer_mr.iova + target,
                        rkey: peer_mr.rkey,
                        imm,
                    }
                };
            }
            4 => {
                let off = rng.below(SRC_LEN - u64::from(len) + 1);
                planned.op = SendOp::RdmaRead {
                    remote_addr: peer_mr.iova + SRC + off,
                    rkey: peer_mr.rkey,
                };
                planned.msg = srcs[peer][off as usize..off as usize + len as usize].to_vec();
                planned.gather.clear();
                for pl in split(len, &mut rng) {
                    let at = cur[me].dest(pl);
                    planned.gather.push(Node::sge(&my_mr, at, pl));
                    planned.read_dest.push((at, pl));
                }
            }
            _ => {
                let w = rng.below(2) as usize;
                let remote_addr = peer_mr.iova + WORDS + 8 * w as u64;
                let orig = cur[peer].words[w];
                if spec.kind == 5 {
                    let compare = if rng.chance(500) { orig } else { rng.below(8) };
                    let swap = rng.below(8);
                    if orig == compare {
                        cur[peer].words[w] = swap;
                    }
                    planned.op = SendOp::AtomicCmpAndSwp {
                        remote_addr,
                        rkey: peer_mr.rkey,
                        compare,
                        swap,
                    };
                } else {
                    let add = 1 + rng.below(3);
                    cur[peer].words[w] = orig.wrapping_add(add);
                    planned.op = SendOp::AtomicFetchAndAdd {
                        remote_addr,
                        rkey: peer_mr.rkey,
                        add,
                    };
                }
                let slot = cur[me].slot;
                cur[me].slot += 8;
                assert!(cur[me].slot <= WORDS);
                planned.gather = vec![Node::sge(&my_mr, slot, 8)];
                planned.atomic = Some((slot, orig));
                planned.len = 8;
                planned.msg.clear();
            }
        }
        if inline_ok && matches!(spec.kind, 0..=3) {
            planned.inline = planned.msg.clone();
            planned.gather.clear();
            planned.flags |= SendFlags::INLINE;
        }
        if !matches!(spec.kind, 1 | 3) {
            planned.flags -= SendFlags::SOLICITED;
        }
        out.push(planned);
    }
    out
}

/// Fault rates in permille.
#[derive(Copy, Clone, Debug)]
struct Faults {
    drop: u64,
    dup: u64,
    hold: u64,
}

/// Posts the receive WQE that WR `w` will consume at the peer.
fn post_recv_for(p: &mut Pair, w: &Planned) {
    if let Some((rid, _, pieces)) = &w.recv {
        let node = p.node(peer(w.from));
        let mr = node.mr;
        let sges: Vec<Sge> = pieces
            .iter()
            .map(|&(off, len)| Node::sge(&mr, off, len))
            .collect();
        node.post_recv(*rid, &sges);
    }
}

/// Sets up the pair (memory, receive WQEs unless `lazy_recv`) and the fault filter; returns
/// the partition switch.
fn setup(
    p: &mut Pair,
    planned: &[Planned],
    faults: Faults,
    fault_seed: u64,
    lazy_recv: bool,
) -> Rc<Cell<bool>> {
    for side in [Side::A, Side::B] {
        let src = source(side);
        let node = p.node(side);
        let mr = node.mr;
        node.write(&mr, SRC, &src);
    }
    // Receive WQEs, in the order the peer's consuming WRs were posted.
    if !lazy_recv {
        for w in planned {
            post_recv_for(p, w);
        }
    }
    let partition = Rc::new(Cell::new(false));
    let cut = partition.clone();
    let mut rng = Mix(fault_seed);
    p.set_filter(move |_| {
        if cut.get() {
            return Action::Drop;
        }
        let x = rng.below(1000);
        if x < faults.drop {
            Action::Drop
        } else if x < faults.drop + faults.dup {
            Action::Duplicate
        } else if x < faults.drop + faults.dup + faults.hold {
            Action::Hold
        } else {
            Action::Deliver
        }
    });
    partition
}

fn post(p: &mut Pair, w: &Planned) {
    let wr = SendWr {
        wr_id: w.wr_id,
        op: w.op,
        sg_list: &w.gather,
        inline_data: &w.inline,
        flags: w.flags,
        ud: None,
    };
    match w.from {
        Side::A => p.post_a(&[wr]),
        Side::B => p.post_b(&[wr]),
    }
}

/// Drives the pair: posts the WRs in batches at seeded steps (and, with `lazy_recv`, the
/// receive WQEs at random later steps, so RNR NAKs happen), moves packets, releases held ones
/// in seeded order, fires timers when idle; partitions at step `partition_at`. Returns false if
/// the step budget ran out.
fn drive(
    p: &mut Pair,
    planned: &[Planned],
    seed: u64,
    partition: &Rc<Cell<bool>>,
    partition_at: Option<usize>,
    lazy_recv: bool,
) -> bool {
    let mut rng = Mix(seed ^ 0x5555);
    let mut next = 0;
    let mut post_at = 0usize;
    let consumers: Vec<&Planned> = planned.iter().filter(|w| w.recv.is_some()).collect();
    let mut next_recv = if lazy_recv { 0 } else { consumers.len() };
    for step in 0..200_000usize {
        if partition_at == Some(step) {
            partition.set(true);
            p.drop_held();
        }
        if next_recv < consumers.len() && rng.chance(40) {
            post_recv_for(p, consumers[next_recv]);
            next_recv += 1;
        }
        while next < planned.len() && step >= post_at {
            post(p, &planned[next]);
            next += 1;
            if rng.chance(300) {
                post_at = step + rng.below(40) as usize;
            }
        }
        let sent = p.transmit_at_most(1 + rng.below(4) as usize);
        if p.held() > 0 && rng.chance(300) {
            p.release_one(rng.next() as usize);
        }
        let delivered = p.deliver();
        if sent + delivered > 0 {
            continue;
        }
        let deadline = p.next_deadline();
        if p.held() > 0 && (deadline.is_none() || rng.chance(600)) {
            if rng.chance(500) {
                p.release_held(rng.chance(500));
            } else {
                p.release_one(rng.next() as usize);
            }
            continue;
        }
        match deadline {
            Some(t) => {
                p.now = p.now.max(t);
                p.fire_timers();
                if next_recv < consumers.len() && rng.chance(200) {
                    post_recv_for(p, consumers[next_recv]);
                    next_recv += 1;
                }
            }
            None if next < planned.len() => post_at = step,
            None if next_recv < consumers.len() => {
                post_recv_for(p, consumers[next_recv]);
                next_recv += 1;
            }
            None => {
                if partition_at.is_some_and(|s| s > step) {
                    // Idle before the partition time: partition now (nothing changes).
                    partition.set(true);
                }
                return p.held() == 0 && p.in_flight() == 0;
            }
        }
    }
    false
}

fn send_opcode(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Send | SendOp::SendWithImm { .. } => WcOpcode::Send,
        SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
        SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
        SendOp::AtomicCmpAndSwp { .. } => WcOpcode::CompSwap,
        SendOp::AtomicFetchAndAdd { .. } => WcOpcode::FetchAdd,
        SendOp::SendWithInv { .. } => WcOpcode::Send,
        SendOp::BindMw { .. } => WcOpcode::BindMw,
        SendOp::LocalInv { .. } => WcOpcode::LocalInv,
    }
}

fn peer(side: Side) -> Side {
    match side {
        Side::A => Side::B,
        Side::B => Side::A,
    }
}

/// Checks the effects of WR `w`, which completed successfully (or, for the receive side,
/// whose receive completed).
fn check_effects(p: &mut Pair, w: &Planned) -> Result<(), TestCaseError> {
    let node = p.node(w.from);
    let mr = node.mr;
    for (i, &(off, len)) in w.read_dest.iter().enumerate() {
        let start: usize = w.read_dest[..i].iter().map(|d| d.1 as usize).sum();
        prop_assert_eq!(
            node.read(&mr, off, len as usize),
            w.msg[start..start + len as usize].to_vec(),
            "READ {} data",
            w.wr_id
        );
    }
    if let Some((slot, orig)) = w.atomic {
        prop_assert_eq!(node.word(&mr, slot), orig, "atomic {} result", w.wr_id);
    }
    if let Some(target) = w.write_target {
        let peer_node = p.node(peer(w.from));
        let pmr = peer_node.mr;
        prop_assert_eq!(
            peer_node.read(&pmr, target, w.len as usize),
            w.msg.clone(),
            "WRITE {} data",
            w.wr_id
        );
    }
    Ok(())
}

/// Checks one receive completion against the WR that consumed it.
fn check_recv(
    p: &mut Pair,
    w: &Planned,
    wc: &verbs_api::WorkCompletion,
) -> Result<(), TestCaseError> {
    let Some((rid, imm, pieces)) = &w.recv else {
        return Err(TestCaseError::fail("receive without a consuming WR"));
    };
    prop_assert_eq!((wc.wr_id, wc.status), (*rid, WcStatus::Success));
    prop_assert_eq!(wc.byte_len, w.len);
    let want_op = if w.write_target.is_some() {
        WcOpcode::RecvRdmaWithImm
    } else {
        WcOpcode::Recv
    };
    prop_assert_eq!(wc.opcode, want_op);
    prop_assert_eq!(wc.wc_flags.contains(WcFlags::WITH_IMM), imm.is_some());
    if let Some(imm) = imm {
        prop_assert_eq!(wc.imm_data, *imm);
    }
    if w.write_target.is_none() {
        let node = p.node(peer(w.from));
        let mr = node.mr;
        let mut got = Vec::new();
        for &(off, len) in pieces {
            got.extend(node.read(&mr, off, len as usize));
        }
        prop_assert_eq!(
            &got[..w.len as usize],
            &w.msg[..],
            "received data of {}",
            w.wr_id
        );
        prop_assert!(
            got[w.len as usize..].iter().all(|&b| b == 0),
            "bytes past the message"
        );
    }
    Ok(())
}

fn opts(max_rd_atomic: u8) -> Opts {
    Opts {
        timeout: 4,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic,
        max_dest_rd_atomic: 4,
        a_psn: 0xFF_FF00,
        b_psn: 0x12_3456,
        ..Opts::default()
    }
}

fn config(cases: u32, seed: u64) -> Config {
    let mut c = Config::with_cases(cases);
    c.rng_seed = RngSeed::Fixed(seed);
    c.max_shrink_iters = 2000;
    c
}

proptest! {
    #![proptest_config(config(4000, 0x5eed_0011))]

    #[test]
    fn lossy_network_completes_everything_exactly_once(
        specs in prop::collection::vec(op_spec(), 1..14),
        fault_seed in any::<u64>(),
        rd in prop_oneof![Just(1u8), Just(2u8), Just(4u8)],
        level in 0u64..5,
        lazy_recv in prop::bool::weighted(0.3),
    ) {
        check_lossy(Recovery::Ibta, &specs, fault_seed, rd, level, lazy_recv)?;
    }
}

proptest! {
    #![proptest_config(config(1500, 0x5eed_5311))]

    /// The same property with selective repeat on both QPs.
    #[test]
    fn selective_repeat_lossy_network_completes_everything_exactly_once(
        specs in prop::collection::vec(op_spec(), 1..14),
        fault_seed in any::<u64>(),
        rd in prop_oneof![Just(1u8), Just(2u8), Just(4u8)],
        level in 0u64..5,
        lazy_recv in prop::bool::weighted(0.3),
    ) {
        check_lossy(Recovery::SelectiveRepeat, &specs, fault_seed, rd, level, lazy_recv)?;
    }
}

/// The selective-repeat property above exercises out-of-order placement: over 300 of its
/// cases, RDMA WRITE packets that arrived past a gap were placed on arrival (and the property
/// held for each).
#[test]
fn selective_repeat_property_covers_placement_on_arrival() {
    let placed = std::cell::Cell::new(0u64);
    let mut runner = proptest::test_runner::TestRunner::new(config(300, 0x5eed_5312));
    let cases = (
        prop::collection::vec(op_spec(), 1..14),
        any::<u64>(),
        prop_oneof![Just(1u8), Just(2u8), Just(4u8)],
        1u64..5,
        prop::bool::weighted(0.3),
    );
    runner
        .run(&cases, |(specs, seed, rd, level, lazy)| {
            let n = check_lossy(Recovery::SelectiveRepeat, &specs, seed, rd, level, lazy)?;
            placed.set(placed.get() + n);
            Ok(())
        })
        .unwrap();
    assert!(placed.get() > 0, "no packet was placed on arrival");
    eprintln!("placed on arrival: {}", placed.get());
}

/// Runs `specs` under faults of `level` and checks every effect against the model.
fn check_lossy(
    recovery: Recovery,
    specs: &[OpSpec],
    fault_seed: u64,
    rd: u8,
    level: u64,
    lazy_recv: bool,
) -> Result<u64, TestCaseError> {
    let mut p = Pair::with(Opts {
        recovery,
        ..opts(rd)
    });
    let planned = plan(&p, specs);
    let faults = Faults {
        drop: 25 * level,
        dup: 20 * level,
        hold: 40 * level,
    };
    let partition = setup(&mut p, &planned, faults, fault_seed, lazy_recv);
    prop_assert!(
        drive(&mut p, &planned, fault_seed, &partition, None, lazy_recv),
        "did not settle"
    );
    prop_assert_eq!(p.next_deadline(), None);
    for side in [Side::A, Side::B] {
        prop_assert_eq!(p.node(side).state(), QpState::Rts);
        let wcs = p.node(side).send_wcs();
        let want: Vec<_> = planned
            .iter()
            .filter(|w| w.from == side && w.signaled)
            .map(|w| (w.wr_id, WcStatus::Success, send_opcode(&w.op), w.len))
            .collect();
        let got: Vec<_> = wcs
            .iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
            .collect();
        prop_assert_eq!(got, want, "send completions of {:?}", side);
        let consumers: Vec<&Planned> = planned
            .iter()
            .filter(|w| w.from == peer(side) && w.recv.is_some())
            .collect();
        let rwcs = p.node(side).recv_wcs();
        prop_assert_eq!(
            rwcs.len(),
            consumers.len(),
            "receive completions of {:?}",
            side
        );
        for (w, wc) in consumers.iter().zip(&rwcs) {
            check_recv(&mut p, w, wc)?;
        }
    }
    for w in &planned {
        check_effects(&mut p, w)?;
    }
    // Atomic words hold the model's final values.
    let mut words = [[0u64; 2]; 2];
    for w in &planned {
        if let SendOp::AtomicCmpAndSwp {
            remote_addr,
            compare,
            swap,
            ..
        } = w.op
        {
            let t = usize::from(w.from == Side::A);
            let i = ((remote_addr - WORDS) % 16 / 8) as usize;
            if words[t][i] == compare {
                words[t][i] = swap;
            }
        }
        if let SendOp::AtomicFetchAndAdd {
            remote_addr, add, ..
        } = w.op
        {
            let t = usize::from(w.from == Side::A);
            let i = ((remote_addr - WORDS) % 16 / 8) as usize;
            words[t][i] = words[t][i].wrapping_add(add);
        }
    }
    for (t, side) in [(0, Side::A), (1, Side::B)] {
        let node = p.node(side);
        let mr = node.mr;
        for (i, &want) in words[t].iter().enumerate() {
            prop_assert_eq!(node.word(&mr, WORDS + 8 * i as u64), want);
        }
    }
    Ok(p.node(Side::A).stats().sr_placed_early + p.node(Side::B).stats().sr_placed_early)
}

proptest! {
    #![proptest_config(config(3000, 0x5eed_0012))]

    #[test]
    fn partition_fails_one_wr_and_flushes_the_rest(
        specs in prop::collection::vec(op_spec(), 1..14),
        fault_seed in any::<u64>(),
        partition_at in 0usize..60,
    ) {
        let mut p = Pair::with(opts(2));
        let planned = plan(&p, &specs);
        let faults = Faults { drop: 25, dup: 20, hold: 40 };
        let partition = setup(&mut p, &planned, faults, fault_seed, false);
        prop_assert!(
            drive(&mut p, &planned, fault_seed, &partition, Some(partition_at), false),
            "did not settle"
        );
        prop_assert_eq!(p.next_deadline(), None);
        for side in [Side::A, Side::B] {
            let mine: Vec<&Planned> = planned.iter().filter(|w| w.from == side).collect();
            let wcs = p.node(side).send_wcs();
            // SUCCESS for a prefix of the signaled WRs, then (if anything failed) one
            // RETRY_EXC_ERR and a flush for every WR after it, signaled or not.
            let first_err = wcs.iter().position(|w| w.status != WcStatus::Success);
            let ok = &wcs[..first_err.unwrap_or(wcs.len())];
            let mut k = 0; // index in `mine` of the first WR not accounted for
            for wc in ok {
                while k < mine.len() && !mine[k].signaled {
                    k += 1;
                }
                prop_assert!(k < mine.len(), "extra success {:?}", wc);
                prop_assert_eq!(wc.wr_id, mine[k].wr_id, "success out of order");
                check_effects(&mut p, mine[k])?;
                k += 1;
            }
            match first_err {
                None => {
                    // Everything completed before the partition.
                    prop_assert!(mine[k..].iter().all(|w| !w.signaled), "signaled WR lost");
                    prop_assert_eq!(p.node(side).state(), QpState::Rts);
                }
                Some(e) => {
                    let err = &wcs[e];
                    prop_assert_eq!(err.status, WcStatus::RetryExcErr);
                    // The failed WR is the first not-yet-completed one: WRs between the last
                    // success and it are unsignaled ones that completed silently.
                    let at = mine.iter().position(|w| w.wr_id == err.wr_id);
                    prop_assert!(at.is_some_and(|i| i >= k), "error for an unexpected WR");
                    let at = at.unwrap_or(0);
                    prop_assert!(mine[k..at].iter().all(|w| !w.signaled));
                    let flushed: Vec<_> = wcs[e + 1..].iter().map(|w| (w.wr_id, w.status)).collect();
                    let want: Vec<_> = mine[at + 1..]
                        .iter()
                        .map(|w| (w.wr_id, WcStatus::WrFlushErr))
                        .collect();
                    prop_assert_eq!(flushed, want, "flush of {:?}", side);
                    prop_assert_eq!(p.node(side).state(), QpState::Err);
                }
            }
            // Receive side: successes for a prefix of the peer's consuming WRs (with the right
            // data), then flushes if this QP is in ERR; nothing else.
            let consumers: Vec<&Planned> = planned
                .iter()
                .filter(|w| w.from == peer(side) && w.recv.is_some())
                .collect();
            let rwcs = p.node(side).recv_wcs();
            let n_ok = rwcs.iter().take_while(|w| w.status == WcStatus::Success).count();
            prop_assert!(n_ok <= consumers.len());
            for (w, wc) in consumers.iter().zip(&rwcs[..n_ok]) {
                check_recv(&mut p, w, wc)?;
            }
            let rest: Vec<_> = rwcs[n_ok..].iter().map(|w| (w.wr_id, w.status)).collect();
            if p.node(side).state() == QpState::Err {
                let want: Vec<_> = consumers[n_ok..]
                    .iter()
                    .map(|w| (w.recv.as_ref().map_or(0, |r| r.0), WcStatus::WrFlushErr))
                    .collect();
                prop_assert_eq!(rest, want, "receive flush of {:?}", side);
            } else {
                prop_assert!(rest.is_empty());
            }
        }
    }
}
