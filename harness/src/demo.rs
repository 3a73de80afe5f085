//! `softverbs demo`: two emulated devices, one RC QP on each, connected RESET → RTS, with their
//! attributes printed. Written against `verbs_api::Context` only, so it runs on any backend.

use std::io::{self, Write};

use verbs_api::{
    Context, Error, ErrorKind, MemoryRegion, QpCap, QpInitAttr, QueuePair, RcConnectOptions,
    Result, connect_rc,
};

/// Connects a QP on `a` with a QP on `b` and writes a report to `out`.
///
/// Errors: any verbs error, or `Io` if `out` fails.
pub fn run<C: Context>(a: &C, b: &C, out: &mut dyn Write) -> Result<()> {
    let io = |e: io::Error| Error::new(ErrorKind::Io, e.to_string());
    let cap = QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    };
    let side = |ctx: &C| -> Result<_> {
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(128, None)?;
        let qp = ctx.create_qp(&pd, &cq, &cq, None, &QpInitAttr::rc(cap))?;
        let mr = ctx.alloc_mr(&pd, 4096, RcConnectOptions::default().access)?;
        Ok((pd, cq, qp, mr))
    };
    let (_pd_a, _cq_a, qp_a, mr_a) = side(a)?;
    let (_pd_b, _cq_b, qp_b, mr_b) = side(b)?;
    let (psn_a, psn_b) = (0x00_1000, 0x00_2000);
    let ep_a = qp_a.endpoint(psn_a)?;
    let ep_b = qp_b.endpoint(psn_b)?;
    writeln!(out, "device {}: {}", a.device_name(), ep_a).map_err(io)?;
    writeln!(out, "device {}: {}", b.device_name(), ep_b).map_err(io)?;
    let opts = RcConnectOptions::default();
    connect_rc(&qp_a, psn_a, &ep_b, &opts)?;
    connect_rc(&qp_b, psn_b, &ep_a, &opts)?;
    for (name, qp, mr) in [
        (a.device_name(), &qp_a, &mr_a),
        (b.device_name(), &qp_b, &mr_b),
    ] {
        let attr = qp.query()?;
        writeln!(
            out,
            "{name} qp {:#08x}: state={} dest_qp={:#08x} sq_psn={:#08x} rq_psn={:#08x} \
             path_mtu={} timeout={} retry_cnt={} rnr_retry={} min_rnr_timer={} \
             max_rd_atomic={} max_dest_rd_atomic={} access={:?}",
            qp.qp_num(),
            attr.qp_state,
            attr.dest_qp_num,
            attr.sq_psn,
            attr.rq_psn,
            attr.path_mtu.bytes(),
            attr.timeout,
            attr.retry_cnt,
            attr.rnr_retry,
            attr.min_rnr_timer,
            attr.max_rd_atomic,
            attr.max_dest_rd_atomic,
            attr.qp_access_flags,
        )
        .map_err(io)?;
        writeln!(
            out,
            "{name} mr: addr={:#x} len={} lkey={:#010x} rkey={:#010x}",
            mr.addr(),
            mr.len(),
            mr.lkey(),
            mr.rkey()
        )
        .map_err(io)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use verbs_api::{Device, Provider};

    #[test]
    fn demo_connects_two_emulated_devices() {
        let sim = emu_sim::SimProvider::builder().devices(2).build().unwrap();
        let devs = sim.devices().unwrap();
        let (a, b) = (devs[0].open().unwrap(), devs[1].open().unwrap());
        let mut out = Vec::new();
        super::run(&a, &b, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.matches("state=RTS").count(), 2, "{text}");
    }
}
