//! The UD transport (unreliable datagrams): one SEND_ONLY or SEND_ONLY_WITH_IMMEDIATE packet
//! per message, a DETH with the Q_Key and the source QP, no ACK, no retransmission.
//!
//! The requester side turns the head send WQE into one packet and completes it once the packet
//! is built (a lost datagram is lost: the sender never learns of it). The receive side takes a
//! receive WQE, writes the 40-byte GRH (the datagram's IP header, rdma-core's layout) and the
//! payload into it and completes it. It is not RC: no PSN checking, no responses, no
//! multi-packet messages: a message above the port's MTU is completed successfully and never
//! sent, as IBTA C10-93.1.1 requires ("shall not emit any packets … shall not generate an
//! error") and rxe's requester does.

use std::net::{IpAddr, SocketAddr};

use verbs_api::{
    AccessFlags, GRH_LEN, QKEY_CONTROLLED, QpState, SendFlags, WcFlags, WcOpcode, WcStatus,
    WorkCompletion,
};

use crate::memory::MemoryFault;
use crate::qp::{Qp, RecvWqe, SendWqe};
use crate::rc::requester::sg_copy;
use crate::rc::responder::take_recv_wqe;
use crate::rc::{Ctx, tx};
use crate::stats::RxDropCause;
use crate::wire::{
    BTH_LEN, Bth, BthRepr, DETH_LEN, Deth, DethRepr, ICRC_LEN, IMMDT_LEN, ImmDt, ImmDtRepr,
    IpAddrs, IpContext, Opcode, fill_icrc, pad_len,
};

/// `UD_SEND_ONLY` (transport bits 011).
pub(crate) const SEND_ONLY: u8 = 0x64;
/// `UD_SEND_ONLY_WITH_IMMEDIATE`.
pub(crate) const SEND_ONLY_WITH_IMMEDIATE: u8 = 0x65;

/// True for the two UD opcodes this engine speaks.
pub(crate) fn is_ud_opcode(byte: u8) -> bool {
    byte == SEND_ONLY || byte == SEND_ONLY_WITH_IMMEDIATE
}

/// Where a UD send WQE goes, resolved from its address handle at post time.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct UdDst {
    /// The peer's IP address (the AH's DGID) and UDP port.
    pub(crate) dst: SocketAddr,
    /// The destination QP.
    pub(crate) remote_qpn: u32,
    /// The Q_Key to send (the QP's already substituted for a controlled one).
    pub(crate) qkey: u32,
}

/// The Q_Key a work request's `remote_qkey` puts in the DETH: the QP's own when the high bit
/// is set (controlled Q_Key), else the request's.
pub(crate) fn effective_qkey(wr_qkey: u32, qp_qkey: u32) -> u32 {
    if wr_qkey & QKEY_CONTROLLED != 0 {
        qp_qkey
    } else {
        wr_qkey
    }
}

/// A packet built by [`next_packet`]: its length in the buffer, destination and source port.
pub(crate) struct Datagram {
    pub(crate) len: usize,
    pub(crate) dst: SocketAddr,
    pub(crate) src_port: u16,
}

/// Builds the head send WQE of a UD QP in RTS into `buf` and completes it. `None` when there is
/// nothing to send. WQEs above `mtu` bytes complete successfully without a packet (C10-93.1.1).
/// A WQE whose gather list fails (bad lkey, range) completes with `LOC_PROT_ERR` and sets
/// `*fatal` (the QP enters ERR, as rxe's requester does).
pub(crate) fn next_packet(
    qp: &mut Qp,
    ctx: &mut Ctx<'_>,
    src_ip: IpAddr,
    fixed_sport: Option<u16>,
    mtu: u32,
    buf: &mut [u8],
    fatal: &mut bool,
) -> Option<Datagram> {
    if qp.state() != QpState::Rts {
        return None;
    }
    let wqe = loop {
        let wqe = qp.sq.pop_front()?;
        if wqe.length <= u64::from(mtu) {
            break wqe;
        }
        qp.rc.req_psn = qp.rc.req_psn.wrapping_add(1);
        complete_send(qp, ctx, &wqe, WcStatus::Success);
    };
    let ud = wqe.ud?;
    let src_port = fixed_sport.unwrap_or_else(|| crate::wire::ip::udp_sport(qp.qpn, ud.remote_qpn));
    let built = tx::ip_context(src_ip, ud.dst.ip(), src_port, ud.dst.port())
        .ok()
        .and_then(|ip| build(qp, ctx, &wqe, &ud, &ip, buf).ok());
    let Some(len) = built else {
        complete_send(qp, ctx, &wqe, WcStatus::LocProtErr);
        *fatal = true;
        return None;
    };
    qp.rc.req_psn = qp.rc.req_psn.wrapping_add(1);
    qp.rc.stats.sent_pkts += 1;
    qp.rc.stats.sent_bytes += wqe.length;
    complete_send(qp, ctx, &wqe, WcStatus::Success);
    Some(Datagram {
        len,
        dst: ud.dst,
        src_port,
    })
}

/// Writes BTH ‖ DETH ‖ [ImmDt] ‖ payload ‖ pad ‖ ICRC.
fn build(
    qp: &Qp,
    ctx: &Ctx<'_>,
    wqe: &SendWqe,
    ud: &UdDst,
    ip: &IpContext,
    buf: &mut [u8],
) -> Result<usize, MemoryFault> {
    let imm = wqe.op.imm();
    let hdr = BTH_LEN + DETH_LEN + if imm.is_some() { IMMDT_LEN } else { 0 };
    let n = usize::try_from(wqe.length).map_err(|_| MemoryFault)?;
    let pad = pad_len(n);
    let total = hdr + n + usize::from(pad) + ICRC_LEN;
    let out = buf.get_mut(..total).ok_or(MemoryFault)?;
    let opcode = if imm.is_some() {
        SEND_ONLY_WITH_IMMEDIATE
    } else {
        SEND_ONLY
    };
    BthRepr {
        solicited: wqe.flags.contains(SendFlags::SOLICITED),
        pad_count: pad,
        ..BthRepr::new(Opcode::from(opcode), ud.remote_qpn, qp.rc.req_psn)
    }
    .emit(&mut Bth::new_unchecked(&mut out[..BTH_LEN]));
    DethRepr {
        qkey: ud.qkey,
        src_qp: qp.qpn,
    }
    .emit(&mut Deth::new_unchecked(
        &mut out[BTH_LEN..BTH_LEN + DETH_LEN],
    ));
    if let Some(imm) = imm {
        ImmDtRepr { imm }.emit(&mut ImmDt::new_unchecked(&mut out[BTH_LEN + DETH_LEN..hdr]));
    }
    gather(qp, ctx, wqe, &mut out[hdr..hdr + n])?;
    out[hdr + n..total - ICRC_LEN].fill(0);
    fill_icrc(ip, out).map_err(|_| MemoryFault)?;
    Ok(total)
}

/// Copies the WQE's payload (inline bytes or its gather list, each SGE checked against the
/// QP's PD) into `out`.
fn gather(qp: &Qp, ctx: &Ctx<'_>, wqe: &SendWqe, out: &mut [u8]) -> Result<(), MemoryFault> {
    if wqe.flags.contains(SendFlags::INLINE) {
        out.copy_from_slice(wqe.inline.get(..out.len()).ok_or(MemoryFault)?);
        return Ok(());
    }
    let bad = wqe.sges.iter().filter(|s| s.length != 0).any(|s| {
        ctx.resolve(
            s.lkey,
            qp.pd,
            s.addr,
            u64::from(s.length),
            AccessFlags::empty(),
        )
        .is_none()
    });
    if bad {
        return Err(MemoryFault);
    }
    sg_copy(ctx, &wqe.sges, 0, out.len(), |key, off, range| {
        ctx.mem.read(key, off, &mut out[range])
    })
}

/// Reports a send WQE's completion: always on error, on success only when signaled.
fn complete_send(qp: &Qp, ctx: &mut Ctx<'_>, wqe: &SendWqe, status: WcStatus) {
    if status == WcStatus::Success && !wqe.signaled {
        return;
    }
    let wc = WorkCompletion {
        wr_id: wqe.wr_id,
        status,
        opcode: WcOpcode::Send,
        byte_len: u32::try_from(wqe.length).unwrap_or(u32::MAX),
        qp_num: qp.qpn,
        ..WorkCompletion::default()
    };
    ctx.wcs.push((qp.send_cq, wc, false));
}

/// The parts of a received UD packet the receive side needs.
pub(crate) struct UdPacket<'a> {
    pub(crate) bth: BthRepr,
    pub(crate) deth: DethRepr,
    pub(crate) imm: Option<u32>,
    pub(crate) payload: &'a [u8],
    /// The whole UDP payload's length.
    pub(crate) len: usize,
}

impl<'a> UdPacket<'a> {
    /// Parses a UD SEND_ONLY[_WITH_IMMEDIATE] packet (ICRC already checked); `None` if it is
    /// malformed (short, bad pad, TVer ≠ 0, another opcode).
    pub(crate) fn parse(bytes: &'a [u8]) -> Option<UdPacket<'a>> {
        let bth = BthRepr::parse(&Bth::new_checked(bytes).ok()?).ok()?;
        let opcode = u8::from(bth.opcode);
        if !is_ud_opcode(opcode) {
            return None;
        }
        let with_imm = opcode == SEND_ONLY_WITH_IMMEDIATE;
        let hdr = BTH_LEN + DETH_LEN + if with_imm { IMMDT_LEN } else { 0 };
        let end = bytes
            .len()
            .checked_sub(ICRC_LEN + usize::from(bth.pad_count))?;
        if end < hdr {
            return None;
        }
        let deth = DethRepr::parse(&Deth::new_checked(bytes.get(BTH_LEN..)?).ok()?).ok()?;
        let imm = if with_imm {
            let at = BTH_LEN + DETH_LEN;
            Some(
                ImmDtRepr::parse(&ImmDt::new_checked(bytes.get(at..)?).ok()?)
                    .ok()?
                    .imm,
            )
        } else {
            None
        };
        Some(UdPacket {
            bth,
            deth,
            imm,
            payload: bytes.get(hdr..end)?,
            len: bytes.len(),
        })
    }
}

/// Delivers a UD packet to `qp` (rxe's responder for UD): wrong state, foreign P_Key, wrong
/// Q_Key and no receive WQE drop it (counted); a message that does not fit the WQE after the
/// GRH completes it with `LOC_LEN_ERR`, a bad receive WQE with `LOC_PROT_ERR`; the QP stays
/// as it is. `ip` is the datagram's IP context (its GRH).
pub(crate) fn receive(qp: &mut Qp, ctx: &mut Ctx<'_>, pkt: &UdPacket<'_>, ip: &IpContext) {
    let drop = if !matches!(qp.state(), QpState::Rtr | QpState::Rts | QpState::Sqd) {
        Some(RxDropCause::WrongState)
    } else if pkt.bth.pkey & 0x7FFF != 0x7FFF {
        Some(RxDropCause::BadPkey)
    } else if pkt.deth.qkey != qp.attr.qkey {
        Some(RxDropCause::BadQkey)
    } else {
        None
    };
    if let Some(cause) = drop {
        qp.rc.stats.count_drop(cause);
        return;
    }
    let Some(wqe) = take_recv_wqe(qp, ctx) else {
        qp.rc.stats.count_drop(RxDropCause::NoRecvWqe);
        return;
    };
    qp.rc.stats.rcvd_pkts += 1;
    let status = place(qp, ctx, &wqe, pkt, ip);
    let len = GRH_LEN + pkt.payload.len();
    let wc = if status == WcStatus::Success {
        qp.rc.stats.rcvd_bytes += pkt.payload.len() as u64;
        WorkCompletion {
            wr_id: wqe.wr_id,
            status,
            opcode: WcOpcode::Recv,
            byte_len: u32::try_from(len).unwrap_or(u32::MAX),
            imm_data: pkt.imm.unwrap_or(0),
            qp_num: qp.qpn,
            src_qp: pkt.deth.src_qp,
            wc_flags: if pkt.imm.is_some() {
                WcFlags::GRH | WcFlags::WITH_IMM
            } else {
                WcFlags::GRH
            },
            pkey_index: 0,
            slid: 0,
            sl: 0,
            ..WorkCompletion::default()
        }
    } else {
        WorkCompletion {
            wr_id: wqe.wr_id,
            status,
            opcode: WcOpcode::Recv,
            qp_num: qp.qpn,
            ..WorkCompletion::default()
        }
    };
    ctx.wcs.push((qp.recv_cq, wc, pkt.bth.solicited));
}

/// Writes the GRH and the payload into the receive WQE; the completion status.
fn place(qp: &Qp, ctx: &Ctx<'_>, wqe: &RecvWqe, pkt: &UdPacket<'_>, ip: &IpContext) -> WcStatus {
    let capacity: u64 = wqe.sges.iter().map(|s| u64::from(s.length)).sum();
    let bad = wqe.sges.iter().filter(|s| s.length != 0).any(|s| {
        ctx.resolve(
            s.lkey,
            qp.pd,
            s.addr,
            u64::from(s.length),
            AccessFlags::LOCAL_WRITE,
        )
        .is_none()
    });
    if bad {
        return WcStatus::LocProtErr;
    }
    if (GRH_LEN + pkt.payload.len()) as u64 > capacity {
        return WcStatus::LocLenErr;
    }
    let grh = grh_bytes(ip, pkt.len);
    let written = sg_copy(ctx, &wqe.sges, 0, GRH_LEN, |key, off, range| {
        ctx.mem.write(key, off, &grh[range])
    })
    .and_then(|()| {
        sg_copy(
            ctx,
            &wqe.sges,
            GRH_LEN as u64,
            pkt.payload.len(),
            |key, off, range| ctx.mem.write(key, off, &pkt.payload[range]),
        )
    });
    match written {
        Ok(()) => WcStatus::Success,
        Err(_) => WcStatus::LocProtErr,
    }
}

/// The 40 GRH bytes of a datagram with IP context `ip`: the IPv6 header, or 20 zero bytes and
/// the IPv4 header (rdma-core's RoCEv2 layout) for a UDP payload of `udp_payload_len` bytes.
fn grh_bytes(ip: &IpContext, udp_payload_len: usize) -> [u8; GRH_LEN] {
    let mut headers = [0u8; GRH_LEN + 8];
    let mut grh = [0u8; GRH_LEN];
    if ip.emit_headers(udp_payload_len, &mut headers).is_err() {
        return grh;
    }
    match ip.addrs {
        IpAddrs::V4 { .. } => grh[20..].copy_from_slice(&headers[..20]),
        IpAddrs::V6 { .. } => grh.copy_from_slice(&headers[..GRH_LEN]),
    }
    grh
}
