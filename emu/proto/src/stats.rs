//! Counters per QP and per device, named after rxe's hw counters (`rxe_hw_counters.h`) where
//! rxe has one.

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
    /// Packets dropped as malformed, for an unknown QP, a wrong state or a wrong source.
    pub dropped: u64,
    /// Transport retries exhausted (`retry_exceeded_err`).
    pub retry_exceeded_err: u64,
    /// RNR retries exhausted (`retry_rnr_exceeded_err`).
    pub retry_rnr_exceeded_err: u64,
    /// Duplicate or ghost responses ignored by the completer.
    pub duplicate_response: u64,
    /// ACKs sent (coalesced, explicit).
    pub acks_sent: u64,
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
            acks_sent
        );
    }
}
