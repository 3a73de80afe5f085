//! Loading `libibverbs.so.1` at run time and resolving the public, versioned `ibv_*` symbols
//! this backend calls.
//!
//! The library is opened once per process (`dlopen` through libloading) and never closed:
//! providers it loads register themselves globally, and contexts may live until exit. Each
//! symbol is resolved with `dlvsym` at the version node where rdma-core defines its current
//! ABI (`IBVERBS_1.1` for the classic verbs, `IBVERBS_1.0` for the completion-channel calls,
//! `IBVERBS_1.8` for `ibv_reg_mr_iova2`), so the `IBVERBS_1.0` compatibility entry points that
//! share the names are never picked. No `IBVERBS_PRIVATE_*` symbol is used. A missing library
//! or symbol is an error value, never a panic or a failed process start.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use verbs_api::{Error, ErrorKind, Result};

use super::sys::*;

/// The shared object name (its soname).
pub(crate) const LIBRARY: &str = "libibverbs.so.1";

/// Function pointers of every symbol the backend calls.
pub(crate) struct Verbs {
    pub(crate) get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device,
    pub(crate) free_device_list: unsafe extern "C" fn(*mut *mut ibv_device),
    pub(crate) get_device_name: unsafe extern "C" fn(*mut ibv_device) -> *const c_char,
    pub(crate) get_device_guid: unsafe extern "C" fn(*mut ibv_device) -> u64,
    pub(crate) open_device: unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context,
    pub(crate) close_device: unsafe extern "C" fn(*mut ibv_context) -> c_int,
    pub(crate) query_device: unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int,
    pub(crate) query_port: unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int,
    pub(crate) query_gid: unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int,
    pub(crate) query_pkey: unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut u16) -> c_int,
    pub(crate) alloc_pd: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd,
    pub(crate) dealloc_pd: unsafe extern "C" fn(*mut ibv_pd) -> c_int,
    pub(crate) reg_mr: unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr,
    /// `IBVERBS_1.8`; absent from libraries older than rdma-core v23.
    pub(crate) reg_mr_iova2:
        Option<unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, u64, c_uint) -> *mut ibv_mr>,
    pub(crate) dereg_mr: unsafe extern "C" fn(*mut ibv_mr) -> c_int,
    pub(crate) create_comp_channel: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_comp_channel,
    pub(crate) destroy_comp_channel: unsafe extern "C" fn(*mut ibv_comp_channel) -> c_int,
    pub(crate) create_cq: unsafe extern "C" fn(
        *mut ibv_context,
        c_int,
        *mut c_void,
        *mut ibv_comp_channel,
        c_int,
    ) -> *mut ibv_cq,
    pub(crate) resize_cq: unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int,
    pub(crate) destroy_cq: unsafe extern "C" fn(*mut ibv_cq) -> c_int,
    pub(crate) get_cq_event:
        unsafe extern "C" fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int,
    pub(crate) ack_cq_events: unsafe extern "C" fn(*mut ibv_cq, c_uint),
    pub(crate) create_srq:
        unsafe extern "C" fn(*mut ibv_pd, *mut ibv_srq_init_attr) -> *mut ibv_srq,
    pub(crate) modify_srq: unsafe extern "C" fn(*mut ibv_srq, *mut ibv_srq_attr, c_int) -> c_int,
    pub(crate) query_srq: unsafe extern "C" fn(*mut ibv_srq, *mut ibv_srq_attr) -> c_int,
    pub(crate) destroy_srq: unsafe extern "C" fn(*mut ibv_srq) -> c_int,
    pub(crate) create_qp: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp,
    pub(crate) modify_qp: unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int,
    pub(crate) query_qp:
        unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int, *mut ibv_qp_init_attr) -> c_int,
    pub(crate) destroy_qp: unsafe extern "C" fn(*mut ibv_qp) -> c_int,
    pub(crate) create_ah: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_ah_attr) -> *mut c_void,
    pub(crate) destroy_ah: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub(crate) get_async_event:
        unsafe extern "C" fn(*mut ibv_context, *mut ibv_async_event) -> c_int,
    pub(crate) ack_async_event: unsafe extern "C" fn(*mut ibv_async_event),
}

/// The resolved symbols with the library they point into.
struct Loaded {
    verbs: Verbs,
    /// Keeps the library mapped; never dropped (the value lives in a process-wide static).
    _library: libloading::os::unix::Library,
}

/// The process-wide library, loaded on first use. The error (library or symbol missing) is
/// remembered, so a process without rdma-core pays for one failed `dlopen` only.
pub(crate) fn verbs() -> Result<&'static Verbs> {
    static VERBS: OnceLock<std::result::Result<Loaded, Error>> = OnceLock::new();
    match VERBS.get_or_init(load) {
        Ok(loaded) => Ok(&loaded.verbs),
        Err(e) => Err(e.clone()),
    }
}

fn not_found(detail: String) -> Error {
    Error::new(ErrorKind::NotFound, detail)
}

/// Resolves `name` at `version` in the library whose `dlopen` handle is `handle`.
fn symbol(handle: *mut c_void, name: &CStr, version: &CStr) -> Option<*mut c_void> {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: `handle` is a live handle returned by dlopen (the library is not closed while
        // `load` runs), and both strings are NUL-terminated C strings.
        let p = unsafe { libc::dlvsym(handle, name.as_ptr(), version.as_ptr()) };
        (!p.is_null()).then_some(p)
    }
    #[cfg(not(target_env = "gnu"))]
    {
        let _ = version;
        // SAFETY: as above; without dlvsym the default version is the one rdma-core marks
        // current (`@@`), which is the version named here.
        let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
        (!p.is_null()).then_some(p)
    }
}

fn load() -> Result<Loaded> {
    // SAFETY: loading libibverbs runs its ELF constructors, which only initialise the
    // library's own globals (rdma-core registers no handlers that could run Rust code). The
    // flags ask for eager binding and local symbols, so nothing it exports can interpose on
    // this process's symbols.
    let library = unsafe {
        libloading::os::unix::Library::open(
            Some(LIBRARY),
            libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL,
        )
    }
    .map_err(|e| {
        not_found(format!(
            "{LIBRARY} (rdma-core's libibverbs) cannot be loaded: {e}; install the \
             libibverbs1 package (and ibverbs-providers for devices) to use the hw provider"
        ))
    })?;
    let handle = library.into_raw();
    // From here on `library` is rebuilt from `handle` before returning, on every path.
    let resolve = |name: &CStr, version: &CStr| -> Result<*mut c_void> {
        symbol(handle, name, version).ok_or_else(|| {
            not_found(format!(
                "{LIBRARY} lacks {}@{}: rdma-core too old or not libibverbs",
                name.to_string_lossy(),
                version.to_string_lossy()
            ))
        })
    };
    let result = resolve_all(&resolve, handle);
    // SAFETY: `handle` came from `into_raw` above and is not used as a Library anywhere else.
    let library = unsafe { libloading::os::unix::Library::from_raw(handle) };
    match result {
        Ok(verbs) => Ok(Loaded {
            verbs,
            _library: library,
        }),
        Err(e) => {
            // Unloading is fine: no pointer into the library escaped.
            drop(library);
            Err(e)
        }
    }
}

/// Casts the symbol address `p` to the function pointer type `F`.
///
/// # Safety
///
/// `p` must be the address of a function whose C signature is `F`'s.
unsafe fn cast<F: Copy>(p: *mut c_void) -> F {
    debug_assert_eq!(size_of::<F>(), size_of::<*mut c_void>());
    // SAFETY: function pointers and data pointers have the same size and representation on
    // every platform libibverbs exists on; the caller vouches for the signature.
    unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) }
}

fn resolve_all(
    resolve: &dyn Fn(&CStr, &CStr) -> Result<*mut c_void>,
    handle: *mut c_void,
) -> Result<Verbs> {
    let v1_0 = c"IBVERBS_1.0";
    let v1_1 = c"IBVERBS_1.1";
    macro_rules! sym {
        ($name:literal, $ver:expr) => {{
            let p = resolve($name, $ver)?;
            // SAFETY: each field's type is the prototype rdma-core's verbs.h declares for the
            // symbol at this version (transcribed in `Verbs`).
            unsafe { cast(p) }
        }};
    }
    let reg_mr_iova2 = symbol(handle, c"ibv_reg_mr_iova2", c"IBVERBS_1.8").map(|p| {
        // SAFETY: `ibv_reg_mr_iova2@IBVERBS_1.8` has exactly this prototype.
        unsafe { cast(p) }
    });
    Ok(Verbs {
        get_device_list: sym!(c"ibv_get_device_list", v1_1),
        free_device_list: sym!(c"ibv_free_device_list", v1_1),
        get_device_name: sym!(c"ibv_get_device_name", v1_1),
        get_device_guid: sym!(c"ibv_get_device_guid", v1_1),
        open_device: sym!(c"ibv_open_device", v1_1),
        close_device: sym!(c"ibv_close_device", v1_1),
        query_device: sym!(c"ibv_query_device", v1_1),
        query_port: sym!(c"ibv_query_port", v1_1),
        query_gid: sym!(c"ibv_query_gid", v1_1),
        query_pkey: sym!(c"ibv_query_pkey", v1_1),
        alloc_pd: sym!(c"ibv_alloc_pd", v1_1),
        dealloc_pd: sym!(c"ibv_dealloc_pd", v1_1),
        reg_mr: sym!(c"ibv_reg_mr", v1_1),
        reg_mr_iova2,
        dereg_mr: sym!(c"ibv_dereg_mr", v1_1),
        create_comp_channel: sym!(c"ibv_create_comp_channel", v1_0),
        destroy_comp_channel: sym!(c"ibv_destroy_comp_channel", v1_0),
        create_cq: sym!(c"ibv_create_cq", v1_1),
        resize_cq: sym!(c"ibv_resize_cq", v1_1),
        destroy_cq: sym!(c"ibv_destroy_cq", v1_1),
        get_cq_event: sym!(c"ibv_get_cq_event", v1_1),
        ack_cq_events: sym!(c"ibv_ack_cq_events", v1_1),
        create_srq: sym!(c"ibv_create_srq", v1_1),
        modify_srq: sym!(c"ibv_modify_srq", v1_1),
        query_srq: sym!(c"ibv_query_srq", v1_1),
        destroy_srq: sym!(c"ibv_destroy_srq", v1_1),
        create_qp: sym!(c"ibv_create_qp", v1_1),
        modify_qp: sym!(c"ibv_modify_qp", v1_1),
        query_qp: sym!(c"ibv_query_qp", v1_1),
        destroy_qp: sym!(c"ibv_destroy_qp", v1_1),
        create_ah: sym!(c"ibv_create_ah", v1_1),
        destroy_ah: sym!(c"ibv_destroy_ah", v1_1),
        get_async_event: sym!(c"ibv_get_async_event", v1_1),
        ack_async_event: sym!(c"ibv_ack_async_event", v1_1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without the library the error names it; with it, every symbol resolves. Either way no
    /// panic.
    #[test]
    fn load_reports_or_resolves() {
        match verbs() {
            Ok(_) => {}
            Err(e) => {
                assert_eq!(e.kind, ErrorKind::NotFound);
                assert!(e.detail.contains(LIBRARY), "{e}");
            }
        }
    }
}
