//! The bodies of the softverbs fuzz targets, as plain functions over arbitrary bytes.
//!
//! Two crates compile this file and its modules: the `softverbs-fuzz-targets` library, which
//! the cargo-fuzz binaries in `fuzz/fuzz_targets/` call (nightly, `cfg(fuzzing)`), and the
//! stable replay test `tests/tests/fuzz_corpus_replay.rs` of the root workspace, which includes
//! it with `#[path]` and runs every file of `fuzz/corpus/<target>/` through it. Hence the rules
//! for these files: depend on nothing but `std`, `verbs-api`, `emu-proto`, `emu-fault`,
//! `emu-sim`, `emu-cm` and `softverbs-cli` (the replay test's crate has exactly these); no `cfg(fuzzing)` (the root workspace
//! does not declare that cfg); no `unwrap`/`expect` (root workspace lints); every `pub` item is
//! a target the replay test calls (anything else would be dead code there).
//!
//! Inputs are decoded by hand ([`common::Input`]: an exhausted input reads as zeros, and 0 is
//! always the ordinary choice), so that short inputs mean plain, valid scenarios.
//!
//! Every function must return normally for *every* input; a panic is a finding. Besides "does
//! not panic", each asserts the invariants listed in its doc.

use core::net::{Ipv4Addr, Ipv6Addr};

mod cm_mad;
mod common;
mod completer;
mod pair;
mod responder;
mod verbs_ops;

pub use cm_mad::cm_mad;
pub use completer::completer;
pub use pair::pair;
pub use responder::responder;
pub use verbs_ops::verbs_ops;

use emu_fault::{DatagramMeta, FaultPlan, HoldQueue, Injector, NodeId, Verdict};
use emu_proto::Instant;
use emu_proto::wire::{
    AETH_LEN, ALL_RC, ATOMIC_ACK_ETH_LEN, ATOMIC_ETH_LEN, Aeth, AethRepr, AtomicAckEth,
    AtomicAckEthRepr, AtomicEth, AtomicEthRepr, BTH_LEN, Bth, BthRepr, Credits, DETH_LEN, Deth,
    DethRepr, ICRC_LEN, IETH_LEN, IMMDT_LEN, Ieth, IethRepr, ImmDt, ImmDtRepr, IpContext, Opcode,
    Packet, PacketRepr, Psn, RETH_LEN, Reth, RethRepr, RnrTimer, Syndrome, WireError, check_icrc,
    compute_icrc, pad_len,
};

/// The IPv4 context the wire target emits with; the `wire_decode` seed corpus carries ICRCs
/// computed for it.
pub const CTX_V4: IpContext = IpContext::v4(
    Ipv4Addr::new(127, 0, 0, 1),
    Ipv4Addr::new(127, 0, 0, 2),
    0xC000,
);

/// A second, IPv6, context, so that emission covers both pseudo-header layouts.
pub const CTX_V6: IpContext = IpContext::v6(Ipv6Addr::LOCALHOST, Ipv6Addr::LOCALHOST, 0xC001);

/// BTH bytes the repr does not keep, as `(offset, bits kept)`: byte 4 keeps FECN and BECN but
/// drops Resv6; byte 8 keeps AckReq but drops Resv7.
const BTH_KEPT_BITS: &[(usize, u8)] = &[(4, 0xC0), (8, 0x80)];

/// Fuzz target `wire_decode`: arbitrary bytes as a RoCEv2 UDP payload (`emu_proto::wire`).
///
/// Asserts, for every input:
/// * each header view's `new_checked` fails exactly on a short buffer, and a parsed header repr
///   emits back to the input bytes (reserved bits cleared) and re-parses equal;
/// * [`Psn`] serial arithmetic on the first 3 + 3 bytes: `a.diff(b) == -b.diff(a)` except at the
///   2^23 boundary, `b + (a - b) == a`, `is_before`/`is_after` agree with `diff`;
/// * `Syndrome` and `Opcode` byte encodings round-trip for the first bytes of the input;
/// * `PacketRepr::parse` agrees with `Packet::check_len`; a parsed packet accounts for every
///   input byte, emits (IPv4 and IPv6 contexts) into `buffer_len()` bytes that re-parse to an
///   equal repr, reproduce the input except reserved bits, pad and ICRC, and pass
///   `check_icrc`; a non-canonical PadCnt is the only reason emission may refuse a parsed
///   packet.
pub fn wire_decode(data: &[u8]) {
    header_views(data);
    psn_arithmetic(data);
    byte_codes(data);
    packet(data);
}

/// Checks one header view type on the raw input; see [`wire_decode`].
macro_rules! view_round_trip {
    ($data:expr, $view:ident, $repr:ident, $len:expr, $kept:expr) => {{
        let data: &[u8] = $data;
        let kept: &[(usize, u8)] = $kept;
        match $view::new_checked(data) {
            Err(e) => assert_eq!(
                e,
                WireError::Truncated {
                    need: $len,
                    have: data.len()
                },
                stringify!($view)
            ),
            Ok(view) => match $repr::parse(&view) {
                // Only the BTH has a field value (TVer) that parsing rejects.
                Err(e) => assert!(matches!(e, WireError::BadTver(_)), "{e:?}"),
                Ok(repr) => {
                    assert_eq!(repr.buffer_len(), $len);
                    let mut out = [0u8; $len];
                    repr.emit(&mut $view::new_unchecked(&mut out[..]));
                    assert_eq!($repr::parse(&$view::new_unchecked(&out[..])), Ok(repr));
                    let mut expect = [0u8; $len];
                    expect.copy_from_slice(&data[..$len]);
                    for &(at, keep) in kept {
                        expect[at] &= keep;
                    }
                    assert_eq!(out, expect, stringify!($view));
                }
            },
        }
    }};
}

fn header_views(data: &[u8]) {
    view_round_trip!(data, Bth, BthRepr, BTH_LEN, BTH_KEPT_BITS);
    view_round_trip!(data, Reth, RethRepr, RETH_LEN, &[]);
    view_round_trip!(data, Aeth, AethRepr, AETH_LEN, &[]);
    view_round_trip!(data, AtomicEth, AtomicEthRepr, ATOMIC_ETH_LEN, &[]);
    view_round_trip!(
        data,
        AtomicAckEth,
        AtomicAckEthRepr,
        ATOMIC_ACK_ETH_LEN,
        &[]
    );
    view_round_trip!(data, ImmDt, ImmDtRepr, IMMDT_LEN, &[]);
    view_round_trip!(data, Ieth, IethRepr, IETH_LEN, &[]);
    // DETH byte 4 is reserved.
    view_round_trip!(data, Deth, DethRepr, DETH_LEN, &[(4, 0x00)]);
}

fn psn_arithmetic(data: &[u8]) {
    const HALF: i32 = 1 << 23;
    let mut b = [0u8; 6];
    b.iter_mut().zip(data).for_each(|(d, s)| *d = *s);
    let raw = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    assert_eq!(Psn::new(raw).value(), raw & Psn::MASK);
    let a = Psn::new(u32::from_be_bytes([0, b[0], b[1], b[2]]));
    let c = Psn::new(u32::from_be_bytes([0, b[3], b[4], b[5]]));
    assert_eq!(Psn::new(a.value()), a);
    let (ac, ca) = (a.diff(c), c.diff(a));
    assert!((-HALF..HALF).contains(&ac), "{a:?} - {c:?} = {ac}");
    if ac == -HALF {
        // Exactly 2^23 apart: "before" from both sides.
        assert_eq!(ca, -HALF);
    } else {
        assert_eq!(ac, -ca, "{a:?} vs {c:?}");
    }
    // Two's complement of a negative distance is ≡ the distance mod 2^24.
    assert_eq!(c.wrapping_add(ac as u32), a);
    assert_eq!(a.wrapping_add(0), a);
    assert_eq!(a.is_after(c), ac > 0);
    assert_eq!(a.is_before(c), ac < 0);
    assert_eq!(a == c, ac == 0);
}

fn byte_codes(data: &[u8]) {
    for &b in data.iter().take(64) {
        let s = Syndrome::from(b);
        assert_eq!(u8::from(s), b, "{s:?}");
        let op = Opcode::from(b);
        assert_eq!(u8::from(op), b);
        match op {
            Opcode::Unknown(_) => {
                assert_eq!(op.ext_headers(), None);
                assert_eq!(Opcode::from_name(op.name()), None);
            }
            _ => {
                assert!(ALL_RC.contains(&op));
                assert_eq!(Opcode::from_name(op.name()), Some(op));
                assert!(op.header_len().is_some_and(|n| n >= BTH_LEN));
            }
        }
        let credits = Credits::from_code(b);
        assert_eq!(credits.wqes().is_none(), credits.is_unlimited());
        assert!(RnrTimer::from_code(b).duration().as_micros() > 0);
    }
}

fn packet(data: &[u8]) {
    let view = Packet::new_unchecked(data);
    let checked = Packet::new_checked(data);
    let payload = view.payload();
    // Must not panic on any input; the result is random here.
    let _ = compute_icrc(&CTX_V4, data);
    let _ = check_icrc(&CTX_V6, data);
    let repr = match PacketRepr::parse(&view) {
        Ok(repr) => repr,
        Err(e) => {
            match checked {
                // `parse` runs `check_len` first.
                Err(c) => assert_eq!(e, c),
                // After `check_len`, only header contents can be rejected.
                Ok(_) => assert!(
                    matches!(
                        e,
                        WireError::BadTver(_) | WireError::UnexpectedPayload { .. }
                    ),
                    "{e:?}"
                ),
            }
            return;
        }
    };
    assert!(checked.is_ok());
    assert_eq!(repr.payload, payload);
    assert_eq!(repr.bth.opcode.ext_headers(), Some(repr.ext_headers()));
    assert!(repr.bth.opcode.has_payload() || repr.payload.is_empty());
    assert!(repr.bth.pad_count <= 3);
    assert_eq!(
        data.len(),
        BTH_LEN
            + repr.ext_headers().len()
            + repr.payload.len()
            + usize::from(repr.bth.pad_count)
            + ICRC_LEN
    );

    let canonical = pad_len(repr.payload.len());
    if repr.bth.pad_count == canonical {
        emit_and_reparse(&repr, Some(data));
    } else {
        let mut out = vec![0u8; repr.buffer_len()];
        assert_eq!(
            repr.emit(&CTX_V4, &mut out),
            Err(WireError::BadPad {
                pad: repr.bth.pad_count,
                len: repr.payload.len()
            })
        );
        let fixed = PacketRepr {
            bth: BthRepr {
                pad_count: canonical,
                ..repr.bth
            },
            ..repr
        };
        emit_and_reparse(&fixed, None);
    }
}

/// Emits a parsed, canonical `repr` with both contexts and checks the result; `original` is
/// the input it was parsed from, when emission must reproduce it.
fn emit_and_reparse(repr: &PacketRepr<'_>, original: Option<&[u8]>) {
    let len = repr.buffer_len();
    for ctx in [CTX_V4, CTX_V6] {
        let mut out = vec![0u8; len];
        match repr.emit(&ctx, &mut out) {
            Ok(n) => assert_eq!(n, len),
            Err(WireError::TooLong(n)) => {
                // The UDP length (8 + n) or IPv4 total length (28 + n) overflows 16 bits.
                let ip_and_udp = if ctx == CTX_V4 { 28 } else { 8 };
                assert_eq!(n, len);
                assert!(n + ip_and_udp > usize::from(u16::MAX), "{n} bytes");
                continue;
            }
            Err(e) => panic!("emitting a parsed, canonical packet failed: {e}; {repr:?}"),
        }
        assert_eq!(
            repr.emit(&ctx, &mut out[..len - 1]),
            Err(WireError::Truncated {
                need: len,
                have: len - 1
            })
        );
        assert_eq!(check_icrc(&ctx, &out), Ok(()));
        let again = PacketRepr::parse(&Packet::new_unchecked(&out[..]));
        assert_eq!(again, Ok(*repr));

        if let Some(original) = original {
            assert_eq!(original.len(), len);
            let mut expect = original[..len - ICRC_LEN].to_vec();
            for &(at, keep) in BTH_KEPT_BITS {
                expect[at] &= keep;
            }
            let pad_start = len - ICRC_LEN - usize::from(repr.bth.pad_count);
            expect[pad_start..].fill(0);
            assert_eq!(&out[..len - ICRC_LEN], &expect[..]);
        }

        // CRC-32 detects every single-bit error. Only checkable where the ICRC is enforced
        // (the fuzz build accepts every ICRC): probe that by spoiling the ICRC itself.
        let mut spoiled = out.clone();
        spoiled[len - 1] ^= 0x01;
        if check_icrc(&ctx, &spoiled).is_err() {
            let covered_bits = (len - ICRC_LEN) * 8;
            let mut bit = (usize::from(repr.bth.psn.value() as u8) * 131 + len) % covered_bits;
            if bit / 8 == 4 {
                bit += 8; // BTH byte 4 is masked in the ICRC.
            }
            let mut flipped = out.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(
                matches!(check_icrc(&ctx, &flipped), Err(WireError::BadIcrc { .. })),
                "bit {bit} flip not detected"
            );
        }
    }
}

/// Fuzz target `fault_plan`: arbitrary bytes as a fault plan file (`emu_fault`).
///
/// Asserts, for every input:
/// * `FaultPlan::from_toml` returns (it never panics), and its errors print with a position
///   inside the text;
/// * an accepted plan validates, its canonical `to_toml()` (and its `Display` form) parses
///   back to an equal plan with an equal `hash()`, and canonical text is a fixed point;
/// * an `Injector` runs it over a fixed opcode sweep plus datagrams derived from the input
///   bytes, with run-time partitions, repairs, releases and heals, giving verdicts whose
///   deliveries, edits and counters are consistent, and the same verdicts and trace hash
///   when run again from the re-parsed plan.
pub fn fault_plan(data: &[u8]) {
    let Ok(text) = core::str::from_utf8(data) else {
        return;
    };
    let plan = match FaultPlan::from_toml(text) {
        Ok(plan) => plan,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            if let Some(pos) = e.position {
                assert!(pos.line >= 1 && pos.column >= 1, "{e}");
                assert!(pos.line <= text.split('\n').count(), "{e}");
            }
            return;
        }
    };
    assert_eq!(plan.validate(), Ok(()));
    let canon = plan.to_toml();
    let again = match FaultPlan::from_toml(&canon) {
        Ok(again) => again,
        Err(e) => panic!("canonical TOML rejected: {e}\n--- input\n{text}\n--- canonical\n{canon}"),
    };
    assert_eq!(again, plan, "canonical:\n{canon}");
    assert_eq!(again.hash(), plan.hash());
    assert_eq!(again.to_toml(), canon);
    assert_eq!(FaultPlan::from_toml(&plan.to_string()), Ok(plan.clone()));

    let traffic = synthetic_traffic(data);
    let first = run_injector(plan, &traffic);
    let second = run_injector(again, &traffic);
    assert_eq!(first, second, "same plan and calls, different decisions");
}

/// A run-time change made before a datagram.
#[derive(Copy, Clone, Debug)]
enum Control {
    None,
    Partition,
    PartitionOneway,
    Repair,
    Release,
    Heal,
}

/// One datagram of synthetic traffic: when, what, and the run-time change made before it.
type Datagram = (Instant, DatagramMeta, Control);

/// Every RC opcode (ACKs as ACK, RNR NAK and NAK) from node 1 to node 2 and back, one
/// microsecond apart, then up to 64 datagrams whose fields are read from `data`, 8 bytes each.
fn synthetic_traffic(data: &[u8]) -> Vec<Datagram> {
    let mut out = Vec::new();
    let mut now = 0u64;
    for (i, op) in ALL_RC.into_iter().enumerate() {
        let syndromes: &[u8] = match op.ext_headers() {
            Some(h) if h.aeth => &[0x1F, 0x2E, 0x60],
            _ => &[0xFF],
        };
        for &syndrome in syndromes {
            for (src, dst) in [(1, 2), (2, 1)] {
                now += 1_000;
                let meta = DatagramMeta {
                    src: NodeId(src),
                    dst: NodeId(dst),
                    dest_qpn: 0x11,
                    opcode: op,
                    psn: Psn::new(0xFF_FFF0 + i as u32),
                    aeth_syndrome: (syndrome != 0xFF).then_some(syndrome),
                    len: 64 + i,
                };
                out.push((Instant::from_nanos(now), meta, Control::None));
            }
        }
    }
    for c in data.chunks_exact(8).take(64) {
        // Steps from 1 ns to ~2^40 ns, so windows and hold times in any unit are crossed.
        now = now.saturating_add(u64::from(c[0]) << (c[1] % 40));
        let control = match c[7] & 0x0F {
            0x0A => Control::Partition,
            0x0B => Control::PartitionOneway,
            0x0C => Control::Repair,
            0x0D => Control::Release,
            0x0E => Control::Heal,
            _ => Control::None,
        };
        let meta = DatagramMeta {
            src: NodeId(u32::from(c[1] % 4)),
            dst: NodeId(u32::from(c[2] % 4)),
            dest_qpn: u32::from(c[2] >> 4),
            opcode: Opcode::from(c[3] % 0x20),
            psn: Psn::new(u32::from_be_bytes([0, c[4], c[5], c[6]])),
            aeth_syndrome: (c[7] & 0x80 == 0).then_some(c[6]),
            len: usize::from(c[5] % 128),
        };
        out.push((Instant::from_nanos(now), meta, control));
    }
    out
}

/// Runs `plan` over `traffic`, checking each verdict; returns the verdicts and the trace hash.
fn run_injector(plan: FaultPlan, traffic: &[Datagram]) -> (Vec<Verdict>, u64) {
    let mut injector = match Injector::new(plan) {
        Ok(injector) => injector,
        Err(e) => panic!("a parsed plan failed Injector::new: {e}"),
    };
    let mut held = HoldQueue::new();
    let mut verdicts = Vec::with_capacity(traffic.len());
    // passed, dropped, partitioned, held, duplicated, corrupted, truncated, delayed
    let mut expect = [0u64; 8];
    for &(now, meta, control) in traffic {
        match control {
            Control::None => {}
            Control::Partition => injector.partition(meta.src, meta.dst),
            Control::PartitionOneway => injector.partition_oneway(meta.src, meta.dst),
            Control::Repair => injector.repair(meta.src, meta.dst),
            Control::Release => {
                injector.release();
                held.drain().for_each(drop);
            }
            Control::Heal => {
                injector.heal();
                held.drain().for_each(drop);
            }
        }
        while held.pop_due(now).is_some() {}

        let verdict = injector.on_datagram(now, &meta);
        let deliveries: Vec<_> = verdict.deliveries(now).collect();
        let delay = match verdict {
            Verdict::Deliver { delay } => {
                assert_eq!(deliveries.len(), 1);
                expect[if delay.is_zero() { 0 } else { 7 }] += 1;
                None
            }
            Verdict::Drop(emu_fault::DropCause::Loss) => {
                expect[1] += 1;
                None
            }
            Verdict::Drop(_) => {
                expect[2] += 1;
                None
            }
            Verdict::Hold { until } => {
                assert!(until.is_none_or(|t| now < t), "{verdict:?} at {now:?}");
                held.push(until, meta);
                expect[3] += 1;
                None
            }
            Verdict::Duplicate { copies, delay } => {
                assert!(copies >= 1);
                assert_eq!(deliveries.len(), 1 + usize::from(copies));
                expect[4] += 1;
                Some(delay)
            }
            Verdict::Corrupt { bit, delay } => {
                assert!(bit < meta.len * 8, "{verdict:?} for {} bytes", meta.len);
                assert!(meta.len <= 4 || bit / 8 != 4, "{verdict:?} hit BTH byte 4");
                expect[5] += 1;
                Some(delay)
            }
            Verdict::Truncate { len, delay } => {
                assert!(len < meta.len, "{verdict:?} for {} bytes", meta.len);
                expect[6] += 1;
                Some(delay)
            }
            _ => None,
        };
        if let Some(delay) = delay {
            expect[7] += u64::from(!delay.is_zero());
        }
        if matches!(verdict, Verdict::Drop(_) | Verdict::Hold { .. }) {
            assert!(deliveries.is_empty());
        }
        for d in deliveries {
            assert!(d.at >= now);
            let bytes: Vec<u8> = (0..meta.len).map(|i| i as u8).collect();
            let mut edited = bytes.clone();
            let n = d.edit.apply(&mut edited);
            assert!(n <= bytes.len());
            let changed_bits: u32 = bytes
                .iter()
                .zip(&edited)
                .map(|(a, b)| (a ^ b).count_ones())
                .sum();
            match verdict {
                Verdict::Corrupt { .. } => assert_eq!((n, changed_bits), (bytes.len(), 1)),
                Verdict::Truncate { len, .. } => assert_eq!((n, changed_bits), (len, 0)),
                _ => assert_eq!((n, changed_bits), (bytes.len(), 0)),
            }
        }
        verdicts.push(verdict);
    }
    let t = injector.counters().total();
    let got = [
        t.passed,
        t.dropped,
        t.partitioned,
        t.held,
        t.duplicated,
        t.corrupted,
        t.truncated,
        t.delayed,
    ];
    assert_eq!(got, expect, "counters disagree with the verdicts");
    (verdicts, injector.trace_hash())
}

/// Nodes of the run a `run_plan` input is parsed for (node indices 0 to 2 exist).
const RUN_PLAN_NODES: u32 = 3;

/// Fuzz target `run_plan`: arbitrary bytes as the plan file of `softverbs run --faults`
/// (`softverbs_cli::run::plan::parse`, for a run of 3 nodes and seed 1).
///
/// Asserts, for every input: a rejected plan has a non-empty message whose position, when
/// given, lies inside the text; an accepted plan names only existing nodes, keeps every time
/// within [`softverbs_cli::run::plan::MAX_TIME`] (so no sum the harness forms overflows), gives
/// every pause a duration and nothing else one, and carries a valid network plan.
pub fn run_plan(data: &[u8]) {
    use softverbs_cli::run::plan::{self, MAX_TIME, ProcessAction, Trigger};
    let Ok(text) = core::str::from_utf8(data) else {
        return;
    };
    let parsed = match plan::parse(text, 1, RUN_PLAN_NODES) {
        Ok(parsed) => parsed,
        Err(e) => {
            assert!(!e.message.is_empty(), "empty message: {e:?}");
            if let Some(pos) = e.position {
                assert!(pos.line >= 1 && pos.column >= 1, "{e}");
                assert!(pos.line <= text.split('\n').count(), "{e}");
            }
            return;
        }
    };
    assert_eq!(parsed.network.validate(), Ok(()));
    for fault in &parsed.process {
        assert!(fault.node < RUN_PLAN_NODES, "{fault:?}");
        if let Trigger::At(at) = fault.trigger {
            assert!(at <= MAX_TIME, "{fault:?}");
        }
        match (fault.action, fault.duration) {
            (ProcessAction::Pause, Some(d)) => assert!(d <= MAX_TIME, "{fault:?}"),
            (ProcessAction::Pause, None) => panic!("pause without a duration: {fault:?}"),
            (_, Some(_)) => panic!("a duration on a non-pause fault: {fault:?}"),
            (_, None) => {}
        }
    }
}
