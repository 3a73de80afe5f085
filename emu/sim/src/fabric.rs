//! The in-memory network between emulated devices, driven in virtual time.
//!
//! After every verbs call the fabric is *pumped*: every HCA's transmit queue is drained into
//! an in-flight heap keyed by `(deliver_at, seq)` (the sequence number breaks ties
//! deterministically), due packets are delivered, and when nothing is due virtual time jumps to
//! the next delivery or timer deadline. A pump is bounded by a step budget, so a QP that retries
//! forever (e.g. `rnr_retry` 7 with no receive posted) cannot hang the caller; the next call
//! continues from where it stopped.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use emu_proto::{AtomicOp, Hca, Instant, MAX_PACKET_LEN, Memory, MemoryFault};

use crate::region::Region;

/// MR memory of one node, by key index (`lkey >> 8`).
#[derive(Debug, Default)]
pub(crate) struct NodeMemory {
    pub(crate) regions: HashMap<u32, Arc<Region>>,
}

impl NodeMemory {
    fn region(&self, key: u32, offset: u64) -> Result<(&Region, usize), MemoryFault> {
        let region = self.regions.get(&(key >> 8)).ok_or(MemoryFault)?;
        let offset = usize::try_from(offset).map_err(|_| MemoryFault)?;
        Ok((region, offset))
    }
}

impl Memory for NodeMemory {
    fn read(&self, key: u32, offset: u64, buf: &mut [u8]) -> Result<(), MemoryFault> {
        let (region, offset) = self.region(key, offset)?;
        region.read(offset, buf).map_err(|_| MemoryFault)
    }

    fn write(&self, key: u32, offset: u64, data: &[u8]) -> Result<(), MemoryFault> {
        let (region, offset) = self.region(key, offset)?;
        region.write(offset, data).map_err(|_| MemoryFault)
    }

    fn atomic(&self, key: u32, offset: u64, op: AtomicOp) -> Result<u64, MemoryFault> {
        let (region, offset) = self.region(key, offset)?;
        region.atomic(offset, op).map_err(|_| MemoryFault)
    }
}

/// A datagram on its way.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct InFlight {
    at: Instant,
    seq: u64,
    dst: usize,
    src: SocketAddr,
    bytes: Vec<u8>,
}

/// The wire between nodes: latency, the in-flight heap and a pool of packet buffers.
#[derive(Debug)]
pub(crate) struct Wire {
    pub(crate) now: Instant,
    pub(crate) latency: Duration,
    inflight: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    pool: Vec<Vec<u8>>,
    /// Datagrams sent to an address no node has.
    pub(crate) undeliverable: u64,
}

impl Wire {
    pub(crate) fn new(latency: Duration) -> Wire {
        Wire {
            now: Instant::ZERO,
            latency,
            inflight: BinaryHeap::new(),
            seq: 0,
            pool: Vec::new(),
            undeliverable: 0,
        }
    }
}

/// One node as the pump sees it.
pub(crate) trait PumpNode {
    fn parts(&mut self) -> (&mut Hca, &NodeMemory, SocketAddr);
}

/// Steps one pump may take before it returns to the caller.
pub(crate) const PUMP_BUDGET: usize = 1 << 16;

/// Moves packets and time forward until nothing is left to do or the budget is spent.
pub(crate) fn pump<N: PumpNode>(wire: &mut Wire, nodes: &mut [N]) {
    let addrs: Vec<SocketAddr> = nodes.iter_mut().map(|n| n.parts().2).collect();
    let mut budget = PUMP_BUDGET;
    while budget > 0 {
        budget -= 1;
        let now = wire.now;
        let mut sent = false;
        for node in nodes.iter_mut() {
            let (hca, mem, src) = node.parts();
            loop {
                let mut buf = wire.pool.pop().unwrap_or_default();
                buf.resize(MAX_PACKET_LEN, 0);
                let Some(tx) = hca.poll_transmit(now, mem, &mut buf) else {
                    wire.pool.push(buf);
                    break;
                };
                sent = true;
                buf.truncate(tx.len);
                let src = SocketAddr::new(src.ip(), tx.src_port);
                match addrs.iter().position(|a| *a == tx.dst) {
                    Some(dst) => {
                        wire.seq += 1;
                        wire.inflight.push(Reverse(InFlight {
                            at: now + wire.latency,
                            seq: wire.seq,
                            dst,
                            src,
                            bytes: buf,
                        }));
                    }
                    None => {
                        wire.undeliverable += 1;
                        wire.pool.push(buf);
                    }
                }
            }
        }
        let mut delivered = false;
        while let Some(Reverse(head)) = wire.inflight.peek() {
            if head.at > now {
                break;
            }
            let Some(Reverse(pkt)) = wire.inflight.pop() else {
                break;
            };
            if let Some(node) = nodes.get_mut(pkt.dst) {
                let (hca, mem, _) = node.parts();
                hca.handle_datagram(now, pkt.src, &pkt.bytes, mem);
            }
            wire.pool.push(pkt.bytes);
            delivered = true;
        }
        if sent || delivered {
            continue;
        }
        // Idle at `now`: fire due timers, else jump virtual time to the next event.
        let next_packet = wire.inflight.peek().map(|Reverse(p)| p.at);
        let next_timer = nodes
            .iter_mut()
            .filter_map(|n| n.parts().0.poll_timeout())
            .min();
        if next_timer.is_some_and(|t| t <= now) {
            for node in nodes.iter_mut() {
                let (hca, mem, _) = node.parts();
                hca.handle_timeout(now, mem);
            }
            continue;
        }
        match (next_packet, next_timer) {
            (None, None) => return,
            (a, b) => {
                wire.now = a.into_iter().chain(b).min().unwrap_or(now);
            }
        }
    }
}
