//! The in-memory network between emulated devices: the event loop ("pump"), the seeded fault
//! injector applied to every datagram, the trace hash, the pcap capture and the two clocks.
//!
//! # Events
//!
//! The pump moves four kinds of events, always in time order:
//!
//! * transmissions: every HCA's transmit queue is drained at `now`; each datagram goes through
//!   the [`Injector`] and is scheduled (possibly several times, corrupted, truncated or delayed)
//!   on an in-flight heap keyed by `(deliver_at, seq)` — the sequence number breaks ties
//!   deterministically — or kept in a [`HoldQueue`];
//! * deliveries of in-flight datagrams, and releases of timed holds;
//! * HCA timers (local ACK timeout, RNR wait).
//!
//! # Clocks
//!
//! In **virtual time** nothing depends on the wall clock. [`Goal::Settle`] processes every
//! transmission and delivery, jumping virtual time forward to each delivery, but never past
//! the earliest HCA timer and never firing one: a call into the provider runs the fabric until
//! only timers are left. [`Goal::NextTimer`] (used when the application waits: an empty CQ
//! poll, an empty channel or event queue) additionally jumps to the earliest timer deadline,
//! fires it and settles again. [`Goal::Until`] fires every timer up to a given instant.
//!
//! In **real time** `now` is the time since the provider was created; the pump processes what is
//! due (timers included) and never jumps ahead.
//!
//! A pump is bounded by a step budget, so a fabric that never settles (e.g. a storm of
//! duplicates) cannot hang the caller; the next call continues from where it stopped.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::BufWriter;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use emu_capture::PcapSink;
use emu_device::DeviceMemory;
use emu_fault::{Counters, DatagramMeta, HoldQueue, Injector, NodeId, Verdict};
use emu_proto::wire::{BTH_LEN, Bth, IpContext, Opcode, Psn};
use emu_proto::{Hca, Instant, MAX_PACKET_LEN};

/// The node number the fault model and the trace use for device index `i`.
pub(crate) fn node_id(i: usize) -> NodeId {
    NodeId(u32::try_from(i).unwrap_or(u32::MAX))
}

/// A datagram on its way. `bytes` is a pool buffer of [`MAX_PACKET_LEN`] bytes, of which the
/// first `len` are the datagram.
#[derive(Debug)]
struct Datagram {
    src_node: usize,
    dst: usize,
    src: SocketAddr,
    bytes: Vec<u8>,
    len: usize,
}

/// A scheduled delivery, ordered by `(at, seq)`.
#[derive(Debug)]
struct InFlight {
    at: Instant,
    seq: u64,
    datagram: Datagram,
}

impl PartialEq for InFlight {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for InFlight {}

impl PartialOrd for InFlight {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for InFlight {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// One delivered datagram, as [`crate::SimProvider::take_trace`] returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceRecord {
    /// Delivery time since the provider was created (virtual or real).
    pub at: Duration,
    /// Sending device.
    pub src: NodeId,
    /// Receiving device.
    pub dst: NodeId,
    /// The RoCEv2 UDP payload as delivered (after corruption or truncation).
    pub bytes: Vec<u8>,
}

/// A stable 64-bit hash (FxHash's multiply-rotate over little-endian words): the same input on
/// every run, platform and Rust release.
#[derive(Copy, Clone, Debug)]
pub(crate) struct TraceHasher(u64);

impl TraceHasher {
    const K: u64 = 0x517c_c1b7_2722_0a95;

    pub(crate) const fn new() -> TraceHasher {
        TraceHasher(0xcbf2_9ce4_8422_2325)
    }

    fn word(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(Self::K);
    }

    fn bytes(&mut self, bytes: &[u8]) {
        self.word(bytes.len() as u64);
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.word(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.word(u64::from_le_bytes(w));
        }
    }

    pub(crate) const fn finish(&self) -> u64 {
        self.0
    }
}

/// Where `now` comes from.
#[derive(Copy, Clone, Debug)]
enum Clock {
    /// Virtual time: advanced by the pump only.
    Virtual,
    /// Real time since `epoch`; pcap timestamps count from `wall` (time since the Unix epoch
    /// when the provider was created).
    Real {
        epoch: std::time::Instant,
        wall: Duration,
    },
}

/// The pcap writer and the first error it met.
#[derive(Debug)]
struct Capture {
    sink: Option<PcapSink<BufWriter<File>>>,
    error: Option<String>,
}

/// What a pump may do; see the module doc.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Goal {
    /// Transmit and deliver, in virtual time up to (not past, not firing) the next timer.
    Settle,
    /// Settle, then fire the earliest timer deadline (virtual time) and settle again.
    NextTimer,
    /// Fire every timer due by this instant, then let virtual time reach it.
    Until(Instant),
}

/// What a pump did.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Pumped {
    /// A timer deadline was reached (virtual time) and fired.
    pub(crate) fired: bool,
    /// The budget ran out before the fabric settled.
    pub(crate) exhausted: bool,
}

/// The wire between nodes: clock, latency, fault injector, in-flight and held datagrams,
/// observers (trace hash, capture, record) and a pool of packet buffers.
#[derive(Debug)]
pub(crate) struct Wire {
    pub(crate) now: Instant,
    latency: Duration,
    clock: Clock,
    /// Every node's address, by device index.
    addrs: Vec<SocketAddr>,
    inflight: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    held: HoldQueue<Datagram>,
    pub(crate) injector: Injector,
    trace: TraceHasher,
    delivered: u64,
    capture: Option<Capture>,
    record: Option<Vec<TraceRecord>>,
    pool: Vec<Vec<u8>>,
    /// Nodes that may have something to transmit: every node at the start of a pump, then
    /// those that received a datagram or fired a timer. Saves `poll_transmit` calls that would
    /// return nothing.
    dirty: Vec<bool>,
    /// Datagrams sent to an address no node has.
    pub(crate) undeliverable: u64,
}

/// How a [`Wire`] is set up.
#[derive(Debug)]
pub(crate) struct WireConfig {
    pub(crate) latency: Duration,
    pub(crate) real_time: bool,
    pub(crate) addrs: Vec<SocketAddr>,
    pub(crate) injector: Injector,
    pub(crate) capture: Option<PcapSink<BufWriter<File>>>,
    pub(crate) record: bool,
}

impl Wire {
    pub(crate) fn new(config: WireConfig) -> Wire {
        let clock = if config.real_time {
            Clock::Real {
                epoch: std::time::Instant::now(),
                wall: SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default(),
            }
        } else {
            Clock::Virtual
        };
        Wire {
            now: Instant::ZERO,
            latency: config.latency,
            clock,
            addrs: config.addrs.clone(),
            inflight: BinaryHeap::new(),
            seq: 0,
            held: HoldQueue::new(),
            injector: config.injector,
            trace: TraceHasher::new(),
            delivered: 0,
            capture: config.capture.map(|sink| Capture {
                sink: Some(sink),
                error: None,
            }),
            record: config.record.then(Vec::new),
            pool: Vec::new(),
            dirty: vec![true; config.addrs.len()],
            undeliverable: 0,
        }
    }

    /// True in real-time mode.
    pub(crate) fn is_real_time(&self) -> bool {
        matches!(self.clock, Clock::Real { .. })
    }

    /// In real time, moves `now` to the clock (never backwards).
    pub(crate) fn tick(&mut self) {
        if let Clock::Real { epoch, .. } = self.clock {
            let nanos = u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.now = self.now.max(Instant::from_nanos(nanos));
        }
    }

    /// Hash over every delivered datagram so far (time, source, destination, bytes).
    pub(crate) fn trace_hash(&self) -> u64 {
        self.trace.finish()
    }

    /// Number of datagrams delivered so far.
    pub(crate) fn delivered(&self) -> u64 {
        self.delivered
    }

    /// Per-link verdict counts.
    pub(crate) fn counters(&self) -> &Counters {
        self.injector.counters()
    }

    /// Datagrams in flight or held.
    pub(crate) fn pending(&self) -> usize {
        self.inflight.len() + self.held.len()
    }

    /// Moves every held datagram to the wire, due after the link latency.
    pub(crate) fn release_all_held(&mut self) {
        let now = self.now;
        let held: Vec<Datagram> = self.held.drain().collect();
        for d in held {
            self.schedule(now + self.latency, d);
        }
    }

    /// Stops capturing: flushes and closes the pcap file. Returns the first error met while
    /// capturing or closing; `Ok` if no capture was configured.
    pub(crate) fn finish_capture(&mut self) -> Result<(), String> {
        let Some(capture) = self.capture.as_mut() else {
            return Ok(());
        };
        if let Some(sink) = capture.sink.take() {
            if let Err(e) = sink.finish() {
                capture.error.get_or_insert(e.to_string());
            }
        }
        match &capture.error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// The datagrams recorded since the last call (empty unless recording was enabled).
    pub(crate) fn take_record(&mut self) -> Vec<TraceRecord> {
        self.record.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Notes that node `i` may have something to transmit.
    fn mark(&mut self, i: usize) {
        if let Some(d) = self.dirty.get_mut(i) {
            *d = true;
        }
    }

    fn buffer(&mut self) -> Vec<u8> {
        match self.pool.pop() {
            Some(buf) => buf,
            None => vec![0; MAX_PACKET_LEN],
        }
    }

    fn schedule(&mut self, at: Instant, datagram: Datagram) {
        self.seq += 1;
        self.inflight.push(Reverse(InFlight {
            at,
            seq: self.seq,
            datagram,
        }));
    }

    /// Puts one transmitted datagram (the first `len` bytes of `buf`) through the injector.
    fn send(
        &mut self,
        now: Instant,
        src_node: usize,
        src: SocketAddr,
        to: SocketAddr,
        buf: Vec<u8>,
        len: usize,
    ) {
        let Some(dst) = self.addrs.iter().position(|a| *a == to) else {
            self.undeliverable += 1;
            self.pool.push(buf);
            return;
        };
        let meta = datagram_meta(src_node, dst, &buf[..len]);
        let verdict = self.injector.on_datagram(now, &meta);
        let datagram = Datagram {
            src_node,
            dst,
            src,
            bytes: buf,
            len,
        };
        if let Verdict::Hold { until } = verdict {
            self.held.push(until, datagram);
            return;
        }
        let deliveries = verdict.deliveries(now);
        let n = deliveries.len();
        let mut original = Some(datagram);
        for (k, delivery) in deliveries.enumerate() {
            let Some(template) = original.as_ref() else {
                break;
            };
            let mut copy = if k + 1 == n {
                match original.take() {
                    Some(d) => d,
                    None => break,
                }
            } else {
                let mut bytes = self.buffer();
                bytes[..len].copy_from_slice(&template.bytes[..len]);
                Datagram { bytes, ..*template }
            };
            copy.len = delivery.edit.apply(&mut copy.bytes[..len]);
            self.schedule(delivery.at + self.latency, copy);
        }
        if let Some(unused) = original {
            self.pool.push(unused.bytes);
        }
    }

    /// Feeds `d` to its destination and the observers at `now`.
    fn deliver<N: PumpNode>(&mut self, nodes: &mut [N], now: Instant, d: Datagram) {
        let bytes = &d.bytes[..d.len];
        self.delivered += 1;
        self.trace.word(now.as_nanos());
        self.trace.word(d.src_node as u64);
        self.trace.word(d.dst as u64);
        self.trace.bytes(bytes);
        let at = self.timestamp(now);
        if let Some(record) = self.record.as_mut() {
            record.push(TraceRecord {
                at: Duration::from_nanos(now.as_nanos()),
                src: node_id(d.src_node),
                dst: node_id(d.dst),
                bytes: bytes.to_vec(),
            });
        }
        if let (Some(capture), Some(to)) = (self.capture.as_mut(), self.addrs.get(d.dst)) {
            capture.write(at, d.src, *to, bytes);
        }
        if let Some(node) = nodes.get_mut(d.dst) {
            let (hca, mem, _) = node.parts();
            hca.handle_datagram(now, d.src, bytes, mem);
            self.mark(d.dst);
        }
        self.pool.push(d.bytes);
    }

    /// The pcap timestamp of `now`.
    fn timestamp(&self, now: Instant) -> Duration {
        let since_start = Duration::from_nanos(now.as_nanos());
        match self.clock {
            Clock::Virtual => since_start,
            Clock::Real { wall, .. } => wall + since_start,
        }
    }

    /// The earliest delivery or timed hold.
    fn next_delivery(&self) -> Option<Instant> {
        let packet = self.inflight.peek().map(|Reverse(p)| p.at);
        match (packet, self.held.next_due()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Delivers everything due at `now`; true if anything was.
    fn deliver_due<N: PumpNode>(&mut self, nodes: &mut [N], now: Instant) -> bool {
        let mut any = false;
        if !self.held.is_empty() {
            while let Some(d) = self.held.pop_due(now) {
                self.schedule(now + self.latency, d);
                any = true;
            }
        }
        while self.inflight.peek().is_some_and(|Reverse(p)| p.at <= now) {
            let Some(Reverse(p)) = self.inflight.pop() else {
                break;
            };
            self.deliver(nodes, now, p.datagram);
            any = true;
        }
        any
    }
}

impl Capture {
    fn write(&mut self, at: Duration, src: SocketAddr, dst: SocketAddr, bytes: &[u8]) {
        let Some(sink) = self.sink.as_mut() else {
            return;
        };
        let Some(ip) = IpContext::between(src, dst) else {
            return;
        };
        if let Err(e) = sink.write_packet(at, &ip, bytes) {
            self.error.get_or_insert(e.to_string());
            self.sink = None;
        }
    }
}

/// What the fault model sees of a datagram: its BTH fields and AETH syndrome.
fn datagram_meta(src: usize, dst: usize, bytes: &[u8]) -> DatagramMeta {
    let (opcode, dest_qpn, psn) = match Bth::new_checked(bytes) {
        Ok(bth) => (bth.opcode(), bth.dest_qp(), bth.psn()),
        Err(_) => (Opcode::Unknown(0xFF), 0, Psn::new(0)),
    };
    let aeth_syndrome = opcode
        .ext_headers()
        .filter(|h| h.aeth)
        .and_then(|_| bytes.get(BTH_LEN).copied());
    DatagramMeta {
        src: node_id(src),
        dst: node_id(dst),
        dest_qpn,
        opcode,
        psn,
        aeth_syndrome,
        len: bytes.len(),
    }
}

/// One node as the pump sees it.
pub(crate) trait PumpNode {
    fn parts(&mut self) -> (&mut Hca, &DeviceMemory, SocketAddr);
}

/// Steps one pump may take before it returns to the caller.
pub(crate) const PUMP_BUDGET: usize = 1 << 16;

/// Drains every HCA's transmit queue at `now`; true if anything was sent.
fn transmit_all<N: PumpNode>(wire: &mut Wire, nodes: &mut [N], now: Instant) -> bool {
    let mut sent = false;
    for (i, node) in nodes.iter_mut().enumerate() {
        match wire.dirty.get_mut(i) {
            Some(d) if *d => *d = false,
            _ => continue,
        }
        let (hca, mem, addr) = node.parts();
        loop {
            let mut buf = wire.buffer();
            let Some(tx) = hca.poll_transmit(now, mem, &mut buf) else {
                wire.pool.push(buf);
                break;
            };
            sent = true;
            let src = SocketAddr::new(addr.ip(), tx.src_port);
            let len = tx.len.min(buf.len());
            wire.send(now, i, src, tx.dst, buf, len);
        }
    }
    sent
}

/// The earliest HCA timer deadline.
pub(crate) fn next_timer<N: PumpNode>(nodes: &mut [N]) -> Option<Instant> {
    nodes
        .iter_mut()
        .filter_map(|n| n.parts().0.poll_timeout())
        .min()
}

/// The earliest pending event of any kind (delivery, timed hold, timer).
pub(crate) fn next_event<N: PumpNode>(wire: &Wire, nodes: &mut [N]) -> Option<Instant> {
    match (wire.next_delivery(), next_timer(nodes)) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Fires the timers of every node due at `now`.
fn fire_timers<N: PumpNode>(wire: &mut Wire, nodes: &mut [N], now: Instant) {
    for (i, node) in nodes.iter_mut().enumerate() {
        let (hca, mem, _) = node.parts();
        if hca.poll_timeout().is_some_and(|t| t <= now) {
            hca.handle_timeout(now, mem);
            wire.mark(i);
        }
    }
}

/// Runs the fabric toward `goal` (module doc).
pub(crate) fn pump<N: PumpNode>(wire: &mut Wire, nodes: &mut [N], goal: Goal) -> Pumped {
    let mut out = Pumped::default();
    // The call before this pump may have given any node work.
    wire.dirty.iter_mut().for_each(|d| *d = true);
    for _ in 0..PUMP_BUDGET {
        wire.tick();
        let now = wire.now;
        let sent = transmit_all(wire, nodes, now);
        if wire.deliver_due(nodes, now) || sent {
            continue;
        }
        let timer = next_timer(nodes);
        if wire.is_real_time() {
            if timer.is_some_and(|t| t <= now) {
                fire_timers(wire, nodes, now);
                continue;
            }
            return out;
        }
        // Virtual time, idle at `now`: jump to the next delivery unless a timer comes first.
        if let Some(at) = wire.next_delivery() {
            if timer.is_none_or(|t| at <= t) {
                wire.now = at.max(now);
                continue;
            }
        }
        let may_fire = |t: Instant| match goal {
            Goal::Settle => false,
            Goal::NextTimer => !out.fired,
            Goal::Until(until) => t <= until,
        };
        match timer {
            Some(t) if may_fire(t) => {
                wire.now = t.max(now);
                let now = wire.now;
                fire_timers(wire, nodes, now);
                out.fired = true;
            }
            _ => {
                if let Goal::Until(until) = goal {
                    wire.now = wire.now.max(until);
                }
                return out;
            }
        }
    }
    out.exhausted = true;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_hasher_is_stable_and_length_aware() {
        let h = |b: &[u8]| {
            let mut t = TraceHasher::new();
            t.bytes(b);
            t.finish()
        };
        assert_eq!(h(b"abc"), h(b"abc"));
        assert_ne!(h(b"abc"), h(b"abc\0"));
        assert_ne!(h(b""), h(b"\0"));
        assert_ne!(h(b"0123456789"), h(b"0123456789x"));
    }

    #[test]
    fn meta_reads_bth_and_aeth() {
        let mut ack = [0u8; 20];
        ack[0] = 0x11; // ACKNOWLEDGE
        ack[5..8].copy_from_slice(&[0, 0, 0x12]);
        ack[9..12].copy_from_slice(&[0, 0, 7]);
        ack[12] = 0x60; // NAK PSN sequence error
        let m = datagram_meta(1, 0, &ack);
        assert_eq!((m.src, m.dst), (NodeId(1), NodeId(0)));
        assert_eq!(m.opcode, Opcode::Acknowledge);
        assert_eq!(m.dest_qpn, 0x12);
        assert_eq!(m.psn, Psn::new(7));
        assert_eq!(m.aeth_syndrome, Some(0x60));
        assert_eq!(m.len, 20);
        let m = datagram_meta(0, 1, &[4; 3]);
        assert_eq!(m.opcode, Opcode::Unknown(0xFF));
        assert_eq!(m.aeth_syndrome, None);
    }
}
