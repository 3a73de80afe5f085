//! `softverbs perf scale --qps N`: N connected RC QPs on one device (their peers on a second
//! device of the same process), an 8-byte WRITE on every one of them per round, the resident
//! memory each QP costs, and the CPU an idle device burns.
//!
//! Memory: resident set (`/proc/self/status` VmRSS, else `/proc/self/statm` resident pages)
//! before and after creating and connecting the QPs, and after the traffic, divided by the
//! QPs created (both ends, 2 N).
//! Idle CPU: `utime + stime` of the whole process from `/proc/self/stat` over one second after
//! the traffic, and the UDP devices' progress-loop wake-ups over the same second.

use std::time::{Duration, Instant};

use emu_sim::SimProvider;
use emu_udp::UdpProvider;
use verbs_api::{
    AccessFlags, CompletionQueue, Context, Device, MemoryRegion, Provider, QpCap, QpInitAttr,
    QueuePair, RcConnectOptions, SendFlags, SendOp, SendWr, WorkCompletion, connect_rc,
};

use super::{Backend, PerfArgs, PerfError, say};

/// WRITE rounds over all QPs.
const ROUNDS: u32 = 3;
/// Bound on one round.
const ROUND_LIMIT: Duration = Duration::from_secs(120);
/// The idle measurement window.
const IDLE: Duration = Duration::from_secs(1);
/// USER_HZ: the unit of /proc/<pid>/stat times on Linux.
const CLK_TCK: f64 = 100.0;

/// Runs the scale test on the backend the flags name.
pub(crate) fn run(args: &PerfArgs) -> Result<(), PerfError> {
    let n = args.qps;
    match args.backend {
        Backend::Udp => {
            let ip = args.bind.unwrap_or(std::net::IpAddr::from([127, 0, 0, 1]));
            let provider = UdpProvider::builder()
                .device(std::net::SocketAddr::new(ip, 0))
                .device(std::net::SocketAddr::new(ip, 0))
                .busy_poll(args.busy_poll)
                .build()?;
            let devs = provider.devices()?;
            let (Some(a), Some(b)) = (devs.first(), devs.get(1)) else {
                return Err(PerfError::run("the UDP provider has fewer than 2 devices"));
            };
            let (a, b) = (a.open()?, b.open()?);
            let wakeups = || {
                let (x, y) = (a.driver_stats().wakeups, b.driver_stats().wakeups);
                Some(x + y)
            };
            let desc = format!("udp ({} and {})", a.local_addr(), b.local_addr());
            let r = scale(&a, &b, n, &desc, wakeups)?;
            finish(args, r)
        }
        Backend::Inproc => {
            let sim = SimProvider::builder().devices(2).build()?;
            let (a, b) = (sim.context(0)?, sim.context(1)?);
            let r = scale(&a, &b, n, "inproc (emu-sim)", || None)?;
            finish(args, r)
        }
    }
}

/// What the scale test measured.
#[derive(serde::Serialize, Debug)]
struct ScaleResult {
    device: String,
    qps: u32,
    setup_seconds: f64,
    rss_before_kib: u64,
    rss_after_setup_kib: u64,
    rss_after_traffic_kib: u64,
    bytes_per_qp: f64,
    bytes_per_qp_after_traffic: f64,
    writes: u64,
    write_seconds: f64,
    idle_cpu_ms: f64,
    idle_wakeups: Option<u64>,
}

fn finish(args: &PerfArgs, r: ScaleResult) -> Result<(), PerfError> {
    let line = super::stats::RESULT_LINE;
    say!("{line}");
    say!("{:^87}", "QP Scale Test");
    say!(" {:<28}: {}", "Device", r.device);
    say!(" {:<28}: {}", "Connected QPs (each end)", r.qps);
    say!(" {:<28}: {:.3} s", "Create + connect", r.setup_seconds);
    say!(
        " {:<28}: {} KiB -> {} KiB -> {} KiB (after traffic)",
        "Resident memory",
        r.rss_before_kib,
        r.rss_after_setup_kib,
        r.rss_after_traffic_kib
    );
    say!(
        " {:<28}: {:.0} B ({:.1} KiB) per QP, both ends counted",
        "Memory per QP",
        r.bytes_per_qp,
        r.bytes_per_qp / 1024.0
    );
    say!(
        " {:<28}: {:.0} B ({:.1} KiB) per QP, queues and buffers grown",
        "Memory per QP after traffic",
        r.bytes_per_qp_after_traffic,
        r.bytes_per_qp_after_traffic / 1024.0
    );
    say!(
        " {:<28}: {} WRITEs of 8 B in {:.3} s ({:.3} M/s), {} rounds over every QP",
        "Traffic",
        r.writes,
        r.write_seconds,
        r.writes as f64 / r.write_seconds.max(1e-9) / 1e6,
        ROUNDS
    );
    match r.idle_wakeups {
        Some(w) => say!(
            " {:<28}: {:.0} ms CPU (utime+stime) and {w} progress wake-ups in {:.0} s",
            "Idle device",
            r.idle_cpu_ms,
            IDLE.as_secs_f64()
        ),
        None => say!(
            " {:<28}: {:.0} ms CPU in {:.0} s (no progress thread)",
            "Idle device",
            r.idle_cpu_ms,
            IDLE.as_secs_f64()
        ),
    }
    say!("{line}");
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&r).map_err(|e| PerfError::run(e.to_string()))?;
        std::fs::write(path, text + "\n")
            .map_err(|e| PerfError::run(format!("writing {}: {e}", path.display())))?;
    }
    Ok(())
}

fn scale<C: Context>(
    a: &C,
    b: &C,
    n: u32,
    device: &str,
    wakeups: impl Fn() -> Option<u64>,
) -> Result<ScaleResult, PerfError> {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let rss_before = rss_kib();
    let t = Instant::now();
    let max_cqe = a.query_device()?.max_cqe;
    let cqe = (n + 64).min(max_cqe);
    if cqe < n {
        return Err(PerfError::usage(format!(
            "--qps {n} is above the CQ size limit {max_cqe}"
        )));
    }
    let (pd_a, pd_b) = (a.alloc_pd()?, b.alloc_pd()?);
    let (cq_a, cq_b) = (a.create_cq(cqe, None)?, b.create_cq(cqe, None)?);
    let mr_len = usize::try_from(n).unwrap_or(0) * 8;
    let (mr_a, mr_b) = (
        a.alloc_mr(&pd_a, mr_len, access)?,
        b.alloc_mr(&pd_b, mr_len, access)?,
    );
    let cap = QpCap {
        max_send_wr: 4,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let rc = RcConnectOptions {
        access,
        max_rd_atomic: 1,
        max_dest_rd_atomic: 1,
        ..RcConnectOptions::default()
    };
    let mut qps = Vec::with_capacity(n as usize);
    for i in 0..n {
        let qa = a.create_qp(&pd_a, &cq_a, &cq_a, None, &QpInitAttr::rc(cap))?;
        let qb = b.create_qp(&pd_b, &cq_b, &cq_b, None, &QpInitAttr::rc(cap))?;
        let (psn_a, psn_b) = (i & 0xFFFF, (i + 7) & 0xFFFF);
        connect_rc(&qa, psn_a, &qb.endpoint(psn_b)?, &rc)?;
        connect_rc(&qb, psn_b, &qa.endpoint(psn_a)?, &rc)?;
        qps.push((qa, qb));
    }
    let setup_seconds = t.elapsed().as_secs_f64();
    let rss_setup = rss_kib();

    let t = Instant::now();
    let mut wcs = vec![WorkCompletion::default(); 256];
    for round in 0..ROUNDS {
        for (i, (qa, _)) in qps.iter().enumerate() {
            let sge = [mr_a.sge(i * 8, 8)?];
            let op = SendOp::RdmaWrite {
                remote_addr: mr_b.addr() + (i as u64) * 8,
                rkey: mr_b.rkey(),
            };
            qa.post_send(&[
                SendWr::new(u64::from(round), op, &sge).with_flags(SendFlags::SIGNALED)
            ])?;
        }
        let start = Instant::now();
        let mut done = 0usize;
        while done < qps.len() {
            let k = cq_a.poll(&mut wcs)?;
            for wc in &wcs[..k] {
                if !wc.is_success() {
                    return Err(PerfError::run(format!(
                        "WRITE on QP {:#x} failed: {}",
                        wc.qp_num,
                        wc.status.name()
                    )));
                }
            }
            done += k;
            if k == 0 && start.elapsed() > ROUND_LIMIT {
                return Err(PerfError::run(format!(
                    "round {round}: {done} of {} WRITEs completed in {}s",
                    qps.len(),
                    ROUND_LIMIT.as_secs()
                )));
            }
        }
    }
    let write_seconds = t.elapsed().as_secs_f64();
    let rss_traffic = rss_kib();

    // Let delayed ACKs and timers settle, then watch an idle second.
    std::thread::sleep(Duration::from_millis(300));
    let (cpu0, w0) = (cpu_ticks(), wakeups());
    std::thread::sleep(IDLE);
    let (cpu1, w1) = (cpu_ticks(), wakeups());
    let idle_cpu_ms = cpu1.saturating_sub(cpu0) as f64 * 1000.0 / CLK_TCK;
    let idle_wakeups = w0.zip(w1).map(|(x, y)| y.saturating_sub(x));

    let _keep = (&cq_b, &mr_a);
    Ok(ScaleResult {
        device: device.to_string(),
        qps: n,
        setup_seconds,
        rss_before_kib: rss_before,
        rss_after_setup_kib: rss_setup,
        rss_after_traffic_kib: rss_traffic,
        bytes_per_qp: rss_setup.saturating_sub(rss_before) as f64 * 1024.0 / (2.0 * f64::from(n)),
        bytes_per_qp_after_traffic: rss_traffic.saturating_sub(rss_before) as f64 * 1024.0
            / (2.0 * f64::from(n)),
        writes: u64::from(ROUNDS) * u64::from(n),
        write_seconds,
        idle_cpu_ms,
        idle_wakeups,
    })
}

/// Resident set in KiB: VmRSS of `/proc/self/status`, else `/proc/self/statm`'s resident
/// pages (4 KiB assumed).
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .or_else(|| {
            let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
            let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
            Some(pages * 4)
        })
        .unwrap_or(0)
}

/// utime + stime of this process, in clock ticks.
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let get = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    get(11) + get(12)
}
