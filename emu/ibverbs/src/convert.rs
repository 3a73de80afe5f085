//! Conversions between libibverbs' C structs ([`ibverbs_sys`]) and the verbs-api values the
//! UDP device takes and returns. Pure functions: no pointers are followed here.

use std::ffi::c_char;

use ibverbs_sys::*;
use verbs_api::{
    AccessFlags, AhAttr, AtomicCap, DeviceAttr, Error, Gid, LinkLayer, Mtu, PortAttr, QpAttr,
    QpAttrMask, QpCap, QpState, ROCE_V2_UDP_PORT, WorkCompletion,
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
        device_cap_flags: IBV_DEVICE_RC_RNR_NAK_GEN,
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
        max_mw: 0,
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

/// `ibv_qp_cap` → [`QpCap`].
pub fn cap_from(c: &ibv_qp_cap) -> QpCap {
    QpCap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// [`QpCap`] → `ibv_qp_cap`.
pub fn cap_to(c: &QpCap) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// `ibv_ah_attr` → [`AhAttr`]. The peer is named by the GRH's destination GID (RoCE v2); the
/// UDP port is always 4791.
pub fn ah_from(a: &ibv_ah_attr) -> AhAttr {
    AhAttr {
        dgid: Gid(a.grh.dgid.raw),
        sgid_index: a.grh.sgid_index,
        flow_label: a.grh.flow_label,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        sl: a.sl,
        port_num: a.port_num,
        udp_dport: ROCE_V2_UDP_PORT,
    }
}

/// [`AhAttr`] → `ibv_ah_attr` (always global: RoCE needs the GRH).
pub fn ah_to(a: &AhAttr) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: a.dgid.0 },
            flow_label: a.flow_label,
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
        },
        dlid: 0,
        sl: a.sl,
        src_path_bits: 0,
        static_rate: 0,
        is_global: 1,
        port_num: a.port_num,
    }
}

/// `ibv_qp_state` number → [`QpState`].
pub fn qp_state(v: u32) -> Option<QpState> {
    QpState::ALL.get(usize::try_from(v).ok()?).copied()
}

/// `ibv_qp_attr` + `attr_mask` → [`QpAttr`] and [`QpAttrMask`] for `ibv_modify_qp`.
///
/// Only the fields the mask names are read; a named value out of range (an unknown state or
/// MTU) is `InvalidArgument`. Unknown mask bits pass through for the device to reject.
pub fn qp_attr_from(a: &ibv_qp_attr, mask: i32) -> Result<(QpAttr, QpAttrMask), Error> {
    let mask = QpAttrMask::from_bits_retain(mask as u32);
    let state = |v, what| qp_state(v).ok_or_else(|| Error::invalid(format!("{what} {v}")));
    let mut out = QpAttr::default();
    if mask.contains(QpAttrMask::STATE) {
        out.qp_state = state(a.qp_state, "qp_state")?;
    }
    if mask.contains(QpAttrMask::CUR_STATE) {
        out.cur_qp_state = state(a.cur_qp_state, "cur_qp_state")?;
    }
    if mask.contains(QpAttrMask::PATH_MTU) {
        out.path_mtu = u8::try_from(a.path_mtu)
            .ok()
            .and_then(Mtu::from_raw)
            .ok_or_else(|| Error::invalid(format!("path_mtu {}", a.path_mtu)))?;
    }
    out.qkey = a.qkey;
    out.rq_psn = a.rq_psn;
    out.sq_psn = a.sq_psn;
    out.dest_qp_num = a.dest_qp_num;
    out.qp_access_flags = AccessFlags::from_bits_retain(a.qp_access_flags);
    out.cap = cap_from(&a.cap);
    out.ah_attr = ah_from(&a.ah_attr);
    out.pkey_index = a.pkey_index;
    out.en_sqd_async_notify = a.en_sqd_async_notify != 0;
    out.max_rd_atomic = a.max_rd_atomic;
    out.max_dest_rd_atomic = a.max_dest_rd_atomic;
    out.min_rnr_timer = a.min_rnr_timer;
    out.port_num = a.port_num;
    out.timeout = a.timeout;
    out.retry_cnt = a.retry_cnt;
    out.rnr_retry = a.rnr_retry;
    Ok((out, mask))
}

/// [`QpAttr`] → `ibv_qp_attr` for `ibv_query_qp` (every field).
pub fn qp_attr_to(a: &QpAttr) -> ibv_qp_attr {
    ibv_qp_attr {
        qp_state: a.qp_state as u32,
        cur_qp_state: a.qp_state as u32,
        path_mtu: a.path_mtu as u32,
        path_mig_state: 0,
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: a.qp_access_flags.bits(),
        cap: cap_to(&a.cap),
        ah_attr: ah_to(&a.ah_attr),
        alt_ah_attr: ibv_ah_attr::default(),
        pkey_index: a.pkey_index,
        alt_pkey_index: 0,
        en_sqd_async_notify: u8::from(a.en_sqd_async_notify),
        sq_draining: u8::from(a.sq_draining),
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        alt_port_num: 0,
        alt_timeout: 0,
        rate_limit: 0,
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
        imm_data: w.imm_data.to_be(),
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
