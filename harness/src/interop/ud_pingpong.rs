//! `softverbs ud-pingpong`: rdma-core's `ibv_ud_pingpong` on any verbs-api provider, compatible
//! on the wire (the same 52-byte TCP exchange as `ibv_rc_pingpong`, UD SENDs with Q_Key
//! 0x11111111) and on the command line, so either side can be the real tool.
//!
//! As the real tool: one buffer of `size + 40` bytes; receives take all of it (the 40-byte GRH
//! first), sends carry the `size` bytes after the first 40. The message must fit the port's
//! active MTU. The QP goes RESET → INIT (P_Key index 0, port, Q_Key) → RTR → RTS (SQ PSN); the
//! peer is reached through an address handle built from its GID (hop limit 1). The ping-pong
//! loop is `ibv_rc_pingpong`'s (shared with `softverbs pingpong`); every receive must carry
//! `size + 40` bytes with `IBV_WC_GRH`. Written from the protocol's description, not from
//! rdma-core's source.

use verbs_api::dynamic::{AnyContext, AnyQp};
use verbs_api::{
    AccessFlags, AddressHandle, AhAttr, Context, GRH_LEN, MemoryRegion, QpAttr, QpAttrMask,
    QpInitAttr, QpState, QueuePair, SendOp, SendWr, UdDest, WcFlags, WcOpcode, WorkCompletion,
};

use super::pingpong_shared::{
    PingPong, SEND_WRID, cq_and_channel, exchange, exit_code, on_device, post_recvs, qp_cap,
};
use super::wire::PpDest;
use super::{Context2, InteropError, Result, SharedArgs};

/// The Q_Key both sides use.
pub const UD_QKEY: u32 = 0x1111_1111;

/// `softverbs ud-pingpong`: the flags of ibv_ud_pingpong that mean something here (those both
/// tools take in [`SharedArgs`]), plus the device selection and a time bound.
#[derive(clap::Args, Clone, Debug)]
pub struct UdPingpongArgs {
    /// Connect to this server (host name or address); without it, act as the server.
    #[arg(value_name = "HOST")]
    pub host: Option<String>,
    /// TCP port of the address exchange.
    #[arg(short = 'p', long, default_value_t = 18515)]
    pub port: u16,
    /// Message size in bytes (at most the port's active MTU).
    #[arg(short = 's', long, default_value_t = 2048)]
    pub size: u32,
    /// Receive depth, iterations, service level, events, device and time bounds.
    #[command(flatten)]
    pub common: SharedArgs,
}

/// Runs `softverbs ud-pingpong`; prints what ibv_ud_pingpong prints. Exit code 0 on success, 1
/// on any failure (bad completion, timeout, malformed peer message, size above the MTU).
pub fn run(args: &UdPingpongArgs) -> u8 {
    exit_code(
        "ud-pingpong",
        on_device(&args.common.device, |ctx| ud_pingpong_on(ctx, args)),
    )
}

/// The UD attributes of `state` on `port` (Q_Key [`UD_QKEY`], first PSN `psn`).
fn ud_attr(state: QpState, port: u8, psn: u32) -> QpAttr {
    QpAttr {
        qp_state: state,
        pkey_index: 0,
        port_num: port,
        qkey: UD_QKEY,
        sq_psn: psn,
        ..QpAttr::default()
    }
}

fn to_rts(qp: &AnyQp, port: u8, psn: u32) -> Result<()> {
    use QpAttrMask as M;
    qp.modify(&ud_attr(QpState::Rtr, port, psn), M::STATE)
        .during("modify QP to RTR")?;
    qp.modify(&ud_attr(QpState::Rts, port, psn), M::STATE | M::SQ_PSN)
        .during("modify QP to RTS")
}

fn ud_pingpong_on(ctx: &AnyContext, args: &UdPingpongArgs) -> Result<()> {
    let port = args.common.device.ib_port;
    let mtu = ctx.query_port(port)?.active_mtu.bytes();
    if args.size > mtu {
        return Err(InteropError::new(format!(
            "requested size {} larger than the port's MTU {mtu}",
            args.size
        )));
    }
    let size = usize::try_from(args.size).during("size")?;
    let gid = super::local_gid(ctx, &args.common.device)?;
    let pd = ctx.alloc_pd()?;
    let mr = ctx.alloc_mr(&pd, size + GRH_LEN, AccessFlags::LOCAL_WRITE)?;
    mr.write(0, &vec![0x7b; size + GRH_LEN])?;
    let (cq, channel) = cq_and_channel(ctx, args.common.rx_depth, args.common.events)?;
    let qp = ctx
        .create_qp(
            &pd,
            &cq,
            &cq,
            None,
            &QpInitAttr::ud(qp_cap(args.common.rx_depth)),
        )
        .during("create UD QP")?;
    let psn = super::random_psn();
    use QpAttrMask as M;
    qp.modify(
        &ud_attr(QpState::Init, port, psn),
        M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY,
    )
    .during("modify QP to INIT")?;

    let recv_sge = [mr.sge(0, size + GRH_LEN)?];
    let send_sge = [mr.sge(GRH_LEN, size)?];
    let routs = post_recvs(&qp, &recv_sge, args.common.rx_depth)?;

    let me = PpDest {
        lid: 0,
        qpn: qp.qp_num(),
        psn,
        gid,
    };
    let peer = exchange(
        args.host.as_deref(),
        args.port,
        &args.common.time,
        &me,
        |_| to_rts(&qp, port, psn),
    )?;
    if peer.gid.is_zero() {
        return Err(InteropError::new(
            "the peer sent GID 0 (LID addressing); RoCE needs a GID: run the peer with -g",
        ));
    }
    let ah = ctx
        .create_ah(
            &pd,
            &AhAttr {
                dgid: peer.gid,
                sgid_index: args.common.device.gid_idx,
                hop_limit: 1,
                sl: args.common.sl,
                port_num: port,
                ..AhAttr::default()
            },
        )
        .during("create AH")?;
    let dest = UdDest {
        ah: ah.handle(),
        remote_qpn: peer.qpn,
        remote_qkey: UD_QKEY,
    };

    let send = || -> Result<()> {
        qp.post_send(&[SendWr::new(SEND_WRID, SendOp::Send, &send_sge).with_ud(dest)])
            .during("post_send")
    };
    let check_recv = |wc: &WorkCompletion, rcnt: u32| -> Result<()> {
        let want = args.size + GRH_LEN as u32;
        if wc.opcode != WcOpcode::Recv || wc.byte_len != want || !wc.wc_flags.contains(WcFlags::GRH)
        {
            return Err(InteropError::new(format!(
                "receive {rcnt}: opcode {:?}, {} bytes, flags {:?}; expected a SEND of {want} \
                 bytes (GRH included) with IBV_WC_GRH",
                wc.opcode, wc.byte_len, wc.wc_flags
            )));
        }
        Ok(())
    };
    PingPong {
        args: &args.common,
        size: args.size,
        client: args.host.is_some(),
        vendor_err: false,
        qp: &qp,
        recv_sge: &recv_sge,
        routs,
        send: &send,
        check_recv: &check_recv,
    }
    .run(cq.clone(), channel)
}
