//! The software HCA: object tables, ownership checks, the QP state machine's effects, and the
//! queues of completions, events and channel notifications that drivers drain.
//!
//! `Hca` is the single object a driver talks to. Its methods fall in four groups:
//! (A) getters (`device_attr`, `query_qp`, …); (C) verbs commands (`create_*`, `modify_qp`,
//! `post_send`, …), all deterministic; (B) inputs from the network and timers (added with the
//! RC engine); (D) outputs, drained after every (B)/(C) call: `poll_event`,
//! `poll_notification` (and transmits and the next timer deadline with the RC engine).
//!
//! The HCA keeps metadata only. The bytes of memory regions belong to the driver, which maps
//! an MR's key to its memory; the HCA never dereferences an address.

use std::collections::VecDeque;

use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use verbs_api::{
    AccessFlags, AhAttr, AsyncEvent, AsyncEventKind, DeviceAttr, Error, ErrorKind, EventElement,
    Gid, LinkLayer, MwBind, MwType, PortAttr, PortState, PostError, QpAttr, QpAttrMask, QpInitAttr,
    QpState, QpType, RecvWr, Result, SendFlags, SendOp, SendWr, SrqAttr, WcOpcode, WcStatus,
    WorkCompletion,
};

use std::net::{IpAddr, SocketAddr};

use crate::config::HcaConfig;
use crate::cq::{Cq, Pushed};
pub use crate::ids::{AhId, ChannelId, CqId, MrInfo, PdId, SrqId};
use crate::memory::Memory;
use crate::mw::MwEntry;
use crate::qp::{self, Qp, RecvWqe, SendWqe};
use crate::rc::{self, Ctx, PacketClass, completer, requester, responder};
use crate::srq::SrqEntry;
use crate::stats::{RxDropCause, Stats};
use crate::table::Table;
use crate::time::Instant;
use crate::timers::TimerIndex;
use crate::wire::{self, IpContext, Packet, PacketRepr, Psn};

/// An armed CQ got a completion: the driver makes the channel's fd readable and reports `cq`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Notification {
    /// The channel to signal.
    pub channel: ChannelId,
    /// The CQ the event is for.
    pub cq: CqId,
}

/// One datagram for the driver to send: the RoCEv2 UDP payload is in the caller's buffer.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Destination address and UDP port.
    pub dst: SocketAddr,
    /// UDP source port (rc-transport.md §1.9); the ICRC covers it.
    pub src_port: u16,
    /// Bytes written to the buffer.
    pub len: usize,
    /// What the packet is (request, data-carrying response or bare ACK/NAK), so that a driver
    /// need not parse it to schedule it.
    pub class: PacketClass,
}

/// The buffer size [`Hca::poll_transmit`] needs.
pub const MAX_PACKET_LEN: usize = rc::MAX_PACKET_LEN;

/// Entries of port 1's GID table: a realistic length (RoCE HCAs have tens to hundreds, rxe
/// 1024), of which only index 0, the device's address, is populated.
pub const GID_TBL_LEN: u32 = 16;

/// The first QP number handed out (QPN 0 and 1 are the special QPs; rxe starts at 0x11).
pub const FIRST_QPN: u32 = 0x11;

/// The GSI's QP number (IBTA 14.2.5: QP1, the general services interface).
pub const GSI_QPN: u32 = 1;

/// The GSI's Q_Key (IBTA 14.2.5.7: the well-known Q_Key 0x8001_0000).
pub const GSI_QKEY: u32 = 0x8001_0000;

// The GSI must stay outside the numbers `create_qp` hands out.
const _: () = assert!(FIRST_QPN > GSI_QPN);

#[derive(Clone, Debug, Default)]
struct PdEntry {
    /// MRs, QPs and SRQs in this PD.
    refs: u32,
}

/// An address handle: its PD (kept busy) and the destination it resolves to.
#[derive(Clone, Debug)]
struct AhEntry {
    pd: PdId,
    dst: SocketAddr,
}

#[derive(Clone, Debug, Default)]
struct ChannelEntry {
    cq_refs: u32,
}

/// The software HCA. See the module documentation for the method groups.
///
/// Every command validates fully before it changes anything: a failed call leaves the HCA as it
/// was.
#[derive(Clone, Debug)]
pub struct Hca {
    config: HcaConfig,
    rng: ChaCha8Rng,
    pds: Table<PdEntry>,
    /// MRs by key index (key >> 8); index 0 is never used, so key 0 is never valid.
    mrs: Table<MrInfo>,
    /// Last random key byte used per MR index, so a new key always differs from the last.
    last_key_byte: Vec<u8>,
    /// Memory windows by table index (key index − `mw::MW_INDEX_BASE`).
    mws: Table<MwEntry>,
    cqs: Table<Cq>,
    channels: Table<ChannelEntry>,
    srqs: Table<SrqEntry>,
    ahs: Table<AhEntry>,
    /// QPs by `qpn - FIRST_QPN`.
    qps: Table<Qp>,
    /// The GSI (QPN 1), when open ([`Hca::create_gsi`]).
    gsi: Option<Qp>,
    events: VecDeque<AsyncEvent>,
    notifications: VecDeque<Notification>,
    /// QPs that may have a packet to send, each at most once (`rc.queued`).
    ready: VecDeque<u32>,
    /// Timer index: each QP's earliest deadline (lazy deletion: [`Hca::purge_timers`] after
    /// every change).
    timers: TimerIndex,
    /// Completions produced by the engine, pushed to CQs after each step.
    wcs: Vec<(CqId, WorkCompletion, bool)>,
    /// [`wire::ipv4_ident_basis`] by UDP payload length, for `foreign_ipv4_ident`.
    ident_bases: Vec<(usize, [u32; 16])>,
    /// Device-level counters (packets no QP took) plus the totals of destroyed QPs.
    stats: Stats,
    /// The device's IP address (its GID), cached: it is needed for every packet.
    own_ip: IpAddr,
    /// The IP context and ICRC prefixes of the last path a datagram came in on.
    rx_path: rc::tx::PathTemplate,
}

/// The context of one engine step over `$hca`'s tables, at `$now`, with memory `$mem`. A macro
/// rather than a method: it borrows the tables field by field, so the step may hold a QP of
/// `$hca.qps` at the same time.
macro_rules! step_ctx {
    ($hca:expr, $now:expr, $mem:expr) => {
        Ctx {
            now: $now,
            mrs: &$hca.mrs,
            mws: &mut $hca.mws,
            srqs: &mut $hca.srqs,
            mem: $mem,
            wcs: &mut $hca.wcs,
            events: &mut $hca.events,
        }
    };
}

impl Hca {
    /// A fresh HCA with no objects.
    pub fn new(config: HcaConfig) -> Hca {
        let config_ip = config.gid.to_ip();
        let rng = ChaCha8Rng::seed_from_u64(config.seed);
        let mut mrs = Table::default();
        // Reserve index 0 so that no key is ever 0x000000xx.
        let _reserved = mrs.insert(MrInfo {
            pd: PdId(u32::MAX),
            lkey: 0,
            rkey: 0,
            iova: 0,
            length: 0,
            access: AccessFlags::empty(),
        });
        Hca {
            config,
            rng,
            pds: Table::default(),
            mrs,
            last_key_byte: vec![0],
            mws: Table::default(),
            cqs: Table::default(),
            channels: Table::default(),
            srqs: Table::default(),
            ahs: Table::default(),
            qps: Table::default(),
            gsi: None,
            events: VecDeque::new(),
            notifications: VecDeque::new(),
            ready: VecDeque::new(),
            timers: TimerIndex::default(),
            wcs: Vec::new(),
            ident_bases: Vec::new(),
            stats: Stats::default(),
            own_ip: config_ip,
            rx_path: rc::tx::PathTemplate::default(),
        }
    }

    // ---- (A) getters -----------------------------------------------------------------------

    /// The configuration the HCA was built with.
    pub fn config(&self) -> &HcaConfig {
        &self.config
    }

    /// `ibv_query_device`.
    pub fn device_attr(&self) -> DeviceAttr {
        self.config.device_attr()
    }

    /// `ibv_query_port`: only port 1 exists; others give `InvalidArgument`.
    pub fn port_attr(&self, port_num: u8) -> Result<PortAttr> {
        check_port(port_num)?;
        Ok(PortAttr {
            state: PortState::Active,
            max_mtu: self.config.max_mtu,
            active_mtu: self.config.active_mtu,
            gid_tbl_len: GID_TBL_LEN,
            port_cap_flags: 0,
            max_msg_sz: self.config.limits.max_msg_sz,
            pkey_tbl_len: 1,
            lid: 0,
            link_layer: LinkLayer::Ethernet,
        })
    }

    /// `ibv_query_gid`: index 0 of port 1 holds the device's GID; the other entries of the
    /// [`GID_TBL_LEN`]-entry table are empty and read as the zero GID (as `ibv_query_gid`
    /// reports an empty entry); an index beyond the table is `InvalidArgument`.
    pub fn gid(&self, port_num: u8, index: u32) -> Result<Gid> {
        check_port(port_num)?;
        match index {
            0 => Ok(self.config.gid),
            i if i < GID_TBL_LEN => Ok(Gid::default()),
            _ => Err(Error::invalid(format!(
                "GID index {index} out of range (table length {GID_TBL_LEN})"
            ))),
        }
    }

    /// `ibv_query_pkey`: index 0 holds the default P_Key 0xFFFF.
    pub fn pkey(&self, port_num: u8, index: u16) -> Result<u16> {
        check_port(port_num)?;
        if index != 0 {
            return Err(Error::invalid(format!(
                "P_Key index {index} out of range (table length 1)"
            )));
        }
        Ok(0xFFFF)
    }

    /// The MR whose lkey (or rkey) is `key`, if registered.
    pub fn mr(&self, key: u32) -> Option<&MrInfo> {
        let info = self.mrs.get(key >> 8)?;
        (info.lkey == key && info.length != 0).then_some(info)
    }

    /// `ibv_query_qp`.
    pub fn query_qp(&self, qpn: u32) -> Result<QpAttr> {
        Ok(self.qp(qpn)?.query())
    }

    /// The capacity of a CQ.
    pub fn cq_capacity(&self, cq: CqId) -> Result<u32> {
        Ok(self.cq(cq)?.capacity)
    }

    /// Number of entries an existing CQ holds now.
    pub fn cq_len(&self, cq: CqId) -> Result<usize> {
        Ok(self.cq(cq)?.len())
    }

    // ---- (C) commands: PD and MR -----------------------------------------------------------

    /// `ibv_alloc_pd`; `NoMemory` beyond `max_pd`.
    pub fn alloc_pd(&mut self) -> Result<PdId> {
        if self.pds.len() >= self.config.limits.max_pd as usize {
            return Err(Error::no_memory("max_pd protection domains allocated"));
        }
        self.pds
            .insert(PdEntry::default())
            .map(PdId)
            .ok_or_else(|| Error::no_memory("PD table exhausted"))
    }

    /// `ibv_dealloc_pd`; `Busy` while MRs, QPs or SRQs use it.
    pub fn dealloc_pd(&mut self, pd: PdId) -> Result<()> {
        let entry = self
            .pds
            .get(pd.0)
            .ok_or_else(|| Error::invalid("no such PD"))?;
        if entry.refs > 0 {
            return Err(Error::busy(format!(
                "PD still used by {} objects",
                entry.refs
            )));
        }
        self.pds.remove(pd.0);
        Ok(())
    }

    /// Registers an MR's metadata and returns it with fresh keys (rxe's layout: index << 8 |
    /// random byte, rc-transport.md §7.3).
    ///
    /// Errors (`InvalidArgument`): unknown PD, zero length, length above `max_mr_size`, a range
    /// that wraps the address space, REMOTE_WRITE/REMOTE_ATOMIC without LOCAL_WRITE (§7.2),
    /// unknown access bits. `NotSupported`: ZERO_BASED, ON_DEMAND. `NoMemory`: `max_mr` reached.
    pub fn reg_mr(
        &mut self,
        pd: PdId,
        iova: u64,
        length: u64,
        access: AccessFlags,
    ) -> Result<MrInfo> {
        self.pds
            .get(pd.0)
            .ok_or_else(|| Error::invalid("no such PD"))?;
        check_mr_access(access)?;
        if length == 0 {
            return Err(Error::invalid("MR length is zero"));
        }
        if length > self.config.limits.max_mr_size {
            return Err(Error::invalid("MR length above max_mr_size"));
        }
        if iova.checked_add(length).is_none() {
            return Err(Error::invalid("MR range wraps the address space"));
        }
        // Index 0 is reserved, hence the "- 1".
        if self.mrs.len() > self.config.limits.max_mr as usize {
            return Err(Error::no_memory("max_mr memory regions registered"));
        }
        let mut info = MrInfo {
            pd,
            lkey: 0,
            rkey: 0,
            iova,
            length,
            access,
        };
        let index = self
            .mrs
            .insert(info)
            .filter(|i| *i < (1 << 24))
            .ok_or_else(|| Error::no_memory("MR key space exhausted"))?;
        let slot = index as usize;
        if self.last_key_byte.len() <= slot {
            self.last_key_byte.resize(slot + 1, 0);
        }
        let last = self.last_key_byte[slot];
        let mut byte = (self.rng.next_u32() & 0xFF) as u8;
        if byte == last {
            byte = byte.wrapping_add(1);
        }
        self.last_key_byte[slot] = byte;
        info.lkey = (index << 8) | u32::from(byte);
        info.rkey = info.lkey;
        if let Some(stored) = self.mrs.get_mut(index) {
            *stored = info;
        }
        if let Some(entry) = self.pds.get_mut(pd.0) {
            entry.refs += 1;
        }
        Ok(info)
    }

    /// `ibv_dereg_mr` by lkey; `InvalidArgument` for an unknown key, `Busy` while memory
    /// windows are bound to the MR (IBTA §10.6.7.2.6).
    pub fn dereg_mr(&mut self, lkey: u32) -> Result<MrInfo> {
        let info = *self.mr(lkey).ok_or_else(|| Error::invalid("no such MR"))?;
        if crate::mw::mr_has_windows(&self.mws, lkey) {
            return Err(Error::busy("memory windows are bound to the MR"));
        }
        self.mrs.remove(lkey >> 8);
        if let Some(entry) = self.pds.get_mut(info.pd.0) {
            entry.refs = entry.refs.saturating_sub(1);
        }
        Ok(info)
    }

    // ---- (C) commands: memory windows -----------------------------------------------------

    /// `ibv_alloc_mw`: an unbound window of `mw_type` in `pd` and its first R_Key (a window key
    /// index, random key byte); the PD stays busy until it is deallocated. `InvalidArgument`
    /// for an unknown PD, `NoMemory` beyond `max_mw`.
    pub fn alloc_mw(&mut self, pd: PdId, mw_type: MwType) -> Result<(u32, u32)> {
        self.pds
            .get(pd.0)
            .ok_or_else(|| Error::invalid("no such PD"))?;
        if self.mws.len() >= self.config.limits.max_mw as usize {
            return Err(Error::no_memory("max_mw memory windows allocated"));
        }
        let entry = MwEntry {
            pd,
            mw_type,
            rkey: 0,
            binding: None,
        };
        let index = self
            .mws
            .insert(entry)
            .filter(|i| *i < (1 << 24) - crate::mw::MW_INDEX_BASE)
            .ok_or_else(|| Error::no_memory("MW key space exhausted"))?;
        let byte = self.rng.next_u32() & 0xFF;
        let rkey = ((crate::mw::MW_INDEX_BASE + index) << 8) | byte;
        if let Some(stored) = self.mws.get_mut(index) {
            stored.rkey = rkey;
        }
        if let Some(entry) = self.pds.get_mut(pd.0) {
            entry.refs += 1;
        }
        Ok((index, rkey))
    }

    /// `ibv_dealloc_mw`: allowed while bound (the window is invalidated with it; later
    /// accesses through its key fail). `InvalidArgument` for an unknown window.
    pub fn dealloc_mw(&mut self, mw: u32) -> Result<()> {
        let entry = self
            .mws
            .remove(mw)
            .ok_or_else(|| Error::invalid("no such memory window"))?;
        if let Some(pd) = self.pds.get_mut(entry.pd.0) {
            pd.refs = pd.refs.saturating_sub(1);
        }
        Ok(())
    }

    /// The R_Key `ibv_mw.rkey` shows for window `mw`.
    pub fn mw_rkey(&self, mw: u32) -> Result<u32> {
        self.mws
            .get(mw)
            .map(|m| m.rkey)
            .ok_or_else(|| Error::invalid("no such memory window"))
    }

    /// `ibv_bind_mw`: posts a BIND_MW of type 1 window `mw` on RC QP `qpn`'s send queue with
    /// the next R_Key (`ibv_inc_rkey`), which it returns and `mw_rkey` reports from now on.
    /// Errors of the post are `post_send`'s; a type 2 window or a QP that is not RC is
    /// `InvalidArgument`. The bind's own errors complete it with `MW_BIND_ERR` (see
    /// `SendOp::BindMw`).
    pub fn bind_mw(&mut self, now: Instant, qpn: u32, mw: u32, bind: &MwBind) -> Result<u32> {
        let entry = self
            .mws
            .get(mw)
            .ok_or_else(|| Error::invalid("no such memory window"))?;
        if entry.mw_type != MwType::Type1 {
            return Err(Error::invalid(
                "ibv_bind_mw binds type 1 windows; a type 2 window is bound by a BIND_MW WR",
            ));
        }
        if self.qp(qpn)?.qp_type != QpType::Rc {
            return Err(Error::invalid("memory windows are bound on RC QPs"));
        }
        let rkey = verbs_api::inc_rkey(entry.rkey);
        let op = SendOp::BindMw {
            mw,
            rkey,
            mr: bind.mr,
            addr: bind.addr,
            length: bind.length,
            access: bind.access,
        };
        let wr = SendWr {
            flags: bind.flags & SendFlags::SIGNALED,
            ..SendWr::new(bind.wr_id, op, &[])
        };
        self.post_send(now, qpn, &[wr]).map_err(|e| e.error)?;
        if let Some(entry) = self.mws.get_mut(mw) {
            entry.rkey = rkey;
        }
        Ok(rkey)
    }

    // ---- (C) commands: channels and CQs ----------------------------------------------------

    /// Creates a completion channel's HCA side; the driver owns its file descriptor.
    pub fn create_comp_channel(&mut self) -> Result<ChannelId> {
        if self.channels.len() >= self.config.limits.max_comp_channels as usize {
            return Err(Error::no_memory("too many completion channels"));
        }
        self.channels
            .insert(ChannelEntry::default())
            .map(ChannelId)
            .ok_or_else(|| Error::no_memory("channel table exhausted"))
    }

    /// Destroys a channel; `Busy` while a CQ uses it.
    pub fn destroy_comp_channel(&mut self, ch: ChannelId) -> Result<()> {
        let entry = self
            .channels
            .get(ch.0)
            .ok_or_else(|| Error::invalid("no such completion channel"))?;
        if entry.cq_refs > 0 {
            return Err(Error::busy("completion channel still used by a CQ"));
        }
        self.channels.remove(ch.0);
        Ok(())
    }

    /// `ibv_create_cq`: `cqe` must be in 1..=`max_cqe` (`InvalidArgument`); `NoMemory` beyond
    /// `max_cq`.
    pub fn create_cq(&mut self, cqe: u32, channel: Option<ChannelId>) -> Result<CqId> {
        self.check_cqe(cqe)?;
        if self.cqs.len() >= self.config.limits.max_cq as usize {
            return Err(Error::no_memory("max_cq completion queues created"));
        }
        if let Some(ch) = channel {
            self.channels
                .get(ch.0)
                .ok_or_else(|| Error::invalid("no such completion channel"))?;
        }
        let id = self
            .cqs
            .insert(Cq::new(cqe, channel))
            .map(CqId)
            .ok_or_else(|| Error::no_memory("CQ table exhausted"))?;
        if let Some(entry) = channel.and_then(|ch| self.channels.get_mut(ch.0)) {
            entry.cq_refs += 1;
        }
        Ok(id)
    }

    /// `ibv_resize_cq`: `InvalidArgument` for 0, above `max_cqe`, or below the entries held.
    pub fn resize_cq(&mut self, cq: CqId, cqe: u32) -> Result<()> {
        self.check_cqe(cqe)?;
        let entry = self.cq_mut(cq)?;
        if (cqe as usize) < entry.len() {
            return Err(Error::invalid("new CQ size below the completions it holds"));
        }
        entry.capacity = cqe;
        Ok(())
    }

    /// `ibv_destroy_cq`: `Busy` while QPs use it or channel events are unacknowledged.
    pub fn destroy_cq(&mut self, cq: CqId) -> Result<()> {
        let entry = self.cq(cq)?;
        if entry.qp_refs > 0 {
            return Err(Error::busy(format!(
                "CQ still used by {} QPs",
                entry.qp_refs
            )));
        }
        if entry.unacked_events > 0 {
            return Err(Error::busy(format!(
                "CQ has {} unacknowledged events",
                entry.unacked_events
            )));
        }
        let channel = entry.channel;
        self.cqs.remove(cq.0);
        if let Some(entry) = channel.and_then(|ch| self.channels.get_mut(ch.0)) {
            entry.cq_refs = entry.cq_refs.saturating_sub(1);
        }
        self.notifications.retain(|n| n.cq != cq);
        Ok(())
    }

    /// `ibv_poll_cq`: moves up to `out.len()` completions into `out`. After an overrun, once
    /// the stored completions are drained, fails with `InvalidState` (the CQ is unusable,
    /// rc-transport.md §6.3).
    pub fn poll_cq(&mut self, cq: CqId, out: &mut [WorkCompletion]) -> Result<usize> {
        let entry = self.cq_mut(cq)?;
        let n = entry.poll(out);
        if n > 0 {
            tracing::trace!(kind = "verbs.poll_cq", cq = cq.0, n);
        }
        if n == 0 && entry.overflowed && !out.is_empty() {
            return Err(Error::state("CQ overran; it cannot be used any more"));
        }
        Ok(n)
    }

    /// `ibv_req_notify_cq`; `InvalidState` for a CQ without a channel.
    pub fn req_notify_cq(&mut self, cq: CqId, solicited_only: bool) -> Result<()> {
        let entry = self.cq_mut(cq)?;
        if entry.channel.is_none() {
            return Err(Error::state("CQ has no completion channel"));
        }
        entry.arm(solicited_only);
        Ok(())
    }

    /// Records that the driver delivered one event for `cq` (call once per notification).
    pub fn cq_event_delivered(&mut self, cq: CqId) {
        if let Ok(entry) = self.cq_mut(cq) {
            entry.unacked_events += 1;
        }
    }

    /// `ibv_ack_cq_events`.
    pub fn ack_cq_events(&mut self, cq: CqId, n: u32) -> Result<()> {
        let entry = self.cq_mut(cq)?;
        entry.unacked_events = entry.unacked_events.saturating_sub(n);
        Ok(())
    }

    // ---- (C) commands: SRQ -----------------------------------------------------------------

    /// `ibv_create_srq`: `max_wr` 1..=`max_srq_wr`, `max_sge` ≤ `max_srq_sge`, (`InvalidArgument`);
    /// `NoMemory` beyond `max_srq`. `srq_limit` is ignored at creation, as `ibv_create_srq(3)`
    /// says: the limit starts disarmed; arm it with `arm_srq_limit`.
    pub fn create_srq(&mut self, pd: PdId, attr: &SrqAttr) -> Result<SrqId> {
        self.pds
            .get(pd.0)
            .ok_or_else(|| Error::invalid("no such PD"))?;
        let l = &self.config.limits;
        if attr.max_wr == 0 || attr.max_wr > l.max_srq_wr {
            return Err(Error::invalid("SRQ max_wr outside 1..=max_srq_wr"));
        }
        if attr.max_sge > l.max_srq_sge {
            return Err(Error::invalid("SRQ max_sge above max_srq_sge"));
        }
        if self.srqs.len() >= l.max_srq as usize {
            return Err(Error::no_memory("max_srq SRQs created"));
        }
        let id = self
            .srqs
            .insert(SrqEntry {
                pd,
                attr: SrqAttr {
                    srq_limit: 0,
                    ..*attr
                },
                queue: VecDeque::new(),
                qp_refs: 0,
            })
            .map(SrqId)
            .ok_or_else(|| Error::no_memory("SRQ table exhausted"))?;
        if let Some(entry) = self.pds.get_mut(pd.0) {
            entry.refs += 1;
        }
        Ok(id)
    }

    /// `ibv_post_srq_recv`: `InvalidArgument` for too many SGEs, `NoMemory` when full.
    pub fn post_srq_recv(&mut self, srq: SrqId, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        let entry = self
            .srqs
            .get_mut(srq.0)
            .ok_or_else(|| PostError::new(0, Error::invalid("no such SRQ")))?;
        for (i, wr) in wrs.iter().enumerate() {
            qp::check_recv_wr(wr, entry.attr.max_sge).map_err(|e| PostError::new(i, e))?;
            if entry.queue.len() >= entry.attr.max_wr as usize {
                return Err(PostError::new(i, Error::no_memory("SRQ full")));
            }
            entry.queue.push_back(RecvWqe::from_wr(wr));
        }
        Ok(())
    }

    /// `ibv_query_srq`.
    pub fn query_srq(&self, srq: SrqId) -> Result<SrqAttr> {
        Ok(self
            .srqs
            .get(srq.0)
            .ok_or_else(|| Error::invalid("no such SRQ"))?
            .attr)
    }

    /// Arms the SRQ limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`); `InvalidArgument` above
    /// `max_wr`.
    pub fn arm_srq_limit(&mut self, srq: SrqId, limit: u32) -> Result<()> {
        let entry = self
            .srqs
            .get_mut(srq.0)
            .ok_or_else(|| Error::invalid("no such SRQ"))?;
        if limit > entry.attr.max_wr {
            return Err(Error::invalid("SRQ limit above max_wr"));
        }
        entry.attr.srq_limit = limit;
        Ok(())
    }

    /// `ibv_destroy_srq`; `Busy` while QPs use it.
    pub fn destroy_srq(&mut self, srq: SrqId) -> Result<()> {
        let entry = self
            .srqs
            .get(srq.0)
            .ok_or_else(|| Error::invalid("no such SRQ"))?;
        if entry.qp_refs > 0 {
            return Err(Error::busy(format!(
                "SRQ still used by {} QPs",
                entry.qp_refs
            )));
        }
        let pd = entry.pd;
        self.srqs.remove(srq.0);
        if let Some(entry) = self.pds.get_mut(pd.0) {
            entry.refs = entry.refs.saturating_sub(1);
        }
        Ok(())
    }

    // ---- (C) commands: address handles ---------------------------------------------------

    /// `ibv_create_ah` in `pd`. Errors (`InvalidArgument`): unknown PD, a port other than 1 (0
    /// means 1), `sgid_index` ≠ 0 (one GID), a zero DGID, a zero UDP port, a DGID of another IP
    /// version than the device's; `NoMemory` when the table is full.
    pub fn create_ah(&mut self, pd: PdId, attr: &AhAttr) -> Result<AhId> {
        self.pds
            .get(pd.0)
            .ok_or_else(|| Error::invalid("no such PD"))?;
        if attr.port_num > 1 {
            return Err(Error::invalid(format!(
                "port {} does not exist (ports: 1)",
                attr.port_num
            )));
        }
        if attr.sgid_index != 0 {
            return Err(Error::invalid(
                "sgid_index out of range (GID table length 1)",
            ));
        }
        if attr.dgid.is_zero() {
            return Err(Error::invalid("dgid is zero: RoCE needs a global address"));
        }
        if attr.udp_dport == 0 {
            return Err(Error::invalid("udp_dport is zero"));
        }
        let dst = SocketAddr::new(attr.dgid.to_ip(), attr.udp_dport);
        if dst.is_ipv4() != self.own_ip.is_ipv4() {
            return Err(Error::invalid(
                "dgid is of another IP version than the port's GID",
            ));
        }
        let id = self
            .ahs
            .insert(AhEntry { pd, dst })
            .map(AhId)
            .ok_or_else(|| Error::no_memory("AH table exhausted"))?;
        if let Some(entry) = self.pds.get_mut(pd.0) {
            entry.refs += 1;
        }
        Ok(id)
    }

    /// `ibv_destroy_ah`; `InvalidArgument` for an unknown AH. Posted work keeps the address.
    pub fn destroy_ah(&mut self, ah: AhId) -> Result<()> {
        let entry = self
            .ahs
            .remove(ah.0)
            .ok_or_else(|| Error::invalid("no such AH"))?;
        if let Some(pd) = self.pds.get_mut(entry.pd.0) {
            pd.refs = pd.refs.saturating_sub(1);
        }
        Ok(())
    }

    // ---- (C) commands: QP ------------------------------------------------------------------

    /// `ibv_create_qp`: a QP in RESET (RC, UC or UD). Errors: unknown PD/CQ/SRQ or an SRQ of
    /// another PD (`InvalidArgument`), capacities above the device limits (`InvalidArgument`),
    /// `max_qp` QPs (`NoMemory`).
    pub fn create_qp(
        &mut self,
        pd: PdId,
        send_cq: CqId,
        recv_cq: CqId,
        srq: Option<SrqId>,
        init: &QpInitAttr,
    ) -> Result<u32> {
        let qp = self.new_qp(pd, send_cq, recv_cq, srq, init)?;
        if self.qps.len() >= self.config.limits.max_qp as usize {
            return Err(Error::no_memory("max_qp QPs created"));
        }
        let index = self
            .qps
            .insert(qp)
            .ok_or_else(|| Error::no_memory("QP table exhausted"))?;
        let qpn = index + FIRST_QPN;
        if qpn > verbs_api::MAX_24BIT {
            self.qps.remove(index);
            return Err(Error::no_memory("QP number space exhausted"));
        }
        if let Some(qp) = self.qps.get_mut(index) {
            qp.qpn = qpn;
        }
        self.retain_qp_refs(pd, send_cq, recv_cq, srq, 1);
        tracing::debug!(kind = "verbs.qp", op = "create", qp = qpn, qp_type = ?init.qp_type);
        Ok(qpn)
    }

    /// Opens the GSI: QP number [`GSI_QPN`], a UD QP already in RTS with Q_Key [`GSI_QKEY`]
    /// (the well-known values of IBTA 14.2.5), receiving the UD datagrams addressed to QP1 and
    /// sending like any UD QP. One per device: `Busy` while open. Other errors as
    /// [`Hca::create_qp`] (`init.qp_type` is ignored: the GSI is UD, without SRQ). Closed by
    /// [`Hca::destroy_qp`] with QPN 1.
    pub fn create_gsi(
        &mut self,
        now: Instant,
        pd: PdId,
        send_cq: CqId,
        recv_cq: CqId,
        init: &QpInitAttr,
    ) -> Result<u32> {
        if self.gsi.is_some() {
            return Err(Error::busy("the GSI (QP1) is already open"));
        }
        let init = QpInitAttr {
            qp_type: QpType::Ud,
            ..*init
        };
        let mut qp = self.new_qp(pd, send_cq, recv_cq, None, &init)?;
        qp.qpn = GSI_QPN;
        self.gsi = Some(qp);
        self.retain_qp_refs(pd, send_cq, recv_cq, None, 1);
        tracing::debug!(kind = "verbs.qp", op = "create", qp = GSI_QPN, qp_type = ?QpType::Ud);
        let steps = [
            (
                QpAttr {
                    qp_state: QpState::Init,
                    qkey: GSI_QKEY,
                    ..QpAttr::default()
                },
                QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
            ),
            (
                QpAttr {
                    qp_state: QpState::Rtr,
                    ..QpAttr::default()
                },
                QpAttrMask::STATE,
            ),
            (
                QpAttr {
                    qp_state: QpState::Rts,
                    ..QpAttr::default()
                },
                QpAttrMask::STATE | QpAttrMask::SQ_PSN,
            ),
        ];
        for (attr, mask) in steps {
            if let Err(e) = self.modify_qp(now, GSI_QPN, &attr, mask) {
                let _ = self.destroy_qp(GSI_QPN);
                return Err(e);
            }
        }
        Ok(GSI_QPN)
    }

    /// Validates `create_qp`'s arguments and builds the QP (number 0 until placed).
    fn new_qp(
        &self,
        pd: PdId,
        send_cq: CqId,
        recv_cq: CqId,
        srq: Option<SrqId>,
        init: &QpInitAttr,
    ) -> Result<Qp> {
        self.pds
            .get(pd.0)
            .ok_or_else(|| Error::invalid("no such PD"))?;
        self.cq(send_cq)?;
        self.cq(recv_cq)?;
        if let Some(srq) = srq {
            let entry = self
                .srqs
                .get(srq.0)
                .ok_or_else(|| Error::invalid("no such SRQ"))?;
            if entry.pd != pd {
                return Err(Error::invalid("SRQ belongs to another PD"));
            }
        }
        let l = &self.config.limits;
        let cap = init.cap;
        let too_big = [
            (cap.max_send_wr, l.max_qp_wr, "max_send_wr"),
            (cap.max_recv_wr, l.max_qp_wr, "max_recv_wr"),
            (cap.max_send_sge, l.max_sge, "max_send_sge"),
            (cap.max_recv_sge, l.max_sge, "max_recv_sge"),
            (cap.max_inline_data, l.max_inline_data, "max_inline_data"),
        ];
        if let Some((v, max, name)) = too_big.iter().find(|(v, max, _)| v > max) {
            return Err(Error::invalid(format!(
                "{name} {v} above the device limit {max}"
            )));
        }
        Ok(Qp {
            qpn: 0,
            qp_type: init.qp_type,
            pd,
            send_cq,
            recv_cq,
            srq,
            cap: if srq.is_some() {
                verbs_api::QpCap {
                    max_recv_wr: 0,
                    max_recv_sge: 0,
                    ..cap
                }
            } else {
                cap
            },
            sq_sig_all: init.sq_sig_all,
            attr: QpAttr::default(),
            sq: VecDeque::new(),
            rq: VecDeque::new(),
            rc: crate::rc::RcState::default(),
            peer_ip: QpAttr::default().ah_attr.dgid.to_ip(),
            tx: rc::tx::PathTemplate::default(),
        })
    }

    /// `ibv_modify_qp` (rc-transport.md §5.1). Validates everything first; on error nothing
    /// changes. Entering RESET clears both queues without completions; entering ERR flushes
    /// them with `WR_FLUSH_ERR` (§6.3); entering SQD raises `SQ_DRAINED` when asked and the send
    /// queue has nothing in flight.
    pub fn modify_qp(
        &mut self,
        now: Instant,
        qpn: u32,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) -> Result<()> {
        let _span = self.qp_span(Some(now), qpn);
        let from = self.qp(qpn).map(Qp::state).ok();
        let result = self.modify_qp_checked(qpn, attr, mask);
        let to = self.qp(qpn).map(Qp::state).ok();
        let (from, to) = (
            from.map(tracing::field::display),
            to.map(tracing::field::display),
        );
        tracing::debug!(kind = "verbs.modify_qp", from, to, ok = result.is_ok());
        result
    }

    fn modify_qp_checked(&mut self, qpn: u32, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        let limits = self.config.limits.clone();
        let max_mtu = self.config.max_mtu;
        let qp = self.qp_mut(qpn)?;
        let t = qp::check_modify(qp, attr, mask, &limits, max_mtu)?;
        qp::apply_attrs(&mut qp.attr, attr, mask);
        qp.peer_ip = qp.attr.ah_attr.dgid.to_ip();
        qp.attr.qp_state = t.to;
        let rc = &mut qp.rc;
        match (t.from, t.to) {
            (from, QpState::Reset) if from != QpState::Reset => {
                qp.sq.clear();
                qp.rq.clear();
                let cap = qp.cap;
                qp.attr = QpAttr {
                    cap,
                    ..QpAttr::default()
                };
                qp.peer_ip = qp.attr.ah_attr.dgid.to_ip();
                // Keep what ties the QP to the HCA's indices; `sync_timer` below drops the timer.
                let (stats, timer_key, queued) = (rc.stats, rc.timer_key, rc.queued);
                *rc = rc::RcState::default();
                rc.stats = stats;
                rc.timer_key = timer_key;
                rc.queued = queued;
            }
            (from, QpState::Err) if from != QpState::Err => {
                self.enter_err(qpn);
            }
            (QpState::Init, QpState::Rtr) => {
                rc.epsn = Psn::new(qp.attr.rq_psn);
                rc.ack_psn = rc.epsn;
            }
            (QpState::Rtr, QpState::Rts) => {
                let psn = Psn::new(qp.attr.sq_psn);
                rc.req_psn = psn;
                rc.comp_psn = psn;
                rc.sent_high = psn;
                rc.retry_left = qp.attr.retry_cnt;
                rc.rnr_retry_left = qp.attr.rnr_retry;
            }
            (QpState::Rts, QpState::Sqd) if qp.attr.en_sqd_async_notify => {
                if qp.sq_draining() {
                    qp.rc.sqd_notify = true;
                } else {
                    self.events.push_back(AsyncEvent {
                        kind: AsyncEventKind::SqDrained,
                        element: EventElement::Qp(qpn),
                    });
                }
            }
            (QpState::Sqd, QpState::Rts) => self.mark_ready(qpn),
            _ => {}
        }
        if let Ok(qp) = self.qp_mut(qpn) {
            if t.to == QpState::Rtr || t.to == QpState::Rts {
                qp.rc.retry_left = qp.attr.retry_cnt;
                qp.rc.rnr_retry_left = qp.attr.rnr_retry;
            }
        }
        self.sync_timer(qpn);
        Ok(())
    }

    /// `ibv_post_send` (rc-transport.md §5.2): allowed in RTS and SQD (queued); in ERR each WR
    /// completes at once with `WR_FLUSH_ERR`; `InvalidState` in RESET, INIT, RTR (and SQE).
    /// Each WR is checked before it is queued; the first bad one stops the batch. On a UC QP
    /// READ and atomics are `InvalidArgument`. On a UD QP a WR must be SEND or SEND_WITH_IMM with a UD destination naming a live AH
    /// (`InvalidArgument` otherwise); its address is copied at post time.
    pub fn post_send(
        &mut self,
        now: Instant,
        qpn: u32,
        wrs: &[SendWr<'_>],
    ) -> Result<(), PostError> {
        let _span = self.qp_span(Some(now), qpn);
        let result = self.post_send_wrs(qpn, wrs);
        tracing::debug!(
            kind = "verbs.post_send",
            wrs = wrs.len(),
            ok = result.is_ok()
        );
        result
    }

    fn post_send_wrs(&mut self, qpn: u32, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        let qp = self.qp_mut(qpn).map_err(|e| PostError::new(0, e))?;
        let state = qp.state();
        if !matches!(state, QpState::Rts | QpState::Sqd | QpState::Err) {
            return Err(PostError::new(
                0,
                Error::state(format!("post_send in {state}")),
            ));
        }
        for (i, wr) in wrs.iter().enumerate() {
            let ud = self.ud_dst(qpn, wr).map_err(|e| PostError::new(i, e))?;
            // The QP and the limits borrowed side by side (no copy of the limits per call).
            let Some(qp) = qp_in_mut(&mut self.qps, &mut self.gsi, qpn) else {
                let e = Error::invalid(format!("no such QP {qpn:#x}"));
                return Err(PostError::new(i, e));
            };
            let limits = &self.config.limits;
            let length = qp::check_send_wr(qp, wr, limits).map_err(|e| PostError::new(i, e))?;
            if qp.sq.len() >= qp.cap.max_send_wr as usize {
                return Err(PostError::new(i, Error::no_memory("send queue full")));
            }
            if state == QpState::Err {
                let cq = qp.send_cq;
                let wqe = qp::send_wqe(qp, wr, length, ud);
                self.complete(
                    cq,
                    flush_wc(qpn, wqe.wr_id, completer::wc_opcode(&wqe)),
                    false,
                );
            } else {
                qp.sq.push_back(qp::send_wqe(qp, wr, length, ud));
                self.mark_ready(qpn);
            }
        }
        Ok(())
    }

    /// For a UD QP, the destination of `wr` (SEND or SEND_WITH_IMM to a live AH;
    /// `InvalidArgument` otherwise); `None` for other QP types. A message above the MTU is
    /// accepted here and never sent (IBTA C10-93.1.1, see `ud::next_packet`).
    fn ud_dst(&self, qpn: u32, wr: &SendWr<'_>) -> Result<Option<crate::ud::UdDst>> {
        let qp = self.qp(qpn)?;
        if qp.qp_type != QpType::Ud {
            return Ok(None);
        }
        if !matches!(
            wr.op,
            verbs_api::SendOp::Send | verbs_api::SendOp::SendWithImm { .. }
        ) {
            return Err(Error::invalid("a UD QP sends only SEND and SEND_WITH_IMM"));
        }
        let ud = wr
            .ud
            .ok_or_else(|| Error::invalid("a UD send needs an AH, remote QPN and Q_Key"))?;
        if ud.remote_qpn > verbs_api::MAX_24BIT {
            return Err(Error::invalid("remote_qpn is not a 24-bit number"));
        }
        let ah = self
            .ahs
            .get(ud.ah)
            .ok_or_else(|| Error::invalid(format!("no such AH {}", ud.ah)))?;
        Ok(Some(crate::ud::UdDst {
            dst: ah.dst,
            remote_qpn: ud.remote_qpn,
            qkey: crate::ud::effective_qkey(ud.remote_qkey, qp.attr.qkey),
        }))
    }

    /// `ibv_post_recv` (rc-transport.md §5.2): allowed from INIT on; in ERR each WR completes at
    /// once with `WR_FLUSH_ERR`; `InvalidState` in RESET or on a QP attached to an SRQ;
    /// `InvalidArgument` for too many SGEs; `NoMemory` when full.
    pub fn post_recv(&mut self, qpn: u32, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        let _span = self.qp_span(None, qpn);
        let result = self.post_recv_wrs(qpn, wrs);
        tracing::debug!(
            kind = "verbs.post_recv",
            wrs = wrs.len(),
            ok = result.is_ok()
        );
        result
    }

    fn post_recv_wrs(&mut self, qpn: u32, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        let qp = self.qp_mut(qpn).map_err(|e| PostError::new(0, e))?;
        let state = qp.state();
        if state == QpState::Reset {
            return Err(PostError::new(0, Error::state("post_recv in RESET")));
        }
        if qp.srq.is_some() {
            return Err(PostError::new(
                0,
                Error::state("QP receives through an SRQ"),
            ));
        }
        for (i, wr) in wrs.iter().enumerate() {
            let qp = self.qp_mut(qpn).map_err(|e| PostError::new(i, e))?;
            qp::check_recv_wr(wr, qp.cap.max_recv_sge).map_err(|e| PostError::new(i, e))?;
            if qp.rq.len() >= qp.cap.max_recv_wr as usize {
                return Err(PostError::new(i, Error::no_memory("receive queue full")));
            }
            if state == QpState::Err {
                let cq = qp.recv_cq;
                self.complete(cq, flush_wc(qpn, wr.wr_id, WcOpcode::Recv), false);
            } else {
                qp.rq.push_back(RecvWqe::from_wr(wr));
            }
        }
        Ok(())
    }

    /// `ibv_destroy_qp`: outstanding work is discarded without completions.
    pub fn destroy_qp(&mut self, qpn: u32) -> Result<()> {
        let qp = if qpn == GSI_QPN {
            self.gsi.take()
        } else {
            qpn.checked_sub(FIRST_QPN)
                .and_then(|index| self.qps.remove(index))
        }
        .ok_or_else(|| Error::invalid("no such QP"))?;
        self.retain_qp_refs(qp.pd, qp.send_cq, qp.recv_cq, qp.srq, -1);
        crate::mw::unbind_qp(&mut self.mws, qpn);
        // `stats()` sums destroyed QPs too (stats.rs), and no timer may outlive its QP.
        self.stats += qp.rc.stats;
        // Its timer entry, if any, is dead now that the QP is gone.
        self.purge_timers();
        tracing::debug!(kind = "verbs.qp", op = "destroy", qp = qpn);
        Ok(())
    }

    // ---- (B) inputs ------------------------------------------------------------------------

    /// Feeds one received RoCEv2 UDP payload from `src` (rxe's receive path, rc-transport.md
    /// §1.10): a bad ICRC, a malformed packet, an unknown QP, a QP in the wrong state, a source
    /// other than the QP's peer or a foreign P_Key is counted and dropped, never answered.
    /// Requests go to the responder, responses to the completer; UC requests to the UC
    /// responder (`crate::uc`: whole messages only, never an answer); UD datagrams to the UD
    /// receive side (`crate::ud`: Q_Key and P_Key checks, GRH, silent drop without a receive WQE), and
    /// a packet whose transport does not match its QP's type is dropped as malformed. Never
    /// panics on any input.
    pub fn handle_datagram(
        &mut self,
        now: Instant,
        src: SocketAddr,
        bytes: &[u8],
        mem: &dyn Memory,
    ) {
        let _span = self.entered_span(Some(now));
        crate::trace::packet(crate::trace::PKT_RX, bytes, src);
        let own = self.own_ip;
        if self
            .rx_path
            .prepare(src, own, self.config.udp_port)
            .is_err()
        {
            self.stats.count_drop(RxDropCause::AddressFamily);
            return;
        }
        if self.rx_path.check_icrc(bytes).is_err() {
            // A foreign sender's IPv4 identification is not visible here (§1.8 addendum).
            let solved = match self.rx_path.ip() {
                Ok(&ip) => self.config.foreign_ipv4_ident && self.ident_solves(&ip, bytes),
                Err(_) => false,
            };
            if !solved {
                self.stats.count_drop(RxDropCause::BadIcrc);
                return;
            }
            self.stats.icrc_ident_solved += 1;
        }
        if bytes.first().is_some_and(|b| crate::ud::is_ud_opcode(*b)) {
            if let Ok(&ip) = self.rx_path.ip() {
                self.handle_ud(now, &ip, bytes, mem);
            }
            return;
        }
        if bytes.first().is_some_and(|b| crate::uc::is_uc_opcode(*b)) {
            self.handle_uc(now, src.ip(), bytes, mem);
            return;
        }
        if bytes.first() == Some(&crate::wire::SACK_OPCODE) {
            self.handle_sack(now, src.ip(), bytes, mem);
            return;
        }
        // Borrowed where `parse` returned it: moving the repr out of its `Result` copied it.
        let parsed = PacketRepr::parse(&Packet::new_unchecked(bytes));
        let Ok(pkt) = &parsed else {
            self.stats.count_drop(RxDropCause::Malformed);
            return;
        };
        let qpn = pkt.bth.dest_qp;
        let _qp = tracing::level_enabled!(tracing::Level::DEBUG)
            .then(|| tracing::debug_span!("qp", qp = qpn).entered());
        let Some(qp) = receiving_qp(
            &mut self.qps,
            &mut self.gsi,
            &mut self.stats,
            qpn,
            QpType::Rc,
        ) else {
            return;
        };
        if let Some(cause) = refusal(qp, pkt, src.ip()) {
            qp.rc.stats.count_drop(cause);
            return;
        }
        let op = pkt.bth.opcode;
        let mut ctx = step_ctx!(self, now, mem);
        let fatal = if op.is_request() {
            responder::handle_request(qp, &mut ctx, pkt) == responder::Disposition::Fatal
        } else {
            qp.rc.stats.rcvd_pkts += 1;
            completer::handle_response(qp, &mut ctx, pkt) == completer::Disposition::Fatal
        };
        self.after_step(qpn, fatal, true);
    }

    /// A selective ACK (ICRC checked): to its RC QP's completer if that QP runs selective
    /// repeat; a QP in IBTA mode drops it as malformed, as a standard peer would.
    fn handle_sack(&mut self, now: Instant, src: IpAddr, bytes: &[u8], mem: &dyn Memory) {
        let Ok(sack) = crate::wire::SackPacketRepr::parse(bytes) else {
            self.stats.count_drop(RxDropCause::Malformed);
            return;
        };
        let qpn = sack.bth.dest_qp;
        let Some(qp) = receiving_qp(
            &mut self.qps,
            &mut self.gsi,
            &mut self.stats,
            qpn,
            QpType::Rc,
        ) else {
            return;
        };
        let cause = if !rc::sr::enabled(qp) {
            Some(RxDropCause::Malformed)
        } else if !matches!(qp.state(), QpState::Rts | QpState::Sqd) {
            Some(RxDropCause::WrongState)
        } else if qp.peer_ip != src {
            Some(RxDropCause::WrongSource)
        } else if sack.bth.pkey & 0x7FFF != 0x7FFF {
            Some(RxDropCause::BadPkey)
        } else {
            None
        };
        if let Some(cause) = cause {
            qp.rc.stats.count_drop(cause);
            return;
        }
        let mut ctx = step_ctx!(self, now, mem);
        let fatal = completer::handle_sack(qp, &mut ctx, &sack) == completer::Disposition::Fatal;
        self.after_step(qpn, fatal, true);
    }

    /// A UC request (ICRC checked): to its UC QP's responder, or dropped and counted.
    fn handle_uc(&mut self, now: Instant, src: IpAddr, bytes: &[u8], mem: &dyn Memory) {
        let mut scratch = [0u8; MAX_PACKET_LEN];
        let Some(pkt) = crate::uc::parse(bytes, &mut scratch) else {
            self.stats.count_drop(RxDropCause::Malformed);
            return;
        };
        let qpn = pkt.bth.dest_qp;
        let Some(qp) = receiving_qp(
            &mut self.qps,
            &mut self.gsi,
            &mut self.stats,
            qpn,
            QpType::Uc,
        ) else {
            return;
        };
        if let Some(cause) = refusal(qp, &pkt, src) {
            qp.rc.stats.count_drop(cause);
            return;
        }
        let mut ctx = step_ctx!(self, now, mem);
        let fatal = crate::uc::receive(qp, &mut ctx, &pkt);
        self.after_step(qpn, fatal, false);
    }

    /// A UD datagram (ICRC checked): to its UD QP's receive side, or dropped and counted.
    fn handle_ud(&mut self, now: Instant, ip: &IpContext, bytes: &[u8], mem: &dyn Memory) {
        let Some(pkt) = crate::ud::UdPacket::parse(bytes) else {
            self.stats.count_drop(RxDropCause::Malformed);
            return;
        };
        let qpn = pkt.bth.dest_qp;
        let _qp = tracing::level_enabled!(tracing::Level::DEBUG)
            .then(|| tracing::debug_span!("qp", qp = qpn).entered());
        let Some(qp) = receiving_qp(
            &mut self.qps,
            &mut self.gsi,
            &mut self.stats,
            qpn,
            QpType::Ud,
        ) else {
            return;
        };
        let mut ctx = step_ctx!(self, now, mem);
        crate::ud::receive(qp, &mut ctx, &pkt, ip);
        self.after_step(qpn, false, false);
    }

    /// Fires every timer due at `now`: RNR waits end, local ACK timeouts retry or fail
    /// (rc-transport.md §3.5–§3.9).
    pub fn handle_timeout(&mut self, now: Instant, mem: &dyn Memory) {
        loop {
            // Firing may have left dead entries in front (a duplicate of the fired one).
            self.purge_timers();
            let Some((at, qpn)) = self.timers.first() else {
                break;
            };
            if at > now {
                break;
            }
            self.timers.pop_first();
            let _span = self.qp_span(Some(now), qpn);
            tracing::debug!(kind = "timer.fired", at = at.as_nanos());
            let Some(qp) = qp_in_mut(&mut self.qps, &mut self.gsi, qpn) else {
                continue;
            };
            qp.rc.timer_key = None;
            let mut ctx = step_ctx!(self, now, mem);
            let fatal = completer::handle_timeout(qp, &mut ctx) == completer::Disposition::Fatal;
            self.after_step(qpn, fatal, true);
        }
    }

    // ---- (D) outputs -----------------------------------------------------------------------

    /// Builds the next packet to send into `buf` (at least [`MAX_PACKET_LEN`] bytes) and says
    /// where it goes; `None` when no QP has anything to send now. Responses go before new
    /// requests of the same QP; QPs take turns.
    #[inline]
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        mem: &dyn Memory,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        // Inlined into the driver's loop: with no QP queued the answer is a length check, not
        // a call into the body (which saves and restores many registers).
        if self.ready.is_empty() {
            return None;
        }
        self.transmit_ready(now, mem, buf)
    }

    /// [`Hca::poll_transmit`] with QPs queued.
    fn transmit_ready(
        &mut self,
        now: Instant,
        mem: &dyn Memory,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        let src_ip: IpAddr = self.own_ip;
        while let Some(qpn) = self.ready.pop_front() {
            let Some(qp) = qp_in_mut(&mut self.qps, &mut self.gsi, qpn) else {
                continue;
            };
            qp.rc.queued = false;
            if qp.qp_type != QpType::Ud && idle(qp) {
                continue;
            }
            // Spans only for a QP with work (the driver calls this in its loops): an idle turn,
            // which logs nothing, opens none.
            let _span = qp_span(&self.config, self.own_ip, Some(now), qpn);
            if qp.qp_type == QpType::Ud {
                let mut ctx = step_ctx!(self, now, mem);
                let mut fatal = false;
                let sport = self.config.source_port;
                let mtu = self.config.active_mtu.bytes();
                let out = crate::ud::next_packet(qp, &mut ctx, src_ip, sport, mtu, buf, &mut fatal);
                self.after_step(qpn, fatal, out.is_some());
                if let Some(d) = out {
                    crate::trace::packet(crate::trace::PKT_TX, &buf[..d.len], d.dst);
                    return Some(Transmit {
                        dst: d.dst,
                        src_port: d.src_port,
                        len: d.len,
                        class: PacketClass::Request,
                    });
                }
                continue;
            }
            let src_port = self
                .config
                .source_port
                .unwrap_or_else(|| crate::wire::ip::udp_sport(qpn, qp.attr.dest_qp_num));
            let src = SocketAddr::new(src_ip, src_port);
            let mut ctx = step_ctx!(self, now, mem);
            let out = responder::next_packet(qp, &mut ctx, src, buf).or_else(|| {
                requester::next_packet(qp, &mut ctx, src, buf).map(|l| (l, PacketClass::Request))
            });
            let fatal = completer::complete_head_errors(qp, &mut ctx)
                == completer::Disposition::Fatal
                || std::mem::take(&mut qp.rc.resp_fatal);
            let dst = SocketAddr::new(qp.peer_ip, qp.attr.ah_attr.udp_dport);
            self.after_step(qpn, fatal, out.is_some());
            if let Some((len, class)) = out {
                crate::trace::packet(crate::trace::PKT_TX, &buf[..len], dst);
                return Some(Transmit {
                    dst,
                    src_port,
                    len,
                    class,
                });
            }
        }
        None
    }

    /// The earliest timer deadline of any QP; call [`Hca::handle_timeout`] then.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.first().map(|(at, _)| at)
    }

    /// Counters of one QP.
    pub fn qp_stats(&self, qpn: u32) -> Result<Stats> {
        Ok(self.qp(qpn)?.rc.stats)
    }

    /// The responder's expected PSN (ePSN, rc-transport.md §2.5) of QP `qpn`, for the fuzz
    /// targets' invariants (it only moves forward). Not a verbs attribute; not a stable API.
    #[doc(hidden)]
    pub fn debug_epsn(&self, qpn: u32) -> Option<u32> {
        self.qp(qpn).ok().map(|qp| qp.rc.epsn.value())
    }

    /// A canonical text encoding of everything that decides the HCA's future behaviour, for
    /// state hashing in the model checker (`emu-model`). Not a stable format; not a verbs API.
    ///
    /// Contract: two HCAs whose encodings at their own `now` are equal behave the same under
    /// the same later inputs, with time measured from `now`. To that end the encoding rebases
    /// every timer deadline to `deadline − now` and every remembered past instant (the last
    /// go-back-N rewind, an RTT probe) to its age `now − instant` (behaviour depends on time
    /// differences only), and leaves out the counters ([`Stats`]) and the IPv4-ident cache, which never steer
    /// the engine. It has no pointers. A deadline field added later that is not rebased here
    /// only makes fewer states compare equal (less reduction), never wrong merges.
    #[doc(hidden)]
    pub fn canonical_state(&self, now: Instant) -> String {
        let rebase = |t: Instant| Instant::from_nanos(saturating_nanos(t, now));
        let age = |t: Instant| Instant::from_nanos(saturating_nanos(now, t));
        let mut c = self.clone();
        c.stats = Stats::default();
        c.ident_bases.clear();
        let live = self
            .timers
            .entries()
            .filter(|&(t, q)| timer_live(&self.qps, &self.gsi, t, q))
            .map(|(t, q)| (rebase(t), q))
            .collect();
        c.timers = TimerIndex::from_entries(live);
        let slots = u32::try_from(c.qps.capacity()).unwrap_or(u32::MAX);
        for qpn in (FIRST_QPN..FIRST_QPN.saturating_add(slots)).chain([GSI_QPN]) {
            if let Some(qp) = qp_in_mut(&mut c.qps, &mut c.gsi, qpn) {
                qp.rc.stats = Stats::default();
                qp.rc.retransmit_at = qp.rc.retransmit_at.map(rebase);
                qp.rc.rnr_at = qp.rc.rnr_at.map(rebase);
                qp.rc.timer_key = qp.rc.timer_key.map(rebase);
                qp.rc.nak_deferred = qp.rc.nak_deferred.map(|(psn, t)| (psn, rebase(t)));
                qp.rc.sr.probe_at = qp.rc.sr.probe_at.map(rebase);
                rc::sr::rebase_seq(&mut qp.rc.sr);
                // Instants in the past, kept as their age.
                qp.rc.rewound = qp.rc.rewound.map(|(t, psn)| (age(t), psn));
                qp.rc.rtt_probe = qp.rc.rtt_probe.map(|(psn, t)| (psn, age(t)));
            }
        }
        format!("{c:?}")
    }

    /// Device counters: packets no QP accepted plus the sum over live and destroyed QPs.
    pub fn stats(&self) -> Stats {
        let mut total = self.stats;
        for i in 0..u32::try_from(self.qps.capacity()).unwrap_or(u32::MAX) {
            if let Some(qp) = self.qps.get(i) {
                total += qp.rc.stats;
            }
        }
        if let Some(qp) = &self.gsi {
            total += qp.rc.stats;
        }
        total
    }

    /// The next asynchronous event.
    #[inline]
    pub fn poll_event(&mut self) -> Option<AsyncEvent> {
        // Inlined into the driver's loop: an empty queue costs a length check, not a call.
        if self.events.is_empty() {
            return None;
        }
        self.next_event()
    }

    fn next_event(&mut self) -> Option<AsyncEvent> {
        let event = self.events.pop_front()?;
        tracing::debug!(kind = "async", dev = %self.config.name, event = ?event.kind, element = ?event.element);
        Some(event)
    }

    /// The next completion-channel notification the driver must deliver.
    #[inline]
    pub fn poll_notification(&mut self) -> Option<Notification> {
        self.notifications.pop_front()
    }

    // ---- internals -------------------------------------------------------------------------

    /// The `device` span entered until the guard drops; `None` (one relaxed load, no span
    /// built or moved) unless some subscriber takes `debug` events.
    #[inline]
    fn entered_span(&self, now: Option<Instant>) -> Option<tracing::span::EnteredSpan> {
        entered_span(&self.config, self.own_ip, now)
    }

    /// The `device` span with a `qp` span inside, as [`Hca::entered_span`].
    #[inline]
    fn qp_span(&self, now: Option<Instant>, qpn: u32) -> Option<QpSpan> {
        qp_span(&self.config, self.own_ip, now, qpn)
    }

    /// After the engine ran on `qpn`: enter ERR if it failed, push its completions, update its
    /// timer, and queue it for transmission if `requeue` and its turn would do something (or
    /// to send a final NAK).
    ///
    /// A step that leaves the QP idle ([`idle`]), as most do (a request sent, an ACK sent or
    /// received), does not queue it: `transmit_ready` would skip the turn. No work is left
    /// behind, because everything that gives an idle QP work queues it (`post_send`, a
    /// datagram, a timer, SQD to RTS). A driver that empties the queue before its next such
    /// call (the in-process fabric, the model checker) sees the same transmit order as when the
    /// idle turn was queued; one that stops part-way (the UDP runtime's batch) may serve such a
    /// QP after QPs queued behind its skipped turn.
    fn after_step(&mut self, qpn: u32, fatal: bool, requeue: bool) {
        if fatal {
            self.engine_failed(qpn);
        }
        self.flush_engine_wcs();
        // One look-up for the queue and the timer.
        let Some(qp) = qp_in_mut(&mut self.qps, &mut self.gsi, qpn) else {
            return;
        };
        let turn = fatal || (requeue && (qp.qp_type == QpType::Ud || !idle(qp)));
        if turn {
            queue_turn(&mut self.ready, qp, qpn);
        }
        if let Some(want) = stale_deadline(qp) {
            self.move_timer(qpn, want);
        }
    }

    /// The engine failed QP `qpn`: it enters ERR ([`Hca::enter_err`]). Out of line: rare, and
    /// its event would weigh on every step's frame.
    #[cold]
    #[inline(never)]
    fn engine_failed(&mut self, qpn: u32) {
        tracing::info!(
            kind = "qp.error",
            qp = qpn,
            "the engine moved the QP to ERR"
        );
        self.enter_err(qpn);
    }

    /// Moves a QP to ERR from the engine: timers stop, queued work flushes, a pending NAK may
    /// still go out (rc-transport.md §6.1: every RC error completion is fatal).
    fn enter_err(&mut self, qpn: u32) {
        if let Ok(qp) = self.qp_mut(qpn) {
            qp.attr.qp_state = QpState::Err;
            qp.rc.retransmit_at = None;
            qp.rc.rnr_at = None;
            qp.rc.nak_deferred = None;
        }
        self.flush_qp(qpn);
        self.sync_timer(qpn);
    }

    /// Posts the completions the engine produced. A receive completion that overruns its CQ
    /// moves its QP to ERR (the responder cannot report the message it accepted; rxe's
    /// `RESPST_ERR_CQ_OVERFLOW`, rc-transport.md §4.3 class G) on top of the CQ's `CQ_ERR`.
    #[inline]
    fn flush_engine_wcs(&mut self) {
        // Most engine steps complete nothing (an ACK sent, a request that is not the last).
        if !self.wcs.is_empty() {
            self.push_engine_wcs();
        }
    }

    /// [`Hca::flush_engine_wcs`] when there are completions.
    #[inline(never)]
    fn push_engine_wcs(&mut self) {
        let mut wcs = std::mem::take(&mut self.wcs);
        let mut overrun: Vec<u32> = Vec::new();
        for (cq, wc, solicited) in wcs.drain(..) {
            let receive = matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
            if !self.complete(cq, wc, solicited) && receive && wc.status == WcStatus::Success {
                overrun.push(wc.qp_num);
            }
        }
        self.wcs = wcs;
        for qpn in overrun {
            let live = self
                .qp(qpn)
                .is_ok_and(|qp| !matches!(qp.state(), QpState::Err | QpState::Reset));
            if live {
                tracing::info!(kind = "qp.error", qp = qpn, "receive CQ overrun: QP to ERR");
                self.enter_err(qpn);
            }
        }
    }

    fn mark_ready(&mut self, qpn: u32) {
        if let Some(qp) = qp_in_mut(&mut self.qps, &mut self.gsi, qpn) {
            queue_turn(&mut self.ready, qp, qpn);
        }
    }

    /// True if some IPv4 identification makes the ICRC of `bytes` match (IPv4 only). The
    /// per-length bases are cached: a peer's packets come in few lengths.
    fn ident_solves(&mut self, ip: &IpContext, bytes: &[u8]) -> bool {
        const CACHED_LENGTHS: usize = 16;
        let len = bytes.len();
        let basis = match self.ident_bases.iter().find(|(l, _)| *l == len) {
            Some((_, b)) => *b,
            None => {
                let Ok(b) = wire::ipv4_ident_basis(len) else {
                    return false;
                };
                if self.ident_bases.len() >= CACHED_LENGTHS {
                    self.ident_bases.remove(0);
                }
                self.ident_bases.push((len, b));
                b
            }
        };
        matches!(wire::solve_ipv4_ident(ip, bytes, &basis), Ok(Some(_)))
    }

    /// Keeps the timer index in step with the QP's earliest deadline.
    #[inline]
    fn sync_timer(&mut self, qpn: u32) {
        let Some(qp) = qp_in_mut(&mut self.qps, &mut self.gsi, qpn) else {
            return;
        };
        if let Some(want) = stale_deadline(qp) {
            self.move_timer(qpn, want);
        }
    }

    /// [`Hca::sync_timer`] when QP `qpn`'s deadline changed to `want`.
    #[inline(never)]
    fn move_timer(&mut self, qpn: u32, want: Option<Instant>) {
        let Some(qp) = qp_in_mut(&mut self.qps, &mut self.gsi, qpn) else {
            return;
        };
        let old = std::mem::replace(&mut qp.rc.timer_key, want);
        match want {
            Some(new) => {
                tracing::trace!(kind = "timer.armed", qp = qpn, at = new.as_nanos());
                self.timers.arm(new, qpn);
            }
            None => tracing::trace!(kind = "timer.cancelled", qp = qpn),
        }
        // Only a deadline that was set leaves a dead entry, which may be the front. Arming a QP
        // that had none (the ACK timeout of a WRITE) keeps the front live: it is the old front,
        // another QP's, or the new entry.
        if old.is_some() {
            self.purge_timers();
        }
    }

    /// Drops dead timer entries from the front of the index (see [`TimerIndex`]).
    fn purge_timers(&mut self) {
        let (qps, gsi) = (&self.qps, &self.gsi);
        self.timers.purge(|at, qpn| timer_live(qps, gsi, at, qpn));
    }

    fn check_cqe(&self, cqe: u32) -> Result<()> {
        if cqe == 0 || cqe > self.config.limits.max_cqe {
            return Err(Error::invalid(format!(
                "cqe {cqe} outside 1..={}",
                self.config.limits.max_cqe
            )));
        }
        Ok(())
    }

    fn cq(&self, cq: CqId) -> Result<&Cq> {
        self.cqs
            .get(cq.0)
            .ok_or_else(|| Error::invalid("no such CQ"))
    }

    fn cq_mut(&mut self, cq: CqId) -> Result<&mut Cq> {
        self.cqs
            .get_mut(cq.0)
            .ok_or_else(|| Error::invalid("no such CQ"))
    }

    fn qp(&self, qpn: u32) -> Result<&Qp> {
        qp_in(&self.qps, &self.gsi, qpn)
            .ok_or_else(|| Error::invalid(format!("no such QP {qpn:#x}")))
    }

    fn qp_mut(&mut self, qpn: u32) -> Result<&mut Qp> {
        qp_in_mut(&mut self.qps, &mut self.gsi, qpn)
            .ok_or_else(|| Error::invalid(format!("no such QP {qpn:#x}")))
    }

    fn retain_qp_refs(&mut self, pd: PdId, scq: CqId, rcq: CqId, srq: Option<SrqId>, delta: i32) {
        let bump = |v: &mut u32| *v = v.saturating_add_signed(delta);
        if let Some(e) = self.pds.get_mut(pd.0) {
            bump(&mut e.refs);
        }
        if let Some(e) = self.cqs.get_mut(scq.0) {
            bump(&mut e.qp_refs);
        }
        if let Some(e) = self.cqs.get_mut(rcq.0) {
            bump(&mut e.qp_refs);
        }
        if let Some(e) = srq.and_then(|s| self.srqs.get_mut(s.0)) {
            bump(&mut e.qp_refs);
        }
    }

    /// Pushes a completion, turning an overrun into `CQ_ERR` and an armed CQ into a
    /// notification.
    pub(crate) fn complete(&mut self, cq: CqId, wc: WorkCompletion, solicited: bool) -> bool {
        tracing::debug!(
            kind = "wc",
            qp = wc.qp_num,
            cq = cq.0,
            wr_id = wc.wr_id,
            status = ?wc.status,
            opcode = ?wc.opcode,
            len = wc.byte_len,
        );
        let Some(entry) = self.cqs.get_mut(cq.0) else {
            return false;
        };
        match entry.push(wc, solicited) {
            Pushed::Stored => true,
            Pushed::Notify(channel) => {
                self.notifications.push_back(Notification { channel, cq });
                true
            }
            Pushed::Overflow => {
                self.events.push_back(AsyncEvent {
                    kind: AsyncEventKind::CqErr,
                    element: EventElement::Cq(cq.0),
                });
                false
            }
        }
    }

    /// Completes every queued WQE of `qpn` with `WR_FLUSH_ERR`, send queue first, in order
    /// (rc-transport.md §6.3). With an SRQ, raises `QP_LAST_WQE_REACHED` instead of touching
    /// the shared queue. Stops when a CQ overruns, as rxe does.
    fn flush_qp(&mut self, qpn: u32) {
        self.flush_engine_wcs();
        let Ok(qp) = self.qp_mut(qpn) else { return };
        let sq: Vec<SendWqe> = qp.sq.drain(..).collect();
        let mut rq: Vec<RecvWqe> = Vec::with_capacity(qp.rq.len() + 1);
        if let rc::InMsg::Send { wqe, .. } = std::mem::take(&mut qp.rc.msg) {
            rq.push(wqe);
        }
        rq.extend(qp.rq.drain(..));
        let (scq, rcq, srq) = (qp.send_cq, qp.recv_cq, qp.srq);
        for wqe in sq {
            if !self.complete(
                scq,
                flush_wc(qpn, wqe.wr_id, completer::wc_opcode(&wqe)),
                false,
            ) {
                break;
            }
        }
        for wqe in rq {
            if !self.complete(rcq, flush_wc(qpn, wqe.wr_id, WcOpcode::Recv), false) {
                break;
            }
        }
        if srq.is_some() {
            self.events.push_back(AsyncEvent {
                kind: AsyncEventKind::QpLastWqeReached,
                element: EventElement::Qp(qpn),
            });
        }
    }
}

/// Why `qp` refuses `pkt` from `src` before the transport looks at it, if it does: its state
/// does not take the packet's kind, or (rxe drops both silently, §1.10, trap 10) the source
/// is not its peer or the P_Key is foreign.
fn refusal(qp: &Qp, pkt: &PacketRepr<'_>, src: IpAddr) -> Option<RxDropCause> {
    let op = pkt.bth.opcode;
    let state = qp.state();
    let accepts = if op.is_request() {
        matches!(state, QpState::Rtr | QpState::Rts | QpState::Sqd)
    } else {
        op.is_response() && matches!(state, QpState::Rts | QpState::Sqd)
    };
    if !accepts {
        Some(RxDropCause::WrongState)
    } else if qp.peer_ip != src {
        Some(RxDropCause::WrongSource)
    } else if pkt.bth.pkey & 0x7FFF != 0x7FFF {
        Some(RxDropCause::BadPkey)
    } else {
        None
    }
}

fn check_port(port_num: u8) -> Result<()> {
    if port_num != 1 {
        return Err(Error::invalid(format!(
            "port {port_num} does not exist (ports: 1)"
        )));
    }
    Ok(())
}

/// Access-flag rules for MR registration (rc-transport.md §7.1, §7.2).
fn check_mr_access(access: AccessFlags) -> Result<()> {
    let known = AccessFlags::all().bits() | OPTIONAL_ACCESS_RANGE;
    if access.bits() & !known != 0 {
        return Err(Error::invalid(format!(
            "unknown access bits {:#x}",
            access.bits() & !known
        )));
    }
    let needs_local = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    if access.intersects(needs_local) && !access.contains(AccessFlags::LOCAL_WRITE) {
        return Err(Error::invalid(
            "REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE",
        ));
    }
    if access.intersects(AccessFlags::ZERO_BASED | AccessFlags::ON_DEMAND) {
        return Err(Error::new(
            ErrorKind::NotSupported,
            "ZERO_BASED and ON_DEMAND registration are not implemented",
        ));
    }
    Ok(())
}

/// `IBV_ACCESS_OPTIONAL_RANGE`: bits 20..=29 may be ignored by a provider (§7.1).
const OPTIONAL_ACCESS_RANGE: u32 = 0x3FF0_0000;

/// `t − now` in nanoseconds, 0 if `t` is not after `now`.
/// The QP a received packet for `qpn` goes to, if it exists and runs the packet's transport
/// `ty`; otherwise the drop is counted (`unknown_qp` on the device, `malformed` on the QP: an
/// RC opcode for a UD QP or the reverse does not match its transport, and rxe drops it too).
fn receiving_qp<'a>(
    qps: &'a mut Table<Qp>,
    gsi: &'a mut Option<Qp>,
    stats: &mut Stats,
    qpn: u32,
    ty: QpType,
) -> Option<&'a mut Qp> {
    let Some(qp) = qp_in_mut(qps, gsi, qpn) else {
        stats.count_drop(RxDropCause::UnknownQp);
        return None;
    };
    if qp.qp_type != ty {
        qp.rc.stats.count_drop(RxDropCause::Malformed);
        return None;
    }
    Some(qp)
}

/// True if the RC or UC QP `qp` has nothing to send or complete now: no response queued, no
/// send WQE at or after the requester's position, no head WQE with an error or a finished local
/// operation to complete, and no selective repeat (whose resends are not looked at here). A
/// transmit turn of such a QP changes nothing — the responder, requester and completer all
/// return at once — so [`Hca::poll_transmit`] skips it and the bookkeeping after it.
fn idle(qp: &Qp) -> bool {
    qp.rc.responses.is_empty()
        && !qp.rc.resp_fatal
        && qp.rc.req_index >= qp.sq.len()
        && !rc::sr::enabled(qp)
        && qp
            .sq
            .front()
            .is_none_or(|w| w.tx.error.is_none() && !(w.tx.started && w.op.is_local()))
}

/// Queues QP `qpn` (`qp`) for a transmit turn in `ready`, unless it is queued already.
fn queue_turn(ready: &mut VecDeque<u32>, qp: &mut Qp, qpn: u32) {
    if !qp.rc.queued {
        qp.rc.queued = true;
        ready.push_back(qpn);
    }
}

/// `qp`'s deadline when its timer entry no longer matches it (`Some(None)`: disarm), else
/// `None`: what [`Hca::move_timer`] is called with.
fn stale_deadline(qp: &Qp) -> Option<Option<Instant>> {
    let want = qp.rc.deadline();
    (want != qp.rc.timer_key).then_some(want)
}

/// The `device` span (`dev`, `addr`, engine time `now` in ns) every event of a call is in, of
/// the device with `config` and IP `own_ip`.
#[inline(never)]
fn device_span(config: &HcaConfig, own_ip: IpAddr, now: Option<Instant>) -> tracing::Span {
    tracing::debug_span!(
        "device",
        dev = %config.name,
        addr = %SocketAddr::new(own_ip, config.udp_port),
        now = now.map(Instant::as_nanos),
    )
}

/// [`Hca::entered_span`] from the fields it reads, so that a caller may hold a QP meanwhile.
#[inline]
fn entered_span(
    config: &HcaConfig,
    own_ip: IpAddr,
    now: Option<Instant>,
) -> Option<tracing::span::EnteredSpan> {
    tracing::level_enabled!(tracing::Level::DEBUG)
        .then(|| device_span(config, own_ip, now).entered())
}

/// The `device` and `qp` spans, entered.
type QpSpan = (tracing::span::EnteredSpan, tracing::span::EnteredSpan);

/// [`Hca::qp_span`] from the fields it reads, so that a caller may hold a QP meanwhile.
#[inline]
fn qp_span(config: &HcaConfig, own_ip: IpAddr, now: Option<Instant>, qpn: u32) -> Option<QpSpan> {
    let dev = entered_span(config, own_ip, now)?;
    Some((dev, tracing::debug_span!("qp", qp = qpn).entered()))
}

/// True if QP `qpn` exists and its deadline is `at`: its timer entry `(at, qpn)` is live.
fn timer_live(qps: &Table<Qp>, gsi: &Option<Qp>, at: Instant, qpn: u32) -> bool {
    qp_in(qps, gsi, qpn).is_some_and(|qp| qp.rc.timer_key == Some(at))
}

/// QP `qpn`: the GSI for [`GSI_QPN`], else the table's entry `qpn - FIRST_QPN`.
fn qp_in<'a>(qps: &'a Table<Qp>, gsi: &'a Option<Qp>, qpn: u32) -> Option<&'a Qp> {
    if qpn == GSI_QPN {
        return gsi.as_ref();
    }
    qpn.checked_sub(FIRST_QPN).and_then(|i| qps.get(i))
}

/// [`qp_in`], mutable.
fn qp_in_mut<'a>(qps: &'a mut Table<Qp>, gsi: &'a mut Option<Qp>, qpn: u32) -> Option<&'a mut Qp> {
    if qpn == GSI_QPN {
        return gsi.as_mut();
    }
    qpn.checked_sub(FIRST_QPN).and_then(|i| qps.get_mut(i))
}

fn saturating_nanos(t: Instant, now: Instant) -> u64 {
    u64::try_from(t.saturating_duration_since(now).as_nanos()).unwrap_or(u64::MAX)
}

fn flush_wc(qpn: u32, wr_id: u64, opcode: WcOpcode) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status: WcStatus::WrFlushErr,
        opcode,
        qp_num: qpn,
        ..WorkCompletion::default()
    }
}
