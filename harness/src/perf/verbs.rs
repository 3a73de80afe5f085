//! The verbs side of the tests, generic over the backend: QP setup, then per run the client's
//! measurement and the server's part (passive for WRITE/READ/atomics, receiving for SEND,
//! echoing for the ping-pongs).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use emu_fault::FaultPlan;
use emu_proto::Stats;
use emu_udp::oob::RemoteMr;
use verbs_api::{
    AccessFlags, CompletionChannel, CompletionQueue, Context, Endpoint, ErrorKind, MemoryRegion,
    Mtu, QpCap, QpInitAttr, QueuePair, RcConnectOptions, RecvWr, SendFlags, SendOp, SendWr, Sge,
    WcFlags, WcOpcode, WorkCompletion, connect_rc,
};

use super::ctl::Ctl;
use super::stats::{self, BwTimes};
use super::{Config, Output, PerfError, RunSpec, Verb};
use super::{baseline, cpu};

/// Immediate data of the last SEND of a run: the receiver stops there.
const STOP_IMM: u32 = 0x5354_4f50;
/// A run fails if no completion (or expected byte) shows up for this long.
const STALL: Duration = Duration::from_secs(30);
/// The bandwidth client checks for a stall once per this many empty polls in a row (each
/// sleeps up to 100 ms with `-e`).
const STALL_CHECK: u32 = 16;
/// WR ids carry the QP index above this shift and the WR's 1-based index below it.
const QP_SHIFT: u32 = 40;
const IDX_MASK: u64 = (1 << QP_SHIFT) - 1;

const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

/// What a backend offers beyond the verbs: loss injection and the poll mode.
pub(crate) trait Backend: Context {
    /// Drops `loss` of the datagrams this side sends from now on (0: none).
    fn set_loss(&self, loss: f64, seed: u64) -> Result<(), PerfError>;
    /// Busy-poll on or off (UDP devices only).
    fn set_busy(&self, on: bool);
    /// This side's device counters (retransmits, timeouts, NAKs), to explain a row.
    fn transport_stats(&self) -> Result<Stats, PerfError>;
    /// Datagrams the loss injection dropped since the run's `set_loss` (UDP: those this side
    /// sent; in-process: both directions).
    fn dropped(&self) -> u64;
}

/// What the transport did during one run (the client side's counters, after − before): why a
/// lossy run is slower than a lossless one.
fn transport_json(before: &Stats, after: &Stats) -> serde_json::Value {
    let d = |f: fn(&Stats) -> u64| f(after).saturating_sub(f(before));
    serde_json::json!({
        "sent_pkts": d(|s| s.sent_pkts),
        "retransmits_nak": d(|s| s.retransmits_nak),
        "retransmits_timeout": d(|s| s.retransmits_timeout),
        "retransmits_sack": d(|s| s.retransmits_sack),
        "retransmits": d(Stats::retransmits),
        "seq_naks_sent": d(|s| s.seq_naks_sent),
        "sacks_sent": d(|s| s.sacks_sent),
        "sacks_rcvd": d(|s| s.sacks_rcvd),
        "sr_probes": d(|s| s.sr_probes),
        "timeout_retries": d(|s| s.timeout_retries),
        "rcvd_seq_err": d(|s| s.rcvd_seq_err),
        "rcvd_rnr_err": d(|s| s.rcvd_rnr_err),
        "duplicate_response": d(|s| s.duplicate_response),
        "rx_drops": rx_drops_json(before, after),
    })
}

/// The receive drops of one run by cause name (after − before), every cause listed.
fn rx_drops_json(before: &Stats, after: &Stats) -> serde_json::Value {
    let map: serde_json::Map<String, serde_json::Value> = after
        .rx_drops
        .iter()
        .map(|(cause, n)| {
            let diff = n.saturating_sub(before.rx_drops.get(cause));
            (cause.name().to_owned(), diff.into())
        })
        .collect();
    serde_json::Value::Object(map)
}

fn plan(loss: f64, seed: u64) -> FaultPlan {
    let plan = FaultPlan::new(seed);
    if loss > 0.0 {
        plan.rule(emu_fault::drop(loss))
    } else {
        plan
    }
}

impl Backend for emu_udp::UdpContext {
    fn set_loss(&self, loss: f64, seed: u64) -> Result<(), PerfError> {
        let p = (loss > 0.0).then(|| plan(loss, seed));
        Ok(self.set_faults(p)?)
    }

    fn set_busy(&self, on: bool) {
        if self.busy_poll() != on {
            self.set_busy_poll(on);
        }
    }

    fn transport_stats(&self) -> Result<Stats, PerfError> {
        Ok(self.device_stats())
    }

    fn dropped(&self) -> u64 {
        self.fault_counters().map_or(0, |c| c.total().dropped)
    }
}

impl Backend for emu_sim::SimContext {
    fn set_loss(&self, loss: f64, seed: u64) -> Result<(), PerfError> {
        // One injector for the whole in-process fabric: side 0 sets it for both.
        if self.node().0 == 0 {
            self.provider().set_faults(plan(loss, seed))?;
        }
        Ok(())
    }

    fn set_busy(&self, _on: bool) {}

    fn transport_stats(&self) -> Result<Stats, PerfError> {
        Ok(self.device_stats()?)
    }

    fn dropped(&self) -> u64 {
        self.provider().fault_counters().total().dropped
    }
}

/// Endpoints and buffers of both sides, for the header block.
pub(crate) struct SetupInfo {
    pub(crate) local: Vec<(Endpoint, RemoteMr)>,
    pub(crate) remote: Vec<(Endpoint, RemoteMr)>,
}

/// One side's objects: a PD, a CQ shared by every queue, and per QP a buffer of two halves
/// (`[0, max)`: what we send; `[max, 2 max)`: where the peer writes and we receive).
struct Side<C: Context> {
    cq: C::Cq,
    /// With `-e`: the CQ's completion channel, slept on when the CQ is empty.
    channel: Option<C::Channel>,
    qps: Vec<C::Qp>,
    index: HashMap<u32, usize>,
    mrs: Vec<C::Mr>,
    remote: Vec<RemoteMr>,
    half: u64,
    info: SetupInfo,
    _pd: C::Pd,
}

fn mtu(bytes: u32) -> Mtu {
    match bytes {
        256 => Mtu::Mtu256,
        512 => Mtu::Mtu512,
        1024 => Mtu::Mtu1024,
        2048 => Mtu::Mtu2048,
        _ => Mtu::Mtu4096,
    }
}

fn setup<C: Backend>(ctl: &mut dyn Ctl, ctx: &C, cfg: &Config) -> Result<Side<C>, PerfError> {
    let attr = ctx.query_device()?;
    let send_tests = cfg.test.verb() == Verb::Send;
    let rx = if send_tests { cfg.rx_depth } else { 1 };
    let tx = cfg.tx_depth.max(if cfg.test.is_bw() { 1 } else { 128 });
    let cqe = (cfg.qps * (tx + rx) + 64).min(attr.max_cqe);
    let pd = ctx.alloc_pd()?;
    let channel = cfg.events.then(|| ctx.create_comp_channel()).transpose()?;
    let cq = ctx.create_cq(cqe, channel.as_ref())?;
    let cap = QpCap {
        max_send_wr: tx,
        max_recv_wr: rx,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let half = cfg.max_size.max(8);
    let len = usize::try_from(half * 2)
        .map_err(|_| PerfError::usage("buffer size does not fit this machine"))?;
    let mut qps = Vec::new();
    let mut mrs = Vec::new();
    let mut local = Vec::new();
    for i in 0..cfg.qps {
        let qp = ctx.create_qp(&pd, &cq, &cq, None, &QpInitAttr::rc(cap))?;
        let mr = ctx.alloc_mr(&pd, len, ALL)?;
        let ep = qp.endpoint((0x1000 * (i + 1)) & verbs_api::MAX_24BIT)?;
        let rmr = RemoteMr {
            addr: mr.addr(),
            rkey: mr.rkey(),
            len: mr.len() as u64,
        };
        ctl.send(&format!("qp {ep} {rmr}"))?;
        local.push((ep, rmr));
        qps.push(qp);
        mrs.push(mr);
    }
    let mut remote_info = Vec::new();
    for _ in 0..cfg.qps {
        let line = ctl.expect("qp")?;
        let (ep, mr) = split_qp_line(&line)?;
        remote_info.push((ep, mr));
    }
    let rc = RcConnectOptions {
        path_mtu: mtu(cfg.mtu),
        timeout: cfg.qp_timeout,
        recovery: cfg.recovery.recovery(),
        ..RcConnectOptions::default()
    };
    for (qp, ((ep, _), (rep, _))) in qps.iter().zip(local.iter().zip(&remote_info)) {
        connect_rc(qp, ep.psn, rep, &rc)?;
    }
    let index = qps
        .iter()
        .enumerate()
        .map(|(i, q)| (q.qp_num(), i))
        .collect();
    let side = Side {
        cq,
        channel,
        qps,
        index,
        remote: remote_info.iter().map(|(_, m)| *m).collect(),
        mrs,
        half,
        info: SetupInfo {
            local,
            remote: remote_info,
        },
        _pd: pd,
    };
    if send_tests {
        for q in 0..side.qps.len() {
            side.post_recvs(q, rx)?;
        }
    }
    ctl.sync("connected")?;
    Ok(side)
}

/// `qpn=… psn=… gid=… port=… addr=… rkey=… len=…`: the endpoint's four fields, then the MR's.
fn split_qp_line(line: &str) -> Result<(Endpoint, RemoteMr), PerfError> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.len() != 7 {
        return Err(PerfError::run(format!(
            "bad QP line from the peer: {line:?}"
        )));
    }
    let ep: Endpoint = fields[..4].join(" ").parse()?;
    let mr: RemoteMr = fields[4..].join(" ").parse()?;
    Ok((ep, mr))
}

impl<C: Context> Side<C> {
    /// Polls the CQ; with `-e`, an empty CQ is armed and slept on (up to 100 ms) first.
    fn poll(&self, wcs: &mut [WorkCompletion]) -> Result<usize, PerfError> {
        let n = self.cq.poll(wcs)?;
        let Some(ch) = &self.channel else {
            return Ok(n);
        };
        if n > 0 {
            return Ok(n);
        }
        self.cq.req_notify(false)?;
        let n = self.cq.poll(wcs)?;
        if n > 0 {
            return Ok(n);
        }
        if ch
            .wait_cq_event(Some(Duration::from_millis(100)))?
            .is_some()
        {
            self.cq.ack_events(1);
        }
        Ok(self.cq.poll(wcs)?)
    }

    fn post_recvs(&self, q: usize, n: u32) -> Result<(), PerfError> {
        let sge = [self.mrs[q].sge(self.half as usize, self.half as usize)?];
        let wrs: Vec<RecvWr<'_>> = (0..n).map(|_| RecvWr::new(q as u64, &sge)).collect();
        for chunk in wrs.chunks(64) {
            self.qps[q].post_recv(chunk)?;
        }
        Ok(())
    }

    fn repost(&self, q: usize) -> Result<(), PerfError> {
        let sge = [self.mrs[q].sge(self.half as usize, self.half as usize)?];
        self.qps[q].post_recv(&[RecvWr::new(q as u64, &sge)])?;
        Ok(())
    }

    fn qp_of(&self, wc: &WorkCompletion) -> Result<usize, PerfError> {
        self.index
            .get(&wc.qp_num)
            .copied()
            .ok_or_else(|| PerfError::run(format!("completion for unknown QP {:#x}", wc.qp_num)))
    }

    /// Zeroes the first `size` bytes of both halves of every buffer.
    fn clear(&self, size: u64) -> Result<(), PerfError> {
        let zeros = vec![0u8; usize::try_from(size.min(self.half)).unwrap_or(0)];
        for mr in &self.mrs {
            mr.write(0, &zeros)?;
            mr.write(self.half as usize, &zeros)?;
        }
        Ok(())
    }

    /// The operation and local SGE of one WR of `test` on QP `q`.
    fn op(&self, verb: Verb, q: usize, size: u64) -> Result<(SendOp, Sge), PerfError> {
        let r = &self.remote[q];
        let half = self.half;
        let size_us = usize::try_from(size).unwrap_or(0);
        Ok(match verb {
            Verb::Write => (
                SendOp::RdmaWrite {
                    remote_addr: r.addr + half,
                    rkey: r.rkey,
                },
                self.mrs[q].sge(0, size_us)?,
            ),
            Verb::Send => (SendOp::Send, self.mrs[q].sge(0, size_us)?),
            Verb::Read => (
                SendOp::RdmaRead {
                    remote_addr: r.addr,
                    rkey: r.rkey,
                },
                self.mrs[q].sge(half as usize, size_us)?,
            ),
            Verb::Atomic => (
                SendOp::AtomicFetchAndAdd {
                    remote_addr: r.addr,
                    rkey: r.rkey,
                    add: 1,
                },
                self.mrs[q].sge(half as usize, 8)?,
            ),
        })
    }
}

fn check(wc: &WorkCompletion) -> Result<(), PerfError> {
    if wc.is_success() {
        Ok(())
    } else {
        Err(PerfError::run(format!(
            "completion failed: wr_id {:#x} {} ({:?})",
            wc.wr_id,
            wc.status.name(),
            wc.opcode
        )))
    }
}

fn stalled(what: &str) -> PerfError {
    PerfError::run(format!("stalled: no {what} for {}s", STALL.as_secs()))
}

/// The client: sets up, then measures every run and prints its row.
pub(crate) fn client<C: Backend>(
    ctl: &mut dyn Ctl,
    ctx: &C,
    cfg: &Config,
    mut udp: Option<baseline::Endpoint>,
    out: &mut Output,
) -> Result<(), PerfError> {
    if let Some(u) = udp.as_mut() {
        u.exchange(ctl)?;
    }
    let side = setup(ctl, ctx, cfg)?;
    out.header(cfg, &side.info);
    for (i, run) in cfg.runs.iter().enumerate() {
        prepare(ctl, ctx, &side, cfg, run, i)?;
        let before = ctx.transport_stats()?;
        // The in-process fabric counts every drop since it was built: take this run's part.
        let dropped_before = ctx.dropped();
        let mut dropped = 0;
        let points_before = out.sweep.len();
        let mut row = if cfg.test.is_bw() {
            let cpu_start = cpu::process_seconds();
            let r = bw_client(&side, cfg, run.size)?;
            ctl.sync(&format!("end {i}"))?;
            let mine = cpu::process_seconds() - cpu_start;
            let peer = cpu::exchange(ctl, &format!("run {i}"), mine)?;
            let bytes = (r.bytes * r.iterations) as f64;
            let used = match out.backend {
                // Both sides are threads of this process: its clock already counts both.
                super::Backend::Inproc => cpu::Use::of(bytes, mine, 0.0),
                super::Backend::Udp => cpu::Use::of(bytes, mine, peer),
            };
            dropped = ctx.dropped().saturating_sub(dropped_before);
            ctx.set_loss(0.0, cfg.seed)?;
            let base = match udp.as_mut() {
                Some(u) => Some(with_busy_off(ctx, cfg, || {
                    u.bw_client(ctl, cfg, run.size, r.iterations)
                })?),
                None => None,
            };
            bw_output(out, cfg, run, &r, base.as_ref(), used)
        } else {
            let r = lat_side(&side, cfg, run.size, true)?;
            ctl.sync(&format!("end {i}"))?;
            ctx.set_loss(0.0, cfg.seed)?;
            let base = match udp.as_mut() {
                Some(u) => Some(with_busy_off(ctx, cfg, || {
                    u.lat_client(ctl, cfg, run.size)
                })?),
                None => None,
            };
            let mode = udp.as_ref().map(baseline::Endpoint::ping_mode);
            lat_output(out, cfg, run, r, base, mode)
        };
        let mut transport = transport_json(&before, &ctx.transport_stats()?);
        if let Some(obj) = transport.as_object_mut() {
            obj.insert("dropped_injected".into(), dropped.into());
        }
        if out.sweep.len() > points_before {
            if let Some(p) = out.sweep.last_mut() {
                p.transport = transport.clone();
            }
        }
        if run.loss > 0.0 {
            // stderr: stdout keeps perftest's table shape for scripts that parse it.
            eprintln!(
                "transport counters of this side, {} B run: {transport}",
                run.size
            );
        }
        if let Some(obj) = row.as_object_mut() {
            obj.insert("transport".into(), transport);
            obj.insert("recovery".into(), cfg.recovery.name().into());
        }
        out.rows.push(row);
    }
    ctl.sync("bye")?;
    Ok(())
}

/// The server: sets up, then plays its part in every run.
pub(crate) fn server<C: Backend>(
    ctl: &mut dyn Ctl,
    ctx: &C,
    cfg: &Config,
    mut udp: Option<baseline::Endpoint>,
) -> Result<(), PerfError> {
    if let Some(u) = udp.as_mut() {
        u.exchange(ctl)?;
    }
    let side = setup(ctl, ctx, cfg)?;
    for (i, run) in cfg.runs.iter().enumerate() {
        prepare(ctl, ctx, &side, cfg, run, i)?;
        let cpu_start = cpu::process_seconds();
        if cfg.test.is_bw() {
            if cfg.test.verb() == Verb::Send {
                send_bw_server(&side)?;
            }
        } else {
            lat_side(&side, cfg, run.size, false)?;
        }
        ctl.sync(&format!("end {i}"))?;
        if cfg.test.is_bw() {
            let mine = cpu::process_seconds() - cpu_start;
            cpu::exchange(ctl, &format!("run {i}"), mine)?;
        }
        ctx.set_loss(0.0, cfg.seed)?;
        if let Some(u) = udp.as_mut() {
            if cfg.test.is_bw() {
                with_busy_off(ctx, cfg, || u.bw_server(ctl, cfg, run.size))?;
            } else {
                with_busy_off(ctx, cfg, || u.lat_server(ctl, cfg, run.size))?;
            }
        }
    }
    ctl.sync("bye")?;
    Ok(())
}

/// The baseline runs with our devices' progress threads parked (they would spin otherwise).
fn with_busy_off<C: Backend, R>(
    ctx: &C,
    cfg: &Config,
    f: impl FnOnce() -> Result<R, PerfError>,
) -> Result<R, PerfError> {
    ctx.set_busy(false);
    let r = f();
    ctx.set_busy(cfg.busy_poll);
    r
}

fn prepare<C: Backend>(
    ctl: &mut dyn Ctl,
    ctx: &C,
    side: &Side<C>,
    cfg: &Config,
    run: &RunSpec,
    i: usize,
) -> Result<(), PerfError> {
    side.clear(run.size)?;
    ctx.set_loss(run.loss, cfg.seed.wrapping_add(i as u64))?;
    ctl.sync(&format!("run {i}"))
}

fn bw_output(
    out: &mut Output,
    cfg: &Config,
    run: &RunSpec,
    r: &stats::BwResult,
    base: Option<&baseline::BwBaseline>,
    used: cpu::Use,
) -> serde_json::Value {
    out.columns(cfg);
    let best = base.map(baseline::BwBaseline::best_bytes_per_sec);
    out.line(&stats::bw_row(r, out.unit, best));
    if let Some(b) = base {
        out.line(&format!("   UDP baseline: {}", b.describe(out.unit)));
    }
    if cfg.runs.len() > 1 && cfg.runs.iter().any(|r| r.loss > 0.0) {
        out.sweep.push(super::sweep::Point {
            recovery: cfg.recovery,
            loss: run.loss,
            bytes_per_sec: r.bytes_per_sec(),
            transport: serde_json::Value::Null,
        });
    }
    serde_json::json!({
        "bytes": r.bytes,
        "iterations": r.iterations,
        "loss": run.loss,
        "seconds": r.seconds,
        "bw_peak": r.peak_bytes_per_sec.map(|b| out.unit.from_bytes_per_sec(b)),
        "bw_average": out.unit.from_bytes_per_sec(r.bytes_per_sec()),
        "msg_rate_mpps": r.mpps(),
        "baseline": base,
        "ratio": best.map(|b| if b > 0.0 { r.bytes_per_sec() / b } else { 0.0 }),
        "cpu": cpu_json(used, base),
    })
}

/// Our CPU use, the most CPU-efficient baseline strategy's, and ours ÷ its bytes per
/// CPU-second.
fn cpu_json(used: cpu::Use, base: Option<&baseline::BwBaseline>) -> serde_json::Value {
    let best = base.and_then(|b| {
        b.strategies
            .iter()
            .max_by(|x, y| x.cpu.bytes_per_cpu_s.total_cmp(&y.cpu.bytes_per_cpu_s))
    });
    serde_json::json!({
        "softverbs": used,
        "baseline": best.map(|s| serde_json::json!({ "strategy": s.name, "cpu": s.cpu })),
        "ratio": best.map(|s| if s.cpu.bytes_per_cpu_s > 0.0 {
            used.bytes_per_cpu_s / s.cpu.bytes_per_cpu_s
        } else {
            0.0
        }),
    })
}

/// A latency run: full statistics, or duration mode's average.
enum Lat {
    Full(stats::LatResult),
    Duration(stats::LatDuration),
}

fn lat_output(
    out: &mut Output,
    cfg: &Config,
    run: &RunSpec,
    r: Option<Lat>,
    base: Option<Option<stats::LatResult>>,
    baseline_poll: Option<&str>,
) -> serde_json::Value {
    out.columns(cfg);
    let base = base.flatten();
    match r {
        Some(Lat::Full(r)) => {
            out.line(&stats::lat_row(&r, base.as_ref().map(|b| b.t_typical)));
            serde_json::json!({
                "bytes": r.bytes,
                "loss": run.loss,
                "latency": r,
                "baseline": base,
                "baseline_poll": baseline_poll,
                "ratio": base.as_ref().map(|b| ratio(r.t_typical, b.t_typical)),
                "ratio_p99": base.as_ref().map(|b| ratio(r.p99, b.p99)),
                "ratio_p999": base.as_ref().map(|b| ratio(r.p999, b.p999)),
            })
        }
        Some(Lat::Duration(r)) => {
            out.line(&stats::lat_duration_row(&r));
            serde_json::json!({ "bytes": r.bytes, "loss": run.loss, "latency_duration": r })
        }
        None => serde_json::json!({ "bytes": run.size, "error": "too few samples" }),
    }
}

fn ratio(ours: f64, theirs: f64) -> f64 {
    if theirs > 0.0 { ours / theirs } else { 0.0 }
}

/// The client of a bandwidth run: keeps `tx_depth` WRs outstanding per QP, signalling one in
/// `cq_mod`, from the first post to the last completion.
fn bw_client<C: Context>(
    side: &Side<C>,
    cfg: &Config,
    size: u64,
) -> Result<stats::BwResult, PerfError> {
    let nq = side.qps.len();
    let verb = cfg.test.verb();
    let depth = u64::from(cfg.tx_depth);
    let cq_mod = u64::from(cfg.cq_mod.min(cfg.tx_depth).max(1));
    let post_list = usize::try_from(cfg.post_list).unwrap_or(1).max(1);
    let timed = cfg.duration.map(|d| Duration::from_secs(u64::from(d)));
    // Per QP: target WRs (u64::MAX until a timed run ends), posted, completed.
    let mut target = vec![if timed.is_some() { u64::MAX } else { cfg.iters }; nq];
    let mut posted = vec![0u64; nq];
    let mut done = vec![0u64; nq];
    let ops: Vec<(SendOp, Sge)> = (0..nq)
        .map(|q| side.op(verb, q, size))
        .collect::<Result<_, _>>()?;
    let mut times = BwTimes::new(cfg.iters.saturating_mul(nq as u64));
    let mut wcs = [WorkCompletion::default(); 64];
    let sges: Vec<[Sge; 1]> = ops.iter().map(|&(_, s)| [s]).collect();
    let mut wrs: Vec<SendWr<'_>> = Vec::with_capacity(post_list);
    let start = Instant::now();
    let mut last_progress = start;
    let mut empty_polls = 0u32;
    let mut finishing = false;
    loop {
        for q in 0..nq {
            let (op, _) = ops[q];
            loop {
                let room = depth.saturating_sub(posted[q] - done[q]);
                let left = target[q].saturating_sub(posted[q]);
                let k = room.min(left).min(post_list as u64) as usize;
                if k == 0 {
                    break;
                }
                wrs.clear();
                for j in 0..k {
                    let s = &sges[q];
                    let idx = posted[q] + j as u64 + 1;
                    let last = idx == target[q];
                    let flags = if idx % cq_mod == 0 || last {
                        SendFlags::SIGNALED
                    } else {
                        SendFlags::empty()
                    };
                    let op = if last && verb == Verb::Send {
                        SendOp::SendWithImm { imm: STOP_IMM }
                    } else {
                        op
                    };
                    wrs.push(SendWr::new(((q as u64) << QP_SHIFT) | idx, op, s).with_flags(flags));
                }
                match side.qps[q].post_send(&wrs) {
                    Ok(()) => {}
                    Err(e) if e.error.kind == ErrorKind::NoMemory => {
                        // The send queue is full after all: post what went in, poll, retry.
                        times.posts(e.index as u64);
                        posted[q] += e.index as u64;
                        break;
                    }
                    Err(e) => return Err(e.into()),
                }
                times.posts(k as u64);
                posted[q] += k as u64;
            }
        }
        let n = side.poll(&mut wcs)?;
        // The clock is read (tens of ns in a VM, as much as a post) when something completed,
        // in a timed run, and every `STALL_CHECK` empty polls for the stall check.
        empty_polls = if n > 0 {
            0
        } else {
            empty_polls.wrapping_add(1)
        };
        let clock_due = n > 0 || timed.is_some() || empty_polls % STALL_CHECK == 0;
        let now = if clock_due {
            Instant::now()
        } else {
            last_progress
        };
        if n > 0 {
            last_progress = now;
        } else if now.duration_since(last_progress) > STALL {
            return Err(stalled("completion"));
        }
        for wc in &wcs[..n] {
            check(wc)?;
            let q = side.qp_of(wc)?;
            let idx = wc.wr_id & IDX_MASK;
            let newly = idx.saturating_sub(done[q]);
            done[q] = done[q].max(idx);
            times.complete(now, newly);
        }
        if let Some(d) = timed {
            if !finishing && now.duration_since(start) >= d {
                // One last signaled WR per QP ends the run.
                finishing = true;
                for q in 0..nq {
                    target[q] = posted[q] + 1;
                }
            }
        }
        if (0..nq).all(|q| done[q] >= target[q]) {
            break;
        }
    }
    Ok(times.result(size, timed.is_none()))
}

/// The server of `send_bw`: reposts every consumed receive until each QP's last SEND.
fn send_bw_server<C: Context>(side: &Side<C>) -> Result<(), PerfError> {
    let mut finished = vec![false; side.qps.len()];
    let mut left = side.qps.len();
    let mut wcs = [WorkCompletion::default(); 64];
    let mut last_progress = Instant::now();
    let mut empty_polls = 0u32;
    while left > 0 {
        let n = side.poll(&mut wcs)?;
        if n == 0 {
            empty_polls = empty_polls.wrapping_add(1);
            if empty_polls % STALL_CHECK == 0 && last_progress.elapsed() > STALL {
                return Err(stalled("SEND received"));
            }
            continue;
        }
        empty_polls = 0;
        last_progress = Instant::now();
        for wc in &wcs[..n] {
            check(wc)?;
            if !wc.opcode.is_recv() {
                continue;
            }
            let q = side.qp_of(wc)?;
            side.repost(q)?;
            let stop = wc.wc_flags.contains(WcFlags::WITH_IMM) && wc.imm_data == STOP_IMM;
            if stop && !finished[q] {
                finished[q] = true;
                left -= 1;
            }
        }
    }
    Ok(())
}

/// One side of a latency run on QP 0. The client posts first; the server answers (WRITE and
/// SEND) or stays passive (READ and atomics, which the client's QP completes by itself).
fn lat_side<C: Context>(
    side: &Side<C>,
    cfg: &Config,
    size: u64,
    is_client: bool,
) -> Result<Option<Lat>, PerfError> {
    let verb = cfg.test.verb();
    if !is_client && matches!(verb, Verb::Read | Verb::Atomic) {
        return Ok(None);
    }
    let timed = cfg.duration.map(|d| Duration::from_secs(u64::from(d)));
    let iters = if timed.is_some() { u64::MAX } else { cfg.iters };
    let mut pp = PingPong::new(side, cfg, size)?;
    let mut posts: Vec<Instant> =
        Vec::with_capacity(usize::try_from(cfg.iters).unwrap_or(0).min(1 << 24));
    let start = Instant::now();
    let mut count = 0u64;
    let mut stop = false;
    while count < iters && !stop {
        let n = count + 1;
        if is_client {
            let last = timed.is_some_and(|d| start.elapsed() >= d);
            if timed.is_none() && posts.len() < posts.capacity() {
                posts.push(Instant::now());
            }
            pp.send(n, last)?;
            if matches!(verb, Verb::Write | Verb::Send) {
                pp.wait(n)?;
            }
            stop = last;
        } else {
            stop = pp.wait(n)?;
            pp.send(n, stop)?;
        }
        count = n;
    }
    pp.drain()?;
    if !is_client {
        return Ok(None);
    }
    let elapsed = start.elapsed();
    let factor = cfg.test.rtt_factor();
    Ok(match timed {
        Some(_) => Some(Lat::Duration(stats::LatDuration::new(
            size, count, elapsed, factor,
        ))),
        None => {
            // The samples are the deltas between consecutive posts: add the end of the last
            // round trip as a final "post".
            posts.push(Instant::now());
            stats::latency(size, &posts, factor).map(|mut r| {
                r.iterations = count;
                Lat::Full(r)
            })
        }
    })
}

/// The ping-pong state of one side.
struct PingPong<'a, C: Context> {
    side: &'a Side<C>,
    verb: Verb,
    op: SendOp,
    sge: Sge,
    size: u64,
    cq_mod: u64,
    /// Signaled sends not completed yet.
    unreaped: u64,
    /// Receives completed but not consumed by `wait` yet (SEND: payload's flag byte).
    received: u64,
    stop_seen: bool,
    /// A timed run: the first payload byte carries the stop flag.
    timed: bool,
    /// Yield the CPU on every empty spin (`--spin-yield`).
    yield_spin: bool,
    wcs: [WorkCompletion; 16],
}

impl<'a, C: Context> PingPong<'a, C> {
    fn new(side: &'a Side<C>, cfg: &Config, size: u64) -> Result<PingPong<'a, C>, PerfError> {
        let verb = cfg.test.verb();
        let (op, sge) = side.op(verb, 0, size)?;
        Ok(PingPong {
            side,
            verb,
            op,
            sge,
            size,
            cq_mod: u64::from(cfg.cq_mod.clamp(1, 64)),
            unreaped: 0,
            received: 0,
            stop_seen: false,
            timed: cfg.duration.is_some(),
            yield_spin: cfg.spin_yield,
            wcs: [WorkCompletion::default(); 16],
        })
    }

    /// Posts message `n`; its last byte carries `n` (perftest's polled byte), its first byte
    /// the stop flag of a timed run.
    fn send(&mut self, n: u64, stop: bool) -> Result<(), PerfError> {
        let mr = &self.side.mrs[0];
        if matches!(self.verb, Verb::Write | Verb::Send) {
            if self.timed && self.size >= 2 {
                mr.write(0, &[u8::from(stop)])?;
            }
            mr.write(self.size as usize - 1, &[n as u8])?;
        }
        // READ and atomics: every WR signaled, one outstanding (the client waits for it).
        let signaled = matches!(self.verb, Verb::Read | Verb::Atomic) || n % self.cq_mod == 0;
        let op = if stop && self.verb == Verb::Send {
            SendOp::SendWithImm { imm: STOP_IMM }
        } else {
            self.op
        };
        let flags = if signaled {
            SendFlags::SIGNALED
        } else {
            SendFlags::empty()
        };
        let sges = [self.sge];
        self.side.qps[0].post_send(&[SendWr::new(n, op, &sges).with_flags(flags)])?;
        if signaled {
            self.unreaped += 1;
        }
        match self.verb {
            Verb::Read | Verb::Atomic => self.reap_all(),
            // Keep at most one signaled send in flight, as perftest polls after it.
            _ if self.unreaped > 1 => self.reap_until(1),
            _ => Ok(()),
        }
    }

    /// Polls the CQ once; counts receives (reposting them) and send completions.
    fn poll_once(&mut self) -> Result<usize, PerfError> {
        let n = self.side.poll(&mut self.wcs)?;
        for i in 0..n {
            let wc = self.wcs[i];
            check(&wc)?;
            if wc.opcode == WcOpcode::Recv || wc.opcode == WcOpcode::RecvRdmaWithImm {
                self.side.repost(0)?;
                self.received += 1;
                if wc.wc_flags.contains(WcFlags::WITH_IMM) && wc.imm_data == STOP_IMM {
                    self.stop_seen = true;
                }
            } else {
                self.unreaped = self.unreaped.saturating_sub(1);
            }
        }
        Ok(n)
    }

    fn reap_until(&mut self, left: u64) -> Result<(), PerfError> {
        let t = Instant::now();
        while self.unreaped > left {
            if self.poll_once()? == 0 && t.elapsed() > STALL {
                return Err(stalled("send completion"));
            }
        }
        Ok(())
    }

    fn reap_all(&mut self) -> Result<(), PerfError> {
        self.reap_until(0)
    }

    /// Waits for the peer's message `n`; true if it carries the stop flag.
    fn wait(&mut self, n: u64) -> Result<bool, PerfError> {
        let t = Instant::now();
        let mut spins = 0u32;
        match self.verb {
            Verb::Write => {
                let mr = &self.side.mrs[0];
                let at = (self.side.half + self.size - 1) as usize;
                let mut b = [0u8; 1];
                loop {
                    mr.read(at, &mut b)?;
                    if b[0] == n as u8 {
                        break;
                    }
                    spins += 1;
                    if self.yield_spin {
                        std::thread::yield_now();
                    }
                    if spins % 64 == 0 {
                        // Reap our own completions meanwhile (and notice a failed QP).
                        if self.unreaped > 0 {
                            self.poll_once()?;
                        }
                        if t.elapsed() > STALL {
                            return Err(stalled("WRITE from the peer"));
                        }
                    }
                }
                let mut flag = [0u8; 1];
                if self.timed && self.size >= 2 {
                    mr.read(self.side.half as usize, &mut flag)?;
                }
                Ok(flag[0] == 1)
            }
            Verb::Send => {
                while self.received < n {
                    if self.poll_once()? == 0 && t.elapsed() > STALL {
                        return Err(stalled("SEND from the peer"));
                    }
                }
                Ok(self.stop_seen)
            }
            Verb::Read | Verb::Atomic => Ok(false),
        }
    }

    /// Reaps what is still outstanding at the end of a run.
    fn drain(&mut self) -> Result<(), PerfError> {
        self.reap_all()
    }
}
