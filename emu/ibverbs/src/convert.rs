//! Conversions between libibverbs' C structs ([`ibverbs_sys`]) and the verbs-api values the
//! UDP device takes and returns. Pure functions: no pointers are followed here. The conversions
//! the hardware backend shares live in [`ibverbs_sys::convert`] (re-exported here); this module
//! keeps the drop-in's own rules (a modify reads only the masked states and MTU and rejects
//! unknown values, a query reports `cur_qp_state` as the current state).

use std::ffi::c_char;

use ibverbs_sys::convert::{self, mtu};
pub use ibverbs_sys::convert::{ah_from, ah_to, cap_from, cap_to, qp_state};
use ibverbs_sys::*;
use verbs_api::{
    AtomicCap, DeviceAttr, Error, LinkLayer, PortAttr, QpAttr, QpAttrMask, WcFlags, WorkCompletion,
};

/// `IBV_LINK_LAYER_INFINIBAND`.
const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
/// `IBV_PORT_ACTIVE_SPEED_EDR`-class speed code reported for the emulated link (25 Gb/s lane).
const ACTIVE_SPEED_EDR: u8 = 32;
/// `IBV_WIDTH_4X`.
const ACTIVE_WIDTH_4X: u8 = 2;
/// Physical port state `LinkUp`.
const PHYS_STATE_LINK_UP: u8 = 5;

fn clamp_i32(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

/// [`DeviceAttr`] → `ibv_device_attr`.
pub fn device_attr(a: &DeviceAttr) -> ibv_device_attr {
    let mut fw_ver = [0 as c_char; 64];
    for (dst, src) in fw_ver.iter_mut().zip(a.fw_ver.bytes().take(63)) {
        *dst = src as c_char;
    }
    ibv_device_attr {
        fw_ver,
        node_guid: a.node_guid.to_be(),
        sys_image_guid: a.sys_image_guid.to_be(),
        max_mr_size: a.max_mr_size,
        page_size_cap: a.page_size_cap,
        vendor_id: a.vendor_id,
        vendor_part_id: a.vendor_part_id,
        hw_ver: a.hw_ver,
        max_qp: clamp_i32(a.max_qp),
        max_qp_wr: clamp_i32(a.max_qp_wr),
        device_cap_flags: IBV_DEVICE_RC_RNR_NAK_GEN | a.device_cap_flags.bits(),
        max_sge: clamp_i32(a.max_sge),
        max_sge_rd: clamp_i32(a.max_sge),
        max_cq: clamp_i32(a.max_cq),
        max_cqe: clamp_i32(a.max_cqe),
        max_mr: clamp_i32(a.max_mr),
        max_pd: clamp_i32(a.max_pd),
        max_qp_rd_atom: clamp_i32(a.max_qp_rd_atom),
        max_ee_rd_atom: 0,
        max_res_rd_atom: clamp_i32(a.max_qp_rd_atom.saturating_mul(a.max_qp)),
        max_qp_init_rd_atom: clamp_i32(a.max_qp_init_rd_atom),
        max_ee_init_rd_atom: 0,
        atomic_cap: match a.atomic_cap {
            AtomicCap::None => 0,
            AtomicCap::Hca => 1,
            AtomicCap::Global => 2,
        },
        max_ee: 0,
        max_rdd: 0,
        max_mw: clamp_i32(a.max_mw),
        max_raw_ipv6_qp: 0,
        max_raw_ethy_qp: 0,
        max_mcast_grp: 0,
        max_mcast_qp_attach: 0,
        max_total_mcast_qp_attach: 0,
        max_ah: clamp_i32(a.max_qp),
        max_fmr: 0,
        max_map_per_fmr: 0,
        max_srq: clamp_i32(a.max_srq),
        max_srq_wr: clamp_i32(a.max_srq_wr),
        max_srq_sge: clamp_i32(a.max_srq_sge),
        max_pkeys: 1,
        local_ca_ack_delay: 15,
        phys_port_cnt: a.phys_port_cnt,
    }
}

/// [`PortAttr`] → `ibv_port_attr` (rdma-core 65 layout; callers copy the prefix they own).
pub fn port_attr(a: &PortAttr) -> ibv_port_attr {
    ibv_port_attr {
        state: a.state as u32,
        max_mtu: a.max_mtu as u32,
        active_mtu: a.active_mtu as u32,
        gid_tbl_len: clamp_i32(a.gid_tbl_len),
        port_cap_flags: a.port_cap_flags,
        max_msg_sz: a.max_msg_sz,
        pkey_tbl_len: a.pkey_tbl_len,
        lid: a.lid,
        active_width: ACTIVE_WIDTH_4X,
        active_speed: ACTIVE_SPEED_EDR,
        phys_state: PHYS_STATE_LINK_UP,
        link_layer: match a.link_layer {
            LinkLayer::InfiniBand => IBV_LINK_LAYER_INFINIBAND,
            LinkLayer::Ethernet => IBV_LINK_LAYER_ETHERNET,
        },
        max_vl_num: 1,
        ..ibv_port_attr::default()
    }
}

/// `ibv_qp_attr` + `attr_mask` → [`QpAttr`] and [`QpAttrMask`] for `ibv_modify_qp`.
///
/// Only the fields the mask names are read; a named value out of range (an unknown state or
/// MTU) is `InvalidArgument`. Unknown mask bits pass through for the device to reject.
pub fn qp_attr_from(a: &ibv_qp_attr, mask: i32) -> Result<(QpAttr, QpAttrMask), Error> {
    let mask = QpAttrMask::from_bits_retain(mask as u32);
    let state = |v, what| qp_state(v).ok_or_else(|| Error::invalid(format!("{what} {v}")));
    let mut out = convert::qp_attr_from(a);
    if mask.contains(QpAttrMask::STATE) {
        out.qp_state = state(a.qp_state, "qp_state")?;
    }
    if mask.contains(QpAttrMask::CUR_STATE) {
        out.cur_qp_state = state(a.cur_qp_state, "cur_qp_state")?;
    }
    if mask.contains(QpAttrMask::PATH_MTU) {
        out.path_mtu =
            mtu(a.path_mtu).ok_or_else(|| Error::invalid(format!("path_mtu {}", a.path_mtu)))?;
    }
    Ok((out, mask))
}

/// [`QpAttr`] → `ibv_qp_attr` for `ibv_query_qp` (every field; `cur_qp_state` reports the
/// current state).
pub fn qp_attr_to(a: &QpAttr) -> ibv_qp_attr {
    ibv_qp_attr {
        cur_qp_state: a.qp_state as u32,
        ..convert::qp_attr_to(a)
    }
}

/// The `ibv_wc` slot `imm_data` and `invalidated_rkey` share: the R_Key (host order) with
/// `IBV_WC_WITH_INV`, else the immediate in network order.
pub fn imm_or_invalidated(w: &WorkCompletion) -> u32 {
    if w.wc_flags.contains(WcFlags::WITH_INV) {
        w.invalidated_rkey
    } else {
        w.imm_data.to_be()
    }
}

/// [`WorkCompletion`] → `ibv_wc` (immediate data in network byte order, as the sender posted
/// it).
pub fn wc_to(w: &WorkCompletion) -> ibv_wc {
    ibv_wc {
        wr_id: w.wr_id,
        status: w.status as u32,
        opcode: w.opcode as u32,
        vendor_err: w.vendor_err,
        byte_len: w.byte_len,
        imm_data: imm_or_invalidated(w),
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        wc_flags: w.wc_flags.bits(),
        pkey_index: w.pkey_index,
        slid: w.slid,
        sl: w.sl,
        dlid_path_bits: 0,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use verbs_api::{Gid, Mtu, QpState};

    use super::*;

    #[test]
    fn qp_attr_round_trips_through_modify_and_query() {
        let mut a = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: Mtu::Mtu4096,
            dest_qp_num: 0x12,
            rq_psn: 7,
            max_dest_rd_atomic: 4,
            min_rnr_timer: 12,
            ..QpAttr::default()
        };
        a.ah_attr.dgid = Gid([9; 16]);
        let c = qp_attr_to(&a);
        let mask = QpAttrMask::STATE | QpAttrMask::PATH_MTU | QpAttrMask::AV;
        let (back, m) = qp_attr_from(&c, mask.bits() as i32).unwrap();
        assert_eq!(m, mask);
        assert_eq!(back.qp_state, QpState::Rtr);
        assert_eq!(back.path_mtu, Mtu::Mtu4096);
        assert_eq!(back.ah_attr.dgid, a.ah_attr.dgid);
        assert_eq!(back.dest_qp_num, 0x12);
    }

    #[test]
    fn bad_state_or_mtu_is_einval() {
        let c = ibv_qp_attr {
            qp_state: 9,
            path_mtu: 7,
            ..ibv_qp_attr::default()
        };
        assert!(qp_attr_from(&c, QpAttrMask::STATE.bits() as i32).is_err());
        assert!(qp_attr_from(&c, QpAttrMask::PATH_MTU.bits() as i32).is_err());
        assert!(qp_attr_from(&c, QpAttrMask::QKEY.bits() as i32).is_ok());
    }
}
