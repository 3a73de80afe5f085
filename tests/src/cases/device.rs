//! Checklist item 1: device list, device/port/GID/P_Key queries, limits, and errors on a bad
//! port or index (pyverbs `test_device.py`).

use std::collections::HashSet;

use verbs_api::{Context, ErrorKind, LinkLayer, MAX_24BIT, PortState, ProtectionDomain, QueuePair};

use crate::check::{Outcome, expect_err, expect_kind, failure};
use crate::fixture::{Env, Fixture};
use crate::{check_eq, ensure};

/// The provider lists at least one device (`ibv_get_device_list` non-empty).
pub fn list_nonempty<C: Context>(env: &Env<C>) -> Outcome {
    ensure!(
        env.device_count() >= 1,
        "provider {} lists no device",
        env.provider_name()
    );
    Ok(())
}

/// Device names are non-empty and unique, and a context reports its device's name.
pub fn names_unique<C: Context>(env: &Env<C>) -> Outcome {
    let names = env.device_names();
    let unique: HashSet<&String> = names.iter().collect();
    check_eq!(
        unique.len(),
        names.len(),
        "duplicate device names in {names:?}"
    );
    for (i, name) in names.iter().enumerate() {
        ensure!(!name.is_empty(), "device {i} has an empty name");
        check_eq!(
            env.open(i)?.device_name(),
            name.clone(),
            "name of device {i}"
        );
    }
    Ok(())
}

/// A device can be opened twice; both contexts work independently.
pub fn open_twice<C: Context>(env: &Env<C>) -> Outcome {
    let a = env.open(0)?;
    let b = env.open(0)?;
    check_eq!(
        a.query_device()?,
        b.query_device()?,
        "both contexts see one device"
    );
    let pd_a = a.alloc_pd()?;
    let pd_b = b.alloc_pd()?;
    pd_a.destroy()?;
    pd_b.destroy()?;
    Ok(())
}

/// `query_device` limits are usable: every count and size at least 1.
pub fn query_device_limits_sane<C: Context>(env: &Env<C>) -> Outcome {
    for i in 0..env.device_count() {
        let d = env.open(i)?.query_device()?;
        let at_least_one = [
            ("max_qp", d.max_qp),
            ("max_qp_wr", d.max_qp_wr),
            ("max_sge", d.max_sge),
            ("max_cq", d.max_cq),
            ("max_cqe", d.max_cqe),
            ("max_mr", d.max_mr),
            ("max_pd", d.max_pd),
        ];
        for (name, v) in at_least_one {
            ensure!(v >= 1, "device {i}: {name} = {v}, expected >= 1");
        }
        ensure!(d.phys_port_cnt >= 1, "device {i}: phys_port_cnt = 0");
        ensure!(
            d.max_mr_size >= 4096,
            "device {i}: max_mr_size = {}",
            d.max_mr_size
        );
        ensure!(d.page_size_cap != 0, "device {i}: page_size_cap = 0");
        ensure!(
            d.max_srq == 0 || d.max_srq_wr >= 1,
            "device {i}: SRQs without WRs"
        );
    }
    Ok(())
}

/// `query_device`'s node GUID is the one the device list reports (`ibv_get_device_guid`).
pub fn query_device_guid_matches_list<C: Context>(env: &Env<C>) -> Outcome {
    for i in 0..env.device_count() {
        let attr = env.open(i)?.query_device()?;
        check_eq!(
            Some(attr.node_guid),
            env.device_guid(i),
            "node GUID of device {i}"
        );
    }
    Ok(())
}

/// Port 1 is ACTIVE, Ethernet (RoCE), `active_mtu` ≤ `max_mtu`, and has a GID and P_Key table.
pub fn query_port_active_ethernet<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let phys = ctx.query_device()?.phys_port_cnt;
    for port in 1..=phys {
        let p = ctx.query_port(port)?;
        check_eq!(p.state, PortState::Active, "port {port} state");
        check_eq!(p.link_layer, LinkLayer::Ethernet, "port {port} link layer");
        ensure!(
            p.active_mtu <= p.max_mtu,
            "port {port}: active_mtu {:?} above max_mtu {:?}",
            p.active_mtu,
            p.max_mtu
        );
        ensure!(p.gid_tbl_len >= 1, "port {port}: empty GID table");
        ensure!(p.pkey_tbl_len >= 1, "port {port}: empty P_Key table");
        ensure!(p.max_msg_sz >= 1, "port {port}: max_msg_sz = 0");
    }
    Ok(())
}

/// Port 0 does not exist: `InvalidArgument`.
pub fn query_port_zero_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    expect_kind(
        ctx.query_port(0),
        ErrorKind::InvalidArgument,
        "query_port(0)",
    )
}

/// Ports above `phys_port_cnt` do not exist: `InvalidArgument`.
pub fn query_port_beyond_count_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let phys = ctx.query_device()?.phys_port_cnt;
    if let Some(beyond) = phys.checked_add(1) {
        expect_kind(
            ctx.query_port(beyond),
            ErrorKind::InvalidArgument,
            "query_port(phys_port_cnt + 1)",
        )?;
    }
    expect_kind(
        ctx.query_port(u8::MAX),
        ErrorKind::InvalidArgument,
        "query_port(255)",
    )
}

/// GID index 0 of port 1 holds a non-zero GID (for RoCE, an IP address).
pub fn query_gid_index_zero<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let gid = ctx.query_gid(1, 0)?;
    ensure!(!gid.is_zero(), "GID index 0 is all zero");
    Ok(())
}

/// Every index of the GID table below `gid_tbl_len` (the first 64) can be queried: a
/// populated entry reads as its GID, an empty one as the zero GID (`ibv_query_gid` since
/// rdma-core 32); the last index of a table longer than one is empty (rxe: 1024 entries, two
/// populated; the emulator: 16, one).
pub fn query_gid_empty_entries_read_zero<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let len = ctx.query_port(1)?.gid_tbl_len;
    for index in 0..len.min(64) {
        ctx.query_gid(1, index)
            .map_err(|e| failure(format!("query_gid(1, {index}) of {len}: {e}")))?;
    }
    if len > 1 {
        let last = ctx.query_gid(1, len - 1)?;
        ensure!(
            last.is_zero(),
            "GID index {} of {len} is populated: {last}",
            len - 1
        );
    }
    Ok(())
}

/// A GID index at or above `gid_tbl_len` is `InvalidArgument`.
pub fn query_gid_beyond_table_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let len = ctx.query_port(1)?.gid_tbl_len;
    expect_kind(
        ctx.query_gid(1, len),
        ErrorKind::InvalidArgument,
        "query_gid(1, gid_tbl_len)",
    )?;
    expect_kind(
        ctx.query_gid(1, u32::MAX),
        ErrorKind::InvalidArgument,
        "query_gid(1, u32::MAX)",
    )
}

/// A GID query on a port that does not exist is `InvalidArgument`.
pub fn query_gid_bad_port_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let phys = ctx.query_device()?.phys_port_cnt;
    expect_kind(
        ctx.query_gid(0, 0),
        ErrorKind::InvalidArgument,
        "query_gid(0, 0)",
    )?;
    expect_kind(
        ctx.query_gid(phys.saturating_add(1), 0),
        ErrorKind::InvalidArgument,
        "query_gid(phys_port_cnt + 1, 0)",
    )
}

/// P_Key index 0 holds the default full-membership P_Key 0xFFFF on RoCE.
pub fn query_pkey_index_zero_default<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    check_eq!(ctx.query_pkey(1, 0)?, 0xFFFF, "P_Key at index 0");
    Ok(())
}

/// A P_Key index at or above `pkey_tbl_len` fails. The contract names no kind; libibverbs
/// reads sysfs (no such file, `ENOENT`) or the kernel answers `EINVAL`, so `InvalidArgument`
/// and `NotFound` are accepted.
pub fn query_pkey_beyond_table_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let len = ctx.query_port(1)?.pkey_tbl_len;
    let kinds = [ErrorKind::InvalidArgument, ErrorKind::NotFound];
    expect_err(
        ctx.query_pkey(1, len),
        &kinds,
        "query_pkey(1, pkey_tbl_len)",
    )?;
    expect_err(ctx.query_pkey(1, u16::MAX), &kinds, "query_pkey(1, 65535)")?;
    expect_err(ctx.query_pkey(0, 0), &kinds, "query_pkey(0, 0)")?;
    Ok(())
}

/// A QP's endpoint carries its QPN, the given PSN and the GID at port 1 index 0; a PSN that is
/// not 24-bit is `InvalidArgument`.
pub fn endpoint_matches_port_gid<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp()?;
    let ep = t.qp.endpoint(0x00_1234)?;
    check_eq!(ep.qpn, t.qpn(), "endpoint qpn");
    check_eq!(ep.psn, 0x00_1234, "endpoint psn");
    check_eq!(ep.gid, fx.ctx.query_gid(1, 0)?, "endpoint gid");
    expect_kind(
        t.qp.endpoint(MAX_24BIT + 1),
        ErrorKind::InvalidArgument,
        "endpoint(2^24)",
    )
}
