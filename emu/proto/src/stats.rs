//! Counters per QP and per device, named after rxe's hw counters (`rxe_hw_counters.h`) where
//! rxe has one, and the causes for which the device discards a received packet.
//!
//! Plain data: the HCA and the RC engine count, drivers and reports read.

use core::ops::AddAssign;

/// Transport counters. Per QP from [`crate::Hca::qp_stats`], summed over the device (including
/// destroyed QPs and packets no QP accepted) from [`crate::Hca::stats`].
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Stats {
    /// Packets sent (`sent_pkts`).
    pub sent_pkts: u64,
    /// Packets received and accepted by a QP (`rcvd_pkts`).
    pub rcvd_pkts: u64,
    /// Payload bytes sent.
    pub sent_bytes: u64,
    /// Payload bytes received.
    pub rcvd_bytes: u64,
    /// Request packets sent again after a local ACK timeout (`completer_retry_err` counts the
    /// retry events; this counts packets).
    pub retransmits_timeout: u64,
    /// Request packets sent again after a NAK (sequence error or RNR).
    pub retransmits_nak: u64,
    /// Retry events started by the local ACK timeout (`completer_retry_err`).
    pub timeout_retries: u64,
    /// Duplicate requests received (`duplicate_request`).
    pub duplicate_request: u64,
    /// Out-of-sequence requests received (`out_of_seq_request`).
    pub out_of_seq_request: u64,
    /// PSN sequence NAKs sent.
    pub seq_naks_sent: u64,
    /// PSN sequence NAKs received (`rcvd_seq_err`).
    pub rcvd_seq_err: u64,
    /// RNR NAKs sent (`send_rnr_err`).
    pub send_rnr_err: u64,
    /// RNR NAKs received (`rcvd_rnr_err`).
    pub rcvd_rnr_err: u64,
    /// Packets dropped for a bad ICRC (device only).
    pub icrc_errors: u64,
    /// IPv4 packets whose ICRC matched only with a non-zero IPv4 identification, which was
    /// solved for (`HcaConfig::foreign_ipv4_ident`; device only): traffic from rxe or a NIC.
    pub icrc_ident_solved: u64,
    /// Received packets dropped for a cause [`RxDropCause::counts_in_dropped`] names
    /// (malformed, unknown QP, wrong state, source or P_Key, responder queue full), plus
    /// packets the engine could not build (an MR gone under a READ response, a codec error).
    pub dropped: u64,
    /// Transport retries exhausted (`retry_exceeded_err`).
    pub retry_exceeded_err: u64,
    /// RNR retries exhausted (`retry_rnr_exceeded_err`).
    pub retry_rnr_exceeded_err: u64,
    /// Duplicate or ghost responses ignored by the completer.
    pub duplicate_response: u64,
    /// ACKs sent (coalesced, explicit).
    pub acks_sent: u64,
    /// Request packets sent again because selective ACKs showed them missing, or by the
    /// selective-repeat probe (softverbs extension; 0 in IBTA mode).
    pub retransmits_sack: u64,
    /// Selective ACKs sent (selective repeat only).
    pub sacks_sent: u64,
    /// Selective ACKs received (selective repeat only).
    pub sacks_rcvd: u64,
    /// Selective-repeat probe timer expiries that resent something (selective repeat only).
    pub sr_probes: u64,
    /// Packets placed in memory on arrival past a gap (selective repeat only): RDMA WRITE
    /// packets at the responder (each also counts in `out_of_seq_request`), READ responses at
    /// the requester.
    pub sr_placed_early: u64,
    /// Received packets discarded, by cause (some also count in an older counter: see
    /// [`RxDropCause`]).
    pub rx_drops: RxDrops,
}

impl Stats {
    /// Request packets sent again, whatever made them go again (timeout, NAK, selective ACK).
    pub fn retransmits(&self) -> u64 {
        self.retransmits_timeout + self.retransmits_nak + self.retransmits_sack
    }

    /// Counts one received packet discarded for `cause`: its per-cause counter and the older
    /// counter that has always counted it, if any ([`RxDropCause`] says which).
    pub(crate) fn count_drop(&mut self, cause: RxDropCause) {
        tracing::debug!(kind = "pkt.drop", cause = cause.name());
        self.rx_drops.counts[cause as usize] += 1;
        use RxDropCause as C;
        let older = match cause {
            C::BadIcrc => Some(&mut self.icrc_errors),
            C::OutOfSequence => Some(&mut self.out_of_seq_request),
            C::ReceiverNotReady => Some(&mut self.send_rnr_err),
            C::StaleResponse => Some(&mut self.duplicate_response),
            C::DuplicateRequest => None,
            _ if cause.counts_in_dropped() => Some(&mut self.dropped),
            _ => None,
        };
        if let Some(counter) = older {
            *counter += 1;
        }
    }
}

/// Why the device discarded a received packet without executing it, in the order of the
/// checks (rc-transport.md §1.8–§1.10, §2.6, §2.10, §4.2, §4.5). Each cause has a counter in
/// [`RxDrops`], reported by [`RxDropCause::name`].
///
/// Not a drop: a request the responder rejects with a NAK that moves its QP to ERR (a class
/// A/C error), or a duplicate it answers again (re-ACK, READ re-execution, atomic replay).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RxDropCause {
    /// The sender's and the device's IP addresses are of different versions: no ICRC can be
    /// computed (counted in `dropped` too).
    AddressFamily,
    /// The ICRC does not match (counted in `icrc_errors` too).
    BadIcrc,
    /// The headers do not parse (unknown opcode, truncated), or an ACKNOWLEDGE carries a
    /// reserved AETH syndrome (counted in `dropped` too).
    Malformed,
    /// No QP has the BTH's destination QP number (counted in `dropped` too).
    UnknownQp,
    /// The QP's state does not accept the packet: requests need RTR, RTS or SQD, responses
    /// RTS or SQD (counted in `dropped` too).
    WrongState,
    /// The source address is not the QP's peer (counted in `dropped` too).
    WrongSource,
    /// The P_Key is not the default partition (counted in `dropped` too).
    BadPkey,
    /// The responder's queue of owed responses is full; the requester retries (counted in
    /// `dropped` too).
    ResponderBusy,
    /// A request past the expected PSN: a gap, NAKed once per gap (counted in
    /// `out_of_seq_request` too).
    OutOfSequence,
    /// A duplicate request with nothing to answer: a READ outside the remembered one, an
    /// atomic not at its first PSN or no longer remembered (`duplicate_request` counts every
    /// duplicate, answered or not).
    DuplicateRequest,
    /// A request that needs a receive WQE when none is posted: RNR NAKed (counted in
    /// `send_rnr_err` too).
    ReceiverNotReady,
    /// A response outside the window of un-ACKed PSNs, or not the next one expected (a
    /// duplicate, or one after a lost response) (counted in `duplicate_response` too).
    StaleResponse,
    /// A UD datagram, or a UC SEND or WRITE_WITH_IMM, for a QP with no receive WQE posted:
    /// dropped silently (a UC message whole), never RNR
    /// (counted in `dropped` too).
    NoRecvWqe,
    /// A UD datagram whose DETH Q_Key differs from the QP's (counted in `dropped` too).
    BadQkey,
    /// A UC packet of a message that cannot be delivered whole: a MIDDLE/LAST after a PSN gap
    /// or without its FIRST, or the rest of a message cut off that way; the responder resumes
    /// at the next FIRST/ONLY (IBTA 9.7.5.1.x; counted in `dropped` too).
    IncompleteMessage,
    /// A UC request the responder refuses (no REMOTE_WRITE on the QP, an R_Key or length
    /// violation, a receive buffer too small): UC has no NAK, so its message is dropped
    /// silently (rxe's class D/E errors; counted in `dropped` too).
    UcRejected,
}

impl RxDropCause {
    /// Every cause, in declaration order.
    pub const ALL: [RxDropCause; 16] = [
        RxDropCause::AddressFamily,
        RxDropCause::BadIcrc,
        RxDropCause::Malformed,
        RxDropCause::UnknownQp,
        RxDropCause::WrongState,
        RxDropCause::WrongSource,
        RxDropCause::BadPkey,
        RxDropCause::ResponderBusy,
        RxDropCause::OutOfSequence,
        RxDropCause::DuplicateRequest,
        RxDropCause::ReceiverNotReady,
        RxDropCause::StaleResponse,
        RxDropCause::NoRecvWqe,
        RxDropCause::BadQkey,
        RxDropCause::IncompleteMessage,
        RxDropCause::UcRejected,
    ];

    /// The counter's name in reports: `snake_case`, stable.
    pub fn name(self) -> &'static str {
        match self {
            RxDropCause::AddressFamily => "address_family",
            RxDropCause::BadIcrc => "bad_icrc",
            RxDropCause::Malformed => "malformed",
            RxDropCause::UnknownQp => "unknown_qp",
            RxDropCause::WrongState => "wrong_state",
            RxDropCause::WrongSource => "wrong_source",
            RxDropCause::BadPkey => "bad_pkey",
            RxDropCause::ResponderBusy => "responder_busy",
            RxDropCause::OutOfSequence => "out_of_sequence",
            RxDropCause::DuplicateRequest => "duplicate_request",
            RxDropCause::ReceiverNotReady => "receiver_not_ready",
            RxDropCause::StaleResponse => "stale_response",
            RxDropCause::NoRecvWqe => "no_recv_wqe",
            RxDropCause::BadQkey => "bad_qkey",
            RxDropCause::IncompleteMessage => "incomplete_message",
            RxDropCause::UcRejected => "uc_rejected",
        }
    }

    /// True for the causes the `dropped` counter has always summed.
    pub fn counts_in_dropped(self) -> bool {
        use RxDropCause as C;
        matches!(
            self,
            C::AddressFamily
                | C::Malformed
                | C::UnknownQp
                | C::WrongState
                | C::WrongSource
                | C::BadPkey
                | C::ResponderBusy
                | C::NoRecvWqe
                | C::BadQkey
                | C::IncompleteMessage
                | C::UcRejected
        )
    }
}

/// One counter per [`RxDropCause`].
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct RxDrops {
    counts: [u64; RxDropCause::ALL.len()],
}

impl RxDrops {
    /// Packets discarded for `cause`.
    pub fn get(&self, cause: RxDropCause) -> u64 {
        self.counts[cause as usize]
    }

    /// Packets discarded for any cause.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Every cause with its count, in [`RxDropCause::ALL`] order (zeros included).
    pub fn iter(&self) -> impl Iterator<Item = (RxDropCause, u64)> + '_ {
        RxDropCause::ALL.iter().map(|&c| (c, self.get(c)))
    }
}

impl AddAssign for RxDrops {
    fn add_assign(&mut self, o: RxDrops) {
        for (a, b) in self.counts.iter_mut().zip(o.counts) {
            *a += b;
        }
    }
}

impl AddAssign for Stats {
    fn add_assign(&mut self, o: Stats) {
        macro_rules! sum {
            ($($f:ident),*) => { $(self.$f += o.$f;)* };
        }
        sum!(
            sent_pkts,
            rcvd_pkts,
            sent_bytes,
            rcvd_bytes,
            retransmits_timeout,
            retransmits_nak,
            timeout_retries,
            duplicate_request,
            out_of_seq_request,
            seq_naks_sent,
            rcvd_seq_err,
            send_rnr_err,
            rcvd_rnr_err,
            icrc_errors,
            icrc_ident_solved,
            dropped,
            retry_exceeded_err,
            retry_rnr_exceeded_err,
            duplicate_response,
            acks_sent,
            retransmits_sack,
            sacks_sent,
            sacks_rcvd,
            sr_probes,
            sr_placed_early,
            rx_drops
        );
    }
}
