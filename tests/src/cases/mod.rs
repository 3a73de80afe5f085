//! The conformance cases, one module per group of the checklist (conformance-checklist.md,
//! items 1–6). Every case is `pub fn name<C: Context>(env: &Env<C>) -> Outcome`.
//!
//! Items 1–4 (`device`, `pd_mr`, `cq`, `qp_state`, `posting`) need no traffic; items 5–6
//! (`send_recv`, `rdma`, `atomic`, `errors`) and memory windows (`mw`, issue 23) run between
//! the two QPs of a [`Pair`](crate::Pair) and assert the exact status, opcode, `byte_len`,
//! immediate, flags and data of every completion.
//!
//! Error kinds are asserted exactly where `rc-transport.md` or the `verbs_api` contract names
//! one. Where libibverbs reports the same errno (`EINVAL`) for several kinds and the contract
//! names more than one ("`InvalidArgument`/`InvalidState`"), a case accepts that set and says
//! so.

pub mod atomic;
pub mod cq;
pub mod device;
pub mod errors;
pub mod mw;
pub mod pd_mr;
pub mod posting;
pub mod qp_state;
pub mod rdma;
pub mod send_recv;
pub mod uc;
pub mod ud;
