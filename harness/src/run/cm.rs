//! `softverbs run --cm rdma`: a node's RC links connected through the IB CM over its
//! device's GSI.
//!
//! What it is: setup code of a node. It opens the device's GSI (QP1, Q_Key 0x8001_0000),
//! drives an [`emu_cm::connector::Connector`] — the lower-numbered node of a pair listens on
//! its service ID, the higher one sends the REQ with its QP's number and PSN — and moves each
//! link's QP to RTR and RTS with the QP number and PSNs the CM negotiated (the other QP
//! attributes are the run's, as without the CM).
//!
//! The MADs go through the run's network fault plan (the node installs it before connecting
//! and again, from the run's start, at the start barrier), so loss exercises CM retries.
//!
//! What it is not: the workload's transport, nor a CM for the rest of the run: the GSI is
//! closed once every link is established and no MAD has moved for a while.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use emu_cm::connector::{Connector, ConnectorEvent, LinkParams, PeerLink};
use emu_cm::wire::MAD_LEN;
use emu_cm::{CmConfig, MadAddr};
use emu_udp::{UdpContext, UdpCq, UdpMr, UdpPd, UdpQp};
use verbs_api::{
    AccessFlags, AddressHandle, AhAttr, CompletionQueue, Context, Endpoint, GRH_LEN, MemoryRegion,
    QpCap, QueuePair, RcConnectOptions, RecvWr, SendOp, SendWr, UdDest, WcStatus, WorkCompletion,
    connect_rc, init_ah_from_wc,
};

/// The GSI's Q_Key.
const GSI_QKEY: u32 = 0x8001_0000;
/// Receive WRs kept posted on the GSI.
const RECVS: usize = 16;
/// Bytes of one receive slot: the GRH, then the MAD.
const SLOT: usize = GRH_LEN + MAD_LEN;
/// How long a node keeps answering MADs after its last one once every link is established:
/// a lost RTU makes the passive side resend its REP, which the active side answers again.
const LINGER: Duration = Duration::from_millis(400);
/// How long one MAD send may take to complete.
const SEND_WAIT: Duration = Duration::from_secs(2);

/// One RC link to connect: the peer, the local QP, the PSN it expects first, and the peer
/// device's GID and UDP port (from its endpoint).
pub(crate) struct CmLink<'a> {
    /// The peer's node index.
    pub(crate) peer: u32,
    /// The local RC QP of the link.
    pub(crate) qp: &'a UdpQp,
    /// The PSN the local QP expects to receive first.
    pub(crate) recv_psn: u32,
    /// The peer's endpoint: its GID and UDP port address the peer's GSI.
    pub(crate) ep: Endpoint,
}

/// The GSI of a node and its buffers.
struct Gsi {
    qp: UdpQp,
    scq: UdpCq,
    rcq: UdpCq,
    mr: UdpMr,
}

/// Connects every link through the CM by `deadline`: on return each QP is in RTS.
pub(crate) fn connect(
    ctx: &UdpContext,
    pd: &UdpPd,
    index: u32,
    seed: u64,
    links: &[CmLink<'_>],
    opts: &RcConnectOptions,
    deadline: Instant,
) -> Result<(), String> {
    let err = |what: &'static str| move |e: verbs_api::Error| format!("--cm rdma: {what}: {e}");
    let gsi = open(ctx, pd).map_err(err("opening the GSI"))?;
    let mut ahs = BTreeMap::new();
    let mut peers = Vec::new();
    for l in links {
        let attr = AhAttr {
            dgid: l.ep.gid,
            udp_dport: l.ep.udp_port,
            ..AhAttr::default()
        };
        ahs.insert(
            l.ep.gid.0,
            ctx.create_ah(pd, &attr).map_err(err("create_ah"))?,
        );
        peers.push(PeerLink {
            node: node16(l.peer)?,
            gsi: MadAddr {
                gid: l.ep.gid.0,
                qpn: 1,
            },
            local_qpn: l.qp.qp_num(),
            recv_psn: l.recv_psn,
        });
    }
    let config = CmConfig {
        local_gid: ctx.query_gid(1, 0).map_err(err("query_gid"))?.0,
        ca_guid: 0x5356_0000_0000_0000 | u64::from(index),
        seed: seed ^ u64::from(index).rotate_left(17),
    };
    let start = Instant::now();
    let now = || emu_cm::Instant::from_nanos(start.elapsed().as_nanos() as u64);
    let mut conn = Connector::new(now(), config, node16(index)?, LinkParams::default(), peers)
        .map_err(|e| format!("--cm rdma: {e}"))?;
    for slot in 0..RECVS {
        post_recv(&gsi, slot).map_err(err("post_recv"))?;
    }
    let mut last_mad = Instant::now();
    loop {
        while let Some(ev) = conn.poll_event() {
            match ev {
                ConnectorEvent::Ready(r) => {
                    let link = links
                        .iter()
                        .find(|l| u32::from(r.peer) == l.peer)
                        .ok_or("--cm rdma: a link of no peer")?;
                    let remote = Endpoint {
                        qpn: r.remote_qpn,
                        psn: r.recv_psn,
                        ..link.ep
                    };
                    connect_rc(link.qp, r.send_psn, &remote, opts)
                        .map_err(|e| format!("--cm rdma: connecting to node {}: {e}", r.peer))?;
                }
                ConnectorEvent::Established { .. } => {}
                ConnectorEvent::Failed { peer, why } => {
                    return Err(format!("--cm rdma: the link to node {peer}: {why}"));
                }
            }
        }
        let mut busy = false;
        while let Some((to, mad)) = conn.poll_transmit() {
            busy = true;
            let ah = ahs.get(&to.gid).ok_or("--cm rdma: a MAD to no peer")?;
            send_mad(&gsi, ah, to.qpn, &mad)?;
        }
        if busy {
            last_mad = Instant::now();
        }
        if conn.all_established() && last_mad.elapsed() >= LINGER {
            return Ok(());
        }
        let mut wc = [WorkCompletion::default(); RECVS];
        let n = gsi.rcq.poll(&mut wc).map_err(err("polling the GSI"))?;
        for wc in &wc[..n] {
            busy = true;
            last_mad = Instant::now();
            if let Some((from, mad)) = received(&gsi, wc) {
                conn.handle_mad(now(), from, &mad);
            }
            post_recv(&gsi, wc.wr_id as usize).map_err(err("post_recv"))?;
        }
        if conn.poll_timeout().is_some_and(|t| t <= now()) {
            conn.handle_timeout(now());
        }
        if Instant::now() > deadline {
            return Err("--cm rdma: the links were not established in time".into());
        }
        if !busy {
            std::thread::sleep(Duration::from_micros(500));
        }
    }
}

fn node16(index: u32) -> Result<u16, String> {
    u16::try_from(index).map_err(|_| format!("--cm rdma: node index {index} too large"))
}

fn open(ctx: &UdpContext, pd: &UdpPd) -> verbs_api::Result<Gsi> {
    let cap = QpCap {
        max_send_wr: 4,
        max_recv_wr: RECVS as u32,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let scq = ctx.create_cq(8, None)?;
    let rcq = ctx.create_cq(RECVS as u32 * 2, None)?;
    let qp = ctx.open_gsi(pd, &scq, &rcq, cap)?;
    let mr = ctx.alloc_mr(pd, SLOT * (RECVS + 1), AccessFlags::LOCAL_WRITE)?;
    Ok(Gsi { qp, scq, rcq, mr })
}

fn post_recv(gsi: &Gsi, slot: usize) -> verbs_api::Result<()> {
    let sge = [gsi.mr.sge(slot * SLOT, SLOT)?];
    gsi.qp
        .post_recv(&[RecvWr::new(slot as u64, &sge)])
        .map_err(|e| e.error)
}

/// The sender and MAD of a successful receive completion.
fn received(gsi: &Gsi, wc: &WorkCompletion) -> Option<(MadAddr, Vec<u8>)> {
    if wc.status != WcStatus::Success {
        return None;
    }
    let off = wc.wr_id as usize * SLOT;
    let mut grh = [0u8; GRH_LEN];
    gsi.mr.read(off, &mut grh).ok()?;
    let from = init_ah_from_wc(wc, &grh, 1).ok()?;
    let len = (wc.byte_len as usize).saturating_sub(GRH_LEN).min(MAD_LEN);
    let mut mad = vec![0u8; len];
    gsi.mr.read(off + GRH_LEN, &mut mad).ok()?;
    Some((
        MadAddr {
            gid: from.dgid.0,
            qpn: wc.src_qp,
        },
        mad,
    ))
}

/// Sends one MAD from the slot after the receive slots and waits for its completion.
fn send_mad(
    gsi: &Gsi,
    ah: &<UdpContext as Context>::Ah,
    qpn: u32,
    mad: &[u8],
) -> Result<(), String> {
    let err = |e: verbs_api::Error| format!("--cm rdma: sending a MAD: {e}");
    let off = RECVS * SLOT;
    gsi.mr.write(off, mad).map_err(err)?;
    let sge = [gsi.mr.sge(off, mad.len()).map_err(err)?];
    let dest = UdDest {
        ah: ah.handle(),
        remote_qpn: qpn,
        remote_qkey: GSI_QKEY,
    };
    gsi.qp
        .post_send(&[SendWr::new(0, SendOp::Send, &sge).with_ud(dest)])
        .map_err(|e| err(e.error))?;
    let end = Instant::now() + SEND_WAIT;
    let mut wc = [WorkCompletion::default(); 1];
    while Instant::now() < end {
        if gsi.scq.poll(&mut wc).map_err(err)? == 1 {
            return match wc[0].status {
                WcStatus::Success => Ok(()),
                s => Err(format!("--cm rdma: a MAD send completed with {s:?}")),
            };
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    Err("--cm rdma: a MAD send did not complete".into())
}
