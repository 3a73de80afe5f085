//! Everything `unsafe` of the crate: the `#[repr(C)]` bindings ([`sys`]), loading libibverbs and
//! resolving its versioned symbols ([`loader`]), and safe owners of
//! libibverbs objects ([`safe`]) whose methods the rest of the crate calls. Every `unsafe` block
//! carries a `// SAFETY:` note. MR memory is the `mr-region` crate's [`mr_region::Region`].

pub(crate) mod loader;
pub(crate) mod safe;
pub(crate) use ibverbs_sys as sys;
