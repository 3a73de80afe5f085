//! The numbers that name the HCA's objects (PDs, CQs, SRQs, completion channels) and the
//! metadata of a registered memory region.
//!
//! A leaf module: every other part of the engine (the HCA's tables, QPs, CQs, the RC transport)
//! names objects with these types, and this module depends on none of them. It holds no state
//! and checks nothing; the HCA decides whether a number names a live object.

use verbs_api::AccessFlags;

/// A protection domain's number.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PdId(pub u32);
/// A completion queue's number.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CqId(pub u32);
/// A shared receive queue's number.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SrqId(pub u32);
/// An address handle's number.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AhId(pub u32);
/// A completion channel's number.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChannelId(pub u32);

/// Registered memory: what the HCA knows about an MR.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct MrInfo {
    /// Owning PD.
    pub pd: PdId,
    /// lkey (equal to rkey, as in rxe).
    pub lkey: u32,
    /// rkey.
    pub rkey: u32,
    /// Start virtual address.
    pub iova: u64,
    /// Length in bytes.
    pub length: u64,
    /// Access rights.
    pub access: AccessFlags,
}
