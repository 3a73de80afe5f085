//! Work completions (`ibv_wc`) with rdma-core's status and opcode numbers and names
//! (rc-transport.md §6).

use core::fmt;

use crate::types::WcFlags;

/// Completion status (`ibv_wc_status`), numbered as rdma-core numbers it.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcStatus {
    /// 0: the work request completed successfully.
    #[default]
    Success = 0,
    /// 1: local length error (e.g. an incoming SEND larger than the receive buffers).
    LocLenErr = 1,
    /// 2: local QP operation error.
    LocQpOpErr = 2,
    /// 3: local EE context operation error.
    LocEecOpErr = 3,
    /// 4: local protection error (bad lkey, PD mismatch, missing LOCAL_WRITE).
    LocProtErr = 4,
    /// 5: the work request was flushed because the QP is in ERR.
    WrFlushErr = 5,
    /// 6: memory window bind error.
    MwBindErr = 6,
    /// 7: bad response error (unexpected opcode from the responder).
    BadRespErr = 7,
    /// 8: local access error.
    LocAccessErr = 8,
    /// 9: the responder reported an invalid request (NAK 0x61).
    RemInvReqErr = 9,
    /// 10: the responder reported a remote access error (NAK 0x62).
    RemAccessErr = 10,
    /// 11: the responder reported a remote operational error (NAK 0x63).
    RemOpErr = 11,
    /// 12: transport retries exhausted (`retry_cnt`).
    RetryExcErr = 12,
    /// 13: RNR retries exhausted (`rnr_retry`).
    RnrRetryExcErr = 13,
    /// 14: local RDD violation.
    LocRddViolErr = 14,
    /// 15: remote invalid RD request.
    RemInvRdReqErr = 15,
    /// 16: remote aborted.
    RemAbortErr = 16,
    /// 17: invalid EE context number.
    InvEecnErr = 17,
    /// 18: invalid EE context state.
    InvEecStateErr = 18,
    /// 19: fatal error.
    FatalErr = 19,
    /// 20: response timeout.
    RespTimeoutErr = 20,
    /// 21: general error.
    GeneralErr = 21,
    /// 22: tag matching error.
    TmErr = 22,
    /// 23: tag matching rendezvous incomplete.
    TmRndvIncomplete = 23,
}

impl WcStatus {
    /// rdma-core's enum name, e.g. `"IBV_WC_RETRY_EXC_ERR"`.
    pub const fn name(self) -> &'static str {
        match self {
            WcStatus::Success => "IBV_WC_SUCCESS",
            WcStatus::LocLenErr => "IBV_WC_LOC_LEN_ERR",
            WcStatus::LocQpOpErr => "IBV_WC_LOC_QP_OP_ERR",
            WcStatus::LocEecOpErr => "IBV_WC_LOC_EEC_OP_ERR",
            WcStatus::LocProtErr => "IBV_WC_LOC_PROT_ERR",
            WcStatus::WrFlushErr => "IBV_WC_WR_FLUSH_ERR",
            WcStatus::MwBindErr => "IBV_WC_MW_BIND_ERR",
            WcStatus::BadRespErr => "IBV_WC_BAD_RESP_ERR",
            WcStatus::LocAccessErr => "IBV_WC_LOC_ACCESS_ERR",
            WcStatus::RemInvReqErr => "IBV_WC_REM_INV_REQ_ERR",
            WcStatus::RemAccessErr => "IBV_WC_REM_ACCESS_ERR",
            WcStatus::RemOpErr => "IBV_WC_REM_OP_ERR",
            WcStatus::RetryExcErr => "IBV_WC_RETRY_EXC_ERR",
            WcStatus::RnrRetryExcErr => "IBV_WC_RNR_RETRY_EXC_ERR",
            WcStatus::LocRddViolErr => "IBV_WC_LOC_RDD_VIOL_ERR",
            WcStatus::RemInvRdReqErr => "IBV_WC_REM_INV_RD_REQ_ERR",
            WcStatus::RemAbortErr => "IBV_WC_REM_ABORT_ERR",
            WcStatus::InvEecnErr => "IBV_WC_INV_EECN_ERR",
            WcStatus::InvEecStateErr => "IBV_WC_INV_EEC_STATE_ERR",
            WcStatus::FatalErr => "IBV_WC_FATAL_ERR",
            WcStatus::RespTimeoutErr => "IBV_WC_RESP_TIMEOUT_ERR",
            WcStatus::GeneralErr => "IBV_WC_GENERAL_ERR",
            WcStatus::TmErr => "IBV_WC_TM_ERR",
            WcStatus::TmRndvIncomplete => "IBV_WC_TM_RNDV_INCOMPLETE",
        }
    }

    /// The text of `ibv_wc_status_str`, e.g. `"transport retry counter exceeded"`.
    pub const fn description(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocEecOpErr => "local EE context operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::LocRddViolErr => "local RDD violation error",
            WcStatus::RemInvRdReqErr => "remote invalid RD request",
            WcStatus::RemAbortErr => "aborted error",
            WcStatus::InvEecnErr => "invalid EE context number",
            WcStatus::InvEecStateErr => "invalid EE context state",
            WcStatus::FatalErr => "fatal error",
            WcStatus::RespTimeoutErr => "response timeout error",
            WcStatus::GeneralErr => "general error",
            WcStatus::TmErr => "TM error",
            WcStatus::TmRndvIncomplete => "TM software rendezvous",
        }
    }

    /// The status for rdma-core's numeric value.
    pub fn from_raw(v: u32) -> Option<WcStatus> {
        WcStatus::ALL.get(usize::try_from(v).ok()?).copied()
    }

    /// Every status in numeric order.
    pub const ALL: [WcStatus; 24] = [
        WcStatus::Success,
        WcStatus::LocLenErr,
        WcStatus::LocQpOpErr,
        WcStatus::LocEecOpErr,
        WcStatus::LocProtErr,
        WcStatus::WrFlushErr,
        WcStatus::MwBindErr,
        WcStatus::BadRespErr,
        WcStatus::LocAccessErr,
        WcStatus::RemInvReqErr,
        WcStatus::RemAccessErr,
        WcStatus::RemOpErr,
        WcStatus::RetryExcErr,
        WcStatus::RnrRetryExcErr,
        WcStatus::LocRddViolErr,
        WcStatus::RemInvRdReqErr,
        WcStatus::RemAbortErr,
        WcStatus::InvEecnErr,
        WcStatus::InvEecStateErr,
        WcStatus::FatalErr,
        WcStatus::RespTimeoutErr,
        WcStatus::GeneralErr,
        WcStatus::TmErr,
        WcStatus::TmRndvIncomplete,
    ];
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Completion opcode (`ibv_wc_opcode`). Receive-side values have bit 7 set.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcOpcode {
    /// 0: SEND or SEND_WITH_IMM completed at the requester.
    #[default]
    Send = 0,
    /// 1: RDMA WRITE (with or without immediate) completed at the requester.
    RdmaWrite = 1,
    /// 2: RDMA READ completed.
    RdmaRead = 2,
    /// 3: compare-and-swap completed.
    CompSwap = 3,
    /// 4: fetch-and-add completed.
    FetchAdd = 4,
    /// 5: memory window bind.
    BindMw = 5,
    /// 6: local invalidate.
    LocalInv = 6,
    /// 128: a receive WR consumed by SEND.
    Recv = 128,
    /// 129: a receive WR consumed by RDMA WRITE with immediate.
    RecvRdmaWithImm = 129,
}

impl WcOpcode {
    /// rdma-core's enum name, e.g. `"IBV_WC_RECV"`.
    pub const fn name(self) -> &'static str {
        match self {
            WcOpcode::Send => "IBV_WC_SEND",
            WcOpcode::RdmaWrite => "IBV_WC_RDMA_WRITE",
            WcOpcode::RdmaRead => "IBV_WC_RDMA_READ",
            WcOpcode::CompSwap => "IBV_WC_COMP_SWAP",
            WcOpcode::FetchAdd => "IBV_WC_FETCH_ADD",
            WcOpcode::BindMw => "IBV_WC_BIND_MW",
            WcOpcode::LocalInv => "IBV_WC_LOCAL_INV",
            WcOpcode::Recv => "IBV_WC_RECV",
            WcOpcode::RecvRdmaWithImm => "IBV_WC_RECV_RDMA_WITH_IMM",
        }
    }

    /// True for receive-side completions (`opcode & IBV_WC_RECV`).
    pub const fn is_recv(self) -> bool {
        (self as u32) & 0x80 != 0
    }
}

/// A work completion (`ibv_wc`).
///
/// When `status` is not [`WcStatus::Success`], only `wr_id`, `status`, `qp_num` and
/// `vendor_err` are meaningful (rc-transport.md §6.1).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct WorkCompletion {
    /// The identifier the work request was posted with.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// Operation that completed (valid on success).
    pub opcode: WcOpcode,
    /// Provider-specific error detail.
    pub vendor_err: u32,
    /// Bytes transferred: the WR's total length on the send side, bytes placed for RECV, the
    /// RETH length for RECV_RDMA_WITH_IMM (rc-transport.md §6.2).
    pub byte_len: u32,
    /// Immediate data, valid when `wc_flags` has WITH_IMM; the value the sender posted.
    pub imm_data: u32,
    /// The R_Key a SEND_WITH_INV invalidated, valid when `wc_flags` has WITH_INV (in rdma-core
    /// it shares a union with `imm_data`).
    pub invalidated_rkey: u32,
    /// Local QP number.
    pub qp_num: u32,
    /// Remote QP number (UD only).
    pub src_qp: u32,
    /// Flags.
    pub wc_flags: WcFlags,
    /// P_Key index (GSI only).
    pub pkey_index: u16,
    /// Source LID.
    pub slid: u16,
    /// Service level.
    pub sl: u8,
}

impl WorkCompletion {
    /// True if `status` is SUCCESS.
    pub fn is_success(&self) -> bool {
        self.status == WcStatus::Success
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_numbers_match_rdma_core() {
        for (i, s) in WcStatus::ALL.iter().enumerate() {
            assert_eq!(*s as usize, i);
            assert_eq!(WcStatus::from_raw(i as u32), Some(*s));
        }
        assert_eq!(WcStatus::WrFlushErr as u32, 5);
        assert_eq!(WcStatus::RetryExcErr as u32, 12);
        assert_eq!(WcStatus::RnrRetryExcErr as u32, 13);
        assert_eq!(WcStatus::from_raw(24), None);
        assert_eq!(WcStatus::RetryExcErr.name(), "IBV_WC_RETRY_EXC_ERR");
    }

    #[test]
    fn recv_opcodes_have_bit_7() {
        assert!(WcOpcode::Recv.is_recv());
        assert!(WcOpcode::RecvRdmaWithImm.is_recv());
        assert!(!WcOpcode::RdmaRead.is_recv());
        assert_eq!(WcOpcode::RecvRdmaWithImm as u32, 129);
    }
}
