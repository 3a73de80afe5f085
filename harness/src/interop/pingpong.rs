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

use std::time::{Duration, Instant};

use verbs_api::dynamic::AnyContext;
use verbs_api::{
    AccessFlags, Context, MemoryRegion, QpCap, QpInitAttr, QueuePair, RecvWr, SendOp, SendWr,
    WcOpcode, WcStatus,
};

use super::wire::{self, DONE, PpDest};
use super::{
    Context2, DeviceArgs, InteropError, QpPath, Result, TimeArgs, Waiter, mtu_arg, udp_report,
};

/// wr_id of every receive WR.
const RECV_WRID: u64 = 1;
/// wr_id of every send WR.
const SEND_WRID: u64 = 2;

/// `softverbs pingpong`: the flags of ibv_rc_pingpong that mean something here, plus the
/// device selection of [`DeviceArgs`] and a time bound.
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
    /// Receive WRs kept posted.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=16384))]
    pub rx_depth: u32,
    /// Iterations (SENDs each way).
    #[arg(short = 'n', long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    pub iters: u32,
    /// Service level.
    #[arg(short = 'l', long, default_value_t = 0)]
    pub sl: u8,
    /// Sleep on CQ events (a completion channel) instead of busy polling.
    #[arg(short = 'e', long)]
    pub events: bool,
    /// Device selection.
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Time bounds.
    #[command(flatten)]
    pub time: TimeArgs,
}

/// Runs `softverbs pingpong`; prints what ibv_rc_pingpong prints. Exit code 0 on success, 1 on
/// any failure (bad completion, timeout, malformed peer message), 2 for bad arguments.
pub fn run(args: &PingpongArgs) -> u8 {
    match pingpong(args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("softverbs pingpong: {e}");
            1
        }
    }
}

fn pingpong(args: &PingpongArgs) -> Result<()> {
    let ctx = args.device.open()?;
    let result = pingpong_on(&ctx, args);
    let finished = args.device.finish(&ctx);
    let result = result.and(finished);
    // ibv_rc_pingpong prints nothing like it; on stderr, so stdout keeps its format.
    if let Some((report, icrc_errors)) = udp_report(&ctx) {
        eprintln!("{report}");
        if result.is_ok() && icrc_errors != 0 {
            return Err(InteropError::new(format!(
                "{icrc_errors} packet(s) dropped for a bad ICRC"
            )));
        }
    }
    result
}

fn pingpong_on(ctx: &AnyContext, args: &PingpongArgs) -> Result<()> {
    let size = usize::try_from(args.size).during("size")?;
    let gid = super::local_gid(ctx, &args.device)?;
    let pd = ctx.alloc_pd()?;
    let send_mr = ctx.alloc_mr(&pd, size.max(1), AccessFlags::LOCAL_WRITE)?;
    let recv_mr = ctx.alloc_mr(&pd, size.max(1), AccessFlags::LOCAL_WRITE)?;
    // ibv_rc_pingpong's buffer starts as 0x7b bytes; send the same.
    send_mr.write(0, &vec![0x7b; size])?;
    let channel = if args.events {
        Some(ctx.create_comp_channel()?)
    } else {
        None
    };
    let cq = ctx.create_cq(args.rx_depth + 1, channel.as_ref())?;
    let cap = QpCap {
        max_send_wr: 1,
        max_recv_wr: args.rx_depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = ctx
        .create_qp(&pd, &cq, &cq, None, &QpInitAttr::rc(cap))
        .during("create QP")?;
    let mut path = QpPath {
        port: args.device.ib_port,
        sgid_index: args.device.gid_idx,
        dgid: gid,
        dest_qpn: 0,
        rq_psn: 0,
        sq_psn: super::random_psn(),
        mtu: args.mtu,
        sl: args.sl,
        hop_limit: 1,
        udp_dport: verbs_api::ROCE_V2_UDP_PORT,
        access: AccessFlags::empty(),
        rd_atomic: 1,
    };
    path.to_init(&qp)?;

    let send_sge = [send_mr.sge(0, size)?];
    let recv_sge = [recv_mr.sge(0, size)?];
    let post_recvs = |n: u32| -> Result<u32> {
        for _ in 0..n {
            qp.post_recv(&[RecvWr::new(RECV_WRID, &recv_sge)])
                .during("post_recv")?;
        }
        Ok(n)
    };
    let mut routs = post_recvs(args.rx_depth)?;

    let me = PpDest {
        lid: 0,
        qpn: qp.qp_num(),
        psn: path.sq_psn,
        gid,
    };
    println!("  local address:  {}", me.describe());
    let peer = match &args.host {
        Some(host) => {
            let mut stream = super::tcp_client(host, args.port, &args.time)?;
            wire::write_msg(&mut stream, &me.encode(), "our address message")?;
            let peer = wire::read_dest(&mut stream)?;
            wire::write_msg(&mut stream, DONE, "\"done\"")?;
            connect(&qp, &mut path, &peer)?;
            peer
        }
        None => {
            let mut stream = super::tcp_server(args.port, &args.time)?;
            let peer = wire::read_dest(&mut stream)?;
            connect(&qp, &mut path, &peer)?;
            wire::write_msg(&mut stream, &me.encode(), "our address message")?;
            wire::read_done(&mut stream)?;
            peer
        }
    };
    println!("  remote address: {}", peer.describe());

    let start = Instant::now();
    let send = || -> Result<()> {
        qp.post_send(&[SendWr::new(SEND_WRID, SendOp::Send, &send_sge)])
            .during("post_send")
    };
    let mut pending = RECV_WRID;
    if args.host.is_some() {
        send()?;
        pending |= SEND_WRID;
    }
    let (mut scnt, mut rcnt) = (0u32, 0u32);
    let mut waiter = Waiter::new(cq.clone(), channel, args.time.io())?;
    let iters = args.iters;
    while scnt < iters || rcnt < iters {
        let wcs = waiter
            .next(&|| {
                format!(
                    "iteration {} (sent {scnt}, received {rcnt})",
                    scnt.min(rcnt)
                )
            })?
            .to_vec();
        for wc in wcs {
            if wc.status != WcStatus::Success {
                return Err(InteropError::new(format!(
                    "failed status {:?} ({}) for wr_id {} (vendor_err {:#x}) after {scnt} \
                     sends, {rcnt} receives",
                    wc.status, wc.status as u32, wc.wr_id, wc.vendor_err
                )));
            }
            match wc.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    if wc.opcode != WcOpcode::Recv || wc.byte_len != args.size {
                        return Err(InteropError::new(format!(
                            "receive {rcnt}: opcode {:?} with {} bytes, expected a SEND of {} \
                             bytes",
                            wc.opcode, wc.byte_len, args.size
                        )));
                    }
                    routs = routs.saturating_sub(1);
                    if routs <= 1 {
                        routs += post_recvs(args.rx_depth - routs)?;
                    }
                    rcnt += 1;
                }
                other => {
                    return Err(InteropError::new(format!(
                        "completion for unknown wr_id {other}"
                    )));
                }
            }
            pending &= !wc.wr_id;
            if scnt < iters && pending == 0 {
                send()?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    let usec = secs * 1e6;
    let bytes = u64::from(args.size) * u64::from(iters) * 2;
    println!(
        "{bytes} bytes in {secs:.2} seconds = {:.2} Mbit/sec",
        bytes as f64 * 8.0 / usec
    );
    println!(
        "{iters} iters in {secs:.2} seconds = {:.2} usec/iter",
        usec / f64::from(iters)
    );
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
