//! Shared receive queues: the HCA's per-SRQ state, which the responder takes receive WQEs
//! from.
//!
//! Bookkeeping only: the HCA validates `create_srq`/`modify_srq`/`post_srq_recv` and raises
//! `SRQ_LIMIT_REACHED`; the responder pops WQEs (`rc::responder`).

use std::collections::VecDeque;

use verbs_api::SrqAttr;

use crate::ids::PdId;
use crate::qp::RecvWqe;

/// An SRQ's HCA state.
#[derive(Clone, Debug)]
pub(crate) struct SrqEntry {
    pub(crate) pd: PdId,
    pub(crate) attr: SrqAttr,
    pub(crate) queue: VecDeque<RecvWqe>,
    /// QPs attached to this SRQ; it cannot be destroyed while any is.
    pub(crate) qp_refs: u32,
}
