//! Node mode (`softverbs node`, hidden): one process of a run, driven by the orchestrator over
//! stdin/stdout (see [`crate::run::proto`]).
//!
//! A node owns one UDP device on 127.0.0.(10 + index) with an OS-chosen port, one
//! file-backed memory region (see [`crate::run::layout`]) and, per peer, an RC QP with its own
//! send CQ and receive CQ (so a completion's queue never depends on its opcode field). It
//! runs the workload, logs every completion it polls (see [`crate::run::log`]), WRITEs a fin
//! word to every peer, and keeps answering its peers until told to quiesce.
//!
//! Every loop is bounded: the workload by `--ops`/`--duration` and the capacity of the
//! append-only areas, each drain by the retry budget plus the slack, and the whole process by
//! its deadline (and by its stdin: when the orchestrator goes away, so does the node).

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::collections::VecDeque;
use std::io::{BufRead, Write};
use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use emu_fault::{FaultPlan, NodeId};
use emu_udp::oob::RemoteMr;
use emu_udp::{UdpContext, UdpCq, UdpMr, UdpProvider, UdpQp};
use verbs_api::{
    AccessFlags, AddressHandle, AhAttr, CompletionChannel, CompletionQueue, Context, Device,
    Endpoint, MemoryRegion, Provider, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QueuePair,
    RcConnectOptions, RecvWr, SendOp, SendWr, UdDest, WcFlags, WcStatus, WorkCompletion,
    connect_rc,
};

use crate::run::layout::{self, PONG, RecordKind, Rng, Workload};
use crate::run::log::{Entry, LogWriter, OpKind, Posted};
use crate::run::plan::shift_plan;
use crate::run::proto::{
    FromNode, HelloEndpoint, InjectedFaults, NodeConfig, NodeSummary, PeerInfo, ToNode,
    TransportStats,
};

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Send WRs a node keeps outstanding on one QP at most (the send queue holds 64).
const SQ_LIMIT: usize = 60;
/// Receive WRs a node keeps posted on one QP.
const RQ_DEPTH: u64 = 64;
/// Completions polled per CQ per call.
const POLL_BATCH: usize = 32;
/// QPs (consecutive links) that share one send CQ and one receive CQ when a node has more
/// than one QP per peer. Every empty poll drives the device in the polling thread, so a main
/// loop that polled two CQs per QP would spend its time in device passes with a thousand QPs.
/// With one QP per peer every QP keeps CQs of its own.
const CQ_GROUP: usize = 64;
/// How often a node reports progress.
const PROGRESS_EVERY: Duration = Duration::from_millis(20);
/// The Q_Key of every UD QP of a run.
const UD_QKEY: u32 = 0x5356_5544;

/// The UDP device's address handle.
type UdpAh = <UdpContext as Context>::Ah;

/// How long a node waits for each setup message.
const SETUP_TIMEOUT: Duration = Duration::from_secs(20);

const ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

enum Input {
    Msg(Box<ToNode>),
    Bad(String),
    Eof,
}

/// Runs node mode on this process's stdin/stdout; the exit code is 0 after an orderly exit.
pub fn node_main() -> ExitCode {
    let (tx, rx) = crossbeam_channel::unbounded();
    // The reader thread ends at EOF; the process exits without joining it.
    let spawned = std::thread::Builder::new()
        .name("control".into())
        .spawn(move || read_control(&tx));
    if let Err(e) = spawned {
        eprintln!("softverbs node: cannot start the control reader: {e}");
        return ExitCode::from(1);
    }
    match run(&rx) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("softverbs node: {message}");
            let _ = send(&FromNode::Error { message });
            ExitCode::from(1)
        }
    }
}

fn read_control(tx: &Sender<Input>) {
    let stdin = std::io::stdin();
    let mut lock = stdin.lock();
    loop {
        let mut line = Vec::new();
        let read = std::io::Read::take(&mut lock, crate::run::proto::MAX_LINE)
            .read_until(b'\n', &mut line);
        let input = match read {
            Ok(0) | Err(_) => Input::Eof,
            Ok(_) if line.last() != Some(&b'\n') => Input::Bad("control line too long".into()),
            Ok(_) => match serde_json::from_slice::<ToNode>(&line) {
                Ok(m) => Input::Msg(Box::new(m)),
                Err(e) => Input::Bad(format!("bad control message: {e}")),
            },
        };
        let end = matches!(input, Input::Eof | Input::Bad(_));
        if tx.send(input).is_err() || end {
            return;
        }
    }
}

/// Writes one message to stdout.
fn send(msg: &FromNode) -> Result<(), String> {
    let mut line = serde_json::to_vec(msg).map_err(|e| e.to_string())?;
    line.push(b'\n');
    let mut out = std::io::stdout().lock();
    out.write_all(&line)
        .and_then(|()| out.flush())
        .map_err(|e| format!("writing to the orchestrator: {e}"))
}

fn err<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// Waits for the next control message (bounded by `timeout`).
fn next_msg(rx: &Receiver<Input>, timeout: Duration) -> Result<ToNode, String> {
    match rx.recv_timeout(timeout) {
        Ok(Input::Msg(m)) => Ok(*m),
        Ok(Input::Bad(e)) => Err(e),
        Ok(Input::Eof) | Err(RecvTimeoutError::Disconnected) => {
            Err("the orchestrator closed the control channel".into())
        }
        Err(RecvTimeoutError::Timeout) => Err(format!("no control message in {timeout:?}")),
    }
}

fn run(rx: &Receiver<Input>) -> Result<(), String> {
    let started = Instant::now();
    let cfg = match next_msg(rx, SETUP_TIMEOUT)? {
        ToNode::Config(c) => c,
        other => return Err(format!("expected config, got {other:?}")),
    };
    let deadline = started + Duration::from_millis(cfg.deadline_ms);
    let plan = cfg
        .plan
        .as_deref()
        .map(FaultPlan::from_toml)
        .transpose()
        .map_err(err("fault plan"))?;
    let ip = layout::node_ip(cfg.index);
    let mut builder = UdpProvider::builder()
        .device(SocketAddr::new(IpAddr::V4(ip), 0))
        .first_node(NodeId(cfg.index))
        .seed(layout::mix(
            cfg.seed ^ u64::from(cfg.index) << 32 ^ u64::from(cfg.generation),
        ));
    if let Some(pcap) = &cfg.pcap {
        builder = builder.capture(pcap);
    }
    let provider = builder.build().map_err(err("building the UDP device"))?;
    // The device's engine clock starts about now: fault-plan times are shifted by the time
    // from here to the start barrier.
    let device_epoch = Instant::now();
    let ctx = provider
        .devices()
        .map_err(err("listing devices"))?
        .first()
        .ok_or("the provider has no device")?
        .open()
        .map_err(err("opening the device"))?;
    let peers = if cfg.standby {
        Vec::new()
    } else {
        layout::peers(cfg.nodes, cfg.workload, cfg.index)
    };
    let pd = ctx.alloc_pd().map_err(err("alloc_pd"))?;
    let path = cfg.run_dir.join(layout::mr_file(cfg.index, cfg.generation));
    let qps = cfg.qps_per_peer.max(1);
    let links = peers.len() * qps as usize;
    let len = usize::try_from(layout::region_len(links)).map_err(err("region size"))?;
    let mr = ctx
        .reg_mr_file(&pd, &path, len, ACCESS)
        .map_err(err("registering the MR file"))?;
    let pattern = layout::pattern(cfg.seed, cfg.index, 0, layout::PATTERN_LEN as usize);
    mr.write(layout::PATTERN_OFF as usize, &pattern)
        .map_err(err("writing the pattern"))?;
    let channel = ctx
        .create_comp_channel()
        .map_err(err("create_comp_channel"))?;
    let log_path = cfg
        .run_dir
        .join(layout::log_file(cfg.index, cfg.generation));
    let mut log = LogWriter::create(&log_path).map_err(err("creating the log"))?;
    log.push(&Entry::Start {
        node: cfg.index,
        generation: cfg.generation,
        at: unix_ms(),
        peers: peers.clone(),
    });
    log.flush(true).map_err(err("writing the log"))?;

    let cap = QpCap {
        max_send_wr: 64,
        max_recv_wr: 128,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let ud_cap = QpCap {
        max_recv_wr: layout::UD_RQ_DEPTH as u32,
        ..cap
    };
    let mut raw = Vec::new();
    let group = if qps > 1 { CQ_GROUP } else { 1 };
    let mut shared: Option<(UdpCq, UdpCq)> = None;
    // Peer-major: the QPs of a peer are consecutive links (`layout::link_position`).
    for (k, (peer, q)) in peers
        .iter()
        .flat_map(|&p| (0..qps).map(move |q| (p, q)))
        .enumerate()
    {
        let (scq, rcq) = match &shared {
            Some(cqs) if k % group != 0 => cqs.clone(),
            _ => {
                let cqs = link_cqs(&ctx, &channel, cfg.workload, group, cap)?;
                shared = Some(cqs.clone());
                cqs
            }
        };
        let init = if cfg.workload.is_ud() {
            QpInitAttr::ud(ud_cap)
        } else {
            QpInitAttr::rc(cap)
        };
        let qp = ctx
            .create_qp(&pd, &scq, &rcq, None, &init)
            .map_err(err("create_qp"))?;
        let resp = if peer == cfg.index {
            let cq = ctx.create_cq(16, None).map_err(err("create_cq"))?;
            let qp = ctx
                .create_qp(&pd, &cq, &cq, None, &QpInitAttr::rc(cap))
                .map_err(err("create_qp"))?;
            Some((qp, cq))
        } else {
            None
        };
        raw.push((peer, q, qp, scq, rcq, resp));
    }
    // QP q > 0 of a pair draws its PSNs with q mixed in; QP 0's are those of a single QP.
    let psn = |peer: u32, q: u32, side: u64| {
        (layout::mix(
            cfg.seed
                ^ u64::from(cfg.index) << 40
                ^ u64::from(peer) << 8
                ^ side
                ^ u64::from(q) << 20,
        ) & 0xFF_FFFF) as u32
    };
    let mut endpoints: Vec<HelloEndpoint> = Vec::new();
    for (peer, q, qp, ..) in &raw {
        if *peer != cfg.index {
            let ep = qp.endpoint(psn(*peer, *q, 0)).map_err(err("endpoint"))?;
            match endpoints.last_mut() {
                Some(last) if last.peer == *peer => {
                    last.endpoint.push(';');
                    last.endpoint += &ep.to_string();
                }
                _ => endpoints.push(HelloEndpoint {
                    peer: *peer,
                    endpoint: ep.to_string(),
                }),
            }
        }
    }
    let my_mr = RemoteMr {
        addr: mr.addr(),
        rkey: mr.rkey(),
        len: mr.len() as u64,
    };
    send(&FromNode::Hello {
        addr: ctx.local_addr().to_string(),
        mr: my_mr.to_string(),
        endpoints,
    })?;

    if cfg.standby {
        return standby(rx, deadline);
    }

    let infos = match next_msg(rx, SETUP_TIMEOUT)? {
        ToNode::Peers { peers } => peers,
        ToNode::Exit => return Ok(()),
        other => return Err(format!("expected peers, got {other:?}")),
    };
    let opts = RcConnectOptions {
        timeout: cfg.qp.timeout,
        retry_cnt: cfg.qp.retry_cnt,
        rnr_retry: cfg.qp.rnr_retry,
        recovery: cfg.qp.recovery.recovery(),
        ..RcConnectOptions::default()
    };
    let mut links = Vec::with_capacity(raw.len());
    // `--cm rdma`: the links the CM connects after they are all built (position, peer, endpoint).
    let mut by_cm = Vec::new();
    for (pos, (peer, q, qp, scq, rcq, resp)) in raw.into_iter().enumerate() {
        let peer_pos = layout::link_position(cfg.nodes, cfg.workload, qps, peer, cfg.index, q)
            .ok_or_else(|| format!("node {peer} does not list node {}", cfg.index))?;
        let mut ud = None;
        let remote = if let Some((rqp, _)) = &resp {
            let ep_a = qp.endpoint(psn(peer, q, 1)).map_err(err("endpoint"))?;
            let ep_b = rqp.endpoint(psn(peer, q, 2)).map_err(err("endpoint"))?;
            connect_rc(&qp, ep_a.psn, &ep_b, &opts).map_err(err("connecting the loopback QP"))?;
            connect_rc(rqp, ep_b.psn, &ep_a, &opts).map_err(err("connecting the loopback QP"))?;
            my_mr
        } else {
            let info = infos
                .iter()
                .find(|p| p.index == peer)
                .ok_or_else(|| format!("no endpoint for peer {peer}"))?;
            if cfg.workload.is_ud() {
                let (remote, ah, dest) = connect_ud(&ctx, &pd, &qp, psn(peer, 0, 0), info)?;
                ud = Some((ah, dest));
                remote
            } else {
                let (remote, ep) =
                    connect_peer(&ctx, &qp, psn(peer, q, 0), info, q, &opts, cfg.cm)?;
                if cfg.cm {
                    by_cm.push((links.len(), peer, ep));
                }
                remote
            }
        };
        let mut link = Link::new(peer, pos, peer_pos, qp, scq, rcq, resp, remote);
        link.ud = ud;
        link.qp_index = q;
        links.push(link);
    }
    if cfg.cm {
        // The CM's MADs go through the same fault stage as the workload (loss exercises CM
        // retries); the plan is installed again, from the run's start, at the start barrier.
        if let Some(plan) = plan.as_ref().filter(|p| !p.rules.is_empty()) {
            ctx.set_faults(Some(shift_plan(plan, device_epoch.elapsed())))
                .map_err(err("installing the fault plan"))?;
        }
        let cm_links: Vec<_> = by_cm
            .into_iter()
            .map(|(li, peer, ep)| crate::run::cm::CmLink {
                peer,
                qp: &links[li].qp,
                recv_psn: psn(peer, 0, 0),
                ep,
            })
            .collect();
        crate::run::cm::connect(&ctx, &pd, cfg.index, cfg.seed, &cm_links, &opts, deadline)?;
    }
    let groups = (0..links.len())
        .step_by(group)
        .map(|start| start..(start + group).min(links.len()))
        .collect();
    let by_qpn = links
        .iter()
        .enumerate()
        .map(|(li, l)| (l.qp.qp_num(), li))
        .collect();
    let mut node = Node {
        rng: Rng::new(cfg.seed ^ layout::mix(u64::from(cfg.index) + 1)),
        cfg,
        ctx,
        mr,
        channel,
        links,
        groups,
        by_qpn,
        log,
        deadline,
        summary: NodeSummary::default(),
        issued: 0,
        next_link: 0,
        problems_sent: 0,
    };
    // A datagram that finds no receive WR is dropped: a UD link's receives are posted before
    // the start barrier, so that no peer's first datagrams can arrive before them.
    if node.cfg.workload.is_ud() {
        for li in 0..node.links.len() {
            node.top_up_recvs(li);
        }
    }
    send(&FromNode::Connected)?;
    match next_msg(rx, SETUP_TIMEOUT)? {
        ToNode::Start => {}
        ToNode::Exit => return Ok(()),
        other => return Err(format!("expected start, got {other:?}")),
    }
    if let Some(plan) = plan.filter(|p| !p.rules.is_empty()) {
        node.ctx
            .set_faults(Some(shift_plan(&plan, device_epoch.elapsed())))
            .map_err(err("installing the fault plan"))?;
    }
    node.log.push(&Entry::Run { at: unix_ms() });
    let result = node.main_loop(rx);
    drop(node);
    // Closes the capture (if any) and reports a write error; a killed node's capture ends
    // with its last buffered packets missing.
    provider.shutdown();
    result.and(
        provider
            .finish_capture()
            .map_err(err("writing the packet capture")),
    )
}

/// The send and receive CQ of `group` links (one link: CQs of its own, sized as ever; more:
/// room for every WR the QPs' caps allow).
fn link_cqs(
    ctx: &UdpContext,
    channel: &emu_udp::UdpChannel,
    workload: Workload,
    group: usize,
    cap: QpCap,
) -> Result<(UdpCq, UdpCq), String> {
    let (slen, rlen) = if group > 1 {
        let g = u32::try_from(group).map_err(err("CQ group"))?;
        (g * cap.max_send_wr, g * cap.max_recv_wr)
    } else if workload.is_ud() {
        // A UD link's receives all complete without the sender waiting for anything: its
        // receive CQ holds as many completions as receives are posted.
        (256, layout::UD_RQ_DEPTH as u32)
    } else {
        (256, 256)
    };
    let scq = ctx
        .create_cq(slen, Some(channel))
        .map_err(err("create_cq"))?;
    let rcq = ctx
        .create_cq(rlen, Some(channel))
        .map_err(err("create_cq"))?;
    Ok((scq, rcq))
}

fn connect_peer(
    ctx: &UdpContext,
    qp: &UdpQp,
    psn: u32,
    info: &PeerInfo,
    q: u32,
    opts: &RcConnectOptions,
    cm: bool,
) -> Result<(RemoteMr, Endpoint), String> {
    let ep: Endpoint = info
        .endpoint
        .split(';')
        .nth(q as usize)
        .ok_or_else(|| format!("peer {} has no QP {q} for this node", info.index))?
        .parse()
        .map_err(err(&format!("peer {} endpoint", info.index)))?;
    let remote: RemoteMr = info
        .mr
        .parse()
        .map_err(err(&format!("peer {} MR", info.index)))?;
    let addr: SocketAddr = info
        .addr
        .parse()
        .map_err(err(&format!("peer {} address", info.index)))?;
    ctx.set_peer_node(addr, NodeId(info.index));
    // With the CM, the QP is connected with what the CM negotiates (`crate::run::cm`).
    if !cm {
        connect_rc(qp, psn, &ep, opts)
            .map_err(err(&format!("connecting to node {}", info.index)))?;
    }
    Ok((remote, ep))
}

/// Brings the UD QP of a link to RTS (Q_Key [`UD_QKEY`]) and makes the address handle of
/// the peer's UD QP: the MR, AH and destination of the link.
fn connect_ud(
    ctx: &UdpContext,
    pd: &emu_udp::UdpPd,
    qp: &UdpQp,
    psn: u32,
    info: &PeerInfo,
) -> Result<(RemoteMr, UdpAh, UdDest), String> {
    let what = |w: &str| format!("peer {} {w}", info.index);
    let ep: Endpoint = info.endpoint.parse().map_err(err(&what("endpoint")))?;
    let remote: RemoteMr = info.mr.parse().map_err(err(&what("MR")))?;
    let addr: SocketAddr = info.addr.parse().map_err(err(&what("address")))?;
    ctx.set_peer_node(addr, NodeId(info.index));
    let attr = |qp_state| QpAttr {
        qp_state,
        port_num: 1,
        qkey: UD_QKEY,
        sq_psn: psn,
        ..QpAttr::default()
    };
    use QpAttrMask as M;
    let steps = [
        (QpState::Init, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY),
        (QpState::Rtr, M::STATE),
        (QpState::Rts, M::STATE | M::SQ_PSN),
    ];
    for (state, mask) in steps {
        qp.modify(&attr(state), mask)
            .map_err(err(&format!("UD QP to {state:?}")))?;
    }
    let ah = ctx
        .create_ah(
            pd,
            &AhAttr {
                dgid: ep.gid,
                udp_dport: ep.udp_port,
                ..AhAttr::default()
            },
        )
        .map_err(err(&what("address handle")))?;
    let dest = UdDest {
        ah: ah.handle(),
        remote_qpn: ep.qpn,
        remote_qkey: UD_QKEY,
    };
    Ok((remote, ah, dest))
}

/// A restarted node: device and MR are up; wait to be told to stop.
fn standby(rx: &Receiver<Input>, deadline: Instant) -> Result<(), String> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("deadline passed".into());
        }
        match rx.recv_timeout(left.min(Duration::from_millis(100))) {
            Ok(Input::Msg(m)) => match *m {
                ToNode::Quiesce => send(&FromNode::Done(Box::default()))?,
                ToNode::Exit => return Ok(()),
                _ => {}
            },
            Ok(Input::Bad(e)) => return Err(e),
            Ok(Input::Eof) | Err(RecvTimeoutError::Disconnected) => return Ok(()),
            Err(RecvTimeoutError::Timeout) => {}
        }
    }
}

/// One outstanding send WR.
#[derive(Clone, Debug)]
struct Op {
    wr: u64,
    op: OpKind,
    posted: u64,
    seq: u64,
    len: u32,
    roff: Option<u64>,
    loff: Option<u64>,
    imm: Option<u32>,
    kind: Option<RecordKind>,
    /// Counts as a workload operation (pongs and fins do not).
    counts: bool,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Fin {
    NotSent,
    Posted,
    Done,
}

struct Link {
    peer: u32,
    /// Which of the QPs to the peer this is (`--qps-per-peer`).
    qp_index: u32,
    /// This node's position for the peer: its areas in this node's MR.
    pos: usize,
    /// The peer's position for this node: this node's areas in the peer's MR.
    peer_pos: usize,
    qp: UdpQp,
    scq: UdpCq,
    rcq: UdpCq,
    /// The responder QP of a loopback link, and its CQ.
    resp: Option<(UdpQp, UdpCq)>,
    /// On a UD link: the address handle of the peer's QP and the destination of every send.
    ud: Option<(UdpAh, UdDest)>,
    remote: RemoteMr,
    last_wr: u64,
    outstanding: VecDeque<Op>,
    recv_posted: u64,
    recv_done: u64,
    write_seq: u64,
    write_off: u64,
    send_seq: u64,
    read_seq: u64,
    read_off: u64,
    faa_seq: u64,
    failed: Option<WcStatus>,
    fin: Fin,
    ping_no: u32,
    ping_out: Option<u32>,
    pongs_due: VecDeque<u32>,
    /// No capacity left for any operation of the workload.
    exhausted: bool,
    /// The last completion on this link (either queue).
    last_progress: Instant,
    /// A ping's pong did not come within two retry budgets and the slack: the peer's QP
    /// failed (its pong ran out of retries). No more workload on this link; the fin
    /// WRITE will report the QP's fate.
    stalled: bool,
}

impl Link {
    #[allow(clippy::too_many_arguments)] // a plain constructor of the link's parts
    fn new(
        peer: u32,
        pos: usize,
        peer_pos: usize,
        qp: UdpQp,
        scq: UdpCq,
        rcq: UdpCq,
        resp: Option<(UdpQp, UdpCq)>,
        remote: RemoteMr,
    ) -> Link {
        Link {
            peer,
            qp_index: 0,
            pos,
            peer_pos,
            qp,
            scq,
            rcq,
            resp,
            ud: None,
            remote,
            last_wr: 0,
            outstanding: VecDeque::new(),
            recv_posted: 0,
            recv_done: 0,
            write_seq: 0,
            write_off: 0,
            send_seq: 0,
            read_seq: 0,
            read_off: 0,
            faa_seq: 0,
            failed: None,
            fin: Fin::NotSent,
            ping_no: 0,
            ping_out: None,
            pongs_due: VecDeque::new(),
            exhausted: false,
            last_progress: Instant::now(),
            stalled: false,
        }
    }

    fn is_loopback(&self) -> bool {
        self.resp.is_some()
    }

    /// Workload operations in flight: posted WRs that count, plus an unanswered ping.
    fn counted_outstanding(&self) -> usize {
        self.outstanding.iter().filter(|o| o.counts).count() + usize::from(self.ping_out.is_some())
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Phase {
    /// Posting workload operations.
    Run,
    /// Waiting for the workload's outstanding operations.
    Drain(Instant),
    /// Waiting for the fin WRITEs.
    Fin(Instant),
    /// Finished; answering peers until quiesce.
    Linger,
    /// Draining everything before the final report.
    Quiesce(Instant),
    /// Reported; waiting for exit.
    Done,
}

struct Node {
    cfg: NodeConfig,
    ctx: UdpContext,
    mr: UdpMr,
    channel: emu_udp::UdpChannel,
    links: Vec<Link>,
    /// The links that share a send CQ and a receive CQ (those of the group's first link):
    /// one link each with one QP per peer, [`CQ_GROUP`] consecutive links otherwise.
    groups: Vec<std::ops::Range<usize>>,
    /// The link of each QP number, for completions on a shared CQ.
    by_qpn: std::collections::HashMap<u32, usize>,
    log: LogWriter,
    deadline: Instant,
    summary: NodeSummary,
    rng: Rng,
    /// Workload operations posted.
    issued: u64,
    next_link: usize,
    /// Problems already sent to the orchestrator (a prefix of `summary.problems`).
    problems_sent: usize,
}

impl Node {
    fn main_loop(&mut self, rx: &Receiver<Input>) -> Result<(), String> {
        let slack = Duration::from_millis(self.cfg.slack_ms);
        let budget = self.cfg.qp.retry_budget();
        let run_end = self
            .cfg
            .duration_ms
            .map(|ms| Instant::now() + Duration::from_millis(ms));
        let mut phase = Phase::Run;
        let mut last_progress = Instant::now();
        if matches!(
            self.cfg.workload,
            Workload::Pingpong | Workload::Mixed | Workload::UdSend
        ) {
            for li in 0..self.links.len() {
                self.top_up_recvs(li);
            }
        }
        loop {
            let now = Instant::now();
            if now >= self.deadline {
                let _ = self.log.flush(true);
                return Err("deadline passed before the orchestrator said exit".into());
            }
            // Control messages.
            loop {
                match rx.try_recv() {
                    Ok(Input::Msg(m)) => match *m {
                        ToNode::Quiesce if phase != Phase::Done => phase = Phase::Quiesce(now),
                        ToNode::Exit => {
                            self.log.flush(true).map_err(err("writing the log"))?;
                            return Ok(());
                        }
                        _ => {}
                    },
                    Ok(Input::Bad(e)) => return Err(e),
                    Ok(Input::Eof) | Err(TryRecvError::Disconnected) => {
                        let _ = self.log.flush(true);
                        return Ok(());
                    }
                    Err(TryRecvError::Empty) => break,
                }
            }
            let mut busy = false;
            match phase {
                Phase::Run => {
                    busy |= self.post_workload(run_end);
                    let out_of_budget = match (self.cfg.ops, run_end) {
                        (Some(ops), _) => self.issued >= ops,
                        (None, Some(end)) => now >= end,
                        (None, None) => true,
                    };
                    let no_link = self
                        .links
                        .iter()
                        .filter(|l| self.issues_on(l))
                        .all(|l| l.failed.is_some() || l.exhausted || l.stalled);
                    if out_of_budget || no_link {
                        phase = Phase::Drain(now);
                    }
                }
                Phase::Drain(since) => {
                    let idle = self.links.iter().all(|l| l.counted_outstanding() == 0);
                    if idle || now >= since + budget + slack {
                        for li in 0..self.links.len() {
                            self.post_fin(li);
                        }
                        phase = Phase::Fin(now);
                        busy = true;
                    }
                }
                Phase::Fin(since) => {
                    let done = self
                        .links
                        .iter()
                        .all(|l| l.fin != Fin::Posted || l.failed.is_some());
                    if done || now >= since + budget + slack {
                        // Written, not synced: peers may still need this node's pongs, and
                        // an fdatasync behind a busy disk can hold the loop for seconds (the
                        // sync thread syncs within SYNC_EVERY; `finish` syncs at the end).
                        self.log.flush(false).map_err(err("writing the log"))?;
                        send(&FromNode::Finished {
                            ops: self.summary.ops_ok,
                        })?;
                        phase = Phase::Linger;
                    }
                }
                Phase::Linger | Phase::Quiesce(_) | Phase::Done => {}
            }
            if !matches!(phase, Phase::Quiesce(_) | Phase::Done) {
                for li in 0..self.links.len() {
                    busy |= self.post_pongs(li);
                }
            }
            if let Phase::Quiesce(since) = phase {
                // A datagram completes at its sender once sent, so the peers' last ones may
                // still be on their way: UD links keep receiving for the slack.
                let settled = !self.cfg.workload.is_ud() || now >= since + slack;
                let idle = settled && self.links.iter().all(|l| l.outstanding.is_empty());
                if idle || now >= since + budget + slack {
                    self.finish()?;
                    phase = Phase::Done;
                }
            }
            let polled = self.poll_all()?;
            busy |= polled > 0;
            // After polling, so a loop that was held up (a slow disk, a loaded machine) first
            // sees what arrived meanwhile.
            self.check_stalls(budget * 2 + slack);
            self.log.flush(false).map_err(err("writing the log"))?;
            self.report_problems()?;
            if last_progress.elapsed() >= PROGRESS_EVERY && phase == Phase::Run {
                send(&FromNode::Progress {
                    ops: self.summary.ops_ok,
                })?;
                last_progress = Instant::now();
            }
            if !busy {
                self.wait_for_completion(Duration::from_millis(2))?;
            }
        }
    }

    /// Sends the problems noticed since the last call, so that they are reported even if this
    /// node is killed before it drains.
    fn report_problems(&mut self) -> Result<(), String> {
        let new = self
            .summary
            .problems
            .get(self.problems_sent..)
            .unwrap_or_default();
        if new.is_empty() {
            return Ok(());
        }
        let problems = new.to_vec();
        self.problems_sent = self.summary.problems.len();
        send(&FromNode::Problems { problems })
    }

    /// Gives up on pings whose pong has not come for `limit` (see [`Link::stalled`]): two
    /// retry budgets (a pong can wait behind the peer's own ping and then retry itself) plus
    /// the slack.
    fn check_stalls(&mut self, limit: Duration) {
        for link in &mut self.links {
            if link.ping_out.is_some() && link.last_progress.elapsed() > limit {
                link.ping_out = None;
                link.stalled = true;
                self.summary.ops_failed += 1;
                eprintln!(
                    "node {}: no pong from node {} in {limit:?}; no more pings on that QP",
                    self.cfg.index, link.peer
                );
            }
        }
    }

    /// Whether this node posts workload operations on `link`.
    fn issues_on(&self, link: &Link) -> bool {
        match self.cfg.workload {
            Workload::AtomicCounter => link.peer == 0,
            _ => !link.is_loopback(),
        }
    }

    /// The per-QP window: the workload's, shared out over the QPs this node issues on
    /// (`layout::qp_window`).
    fn window(&self) -> usize {
        let issuing = self.links.iter().filter(|l| self.issues_on(l)).count();
        layout::qp_window(self.cfg.workload, issuing)
    }

    /// Posts workload operations round-robin over the links, as the per-QP windows, the node
    /// window (`layout::NODE_WINDOW`) and the budget allow. True if anything was posted.
    fn post_workload(&mut self, run_end: Option<Instant>) -> bool {
        let n = self.links.len();
        let mut posted = false;
        let window = self.window();
        let mut in_flight: usize = self.links.iter().map(Link::counted_outstanding).sum();
        for _ in 0..n {
            if in_flight >= layout::NODE_WINDOW {
                break;
            }
            let li = self.next_link % n.max(1);
            self.next_link = self.next_link.wrapping_add(1);
            while in_flight < layout::NODE_WINDOW {
                let link = &self.links[li];
                let budget_left = match (self.cfg.ops, run_end) {
                    (Some(ops), _) => self.issued < ops,
                    (None, Some(end)) => Instant::now() < end,
                    (None, None) => false,
                };
                let room = if self.cfg.workload == Workload::Pingpong {
                    link.ping_out.is_none()
                } else {
                    link.counted_outstanding() < window
                };
                if !budget_left
                    || !room
                    || !self.issues_on(link)
                    || link.failed.is_some()
                    || link.exhausted
                    || link.stalled
                    || link.outstanding.len() >= SQ_LIMIT
                {
                    break;
                }
                if self.post_one(li) {
                    self.issued += 1;
                    in_flight += 1;
                    posted = true;
                } else {
                    break;
                }
            }
        }
        posted
    }

    /// Posts one workload operation on link `li`; false (and the link marked exhausted) if no
    /// operation has room left.
    fn post_one(&mut self, li: usize) -> bool {
        let kinds: Vec<OpKind> = match self.cfg.workload {
            Workload::Pingpong | Workload::UdSend => vec![OpKind::Send],
            Workload::StreamWrite => vec![OpKind::Write],
            Workload::ReadVerify => vec![OpKind::Read],
            Workload::AtomicCounter => vec![OpKind::Faa],
            Workload::Mixed => {
                let r = self.rng.range(0, 99);
                let first = match r {
                    0..=39 => OpKind::Write,
                    40..=59 => OpKind::Send,
                    60..=84 => OpKind::Read,
                    _ => OpKind::Faa,
                };
                let mut all = vec![first];
                for k in [OpKind::Write, OpKind::Send, OpKind::Read, OpKind::Faa] {
                    if k != first {
                        all.push(k);
                    }
                }
                all
            }
        };
        for kind in kinds {
            let ok = match kind {
                OpKind::Write => self.post_write(li),
                OpKind::Send => {
                    if self.cfg.workload == Workload::Pingpong {
                        self.post_ping(li)
                    } else if self.cfg.workload.is_ud() {
                        let imm = self.rng.next_u64() as u32;
                        self.post_send(li, RecordKind::Datagram, imm, true)
                    } else {
                        let imm = self.rng.next_u64() as u32 & !PONG;
                        self.post_send(li, RecordKind::Send, imm, true)
                    }
                }
                OpKind::Read => self.post_read(li),
                OpKind::Faa => self.post_faa(li),
                OpKind::Fin => None,
            };
            match ok {
                Some(true) => return true,
                Some(false) => return false, // post failed: the link is marked failed
                None => {}                   // no room for this kind: try the next
            }
        }
        self.links[li].exhausted = true;
        false
    }

    fn record_len(&mut self, small: (u64, u64), large: (u64, u64)) -> u64 {
        if self.rng.percent(12) {
            self.rng.range(large.0, large.1)
        } else {
            self.rng.range(small.0, small.1)
        }
    }

    /// Posts `wr` on link `li`. False (link failed) if the post is refused.
    fn post(&mut self, li: usize, op: Op, send_op: SendOp, stage: Option<(u64, u32)>) -> bool {
        let link = &mut self.links[li];
        let sge = match stage {
            Some((off, len)) => self.mr.sge(off as usize, len as usize),
            None => Err(verbs_api::Error::invalid("no buffer")),
        };
        let sge = match sge {
            Ok(s) => [s],
            Err(e) => {
                self.summary.problems.push(format!("sge: {e}"));
                link.failed.get_or_insert(WcStatus::GeneralErr);
                return false;
            }
        };
        let mut wr = SendWr::new(op.wr, send_op, &sge);
        if let Some((_, dest)) = &link.ud {
            wr = wr.with_ud(*dest);
        }
        match link.qp.post_send(&[wr]) {
            Ok(()) => {
                link.last_wr = op.wr;
                link.outstanding.push_back(op);
                true
            }
            Err(e) => {
                self.summary.problems.push(format!(
                    "post_send to node {} refused: {}",
                    link.peer, e.error
                ));
                link.failed.get_or_insert(WcStatus::GeneralErr);
                false
            }
        }
    }

    fn stage_off(&self, li: usize, wr: u64) -> u64 {
        layout::link_base(self.links[li].pos)
            + layout::STAGE_OFF
            + (wr % layout::STAGE_SLOTS) * layout::STAGE_SLOT
    }

    fn post_write(&mut self, li: usize) -> Option<bool> {
        let len = self.record_len((40, 512), (513, layout::STAGE_SLOT));
        let link = &self.links[li];
        if link.write_off + len > layout::WRITE_AREA {
            return None;
        }
        let wr = link.last_wr + 1;
        let (seq, roff, peer) = (link.write_seq, link.write_off, link.peer);
        let rec = layout::record(
            self.cfg.seed,
            RecordKind::Write,
            self.cfg.index,
            peer,
            seq,
            0,
            len as usize,
        );
        let stage = self.stage_off(li, wr);
        if let Err(e) = self.mr.write(stage as usize, &rec) {
            self.summary.problems.push(format!("staging: {e}"));
            return Some(false);
        }
        let link = &self.links[li];
        let remote_addr =
            link.remote.addr + layout::link_base(link.peer_pos) + layout::WRITE_OFF + roff;
        let op = Op {
            wr,
            op: OpKind::Write,
            posted: unix_ms(),
            seq,
            len: len as u32,
            roff: Some(roff),
            loff: None,
            imm: None,
            kind: None,
            counts: true,
        };
        let send_op = SendOp::RdmaWrite {
            remote_addr,
            rkey: link.remote.rkey,
        };
        let ok = self.post(li, op, send_op, Some((stage, len as u32)));
        if ok {
            let link = &mut self.links[li];
            link.write_seq += 1;
            link.write_off += len.div_ceil(8) * 8;
        }
        Some(ok)
    }

    fn post_ping(&mut self, li: usize) -> Option<bool> {
        // Each side's pings and pongs share the peer's receive slots: keep pings to half.
        if self.links[li].send_seq + self.links[li].pongs_due.len() as u64 + 1
            >= layout::RECV_SLOTS / 2
        {
            return None;
        }
        let no = self.links[li].ping_no + 1;
        let ok = self.post_send(li, RecordKind::Ping, no, false)?;
        if ok {
            let link = &mut self.links[li];
            link.ping_no = no;
            link.ping_out = Some(no);
            link.last_progress = Instant::now();
        }
        Some(ok)
    }

    /// Posts a SEND with immediate of a `kind` record; `None` if the peer's slots are used up.
    fn post_send(&mut self, li: usize, kind: RecordKind, imm: u32, counts: bool) -> Option<bool> {
        let link = &self.links[li];
        let (limit, largest) = if link.ud.is_some() {
            (layout::UD_SENDS, layout::RECV_SLOT - layout::UD_GRH)
        } else {
            (layout::RECV_SLOTS, layout::RECV_SLOT)
        };
        if link.send_seq >= limit {
            return None;
        }
        let len = self.rng.range(layout::RECORD_HEADER as u64, largest);
        let link = &self.links[li];
        let wr = link.last_wr + 1;
        let (seq, peer) = (link.send_seq, link.peer);
        let rec = layout::record(
            self.cfg.seed,
            kind,
            self.cfg.index,
            peer,
            seq,
            imm,
            len as usize,
        );
        let stage = self.stage_off(li, wr);
        if let Err(e) = self.mr.write(stage as usize, &rec) {
            self.summary.problems.push(format!("staging: {e}"));
            return Some(false);
        }
        let op = Op {
            wr,
            op: OpKind::Send,
            posted: unix_ms(),
            seq,
            len: len as u32,
            roff: None,
            loff: None,
            imm: Some(imm),
            kind: Some(kind),
            counts,
        };
        let ok = self.post(
            li,
            op,
            SendOp::SendWithImm { imm },
            Some((stage, len as u32)),
        );
        if ok {
            self.links[li].send_seq += 1;
        }
        Some(ok)
    }

    fn post_read(&mut self, li: usize) -> Option<bool> {
        let len = self.record_len((8, 512), (513, 2048));
        let link = &self.links[li];
        if link.read_off + len > layout::READ_AREA {
            return None;
        }
        let roff = self.rng.range(0, layout::PATTERN_LEN - len);
        let link = &self.links[li];
        let wr = link.last_wr + 1;
        let (seq, loff) = (link.read_seq, link.read_off);
        let local = layout::link_base(link.pos) + layout::READ_OFF + loff;
        let op = Op {
            wr,
            op: OpKind::Read,
            posted: unix_ms(),
            seq,
            len: len as u32,
            roff: Some(roff),
            loff: Some(loff),
            imm: None,
            kind: None,
            counts: true,
        };
        let send_op = SendOp::RdmaRead {
            remote_addr: link.remote.addr + layout::PATTERN_OFF + roff,
            rkey: link.remote.rkey,
        };
        let ok = self.post(li, op, send_op, Some((local, len as u32)));
        if ok {
            let link = &mut self.links[li];
            link.read_seq += 1;
            link.read_off += len.div_ceil(8) * 8;
        }
        Some(ok)
    }

    fn post_faa(&mut self, li: usize) -> Option<bool> {
        let link = &self.links[li];
        if link.faa_seq >= layout::FAA_SLOTS {
            return None;
        }
        let wr = link.last_wr + 1;
        let seq = link.faa_seq;
        let local = layout::link_base(link.pos) + layout::FAA_OFF + 8 * seq;
        let op = Op {
            wr,
            op: OpKind::Faa,
            posted: unix_ms(),
            seq,
            len: 8,
            roff: None,
            loff: None,
            imm: None,
            kind: None,
            counts: true,
        };
        let send_op = SendOp::AtomicFetchAndAdd {
            remote_addr: link.remote.addr + layout::COUNTER_OFF,
            rkey: link.remote.rkey,
            add: 1,
        };
        let ok = self.post(li, op, send_op, Some((local, 8)));
        if ok {
            self.links[li].faa_seq += 1;
        }
        Some(ok)
    }

    fn post_fin(&mut self, li: usize) {
        let link = &self.links[li];
        // UD has no WRITE: a UD link has no fin word.
        if link.ud.is_some()
            || link.failed.is_some()
            || link.fin != Fin::NotSent
            || link.outstanding.len() >= SQ_LIMIT
        {
            return;
        }
        let wr = link.last_wr + 1;
        let stage = self.stage_off(li, wr);
        if self.mr.write(stage as usize, &1u64.to_le_bytes()).is_err() {
            return;
        }
        let link = &self.links[li];
        let send_op = SendOp::RdmaWrite {
            remote_addr: link.remote.addr + layout::FIN_OFF + 8 * link.peer_pos as u64,
            rkey: link.remote.rkey,
        };
        let op = Op {
            wr,
            op: OpKind::Fin,
            posted: unix_ms(),
            seq: 0,
            len: 8,
            roff: None,
            loff: None,
            imm: None,
            kind: None,
            counts: false,
        };
        if self.post(li, op, send_op, Some((stage, 8))) {
            self.links[li].fin = Fin::Posted;
        }
    }

    fn post_pongs(&mut self, li: usize) -> bool {
        let mut posted = false;
        while let Some(&no) = self.links[li].pongs_due.front() {
            let link = &self.links[li];
            let peer = link.peer;
            if link.failed.is_some() || link.outstanding.len() >= SQ_LIMIT {
                break;
            }
            match self.post_send(li, RecordKind::Pong, no | PONG, false) {
                Some(true) => {
                    self.links[li].pongs_due.pop_front();
                    posted = true;
                }
                Some(false) => break,
                None => {
                    self.summary
                        .problems
                        .push(format!("no receive slot left at node {peer} for a pong"));
                    self.links[li].pongs_due.clear();
                }
            }
        }
        posted
    }

    fn top_up_recvs(&mut self, li: usize) {
        let link = &mut self.links[li];
        if link.is_loopback() || link.failed.is_some() {
            return;
        }
        let depth = if link.ud.is_some() {
            layout::UD_RQ_DEPTH
        } else {
            RQ_DEPTH
        };
        while link.recv_posted - link.recv_done < depth && link.recv_posted < layout::RECV_SLOTS {
            let slot = link.recv_posted;
            let off = layout::link_base(link.pos) + layout::RECV_OFF + slot * layout::RECV_SLOT;
            let Ok(sge) = self.mr.sge(off as usize, layout::RECV_SLOT as usize) else {
                return;
            };
            if let Err(e) = link.qp.post_recv(&[RecvWr::new(slot + 1, &[sge])]) {
                self.summary.problems.push(format!(
                    "post_recv for node {} refused: {}",
                    link.peer, e.error
                ));
                return;
            }
            link.recv_posted += 1;
        }
    }

    /// Polls every CQ once; returns the number of completions.
    fn poll_all(&mut self) -> Result<usize, String> {
        let mut total = 0;
        for g in 0..self.groups.len() {
            total += self.poll_group(g)?;
        }
        Ok(total)
    }

    /// Polls the send and then the receive CQ of link group `g`, handles what they held,
    /// tops up the receives of the links that received and notes their progress.
    fn poll_group(&mut self, g: usize) -> Result<usize, String> {
        let range = self.groups[g].clone();
        let mut wcs = [WorkCompletion::default(); POLL_BATCH];
        let mut touched = Vec::new();
        let sent = self.links[range.start]
            .scq
            .poll(&mut wcs)
            .map_err(err("poll_cq"))?;
        for wc in &wcs[..sent] {
            if let Some(li) = self.link_of(&range, wc) {
                self.on_send(li, wc);
                touched.push((li, false));
            }
        }
        let received = self.links[range.start]
            .rcq
            .poll(&mut wcs)
            .map_err(err("poll_cq"))?;
        for wc in &wcs[..received] {
            if let Some(li) = self.link_of(&range, wc) {
                self.on_recv(li, wc);
                touched.push((li, true));
            }
        }
        touched.sort_unstable();
        touched.dedup();
        for &(li, recv) in &touched {
            if recv {
                self.top_up_recvs(li);
            }
            self.links[li].last_progress = Instant::now();
        }
        for li in range {
            if let Some((_, cq)) = &self.links[li].resp {
                let n = cq.poll(&mut wcs).map_err(err("poll_cq"))?;
                if n > 0 {
                    self.summary
                        .problems
                        .push(format!("{n} completions on the loopback responder QP"));
                }
            }
        }
        Ok(sent + received)
    }

    /// The link of a completion polled from the CQs of the links `range`; `None` (and a
    /// problem reported) for a QP number none of them has.
    fn link_of(&mut self, range: &std::ops::Range<usize>, wc: &WorkCompletion) -> Option<usize> {
        if range.len() == 1 {
            return Some(range.start);
        }
        let li = self
            .by_qpn
            .get(&wc.qp_num)
            .copied()
            .filter(|li| range.contains(li));
        if li.is_none() {
            self.summary.problems.push(format!(
                "a completion for QP {:#x}, not one of this CQ's",
                wc.qp_num
            ));
        }
        li
    }

    fn count(&mut self, status: WcStatus) {
        *self
            .summary
            .completions
            .entry(status.name().to_owned())
            .or_insert(0) += 1;
    }

    fn on_send(&mut self, li: usize, wc: &WorkCompletion) {
        self.count(wc.status);
        let at = unix_ms();
        let link = &mut self.links[li];
        let op = if link.outstanding.front().is_some_and(|o| o.wr == wc.wr_id) {
            link.outstanding.pop_front()
        } else {
            let found = link.outstanding.iter().position(|o| o.wr == wc.wr_id);
            self.summary.problems.push(format!(
                "node {}: send completion for wr {} out of order",
                link.peer, wc.wr_id
            ));
            found.and_then(|i| link.outstanding.remove(i))
        };
        let Some(op) = op else {
            // Logged as is: the checker sees a wr_id that breaks the sequence.
            self.log.push(&Entry::Send {
                peer: link.peer,
                qp: link.qp_index,
                wr: wc.wr_id,
                op: OpKind::Fin,
                status: wc.status as u32,
                posted: at,
                at,
                seq: 0,
                len: 0,
                roff: None,
                loff: None,
                imm: None,
                kind: None,
                val: None,
            });
            return;
        };
        let ok = wc.status == WcStatus::Success;
        let mut val = None;
        if ok {
            match op.op {
                OpKind::Write => {
                    self.summary.ops_ok += 1;
                    self.summary.bytes += u64::from(op.len);
                }
                OpKind::Send => {
                    if op.counts {
                        self.summary.ops_ok += 1;
                    }
                    self.summary.bytes += u64::from(op.len);
                }
                OpKind::Read => {
                    self.summary.ops_ok += 1;
                    self.summary.bytes += u64::from(op.len);
                    let local = layout::link_base(link.pos)
                        + layout::READ_OFF
                        + op.loff.unwrap_or_default();
                    let mut got = vec![0u8; op.len as usize];
                    let want = layout::pattern(
                        self.cfg.seed,
                        link.peer,
                        op.roff.unwrap_or_default(),
                        op.len as usize,
                    );
                    if self.mr.read(local as usize, &mut got).is_err() || got != want {
                        self.summary.problems.push(format!(
                            "READ {} from node {} returned wrong data",
                            op.seq, link.peer
                        ));
                    }
                }
                OpKind::Faa => {
                    self.summary.ops_ok += 1;
                    self.summary.bytes += 8;
                    let local = layout::link_base(link.pos) + layout::FAA_OFF + 8 * op.seq;
                    let mut word = [0u8; 8];
                    if self.mr.read(local as usize, &mut word).is_ok() {
                        val = Some(u64::from_ne_bytes(word));
                    }
                }
                OpKind::Fin => link.fin = Fin::Done,
            }
        } else {
            if op.counts {
                self.summary.ops_failed += 1;
            }
            if link.failed.is_none() {
                link.failed = Some(wc.status);
            }
            if op.op == OpKind::Fin {
                link.fin = Fin::Done;
            }
            if op.kind == Some(RecordKind::Ping) {
                link.ping_out = None;
            }
        }
        self.log.push(&Entry::Send {
            peer: link.peer,
            qp: link.qp_index,
            wr: wc.wr_id,
            op: op.op,
            status: wc.status as u32,
            posted: op.posted,
            at,
            seq: op.seq,
            len: op.len,
            roff: op.roff,
            loff: op.loff,
            imm: op.imm,
            kind: op.kind,
            val,
        });
    }

    fn on_recv(&mut self, li: usize, wc: &WorkCompletion) {
        self.count(wc.status);
        let link = &mut self.links[li];
        let imm = wc
            .wc_flags
            .contains(WcFlags::WITH_IMM)
            .then_some(wc.imm_data);
        self.log.push(&Entry::Recv {
            peer: link.peer,
            qp: link.qp_index,
            wr: wc.wr_id,
            status: wc.status as u32,
            at: unix_ms(),
            len: wc.byte_len,
            imm,
        });
        if wc.wr_id != link.recv_done + 1 {
            self.summary.problems.push(format!(
                "node {}: receive completion for wr {} (expected {})",
                link.peer,
                wc.wr_id,
                link.recv_done + 1
            ));
        }
        link.recv_done += 1;
        if wc.status != WcStatus::Success {
            if link.failed.is_none() {
                link.failed = Some(wc.status);
            }
            return;
        }
        let slot = wc.wr_id.saturating_sub(1);
        let mut off = layout::link_base(link.pos) + layout::RECV_OFF + slot * layout::RECV_SLOT;
        let mut len = (wc.byte_len as usize).min(layout::RECV_SLOT as usize);
        if let Some((_, dest)) = &link.ud {
            // The datagram follows its 40-byte GRH; it must come from the peer's QP.
            off += layout::UD_GRH;
            len = len.saturating_sub(layout::UD_GRH as usize);
            if wc.src_qp != dest.remote_qpn || !wc.wc_flags.contains(WcFlags::GRH) {
                self.summary.problems.push(format!(
                    "node {}: datagram from QP {:#x} (flags {:?}) on the link to QP {:#x}",
                    link.peer, wc.src_qp, wc.wc_flags, dest.remote_qpn
                ));
            }
        }
        let mut got = vec![0u8; len];
        let record = self
            .mr
            .read(off as usize, &mut got)
            .map_err(|e| e.to_string())
            .and_then(|()| layout::check_record(&got));
        match record {
            Ok((_, _, rimm)) if Some(rimm) == imm => {}
            Ok(_) => self.summary.problems.push(format!(
                "node {}: receive slot {slot} holds another immediate than its completion",
                link.peer
            )),
            Err(e) => self
                .summary
                .problems
                .push(format!("node {}: receive slot {slot}: {e}", link.peer)),
        }
        if self.cfg.workload == Workload::Pingpong {
            let Some(imm) = imm else { return };
            if imm & PONG == 0 {
                link.pongs_due.push_back(imm);
            } else if link.ping_out == Some(imm & !PONG) {
                link.ping_out = None;
                self.summary.ops_ok += 1;
            } else if link.ping_out.is_none() && imm & !PONG == link.ping_no {
                // The pong of the last ping, which this side already gave up on (its ACKs
                // were lost until the QP ran out of retries, or the pong was late): the
                // ping did arrive. Not counted as an operation.
            } else {
                self.summary.problems.push(format!(
                    "node {}: pong {} while waiting for {:?}",
                    link.peer,
                    imm & !PONG,
                    link.ping_out
                ));
            }
        }
    }

    /// Arms every CQ and waits on the channel for at most `timeout` if nothing is pending.
    fn wait_for_completion(&mut self, timeout: Duration) -> Result<(), String> {
        for range in &self.groups {
            let link = &self.links[range.start];
            for cq in [&link.scq, &link.rcq] {
                cq.req_notify(false).map_err(err("req_notify_cq"))?;
            }
        }
        // Completions that arrived before the CQs were armed raise no event: poll once more.
        if self.poll_all()? > 0 {
            return Ok(());
        }
        let mut event = self
            .channel
            .wait_cq_event(Some(timeout))
            .map_err(err("wait_cq_event"))?;
        while let Some(handle) = event {
            for range in &self.groups {
                let link = &self.links[range.start];
                for cq in [&link.scq, &link.rcq] {
                    if cq.handle() == handle {
                        cq.ack_events(1);
                    }
                }
            }
            event = self.channel.get_cq_event().map_err(err("get_cq_event"))?;
        }
        Ok(())
    }

    /// Writes the end entry, syncs the log and reports.
    fn finish(&mut self) -> Result<(), String> {
        let posted = self
            .links
            .iter()
            .map(|l| Posted {
                peer: l.peer,
                qp: l.qp_index,
                send: l.last_wr,
                recv: l.recv_posted,
            })
            .collect();
        self.log.push(&Entry::End {
            at: unix_ms(),
            posted,
        });
        self.log.flush(true).map_err(err("writing the log"))?;
        self.summary.stats = TransportStats::from_stats(&self.ctx.device_stats());
        if let Some(c) = self.ctx.fault_counters() {
            let t = c.total();
            self.summary.injected = InjectedFaults {
                dropped: t.dropped,
                duplicated: t.duplicated,
                delayed: t.delayed,
                corrupted: t.corrupted,
                truncated: t.truncated,
                partitioned: t.partitioned,
            };
        }
        send(&FromNode::Done(Box::new(self.summary.clone())))
    }
}
