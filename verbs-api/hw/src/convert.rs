//! Conversions between libibverbs' values (errnos, attribute structs, completions, events) and
//! `verbs_api`'s. The conversions the drop-in shares live in `ibverbs_sys::convert`; this module
//! keeps the hardware side's own rules (unknown states read as ERR, queried capacities from the
//! init attr, `sq_draining` never passed to `ibv_modify_qp`).

use std::ffi::CStr;

use verbs_api::{
    AsyncEvent, AsyncEventKind, AtomicCap, DeviceAttr, DeviceCapFlags, Error, ErrorKind,
    EventElement, LinkLayer, Mtu, PortAttr, PortState, QpAttr, QpState, WcFlags, WcOpcode,
    WcStatus, WorkCompletion,
};

use crate::ffi::safe::{RawElement, RawEvent};
use crate::ffi::sys::convert as shared;
pub(crate) use crate::ffi::sys::convert::{ah_to, cap_from, cap_to, mtu};
use crate::ffi::sys::{
    IBV_LINK_LAYER_ETHERNET, ibv_device_attr, ibv_port_attr, ibv_qp_attr, ibv_qp_cap, ibv_wc,
};

/// The error for a failed libibverbs call: the kind its errno maps to, with the call named.
pub(crate) fn errno_error(call: &str, errno: i32) -> Error {
    let kind = match errno {
        libc::EINVAL => ErrorKind::InvalidArgument,
        libc::ENOMEM | libc::ENOSPC | libc::EAGAIN | libc::EMFILE | libc::ENFILE => {
            ErrorKind::NoMemory
        }
        libc::EBUSY => ErrorKind::Busy,
        libc::EOPNOTSUPP | libc::ENOSYS | libc::EPROTONOSUPPORT => ErrorKind::NotSupported,
        libc::ENODEV | libc::ENOENT | libc::ENXIO | libc::ENODATA => ErrorKind::NotFound,
        _ => ErrorKind::Io,
    };
    Error::new(
        kind,
        format!("{call}: {}", std::io::Error::from_raw_os_error(errno)),
    )
}

fn count(v: i32) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

fn c_string(chars: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| c.to_ne_bytes()[0])
        .collect();
    CStr::from_bytes_until_nul(&[bytes.as_slice(), &[0]].concat())
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// `ibv_device_attr` → [`DeviceAttr`] (GUIDs are big-endian in the struct).
pub(crate) fn device_attr(a: &ibv_device_attr) -> DeviceAttr {
    DeviceAttr {
        fw_ver: c_string(&a.fw_ver),
        node_guid: u64::from_be(a.node_guid),
        sys_image_guid: u64::from_be(a.sys_image_guid),
        max_mr_size: a.max_mr_size,
        page_size_cap: a.page_size_cap,
        vendor_id: a.vendor_id,
        vendor_part_id: a.vendor_part_id,
        hw_ver: a.hw_ver,
        max_qp: count(a.max_qp),
        max_qp_wr: count(a.max_qp_wr),
        max_sge: count(a.max_sge),
        max_cq: count(a.max_cq),
        max_cqe: count(a.max_cqe),
        max_mr: count(a.max_mr),
        max_pd: count(a.max_pd),
        max_qp_rd_atom: count(a.max_qp_rd_atom),
        max_qp_init_rd_atom: count(a.max_qp_init_rd_atom),
        max_srq: count(a.max_srq),
        max_srq_wr: count(a.max_srq_wr),
        max_srq_sge: count(a.max_srq_sge),
        // libibverbs' device attributes have no inline limit; rxe's is RXE_MAX_INLINE_DATA.
        max_inline_data: 0,
        phys_port_cnt: a.phys_port_cnt,
        atomic_cap: match a.atomic_cap {
            1 => AtomicCap::Hca,
            2 => AtomicCap::Global,
            _ => AtomicCap::None,
        },
        max_mw: count(a.max_mw),
        device_cap_flags: DeviceCapFlags::from_bits_retain(a.device_cap_flags),
    }
}

/// `ibv_port_attr` → [`PortAttr`].
pub(crate) fn port_attr(a: &ibv_port_attr) -> PortAttr {
    PortAttr {
        state: match a.state {
            2 => PortState::Init,
            3 => PortState::Armed,
            4 | 5 => PortState::Active,
            _ => PortState::Down,
        },
        max_mtu: mtu(a.max_mtu).unwrap_or(Mtu::Mtu256),
        active_mtu: mtu(a.active_mtu).unwrap_or(Mtu::Mtu256),
        gid_tbl_len: count(a.gid_tbl_len),
        port_cap_flags: a.port_cap_flags,
        max_msg_sz: a.max_msg_sz,
        pkey_tbl_len: a.pkey_tbl_len,
        lid: a.lid,
        link_layer: if a.link_layer == IBV_LINK_LAYER_ETHERNET {
            LinkLayer::Ethernet
        } else {
            LinkLayer::InfiniBand
        },
    }
}

/// rdma-core's `ibv_qp_state` value → [`QpState`] (unknown values read as ERR).
pub(crate) fn qp_state(v: u32) -> QpState {
    shared::qp_state(v).unwrap_or(QpState::Err)
}

/// [`QpAttr`] → `ibv_qp_attr` (every field; the mask says which the kernel applies).
/// `sq_draining` is always 0: `ibv_query_qp` reports it, `ibv_modify_qp` does not take it.
pub(crate) fn qp_attr_to(a: &QpAttr) -> ibv_qp_attr {
    ibv_qp_attr {
        sq_draining: 0,
        ..shared::qp_attr_to(a)
    }
}

/// `ibv_qp_attr` (from `ibv_query_qp`) → [`QpAttr`], with the capacities of the init attr.
pub(crate) fn qp_attr_from(a: &ibv_qp_attr, cap: &ibv_qp_cap) -> QpAttr {
    QpAttr {
        qp_state: qp_state(a.qp_state),
        cur_qp_state: qp_state(a.cur_qp_state),
        path_mtu: mtu(a.path_mtu).unwrap_or_default(),
        cap: cap_from(cap),
        sq_draining: a.sq_draining != 0,
        ..shared::qp_attr_from(a)
    }
}

/// `ibv_wc` → [`WorkCompletion`] (immediate data is big-endian in the struct).
pub(crate) fn wc(w: &ibv_wc) -> WorkCompletion {
    let opcode = match w.opcode {
        1 => WcOpcode::RdmaWrite,
        2 => WcOpcode::RdmaRead,
        3 => WcOpcode::CompSwap,
        4 => WcOpcode::FetchAdd,
        5 => WcOpcode::BindMw,
        6 => WcOpcode::LocalInv,
        128 => WcOpcode::Recv,
        129 => WcOpcode::RecvRdmaWithImm,
        _ => WcOpcode::Send,
    };
    let flags = WcFlags::from_bits_retain(w.wc_flags);
    // `imm_data` and `invalidated_rkey` share a slot: network order for one, host for the other.
    let inv = flags.contains(WcFlags::WITH_INV);
    WorkCompletion {
        wr_id: w.wr_id,
        status: WcStatus::from_raw(w.status).unwrap_or(WcStatus::GeneralErr),
        opcode,
        vendor_err: w.vendor_err,
        byte_len: w.byte_len,
        imm_data: if inv { 0 } else { u32::from_be(w.imm_data) },
        invalidated_rkey: if inv { w.imm_data } else { 0 },
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        wc_flags: flags,
        pkey_index: w.pkey_index,
        slid: w.slid,
        sl: w.sl,
    }
}

/// A raw async event → [`AsyncEvent`]; `None` for kinds `verbs_api` does not name (path
/// migration, LID/P_Key/SM changes, client re-register, GID change, WQ fatal).
pub(crate) fn async_event(e: &RawEvent) -> Option<AsyncEvent> {
    let kind = match e.kind {
        0 => AsyncEventKind::CqErr,
        1 => AsyncEventKind::QpFatal,
        2 => AsyncEventKind::QpReqErr,
        3 => AsyncEventKind::QpAccessErr,
        4 => AsyncEventKind::CommEst,
        5 => AsyncEventKind::SqDrained,
        8 => AsyncEventKind::DeviceFatal,
        9 => AsyncEventKind::PortActive,
        10 => AsyncEventKind::PortErr,
        14 => AsyncEventKind::SrqErr,
        15 => AsyncEventKind::SrqLimitReached,
        16 => AsyncEventKind::QpLastWqeReached,
        _ => return None,
    };
    let element = match e.element {
        RawElement::Cq(h) => EventElement::Cq(h),
        RawElement::Qp(n) => EventElement::Qp(n),
        RawElement::Srq(h) => EventElement::Srq(h),
        RawElement::Port(p) => EventElement::Port(p),
        RawElement::Device => EventElement::Device,
    };
    Some(AsyncEvent { kind, element })
}

#[cfg(test)]
mod tests {
    use verbs_api::{AccessFlags, AhAttr, Gid};

    use super::*;

    #[test]
    fn errnos_map_to_kinds() {
        assert_eq!(
            errno_error("x", libc::EINVAL).kind,
            ErrorKind::InvalidArgument
        );
        assert_eq!(errno_error("x", libc::EBUSY).kind, ErrorKind::Busy);
        assert_eq!(
            errno_error("x", libc::EOPNOTSUPP).kind,
            ErrorKind::NotSupported
        );
        assert_eq!(errno_error("x", libc::ENOMEM).kind, ErrorKind::NoMemory);
        assert_eq!(errno_error("x", libc::EIO).kind, ErrorKind::Io);
        assert!(
            errno_error("ibv_modify_qp", libc::EINVAL)
                .detail
                .starts_with("ibv_modify_qp: ")
        );
    }

    #[test]
    fn qp_attr_round_trips() {
        let a = QpAttr {
            qp_state: QpState::Rtr,
            cur_qp_state: QpState::Init,
            rq_psn: 0x12_3456,
            dest_qp_num: 0x11,
            qp_access_flags: AccessFlags::REMOTE_READ,
            ah_attr: AhAttr {
                dgid: Gid([7; 16]),
                sgid_index: 1,
                ..AhAttr::default()
            },
            retry_cnt: 7,
            timeout: 14,
            ..QpAttr::default()
        };
        let raw = qp_attr_to(&a);
        assert_eq!(raw.ah_attr.is_global, 1);
        assert_eq!(qp_attr_from(&raw, &cap_to(&a.cap)), a);
    }

    #[test]
    fn wc_immediate_is_network_order() {
        let w = ibv_wc {
            opcode: 129,
            imm_data: 0xAABB_CCDDu32.to_be(),
            wc_flags: 2,
            ..ibv_wc::default()
        };
        let c = wc(&w);
        assert_eq!(c.opcode, WcOpcode::RecvRdmaWithImm);
        assert_eq!(c.imm_data, 0xAABB_CCDD);
        assert!(c.wc_flags.contains(WcFlags::WITH_IMM));
    }
}
