//! `softverbs demo`: the fault-injection harness in one command. Three node processes, each an
//! emulated RoCEv2 device on UDP loopback, run the `mixed` workload (RDMA WRITE, SEND with
//! immediate, READ and FETCH_ADD between every pair) while every datagram is dropped with 5 %
//! probability and node 1 is stopped (SIGSTOP) for 200 ms and resumed — the plan
//! `harness/plans/demo.toml`, built into the binary. Afterwards the harness checks from the
//! nodes' memory-region files and completion logs that every operation a sender saw succeed
//! left exactly its bytes at the target, once and in order, and prints a verified summary.
//!
//! `softverbs demo --pair` is the earlier, smaller demo ([`run`]): two devices of the
//! `SOFTVERBS_PROVIDER` provider, one RC QP on each, connected RESET → RTS, their attributes
//! printed, then an RDMA WRITE and a SEND with immediate data whose completions and delivered
//! bytes are printed. Written against `verbs_api::Context` only, so it runs on any backend.

use std::io::{self, Write};
use std::path::PathBuf;
use std::time::Duration;

use verbs_api::{
    CompletionQueue, Context, Device, Error, ErrorKind, MemoryRegion, QpCap, QpInitAttr, QueuePair,
    RcConnectOptions, RecvWr, Result, SendOp, SendWr, WorkCompletion, connect_rc,
};

use crate::run::report::{Report, render};
use crate::run::{EXIT_HARNESS, EXIT_PASS, EXIT_VIOLATION, Options, Progress, RunArgs, Workload};

/// The demo's fault plan (`harness/plans/demo.toml`): 5 % loss, node 1 paused for 200 ms at
/// 500 ms.
pub const DEMO_PLAN: &str = include_str!("../plans/demo.toml");

/// Where the demo plan lives in the source tree (named in the replay command).
pub const DEMO_PLAN_PATH: &str = "harness/plans/demo.toml";

fn demo_duration(s: &str) -> std::result::Result<Duration, String> {
    let d = crate::run::plan::parse_duration(s)?;
    if d < Duration::from_secs(1) {
        return Err("the demo needs at least 1s: node 1 is paused at 500ms for 200ms".into());
    }
    Ok(d)
}

/// Flags of `softverbs demo`.
#[derive(clap::Args, Clone, Debug)]
pub struct DemoArgs {
    /// The two-device demo instead: connect an RC QP pair between two devices of the
    /// SOFTVERBS_PROVIDER provider (default: the in-process emulator), print their
    /// attributes, then a WRITE and a SEND with their completions.
    #[arg(long, conflicts_with_all = ["duration", "seed", "run_dir", "report"])]
    pub pair: bool,
    /// How long the workload runs (at least 1s).
    #[arg(long, default_value = "2s", value_parser = demo_duration)]
    pub duration: Duration,
    /// Seed of the workload and the loss.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Keep the evidence (MR files, logs) in this directory, which must be empty or absent
    /// (default: a temporary directory, removed when the demo passes).
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
    /// Write the run's JSON report here.
    #[arg(long, value_name = "FILE.json")]
    pub report: Option<PathBuf>,
}

/// Runs `softverbs demo`; returns the exit code: 0 the demo passed (every invariant held and
/// every fault of the plan was applied), 1 it did not, 2 invalid flags, 3 the nodes could not
/// be started.
pub fn main(args: &DemoArgs) -> u8 {
    if args.pair {
        return match pair_from_env(&mut io::stdout().lock()) {
            Ok(()) => EXIT_PASS,
            Err(e) => {
                eprintln!("softverbs demo: {e}");
                EXIT_VIOLATION
            }
        };
    }
    let run_args = RunArgs {
        qps_per_peer: 1,
        cm: crate::run::CmMode::None,
        nodes: 3,
        workload: Workload::Mixed,
        faults: Some(PathBuf::from(DEMO_PLAN_PATH)),
        seed: Some(args.seed),
        duration: Some(args.duration),
        ops: None,
        report: None,
        pcap_dir: None,
        run_dir: args.run_dir.clone(),
        qp_timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        recovery: crate::recovery::RecoveryArg::Ibta,
        slack: Duration::from_millis(500),
        timeout: Some(args.duration + Duration::from_secs(30)),
        self_test_corrupt: false,
        self_test: None,
        keep: false,
    };
    println!(
        "softverbs demo: 3 node processes, each an emulated RoCEv2 device on UDP loopback, run\n\
         the mixed workload (RDMA WRITE, SEND with immediate, READ, FETCH_ADD between every pair)\n\
         for {}, while every datagram is dropped with 5 % probability and node 1 is stopped\n\
         (SIGSTOP) for 200 ms at 500 ms, then resumed ({DEMO_PLAN_PATH}). Afterwards every\n\
         operation is checked against the nodes' memory files and completion logs.\n",
        crate::run::plan::format_duration(args.duration)
    );
    let opts = Options {
        plan_text: Some(DEMO_PLAN.to_owned()),
        quiet: true,
        progress: Progress::Stderr,
    };
    let report = match crate::run::execute(&run_args, &opts) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("softverbs demo: {e}");
            return e.exit_code();
        }
    };
    print!("{}", render(&report));
    if let Some(path) = &args.report {
        if let Err(e) = crate::run::orchestrator::write_report(&report, path) {
            eprintln!("softverbs demo: {e}");
            return EXIT_HARNESS;
        }
    }
    let (mut lines, passed) = verdict(&report);
    if passed && args.run_dir.is_none() {
        // The temporary directory this run created, and nothing else.
        if std::fs::remove_dir_all(&report.run_dir).is_ok() {
            lines.insert(
                lines.len() - 1,
                "evidence removed (keep it with --run-dir DIR)".to_owned(),
            );
        }
    }
    println!();
    for line in &lines {
        println!("demo: {line}");
    }
    if passed { EXIT_PASS } else { EXIT_VIOLATION }
}

/// The demo's own verdict on a run's report: what was verified, in a few lines, and whether
/// the demo passed — every invariant held, operations completed, the loss was injected and
/// recovered from, and the pause was applied.
pub fn verdict(r: &Report) -> (Vec<String>, bool) {
    let mut lines = Vec::new();
    let mut ok = r.passed;
    let ops: u64 = r.node_reports.iter().map(|n| n.ops_ok).sum();
    let errors: u64 = r
        .node_reports
        .iter()
        .flat_map(|n| n.completions.iter())
        .filter(|(k, _)| k.as_str() != "IBV_WC_SUCCESS")
        .map(|(_, v)| v)
        .sum();
    let dropped: u64 = r
        .node_reports
        .iter()
        .filter_map(|n| n.injected)
        .map(|f| f.dropped)
        .sum();
    let sent: u64 = r
        .node_reports
        .iter()
        .filter_map(|n| n.stats.as_ref())
        .map(|s| s.sent_pkts)
        .sum();
    let retransmits: u64 = r
        .node_reports
        .iter()
        .filter_map(|n| n.stats.as_ref())
        .map(|s| s.retransmits_timeout + s.retransmits_nak + s.retransmits_sack)
        .sum();
    let checked: u64 = r
        .invariants
        .iter()
        .filter(|i| {
            matches!(
                i.name.as_str(),
                "write-data" | "send-data" | "read-data" | "atomic-exactly-once"
            )
        })
        .map(|i| i.checked)
        .sum();
    if ops == 0 {
        ok = false;
        lines.push("no operation completed".to_owned());
    } else {
        lines.push(format!(
            "{ops} operations completed; {checked} results checked byte for byte in the \
             targets' memory files: none lost, none duplicated, none out of order"
        ));
    }
    if dropped == 0 {
        ok = false;
        lines.push("no datagram was dropped: the loss was not injected".to_owned());
    } else {
        lines.push(format!(
            "{dropped} of {sent} datagrams dropped ({:.1} %), recovered by {retransmits} \
             retransmissions, with {errors} error completions",
            dropped as f64 * 100.0 / sent.max(1) as f64
        ));
    }
    match r.process_faults.first() {
        Some(f) if f.status == "applied" => lines.push(format!(
            "node 1 was stopped at {} ms for 200 ms and caught up after SIGCONT",
            f.applied_at_ms.unwrap_or(0)
        )),
        Some(f) => {
            ok = false;
            lines.push(format!(
                "the pause was not applied: {}",
                f.note.as_deref().unwrap_or(&f.status)
            ));
        }
        None => {
            ok = false;
            lines.push("the plan has no pause".to_owned());
        }
    }
    let held = r.invariants.iter().filter(|i| i.passed()).count();
    lines.push(format!("{held} of {} invariants held", r.invariants.len()));
    lines.push(if ok {
        "PASS".to_owned()
    } else {
        format!("FAIL (replay: {})", r.replay)
    });
    (lines, ok)
}

/// The two-device demo on the provider named by `SOFTVERBS_PROVIDER` (default: `emu`): opens
/// its first two devices and runs [`run`] on them, writing to `out`.
///
/// Errors: the provider is unknown or has fewer than two devices, or any error of [`run`].
pub fn pair_from_env(out: &mut dyn Write) -> Result<()> {
    let registry = crate::registry();
    let provider = std::env::var(verbs_api::dynamic::PROVIDER_ENV).unwrap_or_else(|_| "emu".into());
    let devices = registry.devices(&provider)?;
    let [a, b, ..] = devices.as_slice() else {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!(
                "provider {provider} has {} device(s); the demo needs two",
                devices.len()
            ),
        ));
    };
    let (a, b) = (a.open()?, b.open()?);
    run(&a, &b, out)
}

/// Connects a QP on `a` with a QP on `b` and writes a report to `out`.
///
/// Errors: any verbs error, or `Io` if `out` fails.
pub fn run<C: Context>(a: &C, b: &C, out: &mut dyn Write) -> Result<()> {
    let io = |e: io::Error| Error::new(ErrorKind::Io, e.to_string());
    let cap = QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    };
    let side = |ctx: &C| -> Result<_> {
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(128, None)?;
        let qp = ctx.create_qp(&pd, &cq, &cq, None, &QpInitAttr::rc(cap))?;
        let mr = ctx.alloc_mr(&pd, 4096, RcConnectOptions::default().access)?;
        Ok((pd, cq, qp, mr))
    };
    let (_pd_a, cq_a, qp_a, mr_a) = side(a)?;
    let (_pd_b, cq_b, qp_b, mr_b) = side(b)?;
    let (psn_a, psn_b) = (0x00_1000, 0x00_2000);
    let ep_a = qp_a.endpoint(psn_a)?;
    let ep_b = qp_b.endpoint(psn_b)?;
    writeln!(out, "device {}: {}", a.device_name(), ep_a).map_err(io)?;
    writeln!(out, "device {}: {}", b.device_name(), ep_b).map_err(io)?;
    let opts = RcConnectOptions::default();
    connect_rc(&qp_a, psn_a, &ep_b, &opts)?;
    connect_rc(&qp_b, psn_b, &ep_a, &opts)?;
    for (name, qp, mr) in [
        (a.device_name(), &qp_a, &mr_a),
        (b.device_name(), &qp_b, &mr_b),
    ] {
        let attr = qp.query()?;
        writeln!(
            out,
            "{name} qp {:#08x}: state={} dest_qp={:#08x} sq_psn={:#08x} rq_psn={:#08x} \
             path_mtu={} timeout={} retry_cnt={} rnr_retry={} min_rnr_timer={} \
             max_rd_atomic={} max_dest_rd_atomic={} access={:?}",
            qp.qp_num(),
            attr.qp_state,
            attr.dest_qp_num,
            attr.sq_psn,
            attr.rq_psn,
            attr.path_mtu.bytes(),
            attr.timeout,
            attr.retry_cnt,
            attr.rnr_retry,
            attr.min_rnr_timer,
            attr.max_rd_atomic,
            attr.max_dest_rd_atomic,
            attr.qp_access_flags,
        )
        .map_err(io)?;
        writeln!(
            out,
            "{name} mr: addr={:#x} len={} lkey={:#010x} rkey={:#010x}",
            mr.addr(),
            mr.len(),
            mr.lkey(),
            mr.rkey()
        )
        .map_err(io)?;
    }

    // Data path: WRITE "hello, RDMA" into b's MR, then SEND it back with immediate data.
    let msg = b"hello, RDMA";
    mr_a.write(0, msg)?;
    let src = [mr_a.sge(0, msg.len())?];
    let write = SendOp::RdmaWrite {
        remote_addr: mr_b.addr() + 1024,
        rkey: mr_b.rkey(),
    };
    qp_a.post_send(&[SendWr::new(1, write, &src)])
        .map_err(|e| e.error)?;
    report(out, &a.device_name(), &wait(&cq_a)?)?;
    let recv = [mr_a.sge(2048, 64)?];
    qp_a.post_recv(&[RecvWr::new(2, &recv)])
        .map_err(|e| e.error)?;
    let back = [mr_b.sge(1024, msg.len())?];
    qp_b.post_send(&[SendWr::new(3, SendOp::SendWithImm { imm: 0x5eed }, &back)])
        .map_err(|e| e.error)?;
    report(out, &b.device_name(), &wait(&cq_b)?)?;
    report(out, &a.device_name(), &wait(&cq_a)?)?;
    let mut got = vec![0u8; msg.len()];
    mr_a.read(2048, &mut got)?;
    writeln!(
        out,
        "{} received: {:?}",
        a.device_name(),
        String::from_utf8_lossy(&got)
    )
    .map_err(io)?;
    Ok(())
}

/// Polls `cq` until one completion arrives (bounded).
fn wait<Q: CompletionQueue>(cq: &Q) -> Result<WorkCompletion> {
    let mut wc = [WorkCompletion::default()];
    for _ in 0..100_000 {
        if cq.poll(&mut wc)? == 1 {
            return Ok(wc[0]);
        }
        std::thread::yield_now();
    }
    Err(Error::new(ErrorKind::Io, "no completion arrived"))
}

fn report(out: &mut dyn Write, dev: &str, wc: &WorkCompletion) -> Result<()> {
    writeln!(
        out,
        "{dev} completion: wr_id={} status={} opcode={} byte_len={} imm={:#x}",
        wc.wr_id,
        wc.status,
        wc.opcode.name(),
        wc.byte_len,
        wc.imm_data
    )
    .map_err(|e| Error::new(ErrorKind::Io, e.to_string()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use verbs_api::{Device, Provider};

    #[test]
    fn demo_connects_two_emulated_devices() {
        let sim = emu_sim::SimProvider::builder().devices(2).build().unwrap();
        let devs = sim.devices().unwrap();
        let (a, b) = (devs[0].open().unwrap(), devs[1].open().unwrap());
        let mut out = Vec::new();
        super::run(&a, &b, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.matches("state=RTS").count(), 2, "{text}");
        assert_eq!(text.matches("status=IBV_WC_SUCCESS").count(), 3, "{text}");
        assert!(text.contains("received: \"hello, RDMA\""), "{text}");
    }
}
