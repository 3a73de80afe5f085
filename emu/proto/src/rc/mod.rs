//! The InfiniBand RC transport: requester, completer and responder (rc-transport.md §2–§4),
//! after rxe's `rxe_req.c`, `rxe_comp.c` and `rxe_resp.c`.
//!
//! Everything here is sans-IO: functions take the QP, a [`Ctx`] (time, MR table, memory,
//! completion and event sinks) and packets, and they produce packets into caller buffers,
//! completions and timer deadlines. The HCA (`crate::hca`) routes packets to QPs, drains
//! transmits and keeps the timer index.
//!
//! UC (`crate::uc`) reuses the requester and the responder's SEND/WRITE execution. Memory
//! windows are bound and invalidated here (BIND_MW, LOCAL_INV at the requester,
//! SEND_WITH_INV at the responder) through `crate::mw`.
//!
//! It is not a general IB transport: UD, RD, credits (rxe ignores them too;
//! we always advertise unlimited credits, §1.5) and automatic path migration are out of scope.

pub(crate) mod completer;
pub(crate) mod requester;
pub(crate) mod responder;
pub(crate) mod sr;
pub(crate) mod tx;

use std::collections::VecDeque;
use std::time::Duration;

use verbs_api::{AccessFlags, AsyncEvent, WcStatus, WorkCompletion};

use crate::ids::{CqId, MrInfo, PdId};
use crate::memory::Memory;
use crate::srq::SrqEntry;
use crate::stats::Stats;
use crate::table::Table;
use crate::time::Instant;
use crate::wire::{NakCode, Psn};

pub(crate) use tx::MAX_PACKET_LEN;
pub use tx::PacketClass;

/// At most this many un-ACKed PSNs per QP: the requester's window (rc-transport.md §2.11).
/// rxe allows 128 un-ACKed PSNs and 64 packets in flight; we take 64, because a go-back-N
/// round resends about a window per loss (issue 19: at 1 % loss 128 costs ~1.8× the packets,
/// 64 ~1.4×) while 64 × 4 KiB still covers a loopback or LAN path (DIVERGENCES.md #20).
pub(crate) const MAX_UNACKED_PSNS: i32 = 64;

/// One queued ACK answers AckReq packets spanning at most this many PSNs; the next one gets
/// its own ACK. A responder that takes a whole window in one pass would otherwise answer it
/// with one ACK, whose loss stalls a window-limited requester until its ACK timeout (issue 19).
pub(crate) const MAX_ACK_COALESCE: i32 = 32;

/// Set AckReq at least every this many packets inside long messages (rxe: 64, §2.7).
pub(crate) const MAX_PKT_PER_ACK: u32 = 64;

/// The local ACK timeout: 4.096 µs × 2^`timeout`; `None` for 0 = infinite (§3.5).
pub(crate) fn ack_timeout(timeout: u8) -> Option<Duration> {
    (timeout != 0).then(|| Duration::from_nanos(4096u64 << timeout.min(31)))
}

/// What the engine needs from the HCA besides the QP.
pub(crate) struct Ctx<'a> {
    pub(crate) now: Instant,
    pub(crate) mrs: &'a Table<MrInfo>,
    /// Memory windows: remote keys resolve through them; BIND_MW and invalidations change them.
    pub(crate) mws: &'a mut Table<crate::mw::MwEntry>,
    pub(crate) srqs: &'a mut Table<SrqEntry>,
    pub(crate) mem: &'a dyn Memory,
    /// Completions to push, in order: (CQ, completion, solicited).
    pub(crate) wcs: &'a mut Vec<(CqId, WorkCompletion, bool)>,
    pub(crate) events: &'a mut VecDeque<AsyncEvent>,
}

impl Ctx<'_> {
    /// The MR `key` names if it is registered in `pd`.
    pub(crate) fn mr(&self, key: u32, pd: PdId) -> Option<&MrInfo> {
        self.mrs
            .get(key >> 8)
            .filter(|m| m.lkey == key && m.length != 0 && m.pd == pd)
    }

    /// Resolves `va..va+len` in MR `key` of `pd` with `need` rights: the MR key and the offset
    /// of `va` from the MR's start (rc-transport.md §4.4, §7.4).
    pub(crate) fn resolve(
        &self,
        key: u32,
        pd: PdId,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Option<(u32, u64)> {
        let mr = self.mr(key, pd)?;
        if !mr.access.contains(need) {
            return None;
        }
        let offset = va.checked_sub(mr.iova)?;
        let end = offset.checked_add(len)?;
        (end <= mr.length).then_some((key, offset))
    }

    /// As [`resolve`](Self::resolve) for an R_Key a peer sent to QP `qpn`: an MR key resolves
    /// as an MR's, a window key through its window (`crate::mw::resolve`).
    pub(crate) fn resolve_remote(
        &self,
        key: u32,
        pd: PdId,
        qpn: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Option<(u32, u64)> {
        if crate::mw::is_window_key(key) {
            crate::mw::resolve(self.mws, key, pd, qpn, va, len, need)
        } else {
            self.resolve(key, pd, va, len, need)
        }
    }
}

/// The per-QP transport state. Reset to `default()` whenever the QP enters RESET.
#[derive(Clone, Debug, Default)]
pub(crate) struct RcState {
    // ---- requester/completer (send side) ----
    /// PSN of the next request packet.
    pub(crate) req_psn: Psn,
    /// Oldest PSN not yet acknowledged (the completer's expected response PSN).
    pub(crate) comp_psn: Psn,
    /// Index in the send queue of the next WQE to (re)transmit from.
    pub(crate) req_index: usize,
    /// READ/atomic WQEs started and not completed.
    pub(crate) rd_atomic_outstanding: u32,
    pub(crate) retry_left: u8,
    pub(crate) rnr_retry_left: u8,
    /// A NAK already started a retry; only a timeout may start another until progress.
    pub(crate) started_retry: bool,
    pub(crate) retransmit_at: Option<Instant>,
    /// Waiting out an RNR NAK: nothing is sent until then (§3.7 "RNR wait").
    pub(crate) rnr_at: Option<Instant>,
    /// `SQ_DRAINED` is owed when the started WQEs complete in SQD.
    pub(crate) sqd_notify: bool,
    /// One past the highest PSN ever sent: packets before it are retransmissions.
    pub(crate) sent_high: Psn,
    /// The current retry was started by the local ACK timeout (else by a NAK).
    pub(crate) retry_by_timeout: bool,
    /// When the last go-back-N round started, and from which PSN: a sequence NAK for a PSN
    /// that round already resent is trusted only once a round trip has passed since (see
    /// `completer::nak_is_echo`).
    pub(crate) rewound: Option<(Instant, Psn)>,
    /// A sequence NAK judged an echo, for this PSN: if no progress was made by the instant
    /// given, it is acted on then (a misjudged NAK costs a short wait, not the ACK timeout).
    pub(crate) nak_deferred: Option<(Psn, Instant)>,
    /// The first transmission of an AckReq packet whose ACK is awaited for an RTT sample.
    pub(crate) rtt_probe: Option<(Psn, Instant)>,
    /// Smoothed round-trip time (7/8 old + 1/8 sample), `None` before the first sample.
    pub(crate) srtt: Option<Duration>,
    // ---- responder (receive side) ----
    pub(crate) epsn: Psn,
    /// One past the PSN of the last accepted SEND/WRITE/atomic packet (rxe `resp.ack_psn`):
    /// duplicates of SEND/WRITE are re-ACKed with `ack_psn − 1`. READs do not move it, so a
    /// re-ACK never carries a READ-response PSN (rc-transport.md §4.5, [S48]).
    pub(crate) ack_psn: Psn,
    pub(crate) msn: u32,
    /// A PSN sequence NAK was sent for the current gap (§2.6); see `responder::seq_nak_due`
    /// for when another one follows.
    pub(crate) seq_nak_sent: bool,
    /// The PSN of the latest out-of-sequence packet of the current gap.
    pub(crate) gap_last: Psn,
    /// Out-of-sequence packets since the last sequence NAK of the current gap.
    pub(crate) gap_unanswered: u32,
    pub(crate) msg: InMsg,
    /// UC only: the message in progress was lost or refused; every packet up to the next
    /// FIRST/ONLY is dropped (rxe's `resp.drop_msg`).
    pub(crate) uc_drop: bool,
    /// READ/atomic responder resources, oldest first, at most `max_dest_rd_atomic`.
    pub(crate) resources: VecDeque<Resource>,
    /// Building a response hit a class C error (an R_Key gone mid-READ): the HCA moves the QP
    /// to ERR once the NAK is out.
    pub(crate) resp_fatal: bool,
    pub(crate) responses: VecDeque<Response>,
    // ---- selective repeat (softverbs extension; untouched in IBTA mode) ----
    pub(crate) sr: sr::SrState,
    // ---- bookkeeping ----
    pub(crate) stats: Stats,
    /// The deadline registered in the HCA's timer index.
    pub(crate) timer_key: Option<Instant>,
    /// In the HCA's ready queue.
    pub(crate) queued: bool,
}

impl RcState {
    /// The earliest timer deadline.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        // Runs after every engine step: a chain of `Option` minima, no iterator.
        let earliest = |a: Option<Instant>, b: Option<Instant>| match (a, b) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        };
        let t = earliest(self.retransmit_at, self.rnr_at);
        let t = earliest(t, self.nak_deferred.map(|(_, t)| t));
        earliest(t, self.sr.probe_at)
    }
}

/// An inbound multi-packet message in progress at the responder.
#[derive(Clone, Debug, Default)]
pub(crate) enum InMsg {
    /// No message open: the next request must be FIRST, ONLY, READ or an atomic.
    #[default]
    None,
    /// A SEND: its receive WQE and the bytes placed so far.
    Send {
        wqe: crate::qp::RecvWqe,
        placed: u64,
        capacity: u64,
    },
    /// An RDMA WRITE: the target and the bytes still expected.
    Write {
        /// The R_Key the request named (an MR's or a window's), re-checked on every packet.
        rkey: u32,
        key: u32,
        offset: u64,
        remaining: u64,
        total: u32,
    },
}

/// A READ or atomic the responder executed, kept for duplicate handling (§4.5).
#[derive(Copy, Clone, Debug)]
pub(crate) struct Resource {
    pub(crate) first_psn: Psn,
    pub(crate) last_psn: Psn,
    pub(crate) kind: ResourceKind,
}

/// What a [`Resource`] remembers.
#[derive(Copy, Clone, Debug)]
pub(crate) enum ResourceKind {
    Read { va: u64, rkey: u32, len: u32 },
    Atomic { orig: u64 },
}

/// A response the responder owes the requester, sent in order.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Response {
    /// ACK for `psn`; `first` is the PSN of the oldest AckReq packet it answers (coalescing
    /// stops at [`MAX_ACK_COALESCE`] PSNs).
    Ack { psn: Psn, first: Psn },
    /// NAK (sequence, invalid request, remote access, remote operational) for `psn`.
    Nak { psn: Psn, code: NakCode },
    /// RNR NAK for `psn` carrying our `min_rnr_timer`.
    RnrNak { psn: Psn },
    /// Selective ACK (selective repeat only) whose BTH PSN is `psn`, the ePSN when queued; its
    /// bitmap is taken when it is built (`sr::bitmap`).
    Sack { psn: Psn },
    /// ATOMIC ACKNOWLEDGE for `psn` with the original value.
    AtomicAck { psn: Psn, orig: u64 },
    /// READ responses `first_psn + sent ..` of a read of `len` bytes at `va`.
    Read {
        first_psn: Psn,
        va: u64,
        rkey: u32,
        len: u32,
        sent: u32,
    },
}

/// Maps a NAK code to the requester's completion status (rc-transport.md §3.9).
pub(crate) fn nak_status(code: NakCode) -> WcStatus {
    match code {
        NakCode::InvalidRequest => WcStatus::RemInvReqErr,
        NakCode::RemoteAccessError => WcStatus::RemAccessErr,
        _ => WcStatus::RemOpErr,
    }
}

/// Number of packets a message of `len` bytes takes at `mtu`: at least one (§2.4, §3.1).
pub(crate) fn packets(len: u64, mtu: u32) -> u32 {
    let n = len.div_ceil(u64::from(mtu)).max(1);
    u32::try_from(n).unwrap_or(u32::MAX)
}
