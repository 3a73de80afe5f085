//! The conformance suite against the real-hardware backend (`verbs-hw`): the RDMA devices
//! libibverbs lists (run it against Linux SoftRoCE with `scripts/rxe-conformance.sh`). With one
//! device (rxe0), the suite's peer context is a second context on the same device.
//!
//! On a machine without libibverbs, or whose libibverbs lists no device, every case is skipped
//! with the reason ("libibverbs not available: …", "no RDMA device: …").
//! `SOFTVERBS_DEVICE` restricts the run to one device by name.
//!
//! `SOFTVERBS_HW_RAW=1` runs the suite on `verbs-hw` in raw mode (`HwProvider::raw`): the
//! wrapper's contract-only checks are off, so the cases see libibverbs' and the device's own
//! answers. Known failures: `KNOWN` in both modes, `RAW_KNOWN` on top in raw mode; each names
//! the failure it expects, and any other failure of a listed case fails (`XFAIL mismatch`).

use std::io::Write;
use std::sync::OnceLock;

use verbs_api::{Device, Error, Provider};
use verbs_conformance::{CASE_NAMES, Env, KnownFailure, conformance_suite};
use verbs_hw::{HwContext, HwProvider};

/// Wraps the provider so that `SOFTVERBS_DEVICE` can pick one device.
struct Selected(HwProvider);

impl Provider for Selected {
    type Device = verbs_hw::HwDevice;

    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn devices(&self) -> verbs_api::Result<Vec<verbs_hw::HwDevice>> {
        let all = self.0.devices()?;
        match std::env::var(verbs_api::dynamic::DEVICE_ENV) {
            Ok(want) if !want.trim().is_empty() => Ok(all
                .into_iter()
                .filter(|d| d.name() == want.trim())
                .collect()),
            _ => Ok(all),
        }
    }
}

/// Whether `SOFTVERBS_HW_RAW=1` asks for raw mode: `verbs-hw`'s contract-only checks off, so
/// the cases see libibverbs' and the device's own answers.
fn raw_mode() -> bool {
    std::env::var(verbs_hw::RAW_ENV).is_ok_and(|v| v.trim() == "1")
}

fn hw_env() -> verbs_api::Result<Env<HwContext>> {
    let provider = if raw_mode() {
        HwProvider::raw()
    } else {
        HwProvider::new()
    }
    .map_err(|e| Error::unsupported(format!("libibverbs not available: {}", e.detail)))?;
    let env = Env::from_provider(&Selected(provider))?;
    if env.device_count() == 0 {
        return Err(Error::unsupported(
            "no RDMA device: libibverbs lists none (load rdma_rxe and add rxe0, or see \
             scripts/rxe-conformance.sh)",
        ));
    }
    Ok(env)
}

/// rxe (Debian 12: Linux 6.1, rdma-core 44) leaves receive WRs posted to a QP that is already
/// in ERR in its receive queue: user-space rxe writes them into the shared ring without a
/// kernel call, and the kernel flushes the ring only when the QP enters ERR (or a packet
/// arrives). The spec and the `verbs_api` contract complete them with `WR_FLUSH_ERR`.
const RXE_NO_RECV_FLUSH_IN_ERR: &str = "rxe does not flush receive WRs posted while the QP is \
     already in ERR (no completion, so no channel event either); the contract and IBTA flush \
     them with WR_FLUSH_ERR";

/// rxe in Linux 6.1 raises no `QP_LAST_WQE_REACHED` when a QP attached to an SRQ enters ERR.
const RXE_NO_LAST_WQE: &str = "rxe (Linux 6.1) raises no IBV_EVENT_QP_LAST_WQE_REACHED when a \
     QP with an SRQ enters ERR";

/// The failure rxe gives for a receive WR posted in ERR (no completion): the case's wait for
/// the flush completions times out (`EXP_NO_FLUSH_3` for three WRs).
const EXP_NO_FLUSH_1: &str = "expected 1 completions, got 0";
const EXP_NO_FLUSH_3: &str = "expected 3 completions, got 0";
/// No completion, so the armed channel never fires.
const EXP_NO_EVENT: &str = "no completion event within";
const EXP_NO_LAST_WQE: &str = "no QP_LAST_WQE_REACHED async event";
const EXP_UD_LEN: &str = "LocQpOpErr != LocLenErr";

/// Cases that fail against rxe because rxe deviates from the contract (each is listed in the
/// differential report of `scripts/rxe-conformance.sh`; none is a bug of this backend).
const KNOWN: &[KnownFailure] = &[
    KnownFailure {
        case: "posting::post_recv_in_err_flushes",
        reason: RXE_NO_RECV_FLUSH_IN_ERR,
        expect: EXP_NO_FLUSH_3,
    },
    KnownFailure {
        case: "posting::post_recv_in_reset_invalid_state",
        reason: RXE_NO_RECV_FLUSH_IN_ERR,
        expect: EXP_NO_FLUSH_1,
    },
    KnownFailure {
        case: "qp_state::reset_clears_queues",
        reason: RXE_NO_RECV_FLUSH_IN_ERR,
        expect: EXP_NO_FLUSH_1,
    },
    KnownFailure {
        case: "qp_state::destroy_discards_work",
        reason: RXE_NO_RECV_FLUSH_IN_ERR,
        expect: EXP_NO_FLUSH_1,
    },
    KnownFailure {
        case: "cq::channel_event_names_cq",
        reason: RXE_NO_RECV_FLUSH_IN_ERR,
        expect: EXP_NO_EVENT,
    },
    KnownFailure {
        case: "cq::channel_solicited_arm_fires_on_error",
        reason: RXE_NO_RECV_FLUSH_IN_ERR,
        expect: EXP_NO_EVENT,
    },
    KnownFailure {
        case: "posting::err_with_srq_raises_last_wqe_reached",
        reason: RXE_NO_LAST_WQE,
        expect: EXP_NO_LAST_WQE,
    },
    KnownFailure {
        case: "errors::srq_qp_error_raises_last_wqe_reached",
        reason: RXE_NO_LAST_WQE,
        expect: EXP_NO_LAST_WQE,
    },
    KnownFailure {
        case: "errors::send_bad_lkey",
        reason: "rxe completes a send WR with an invalid lkey with LOC_QP_OP_ERR; the contract \
                 says LOC_PROT_ERR (DIVERGENCES.md #4)",
        expect: "LocQpOpErr != LocProtErr",
    },
    KnownFailure {
        case: "errors::recv_bad_lkey",
        reason: "rxe's responder NAKs a SEND landing in a receive WR with an invalid lkey and \
                 completes that WR with LOC_QP_OP_ERR; the contract says LOC_PROT_ERR \
                 (DIVERGENCES.md #4)",
        expect: "LocQpOpErr != LocProtErr",
    },
    KnownFailure {
        case: "send_recv::recv_buffer_too_small",
        reason: "for a SEND larger than the receive buffers, rxe's requester completes with \
                 REM_OP_ERR (NAK 0x63), not REM_INV_REQ_ERR (NAK 0x61) as the contract and \
                 rc-transport.md §4.3 say",
        expect: "RemOpErr != RemInvReqErr",
    },
    KnownFailure {
        case: "mw::send_with_invalidate_revokes",
        reason: "rxe (Linux 6.1) completes the receive of a SEND_WITH_INV with wc_flags GRH | \
                 IP_CSUM_OK and without IBV_WC_WITH_INV: bit 2 is the kernel's \
                 IB_WC_WITH_INVALIDATE, which reaches user space as IBV_WC_IP_CSUM_OK \
                 (DIVERGENCES.md #36)",
        expect: "IBV_WC_WITH_INV in",
    },
    KnownFailure {
        case: "mw::write_past_window_refused",
        reason: RXE_MW_RANGE,
        expect: "status of wr_id 77: Success != RemAccessErr",
    },
    KnownFailure {
        case: "mw::write_before_window_refused",
        reason: RXE_MW_RANGE,
        expect: "status of wr_id 77: Success != RemAccessErr",
    },
    KnownFailure {
        case: "ud::ud_too_long_loc_len_err",
        reason: RXE_UD_LEN_ERR,
        expect: EXP_UD_LEN,
    },
    KnownFailure {
        case: "ud::ud_recv_without_room_for_grh",
        reason: RXE_UD_LEN_ERR,
        expect: EXP_UD_LEN,
    },
    KnownFailure {
        case: "ud::ud_controlled_qkey_uses_qp_qkey",
        reason: "rxe sends a UD WR's Q_Key as it is, also with the high bit set (a controlled \
                 Q_Key, which IBTA C10-15 replaces by the QP's Q_Key), so the receiver drops the \
                 datagram (DIVERGENCES.md #24)",
        expect: "expected 1 completions, got 0",
    },
];

/// rxe checks a window access against the window's MR, not the window's own range.
const RXE_MW_RANGE: &str = "rxe accepts an access through a memory window outside the window \
                            but inside its MR (check_rkey checks the MR's range only); the \
                            window's range bounds it (DIVERGENCES.md #33)";

/// rxe's UD responder completes a receive WR too small for the datagram (or for its GRH) with
/// LOC_QP_OP_ERR; `ibv_poll_cq(3)` and ConnectX say LOC_LEN_ERR.
const RXE_UD_LEN_ERR: &str = "rxe completes a UD receive WR too small for the datagram (or its \
                              GRH) with LOC_QP_OP_ERR; the contract says LOC_LEN_ERR \
                              (DIVERGENCES.md #18)";

/// rxe accepts a `modify` with a value the contract rejects (the kernel masks it, or rxe does
/// not check the device limit); seen only in raw mode.
const RAW_ACCEPTS: &str = "rxe accepts the out-of-range value (the kernel masks it or does not \
                           check the device limit); the contract says InvalidArgument \
                           (DIVERGENCES.md #15, #26)";
const EXP_ACCEPTED: &str = "but it succeeded";
/// rxe's answer to a post in a state that does not allow it: `EINVAL` from the provider.
const RAW_POST_EINVAL: &str = "rxe's provider fails a post in a state that does not allow it \
                               with EINVAL (InvalidArgument); the contract says InvalidState \
                               (DIVERGENCES.md #27)";

/// Raw mode (`SOFTVERBS_HW_RAW=1`): the cases that fail only because `verbs-hw`'s contract
/// checks are off, each a deviation of libibverbs/rxe from the contract that the checked mode
/// hides. An entry here replaces the `KNOWN` entry of the same case in raw mode.
const RAW_KNOWN: &[KnownFailure] = &[
    KnownFailure {
        case: "cq::req_notify_without_channel",
        reason: "rxe arms a CQ that has no completion channel and notifies nobody; the \
                 contract says InvalidState (DIVERGENCES.md #25)",
        expect: EXP_ACCEPTED,
    },
    KnownFailure {
        case: "posting::post_send_in_reset_invalid_state",
        reason: RAW_POST_EINVAL,
        expect: "got index 0 with InvalidArgument",
    },
    KnownFailure {
        case: "posting::post_send_in_init_invalid_state",
        reason: RAW_POST_EINVAL,
        expect: "got index 0 with InvalidArgument",
    },
    KnownFailure {
        case: "posting::post_send_in_rtr_invalid_state",
        reason: RAW_POST_EINVAL,
        expect: "got index 0 with InvalidArgument",
    },
    KnownFailure {
        case: "posting::post_recv_in_reset_invalid_state",
        reason: RAW_POST_EINVAL,
        expect: "got index 0 with InvalidArgument",
    },
    KnownFailure {
        case: "ud::ud_post_send_in_init_invalid",
        reason: RAW_POST_EINVAL,
        expect: "invalid argument: ibv_post_send",
    },
    KnownFailure {
        case: "ud::ud_post_recv_in_reset_invalid",
        reason: RAW_POST_EINVAL,
        expect: "invalid argument: ibv_post_recv",
    },
    KnownFailure {
        case: "qp_state::retry_cnt_out_of_range",
        reason: RAW_ACCEPTS,
        expect: EXP_ACCEPTED,
    },
    KnownFailure {
        case: "qp_state::rnr_retry_out_of_range",
        reason: RAW_ACCEPTS,
        expect: EXP_ACCEPTED,
    },
    KnownFailure {
        case: "qp_state::min_rnr_timer_out_of_range",
        reason: RAW_ACCEPTS,
        expect: EXP_ACCEPTED,
    },
    KnownFailure {
        case: "qp_state::psn_out_of_range",
        reason: RAW_ACCEPTS,
        expect: EXP_ACCEPTED,
    },
    KnownFailure {
        case: "qp_state::dest_qpn_out_of_range",
        reason: RAW_ACCEPTS,
        expect: EXP_ACCEPTED,
    },
    KnownFailure {
        case: "qp_state::max_dest_rd_atomic_above_device_max",
        reason: RAW_ACCEPTS,
        expect: EXP_ACCEPTED,
    },
    KnownFailure {
        case: "qp_state::pkey_index_out_of_range",
        reason: RAW_ACCEPTS,
        expect: EXP_ACCEPTED,
    },
];

/// The known failures of this run: `KNOWN`, and in raw mode `RAW_KNOWN` on top (replacing the
/// entries of the same cases).
fn known() -> &'static [KnownFailure] {
    static RAW: OnceLock<Vec<KnownFailure>> = OnceLock::new();
    if !raw_mode() {
        return KNOWN;
    }
    RAW.get_or_init(|| {
        let mut all: Vec<KnownFailure> = KNOWN
            .iter()
            .filter(|k| RAW_KNOWN.iter().all(|r| r.case != k.case))
            .copied()
            .collect();
        all.extend_from_slice(RAW_KNOWN);
        all
    })
}

conformance_suite!(env = hw_env, known_failures = known());

/// Not a conformance case: one line (`SUMMARY hw: …`, on stderr past libtest's capture) that
/// says whether this binary's cases ran, in which mode, so that a run on a machine without
/// libibverbs or without a device, where libtest shows every skipped case as `ok`, reads as
/// "0 executed, all skipped" and not as a pass.
#[test]
fn summary() {
    let n = CASE_NAMES.len();
    let line = match hw_env() {
        Ok(env) => format!(
            "SUMMARY hw: {} device(s), {} mode: the {n} cases run (SKIP/XFAIL lines name the \
             exceptions)",
            env.device_count(),
            if raw_mode() { "raw" } else { "checked" }
        ),
        Err(e) => format!(
            "SUMMARY hw: 0 of {n} cases executed, {n} skipped: {}",
            e.detail
        ),
    };
    let _ = writeln!(std::io::stderr().lock(), "\n{line}");
}
