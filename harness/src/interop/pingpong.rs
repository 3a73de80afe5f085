//! `softverbs pingpong`: rdma-core's `ibv_rc_pingpong` on any verbs-api provider, compatible on
//! the wire (its 52-byte TCP exchange, RC SENDs) and on the command line, so either side can be
//! the real tool.
//!
//! Server without a host argument, client with one. Both create a CQ of `rx_depth + 1`
//! entries, an RC QP (one send WR, `rx_depth` receive WRs), a send buffer and a receive buffer
//! of `size` bytes, post `rx_depth` receives and exchange addresses. The client posts the first
//! SEND; from then on each side sends again once both its last SEND and a receive have
//! completed, until it has counted `iters` of each. Receives are reposted when at most one is
//! left. Every completion must succeed, and every receive must carry exactly `size` bytes.
//! Written from the protocol's description, not from rdma-core's source.

use std::time::Duration;

use verbs_api::dynamic::AnyContext;
use verbs_api::{
    AccessFlags, Context, MemoryRegion, QpInitAttr, QueuePair, SendOp, SendWr, WcOpcode,
    WorkCompletion,
};

use super::pingpong_shared::{
    PingPong, SEND_WRID, cq_and_channel, exchange, exit_code, on_device, post_recvs, qp_cap,
};
use super::wire::PpDest;
use super::{Context2, InteropError, QpPath, Result, SharedArgs, mtu_arg};

/// `softverbs pingpong`: the flags of ibv_rc_pingpong that mean something here (those both
/// tools take in [`SharedArgs`]), plus the device selection and a time bound.
#[derive(clap::Args, Clone, Debug)]
pub struct PingpongArgs {
    /// Connect to this server (host name or address); without it, act as the server.
    #[arg(value_name = "HOST")]
    pub host: Option<String>,
    /// TCP port of the address exchange.
    #[arg(short = 'p', long, default_value_t = 18515)]
    pub port: u16,
    /// Message size in bytes.
    #[arg(short = 's', long, default_value_t = 4096)]
    pub size: u32,
    /// Path MTU in bytes (256, 512, 1024, 2048 or 4096).
    #[arg(short = 'm', long, default_value = "1024", value_parser = mtu_arg)]
    pub mtu: verbs_api::Mtu,
    /// Receive depth, iterations, service level, events, device and time bounds.
    #[command(flatten)]
    pub common: SharedArgs,
}

/// Runs `softverbs pingpong`; prints what ibv_rc_pingpong prints. Exit code 0 on success, 1 on
/// any failure (bad completion, timeout, malformed peer message), 2 for bad arguments.
pub fn run(args: &PingpongArgs) -> u8 {
    exit_code(
        "pingpong",
        on_device(&args.common.device, |ctx| pingpong_on(ctx, args)),
    )
}

fn pingpong_on(ctx: &AnyContext, args: &PingpongArgs) -> Result<()> {
    let size = usize::try_from(args.size).during("size")?;
    let gid = super::local_gid(ctx, &args.common.device)?;
    let pd = ctx.alloc_pd()?;
    let send_mr = ctx.alloc_mr(&pd, size.max(1), AccessFlags::LOCAL_WRITE)?;
    let recv_mr = ctx.alloc_mr(&pd, size.max(1), AccessFlags::LOCAL_WRITE)?;
    // ibv_rc_pingpong's buffer starts as 0x7b bytes; send the same.
    send_mr.write(0, &vec![0x7b; size])?;
    let (cq, channel) = cq_and_channel(ctx, args.common.rx_depth, args.common.events)?;
    let qp = ctx
        .create_qp(
            &pd,
            &cq,
            &cq,
            None,
            &QpInitAttr::rc(qp_cap(args.common.rx_depth)),
        )
        .during("create QP")?;
    let mut path = QpPath {
        port: args.common.device.ib_port,
        sgid_index: args.common.device.gid_idx,
        dgid: gid,
        dest_qpn: 0,
        rq_psn: 0,
        sq_psn: super::random_psn(),
        mtu: args.mtu,
        sl: args.common.sl,
        hop_limit: 1,
        udp_dport: verbs_api::ROCE_V2_UDP_PORT,
        access: AccessFlags::empty(),
        rd_atomic: 1,
    };
    path.to_init(&qp)?;

    let send_sge = [send_mr.sge(0, size)?];
    let recv_sge = [recv_mr.sge(0, size)?];
    let routs = post_recvs(&qp, &recv_sge, args.common.rx_depth)?;

    let me = PpDest {
        lid: 0,
        qpn: qp.qp_num(),
        psn: path.sq_psn,
        gid,
    };
    exchange(
        args.host.as_deref(),
        args.port,
        &args.common.time,
        &me,
        |peer| connect(&qp, &mut path, peer),
    )?;

    let send = || -> Result<()> {
        qp.post_send(&[SendWr::new(SEND_WRID, SendOp::Send, &send_sge)])
            .during("post_send")
    };
    let check_recv = |wc: &WorkCompletion, rcnt: u32| -> Result<()> {
        if wc.opcode != WcOpcode::Recv || wc.byte_len != args.size {
            return Err(InteropError::new(format!(
                "receive {rcnt}: opcode {:?} with {} bytes, expected a SEND of {} bytes",
                wc.opcode, wc.byte_len, args.size
            )));
        }
        Ok(())
    };
    PingPong {
        args: &args.common,
        size: args.size,
        client: args.host.is_some(),
        vendor_err: true,
        qp: &qp,
        recv_sge: &recv_sge,
        routs,
        send: &send,
        check_recv: &check_recv,
    }
    .run(cq.clone(), channel)?;
    linger(ctx);
    Ok(())
}

/// Moves the QP to RTR/RTS towards `peer`. A zero GID (peer without `-g`) cannot be routed on
/// RoCE: a clear error instead of a QP that never connects.
fn connect(qp: &verbs_api::dynamic::AnyQp, path: &mut QpPath, peer: &PpDest) -> Result<()> {
    if peer.gid.is_zero() {
        return Err(InteropError::new(
            "the peer sent GID 0 (LID addressing); RoCE needs a GID: run the peer with -g \
             (e.g. -g 1 on rxe)",
        ));
    }
    path.dgid = peer.gid;
    path.dest_qpn = peer.qpn;
    path.rq_psn = peer.psn;
    path.to_rts(qp)
}

/// Lets a UDP device send what it still owes the peer: the emulator's progress thread sends
/// the ACK of the peer's last SEND after that SEND's receive completion may already be visible
/// here, and the peer's last send completes only with that ACK. Other providers acknowledge in
/// the kernel or the NIC, whatever the process does next.
fn linger(ctx: &AnyContext) {
    if ctx.downcast_ref::<emu_udp::UdpContext>().is_some() {
        std::thread::sleep(Duration::from_millis(100));
    }
}
