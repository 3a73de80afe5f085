//! The conformance cases, one module per group of the checklist (conformance-checklist.md,
//! items 1–4). Every case is `pub fn name<C: Context>(env: &Env<C>) -> Outcome`.
//!
//! Error kinds are asserted exactly where `rc-transport.md` or the `verbs_api` contract names
//! one. Where libibverbs reports the same errno (`EINVAL`) for several kinds and the contract
//! names more than one ("`InvalidArgument`/`InvalidState`"), a case accepts that set and says
//! so.

pub mod cq;
pub mod device;
pub mod pd_mr;
pub mod posting;
pub mod qp_state;
