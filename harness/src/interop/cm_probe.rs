//! `softverbs cm-probe`: one IB CM handshake attempt from a UDP device's GSI (QP1) to a peer's
//! QP1, for interop with a real kernel CM (`scripts/rxe-interop.sh`, check (i)): it sends a
//! REQ (`emu_cm::Cm`, with an rdma_cm private-data header) for a service ID and reports the
//! answer — REJ with its reason, REP (then rejected by us), or unreachable after the CM's
//! retries. Against a service nobody listens on, a kernel CM answers REJ reason 8 (invalid
//! service ID).
//!
//! It moves no QP: the REQ names a QP number this device does not serve, which is fine for a
//! REQ meant to be rejected.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant as WallClock};

use emu_cm::wire::{CMA_HDR_LEN, CmaHdrRepr, MAD_LEN};
use emu_cm::{Cm, CmConfig, CmEvent, ConnectParams, Instant, MadAddr, reason, service_id};
use emu_proto::{GSI_QKEY, GSI_QPN};
use emu_udp::{UdpContext, UdpProvider};
use verbs_api::{
    AccessFlags, AddressHandle, AhAttr, CompletionQueue, Context, Device, GRH_LEN, Gid,
    MemoryRegion, Provider, QpCap, QueuePair, RecvWr, SendFlags, SendOp, SendWr, UdDest,
    WorkCompletion, init_ah_from_wc,
};

use super::{InteropError, Result};

/// Receive slots (GRH + MAD each).
const SLOTS: usize = 16;
const SLOT: usize = GRH_LEN + MAD_LEN;

/// `softverbs cm-probe` flags.
#[derive(clap::Args, Clone, Debug)]
pub struct CmProbeArgs {
    /// The local UDP device's address (IP:4791 for a real RoCEv2 peer).
    #[arg(long, value_name = "IP:PORT")]
    pub bind: SocketAddr,
    /// The peer's IP address (its GID on RoCEv2).
    #[arg(value_name = "PEER")]
    pub peer: IpAddr,
    /// The rdma_cm TCP port space's port the REQ asks for (service ID 0x0000_0000_0106_PPPP).
    #[arg(long, default_value_t = 7471)]
    pub port: u16,
    /// Succeed only on a REJ with this reason (8: invalid service ID).
    #[arg(long, value_name = "REASON")]
    pub expect_reject: Option<u16>,
    /// Succeed only on a REP (a listener accepted; the REP is then rejected): REJ "invalid
    /// service ID" means the listener is not up yet, and the REQ is sent again.
    #[arg(long, conflicts_with = "expect_reject")]
    pub expect_rep: bool,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 20)]
    pub timeout: u64,
}

/// Runs `softverbs cm-probe`; prints the outcome. Exit code 0 when it is the expected one (any
/// answer without `--expect-reject`), 1 otherwise.
pub fn run(args: &CmProbeArgs) -> u8 {
    match probe(args) {
        Ok(line) => {
            println!("cm-probe: {line}");
            0
        }
        Err(e) => {
            eprintln!("cm-probe: {e}");
            1
        }
    }
}

/// The GSI and what posting on it needs.
struct Gsi {
    ctx: UdpContext,
    qp: <UdpContext as Context>::Qp,
    cq: <UdpContext as Context>::Cq,
    mr: <UdpContext as Context>::Mr,
    ah: <UdpContext as Context>::Ah,
}

fn err(what: &str, e: impl std::fmt::Display) -> InteropError {
    InteropError::new(format!("{what}: {e}"))
}

fn open(args: &CmProbeArgs) -> Result<Gsi> {
    let provider = UdpProvider::builder()
        .device(args.bind)
        .foreign_ipv4_ident(true)
        .build()
        .map_err(|e| err("open the UDP device", e))?;
    let dev = provider.devices().map_err(|e| err("devices", e))?;
    let ctx = dev
        .first()
        .ok_or_else(|| InteropError::new("no device"))?
        .open()
        .map_err(|e| err("open", e))?;
    let pd = ctx.alloc_pd().map_err(|e| err("alloc_pd", e))?;
    let cq = ctx.create_cq(64, None).map_err(|e| err("create_cq", e))?;
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: SLOTS as u32,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = ctx
        .open_gsi(&pd, &cq, &cq, cap)
        .map_err(|e| err("open the GSI", e))?;
    let mr = ctx
        .alloc_mr(&pd, (SLOTS + 1) * SLOT, AccessFlags::LOCAL_WRITE)
        .map_err(|e| err("alloc_mr", e))?;
    let attr = AhAttr {
        dgid: Gid::from_ip(args.peer),
        ..AhAttr::default()
    };
    let ah = ctx.create_ah(&pd, &attr).map_err(|e| err("create_ah", e))?;
    let gsi = Gsi {
        ctx,
        qp,
        cq,
        mr,
        ah,
    };
    for slot in 0..SLOTS {
        gsi.post_recv(slot)?;
    }
    Ok(gsi)
}

impl Gsi {
    fn post_recv(&self, slot: usize) -> Result<()> {
        let sge = [self.mr.sge(slot * SLOT, SLOT).map_err(|e| err("sge", e))?];
        self.qp
            .post_recv(&[RecvWr::new(slot as u64, &sge)])
            .map_err(|e| err("post_recv", e.error))
    }

    /// Sends `mad` to the peer's QP `qpn` from the slot after the receive slots.
    fn send(&self, qpn: u32, mad: &[u8]) -> Result<()> {
        let at = SLOTS * SLOT;
        self.mr.write(at, mad).map_err(|e| err("write", e))?;
        let sge = [self.mr.sge(at, mad.len()).map_err(|e| err("sge", e))?];
        let dest = UdDest {
            ah: self.ah.handle(),
            remote_qpn: qpn,
            remote_qkey: GSI_QKEY,
        };
        let mut wr = SendWr::new(u64::MAX, SendOp::Send, &sge).with_ud(dest);
        wr.flags = SendFlags::SIGNALED;
        self.qp
            .post_send(&[wr])
            .map_err(|e| err("post_send", e.error))
    }

    /// Feeds every received MAD to `cm` (from the GRH's source and the completion's source QP).
    fn receive(&self, cm: &mut Cm, now: Instant) -> Result<()> {
        let mut wcs = [WorkCompletion::default(); 16];
        let n = self.cq.poll(&mut wcs).map_err(|e| err("poll_cq", e))?;
        for wc in &wcs[..n] {
            if wc.wr_id == u64::MAX {
                continue;
            }
            let slot = usize::try_from(wc.wr_id).unwrap_or(0);
            let mut buf = vec![0u8; SLOT];
            self.mr
                .read(slot * SLOT, &mut buf)
                .map_err(|e| err("read", e))?;
            if let Ok(ah) = init_ah_from_wc(wc, &buf[..GRH_LEN], 1) {
                let len = (wc.byte_len as usize).min(SLOT);
                let from = MadAddr {
                    gid: ah.dgid.0,
                    qpn: wc.src_qp,
                };
                cm.handle_mad(now, from, &buf[GRH_LEN..len]);
            }
            self.post_recv(slot)?;
        }
        Ok(())
    }
}

fn probe(args: &CmProbeArgs) -> Result<String> {
    let gsi = open(args)?;
    let local_gid = gsi.ctx.query_gid(1, 0).map_err(|e| err("query_gid", e))?;
    let mut cm = Cm::new(CmConfig {
        local_gid: local_gid.0,
        ca_guid: 0x0200_00ff_fe00_0001,
        seed: u64::from(std::process::id()),
    });
    let mut private_data = vec![0u8; CMA_HDR_LEN];
    CmaHdrRepr::new(args.bind.ip(), 0xC000, args.peer)
        .emit(&mut private_data)
        .ok_or_else(|| InteropError::new("CMA header"))?;
    let params = ConnectParams {
        service_id: service_id(0x0106, args.port),
        remote: MadAddr {
            gid: Gid::from_ip(args.peer).0,
            qpn: GSI_QPN,
        },
        local_qpn: 0x77,
        starting_psn: 0x1234,
        reliable: true,
        responder_resources: 1,
        initiator_depth: 1,
        path_mtu: 3,
        retry_count: 7,
        rnr_retry_count: 7,
        local_ack_timeout: 14,
        cm_response_timeout: 18,
        max_cm_retries: 10,
        private_data,
    };
    let start = WallClock::now();
    let now = || Instant::from_nanos(u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX));
    cm.connect(now(), params.clone())
        .map_err(|e| err("connect", e))?;
    let deadline = start + Duration::from_secs(args.timeout);
    while WallClock::now() < deadline {
        while let Some((to, mad)) = cm.poll_transmit() {
            gsi.send(to.qpn, &mad)?;
        }
        gsi.receive(&mut cm, now())?;
        cm.handle_timeout(now());
        while let Some(ev) = cm.poll_event() {
            let not_yet = matches!(
                ev,
                CmEvent::Rejected {
                    reason: reason::INVALID_SERVICE_ID,
                    ..
                }
            );
            if args.expect_rep && not_yet {
                std::thread::sleep(Duration::from_millis(200));
                cm.connect(now(), params.clone())
                    .map_err(|e| err("connect", e))?;
                continue;
            }
            if let Some(done) = outcome(args, &mut cm, now(), ev) {
                while let Some((to, mad)) = cm.poll_transmit() {
                    gsi.send(to.qpn, &mad)?;
                }
                return done;
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Err(InteropError::new(format!(
        "no answer within {} s",
        args.timeout
    )))
}

/// The verdict an event gives, if it ends the probe.
fn outcome(args: &CmProbeArgs, cm: &mut Cm, now: Instant, ev: CmEvent) -> Option<Result<String>> {
    let (line, expected) = match ev {
        CmEvent::Rejected { reason: r, .. } => (
            format!("REJ reason {r}"),
            !args.expect_rep && args.expect_reject.is_none_or(|want| want == r),
        ),
        CmEvent::RepReceived { id, rep } => {
            let _ = cm.reject(now, id, reason::CONSUMER, &[]);
            let line = format!(
                "REP from QPN {:#x}, starting PSN {:#x}, responder resources {}, initiator \
                 depth {} (rejected)",
                rep.remote_qpn, rep.starting_psn, rep.responder_resources, rep.initiator_depth
            );
            (line, args.expect_reject.is_none())
        }
        CmEvent::Unreachable { .. } => (
            "unreachable after the CM retries".to_string(),
            args.expect_reject.is_none() && !args.expect_rep,
        ),
        _ => return None,
    };
    Some(if expected {
        Ok(line)
    } else {
        Err(InteropError::new(format!(
            "{line}: not the expected answer"
        )))
    })
}
