//! The `softverbs` command-line tool. See the README for its subcommands.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// softverbs: a userspace RDMA verbs emulator.
#[derive(Parser, Debug)]
#[command(name = "softverbs", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log to stderr with this filter (EnvFilter syntax, e.g. `emu_proto=debug`); default
    /// SOFTVERBS_LOG, then RUST_LOG.
    #[arg(long, global = true, value_name = "FILTER")]
    log: Option<String>,
    /// Write every trace event to FILE as JSON lines, the input of `softverbs ladder`; default
    /// SOFTVERBS_TRACE.
    #[arg(long, global = true, value_name = "FILE")]
    trace: Option<std::path::PathBuf>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The fault-injection harness in one command: 3 node processes run the mixed workload
    /// over UDP under 5 % loss with node 1 paused and resumed, then every operation is verified
    /// from evidence. `--pair`: connect an RC QP pair between two devices of the selected
    /// provider (SOFTVERBS_PROVIDER) and print their attributes. Exit code: 0 pass.
    Demo(Box<softverbs_cli::demo::DemoArgs>),
    /// Write a pcap of a scripted two-device RC exchange (every RC opcode, an ACK and the three
    /// kinds of NAK) that Wireshark decodes as RoCEv2.
    Capture {
        /// Output file.
        #[arg(long, value_name = "FILE.pcap")]
        out: std::path::PathBuf,
    },
    /// Run a workload on N node processes over UDP loopback, inject network and process
    /// faults, and check from evidence (MR files, completion logs) that nothing was lost,
    /// duplicated or reordered. Exit code: 0 pass, 1 violation, 2 bad input, 3 harness error.
    Run(Box<softverbs_cli::run::RunArgs>),
    /// Many short runs, each with a fault plan drawn from the seed (loss, duplication, jitter,
    /// corruption, loss storms and partitions that heal within the retry budget, a kill or a
    /// pause); a table of the runs and totals. Exit code: 0 all passed, 1 a violation, 2 bad
    /// flags, 3 a run could not start.
    Campaign(Box<softverbs_cli::run::campaign::CampaignArgs>),
    /// One node of `softverbs run` (started by the orchestrator; reads JSON lines on stdin).
    #[command(hide = true)]
    Node,
    /// perftest-shaped benchmarks (write_bw, write_lat, send_bw, send_lat, read_bw, read_lat,
    /// atomic_bw, atomic_lat, scale), optionally against raw UDP in the same run
    /// (`--baseline`). Exit code: 0 done, 1 failed, 2 bad flags.
    Perf(Box<softverbs_cli::perf::PerfArgs>),
    /// ibv_rc_pingpong on any provider, compatible on the wire and on the command line: server
    /// without HOST, client with it (e.g. against Linux rxe). Exit code: 0 done, 1 failed.
    Pingpong(Box<softverbs_cli::interop::pingpong::PingpongArgs>),
    /// ibv_ud_pingpong on any provider, compatible on the wire and on the command line: server
    /// without HOST, client with it (e.g. against Linux rxe). Exit code: 0 done, 1 failed.
    UdPingpong(Box<softverbs_cli::interop::ud_pingpong::UdPingpongArgs>),
    /// RDMA WRITE/READ, WRITE/SEND_WITH_IMM and atomics in both directions between two
    /// processes (server without HOST), every result verified on both sides. Exit code: 0 all
    /// passed.
    RdmaCheck(Box<softverbs_cli::interop::rdma_check::RdmaCheckArgs>),
    /// One IB CM handshake attempt from a UDP device's GSI to a peer's QP1 (e.g. Linux rxe's
    /// kernel CM): sends a REQ and reports the REJ reason, REP or unreachable. Exit code: 0
    /// the expected answer.
    CmProbe(Box<softverbs_cli::interop::cm_probe::CmProbeArgs>),
    /// Verify the ICRC of every RoCEv2 packet of a pcap (taken on the wire) over its real
    /// IPv4/UDP headers. Exit code: 0 all valid.
    IcrcCheck(Box<softverbs_cli::interop::icrc_check::IcrcCheckArgs>),
    /// Run an unmodified libibverbs program (perftest, ibv_rc_pingpong, pyverbs, …) on
    /// softverbs: the drop-in libibverbs.so.1 first on LD_LIBRARY_PATH, SOFTVERBS_FAULTS and
    /// SOFTVERBS_PCAP set when asked for. Exit code: the program's; 2 bad flags or no library
    /// (build it with scripts/build-libibverbs.sh --release), 126/127 program not executable/found.
    Exec(Box<softverbs_cli::exec::ExecArgs>),
    /// A ladder (sequence) diagram of an exchange, as SVG or HTML: one lane per device/QP,
    /// one arrow per packet, time down the page, from a pcap written by softverbs or from
    /// SOFTVERBS_TRACE files (with fault verdicts, timers, retransmissions and completions).
    /// Exit code: 0 written, 1 cannot write, 2 bad input or flags.
    Ladder(Box<softverbs_cli::ladder::LadderArgs>),
    /// Print `export` lines that make a shell's programs use softverbs
    /// (`eval "$(softverbs env)"`). Exit code: 0, 2 bad flags or no library.
    Env(Box<softverbs_cli::exec::DropInArgs>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let log = cli.log.clone().or_else(emu_trace::log_filter_from_env);
    let trace = cli.trace.clone().or_else(emu_trace::trace_file_from_env);
    if let Err(e) = emu_trace::init(log.as_deref(), trace.as_deref()) {
        eprintln!("softverbs: {e}");
        return ExitCode::from(2);
    }
    let result = match cli.command {
        Command::Run(args) => return ExitCode::from(softverbs_cli::run::run(&args)),
        Command::Campaign(args) => {
            return ExitCode::from(softverbs_cli::run::campaign::campaign(&args));
        }
        Command::Demo(args) => return ExitCode::from(softverbs_cli::demo::main(&args)),
        Command::Node => return softverbs_cli::run::node_main(),
        Command::Perf(args) => return ExitCode::from(softverbs_cli::perf::run(*args)),
        Command::Pingpong(args) => {
            return ExitCode::from(softverbs_cli::interop::pingpong::run(&args));
        }
        Command::UdPingpong(args) => {
            return ExitCode::from(softverbs_cli::interop::ud_pingpong::run(&args));
        }
        Command::RdmaCheck(args) => {
            return ExitCode::from(softverbs_cli::interop::rdma_check::run(&args));
        }
        Command::CmProbe(args) => {
            return ExitCode::from(softverbs_cli::interop::cm_probe::run(&args));
        }
        Command::IcrcCheck(args) => {
            return ExitCode::from(softverbs_cli::interop::icrc_check::run(&args));
        }
        Command::Exec(args) => return ExitCode::from(softverbs_cli::exec::exec(&args)),
        Command::Ladder(args) => return ExitCode::from(softverbs_cli::ladder::run(&args)),
        Command::Env(args) => return ExitCode::from(softverbs_cli::exec::env(&args)),
        Command::Capture { out } => softverbs_cli::capture::write_demo_capture(&out)
            .map(|summary| {
                println!(
                    "wrote {} packets to {}",
                    summary.packet_count(),
                    out.display()
                );
            })
            .map_err(|e| e.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("softverbs: {e}");
            ExitCode::FAILURE
        }
    }
}
