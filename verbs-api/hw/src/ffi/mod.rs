//! Everything `unsafe` of the crate: the `#[repr(C)]` bindings ([`sys`]), loading libibverbs and
//! resolving its versioned symbols ([`loader`]), MR memory ([`region`]), and safe owners of
//! libibverbs objects ([`safe`]) whose methods the rest of the crate calls. Every `unsafe` block
//! carries a `// SAFETY:` note.

pub(crate) mod loader;
pub(crate) mod region;
pub(crate) mod safe;
pub(crate) use ibverbs_sys as sys;
