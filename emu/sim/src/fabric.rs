//! The in-memory network between emulated devices: the event loop ("pump"), the seeded fault
//! injector applied to every datagram, the trace hash, the pcap capture and the two clocks.
//!
//! # Events
//!
//! The pump moves four kinds of events, always in time order:
//!
//! * transmissions: every HCA's transmit queue is drained at `now`; each datagram goes through
//!   the fault stage ([`emu_fault::Stage`], judged by the [`Injector`], the same stage the UDP
//!   driver runs) and is scheduled (possibly several times, corrupted, truncated or delayed,
//!   always after the wire latency) in time order — the scheduling order breaks ties
//!   deterministically — or held;
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

use std::fs::File;
use std::io::BufWriter;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use emu_capture::{Capture, PcapSink};
use emu_device::DeviceMemory;
use emu_fault::{Buffers, Counters, Injector, Link, NodeId, Payload, Stage};
use emu_proto::{Hca, Instant, MAX_PACKET_LEN};

/// The node number the fault model and the trace use for device index `i`.
pub(crate) fn node_id(i: usize) -> NodeId {
    NodeId(u32::try_from(i).unwrap_or(u32::MAX))
}

/// A datagram on its way. `bytes` is a pool buffer of [`MAX_PACKET_LEN`] bytes, of which the
/// first `len` are the datagram. It came from UDP port `src_port` of node `src_node` (whose IP
/// is the wire's address of that node): kept as a port, not a `SocketAddr`, so that the stage
/// moves fewer bytes per datagram.
#[derive(Debug)]
struct Datagram {
    src_node: usize,
    dst: usize,
    src_port: u16,
    bytes: Vec<u8>,
    len: usize,
}

impl Payload for Datagram {
    fn bytes(&self) -> &[u8] {
        self.bytes.get(..self.len).unwrap_or(&self.bytes)
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.len.min(self.bytes.len());
        &mut self.bytes[..len]
    }

    fn set_len(&mut self, len: usize) {
        self.len = len;
    }
}

/// Spare packet buffers of [`MAX_PACKET_LEN`] bytes.
#[derive(Debug, Default)]
struct Pool(Vec<Vec<u8>>);

impl Pool {
    fn take(&mut self) -> Vec<u8> {
        self.0.pop().unwrap_or_else(|| vec![0; MAX_PACKET_LEN])
    }

    fn give(&mut self, buf: Vec<u8>) {
        self.0.push(buf);
    }
}

impl Buffers<Datagram> for Pool {
    fn copy(&mut self, original: &Datagram) -> Datagram {
        let mut bytes = self.take();
        let len = original.len.min(bytes.len());
        bytes[..len].copy_from_slice(&original.bytes[..len]);
        Datagram { bytes, ..*original }
    }

    fn recycle(&mut self, datagram: Datagram) {
        self.give(datagram.bytes);
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

/// The wire between nodes: clock, fault injector, the fault stage (in-flight and held
/// datagrams, with the latency), observers (trace hash, capture, record) and a pool of packet
/// buffers.
#[derive(Debug)]
pub(crate) struct Wire {
    pub(crate) now: Instant,
    clock: Clock,
    /// Every node's address, by device index.
    addrs: Vec<SocketAddr>,
    stage: Stage<Datagram>,
    pub(crate) injector: Injector,
    trace: TraceHasher,
    delivered: u64,
    capture: Option<Capture>,
    record: Option<Vec<TraceRecord>>,
    pool: Pool,
    /// The buffer the next `poll_transmit` writes into: it stays here while transmit queues
    /// come back empty and is replaced from `pool` only when a datagram leaves in it.
    spare: Vec<u8>,
    /// Nodes that may have something to transmit: every node at the start of a pump
    /// (`all_dirty`), then those that received a datagram or fired a timer. Saves
    /// `poll_transmit` calls that would return nothing.
    dirty: Vec<bool>,
    /// Every node counts as dirty: set at the start of a pump instead of filling `dirty`.
    all_dirty: bool,
    /// `all_dirty` or some entry of `dirty` may be true: false lets a pump step that follows a
    /// step with nothing delivered (a jump in virtual time, the step after a send) skip the
    /// scan.
    any_dirty: bool,
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
            clock,
            addrs: config.addrs.clone(),
            stage: Stage::new(config.latency),
            injector: config.injector,
            trace: TraceHasher::new(),
            delivered: 0,
            capture: config
                .capture
                .map(|sink| Capture::new(sink, config.addrs.clone())),
            record: config.record.then(Vec::new),
            pool: Pool::default(),
            spare: vec![0; MAX_PACKET_LEN],
            dirty: vec![true; config.addrs.len()],
            all_dirty: true,
            any_dirty: true,
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
        self.stage.len()
    }

    /// Moves every held datagram to the wire, due after the link latency.
    pub(crate) fn release_all_held(&mut self) {
        self.stage.release_held(self.now);
    }

    /// Stops capturing: flushes and closes the pcap file. Returns the first error met while
    /// capturing or closing; `Ok` if no capture was configured.
    pub(crate) fn finish_capture(&mut self) -> Result<(), String> {
        self.capture.as_ref().map_or(Ok(()), Capture::finish)
    }

    /// The datagrams recorded since the last call (empty unless recording was enabled).
    pub(crate) fn take_record(&mut self) -> Vec<TraceRecord> {
        self.record.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Notes that node `i` may have something to transmit.
    fn mark(&mut self, i: usize) {
        if let Some(d) = self.dirty.get_mut(i) {
            *d = true;
            self.any_dirty = true;
        }
    }

    /// Puts one transmitted datagram (the first `len` bytes of `buf`, from UDP port `src_port`
    /// of node `src_node`) through the fault stage.
    fn send(
        &mut self,
        now: Instant,
        src_node: usize,
        src_port: u16,
        to: SocketAddr,
        buf: Vec<u8>,
        len: usize,
    ) {
        let Some(dst) = self.addrs.iter().position(|a| *a == to) else {
            self.undeliverable += 1;
            self.pool.give(buf);
            return;
        };
        let datagram = Datagram {
            src_node,
            dst,
            src_port,
            bytes: buf,
            len,
        };
        let link = Link::new(node_id(src_node), node_id(dst));
        self.stage
            .submit(&mut self.injector, now, link, datagram, &mut self.pool);
    }

    /// Feeds `d` to its destination and the observers at `now`.
    fn deliver<N: PumpNode>(&mut self, nodes: &mut [N], now: Instant, d: Datagram) {
        let bytes = &d.bytes[..d.len];
        // Every sender has an address: `transmit_all` polls only nodes of `dirty`, which has
        // one entry per address.
        let src_ip = self.addrs.get(d.src_node).map(SocketAddr::ip);
        let src = SocketAddr::new(
            src_ip.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
            d.src_port,
        );
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
        if let (Some(capture), Some(to)) = (self.capture.as_ref(), self.addrs.get(d.dst)) {
            capture.writer().write(at, src, *to, bytes);
        }
        if let Some(node) = nodes.get_mut(d.dst) {
            let (hca, mem) = node.parts();
            hca.handle_datagram(now, src, bytes, mem);
            self.mark(d.dst);
        }
        self.pool.give(d.bytes);
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
        self.stage.next_due()
    }

    /// Delivers everything due at `now`; true if anything was (or a hold ended).
    fn deliver_due<N: PumpNode>(&mut self, nodes: &mut [N], now: Instant) -> bool {
        let mut any = self.stage.release_due(now);
        while let Some(d) = self.stage.pop_due(now) {
            self.deliver(nodes, now, d);
            any = true;
        }
        any
    }
}

/// One node as the pump sees it. Its address is the wire's (`Wire::addrs`, by index): the
/// pump runs per packet and should not rebuild it from the node's GID each time.
pub(crate) trait PumpNode {
    fn parts(&mut self) -> (&mut Hca, &DeviceMemory);
}

/// Steps one pump may take before it returns to the caller.
pub(crate) const PUMP_BUDGET: usize = 1 << 16;

/// Drains every HCA's transmit queue at `now`; true if anything was sent.
fn transmit_all<N: PumpNode>(wire: &mut Wire, nodes: &mut [N], now: Instant) -> bool {
    if !std::mem::take(&mut wire.any_dirty) {
        return false;
    }
    let all = std::mem::take(&mut wire.all_dirty);
    let mut sent = false;
    for (i, node) in nodes.iter_mut().enumerate() {
        match wire.dirty.get_mut(i) {
            Some(d) if *d || all => *d = false,
            _ => continue,
        }
        let (hca, mem) = node.parts();
        // An empty poll leaves the spare buffer where it is; one that fills it sends it and
        // takes the next spare from the pool.
        while let Some(tx) = hca.poll_transmit(now, mem, &mut wire.spare) {
            let buf = std::mem::replace(&mut wire.spare, wire.pool.take());
            sent = true;
            let len = tx.len.min(buf.len());
            wire.send(now, i, tx.src_port, tx.dst, buf, len);
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
        let (hca, mem) = node.parts();
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
    wire.all_dirty = true;
    wire.any_dirty = true;
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
#[path = "../../fault/tests/support/stage_sequence.rs"]
mod stage_sequence;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::stage_sequence::{self, Backend, EXPECTED};
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

    /// The fabric's fault stage as the pump drives it: [`Wire::send`] for a datagram node 0
    /// transmits to node 1, the calls of `deliver_due` for what is due, and what
    /// `SimProvider::release` does. No latency, so times compare with the other backends.
    struct Fabric {
        wire: Wire,
        addrs: [SocketAddr; 2],
    }

    impl Fabric {
        fn new() -> Fabric {
            let addrs = ["127.0.0.1:4791", "127.0.0.2:4791"].map(|a| a.parse().unwrap());
            let wire = Wire::new(WireConfig {
                latency: Duration::ZERO,
                real_time: false,
                addrs: addrs.to_vec(),
                injector: Injector::new(stage_sequence::plan()).unwrap(),
                capture: None,
                record: false,
            });
            Fabric { wire, addrs }
        }

        fn pop(&mut self, now: Instant) -> Vec<Vec<u8>> {
            std::iter::from_fn(|| self.wire.stage.pop_due(now))
                .map(|d| d.bytes[..d.len].to_vec())
                .collect()
        }
    }

    impl Backend for Fabric {
        fn send(&mut self, now: Instant, bytes: &[u8]) -> Vec<Vec<u8>> {
            let mut buf = self.wire.pool.take();
            buf[..bytes.len()].copy_from_slice(bytes);
            let [from, to] = self.addrs;
            self.wire.send(now, 0, from.port(), to, buf, bytes.len());
            self.pop(now)
        }

        fn due(&mut self, now: Instant) -> Vec<Vec<u8>> {
            self.wire.stage.release_due(now);
            self.pop(now)
        }

        fn release(&mut self, now: Instant) -> Vec<Vec<u8>> {
            self.wire.now = now;
            self.wire.injector.release();
            self.wire.release_all_held();
            self.pop(now)
        }

        fn next_due(&self) -> Option<Instant> {
            self.wire.next_delivery()
        }

        fn injector(&self) -> &Injector {
            &self.wire.injector
        }
    }

    #[test]
    fn the_fabric_stage_decides_as_every_backend() {
        assert_eq!(stage_sequence::run(&mut Fabric::new()), EXPECTED);
    }
}
