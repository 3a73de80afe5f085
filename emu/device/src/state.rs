//! The state of one emulated device, behind whatever lock its backend uses: the HCA, its MR
//! memory, its completion channels and the routing of its async events to contexts.
//!
//! Not the locking, the clock or the packet I/O: those are the backend's [`crate::Port`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use emu_proto::{ChannelId, EventRouter, Hca, MrInfo, PdId};
use mr_region::Region;
use verbs_api::{AccessFlags, Error, Result};

use crate::channel::ChannelShared;
use crate::memory::DeviceMemory;

/// Virtual address of a device's first emulator-owned MR with [`MrAddresses::Synthetic`].
const FIRST_IOVA: u64 = 0x1000_0000;
/// Page size for synthetic MR addresses.
const PAGE: u64 = 4096;

/// Which virtual address an MR whose memory the emulator allocates (`alloc_mr`,
/// `reg_mr_file`) gets. Caller memory (`reg_mr_raw`) always keeps its own address.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum MrAddresses {
    /// The host address of the memory.
    Host,
    /// Synthetic, deterministic addresses per device (from `0x1000_0000`, page aligned, a
    /// guard page between regions), so that the same calls put the same addresses on the
    /// wire (RETH, AtomicETH) in every run.
    Synthetic,
}

/// Everything a verbs call or the backend's progress may touch on one device.
#[derive(Debug)]
pub struct DeviceState {
    /// The engine.
    pub hca: Hca,
    /// The MR memory the engine reads and writes.
    pub mem: DeviceMemory,
    /// Completion channels by id: where CQ notifications go.
    pub channels: HashMap<ChannelId, Arc<ChannelShared>>,
    /// Async events per context (rc-transport.md §5.3; `ibv_get_async_event` is per context).
    pub events: EventRouter,
    /// The next synthetic MR address; `None` with [`MrAddresses::Host`].
    next_iova: Option<u64>,
}

impl DeviceState {
    /// A device around `hca`, with no MR, channel or context yet.
    pub fn new(hca: Hca, addresses: MrAddresses) -> DeviceState {
        DeviceState {
            hca,
            mem: DeviceMemory::default(),
            channels: HashMap::new(),
            events: EventRouter::default(),
            next_iova: (addresses == MrAddresses::Synthetic).then_some(FIRST_IOVA),
        }
    }

    /// The device's address on the network: its GID's IP and its UDP port.
    pub fn addr(&self) -> SocketAddr {
        let config = self.hca.config();
        SocketAddr::new(config.gid.to_ip(), config.udp_port)
    }

    /// Hands what the HCA produced to the application side: channel notifications (the
    /// channel's fd becomes readable) and async events (queued for the owning context).
    pub fn deliver(&mut self) {
        while let Some(n) = self.hca.poll_notification() {
            if let Some(ch) = self.channels.get(&n.channel) {
                ch.signal(n.cq.0);
                self.hca.cq_event_delivered(n.cq);
            }
        }
        while let Some(e) = self.hca.poll_event() {
            self.events.route(e);
        }
    }

    /// Registers `region` as an MR of `pd` and routes its key to it. Emulator-owned memory
    /// (`owned`) gets a synthetic address with [`MrAddresses::Synthetic`]; otherwise the MR's
    /// virtual address is the region's host address.
    ///
    /// Errors: those of [`Hca::reg_mr`]; `NoMemory` when the synthetic address space is used
    /// up.
    pub(crate) fn register(
        &mut self,
        pd: PdId,
        region: &Arc<Region>,
        access: AccessFlags,
        owned: bool,
    ) -> Result<MrInfo> {
        let len = region.len() as u64;
        let (iova, next) = match self.next_iova {
            Some(iova) if owned => {
                // One guard page between regions.
                let next = len
                    .checked_next_multiple_of(PAGE)
                    .and_then(|l| iova.checked_add(l + PAGE))
                    .ok_or_else(|| Error::no_memory("MR address space exhausted"))?;
                (iova, Some(next))
            }
            next => (region.addr(), next),
        };
        let info = self.hca.reg_mr(pd, iova, len, access)?;
        self.next_iova = next;
        self.mem.insert(info.lkey, region.clone());
        Ok(info)
    }
}
