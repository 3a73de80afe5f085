//! `verbs-hw`: the real-hardware backend of softverbs — the [`verbs_api`] traits over
//! rdma-core's libibverbs, for RDMA NICs and Linux SoftRoCE (`rxe`).
//!
//! `libibverbs.so.1` is loaded at run time (`dlopen`), never linked, so softverbs builds, tests
//! and runs on machines without rdma-core: [`HwProvider::new`] then fails with
//! [`verbs_api::ErrorKind::NotFound`] naming the library, and nothing else happens. Only public
//! symbols of the `IBVERBS_1.x` version nodes are resolved (with `dlvsym`, at the version that
//! defines their current ABI); the header-inline data-path verbs (`ibv_post_send`,
//! `ibv_post_recv`, `ibv_post_srq_recv`, `ibv_poll_cq`, `ibv_req_notify_cq`) are dispatched
//! through the context's `ibv_context_ops` table exactly as `infiniband/verbs.h` does.
//!
//! The backend is registered as `"hw"` in the `softverbs` registry, so the same binary runs on
//! the emulator or on hardware depending on `SOFTVERBS_PROVIDER`.
//!
//! ```no_run
//! use verbs_api::{Context, Device, ProtectionDomain, Provider};
//!
//! let provider = verbs_hw::HwProvider::new()?; // NotFound without rdma-core
//! for dev in provider.devices()? {
//!     let ctx = dev.open()?;
//!     let pd = ctx.alloc_pd()?;
//!     println!("{}: {:?}", dev.name(), ctx.query_port(1)?.state);
//!     pd.destroy()?;
//! }
//! # Ok::<(), verbs_api::Error>(())
//! ```
//!
//! # Where the wrapper enforces the `verbs_api` contract
//!
//! libibverbs (and rxe behind it) differs from the trait contract in a few places; the wrapper
//! checks these before calling into the library, so applications see the emulator's
//! behaviour. Two kinds of checks:
//!
//! **Contract checks**, made only to make libibverbs and rxe look like the contract; raw mode
//! ([`HwProvider::raw`]) turns them off, so the call reaches libibverbs and the caller sees the
//! library's and the device's own answer (the differential run measures rxe both ways):
//! * `req_notify` on a CQ without a completion channel is `InvalidState` (rxe accepts it and
//!   notifies nobody);
//! * `modify` with `retry_cnt`/`rnr_retry` above 7, `timeout`/`min_rnr_timer` above 31, PSNs or
//!   `dest_qp_num` above 24 bits is `InvalidArgument` (the kernel masks them; rxe rejects only
//!   the `timeout`), an address vector
//!   with a UDP port other than 4791 is `InvalidArgument`, an undefined mask bit `NotSupported`;
//! * `modify` with `max_dest_rd_atomic` above `max_qp_rd_atom` (or `max_rd_atomic` above
//!   `max_qp_init_rd_atom`) or a `pkey_index` at or above the port's `pkey_tbl_len` is
//!   `InvalidArgument` (rxe accepts the first and the last);
//! * `post_send` in RESET, INIT or RTR is `InvalidState` (rxe queues the WRs and fails only the
//!   doorbell, so they would run later); `post_recv` in RESET is `InvalidState`;
//! * port numbers (`query_port`, `query_pkey`, `query_gid`, `create_ah`) and GID indexes
//!   outside the port's tables are `InvalidArgument`, as is an AH with a UDP port other than
//!   4791.
//!
//! **Safety checks**, made in raw mode too, because without them the wrapper would hand
//! libibverbs a freed, foreign or missing object, or block forever; raw mode is never
//! undefined behaviour:
//! * handles used after `destroy` fail with `Destroyed`; handles of another context are
//!   `InvalidArgument` (libibverbs would send the kernel a handle number of the wrong file);
//! * destroying a PD, CQ, SRQ, AH or channel that another object uses is `Busy` (the kernel
//!   agrees, but the wrapper must not free what a live object points to);
//! * destroying a CQ with unacknowledged events is `Busy` (libibverbs would block forever);
//! * a UD send WR without an AH is `InvalidArgument` (the provider would read a null
//!   `ibv_ah`); `post_recv` on a QP with an SRQ is `InvalidState` (the QP has no receive queue
//!   of its own, and libibverbs does not promise that every provider checks that);
//! * MR lengths: zero or above `max_mr_size` is `InvalidArgument` (the wrapper allocates or
//!   maps the memory itself), and counts that do not fit the C types are `InvalidArgument`.
//!
//! In both modes `max_inline_data` (absent from `ibv_device_attr`) is found once per device by
//! probing QP creation.
//!
//! Everything else (masks of state transitions, queue limits, access flags, completion
//! statuses) is libibverbs' and the device's own answer, mapped from its errno.
//!
//! All `unsafe` code is in the private `ffi` module (bindings, loader, MR memory, safe owners
//! of the C objects), plus the one `unsafe fn` the trait [`verbs_api::Context::reg_mr_raw`]
//! declares.
#![deny(unsafe_code)]

mod convert;
#[allow(unsafe_code)]
mod ffi;
mod provider;

pub use provider::{HwChannel, HwContext, HwCq, HwDevice, HwMr, HwPd, HwProvider, HwQp, HwSrq};

/// The shared library the backend loads: `libibverbs.so.1`.
pub const LIBRARY: &str = ffi::loader::LIBRARY;

/// Environment variable that the conformance suite's hardware test (and tools that choose to)
/// read: `1` selects raw mode ([`HwProvider::raw`]).
pub const RAW_ENV: &str = "SOFTVERBS_HW_RAW";
