//! Conversions between the libibverbs structs of this crate and `verbs_api`'s values that read
//! the same in both directions of use: the hardware backend (`verbs-hw`, a caller of libibverbs)
//! and the `libibverbs.so.1` drop-in (`softverbs-ibverbs`, a callee) share them.
//!
//! What this module is not: the conversions whose rules differ between the two sides (how an
//! unknown QP state or MTU is read, which capacities a queried QP reports, the device and port
//! attributes, completions), which stay in each crate. Pure functions: no pointers are followed.

use verbs_api::{AccessFlags, AhAttr, Gid, Mtu, QpAttr, QpCap, QpState, ROCE_V2_UDP_PORT};

use crate::{ibv_ah_attr, ibv_gid, ibv_global_route, ibv_qp_attr, ibv_qp_cap};

/// rdma-core's `ibv_qp_state` value → [`QpState`], `None` for a value it does not name.
pub fn qp_state(v: u32) -> Option<QpState> {
    QpState::ALL.get(usize::try_from(v).ok()?).copied()
}

/// rdma-core's `ibv_mtu` value (1..=5) → [`Mtu`], `None` for 0 or garbage.
pub fn mtu(v: u32) -> Option<Mtu> {
    u8::try_from(v).ok().and_then(Mtu::from_raw)
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

/// `ibv_qp_attr` → [`QpAttr`]: every field that converts without a rule of its own, with the
/// capacities from `a.cap`. `qp_state`, `cur_qp_state`, `path_mtu` and `sq_draining` are left
/// at their [`QpAttr::default`] values for the caller to set under its own rule.
pub fn qp_attr_from(a: &ibv_qp_attr) -> QpAttr {
    QpAttr {
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: AccessFlags::from_bits_retain(a.qp_access_flags),
        cap: cap_from(&a.cap),
        ah_attr: ah_from(&a.ah_attr),
        pkey_index: a.pkey_index,
        en_sqd_async_notify: a.en_sqd_async_notify != 0,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        ..QpAttr::default()
    }
}

/// [`QpAttr`] → `ibv_qp_attr`, every field as `a` holds it (alternate path, path migration and
/// rate limit zero). A caller that reports a field under another rule patches it afterwards.
pub fn qp_attr_to(a: &QpAttr) -> ibv_qp_attr {
    ibv_qp_attr {
        qp_state: a.qp_state as u32,
        cur_qp_state: a.cur_qp_state as u32,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_state_and_mtu_are_none() {
        assert_eq!(qp_state(2), Some(QpState::Rtr));
        assert_eq!(qp_state(7), None);
        assert_eq!(mtu(5), Some(Mtu::Mtu4096));
        assert_eq!(mtu(0), None);
    }

    #[test]
    fn plain_fields_round_trip_and_ruled_ones_stay_default() {
        let a = QpAttr {
            qp_state: QpState::Rts,
            sq_draining: true,
            path_mtu: Mtu::Mtu4096,
            qkey: 0x1111,
            dest_qp_num: 0x22,
            ah_attr: AhAttr {
                dgid: Gid([3; 16]),
                sgid_index: 2,
                ..AhAttr::default()
            },
            cap: QpCap {
                max_send_wr: 16,
                ..QpCap::default()
            },
            rnr_retry: 7,
            ..QpAttr::default()
        };
        let raw = qp_attr_to(&a);
        assert_eq!(raw.ah_attr.is_global, 1);
        assert_eq!(raw.sq_draining, 1);
        let back = qp_attr_from(&raw);
        let ruled = QpAttr {
            qp_state: QpAttr::default().qp_state,
            path_mtu: QpAttr::default().path_mtu,
            sq_draining: false,
            ..a
        };
        assert_eq!(back, ruled);
    }
}
