//! `verbs-conformance`: the softverbs conformance suite, written once and run against every
//! verbs backend.
//!
//! The cases check what rdma-core and Linux SoftRoCE (rxe) do, as distilled in
//! `conformance-checklist.md` (items 1–4: device queries, PD/MR, CQ and completion channels,
//! QP creation, state machine and posting; items 5–6: data operations between two connected
//! QPs and their error semantics) and `rc-transport.md` §3–§7, and the contract of the
//! [`verbs_api`] traits. Where the emulator differs from rxe, the emulator is wrong, except
//! where `DIVERGENCES.md` records a deliberate choice of the spec over rxe.
//!
//! * [`cases`]: the case bodies, `pub fn name<C: Context>(env: &Env<C>) -> Outcome`, grouped by
//!   checklist item. No backend type is named.
//! * [`fixture`]: [`Env`] (the backend's devices), [`Fixture`] (contexts, PD, QP helpers, a
//!   connected pair via [`verbs_api::connect_rc`]), [`Pair`] (two connected QPs with PD, CQs
//!   and MR on each side, options per case via [`PairConfig`]) and bounded-wait helpers.
//! * [`check`]: [`Outcome`] and the assertion macros.
//! * [`conformance_suite!`]: expands one `#[test]` per case for a backend, so `cargo test`
//!   lists every case by name (`device::query_port_zero_invalid`, …).
//!
//! A backend instantiates the suite in a test file:
//!
//! ```text
//! fn env() -> verbs_api::Result<verbs_conformance::Env<MyContext>> {
//!     verbs_conformance::Env::from_provider(&MyProvider::new()?)
//! }
//! const KNOWN: &[verbs_conformance::KnownFailure] = &[];
//! verbs_conformance::conformance_suite!(env = env, known_failures = KNOWN);
//! ```
//!
//! Outcomes: a passing case passes; a failing case panics with the failed expectation and its
//! source line. A case that needs a feature the backend lacks (it answered `NotSupported`) is
//! skipped and says so on stderr (`SKIP name: reason`, printed past the test harness's output
//! capture); with `SOFTVERBS_CONFORMANCE_STRICT=1` a skip fails. An instantiation whose `env`
//! function fails with `NotSupported` (the backend is absent on this machine) skips every case
//! the same way, and the first such skip prints [`ABSENT_BANNER`] (libtest still counts these
//! cases as `ok`: scripts count the `SKIP` lines, see `scripts/rxe-conformance.sh`). A case listed in the instantiation's known failures prints
//! `XFAIL name: reason` when it fails with the failure the entry expects
//! ([`KnownFailure::expect`]), fails with `XFAIL mismatch` when it fails any other way, and fails
//! when it passes (`XPASS`), so the list shrinks as the backend is fixed and a known case cannot
//! hide a new failure.
#![deny(unsafe_code)]

pub mod cases;
pub mod check;
pub mod fixture;

use std::io::Write;

pub use check::{Outcome, Stop};
pub use fixture::{Env, Fixture, Pair, PairConfig, Side, TestQp};
pub use verbs_api;
use verbs_api::Context;

/// Environment variable: when set to `1`, skipped cases fail.
pub const STRICT_ENV: &str = "SOFTVERBS_CONFORMANCE_STRICT";

/// A case a backend is known to fail, with the reason (a bug to fix, named in the report) and
/// the failure it is expected to show.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct KnownFailure {
    /// The case, as `group::name` (e.g. `"posting::post_recv_on_srq_qp_rejected"`).
    pub case: &'static str,
    /// Why it fails on this backend.
    pub reason: &'static str,
    /// The expected failure: a non-empty substring of the case's failure message (for example
    /// the completion status the backend is known to give, `"LOC_QP_OP_ERR"`). A failure whose
    /// message does not contain it is an `XFAIL mismatch` and fails the case.
    pub expect: &'static str,
}

impl KnownFailure {
    /// Whether `msg`, the case's failure message, is the failure this entry expects (never for
    /// an empty [`KnownFailure::expect`]).
    pub fn matches(&self, msg: &str) -> bool {
        !self.expect.is_empty() && msg.contains(self.expect)
    }
}

/// Every case of the suite, as `group::name`, in the order of [`conformance_suite!`].
pub const CASE_NAMES: &[&str] = __conformance_cases!(__conformance_names!());

/// Lists the cases' names; used by [`CASE_NAMES`].
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_names {
    (() $($group:ident { $($case:ident),* $(,)? })*) => {
        &[$($(concat!(stringify!($group), "::", stringify!($case)),)*)*]
    };
}

/// The first line a test binary whose backend is absent prints, once: its cases are skipped,
/// and libtest's `ok` for them is not a pass.
pub const ABSENT_BANNER: &str = "SKIPPED (backend absent): no case of this test binary runs; \
                                 libtest reports each as `ok`, but every one is a SKIP, not a \
                                 pass";

/// Writes a line to the process's stderr directly, bypassing the test harness's capture, so
/// skips and expected failures stay visible in a normal `cargo test` run.
fn report(line: &str) {
    let stderr = std::io::stderr();
    let mut lock = stderr.lock();
    // Leading newline: libtest may have printed "test name ... " without its end of line.
    let _ = writeln!(lock, "\n{line}");
}

/// Runs one case on a fresh [`Env`] and turns its outcome into a test result: panics on
/// failure (or on an unexpected pass of a known failure), reports skips.
pub fn run_case<C: Context>(
    name: &str,
    make_env: fn() -> verbs_api::Result<Env<C>>,
    case: fn(&Env<C>) -> Outcome,
    known_failures: &[KnownFailure],
) {
    let env = match make_env() {
        Ok(env) => env,
        // The backend is absent on this machine (e.g. no libibverbs or no RDMA device for the
        // hardware backend): every case is a skip, reported like one.
        Err(e) if e.kind == verbs_api::ErrorKind::NotSupported => {
            static BANNER: std::sync::Once = std::sync::Once::new();
            BANNER.call_once(|| report(&format!("{ABSENT_BANNER} ({})", e.detail)));
            report(&format!("SKIP {name}: {}", e.detail));
            if std::env::var(STRICT_ENV).is_ok_and(|v| v.trim() == "1") {
                panic!("{name} skipped and {STRICT_ENV}=1: {}", e.detail);
            }
            return;
        }
        Err(e) => panic!("{name}: setting up the backend failed: {e}"),
    };
    let known = known_failures.iter().find(|k| k.case == name);
    match (case(&env), known) {
        (Ok(()), None) => {}
        (Ok(()), Some(k)) => panic!(
            "XPASS {name}: listed as a known failure ({}) but passed on {}; remove it from \
             the list",
            k.reason,
            env.provider_name()
        ),
        (Err(Stop::Fail(msg)), Some(k)) if k.matches(&msg) => {
            report(&format!("XFAIL {name}: {} [{msg}]", k.reason));
        }
        (Err(Stop::Fail(msg)), Some(k)) => panic!(
            "XFAIL mismatch {name} on {}: a known failure ({}) expected to fail with {:?}, but \
             it failed with: {msg}",
            env.provider_name(),
            k.reason,
            k.expect
        ),
        (Err(Stop::Fail(msg)), None) => panic!("{name} on {}: {msg}", env.provider_name()),
        (Err(Stop::Skip(reason)), _) => {
            report(&format!("SKIP {name}: {reason}"));
            if std::env::var(STRICT_ENV).is_ok_and(|v| v.trim() == "1") {
                panic!("{name} skipped and {STRICT_ENV}=1: {reason}");
            }
        }
    }
}

/// Expands one `#[test]` per conformance case for a backend.
///
/// `env` is the path of a `fn() -> verbs_api::Result<Env<C>>` building a fresh environment
/// (called once per case), `known_failures` an expression of type `&[KnownFailure]`. Both are
/// resolved from the invoking module. Tests are grouped in modules named after the case
/// groups of [`cases`].
#[macro_export]
macro_rules! conformance_suite {
    (env = $env:path, known_failures = $known:expr $(,)?) => {
        $crate::__conformance_cases!(__conformance_emit!($env, $known));
    };
}

/// Emits the test modules; used by [`conformance_suite!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_emit {
    (($env:path, $known:expr) $($group:ident { $($case:ident),* $(,)? })*) => {
        $(
            mod $group {
                #[allow(unused_imports)]
                use super::*;
                $(
                    #[test]
                    fn $case() {
                        $crate::run_case(
                            concat!(stringify!($group), "::", stringify!($case)),
                            $env,
                            $crate::cases::$group::$case,
                            $known,
                        );
                    }
                )*
            }
        )*
    };
}

/// The list of every case, by group; calls back `$callback!(($args) group { case, … } …)`.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    ($callback:ident ! ($($args:tt)*)) => {
        $crate::$callback! { ($($args)*)
            device {
                list_nonempty,
                names_unique,
                open_twice,
                query_device_limits_sane,
                query_device_guid_matches_list,
                query_port_active_ethernet,
                query_port_zero_invalid,
                query_port_beyond_count_invalid,
                query_gid_index_zero,
                query_gid_empty_entries_read_zero,
                query_gid_beyond_table_invalid,
                query_gid_bad_port_invalid,
                query_pkey_index_zero_default,
                query_pkey_beyond_table_invalid,
                endpoint_matches_port_gid,
            }
            pd_mr {
                pd_alloc_destroy,
                pd_double_destroy,
                pd_many,
                pd_destroy_with_mr_busy,
                pd_destroy_with_qp_busy,
                pd_destroy_with_srq_busy,
                mr_register_deregister,
                mr_keys_differ,
                mr_rkeys_not_sequential,
                mr_remote_write_needs_local_write,
                mr_remote_atomic_needs_local_write,
                mr_remote_read_alone_ok,
                mr_no_access_ok,
                mr_unknown_access_bits_invalid,
                mr_zero_length_invalid,
                mr_above_max_size_invalid,
                mr_read_write_round_trip,
                mr_read_write_out_of_range,
                mr_sge_bounds,
                mr_file_backed,
                mr_raw_caller_buffer,
                mr_use_after_destroy,
                mr_destroyed_pd_rejected,
                foreign_pd_rejected,
            }
            cq {
                create_min_size,
                create_max_size,
                create_zero_invalid,
                create_above_max_invalid,
                resize_up_and_down,
                resize_bounds_invalid,
                resize_below_held_invalid,
                poll_empty,
                destroy_in_use_busy,
                use_after_destroy,
                req_notify_without_channel,
                foreign_channel_invalid,
                channel_idle_not_readable,
                channel_event_fd_readable,
                channel_arming_one_shot,
                channel_solicited_arm_fires_on_error,
                channel_event_names_cq,
                channel_wait_cq_event,
                destroy_with_unacked_events_busy,
                destroy_with_unread_event_succeeds,
                channel_destroy_busy_while_cq_uses_it,
                overflow_raises_cq_err,
            }
            qp_state {
                create_rc_caps_reported,
                create_send_wr_above_limit_invalid,
                create_recv_wr_above_limit_invalid,
                create_send_sge_above_limit_invalid,
                create_recv_sge_above_limit_invalid,
                create_inline_above_limit_invalid,
                create_uc_in_reset,
                create_ud_supported_or_not,
                qp_numbers_unique_24bit,
                create_foreign_objects_invalid,
                create_destroyed_cq_rejected,
                walk_reset_init_rtr_rts,
                reset_to_reset,
                init_to_init_optional,
                rts_to_rts_optional,
                rts_sqd_rts,
                sqd_to_sqd_optional,
                any_to_reset,
                any_to_err,
                modify_without_state_bit,
                reset_to_init_missing_each_required,
                init_to_rtr_missing_each_required,
                rtr_to_rts_missing_each_required,
                reset_to_init_extra_bits_invalid,
                init_to_rtr_extra_bits_invalid,
                rtr_to_rts_extra_bits_invalid,
                rts_to_sqd_extra_bits_invalid,
                to_reset_and_err_extra_bits_invalid,
                illegal_from_reset,
                illegal_from_init,
                illegal_from_rtr,
                illegal_from_rts,
                illegal_from_sqd,
                illegal_from_err,
                unknown_mask_bit_not_supported,
                timeout_out_of_range,
                retry_cnt_out_of_range,
                rnr_retry_out_of_range,
                min_rnr_timer_out_of_range,
                psn_out_of_range,
                dest_qpn_out_of_range,
                path_mtu_bounded_by_max_mtu,
                port_out_of_range,
                pkey_index_out_of_range,
                max_rd_atomic_above_device_max,
                max_dest_rd_atomic_above_device_max,
                cur_state_mismatch_invalid,
                query_after_connect,
                reset_clears_queues,
                sqd_async_notify_raises_sq_drained,
                async_event_scoped_to_context,
                destroyed_qp_calls_fail,
                destroy_discards_work,
            }
            posting {
                post_send_in_reset_invalid_state,
                post_send_in_init_invalid_state,
                post_send_in_rtr_invalid_state,
                post_recv_in_reset_invalid_state,
                post_recv_in_init_and_rtr_allowed,
                post_send_in_sqd_queued,
                post_send_in_err_flushes,
                post_recv_in_err_flushes,
                err_flushes_queued_recvs_in_order,
                err_flushes_queued_sends_in_order,
                send_queue_full_nomem,
                recv_queue_full_nomem,
                send_too_many_sges_invalid,
                recv_too_many_sges_invalid,
                inline_above_max_invalid,
                atomic_short_sge_invalid,
                atomic_misaligned_invalid,
                post_recv_on_srq_qp_rejected,
                srq_create_limits,
                srq_post_and_full,
                srq_too_many_sges_invalid,
                srq_destroy_busy_while_qp_uses_it,
                srq_use_after_destroy,
                err_with_srq_raises_last_wqe_reached,
            }
            send_recv {
                send_small,
                send_multi_packet,
                send_mtu_boundaries,
                send_zero_length,
                send_with_imm,
                send_with_imm_zero_length,
                send_gather_scatter_three_sges,
                send_zero_length_sge_skipped,
                send_inline_copied_at_post,
                send_solicited_fires_solicited_arm,
                unsignaled_send_no_completion,
                sq_sig_all_signals_every_wr,
                recv_completions_in_posting_order,
                recv_wc_qp_numbers,
                recv_byte_len_is_bytes_placed,
                recv_buffer_too_small,
                srq_two_qps_share_receives,
                srq_write_with_imm_consumes_srq_recv,
                srq_limit_event,
            }
            rdma {
                write_small,
                write_large_1mib,
                write_zero_length,
                write_gather_three_sges,
                write_inline_copied_at_post,
                write_with_imm,
                write_with_imm_zero_length,
                write_imm_solicited_fires_solicited_arm,
                write_with_imm_waits_for_recv,
                read_small,
                read_multi_packet,
                read_scatter_three_sges,
                read_zero_length,
                reads_beyond_max_rd_atomic_wait,
                zero_length_rdma_rkey_unchecked,
                write_mr_edges,
                read_mr_edges,
                mixed_ops_complete_in_order,
            }
            atomic {
                fetch_add,
                cmp_swap_success,
                cmp_swap_failure,
                fetch_add_two_qps_sum,
                mr_without_remote_atomic,
                qp_without_remote_atomic,
                invalid_rkey,
                invalid_lkey,
            }
            errors {
                write_invalid_rkey,
                read_invalid_rkey,
                write_rkey_of_other_pd,
                write_deregistered_mr,
                write_mr_without_remote_write,
                read_mr_without_remote_read,
                write_qp_without_remote_write,
                read_qp_without_remote_read,
                send_bad_lkey,
                read_into_bad_lkey,
                read_into_mr_without_local_write,
                recv_bad_lkey,
                error_after_success_in_order,
                srq_qp_error_raises_last_wqe_reached,
                unsignaled_error_completes,
                no_wr_succeeds_after_error,
                rnr_retry_exceeded,
                rnr_retry_infinite_then_recv,
                retry_exceeded_peer_gone,
            }
            uc {
                uc_init_mask,
                uc_rtr_with_rc_attributes_invalid,
                uc_rtr_missing_each_required,
                uc_rts_with_retry_attributes_invalid,
                uc_err_flushes_and_resets,
                uc_post_rdma_read_rejected,
                uc_post_atomic_rejected,
                uc_send_small,
                uc_send_segmented_at_path_mtu,
                uc_write_and_write_with_imm_land,
                uc_no_recv_wqe_drops,
                uc_write_without_remote_write_dropped,
                uc_requester_completes_without_a_peer,
                uc_many_messages_in_order,
            }
            mw {
                device_reports_windows,
                alloc_dealloc_both_types,
                type2_bind_then_write,
                type2_read_through_window,
                rights_narrower_than_mr,
                window_grants_what_the_mr_does_not,
                write_past_window_refused,
                write_before_window_refused,
                bind_beyond_mr_is_bind_error,
                bind_without_mw_bind_access_is_bind_error,
                local_invalidate_revokes,
                send_with_invalidate_revokes,
                send_with_invalidate_bad_key,
                rebind_changes_rkey,
                dealloc_while_bound_revokes,
                mr_dereg_while_bound_refused,
                zero_based_window,
                type1_bind_changes_rkey,
                type1_zero_length_unbinds,
                type1_bind_refuses_type2,
                type1_local_invalidate_fails,
            }
            ud {
                ud_create_in_reset,
                ud_init_with_rc_mask_invalid,
                ud_init_without_qkey_invalid,
                ud_init_sets_qkey,
                ud_rtr_needs_no_attributes,
                ud_rtr_with_path_attributes_invalid,
                ud_rts_needs_sq_psn,
                ud_rts_with_retry_attributes_invalid,
                ud_rts_query,
                ud_rts_changes_qkey,
                ud_reset_to_rtr_illegal,
                ud_err_flushes_and_resets,
                ud_post_recv_in_reset_invalid,
                ud_post_send_in_init_invalid,
                ud_post_rdma_write_rejected,
                ud_post_rdma_read_rejected,
                ud_post_atomic_rejected,
                ud_post_without_ah_rejected,
                ud_send_above_mtu_not_emitted,
                ud_send_exactly_mtu,
                ud_post_destroyed_ah_rejected,
                ah_create_destroy,
                pd_destroy_with_ah_busy,
                ah_drop_releases_pd,
                ah_bad_port_invalid,
                ah_sgid_index_beyond_table_fails,
                ah_foreign_pd_rejected,
                ah_destroyed_pd_rejected,
                ud_send_small,
                ud_send_with_imm,
                ud_send_zero_length,
                ud_grh_addresses,
                ud_reply_via_ah_from_wc,
                ud_no_recv_wqe_drops,
                ud_wrong_qkey_drops,
                ud_controlled_qkey_uses_qp_qkey,
                ud_receiver_qkey_change_applies,
                ud_too_long_loc_len_err,
                ud_recv_without_room_for_grh,
                ud_grh_in_its_own_sge,
                ud_many_datagrams_in_order,
                ud_unsignaled_send,
                ud_src_qp_distinguishes_senders,
                ud_send_inline,
                ud_receive_through_srq,
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use emu_sim::{SimContext, SimProvider};

    use super::*;

    fn env() -> verbs_api::Result<Env<SimContext>> {
        Env::from_provider(&SimProvider::builder().devices(1).build()?)
    }

    fn passes(_: &Env<SimContext>) -> Outcome {
        Ok(())
    }

    fn fails(_: &Env<SimContext>) -> Outcome {
        Err(Stop::Fail("broken".into()))
    }

    fn skips(_: &Env<SimContext>) -> Outcome {
        Err(Stop::Skip("no such feature".into()))
    }

    const KNOWN: &[KnownFailure] = &[
        KnownFailure {
            case: "t::known",
            reason: "a known bug",
            expect: "broken",
        },
        KnownFailure {
            case: "t::other",
            reason: "a known bug",
            expect: "LOC_QP_OP_ERR",
        },
        KnownFailure {
            case: "t::unnamed",
            reason: "a known bug without its failure",
            expect: "",
        },
    ];

    #[test]
    fn pass_passes() {
        run_case("t::pass", env, passes, KNOWN);
    }

    #[test]
    #[should_panic(expected = "broken")]
    fn failure_panics() {
        run_case("t::fail", env, fails, KNOWN);
    }

    #[test]
    fn known_failure_is_reported_not_raised() {
        run_case("t::known", env, fails, KNOWN);
    }

    #[test]
    #[should_panic(expected = "XFAIL mismatch t::other")]
    fn known_failure_failing_differently_panics() {
        run_case("t::other", env, fails, KNOWN);
    }

    #[test]
    #[should_panic(expected = "XFAIL mismatch t::unnamed")]
    fn known_failure_without_expectation_panics() {
        run_case("t::unnamed", env, fails, KNOWN);
    }

    #[test]
    #[should_panic(expected = "XPASS")]
    fn known_failure_that_passes_panics() {
        run_case("t::known", env, passes, KNOWN);
    }

    #[test]
    fn skip_is_reported_not_raised() {
        // Only meaningful without STRICT; with it set, the skip must fail instead.
        if std::env::var(STRICT_ENV).is_err() {
            run_case("t::skip", env, skips, KNOWN);
        }
    }

    #[test]
    fn absent_backend_skips() {
        fn absent() -> verbs_api::Result<Env<SimContext>> {
            Err(verbs_api::Error::unsupported("libibverbs not available"))
        }
        // Only meaningful without STRICT; with it set, the skip must fail instead.
        if std::env::var(STRICT_ENV).is_err() {
            run_case("t::absent", absent, fails, KNOWN);
        }
    }

    #[test]
    fn case_names_list_every_case_once() {
        assert!(CASE_NAMES.contains(&"device::list_nonempty"));
        assert!(CASE_NAMES.contains(&"ud::ud_receive_through_srq"));
        let mut sorted = CASE_NAMES.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), CASE_NAMES.len());
    }

    #[test]
    fn needs_turns_not_supported_into_skip() {
        let r: Result<(), verbs_api::Error> = Err(verbs_api::Error::unsupported("UD"));
        assert!(matches!(check::needs(r, "UD QPs"), Err(Stop::Skip(_))));
        let r: Result<(), verbs_api::Error> = Err(verbs_api::Error::invalid("bad"));
        assert!(matches!(check::needs(r, "UD QPs"), Err(Stop::Fail(_))));
    }

    #[test]
    fn failures_name_the_caller_line() {
        fn inner() -> Outcome {
            Err(verbs_api::Error::invalid("x"))?;
            Ok(())
        }
        match inner() {
            Err(Stop::Fail(msg)) => assert!(msg.contains("lib.rs:"), "{msg}"),
            other => panic!("unexpected {other:?}"),
        }
    }
}
