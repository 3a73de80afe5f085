//! `softverbs ud-pingpong`: rdma-core's `ibv_ud_pingpong` on any verbs-api provider, compatible
//! on the wire (the same 52-byte TCP exchange as `ibv_rc_pingpong`, UD SENDs with Q_Key
//! 0x11111111) and on the command line, so either side can be the real tool.
//!
//! As the real tool: one buffer of `size + 40` bytes; receives take all of it (the 40-byte GRH
//! first), sends carry the `size` bytes after the first 40. The message must fit the port's
//! active MTU. The QP goes RESET → INIT (P_Key index 0, port, Q_Key) → RTR → RTS (SQ PSN); the
//! peer is reached through an address handle built from its GID (hop limit 1). The ping-pong
//! loop is `ibv_rc_pingpong`'s ([`super::pingpong`]); every receive must carry `size + 40`
//! bytes with `IBV_WC_GRH`. Written from the protocol's description, not from rdma-core's
//! source.

use verbs_api::dynamic::{AnyContext, AnyQp};
use verbs_api::{
    AccessFlags, AddressHandle, AhAttr, Context, GRH_LEN, MemoryRegion, QpAttr, QpAttrMask, QpCap,
    QpInitAttr, QpState, QueuePair, RecvWr, SendOp, SendWr, UdDest, WcFlags, WcOpcode, WcStatus,
};

use super::wire::{self, DONE, PpDest};
use super::{Context2, DeviceArgs, InteropError, Result, TimeArgs, Waiter, udp_report};

/// The Q_Key both sides use.
pub const UD_QKEY: u32 = 0x1111_1111;
/// wr_id of every receive WR.
const RECV_WRID: u64 = 1;
/// wr_id of every send WR.
const SEND_WRID: u64 = 2;

/// `softverbs ud-pingpong`: the flags of ibv_ud_pingpong that mean something here, plus the
/// device selection of [`DeviceArgs`] and a time bound.
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

/// Runs `softverbs ud-pingpong`; prints what ibv_ud_pingpong prints. Exit code 0 on success, 1
/// on any failure (bad completion, timeout, malformed peer message, size above the MTU).
pub fn run(args: &UdPingpongArgs) -> u8 {
    match ud_pingpong(args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("softverbs ud-pingpong: {e}");
            1
        }
    }
}

fn ud_pingpong(args: &UdPingpongArgs) -> Result<()> {
    let ctx = args.device.open()?;
    let result = ud_pingpong_on(&ctx, args);
    let result = result.and(args.device.finish(&ctx));
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
    let port = args.device.ib_port;
    let mtu = ctx.query_port(port)?.active_mtu.bytes();
    if args.size > mtu {
        return Err(InteropError::new(format!(
            "requested size {} larger than the port's MTU {mtu}",
            args.size
        )));
    }
    let size = usize::try_from(args.size).during("size")?;
    let gid = super::local_gid(ctx, &args.device)?;
    let pd = ctx.alloc_pd()?;
    let mr = ctx.alloc_mr(&pd, size + GRH_LEN, AccessFlags::LOCAL_WRITE)?;
    mr.write(0, &vec![0x7b; size + GRH_LEN])?;
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
        .create_qp(&pd, &cq, &cq, None, &QpInitAttr::ud(cap))
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
        psn,
        gid,
    };
    println!("  local address:  {}", me.describe());
    let peer = match &args.host {
        Some(host) => {
            let mut stream = super::tcp_client(host, args.port, &args.time)?;
            wire::write_msg(&mut stream, &me.encode(), "our address message")?;
            let peer = wire::read_dest(&mut stream)?;
            wire::write_msg(&mut stream, DONE, "\"done\"")?;
            to_rts(&qp, port, psn)?;
            peer
        }
        None => {
            let mut stream = super::tcp_server(args.port, &args.time)?;
            let peer = wire::read_dest(&mut stream)?;
            to_rts(&qp, port, psn)?;
            wire::write_msg(&mut stream, &me.encode(), "our address message")?;
            wire::read_done(&mut stream)?;
            peer
        }
    };
    println!("  remote address: {}", peer.describe());
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
                sgid_index: args.device.gid_idx,
                hop_limit: 1,
                sl: args.sl,
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

    let start = std::time::Instant::now();
    let send = || -> Result<()> {
        qp.post_send(&[SendWr::new(SEND_WRID, SendOp::Send, &send_sge).with_ud(dest)])
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
                    "failed status {:?} ({}) for wr_id {} after {scnt} sends, {rcnt} receives",
                    wc.status, wc.status as u32, wc.wr_id
                )));
            }
            match wc.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    let want = args.size + GRH_LEN as u32;
                    if wc.opcode != WcOpcode::Recv
                        || wc.byte_len != want
                        || !wc.wc_flags.contains(WcFlags::GRH)
                    {
                        return Err(InteropError::new(format!(
                            "receive {rcnt}: opcode {:?}, {} bytes, flags {:?}; expected a \
                             SEND of {want} bytes (GRH included) with IBV_WC_GRH",
                            wc.opcode, wc.byte_len, wc.wc_flags
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
    Ok(())
}
