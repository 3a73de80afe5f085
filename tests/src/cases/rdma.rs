//! Checklist item 5, second part: RDMA WRITE (± immediate) and RDMA READ between two connected
//! RC QPs (pyverbs `test_qpex.py` write/read cases), rc-transport.md §1.7, §2.4, §3.1, §4.2,
//! §4.4, §6.2: sizes up to 1 MiB, zero length (whose R_Key is not validated, C9-88),
//! scatter/gather, inline data, immediate data consuming a receive, RNR on a WRITE with
//! immediate, MR bounds, and completion order of a long mixed send queue.

use verbs_api::{
    CompletionChannel, CompletionQueue, Context, MemoryRegion, Mtu, QpState, QueuePair, RecvWr,
    SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};

use crate::check::{Outcome, Stop, failure};
use crate::check_eq;
use crate::fixture::{
    Env, Pair, WAIT, check_bytes, check_recv, check_success, expect_error_then_flush,
    expect_nothing_for_a_while, pattern, poll_exact,
};

/// A 64-byte RDMA WRITE lands at the target offset; the send WC is `RDMA_WRITE`/64; the
/// responder sees no completion and the bytes around the target are untouched.
pub fn write_small<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    let data = pattern(1, 64);
    p.a.fill(0, &data)?;
    let sge = [p.a.sge(0, 64)?];
    p.a.qp
        .post_send(&[SendWr::new(1, p.b.write_op(512), &sge)])?;
    p.a.expect_send(1, WcOpcode::RdmaWrite, 64)?;
    check_bytes(&p.b.bytes(512, 64)?, &data, "written bytes")?;
    check_bytes(&p.b.bytes(448, 64)?, &[0; 64], "bytes before the target")?;
    check_bytes(&p.b.bytes(576, 64)?, &[0; 64], "bytes after the target")?;
    p.b.expect_no_completions()
}

/// One 1 MiB RDMA WRITE (1024 packets at MTU 1024, more than rxe's 128 un-ACKed PSNs,
/// §2.11) arrives whole; its send WC reports 1048576 bytes.
pub fn write_large_1mib<C: Context>(env: &Env<C>) -> Outcome {
    const LEN: usize = 1 << 20;
    let p = Pair::with(env, |c| {
        c.mr_len = LEN + 4096;
        c.both(|o| o.path_mtu = Mtu::Mtu1024);
    })?;
    let max_msg = p.a.ctx.query_port(1)?.max_msg_sz;
    if (max_msg as usize) < LEN {
        return Err(Stop::Skip(format!("port max_msg_sz {max_msg} < 1 MiB")));
    }
    let data = pattern(2, LEN);
    p.a.fill(0, &data)?;
    let sge = [p.a.sge(0, LEN)?];
    p.a.qp
        .post_send(&[SendWr::new(1, p.b.write_op(4096), &sge)])?;
    p.a.expect_send(1, WcOpcode::RdmaWrite, LEN as u32)?;
    check_bytes(&p.b.bytes(4096, LEN)?, &data, "1 MiB WRITE")?;
    check_bytes(&p.b.bytes(0, 4096)?, &[0; 4096], "bytes before the target")
}

/// A zero-length RDMA WRITE succeeds (`RDMA_WRITE`, `byte_len` 0) and changes nothing; the QP
/// stays usable.
pub fn write_zero_length<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    p.b.fill(0, &[0xCC; 64])?;
    p.a.qp.post_send(&[SendWr::new(1, p.b.write_op(0), &[])])?;
    p.a.expect_send(1, WcOpcode::RdmaWrite, 0)?;
    check_bytes(
        &p.b.bytes(0, 64)?,
        &[0xCC; 64],
        "target of a zero-length WRITE",
    )?;
    p.b.expect_no_completions()?;
    let sge = [p.a.sge(0, 8)?];
    p.a.qp.post_send(&[SendWr::new(2, p.b.write_op(0), &sge)])?;
    p.a.expect_send(2, WcOpcode::RdmaWrite, 8)?;
    Ok(())
}

fn need_send_sges<C: Context>(p: &Pair<C>, n: u32) -> Outcome {
    let have = p.a.qp.query()?.cap.max_send_sge;
    if have < n {
        return Err(Stop::Skip(format!(
            "{n} send SGEs needed; the QP allows {have}"
        )));
    }
    Ok(())
}

/// Three local regions: 100, 1 and 1900 bytes at offsets 0, 1000, 2000, filled with distinct
/// patterns; returns their SGEs and their concatenation.
fn three_regions<C: Context>(p: &Pair<C>, fill: bool) -> Result<(Vec<Sge>, Vec<u8>), Stop> {
    let parts = [(0usize, 100usize), (1000, 1), (2000, 1900)];
    let mut msg = Vec::new();
    let mut sges = Vec::new();
    for (i, &(off, len)) in parts.iter().enumerate() {
        let chunk = pattern(20 + i as u8, len);
        if fill {
            p.a.fill(off, &chunk)?;
        }
        msg.extend_from_slice(&chunk);
        sges.push(p.a.sge(off, len)?);
    }
    Ok((sges, msg))
}

/// An RDMA WRITE gathered from 3 SGEs writes their concatenation (2001 bytes, two packets)
/// contiguously at the target.
pub fn write_gather_three_sges<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    need_send_sges(&p, 3)?;
    let (sges, msg) = three_regions(&p, true)?;
    p.a.qp
        .post_send(&[SendWr::new(1, p.b.write_op(8192), &sges)])?;
    p.a.expect_send(1, WcOpcode::RdmaWrite, 2001)?;
    check_bytes(&p.b.bytes(8192, 2001)?, &msg, "gathered WRITE")?;
    check_bytes(&p.b.bytes(8192 + 2001, 64)?, &[0; 64], "past the WRITE")
}

/// An inline RDMA WRITE is copied at post time (§3.2): overwriting the caller's buffer after
/// `post_send` returns does not change what lands.
pub fn write_inline_copied_at_post<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    let max = p.a.qp.query()?.cap.max_inline_data as usize;
    if max < 40 {
        return Err(Stop::Skip(format!("max_inline_data {max} < 40")));
    }
    let want = pattern(8, 40);
    let mut buf = want.clone();
    p.a.qp
        .post_send(&[SendWr::inline(1, p.b.write_op(100), &buf)])?;
    buf.fill(0xEE);
    p.a.expect_send(1, WcOpcode::RdmaWrite, 40)?;
    check_bytes(&p.b.bytes(100, 40)?, &want, "inline WRITE")
}

/// RDMA WRITE with immediate (§4.2): the data lands at the RETH target, a receive is consumed
/// with `RECV_RDMA_WITH_IMM`, `byte_len` = the WRITE's length and the immediate; the receive
/// WR's own buffer is not used (one with a buffer, one without SGEs). The send WC is
/// `RDMA_WRITE` (its `wc_flags` unchecked, DIVERGENCES.md #7).
pub fn write_with_imm<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    let data = pattern(9, 3000);
    p.a.fill(0, &data)?;
    p.b.fill(16384, &[0xCC; 64])?;
    p.b.post_recv_at(10, 16384, 64)?;
    p.b.qp.post_recv(&[RecvWr::new(11, &[])])?;
    let (s1, s2) = ([p.a.sge(0, 300)?], [p.a.sge(0, 3000)?]);
    let (imm1, imm2) = (0xDEAD_BEEF, 7);
    p.a.qp.post_send(&[
        SendWr::new(1, p.b.write_imm_op(256, imm1), &s1),
        SendWr::new(2, p.b.write_imm_op(4096, imm2), &s2),
    ])?;
    let sent = poll_exact(&p.a.send_cq, 2)?;
    check_success(&sent[0], 1, WcOpcode::RdmaWrite, 300, p.a.qpn())?;
    check_success(&sent[1], 2, WcOpcode::RdmaWrite, 3000, p.a.qpn())?;
    let got = poll_exact(&p.b.recv_cq, 2)?;
    let (bq, aq) = (p.b.qpn(), p.a.qpn());
    check_recv(
        &got[0],
        10,
        WcOpcode::RecvRdmaWithImm,
        300,
        Some(imm1),
        bq,
        aq,
    )?;
    check_recv(
        &got[1],
        11,
        WcOpcode::RecvRdmaWithImm,
        3000,
        Some(imm2),
        bq,
        aq,
    )?;
    check_bytes(&p.b.bytes(256, 300)?, &data[..300], "first WRITE_WITH_IMM")?;
    check_bytes(&p.b.bytes(4096, 3000)?, &data, "second WRITE_WITH_IMM")?;
    check_bytes(
        &p.b.bytes(16384, 64)?,
        &[0xCC; 64],
        "the receive WR's buffer",
    )
}

/// A zero-length RDMA WRITE with immediate still consumes a receive: `RECV_RDMA_WITH_IMM`,
/// `byte_len` 0, the immediate.
pub fn write_with_imm_zero_length<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    p.b.qp.post_recv(&[RecvWr::new(10, &[])])?;
    p.a.qp
        .post_send(&[SendWr::new(1, p.b.write_imm_op(0, 0x55), &[])])?;
    p.a.expect_send(1, WcOpcode::RdmaWrite, 0)?;
    p.b.expect_recv(&p.a, 10, WcOpcode::RecvRdmaWithImm, 0, Some(0x55))?;
    Ok(())
}

/// `SOLICITED` on an RDMA WRITE with immediate fires the receiver's solicited-only arm (§3.2);
/// a plain RDMA WRITE raises nothing (no receive completion at all).
pub fn write_imm_solicited_fires_solicited_arm<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::with(env, |c| c.recv_channel = true)?;
    let ch =
        p.b.channel
            .as_ref()
            .ok_or_else(|| failure("pair built without a channel"))?;
    p.b.recv_cq.req_notify(true)?;
    p.b.qp.post_recv(&[RecvWr::new(10, &[])])?;
    let sge = [p.a.sge(0, 16)?];
    p.a.qp.post_send(&[SendWr::new(1, p.b.write_op(0), &sge)])?;
    p.a.expect_send(1, WcOpcode::RdmaWrite, 16)?;
    check_eq!(ch.get_cq_event()?, None, "event after a plain WRITE");
    let wr = SendWr::new(2, p.b.write_imm_op(64, 0xABCD), &sge)
        .with_flags(SendFlags::SIGNALED | SendFlags::SOLICITED);
    p.a.qp.post_send(&[wr])?;
    check_eq!(
        ch.wait_cq_event(Some(WAIT))?,
        Some(p.b.recv_cq.handle()),
        "event for the solicited WRITE_WITH_IMM"
    );
    p.b.recv_cq.ack_events(1);
    p.a.expect_send(2, WcOpcode::RdmaWrite, 16)?;
    p.b.expect_recv(&p.a, 10, WcOpcode::RecvRdmaWithImm, 16, Some(0xABCD))?;
    Ok(())
}

/// An RDMA WRITE with immediate to a QP without a posted receive is RNR-NAKed (§4.2; for a
/// multi-packet WRITE at its LAST packet, §1.3); with `rnr_retry` 7 (infinite) the requester
/// keeps retrying, stays in RTS, and completes once a receive is posted: data,
/// `RECV_RDMA_WITH_IMM`, the immediate. Run for 100 bytes (one packet) and 3000 (three).
pub fn write_with_imm_waits_for_recv<C: Context>(env: &Env<C>) -> Outcome {
    for len in [100usize, 3000] {
        let p = Pair::with(env, |c| {
            c.both(|o| {
                o.rnr_retry = 7;
                o.min_rnr_timer = 1;
                o.path_mtu = Mtu::Mtu1024;
            });
        })?;
        let data = pattern(11, len);
        p.a.fill(0, &data)?;
        let sge = [p.a.sge(0, len)?];
        p.a.qp
            .post_send(&[SendWr::new(1, p.b.write_imm_op(64, 0x77), &sge)])?;
        expect_nothing_for_a_while(&p.a.send_cq, "WRITE_WITH_IMM without a receive")?;
        check_eq!(
            p.a.state()?,
            QpState::Rts,
            "requester during RNR ({len} bytes)"
        );
        p.b.qp.post_recv(&[RecvWr::new(10, &[])])?;
        p.a.expect_send(1, WcOpcode::RdmaWrite, len as u32)?;
        p.b.expect_recv(&p.a, 10, WcOpcode::RecvRdmaWithImm, len as u32, Some(0x77))?;
        check_bytes(&p.b.bytes(64, len)?, &data, "WRITE_WITH_IMM after RNR")?;
    }
    Ok(())
}

/// A 64-byte RDMA READ copies the peer's bytes into the local buffer; the send WC is
/// `RDMA_READ` with `byte_len` 64 (the man page defines it for READ); the peer sees nothing.
pub fn read_small<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    let data = pattern(12, 64);
    p.b.fill(100, &data)?;
    let dst = [p.a.sge(4096, 64)?];
    p.a.qp
        .post_send(&[SendWr::new(1, p.b.read_op(100), &dst)])?;
    p.a.expect_send(1, WcOpcode::RdmaRead, 64)?;
    check_bytes(&p.a.bytes(4096, 64)?, &data, "read bytes")?;
    check_bytes(&p.a.bytes(4096 + 64, 64)?, &[0; 64], "past the READ")?;
    p.b.expect_no_completions()
}

/// A 5000-byte RDMA READ at MTU 1024 (five response packets, five PSNs, §2.4) arrives whole;
/// a SEND posted after it still works (the PSNs of both sides stayed in step).
pub fn read_multi_packet<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::with(env, |c| c.both(|o| o.path_mtu = Mtu::Mtu1024))?;
    let data = pattern(13, 5000);
    p.b.fill(8192, &data)?;
    let dst = [p.a.sge(0, 5000)?];
    p.a.qp
        .post_send(&[SendWr::new(1, p.b.read_op(8192), &dst)])?;
    p.a.expect_send(1, WcOpcode::RdmaRead, 5000)?;
    check_bytes(&p.a.bytes(0, 5000)?, &data, "5000-byte READ")?;
    p.b.post_recv_at(10, 0, 64)?;
    let sge = [p.a.sge(0, 8)?];
    p.a.qp.post_send(&[SendWr::new(2, SendOp::Send, &sge)])?;
    p.a.expect_send(2, WcOpcode::Send, 8)?;
    p.b.expect_recv(&p.a, 10, WcOpcode::Recv, 8, None)?;
    Ok(())
}

/// An RDMA READ of 2001 bytes scattered into 3 local SGEs (100, 1, 1900 bytes) fills each in
/// order.
pub fn read_scatter_three_sges<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    need_send_sges(&p, 3)?;
    let (sges, msg) = three_regions(&p, false)?;
    p.b.fill(8192, &msg)?;
    p.a.qp
        .post_send(&[SendWr::new(1, p.b.read_op(8192), &sges)])?;
    p.a.expect_send(1, WcOpcode::RdmaRead, 2001)?;
    check_bytes(&p.a.bytes(0, 100)?, &msg[..100], "SGE 0")?;
    check_bytes(&p.a.bytes(1000, 1)?, &msg[100..101], "SGE 1")?;
    check_bytes(&p.a.bytes(2000, 1900)?, &msg[101..], "SGE 2")?;
    check_bytes(&p.a.bytes(100, 900)?, &[0; 900], "between SGE 0 and 1")
}

/// A zero-length RDMA READ succeeds (`RDMA_READ`, `byte_len` 0; one PSN, §2.4), and the QP
/// stays usable.
pub fn read_zero_length<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    p.a.qp.post_send(&[SendWr::new(1, p.b.read_op(0), &[])])?;
    p.a.expect_send(1, WcOpcode::RdmaRead, 0)?;
    p.b.fill(0, &[0x42; 8])?;
    let dst = [p.a.sge(0, 8)?];
    p.a.qp.post_send(&[SendWr::new(2, p.b.read_op(0), &dst)])?;
    p.a.expect_send(2, WcOpcode::RdmaRead, 8)?;
    check_bytes(
        &p.a.bytes(0, 8)?,
        &[0x42; 8],
        "READ after a zero-length READ",
    )
}

/// With `max_rd_atomic` 1, eight RDMA READs posted at once wait for each other's slot (§3.4)
/// and a WRITE posted behind them waits too (in-order issue): all complete successfully, in
/// posting order, with the right data.
pub fn reads_beyond_max_rd_atomic_wait<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::with(env, |c| c.both(|o| o.max_rd_atomic = 1))?;
    let mut dsts = Vec::new();
    for i in 0..8usize {
        p.b.fill(i * 256, &pattern(i as u8, 200))?;
        dsts.push(p.a.sge(i * 256, 200)?);
    }
    let mut wrs: Vec<SendWr<'_>> = dsts
        .iter()
        .enumerate()
        .map(|(i, d)| SendWr::new(i as u64, p.b.read_op(i * 256), std::slice::from_ref(d)))
        .collect();
    let src = [p.a.sge(0, 16)?];
    wrs.push(SendWr::new(8, p.b.write_op(8192), &src));
    p.a.qp.post_send(&wrs)?;
    let wcs = poll_exact(&p.a.send_cq, 9)?;
    for (i, wc) in wcs.iter().take(8).enumerate() {
        check_success(wc, i as u64, WcOpcode::RdmaRead, 200, p.a.qpn())?;
        check_bytes(
            &p.a.bytes(i * 256, 200)?,
            &pattern(i as u8, 200),
            &format!("READ {i}"),
        )?;
    }
    check_success(&wcs[8], 8, WcOpcode::RdmaWrite, 16, p.a.qpn())?;
    check_bytes(
        &p.b.bytes(8192, 16)?,
        &pattern(0, 16),
        "WRITE behind the READs",
    )
}

/// Zero-length RDMA WRITE and READ are not R_Key- or VA-checked (C9-88, §1.7): with rkey and
/// address 0 both succeed and the QPs stay in RTS.
pub fn zero_length_rdma_rkey_unchecked<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    let write = SendOp::RdmaWrite {
        remote_addr: 0,
        rkey: 0,
    };
    let read = SendOp::RdmaRead {
        remote_addr: 0,
        rkey: 0,
    };
    p.a.qp
        .post_send(&[SendWr::new(1, write, &[]), SendWr::new(2, read, &[])])?;
    let wcs = poll_exact(&p.a.send_cq, 2)?;
    check_success(&wcs[0], 1, WcOpcode::RdmaWrite, 0, p.a.qpn())?;
    check_success(&wcs[1], 2, WcOpcode::RdmaRead, 0, p.a.qpn())?;
    check_eq!(p.a.state()?, QpState::Rts, "requester");
    check_eq!(p.b.state()?, QpState::Rts, "responder");
    Ok(())
}

/// RDMA at the edges of the peer's MR (§4.4: [VA, VA+len) inside the region): covering the
/// whole MR and its last byte succeed; one byte past the end is `REM_ACCESS_ERR`, and so (on
/// a second pair) is one byte before the start. `read` selects READ instead of WRITE.
fn mr_edges<C: Context>(env: &Env<C>, read: bool) -> Outcome {
    let (op, opcode): (fn(u64, u32) -> SendOp, _) = if read {
        (
            |remote_addr, rkey| SendOp::RdmaRead { remote_addr, rkey },
            WcOpcode::RdmaRead,
        )
    } else {
        (
            |remote_addr, rkey| SendOp::RdmaWrite { remote_addr, rkey },
            WcOpcode::RdmaWrite,
        )
    };
    let p = Pair::with(env, |c| c.mr_len = 8192)?;
    let len = p.config.mr_len;
    let (end, rkey) = (p.b.addr(len), p.b.mr.rkey());
    let whole = [p.a.sge(0, len)?];
    let one = [p.a.sge(0, 1)?];
    let two = [p.a.sge(0, 2)?];
    p.a.qp.post_send(&[
        SendWr::new(1, op(p.b.addr(0), rkey), &whole),
        SendWr::new(2, op(end - 1, rkey), &one),
    ])?;
    let wcs = poll_exact(&p.a.send_cq, 2)?;
    check_success(&wcs[0], 1, opcode, len as u32, p.a.qpn())?;
    check_success(&wcs[1], 2, opcode, 1, p.a.qpn())?;
    p.a.qp
        .post_send(&[SendWr::new(3, op(end - 1, rkey), &two)])?;
    expect_error_then_flush(&p.a.send_cq, p.a.qpn(), 3, WcStatus::RemAccessErr, &[])?;

    let q = Pair::with(env, |c| c.mr_len = 8192)?;
    let before = q.b.addr(0) - 1;
    let two = [q.a.sge(0, 2)?];
    q.a.qp
        .post_send(&[SendWr::new(4, op(before, q.b.mr.rkey()), &two)])?;
    expect_error_then_flush(&q.a.send_cq, q.a.qpn(), 4, WcStatus::RemAccessErr, &[])
}

/// RDMA WRITE at the MR's edges: the whole MR and its last byte are writable; two bytes from
/// the last one, or one byte before the start, are `REM_ACCESS_ERR`.
pub fn write_mr_edges<C: Context>(env: &Env<C>) -> Outcome {
    mr_edges(env, false)
}

/// RDMA READ at the MR's edges: the whole MR and its last byte are readable; two bytes from
/// the last one, or one byte before the start, are `REM_ACCESS_ERR`.
pub fn read_mr_edges<C: Context>(env: &Env<C>) -> Outcome {
    mr_edges(env, true)
}

/// 100 WRs posted in one call, cycling SEND, RDMA WRITE and RDMA READ of 32 bytes each,
/// complete on the send CQ in posting order (RC ordering, §3.3), all successfully with the
/// right opcode; the receives complete in order and every transfer's data is right.
pub fn mixed_ops_complete_in_order<C: Context>(env: &Env<C>) -> Outcome {
    const N: usize = 100;
    let dev = env.open(0)?.query_device()?;
    if (dev.max_qp_wr as usize) < N || dev.max_cqe < 256 {
        return Err(Stop::Skip(format!(
            "needs {N} WRs per queue and 256 CQEs; max_qp_wr {}, max_cqe {}",
            dev.max_qp_wr, dev.max_cqe
        )));
    }
    let p = Pair::with(env, |c| {
        c.cap.max_send_wr = N as u32;
        c.cap.max_recv_wr = N as u32;
        c.cqe = 256;
    })?;
    let mut sges = Vec::with_capacity(N);
    let mut ops = Vec::with_capacity(N);
    let mut recvs = 0u64;
    for i in 0..N {
        let data = pattern(i as u8, 32);
        let (op, sge) = match i % 3 {
            0 => {
                p.a.fill(i * 64, &data)?;
                p.b.post_recv_at(1000 + recvs, i * 64, 64)?;
                recvs += 1;
                (SendOp::Send, p.a.sge(i * 64, 32)?)
            }
            1 => {
                p.a.fill(i * 64, &data)?;
                (p.b.write_op(16384 + i * 64), p.a.sge(i * 64, 32)?)
            }
            _ => {
                p.b.fill(32768 + i * 64, &data)?;
                (p.b.read_op(32768 + i * 64), p.a.sge(16384 + i * 64, 32)?)
            }
        };
        ops.push(op);
        sges.push(sge);
    }
    let wrs: Vec<SendWr<'_>> = ops
        .iter()
        .zip(&sges)
        .enumerate()
        .map(|(i, (op, sge))| SendWr::new(i as u64, *op, std::slice::from_ref(sge)))
        .collect();
    p.a.qp.post_send(&wrs)?;
    let wcs = poll_exact(&p.a.send_cq, N)?;
    for (i, wc) in wcs.iter().enumerate() {
        let opcode = [WcOpcode::Send, WcOpcode::RdmaWrite, WcOpcode::RdmaRead][i % 3];
        check_success(wc, i as u64, opcode, 32, p.a.qpn())?;
    }
    let got = poll_exact(&p.b.recv_cq, recvs as usize)?;
    for (k, wc) in got.iter().enumerate() {
        check_recv(
            wc,
            1000 + k as u64,
            WcOpcode::Recv,
            32,
            None,
            p.b.qpn(),
            p.a.qpn(),
        )?;
    }
    for i in 0..N {
        let want = pattern(i as u8, 32);
        let got = match i % 3 {
            0 => p.b.bytes(i * 64, 32)?,
            1 => p.b.bytes(16384 + i * 64, 32)?,
            _ => p.a.bytes(16384 + i * 64, 32)?,
        };
        check_bytes(&got, &want, &format!("WR {i}"))?;
    }
    Ok(())
}
