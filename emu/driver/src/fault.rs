//! The fault model on the UDP path: every datagram a device sends passes through its
//! [`emu_fault::Injector`] (when one is installed) before it reaches the socket.
//!
//! The verdict's effects are carried out here: drops, duplicates, corruption and truncation
//! at once; delays through a small timer heap the progress thread arms its poll timeout
//! with; holds through [`HoldQueue`]. Faults apply on the send side only, so that each datagram
//! is decided exactly once whichever process receives it (two processes each inject on their
//! own sends, which covers both directions).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::SocketAddr;

use emu_fault::{DatagramMeta, HoldQueue, Injector, NodeId, Verdict};
use emu_proto::Instant;
use emu_proto::wire::{Packet as WirePacket, PacketRepr};

/// The node number of a destination no mapping names.
pub const UNKNOWN_NODE: NodeId = NodeId(u32::MAX);

/// One datagram on its way out.
#[derive(Debug)]
pub(crate) struct OutPacket {
    pub(crate) dst: SocketAddr,
    pub(crate) bytes: Vec<u8>,
}

/// The run-time fault configuration of a device, shared by the application (which replaces
/// the plan) and the progress thread (which applies it).
#[derive(Debug)]
pub(crate) struct FaultConfig {
    pub(crate) injector: Option<Injector>,
    /// Node numbers of known addresses, including the device's own.
    pub(crate) nodes: HashMap<SocketAddr, NodeId>,
    /// The sending device's own node number.
    pub(crate) local: NodeId,
}

impl FaultConfig {
    fn node_of(&self, addr: SocketAddr) -> NodeId {
        self.nodes.get(&addr).copied().unwrap_or(UNKNOWN_NODE)
    }
}

/// A datagram delayed by a fault rule.
#[derive(Debug)]
struct Delayed {
    at: Instant,
    seq: u64,
    packet: OutPacket,
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

/// The progress thread's side: delayed and held datagrams.
#[derive(Debug, Default)]
pub(crate) struct FaultStage {
    delayed: BinaryHeap<Reverse<Delayed>>,
    held: HoldQueue<OutPacket>,
    seq: u64,
}

/// What a rule sees of a datagram, from its BTH (and AETH); `None` if it does not parse, in
/// which case it is sent unchanged (the engine never builds such a datagram).
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

impl FaultStage {
    /// Decides the fate of `packet` sent at `now` and queues what is due now on `out`.
    /// Dropped buffers go back to `pool`.
    pub(crate) fn apply(
        &mut self,
        cfg: &mut FaultConfig,
        now: Instant,
        packet: OutPacket,
        out: &mut VecDeque<OutPacket>,
        pool: &mut Vec<Vec<u8>>,
    ) {
        let (src, dst) = (cfg.local, cfg.node_of(packet.dst));
        let Some(injector) = cfg.injector.as_mut() else {
            out.push_back(packet);
            return;
        };
        let Some(meta) = datagram_meta(src, dst, &packet.bytes) else {
            out.push_back(packet);
            return;
        };
        let verdict = injector.on_datagram(now, &meta);
        if let Verdict::Hold { until } = verdict {
            self.held.push(until, packet);
            return;
        }
        let mut deliveries = verdict.deliveries(now).peekable();
        if deliveries.peek().is_none() {
            pool.push(packet.bytes);
            return;
        }
        let mut original = Some(packet);
        while let Some(delivery) = deliveries.next() {
            let Some(template) = original.as_ref() else {
                break;
            };
            // The last delivery takes the original buffer; earlier ones copy it.
            let mut pkt = if deliveries.peek().is_none() {
                match original.take() {
                    Some(p) => p,
                    None => break,
                }
            } else {
                OutPacket {
                    dst: template.dst,
                    bytes: template.bytes.clone(),
                }
            };
            let keep = delivery.edit.apply(&mut pkt.bytes);
            pkt.bytes.truncate(keep);
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
    pub(crate) fn due(&mut self, now: Instant, release: bool, out: &mut VecDeque<OutPacket>) {
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

    fn packet() -> OutPacket {
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
        OutPacket { dst: dst(), bytes }
    }

    fn config(plan: FaultPlan) -> FaultConfig {
        FaultConfig {
            injector: Some(Injector::new(plan).unwrap()),
            nodes: [(dst(), NodeId(1))].into_iter().collect(),
            local: NodeId(0),
        }
    }

    #[test]
    fn meta_comes_from_the_bth() {
        let p = packet();
        let meta = datagram_meta(NodeId(0), NodeId(1), &p.bytes).unwrap();
        assert_eq!(meta.dest_qpn, 0x12);
        assert_eq!(meta.opcode, Opcode::SendOnly);
        assert_eq!(meta.psn, Psn::new(5));
        assert_eq!(meta.aeth_syndrome, None);
        assert_eq!(meta.len, p.bytes.len());
        assert!(datagram_meta(NodeId(0), NodeId(1), &[1, 2, 3]).is_none());
    }

    #[test]
    fn no_plan_passes_everything() {
        let mut cfg = FaultConfig {
            injector: None,
            nodes: HashMap::new(),
            local: NodeId(0),
        };
        let (mut stage, mut out, mut pool) = (FaultStage::default(), VecDeque::new(), Vec::new());
        stage.apply(&mut cfg, NOW, packet(), &mut out, &mut pool);
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn drop_duplicate_delay_hold() {
        let (mut stage, mut out, mut pool) = (FaultStage::default(), VecDeque::new(), Vec::new());
        let mut cfg = config(FaultPlan::new(1).rule(drop(1.0).to(NodeId(1))));
        stage.apply(&mut cfg, NOW, packet(), &mut out, &mut pool);
        assert!(out.is_empty());
        assert_eq!(pool.len(), 1, "a dropped buffer is recycled");

        let mut cfg = config(FaultPlan::new(1).rule(duplicate(2)));
        stage.apply(&mut cfg, NOW, packet(), &mut out, &mut pool);
        assert_eq!(out.len(), 3);
        assert!(out.iter().all(|p| p.bytes == packet().bytes));
        out.clear();

        let d = Duration::from_millis(5);
        let mut cfg = config(FaultPlan::new(1).rule(delay(d..=d)));
        stage.apply(&mut cfg, NOW, packet(), &mut out, &mut pool);
        assert!(out.is_empty());
        assert_eq!(stage.next_due(), Some(NOW + d));
        stage.due(NOW + Duration::from_millis(4), false, &mut out);
        assert!(out.is_empty());
        stage.due(NOW + d, false, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(stage.next_due(), None);
        out.clear();

        let mut cfg = config(FaultPlan::new(1).rule(hold()));
        stage.apply(&mut cfg, NOW, packet(), &mut out, &mut pool);
        stage.due(NOW + Duration::from_secs(60), false, &mut out);
        assert!(out.is_empty(), "an untimed hold waits for release");
        stage.due(NOW + Duration::from_secs(60), true, &mut out);
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn unknown_destinations_get_the_unknown_node() {
        let mut cfg = config(FaultPlan::new(1).rule(drop(1.0).to(UNKNOWN_NODE)));
        let (mut stage, mut out, mut pool) = (FaultStage::default(), VecDeque::new(), Vec::new());
        stage.apply(&mut cfg, NOW, packet(), &mut out, &mut pool);
        assert_eq!(out.len(), 1, "a known destination is not the unknown node");
        let mut stranger = packet();
        stranger.dst = "127.0.0.9:4791".parse().unwrap();
        stage.apply(&mut cfg, NOW, stranger, &mut out, &mut pool);
        assert_eq!(out.len(), 1);
    }
}
