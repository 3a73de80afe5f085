//! The fault-stage equivalence fixture: one plan and one sequence of datagrams from node 0 to
//! node 1 — a datagram too short for a BTH and an empty one among them — that every backend's
//! fault stage must judge, count and deliver the same way.
//!
//! It is compiled into three tests (included with `#[path]`): emu-fault's own
//! (`tests/stage_equivalence.rs`, a bare [`emu_fault::Stage`]), the in-process fabric's
//! (`emu-sim`, `fabric.rs`: `Wire::send` and the pump's delivery calls) and the UDP driver's
//! (`emu-udp`, `fault.rs`: the send-side and the receive-side stage of a device). Each runs
//! [`run`] with its backend's entry points and compares the [`Outcome`] with [`EXPECTED`],
//! pinned once here, so the backends agree with each other through it.

use core::time::Duration;

use emu_fault::{
    FaultPlan, Injector, LinkCounters, NodeId, delay, drop, drop_nth, duplicate, hold, truncate,
};
use emu_proto::Instant;
use emu_proto::wire::Opcode;

/// The sending node.
pub(crate) const SRC: NodeId = NodeId(0);
/// The receiving node.
pub(crate) const DST: NodeId = NodeId(1);

/// What one backend's fault stage did with the sequence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// [`Injector::trace_hash`]: every `(now, meta, verdict)` in order.
    pub(crate) trace_hash: u64,
    /// Verdict counts of the link `SRC → DST`.
    pub(crate) counters: [u64; 8],
    /// Datagrams handed on.
    pub(crate) delivered: usize,
    /// Hash over every delivery: the instant it was handed on and its bytes, in order.
    pub(crate) deliveries: u64,
}

/// What every backend must produce. The 3rd datagram (a READ request) is the one `drop_nth(3)`
/// loses because the short datagram before it counts.
pub(crate) const EXPECTED: Outcome = Outcome {
    trace_hash: 0x368a_668c_5eaa_7ca1,
    counters: [3, 3, 1, 8, 4, 3, 4, 0],
    delivered: 23,
    deliveries: 0xca6c_0df3_ef7b_3c8d,
};

/// A backend's fault stage for the link `SRC → DST`, as the sequence drives it.
pub(crate) trait Backend {
    /// Puts `bytes` through the stage at `now`; returns what is due at once, in order.
    fn send(&mut self, now: Instant, bytes: &[u8]) -> Vec<Vec<u8>>;
    /// What became due by `now` (ended holds and delays), in order.
    fn due(&mut self, now: Instant) -> Vec<Vec<u8>>;
    /// Ends every hold ([`Injector::release`]) and returns what is due at `now`.
    fn release(&mut self, now: Instant) -> Vec<Vec<u8>>;
    /// The next instant something becomes due.
    fn next_due(&self) -> Option<Instant>;
    /// The injector judging the stage's datagrams.
    fn injector(&self) -> &Injector;
}

/// The plan: positional, per-opcode and random rules of every kind a stage carries out.
pub(crate) fn plan() -> FaultPlan {
    let us = Duration::from_micros;
    FaultPlan::new(0x5eed_0013)
        .rule(drop_nth(3))
        .rule(delay(us(0)..=us(20)).probability(0.5))
        .rule(hold().opcode(Opcode::RdmaReadRequest).until(at(60)))
        .rule(hold().opcode(Opcode::Unknown(0xFF)))
        .rule(duplicate(2).opcode(Opcode::Acknowledge).nth(2))
        .rule(emu_fault::corrupt(0.2))
        .rule(truncate(20).probability(0.3))
        .rule(drop(0.1))
}

/// `n` microseconds after the epoch.
pub(crate) fn at(n: u64) -> Instant {
    Instant::from_nanos(n * 1_000)
}

/// The datagrams, one every 7 µs: SEND_ONLY, ACKNOWLEDGE and RDMA_READ_REQUEST in turn, with
/// a 5-byte datagram second and an empty one fourteenth.
pub(crate) fn sequence() -> Vec<(Instant, Vec<u8>)> {
    (0..24u32)
        .map(|i| {
            let bytes = match (i, i % 3) {
                (1, _) => vec![0xAB; 5],
                (13, _) => Vec::new(),
                (_, 0) => datagram(Opcode::SendOnly, i, 64),
                (_, 1) => datagram(Opcode::Acknowledge, i, 20),
                _ => datagram(Opcode::RdmaReadRequest, i, 32),
            };
            (at(7 * u64::from(i)), bytes)
        })
        .collect()
}

/// A datagram of `len` bytes with a BTH (QPN 0x11, PSN `psn`) and, for an ACK, an AETH
/// syndrome saying ACK; the rest is filler (the stage never checks the ICRC).
fn datagram(opcode: Opcode, psn: u32, len: usize) -> Vec<u8> {
    let mut b: Vec<u8> = (0..len).map(|i| i as u8).collect();
    b[0] = u8::from(opcode);
    b[4] = 0;
    b[5..8].copy_from_slice(&[0, 0, 0x11]);
    b[8..12].copy_from_slice(&psn.to_be_bytes());
    b[8] = 0x80;
    if opcode == Opcode::Acknowledge {
        b[12] = 0x1f;
    }
    b
}

/// Drives `backend` through the sequence: before and after each datagram what is due, then
/// every delay and timed hold, then a release of the rest.
pub(crate) fn run(backend: &mut impl Backend) -> Outcome {
    let mut log = Log::default();
    let mut now = Instant::ZERO;
    for (t, bytes) in sequence() {
        now = t;
        log.add(now, backend.due(now));
        log.add(now, backend.send(now, &bytes));
    }
    while let Some(t) = backend.next_due() {
        if t > at(1_000) {
            break;
        }
        now = now.max(t);
        log.add(now, backend.due(now));
    }
    now += Duration::from_micros(1);
    log.add(now, backend.release(now));
    while let Some(t) = backend.next_due() {
        now = now.max(t);
        log.add(now, backend.due(now));
    }
    let c = backend
        .injector()
        .counters()
        .link(emu_fault::Link::new(SRC, DST));
    Outcome {
        trace_hash: backend.injector().trace_hash(),
        counters: counts(&c),
        delivered: log.count,
        deliveries: log.hash,
    }
}

/// The counters in a fixed order: passed, dropped, duplicated, delayed, corrupted, truncated,
/// held, partitioned.
fn counts(c: &LinkCounters) -> [u64; 8] {
    [
        c.passed,
        c.dropped,
        c.duplicated,
        c.delayed,
        c.corrupted,
        c.truncated,
        c.held,
        c.partitioned,
    ]
}

/// Deliveries so far: a count and an FNV-1a hash over `(instant, length, bytes)`.
struct Log {
    count: usize,
    hash: u64,
}

impl Default for Log {
    fn default() -> Log {
        Log {
            count: 0,
            hash: 0xcbf2_9ce4_8422_2325,
        }
    }
}

impl Log {
    fn add(&mut self, now: Instant, datagrams: Vec<Vec<u8>>) {
        for d in datagrams {
            self.count += 1;
            let words = [now.as_nanos(), d.len() as u64];
            for b in words.iter().flat_map(|w| w.to_le_bytes()).chain(d) {
                self.hash = (self.hash ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
            }
        }
    }
}
