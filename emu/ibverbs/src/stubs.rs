//! Every exported symbol softverbs does not implement, failing as libibverbs fails for a verb
//! the device does not support: an errno return (`EOPNOTSUPP`, also stored in `errno`, which pyverbs reports) for calls
//! returning one, NULL
//! with `errno = EOPNOTSUPP` for calls returning an object, −1 with `errno` for the sysfs
//! readers, nothing for the `void` provider hooks (`verbs_register_driver_34`, which libmlx5's
//! and libefa's constructors call at load time, is accepted and ignored).
//!
//! They exist so that programs and provider libraries linked `BIND_NOW` against Debian's
//! libibverbs load (libibverbs-abi.md §4.4). None reads its arguments, so each is declared
//! without parameters: in the C calling convention the caller owns the argument registers and
//! stack, so a call with arguments to a function that ignores them is well-defined.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::AtomicBool;

use crate::{null_with, set_errno};

/// Defines stubs returning `EOPNOTSUPP` (the errno-returning convention of verbs).
macro_rules! errno_stubs {
    ($($name:ident),* $(,)?) => {$(
        #[doc = concat!("`", stringify!($name), "`: not supported (`EOPNOTSUPP`, also in `errno`).")]
        #[unsafe(no_mangle)]
        pub extern "C" fn $name() -> c_int {
            set_errno(libc::EOPNOTSUPP);
            libc::EOPNOTSUPP
        }
    )*};
}

/// Defines stubs returning NULL with `errno = EOPNOTSUPP`.
macro_rules! null_stubs {
    ($($name:ident),* $(,)?) => {$(
        #[doc = concat!("`", stringify!($name), "`: not supported (NULL, `errno` `EOPNOTSUPP`).")]
        #[unsafe(no_mangle)]
        pub extern "C" fn $name() -> *mut c_void {
            null_with(libc::EOPNOTSUPP)
        }
    )*};
}

/// Defines `void` stubs that do nothing.
macro_rules! void_stubs {
    ($($name:ident),* $(,)?) => {$(
        #[doc = concat!("`", stringify!($name), "`: accepted and ignored.")]
        #[unsafe(no_mangle)]
        pub extern "C" fn $name() {}
    )*};
}

/// Defines stubs returning −1 with `errno = ENOSYS` (no sysfs tree for softverbs devices).
macro_rules! minus_one_stubs {
    ($($name:ident),* $(,)?) => {$(
        #[doc = concat!("`", stringify!($name), "`: no sysfs file (−1, `errno` `ENOSYS`).")]
        #[unsafe(no_mangle)]
        pub extern "C" fn $name() -> c_int {
            set_errno(libc::ENOSYS);
            -1
        }
    )*};
}

errno_stubs!(
    execute_ioctl,
    ibv_attach_mcast,
    ibv_cmd_advise_mr,
    ibv_cmd_alloc_dm,
    ibv_cmd_alloc_mw,
    ibv_cmd_alloc_pd,
    ibv_cmd_attach_mcast,
    ibv_cmd_close_xrcd,
    ibv_cmd_create_ah,
    ibv_cmd_create_counters,
    ibv_cmd_create_cq,
    ibv_cmd_create_cq_ex,
    ibv_cmd_create_flow,
    ibv_cmd_create_flow_action_esp,
    ibv_cmd_create_qp,
    ibv_cmd_create_qp_ex,
    ibv_cmd_create_qp_ex2,
    ibv_cmd_create_rwq_ind_table,
    ibv_cmd_create_srq,
    ibv_cmd_create_srq_ex,
    ibv_cmd_create_wq,
    ibv_cmd_dealloc_mw,
    ibv_cmd_dealloc_pd,
    ibv_cmd_dereg_mr,
    ibv_cmd_destroy_ah,
    ibv_cmd_destroy_counters,
    ibv_cmd_destroy_cq,
    ibv_cmd_destroy_flow,
    ibv_cmd_destroy_flow_action,
    ibv_cmd_destroy_qp,
    ibv_cmd_destroy_rwq_ind_table,
    ibv_cmd_destroy_srq,
    ibv_cmd_destroy_wq,
    ibv_cmd_detach_mcast,
    ibv_cmd_free_dm,
    ibv_cmd_get_context,
    ibv_cmd_modify_cq,
    ibv_cmd_modify_flow_action_esp,
    ibv_cmd_modify_qp,
    ibv_cmd_modify_qp_ex,
    ibv_cmd_modify_srq,
    ibv_cmd_modify_wq,
    ibv_cmd_open_qp,
    ibv_cmd_open_xrcd,
    ibv_cmd_poll_cq,
    ibv_cmd_post_recv,
    ibv_cmd_post_send,
    ibv_cmd_post_srq_recv,
    ibv_cmd_query_context,
    ibv_cmd_query_device_any,
    ibv_cmd_query_mr,
    ibv_cmd_query_port,
    ibv_cmd_query_qp,
    ibv_cmd_query_srq,
    ibv_cmd_read_counters,
    ibv_cmd_reg_dm_mr,
    ibv_cmd_reg_dmabuf_mr,
    ibv_cmd_reg_mr,
    ibv_cmd_req_notify_cq,
    ibv_cmd_rereg_mr,
    ibv_cmd_resize_cq,
    ibv_detach_mcast,
    ibv_query_ece,
    ibv_rereg_mr,
    ibv_resolve_eth_l2_from_gid,
    ibv_set_ece,
);

null_stubs!(
    _verbs_init_and_alloc_context,
    ibv_import_device,
    ibv_import_dm,
    ibv_import_mr,
    ibv_import_pd,
    ibv_reg_dmabuf_mr,
    verbs_open_device,
);

void_stubs!(
    __verbs_log,
    ibv_copy_ah_attr_from_kern,
    ibv_copy_path_rec_from_kern,
    ibv_copy_path_rec_to_kern,
    ibv_copy_qp_attr_from_kern,
    ibv_register_driver,
    ibv_unimport_dm,
    ibv_unimport_mr,
    ibv_unimport_pd,
    verbs_init_cq,
    verbs_register_driver_34,
    verbs_set_ops,
    verbs_uninit_context,
);

minus_one_stubs!(ibv_read_ibdev_sysfs_file, ibv_read_sysfs_file);

/// `ibv_get_sysfs_path`: `/sys`, as libibverbs answers without a `SYSFS_PATH` override.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}

/// `__ioctl_final_num_attrs`: no ioctl interface, so no attributes.
#[unsafe(no_mangle)]
pub extern "C" fn __ioctl_final_num_attrs() -> c_uint {
    0
}

/// `verbs_allow_disassociate_destroy` (data, `IBVERBS_PRIVATE_34`): providers read it.
#[unsafe(no_mangle)]
pub static verbs_allow_disassociate_destroy: AtomicBool = AtomicBool::new(false);
