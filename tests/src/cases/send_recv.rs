//! Checklist item 5, first part: SEND/RECV between two connected RC QPs (pyverbs
//! `test_qpex.py` RC send cases, `test_srq.py`), rc-transport.md §3.1–§3.2, §4.2–§4.3, §6.2:
//! sizes across packet boundaries, zero length, scatter/gather, inline data, immediate data,
//! solicited events, unsignaled sends, ordering, receive length errors and SRQs.
//!
//! Receives are posted before the matching sends, so no case depends on RNR timing.

use verbs_api::{
    AsyncEventKind, CompletionChannel, CompletionQueue, Context, EventElement, Mtu, QpState,
    QueuePair, RecvWr, SendFlags, SendOp, SendWr, SharedReceiveQueue, SrqAttr, WcOpcode, WcStatus,
};

use crate::check::{Outcome, Stop, failure, needs};
use crate::fixture::{
    Env, Pair, Side, WAIT, check_bytes, check_recv, check_success, expect_error_then_flush,
    pattern, poll_exact, wait_async,
};
use crate::{check_eq, ensure, fail};

/// SENDs `len` bytes of `pattern(wr_id)` from offset 0 of `from`'s MR as WR `wr_id` into a
/// receive (WR `wr_id + 1000`) of `room` bytes at offset `at` of `to`; checks both completions
/// and the data.
fn send_one<C: Context>(
    from: &Side<C>,
    to: &Side<C>,
    wr_id: u64,
    len: usize,
    room: usize,
    at: usize,
) -> Outcome {
    let data = pattern(wr_id as u8, len);
    from.fill(0, &data)?;
    to.post_recv_at(wr_id + 1000, at, room)?;
    let sge = [from.sge(0, len)?];
    from.qp
        .post_send(&[SendWr::new(wr_id, SendOp::Send, &sge)])?;
    from.expect_send(wr_id, WcOpcode::Send, len as u32)?;
    to.expect_recv(from, wr_id + 1000, WcOpcode::Recv, len as u32, None)?;
    check_bytes(&to.bytes(at, len)?, &data, &format!("{len}-byte SEND"))
}

/// A 64-byte SEND into a 256-byte receive: send WC `SEND`/64, receive WC `RECV`/64 without
/// immediate, the bytes placed at the receive buffer.
pub fn send_small<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    send_one(&p.a, &p.b, 1, 64, 256, 4096)?;
    p.b.expect_no_completions()?;
    p.a.expect_no_completions()
}

/// A 5000-byte SEND at path MTU 1024 (five packets: FIRST, 3 × MIDDLE, LAST, §3.1) arrives
/// whole and in order.
pub fn send_multi_packet<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::with(env, |c| c.both(|o| o.path_mtu = Mtu::Mtu1024))?;
    send_one(&p.a, &p.b, 1, 5000, 8192, 8192)
}

/// SENDs of 1, 1023, 1024, 1025, 2047, 2048 and 2049 bytes at path MTU 1024 (ONLY, ONLY at
/// the boundary, FIRST+LAST, …) each arrive whole, in both directions.
pub fn send_mtu_boundaries<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::with(env, |c| c.both(|o| o.path_mtu = Mtu::Mtu1024))?;
    for (i, len) in [1usize, 1023, 1024, 1025, 2047, 2048, 2049]
        .into_iter()
        .enumerate()
    {
        let id = i as u64 + 1;
        send_one(&p.a, &p.b, id, len, 4096, 8192)?;
        send_one(&p.b, &p.a, id + 100, len, 4096, 8192)?;
    }
    Ok(())
}

/// A SEND without SGEs (one SEND_ONLY packet, §3.1) consumes a receive: `RECV` with
/// `byte_len` 0; the receive buffer is untouched.
pub fn send_zero_length<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    p.b.fill(0, &[0xCC; 64])?;
    p.b.post_recv_at(10, 0, 64)?;
    p.a.qp.post_send(&[SendWr::new(1, SendOp::Send, &[])])?;
    p.a.expect_send(1, WcOpcode::Send, 0)?;
    p.b.expect_recv(&p.a, 10, WcOpcode::Recv, 0, None)?;
    check_bytes(&p.b.bytes(0, 64)?, &[0xCC; 64], "receive buffer")
}

/// SEND_WITH_IMM, in one packet and in three (the immediate rides on the LAST packet, §3.1):
/// the receive WC is `RECV` (not `RECV_RDMA_WITH_IMM`) with `WITH_IMM` and the posted
/// immediate verbatim; the send WC is `SEND` (§6.2). The send WC's `wc_flags` are not
/// checked: rxe and mlx5 set `WITH_IMM` there, softverbs does not (DIVERGENCES.md #7).
pub fn send_with_imm<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::with(env, |c| c.both(|o| o.path_mtu = Mtu::Mtu1024))?;
    for (id, len, imm) in [(1u64, 32usize, 0x1234_5678u32), (2, 3000, 0x8000_0001)] {
        let data = pattern(id as u8, len);
        p.a.fill(0, &data)?;
        p.b.post_recv_at(10 + id, 8192, 4096)?;
        let sge = [p.a.sge(0, len)?];
        p.a.qp
            .post_send(&[SendWr::new(id, SendOp::SendWithImm { imm }, &sge)])?;
        p.a.expect_send(id, WcOpcode::Send, len as u32)?;
        p.b.expect_recv(&p.a, 10 + id, WcOpcode::Recv, len as u32, Some(imm))?;
        check_bytes(&p.b.bytes(8192, len)?, &data, "SEND_WITH_IMM payload")?;
    }
    Ok(())
}

/// A zero-length SEND_WITH_IMM delivers only the immediate: `RECV`, `byte_len` 0, `WITH_IMM`.
pub fn send_with_imm_zero_length<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    p.b.post_recv_at(10, 0, 64)?;
    let imm = 0xFFFF_0001;
    p.a.qp
        .post_send(&[SendWr::new(1, SendOp::SendWithImm { imm }, &[])])?;
    p.a.expect_send(1, WcOpcode::Send, 0)?;
    p.b.expect_recv(&p.a, 10, WcOpcode::Recv, 0, Some(imm))?;
    Ok(())
}

fn need_sges<C: Context>(p: &Pair<C>, n: u32) -> Outcome {
    let cap = p.a.qp.query()?.cap;
    let peer = p.b.qp.query()?.cap;
    if cap.max_send_sge.min(peer.max_recv_sge) < n {
        return Err(Stop::Skip(format!(
            "{n} SGEs needed; the QPs allow {} send / {} receive",
            cap.max_send_sge, peer.max_recv_sge
        )));
    }
    Ok(())
}

/// A SEND gathered from 3 SGEs (100, 1 and 1900 bytes, scattered in the MR) is scattered into
/// a receive of 3 SGEs (700, 300, 4000 bytes): each receive SGE is filled in order, `byte_len`
/// is 2001, bytes past the message are untouched.
pub fn send_gather_scatter_three_sges<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    need_sges(&p, 3)?;
    let parts = [(0usize, 100usize), (1000, 1), (2000, 1900)];
    let mut msg = Vec::new();
    for (i, &(off, len)) in parts.iter().enumerate() {
        let chunk = pattern(10 + i as u8, len);
        p.a.fill(off, &chunk)?;
        msg.extend_from_slice(&chunk);
    }
    let gather = parts
        .iter()
        .map(|&(off, len)| p.a.sge(off, len))
        .collect::<Result<Vec<_>, _>>()?;
    let slots = [(0usize, 700usize), (8192, 300), (16384, 4000)];
    let scatter = slots
        .iter()
        .map(|&(off, len)| p.b.sge(off, len))
        .collect::<Result<Vec<_>, _>>()?;
    p.b.qp.post_recv(&[RecvWr::new(10, &scatter)])?;
    p.a.qp.post_send(&[SendWr::new(1, SendOp::Send, &gather)])?;
    p.a.expect_send(1, WcOpcode::Send, 2001)?;
    p.b.expect_recv(&p.a, 10, WcOpcode::Recv, 2001, None)?;
    check_bytes(&p.b.bytes(0, 700)?, &msg[..700], "receive SGE 0")?;
    check_bytes(&p.b.bytes(8192, 300)?, &msg[700..1000], "receive SGE 1")?;
    check_bytes(&p.b.bytes(16384, 1001)?, &msg[1000..], "receive SGE 2")?;
    check_bytes(
        &p.b.bytes(16384 + 1001, 2999)?,
        &[0; 2999],
        "receive SGE 2 past the message",
    )
}

/// Zero-length SGEs are skipped, their lkey unchecked (§7.4): a SEND of [8 bytes, 0 bytes
/// with a bogus lkey, 8 bytes] delivers the 16 bytes.
pub fn send_zero_length_sge_skipped<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    need_sges(&p, 3)?;
    let data = pattern(4, 16);
    p.a.fill(0, &data[..8])?;
    p.a.fill(64, &data[8..])?;
    let mut empty = p.a.sge(32, 0)?;
    empty.lkey ^= 0x80;
    let gather = [p.a.sge(0, 8)?, empty, p.a.sge(64, 8)?];
    p.b.post_recv_at(10, 0, 64)?;
    p.a.qp.post_send(&[SendWr::new(1, SendOp::Send, &gather)])?;
    p.a.expect_send(1, WcOpcode::Send, 16)?;
    p.b.expect_recv(&p.a, 10, WcOpcode::Recv, 16, None)?;
    check_bytes(
        &p.b.bytes(0, 16)?,
        &data,
        "payload around a zero-length SGE",
    )
}

/// Inline data is copied at post time (§3.2): overwriting the caller's buffer right after
/// `post_send` returns does not change what arrives.
pub fn send_inline_copied_at_post<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    let max = p.a.qp.query()?.cap.max_inline_data as usize;
    if max < 48 {
        return Err(Stop::Skip(format!("max_inline_data {max} < 48")));
    }
    let want = pattern(5, 48);
    let mut buf = want.clone();
    p.b.post_recv_at(10, 0, 64)?;
    p.a.qp.post_send(&[SendWr::inline(1, SendOp::Send, &buf)])?;
    buf.fill(0xEE);
    p.a.expect_send(1, WcOpcode::Send, 48)?;
    p.b.expect_recv(&p.a, 10, WcOpcode::Recv, 48, None)?;
    check_bytes(&p.b.bytes(0, 48)?, &want, "inline payload")?;
    ensure!(buf.iter().all(|&b| b == 0xEE), "caller buffer changed");
    Ok(())
}

/// A solicited-only arm of the receiver's CQ ignores an unsolicited SEND's completion and
/// fires for a SEND with `SOLICITED` (the SE bit, §3.2, §6.3); the event names the CQ.
pub fn send_solicited_fires_solicited_arm<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::with(env, |c| c.recv_channel = true)?;
    let ch =
        p.b.channel
            .as_ref()
            .ok_or_else(|| failure("pair built without a channel"))?;
    p.b.recv_cq.req_notify(true)?;
    p.b.post_recv_at(10, 0, 64)?;
    p.b.post_recv_at(11, 64, 64)?;
    let sge = [p.a.sge(0, 16)?];
    p.a.qp.post_send(&[SendWr::new(1, SendOp::Send, &sge)])?;
    p.a.expect_send(1, WcOpcode::Send, 16)?;
    p.b.expect_recv(&p.a, 10, WcOpcode::Recv, 16, None)?;
    check_eq!(
        ch.get_cq_event()?,
        None,
        "event for an unsolicited receive under a solicited-only arm"
    );
    let solicited =
        SendWr::new(2, SendOp::Send, &sge).with_flags(SendFlags::SIGNALED | SendFlags::SOLICITED);
    p.a.qp.post_send(&[solicited])?;
    check_eq!(
        ch.wait_cq_event(Some(WAIT))?,
        Some(p.b.recv_cq.handle()),
        "event for the solicited receive"
    );
    p.b.recv_cq.ack_events(1);
    p.a.expect_send(2, WcOpcode::Send, 16)?;
    p.b.expect_recv(&p.a, 11, WcOpcode::Recv, 16, None)?;
    check_eq!(ch.get_cq_event()?, None, "a second event");
    Ok(())
}

/// An unsignaled SEND produces no send completion; the signaled SEND after it does, alone.
/// Both are delivered, in order.
pub fn unsignaled_send_no_completion<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    p.a.fill(0, &pattern(6, 8))?;
    p.a.fill(8, &pattern(7, 8))?;
    p.b.post_recv_at(10, 0, 64)?;
    p.b.post_recv_at(11, 64, 64)?;
    let (s1, s2) = ([p.a.sge(0, 8)?], [p.a.sge(8, 8)?]);
    p.a.qp.post_send(&[
        SendWr::new(1, SendOp::Send, &s1).with_flags(SendFlags::empty()),
        SendWr::new(2, SendOp::Send, &s2),
    ])?;
    p.a.expect_send(2, WcOpcode::Send, 8)?;
    let wcs = poll_exact(&p.b.recv_cq, 2)?;
    check_recv(&wcs[0], 10, WcOpcode::Recv, 8, None, p.b.qpn(), p.a.qpn())?;
    check_recv(&wcs[1], 11, WcOpcode::Recv, 8, None, p.b.qpn(), p.a.qpn())?;
    check_bytes(&p.b.bytes(0, 8)?, &pattern(6, 8), "unsignaled SEND")?;
    check_bytes(&p.b.bytes(64, 8)?, &pattern(7, 8), "signaled SEND")
}

/// With `sq_sig_all` every send WR completes, the unsignaled ones included, in order.
pub fn sq_sig_all_signals_every_wr<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::with(env, |c| c.sq_sig_all = true)?;
    p.b.post_recv_at(10, 0, 64)?;
    let sge = [p.a.sge(0, 8)?];
    p.a.qp.post_send(&[
        SendWr::new(1, SendOp::Send, &sge).with_flags(SendFlags::empty()),
        SendWr::new(2, p.b.write_op(128), &sge).with_flags(SendFlags::empty()),
        SendWr::new(3, p.b.read_op(128), &sge),
    ])?;
    let wcs = poll_exact(&p.a.send_cq, 3)?;
    check_success(&wcs[0], 1, WcOpcode::Send, 8, p.a.qpn())?;
    check_success(&wcs[1], 2, WcOpcode::RdmaWrite, 8, p.a.qpn())?;
    check_success(&wcs[2], 3, WcOpcode::RdmaRead, 8, p.a.qpn())?;
    p.b.expect_recv(&p.a, 10, WcOpcode::Recv, 8, None)?;
    Ok(())
}

/// Sixteen SENDs posted in one call consume sixteen receives in posting order: the receive
/// WCs come in order, message *i* in receive *i*, send WCs in order.
pub fn recv_completions_in_posting_order<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    let n = 16usize;
    let mut sges = Vec::new();
    for i in 0..n {
        p.a.fill(i * 64, &pattern(i as u8, 40 + i))?;
        sges.push(p.a.sge(i * 64, 40 + i)?);
        p.b.post_recv_at(100 + i as u64, i * 128, 128)?;
    }
    let wrs: Vec<SendWr<'_>> = sges
        .iter()
        .enumerate()
        .map(|(i, s)| SendWr::new(i as u64, SendOp::Send, std::slice::from_ref(s)))
        .collect();
    p.a.qp.post_send(&wrs)?;
    let sent = poll_exact(&p.a.send_cq, n)?;
    let recvd = poll_exact(&p.b.recv_cq, n)?;
    for i in 0..n {
        let len = 40 + i as u32;
        check_success(&sent[i], i as u64, WcOpcode::Send, len, p.a.qpn())?;
        check_recv(
            &recvd[i],
            100 + i as u64,
            WcOpcode::Recv,
            len,
            None,
            p.b.qpn(),
            p.a.qpn(),
        )?;
        check_bytes(
            &p.b.bytes(i * 128, 40 + i)?,
            &pattern(i as u8, 40 + i),
            &format!("message {i}"),
        )?;
    }
    Ok(())
}

/// Receive WCs carry the receiving QP's number in `qp_num`, in both directions; `src_qp` is
/// 0 or the sender's QPN (the field is defined for UD only; see `check_recv`).
pub fn recv_wc_qp_numbers<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    send_one(&p.a, &p.b, 1, 8, 64, 0)?;
    send_one(&p.b, &p.a, 2, 8, 64, 0)?;
    Ok(())
}

/// `byte_len` of a receive is the number of bytes placed, not the buffer size; the buffer past
/// them is untouched.
pub fn recv_byte_len_is_bytes_placed<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    p.b.fill(0, &[0xCC; 4096])?;
    send_one(&p.a, &p.b, 1, 100, 4096, 0)?;
    check_bytes(
        &p.b.bytes(100, 3996)?,
        &[0xCC; 3996],
        "buffer past the message",
    )
}

/// A SEND larger than the receive buffer (§4.3): the responder's receive WC is `LOC_LEN_ERR`
/// (DIVERGENCES.md #5: rxe reports `REM_INV_REQ_ERR` there), the requester's `REM_INV_REQ_ERR`
/// (NAK 0x61); both QPs enter ERR and every remaining WR on both sides flushes in order.
pub fn recv_buffer_too_small<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    p.b.post_recv_at(10, 0, 64)?;
    p.b.post_recv_at(11, 4096, 4096)?;
    p.a.post_recv_at(20, 0, 64)?;
    let (big, small) = ([p.a.sge(0, 100)?], [p.a.sge(0, 10)?]);
    p.a.qp.post_send(&[
        SendWr::new(1, SendOp::Send, &big),
        SendWr::new(2, SendOp::Send, &small),
    ])?;
    expect_error_then_flush(&p.a.send_cq, p.a.qpn(), 1, WcStatus::RemInvReqErr, &[2])?;
    expect_error_then_flush(&p.b.recv_cq, p.b.qpn(), 10, WcStatus::LocLenErr, &[11])?;
    check_eq!(p.a.state()?, QpState::Err, "requester state");
    p.b.wait_state(QpState::Err)?;
    p.a.expect_recv_flushed(&[20])?;
    poll_exact(&p.b.send_cq, 0)?;
    Ok(())
}

fn srq_pair<C: Context>(env: &Env<C>, max_wr: u32) -> Result<Pair<C>, Stop> {
    Pair::with(env, |c| {
        c.srq_b = Some(SrqAttr {
            max_wr,
            max_sge: 1,
            srq_limit: 0,
        });
        c.cqe = 128;
    })
}

/// Two QPs receiving through one SRQ (pyverbs `test_srq.py`): the SRQ's receives are
/// consumed in posting order by whichever QP gets a message; each receive WC names the QP
/// that received it.
pub fn srq_two_qps_share_receives<C: Context>(env: &Env<C>) -> Outcome {
    let p = srq_pair(env, 16)?;
    let (qa2, qb2) = p.connect_another()?;
    p.b.post_recv_at(1, 0, 1024)?;
    p.b.post_recv_at(2, 1024, 1024)?;
    p.b.post_recv_at(3, 2048, 1024)?;
    let (m1, m2, m3) = (pattern(1, 100), pattern(2, 200), pattern(3, 300));
    p.a.fill(0, &m1)?;
    p.a.fill(4096, &m2)?;
    p.a.fill(8192, &m3)?;
    let qps = [(&p.a.qp, &p.b.qp), (&qa2, &qb2)];
    for (pair, id, len, from) in [(0, 1, 100, 0), (1, 2, 200, 4096), (0, 3, 300, 8192)] {
        let (sender, receiver) = qps[pair];
        let sge = [p.a.sge(from, len)?];
        sender.post_send(&[SendWr::new(id, SendOp::Send, &sge)])?;
        let sent = poll_exact(&p.a.send_cq, 1)?;
        check_success(&sent[0], id, WcOpcode::Send, len as u32, sender.qp_num())?;
        let got = poll_exact(&p.b.recv_cq, 1)?;
        check_recv(
            &got[0],
            id,
            WcOpcode::Recv,
            len as u32,
            None,
            receiver.qp_num(),
            sender.qp_num(),
        )?;
    }
    check_bytes(&p.b.bytes(0, 100)?, &m1, "SRQ receive 1")?;
    check_bytes(&p.b.bytes(1024, 200)?, &m2, "SRQ receive 2")?;
    check_bytes(&p.b.bytes(2048, 300)?, &m3, "SRQ receive 3")
}

/// An RDMA WRITE with immediate to a QP with an SRQ consumes the SRQ's next receive:
/// `RECV_RDMA_WITH_IMM` with the WRITE's length, the immediate, the receiving QP's number.
pub fn srq_write_with_imm_consumes_srq_recv<C: Context>(env: &Env<C>) -> Outcome {
    let p = srq_pair(env, 8)?;
    p.b.post_recv_at(1, 0, 64)?;
    let data = pattern(9, 200);
    p.a.fill(0, &data)?;
    let sge = [p.a.sge(0, 200)?];
    p.a.qp
        .post_send(&[SendWr::new(1, p.b.write_imm_op(4096, 0xC0DE), &sge)])?;
    p.a.expect_send(1, WcOpcode::RdmaWrite, 200)?;
    p.b.expect_recv(&p.a, 1, WcOpcode::RecvRdmaWithImm, 200, Some(0xC0DE))?;
    check_bytes(
        &p.b.bytes(4096, 200)?,
        &data,
        "WRITE_WITH_IMM through an SRQ QP",
    )?;
    check_bytes(&p.b.bytes(0, 64)?, &[0; 64], "the SRQ receive's buffer")
}

/// An armed SRQ limit (pyverbs `test_srq.py`): with 4 receives posted and the limit armed at
/// 2, consuming 2 raises nothing; the third (fewer than 2 left) raises `SRQ_LIMIT_REACHED`
/// for the SRQ on the receiver's context, and the limit is disarmed (queries as 0).
pub fn srq_limit_event<C: Context>(env: &Env<C>) -> Outcome {
    let p = srq_pair(env, 8)?;
    let srq =
        p.b.srq
            .as_ref()
            .ok_or_else(|| failure("pair built without an SRQ"))?;
    for i in 0..4 {
        p.b.post_recv_at(i + 1, i as usize * 64, 64)?;
    }
    needs(srq.arm_limit(2), "SRQ limit")?;
    check_eq!(srq.query()?.srq_limit, 2, "armed srq_limit");
    let sge = [p.a.sge(0, 8)?];
    for id in 1..=3u64 {
        p.a.qp.post_send(&[SendWr::new(id, SendOp::Send, &sge)])?;
        p.a.expect_send(id, WcOpcode::Send, 8)?;
        p.b.expect_recv(&p.a, id, WcOpcode::Recv, 8, None)?;
        if id < 3 {
            while let Some(e) = p.b.ctx.poll_async_event() {
                if e.kind == AsyncEventKind::SrqLimitReached {
                    fail!("{e} with {} receives left (limit 2)", 4 - id);
                }
            }
        }
    }
    let handle = srq.handle();
    wait_async(&p.b.ctx, "SRQ_LIMIT_REACHED", |e| {
        e.kind == AsyncEventKind::SrqLimitReached && e.element == EventElement::Srq(handle)
    })?;
    check_eq!(srq.query()?.srq_limit, 0, "srq_limit after the event");
    Ok(())
}
