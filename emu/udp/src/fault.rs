//! The fault model on the UDP path: a device judges the datagrams it sends with one
//! [`emu_fault::Injector`] and, separately, the datagrams it receives from its socket with
//! another (each when installed).
//!
//! Datagrams are judged with [`Injector::judge`] (the one classifier, so every datagram
//! counts, one that does not parse as opcode `Unknown(0xFF)`) and the verdict is carried out by
//! [`emu_fault::Stage`], the stage the in-process fabric runs too, the same way for both
//! directions: what is due at once goes on, delayed and held datagrams wait in the stage, whose
//! next deadline the progress thread arms its poll timeout with. A send-side verdict decides
//! what goes on the wire; a receive-side verdict decides what the engine is handed, so a device
//! can inject faults on traffic from a peer that injects none itself (a real RoCEv2 NIC, Linux
//! rxe, an old softverbs).
//!
//! Both directions use the same node numbers: a sent datagram is the link `local → node of
//! the destination`, a received one `node of the source → local`.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use emu_fault::{Buffers, Injector, NodeId, Payload, Stage, Verdict};
use emu_proto::{Instant, MAX_PACKET_LEN};

/// The node number of an address no mapping names.
pub const UNKNOWN_NODE: NodeId = NodeId(u32::MAX);

/// Spare packet buffers kept for reuse.
const POOL_MAX: usize = 256;

/// One datagram inside the driver: its peer (the destination of a sent datagram, the source
/// of a received one) and its bytes, the first `len` of a pooled buffer.
#[derive(Debug)]
pub(crate) struct Datagram {
    pub(crate) peer: SocketAddr,
    pub(crate) buf: Vec<u8>,
    pub(crate) len: usize,
}

impl Datagram {
    /// The datagram's bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or(&self.buf)
    }

    /// The datagram's bytes, mutable.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.len.min(self.buf.len());
        &mut self.buf[..len]
    }
}

impl Payload for Datagram {
    fn bytes(&self) -> &[u8] {
        Datagram::bytes(self)
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        Datagram::bytes_mut(self)
    }

    fn set_len(&mut self, len: usize) {
        self.len = len;
    }
}

/// Reusable packet buffers. Every buffer handed out is at least [`MAX_PACKET_LEN`] bytes long
/// and keeps its length while in use (a datagram's own length is [`Datagram::len`]), so a
/// recycled buffer is never cleared or resized again.
#[derive(Debug, Default)]
pub(crate) struct Pool {
    free: Vec<Vec<u8>>,
}

impl Pool {
    /// A buffer of at least [`MAX_PACKET_LEN`] bytes (contents unspecified).
    pub(crate) fn take(&mut self) -> Vec<u8> {
        self.free.pop().unwrap_or_else(|| vec![0; MAX_PACKET_LEN])
    }

    /// Returns a buffer for reuse (dropped if the pool is full).
    pub(crate) fn give(&mut self, buf: Vec<u8>) {
        if self.free.len() < POOL_MAX && buf.len() >= MAX_PACKET_LEN {
            self.free.push(buf);
        }
    }

    /// A pooled copy of `bytes` from or to `peer`.
    pub(crate) fn copy(&mut self, peer: SocketAddr, bytes: &[u8]) -> Datagram {
        let mut buf = self.take();
        if buf.len() < bytes.len() {
            buf.resize(bytes.len(), 0);
        }
        buf[..bytes.len()].copy_from_slice(bytes);
        Datagram {
            peer,
            buf,
            len: bytes.len(),
        }
    }
}

impl Buffers<Datagram> for Pool {
    fn copy(&mut self, original: &Datagram) -> Datagram {
        Pool::copy(self, original.peer, original.bytes())
    }

    fn recycle(&mut self, datagram: Datagram) {
        self.give(datagram.buf);
    }
}

/// Which way a datagram crosses the device's socket.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Sent by this device.
    Tx,
    /// Received from the socket.
    Rx,
}

/// The run-time fault configuration of a device, shared by the application (which replaces
/// the plans) and the progress thread (which applies them).
#[derive(Debug)]
pub(crate) struct FaultConfig {
    /// Judges the datagrams the device sends.
    pub(crate) injector: Option<Injector>,
    /// Judges the datagrams the device receives from its socket.
    pub(crate) rx_injector: Option<Injector>,
    /// Node numbers of known addresses, including the device's own. Port 0 names every port
    /// of its IP address. Changed only through [`FaultConfig::set_node`].
    nodes: HashMap<SocketAddr, NodeId>,
    /// The latest address [`FaultConfig::node_of`] looked up and its answer: a device mostly
    /// talks to one peer, and this spares the one or two hashes of a look-up per datagram.
    last: Option<(SocketAddr, NodeId)>,
    /// The device's own node number.
    pub(crate) local: NodeId,
}

impl FaultConfig {
    /// A configuration with these plans, node numbers and own node number.
    pub(crate) fn new(
        injector: Option<Injector>,
        rx_injector: Option<Injector>,
        nodes: HashMap<SocketAddr, NodeId>,
        local: NodeId,
    ) -> FaultConfig {
        FaultConfig {
            injector,
            rx_injector,
            nodes,
            last: None,
            local,
        }
    }

    /// Names `addr`'s node number (port 0: every port of its IP); a later call for the same
    /// address wins.
    pub(crate) fn set_node(&mut self, addr: SocketAddr, node: NodeId) {
        self.nodes.insert(addr, node);
        // A new entry can change the answer for any cached address (port 0 covers many).
        self.last = None;
    }

    /// The node number of `addr`: its own entry, else the entry of its IP with port 0, else
    /// [`UNKNOWN_NODE`].
    pub(crate) fn node_of(&mut self, addr: SocketAddr) -> NodeId {
        if let Some((_, node)) = self.last.filter(|(a, _)| *a == addr) {
            return node;
        }
        let node = self
            .nodes
            .get(&addr)
            .or_else(|| self.nodes.get(&SocketAddr::new(addr.ip(), 0)))
            .copied()
            .unwrap_or(UNKNOWN_NODE);
        self.last = Some((addr, node));
        node
    }

    /// Whether an injector is installed for `dir`.
    pub(crate) fn active(&self, dir: Direction) -> bool {
        match dir {
            Direction::Tx => self.injector.is_some(),
            Direction::Rx => self.rx_injector.is_some(),
        }
    }

    /// The verdict on a datagram crossing in direction `dir` to or from `peer` at `now`;
    /// `None` when no injector is installed for `dir`. Every datagram is judged, one that does
    /// not parse too ([`emu_fault::DatagramMeta::classify`]).
    pub(crate) fn judge(
        &mut self,
        dir: Direction,
        now: Instant,
        peer: SocketAddr,
        bytes: &[u8],
    ) -> Option<Verdict> {
        if !self.active(dir) {
            // No plan for this direction: skip the node look-ups (two hashes per datagram).
            return None;
        }
        let (src, dst) = match dir {
            Direction::Tx => (self.local, self.node_of(peer)),
            Direction::Rx => (self.node_of(peer), self.local),
        };
        let injector = match dir {
            Direction::Tx => self.injector.as_mut()?,
            Direction::Rx => self.rx_injector.as_mut()?,
        };
        Some(injector.judge(now, src, dst, bytes))
    }
}

/// The progress thread's side of one direction: an [`emu_fault::Stage`] without latency (the
/// socket is the wire), emptied into the caller's queue.
#[derive(Debug)]
pub(crate) struct FaultStage {
    stage: Stage<Datagram>,
}

impl Default for FaultStage {
    fn default() -> FaultStage {
        FaultStage {
            stage: Stage::new(Duration::ZERO),
        }
    }
}

impl FaultStage {
    /// Judges `packet` (direction `dir`, at `now`) with `cfg` and carries out the verdict:
    /// what is due now is appended to `out`, in order. Dropped buffers go back to `pool`.
    pub(crate) fn apply(
        &mut self,
        cfg: &mut FaultConfig,
        dir: Direction,
        now: Instant,
        packet: Datagram,
        out: &mut VecDeque<Datagram>,
        pool: &mut Pool,
    ) {
        match cfg.judge(dir, now, packet.peer, packet.bytes()) {
            Some(verdict) => self.carry_out(verdict, now, packet, out, pool),
            None => out.push_back(packet),
        }
    }

    /// Judges the datagram `bytes` received from `peer` at `now` with `cfg`'s receive-side
    /// plan, if any. True if it passes unchanged: the caller hands `bytes` on as they are,
    /// uncopied. Otherwise a copy went through the stage and what is due now was appended to
    /// `out`.
    pub(crate) fn receive(
        &mut self,
        cfg: Option<&mut FaultConfig>,
        now: Instant,
        peer: SocketAddr,
        bytes: &[u8],
        out: &mut VecDeque<Datagram>,
        pool: &mut Pool,
    ) -> bool {
        match cfg.and_then(|c| c.judge(Direction::Rx, now, peer, bytes)) {
            Some(verdict) if !verdict.passes() => {
                let copy = pool.copy(peer, bytes);
                self.carry_out(verdict, now, copy, out, pool);
                false
            }
            _ => true,
        }
    }

    /// Carries out `verdict` on `packet`, seen at `now` ([`Stage::carry_out`]), and appends
    /// what is due now to `out`, in time order (copies before the original); a dropped buffer
    /// goes back to `pool`.
    pub(crate) fn carry_out(
        &mut self,
        verdict: Verdict,
        now: Instant,
        packet: Datagram,
        out: &mut VecDeque<Datagram>,
        pool: &mut Pool,
    ) {
        // The common case (a datagram passes and nothing in the stage is due yet): what the
        // stage would do, scheduling it for now (its latency is zero on a socket) and popping
        // it alone, without its heap.
        if verdict.passes() && self.stage.next_due().is_none_or(|t| t > now) {
            out.push_back(packet);
            return;
        }
        self.stage.carry_out(verdict, now, packet, pool);
        self.pop_due(now, out);
    }

    /// Moves delayed and held datagrams due at `now` (all held ones if `release`) to `out`.
    pub(crate) fn due(&mut self, now: Instant, release: bool, out: &mut VecDeque<Datagram>) {
        if release {
            self.stage.release_held(now);
        }
        self.stage.release_due(now);
        self.pop_due(now, out);
    }

    fn pop_due(&mut self, now: Instant, out: &mut VecDeque<Datagram>) {
        while let Some(d) = self.stage.pop_due(now) {
            out.push_back(d);
        }
    }

    /// The next instant a delayed or held datagram becomes due.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.stage.next_due()
    }
}

#[cfg(test)]
#[path = "../../fault/tests/support/stage_sequence.rs"]
mod stage_sequence;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use emu_fault::{FaultPlan, delay, drop, duplicate, hold};
    use emu_proto::wire::{BthRepr, IpContext, Opcode, PacketRepr, Psn};

    use super::stage_sequence::{self, Backend, DST, EXPECTED, SRC};
    use super::*;

    const NOW: Instant = Instant::from_nanos(1_000_000);

    fn dst() -> SocketAddr {
        "127.0.0.2:4791".parse().unwrap()
    }

    fn bytes() -> Vec<u8> {
        let bth = BthRepr {
            ack_req: true,
            ..BthRepr::new(Opcode::SendOnly, 0x12, Psn::new(5))
        };
        let repr = PacketRepr::new(bth, b"payload!");
        let ip = IpContext::v4(
            "127.0.0.1".parse().unwrap(),
            "127.0.0.2".parse().unwrap(),
            1,
        );
        let mut bytes = vec![0; repr.buffer_len()];
        repr.emit(&ip, &mut bytes).unwrap();
        bytes
    }

    fn packet() -> Datagram {
        Pool::default().copy(dst(), &bytes())
    }

    fn config(plan: FaultPlan) -> FaultConfig {
        FaultConfig::new(
            Some(Injector::new(plan.clone()).unwrap()),
            Some(Injector::new(plan).unwrap()),
            [(dst(), NodeId(1))].into_iter().collect(),
            NodeId(0),
        )
    }

    #[test]
    fn every_datagram_is_judged_even_one_that_does_not_parse() {
        let mut cfg = config(FaultPlan::new(1).rule(drop(1.0).opcode(Opcode::Unknown(0xFF))));
        let (mut stage, mut out, mut pool) =
            (FaultStage::default(), VecDeque::new(), Pool::default());
        stage.apply(&mut cfg, Direction::Rx, NOW, packet(), &mut out, &mut pool);
        let garbage = pool.copy(dst(), &[1, 2, 3]);
        stage.apply(&mut cfg, Direction::Rx, NOW, garbage, &mut out, &mut pool);
        assert_eq!(out.len(), 1, "the short datagram is dropped");
        let rx = cfg.rx_injector.as_ref().unwrap().counters().total();
        assert_eq!((rx.passed, rx.dropped), (1, 1));
    }

    #[test]
    fn no_plan_passes_everything() {
        let mut cfg = FaultConfig::new(None, None, HashMap::new(), NodeId(0));
        let (mut stage, mut out, mut pool) =
            (FaultStage::default(), VecDeque::new(), Pool::default());
        for dir in [Direction::Tx, Direction::Rx] {
            assert!(!cfg.active(dir));
            stage.apply(&mut cfg, dir, NOW, packet(), &mut out, &mut pool);
        }
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn drop_duplicate_delay_hold() {
        let (mut stage, mut out, mut pool) =
            (FaultStage::default(), VecDeque::new(), Pool::default());
        let mut cfg = config(FaultPlan::new(1).rule(drop(1.0).to(NodeId(1))));
        stage.apply(&mut cfg, Direction::Tx, NOW, packet(), &mut out, &mut pool);
        assert!(out.is_empty());
        assert_eq!(pool.free.len(), 1, "a dropped buffer is recycled");

        let mut cfg = config(FaultPlan::new(1).rule(duplicate(2)));
        stage.apply(&mut cfg, Direction::Tx, NOW, packet(), &mut out, &mut pool);
        assert_eq!(out.len(), 3);
        assert!(out.iter().all(|p| p.bytes() == bytes()));
        out.clear();

        let d = Duration::from_millis(5);
        let mut cfg = config(FaultPlan::new(1).rule(delay(d..=d)));
        stage.apply(&mut cfg, Direction::Tx, NOW, packet(), &mut out, &mut pool);
        assert!(out.is_empty());
        assert_eq!(stage.next_due(), Some(NOW + d));
        stage.due(NOW + Duration::from_millis(4), false, &mut out);
        assert!(out.is_empty());
        stage.due(NOW + d, false, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(stage.next_due(), None);
        out.clear();

        let mut cfg = config(FaultPlan::new(1).rule(hold()));
        stage.apply(&mut cfg, Direction::Tx, NOW, packet(), &mut out, &mut pool);
        stage.due(NOW + Duration::from_secs(60), false, &mut out);
        assert!(out.is_empty(), "an untimed hold waits for release");
        stage.due(NOW + Duration::from_secs(60), true, &mut out);
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn the_receive_side_sees_the_link_from_the_source() {
        // A rule on the link 1 -> 0 drops what device 0 receives from node 1, not what it
        // sends there.
        let mut cfg = config(FaultPlan::new(1).rule(drop(1.0).from(NodeId(1)).to(NodeId(0))));
        let (mut stage, mut out, mut pool) =
            (FaultStage::default(), VecDeque::new(), Pool::default());
        stage.apply(&mut cfg, Direction::Tx, NOW, packet(), &mut out, &mut pool);
        assert_eq!(out.len(), 1);
        stage.apply(&mut cfg, Direction::Rx, NOW, packet(), &mut out, &mut pool);
        assert_eq!(out.len(), 1);
        let rx = cfg.rx_injector.as_ref().unwrap().counters().total();
        assert_eq!(rx.dropped, 1);
    }

    #[test]
    fn unknown_addresses_get_the_unknown_node_and_port_zero_names_every_port() {
        let mut cfg = config(FaultPlan::new(1).rule(drop(1.0).to(UNKNOWN_NODE)));
        let (mut stage, mut out, mut pool) =
            (FaultStage::default(), VecDeque::new(), Pool::default());
        stage.apply(&mut cfg, Direction::Tx, NOW, packet(), &mut out, &mut pool);
        assert_eq!(out.len(), 1, "a known destination is not the unknown node");
        let mut stranger = packet();
        stranger.peer = "127.0.0.9:4791".parse().unwrap();
        stage.apply(&mut cfg, Direction::Tx, NOW, stranger, &mut out, &mut pool);
        assert_eq!(out.len(), 1);

        // The stranger's answer is cached; naming its IP's node must replace it.
        cfg.set_node("127.0.0.9:0".parse().unwrap(), NodeId(9));
        assert_eq!(cfg.node_of("127.0.0.9:4791".parse().unwrap()), NodeId(9));
        assert_eq!(cfg.node_of("127.0.0.9:49152".parse().unwrap()), NodeId(9));
        cfg.set_node("127.0.0.9:49152".parse().unwrap(), NodeId(10));
        assert_eq!(cfg.node_of("127.0.0.9:49152".parse().unwrap()), NodeId(10));
        assert_eq!(cfg.node_of(dst()), NodeId(1));
        assert_eq!(cfg.node_of(dst()), NodeId(1), "cached");
        assert_eq!(cfg.node_of("127.0.0.8:4791".parse().unwrap()), UNKNOWN_NODE);
    }

    /// A passing datagram skips the stage only while nothing in it is due: a delayed one due
    /// by then still leaves first, and one due later leaves after.
    #[test]
    fn a_passing_datagram_leaves_after_a_delayed_one_already_due() {
        let ten = Duration::from_micros(10);
        let plan = FaultPlan::new(1).rule(delay(ten..=ten).nth(1));
        let mut cfg = config(plan);
        let (mut stage, mut out, mut pool) =
            (FaultStage::default(), VecDeque::new(), Pool::default());
        let tagged = |tag: u8| {
            let mut p = packet();
            let last = p.len - 1;
            p.bytes_mut()[last] = tag;
            p
        };
        let (first, second, third) = (tagged(1), tagged(2), tagged(3));
        stage.apply(&mut cfg, Direction::Tx, NOW, first, &mut out, &mut pool);
        assert!(out.is_empty(), "the first is delayed");
        let later = NOW + Duration::from_micros(20);
        stage.apply(&mut cfg, Direction::Tx, later, second, &mut out, &mut pool);
        let last_bytes =
            |out: &VecDeque<Datagram>| out.iter().map(|d| d.bytes()[d.len - 1]).collect::<Vec<_>>();
        assert_eq!(last_bytes(&out), [1, 2], "the due one first");
        stage.apply(&mut cfg, Direction::Tx, later, third, &mut out, &mut pool);
        assert_eq!(last_bytes(&out), [1, 2, 3]);
    }

    #[test]
    fn corrupt_and_truncate_edit_the_pooled_bytes() {
        let (mut stage, mut out, mut pool) =
            (FaultStage::default(), VecDeque::new(), Pool::default());
        let mut cfg = config(FaultPlan::new(3).rule(emu_fault::truncate(10)));
        stage.apply(&mut cfg, Direction::Rx, NOW, packet(), &mut out, &mut pool);
        let p = out.pop_front().unwrap();
        assert_eq!(p.bytes(), &bytes()[..10]);
        assert!(p.buf.len() >= MAX_PACKET_LEN, "the buffer keeps its size");
        let mut cfg = config(FaultPlan::new(3).rule(emu_fault::corrupt(1.0)));
        stage.apply(&mut cfg, Direction::Rx, NOW, packet(), &mut out, &mut pool);
        let p = out.pop_front().unwrap();
        assert_eq!(p.len, bytes().len());
        assert_ne!(p.bytes(), &bytes()[..]);
    }

    /// One side of a device's fault stage, driven as the engine drives it: the send side of
    /// node 0 ([`FaultStage::apply`] on what the engine pulled) or the receive side of node 1
    /// ([`FaultStage::receive`] on what the socket read), and [`FaultStage::due`] with a
    /// release as the progress thread runs them.
    struct Side {
        dir: Direction,
        cfg: FaultConfig,
        stage: FaultStage,
        pool: Pool,
        out: VecDeque<Datagram>,
    }

    impl Side {
        fn new(dir: Direction) -> Side {
            let (node0, node1): (SocketAddr, SocketAddr) =
                ("127.0.0.1:4791".parse().unwrap(), dst());
            let plan = || Some(Injector::new(stage_sequence::plan()).unwrap());
            let cfg = FaultConfig::new(
                if dir == Direction::Tx { plan() } else { None },
                if dir == Direction::Rx { plan() } else { None },
                [(node0, SRC), (node1, DST)].into_iter().collect(),
                if dir == Direction::Tx { SRC } else { DST },
            );
            let (stage, pool, out) = (FaultStage::default(), Pool::default(), VecDeque::new());
            Side {
                dir,
                cfg,
                stage,
                pool,
                out,
            }
        }

        /// The peer address of the other node.
        fn peer(&self) -> SocketAddr {
            let other = if self.dir == Direction::Tx { DST } else { SRC };
            let found = self.cfg.nodes.iter().find(|(_, n)| **n == other);
            *found.unwrap().0
        }

        fn drain(&mut self) -> Vec<Vec<u8>> {
            self.out.drain(..).map(|d| d.bytes().to_vec()).collect()
        }
    }

    impl Backend for Side {
        fn send(&mut self, now: Instant, bytes: &[u8]) -> Vec<Vec<u8>> {
            let (peer, dir) = (self.peer(), self.dir);
            if dir == Direction::Rx {
                let (cfg, out, pool) = (Some(&mut self.cfg), &mut self.out, &mut self.pool);
                if self.stage.receive(cfg, now, peer, bytes, out, pool) {
                    return vec![bytes.to_vec()];
                }
            } else {
                let d = self.pool.copy(peer, bytes);
                let (cfg, out, pool) = (&mut self.cfg, &mut self.out, &mut self.pool);
                self.stage.apply(cfg, dir, now, d, out, pool);
            }
            self.drain()
        }

        fn due(&mut self, now: Instant) -> Vec<Vec<u8>> {
            self.stage.due(now, false, &mut self.out);
            self.drain()
        }

        fn release(&mut self, now: Instant) -> Vec<Vec<u8>> {
            self.cfg.injector.iter_mut().for_each(Injector::release);
            self.cfg.rx_injector.iter_mut().for_each(Injector::release);
            self.stage.due(now, true, &mut self.out);
            self.drain()
        }

        fn next_due(&self) -> Option<Instant> {
            self.stage.next_due()
        }

        fn injector(&self) -> &Injector {
            let injector = self.cfg.injector.as_ref();
            injector.or(self.cfg.rx_injector.as_ref()).unwrap()
        }
    }

    #[test]
    fn both_sides_decide_as_every_backend() {
        for dir in [Direction::Tx, Direction::Rx] {
            let outcome = stage_sequence::run(&mut Side::new(dir));
            assert_eq!(outcome, EXPECTED, "{dir:?}");
        }
    }
}
