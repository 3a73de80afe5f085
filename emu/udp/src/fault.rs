//! The fault model on the UDP path: a device judges the datagrams it sends with one
//! [`emu_fault::Injector`] and, separately, the datagrams it receives from its socket with
//! another (each when installed).
//!
//! The verdict's effects are carried out here, the same way for both directions: drops,
//! duplicates, corruption and truncation at once; delays through a small timer heap the
//! progress thread arms its poll timeout with; holds through [`HoldQueue`]. A send-side
//! verdict decides what goes on the wire; a receive-side verdict decides what the engine is
//! handed, so a device can inject faults on traffic from a peer that injects none itself (a
//! real RoCEv2 NIC, Linux rxe, an old softverbs).
//!
//! Both directions use the same node numbers: a sent datagram is the link `local → node of
//! the destination`, a received one `node of the source → local`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::SocketAddr;

use emu_fault::{DatagramMeta, HoldQueue, Injector, NodeId, Verdict};
use emu_proto::wire::{Packet as WirePacket, PacketRepr};
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
    /// of its IP address.
    pub(crate) nodes: HashMap<SocketAddr, NodeId>,
    /// The device's own node number.
    pub(crate) local: NodeId,
}

impl FaultConfig {
    /// The node number of `addr`: its own entry, else the entry of its IP with port 0, else
    /// [`UNKNOWN_NODE`].
    pub(crate) fn node_of(&self, addr: SocketAddr) -> NodeId {
        self.nodes
            .get(&addr)
            .or_else(|| self.nodes.get(&SocketAddr::new(addr.ip(), 0)))
            .copied()
            .unwrap_or(UNKNOWN_NODE)
    }

    /// Whether an injector is installed for `dir`.
    pub(crate) fn active(&self, dir: Direction) -> bool {
        match dir {
            Direction::Tx => self.injector.is_some(),
            Direction::Rx => self.rx_injector.is_some(),
        }
    }

    /// The verdict on a datagram crossing in direction `dir` to or from `peer` at `now`;
    /// `None` when no injector is installed for `dir` or the bytes do not parse as a RoCEv2
    /// packet (such a datagram passes unchanged: the engine never builds one, and the
    /// receiving engine drops and counts it).
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
        let meta = datagram_meta(src, dst, bytes)?;
        Some(injector.on_datagram(now, &meta))
    }
}

/// A datagram delayed by a fault rule.
#[derive(Debug)]
struct Delayed {
    at: Instant,
    seq: u64,
    packet: Datagram,
}

impl PartialEq for Delayed {
    fn eq(&self, other: &Delayed) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Delayed {}
impl PartialOrd for Delayed {
    fn partial_cmp(&self, other: &Delayed) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Delayed {
    fn cmp(&self, other: &Delayed) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// The progress thread's side of one direction: delayed and held datagrams.
#[derive(Debug, Default)]
pub(crate) struct FaultStage {
    delayed: BinaryHeap<Reverse<Delayed>>,
    held: HoldQueue<Datagram>,
    seq: u64,
}

/// What a rule sees of a datagram, from its BTH (and AETH); `None` if it does not parse.
pub(crate) fn datagram_meta(src: NodeId, dst: NodeId, bytes: &[u8]) -> Option<DatagramMeta> {
    let pkt = PacketRepr::parse(&WirePacket::new_unchecked(bytes)).ok()?;
    Some(DatagramMeta {
        src,
        dst,
        dest_qpn: pkt.bth.dest_qp,
        opcode: pkt.bth.opcode,
        psn: pkt.bth.psn,
        aeth_syndrome: pkt.aeth.map(|a| u8::from(a.syndrome)),
        len: bytes.len(),
    })
}

/// True if `verdict` hands the datagram on unchanged, now, exactly once.
pub(crate) fn passes(verdict: &Verdict) -> bool {
    matches!(verdict, Verdict::Deliver { delay } if delay.is_zero())
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

    /// Carries out `verdict` on `packet`, seen at `now`: deliveries due now are appended to
    /// `out` (the original last, copies first), later ones wait in the delay heap, a held
    /// datagram in the hold queue; a dropped buffer goes back to `pool`.
    pub(crate) fn carry_out(
        &mut self,
        verdict: Verdict,
        now: Instant,
        packet: Datagram,
        out: &mut VecDeque<Datagram>,
        pool: &mut Pool,
    ) {
        if let Verdict::Hold { until } = verdict {
            self.held.push(until, packet);
            return;
        }
        let mut deliveries = verdict.deliveries(now).peekable();
        if deliveries.peek().is_none() {
            pool.give(packet.buf);
            return;
        }
        let mut original = Some(packet);
        while let Some(delivery) = deliveries.next() {
            // The last delivery takes the original buffer; earlier ones copy it.
            let mut pkt = if deliveries.peek().is_none() {
                match original.take() {
                    Some(p) => p,
                    None => break,
                }
            } else {
                match original.as_ref() {
                    Some(template) => pool.copy(template.peer, template.bytes()),
                    None => break,
                }
            };
            pkt.len = delivery.edit.apply(pkt.bytes_mut());
            if delivery.at <= now {
                out.push_back(pkt);
            } else {
                self.seq += 1;
                self.delayed.push(Reverse(Delayed {
                    at: delivery.at,
                    seq: self.seq,
                    packet: pkt,
                }));
            }
        }
    }

    /// Moves delayed and held datagrams due at `now` (all held ones if `release`) to `out`.
    pub(crate) fn due(&mut self, now: Instant, release: bool, out: &mut VecDeque<Datagram>) {
        while self.delayed.peek().is_some_and(|Reverse(d)| d.at <= now) {
            if let Some(Reverse(d)) = self.delayed.pop() {
                out.push_back(d.packet);
            }
        }
        if release {
            out.extend(self.held.drain());
        }
        while let Some(p) = self.held.pop_due(now) {
            out.push_back(p);
        }
    }

    /// The next instant a delayed or held datagram becomes due.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        let delayed = self.delayed.peek().map(|Reverse(d)| d.at);
        delayed.into_iter().chain(self.held.next_due()).min()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use emu_fault::{FaultPlan, delay, drop, duplicate, hold};
    use emu_proto::wire::{BthRepr, IpContext, Opcode, Psn};

    use super::*;

    const NOW: Instant = Instant::from_nanos(1_000_000);

    fn dst() -> SocketAddr {
        "127.0.0.2:4791".parse().unwrap()
    }

    fn bytes() -> Vec<u8> {
        let bth = BthRepr {
            opcode: Opcode::SendOnly,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: BthRepr::DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp: 0x12,
            ack_req: true,
            psn: Psn::new(5),
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
        FaultConfig {
            injector: Some(Injector::new(plan.clone()).unwrap()),
            rx_injector: Some(Injector::new(plan).unwrap()),
            nodes: [(dst(), NodeId(1))].into_iter().collect(),
            local: NodeId(0),
        }
    }

    #[test]
    fn meta_comes_from_the_bth() {
        let p = packet();
        let meta = datagram_meta(NodeId(0), NodeId(1), p.bytes()).unwrap();
        assert_eq!(meta.dest_qpn, 0x12);
        assert_eq!(meta.opcode, Opcode::SendOnly);
        assert_eq!(meta.psn, Psn::new(5));
        assert_eq!(meta.aeth_syndrome, None);
        assert_eq!(meta.len, p.len);
        assert!(datagram_meta(NodeId(0), NodeId(1), &[1, 2, 3]).is_none());
    }

    #[test]
    fn no_plan_passes_everything() {
        let mut cfg = FaultConfig {
            injector: None,
            rx_injector: None,
            nodes: HashMap::new(),
            local: NodeId(0),
        };
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

        cfg.nodes.insert("127.0.0.9:0".parse().unwrap(), NodeId(9));
        assert_eq!(cfg.node_of("127.0.0.9:49152".parse().unwrap()), NodeId(9));
        assert_eq!(cfg.node_of(dst()), NodeId(1));
        assert_eq!(cfg.node_of("127.0.0.8:4791".parse().unwrap()), UNKNOWN_NODE);
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
}
