//! Compares the Rust layouts with the C compiler's: a small C program built against the
//! installed `/usr/include/infiniband/verbs.h` prints `sizeof`/`offsetof` of every struct and
//! member the two users of this crate touch, and each line must equal `size_of`/`offset_of!`.
//!
//! Skipped (loudly, on stderr) when the header or `cc` is absent. Where the crate declares
//! the newest (rdma-core 65) layout and the header is older, sizes differ by design: those
//! structs are compared member by member (`verbs_context` relative to its end).

#![cfg(all(target_arch = "x86_64", target_os = "linux"))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::mem::{offset_of, size_of};
use std::path::Path;
use std::process::Command;

use ibverbs_sys::*;

const HEADER: &str = "/usr/include/infiniband/verbs.h";

/// One line the C program prints: `key value`, with the value Rust expects.
type Entry = (String, usize);

macro_rules! size {
    ($t:ident) => {
        (format!("sizeof {}", stringify!($t)), size_of::<$t>())
    };
}

macro_rules! off {
    ($t:ident, $f:ident) => {
        off!($t, $f => stringify!($f))
    };
    ($t:ident, $f:ident => $c:expr) => {
        (
            format!("offsetof {} {}", stringify!($t), $c),
            offset_of!($t, $f),
        )
    };
}

/// `verbs_context` members, as their distance before `context` (the ABI is relative to it).
macro_rules! vctx {
    ($f:ident) => {
        vctx!($f => stringify!($f))
    };
    ($f:ident => $c:expr) => {
        (
            format!("before_context verbs_context {}", $c),
            offset_of!(verbs_context, context) - offset_of!(verbs_context, $f),
        )
    };
}

fn entries() -> Vec<Entry> {
    vec![
        size!(ibv_device),
        size!(ibv_context),
        size!(ibv_context_ops),
        size!(ibv_pd),
        size!(ibv_mr),
        size!(ibv_comp_channel),
        size!(ibv_cq),
        size!(ibv_cq_ex),
        size!(ibv_srq),
        size!(ibv_qp),
        size!(ibv_ah),
        size!(ibv_gid),
        size!(ibv_gid_entry),
        size!(ibv_global_route),
        size!(ibv_ah_attr),
        size!(ibv_qp_cap),
        size!(ibv_qp_init_attr),
        size!(ibv_qp_init_attr_ex),
        size!(ibv_cq_init_attr_ex),
        size!(ibv_qp_attr),
        size!(ibv_srq_attr),
        size!(ibv_srq_init_attr),
        size!(ibv_sge),
        size!(ibv_send_wr),
        size!(ibv_recv_wr),
        size!(ibv_wc),
        size!(ibv_device_attr),
        size!(ibv_device_attr_ex),
        size!(ibv_async_event),
        size!(ibv_data_buf),
        ("sizeof ibv_port_attr".to_string(), IBV_PORT_ATTR_SIZE_V44),
        off!(ibv_device, node_type),
        off!(ibv_device, transport_type),
        off!(ibv_device, name),
        off!(ibv_device, dev_name),
        off!(ibv_device, dev_path),
        off!(ibv_device, ibdev_path),
        off!(ibv_context, device),
        off!(ibv_context, ops),
        off!(ibv_context, cmd_fd),
        off!(ibv_context, async_fd),
        off!(ibv_context, num_comp_vectors),
        off!(ibv_context, mutex),
        off!(ibv_context, abi_compat),
        off!(ibv_context_ops, alloc_mw),
        off!(ibv_context_ops, bind_mw),
        off!(ibv_context_ops, dealloc_mw),
        size!(ibv_mw),
        off!(ibv_mw, rkey),
        off!(ibv_mw, handle),
        off!(ibv_mw, mw_type => "type"),
        size!(ibv_mw_bind),
        size!(ibv_mw_bind_info),
        off!(ibv_mw_bind, send_flags),
        off!(ibv_mw_bind, bind_info),
        off!(ibv_mw_bind_info, mw_access_flags),
        off!(ibv_context_ops, poll_cq),
        off!(ibv_context_ops, req_notify_cq),
        off!(ibv_context_ops, post_srq_recv),
        off!(ibv_context_ops, post_send),
        off!(ibv_context_ops, post_recv),
        off!(ibv_mr, addr),
        off!(ibv_mr, length),
        off!(ibv_mr, handle),
        off!(ibv_mr, lkey),
        off!(ibv_mr, rkey),
        off!(ibv_comp_channel, fd),
        off!(ibv_comp_channel, refcnt),
        off!(ibv_cq, cq_context),
        off!(ibv_cq, handle),
        off!(ibv_cq, cqe),
        off!(ibv_cq, mutex),
        off!(ibv_cq, cond),
        off!(ibv_cq, comp_events_completed),
        off!(ibv_cq, async_events_completed),
        off!(ibv_cq_ex, comp_mask),
        off!(ibv_cq_ex, status),
        off!(ibv_cq_ex, wr_id),
        off!(ibv_cq_ex, start_poll),
        off!(ibv_cq_ex, next_poll),
        off!(ibv_cq_ex, end_poll),
        off!(ibv_cq_ex, read_opcode),
        off!(ibv_cq_ex, read_vendor_err),
        off!(ibv_cq_ex, read_byte_len),
        off!(ibv_cq_ex, read_imm_data),
        off!(ibv_cq_ex, read_qp_num),
        off!(ibv_cq_ex, read_src_qp),
        off!(ibv_cq_ex, read_wc_flags),
        off!(ibv_cq_ex, read_slid),
        off!(ibv_cq_ex, read_sl),
        off!(ibv_cq_ex, read_dlid_path_bits),
        off!(ibv_cq_ex, read_completion_ts),
        off!(ibv_cq_ex, read_cvlan),
        off!(ibv_cq_ex, read_flow_tag),
        off!(ibv_cq_ex, read_tm_info),
        off!(ibv_cq_ex, read_completion_wallclock_ns),
        off!(ibv_srq, srq_context),
        off!(ibv_srq, pd),
        off!(ibv_srq, handle),
        off!(ibv_srq, events_completed),
        off!(ibv_qp, send_cq),
        off!(ibv_qp, recv_cq),
        off!(ibv_qp, srq),
        off!(ibv_qp, handle),
        off!(ibv_qp, qp_num),
        off!(ibv_qp, state),
        off!(ibv_qp, qp_type),
        off!(ibv_qp, events_completed),
        off!(ibv_qp_ex, qp_base),
        off!(ibv_qp_ex, comp_mask),
        off!(ibv_qp_ex, wr_id),
        off!(ibv_qp_ex, wr_flags),
        off!(ibv_qp_ex, wr_atomic_cmp_swp),
        off!(ibv_qp_ex, wr_atomic_fetch_add),
        off!(ibv_qp_ex, wr_bind_mw),
        off!(ibv_qp_ex, wr_local_inv),
        off!(ibv_qp_ex, wr_rdma_read),
        off!(ibv_qp_ex, wr_rdma_write),
        off!(ibv_qp_ex, wr_rdma_write_imm),
        off!(ibv_qp_ex, wr_send),
        off!(ibv_qp_ex, wr_send_imm),
        off!(ibv_qp_ex, wr_send_inv),
        off!(ibv_qp_ex, wr_send_tso),
        off!(ibv_qp_ex, wr_set_ud_addr),
        off!(ibv_qp_ex, wr_set_xrc_srqn),
        off!(ibv_qp_ex, wr_set_inline_data),
        off!(ibv_qp_ex, wr_set_inline_data_list),
        off!(ibv_qp_ex, wr_set_sge),
        off!(ibv_qp_ex, wr_set_sge_list),
        off!(ibv_qp_ex, wr_start),
        off!(ibv_qp_ex, wr_complete),
        off!(ibv_qp_ex, wr_abort),
        off!(ibv_qp_ex, wr_atomic_write),
        off!(ibv_ah, handle),
        off!(ibv_gid_entry, gid_index),
        off!(ibv_gid_entry, port_num),
        off!(ibv_gid_entry, gid_type),
        off!(ibv_gid_entry, ndev_ifindex),
        off!(ibv_global_route, flow_label),
        off!(ibv_global_route, sgid_index),
        off!(ibv_global_route, hop_limit),
        off!(ibv_global_route, traffic_class),
        off!(ibv_ah_attr, dlid),
        off!(ibv_ah_attr, sl),
        off!(ibv_ah_attr, is_global),
        off!(ibv_ah_attr, port_num),
        off!(ibv_qp_init_attr, cap),
        off!(ibv_qp_init_attr, qp_type),
        off!(ibv_qp_init_attr, sq_sig_all),
        off!(ibv_qp_init_attr_ex, comp_mask),
        off!(ibv_qp_init_attr_ex, pd),
        off!(ibv_qp_init_attr_ex, xrcd),
        off!(ibv_qp_init_attr_ex, create_flags),
        off!(ibv_qp_init_attr_ex, max_tso_header),
        off!(ibv_qp_init_attr_ex, rwq_ind_tbl),
        off!(ibv_qp_init_attr_ex, rx_hash_conf),
        off!(ibv_qp_init_attr_ex, source_qpn),
        off!(ibv_qp_init_attr_ex, send_ops_flags),
        off!(ibv_cq_init_attr_ex, cq_context),
        off!(ibv_cq_init_attr_ex, channel),
        off!(ibv_cq_init_attr_ex, comp_vector),
        off!(ibv_cq_init_attr_ex, wc_flags),
        off!(ibv_cq_init_attr_ex, comp_mask),
        off!(ibv_cq_init_attr_ex, flags),
        off!(ibv_cq_init_attr_ex, parent_domain),
        off!(ibv_qp_attr, qp_access_flags),
        off!(ibv_qp_attr, cap),
        off!(ibv_qp_attr, ah_attr),
        off!(ibv_qp_attr, alt_ah_attr),
        off!(ibv_qp_attr, pkey_index),
        off!(ibv_qp_attr, en_sqd_async_notify),
        off!(ibv_qp_attr, sq_draining),
        off!(ibv_qp_attr, max_rd_atomic),
        off!(ibv_qp_attr, max_dest_rd_atomic),
        off!(ibv_qp_attr, min_rnr_timer),
        off!(ibv_qp_attr, port_num),
        off!(ibv_qp_attr, timeout),
        off!(ibv_qp_attr, retry_cnt),
        off!(ibv_qp_attr, rnr_retry),
        off!(ibv_qp_attr, alt_port_num),
        off!(ibv_qp_attr, alt_timeout),
        off!(ibv_qp_attr, rate_limit),
        off!(ibv_srq_init_attr, attr),
        off!(ibv_send_wr, next),
        off!(ibv_send_wr, sg_list),
        off!(ibv_send_wr, num_sge),
        off!(ibv_send_wr, opcode),
        off!(ibv_send_wr, send_flags),
        off!(ibv_send_wr, imm_data),
        off!(ibv_send_wr, wr),
        off!(ibv_send_wr, qp_type_xrc_remote_srqn => "qp_type"),
        off!(ibv_send_wr, bind_mw_or_tso => "bind_mw"),
        off!(ibv_recv_wr, next),
        off!(ibv_recv_wr, sg_list),
        off!(ibv_recv_wr, num_sge),
        off!(ibv_wc, status),
        off!(ibv_wc, opcode),
        off!(ibv_wc, vendor_err),
        off!(ibv_wc, byte_len),
        off!(ibv_wc, imm_data),
        off!(ibv_wc, qp_num),
        off!(ibv_wc, src_qp),
        off!(ibv_wc, wc_flags),
        off!(ibv_wc, pkey_index),
        off!(ibv_wc, slid),
        off!(ibv_wc, sl),
        off!(ibv_wc, dlid_path_bits),
        off!(ibv_device_attr, node_guid),
        off!(ibv_device_attr, max_mr_size),
        off!(ibv_device_attr, max_qp_wr),
        off!(ibv_device_attr, device_cap_flags),
        off!(ibv_device_attr, max_qp_rd_atom),
        off!(ibv_device_attr, atomic_cap),
        off!(ibv_device_attr, max_srq_sge),
        off!(ibv_device_attr, max_pkeys),
        off!(ibv_device_attr, local_ca_ack_delay),
        off!(ibv_device_attr, phys_port_cnt),
        off!(ibv_device_attr_ex, comp_mask),
        off!(ibv_device_attr_ex, odp_caps),
        off!(ibv_device_attr_ex, completion_timestamp_mask),
        off!(ibv_device_attr_ex, hca_core_clock),
        off!(ibv_device_attr_ex, device_cap_flags_ex),
        off!(ibv_device_attr_ex, tso_caps),
        off!(ibv_device_attr_ex, rss_caps),
        off!(ibv_device_attr_ex, max_wq_type_rq),
        off!(ibv_device_attr_ex, packet_pacing_caps),
        off!(ibv_device_attr_ex, raw_packet_caps),
        off!(ibv_device_attr_ex, tm_caps),
        off!(ibv_device_attr_ex, cq_mod_caps),
        off!(ibv_device_attr_ex, max_dm_size),
        off!(ibv_device_attr_ex, pci_atomic_caps),
        off!(ibv_device_attr_ex, xrc_odp_caps),
        off!(ibv_device_attr_ex, phys_port_cnt_ex),
        off!(ibv_port_attr, max_mtu),
        off!(ibv_port_attr, active_mtu),
        off!(ibv_port_attr, gid_tbl_len),
        off!(ibv_port_attr, port_cap_flags),
        off!(ibv_port_attr, max_msg_sz),
        off!(ibv_port_attr, pkey_tbl_len),
        off!(ibv_port_attr, lid),
        off!(ibv_port_attr, active_width),
        off!(ibv_port_attr, active_speed),
        off!(ibv_port_attr, phys_state),
        off!(ibv_port_attr, link_layer),
        off!(ibv_port_attr, flags),
        off!(ibv_port_attr, port_cap_flags2),
        off!(ibv_async_event, event_type),
        vctx!(query_port),
        vctx!(create_wq),
        vctx!(query_rt_values),
        vctx!(create_cq_ex),
        vctx!(priv_ => "priv"),
        vctx!(query_device_ex),
        vctx!(ibv_create_flow),
        vctx!(open_qp),
        vctx!(create_qp_ex),
        vctx!(get_srq_num),
        vctx!(create_srq_ex),
        vctx!(open_xrcd),
        vctx!(close_xrcd),
        vctx!(sz),
    ]
}

/// The C statement printing `key`'s value.
fn c_line(key: &str) -> String {
    let parts: Vec<&str> = key.split(' ').collect();
    let expr = match parts.as_slice() {
        ["sizeof", t] if *t == "ibv_gid" => "sizeof(union ibv_gid)".to_string(),
        ["sizeof", t] => format!("sizeof(struct {t})"),
        ["offsetof", t, f] => format!("offsetof(struct {t}, {f})"),
        ["before_context", t, f] => {
            format!("offsetof(struct {t}, context) - offsetof(struct {t}, {f})")
        }
        _ => panic!("bad key {key}"),
    };
    format!("    printf(\"{key} %zu\\n\", (size_t)({expr}));\n")
}

#[test]
fn rust_layouts_match_the_installed_header() {
    if !Path::new(HEADER).exists() {
        eprintln!("SKIPPED: {HEADER} is absent (apt-get install libibverbs-dev)");
        return;
    }
    let entries = entries();
    let mut src = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\nint main(void) {\n",
    );
    for (key, _) in &entries {
        src.push_str(&c_line(key));
    }
    src.push_str("    return 0;\n}\n");
    let dir = std::env::temp_dir().join(format!("ibverbs-sys-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (c, exe) = (dir.join("layout.c"), dir.join("layout"));
    std::fs::write(&c, src).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let built = Command::new(&cc).arg(&c).arg("-o").arg(&exe).status();
    match built {
        Err(e) => {
            eprintln!("SKIPPED: cannot run {cc}: {e}");
            return;
        }
        Ok(s) => assert!(s.success(), "{cc} failed on {}", c.display()),
    }
    let out = Command::new(&exe).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let mut mismatches = Vec::new();
    for ((key, rust), line) in entries.iter().zip(text.lines()) {
        let c: usize = line.rsplit(' ').next().unwrap().parse().unwrap();
        if c != *rust {
            mismatches.push(format!("{key}: C {c}, Rust {rust}"));
        }
    }
    assert_eq!(text.lines().count(), entries.len());
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        mismatches.is_empty(),
        "layout mismatches:\n{}",
        mismatches.join("\n")
    );
}
