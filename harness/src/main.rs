//! The `softverbs` command-line tool. See the README for its subcommands.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use verbs_api::Device;

/// softverbs: a userspace RDMA verbs emulator.
#[derive(Parser, Debug)]
#[command(name = "softverbs", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Connect an RC QP pair between two devices of the selected provider (SOFTVERBS_PROVIDER,
    /// default: the in-process emulator) and print their attributes.
    Demo,
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
    Run(Box<softverbs::run::RunArgs>),
    /// One node of `softverbs run` (started by the orchestrator; reads JSON lines on stdin).
    #[command(hide = true)]
    Node,
    /// perftest-shaped benchmarks (write_bw, write_lat, send_bw, send_lat, read_bw, read_lat,
    /// atomic_bw, atomic_lat, scale), optionally against raw UDP in the same run
    /// (`--baseline`). Exit code: 0 done, 1 failed, 2 bad flags.
    Perf(Box<softverbs::perf::PerfArgs>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => return ExitCode::from(softverbs::run::run(&args)),
        Command::Node => return softverbs::run::node_main(),
        Command::Perf(args) => return ExitCode::from(softverbs::perf::run(*args)),
        Command::Demo => demo().map_err(|e| e.to_string()),
        Command::Capture { out } => softverbs::capture::write_demo_capture(&out)
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

fn demo() -> Result<(), verbs_api::Error> {
    let registry = softverbs::registry();
    let provider = std::env::var(verbs_api::dynamic::PROVIDER_ENV).unwrap_or_else(|_| "emu".into());
    let devices = registry.devices(&provider)?;
    let [a, b, ..] = devices.as_slice() else {
        return Err(verbs_api::Error::new(
            verbs_api::ErrorKind::NotFound,
            format!(
                "provider {provider} has {} device(s); the demo needs two",
                devices.len()
            ),
        ));
    };
    let (a, b) = (a.open()?, b.open()?);
    softverbs::demo::run(&a, &b, &mut std::io::stdout().lock())
}
