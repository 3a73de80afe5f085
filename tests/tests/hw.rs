//! The conformance suite against the real-hardware backend (`verbs-hw`): the RDMA devices
//! libibverbs lists (run it against Linux SoftRoCE with `scripts/rxe-conformance.sh`). With one
//! device (rxe0), the suite's peer context is a second context on the same device.
//!
//! On a machine without libibverbs, or whose libibverbs lists no device, every case is skipped
//! with the reason ("libibverbs not available: …", "no RDMA device: …").
//! `SOFTVERBS_DEVICE` restricts the run to one device by name.

use verbs_api::{Device, Error, Provider};
use verbs_conformance::{Env, KnownFailure, conformance_suite};
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

fn hw_env() -> verbs_api::Result<Env<HwContext>> {
    let provider = HwProvider::new()
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

/// Cases that fail against rxe because rxe deviates from the contract (each is listed in the
/// differential report of `scripts/rxe-conformance.sh`; none is a bug of this backend).
const KNOWN: &[KnownFailure] = &[
    KnownFailure {
        case: "posting::post_recv_in_err_flushes",
        reason: RXE_NO_RECV_FLUSH_IN_ERR,
    },
    KnownFailure {
        case: "posting::post_recv_in_reset_invalid_state",
        reason: RXE_NO_RECV_FLUSH_IN_ERR,
    },
    KnownFailure {
        case: "qp_state::reset_clears_queues",
        reason: RXE_NO_RECV_FLUSH_IN_ERR,
    },
    KnownFailure {
        case: "qp_state::destroy_discards_work",
        reason: RXE_NO_RECV_FLUSH_IN_ERR,
    },
    KnownFailure {
        case: "cq::channel_event_names_cq",
        reason: RXE_NO_RECV_FLUSH_IN_ERR,
    },
    KnownFailure {
        case: "cq::channel_solicited_arm_fires_on_error",
        reason: RXE_NO_RECV_FLUSH_IN_ERR,
    },
    KnownFailure {
        case: "posting::err_with_srq_raises_last_wqe_reached",
        reason: RXE_NO_LAST_WQE,
    },
    KnownFailure {
        case: "errors::srq_qp_error_raises_last_wqe_reached",
        reason: RXE_NO_LAST_WQE,
    },
    KnownFailure {
        case: "errors::send_bad_lkey",
        reason: "rxe completes a send WR with an invalid lkey with LOC_QP_OP_ERR; the contract \
                 says LOC_PROT_ERR (DIVERGENCES.md #4)",
    },
    KnownFailure {
        case: "errors::recv_bad_lkey",
        reason: "rxe's responder NAKs a SEND landing in a receive WR with an invalid lkey and \
                 completes that WR with LOC_QP_OP_ERR; the contract says LOC_PROT_ERR \
                 (DIVERGENCES.md #4)",
    },
    KnownFailure {
        case: "send_recv::recv_buffer_too_small",
        reason: "for a SEND larger than the receive buffers, rxe's requester completes with \
                 REM_OP_ERR (NAK 0x63), not REM_INV_REQ_ERR (NAK 0x61) as the contract and \
                 rc-transport.md §4.3 say",
    },
    KnownFailure {
        case: "mw::write_past_window_refused",
        reason: RXE_MW_RANGE,
    },
    KnownFailure {
        case: "mw::write_before_window_refused",
        reason: RXE_MW_RANGE,
    },
    KnownFailure {
        case: "ud::ud_too_long_loc_len_err",
        reason: RXE_UD_LEN_ERR,
    },
    KnownFailure {
        case: "ud::ud_recv_without_room_for_grh",
        reason: RXE_UD_LEN_ERR,
    },
    KnownFailure {
        case: "ud::ud_controlled_qkey_uses_qp_qkey",
        reason: "rxe sends a UD WR's Q_Key as it is, also with the high bit set (a controlled \
                 Q_Key, which IBTA C10-15 replaces by the QP's Q_Key), so the receiver drops the \
                 datagram (DIVERGENCES.md #24)",
    },
];

/// rxe checks a window access against the window's MR, not the window's own range.
const RXE_MW_RANGE: &str = "rxe accepts an access through a memory window outside the window                             but inside its MR (check_rkey checks the MR's range only); the                             window's range bounds it (DIVERGENCES.md #30)";

/// rxe's UD responder completes a receive WR too small for the datagram (or for its GRH) with
/// LOC_QP_OP_ERR; `ibv_poll_cq(3)` and ConnectX say LOC_LEN_ERR.
const RXE_UD_LEN_ERR: &str = "rxe completes a UD receive WR too small for the datagram (or its \
                              GRH) with LOC_QP_OP_ERR; the contract says LOC_LEN_ERR \
                              (DIVERGENCES.md #18)";

conformance_suite!(env = hw_env, known_failures = KNOWN);
