//! `softverbs demo`: two devices, one RC QP on each, connected RESET → RTS, their attributes
//! printed, then an RDMA WRITE and a SEND with immediate data whose completions and delivered
//! bytes are printed. Written against `verbs_api::Context` only, so it runs on any backend.

use std::io::{self, Write};

use verbs_api::{
    CompletionQueue, Context, Error, ErrorKind, MemoryRegion, QpCap, QpInitAttr, QueuePair,
    RcConnectOptions, RecvWr, Result, SendOp, SendWr, WorkCompletion, connect_rc,
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
    let (_pd_a, cq_a, qp_a, mr_a) = side(a)?;
    let (_pd_b, cq_b, qp_b, mr_b) = side(b)?;
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

    // Data path: WRITE "hello, RDMA" into b's MR, then SEND it back with immediate data.
    let msg = b"hello, RDMA";
    mr_a.write(0, msg)?;
    let src = [mr_a.sge(0, msg.len())?];
    let write = SendOp::RdmaWrite {
        remote_addr: mr_b.addr() + 1024,
        rkey: mr_b.rkey(),
    };
    qp_a.post_send(&[SendWr::new(1, write, &src)])
        .map_err(|e| e.error)?;
    report(out, &a.device_name(), &wait(&cq_a)?)?;
    let recv = [mr_a.sge(2048, 64)?];
    qp_a.post_recv(&[RecvWr::new(2, &recv)])
        .map_err(|e| e.error)?;
    let back = [mr_b.sge(1024, msg.len())?];
    qp_b.post_send(&[SendWr::new(3, SendOp::SendWithImm { imm: 0x5eed }, &back)])
        .map_err(|e| e.error)?;
    report(out, &b.device_name(), &wait(&cq_b)?)?;
    report(out, &a.device_name(), &wait(&cq_a)?)?;
    let mut got = vec![0u8; msg.len()];
    mr_a.read(2048, &mut got)?;
    writeln!(
        out,
        "{} received: {:?}",
        a.device_name(),
        String::from_utf8_lossy(&got)
    )
    .map_err(io)?;
    Ok(())
}

/// Polls `cq` until one completion arrives (bounded).
fn wait<Q: CompletionQueue>(cq: &Q) -> Result<WorkCompletion> {
    let mut wc = [WorkCompletion::default()];
    for _ in 0..100_000 {
        if cq.poll(&mut wc)? == 1 {
            return Ok(wc[0]);
        }
        std::thread::yield_now();
    }
    Err(Error::new(ErrorKind::Io, "no completion arrived"))
}

fn report(out: &mut dyn Write, dev: &str, wc: &WorkCompletion) -> Result<()> {
    writeln!(
        out,
        "{dev} completion: wr_id={} status={} opcode={} byte_len={} imm={:#x}",
        wc.wr_id,
        wc.status,
        wc.opcode.name(),
        wc.byte_len,
        wc.imm_data
    )
    .map_err(|e| Error::new(ErrorKind::Io, e.to_string()))
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
        assert_eq!(text.matches("status=IBV_WC_SUCCESS").count(), 3, "{text}");
        assert!(text.contains("received: \"hello, RDMA\""), "{text}");
    }
}
