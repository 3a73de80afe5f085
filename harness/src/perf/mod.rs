//! `softverbs perf`: perftest-shaped benchmarks (`write_bw`, `write_lat`, `send_bw`,
//! `send_lat`, `read_bw`, `read_lat`, `atomic_bw`, `atomic_lat`), optionally measured against
//! raw UDP between the same two processes in the same run (`--baseline`), plus the QP scale
//! test (`scale`) and a goodput-versus-loss sweep (`--sweep-loss`).
//!
//! By default the command starts a second copy of itself as the server (two processes on
//! loopback, OS-chosen ports, endpoint exchange over TCP as perftest does) and acts as the
//! client; `--server` and `--client ADDR` split the two across hosts. The client sends its
//! whole configuration to the server, so the server needs only `--server` (and `-p`).
//! `--backend inproc` runs both sides as two threads of one process on the in-process
//! emulator (no sockets), to measure the engine itself.
//!
//! Output follows perftest's (perftest.md §5.1): a header block, then the column header and
//! one row per size; the formulas are perftest's (§5.3), timed with `std::time::Instant`
//! instead of cycle counters. Differences, by choice: the latency `t_stdev` is the exact
//! standard deviation (perftest truncates each deviation to an integer); the bandwidth peak
//! samples at most 64 window starts.
//!
//! Exit codes: 0 done, 1 the run failed (the message says where), 2 bad flags.

mod baseline;
mod cpu;
mod ctl;
mod scale;
pub mod stats;
mod sweep;
mod verbs;

use std::io::{BufRead, BufReader, Write as _};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use emu_sim::SimProvider;
use emu_udp::{UdpProvider, oob};
use serde::{Deserialize, Serialize};
use verbs_api::{Device, Provider};

use crate::recovery::RecoveryArg;

pub use stats::{BwResult, BwUnit, LatDuration, LatResult};

/// `println!` that ignores a closed stdout (`softverbs perf … | head` must not panic).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}
pub(crate) use say;

use ctl::{Ctl, TcpCtl};

/// Exit code: the benchmark ran.
pub const EXIT_OK: u8 = 0;
/// Exit code: the benchmark failed (setup, transport error, peer gone, stall).
pub const EXIT_FAILED: u8 = 1;
/// Exit code: invalid flags.
pub const EXIT_USAGE: u8 = 2;

/// perftest's TCP port for the endpoint exchange.
pub const DEFAULT_PORT: u16 = 18515;

/// The largest size of `-a` (2^23, perftest's).
pub const MAX_ALL_SIZE: u64 = 1 << 23;

/// The tests, named as perftest's tools without the `ib_` prefix.
#[derive(clap::ValueEnum, Serialize, Deserialize, Copy, Clone, Debug, PartialEq, Eq)]
pub enum TestName {
    /// RDMA WRITE bandwidth (ib_write_bw).
    #[value(name = "write_bw")]
    #[serde(rename = "write_bw")]
    WriteBw,
    /// RDMA WRITE latency, ping-pong polling the last byte (ib_write_lat).
    #[value(name = "write_lat")]
    #[serde(rename = "write_lat")]
    WriteLat,
    /// SEND bandwidth (ib_send_bw).
    #[value(name = "send_bw")]
    #[serde(rename = "send_bw")]
    SendBw,
    /// SEND latency, ping-pong (ib_send_lat).
    #[value(name = "send_lat")]
    #[serde(rename = "send_lat")]
    SendLat,
    /// RDMA READ bandwidth (ib_read_bw).
    #[value(name = "read_bw")]
    #[serde(rename = "read_bw")]
    ReadBw,
    /// RDMA READ latency (ib_read_lat; full round trip).
    #[value(name = "read_lat")]
    #[serde(rename = "read_lat")]
    ReadLat,
    /// FETCH_AND_ADD bandwidth (ib_atomic_bw).
    #[value(name = "atomic_bw")]
    #[serde(rename = "atomic_bw")]
    AtomicBw,
    /// FETCH_AND_ADD latency (ib_atomic_lat; full round trip).
    #[value(name = "atomic_lat")]
    #[serde(rename = "atomic_lat")]
    AtomicLat,
    /// `--qps` connected QPs on one device with traffic on all: memory per QP, idle CPU.
    #[value(name = "scale")]
    #[serde(rename = "scale")]
    Scale,
}

/// The operation a test measures.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verb {
    Write,
    Send,
    Read,
    Atomic,
}

impl TestName {
    fn name(self) -> &'static str {
        match self {
            TestName::WriteBw => "write_bw",
            TestName::WriteLat => "write_lat",
            TestName::SendBw => "send_bw",
            TestName::SendLat => "send_lat",
            TestName::ReadBw => "read_bw",
            TestName::ReadLat => "read_lat",
            TestName::AtomicBw => "atomic_bw",
            TestName::AtomicLat => "atomic_lat",
            TestName::Scale => "scale",
        }
    }

    pub(crate) fn verb(self) -> Verb {
        match self {
            TestName::WriteBw | TestName::WriteLat | TestName::Scale => Verb::Write,
            TestName::SendBw | TestName::SendLat => Verb::Send,
            TestName::ReadBw | TestName::ReadLat => Verb::Read,
            TestName::AtomicBw | TestName::AtomicLat => Verb::Atomic,
        }
    }

    pub(crate) fn is_bw(self) -> bool {
        matches!(
            self,
            TestName::WriteBw | TestName::SendBw | TestName::ReadBw | TestName::AtomicBw
        )
    }

    /// Latency = RTT / factor (perftest: 2 for SEND/WRITE, 1 for READ/atomics).
    pub(crate) fn rtt_factor(self) -> u32 {
        match self.verb() {
            Verb::Write | Verb::Send => 2,
            Verb::Read | Verb::Atomic => 1,
        }
    }

    /// perftest's title, e.g. `RDMA_Write BW Test`.
    fn title(self) -> String {
        let op = match self.verb() {
            Verb::Write => "RDMA_Write",
            Verb::Send => "Send",
            Verb::Read => "RDMA_Read",
            Verb::Atomic => "Atomic FETCH_AND_ADD",
        };
        let kind = if self.is_bw() { "BW" } else { "Latency" };
        format!("{op} {kind} Test")
    }
}

/// Which emulator backend carries the traffic.
#[derive(clap::ValueEnum, Serialize, Deserialize, Copy, Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The UDP driver: two processes (or hosts), real sockets.
    #[value(name = "udp")]
    #[serde(rename = "udp")]
    Udp,
    /// The in-process emulator: two threads of one process, no sockets.
    #[value(name = "inproc")]
    #[serde(rename = "inproc")]
    Inproc,
}

/// Flags of `softverbs perf`. Options that perftest marks symmetric are taken from the client
/// only: it sends them to the server.
#[derive(clap::Args, Clone, Debug)]
#[command(
    after_help = "Examples:\n  softverbs perf write_bw -s 65536 --baseline\n  \
    softverbs perf write_lat -s 8 -n 10000 --baseline --busy-poll\n  \
    softverbs perf send_bw -a --max-size 65536 --json out.json\n  \
    softverbs perf write_bw --backend inproc -s 8 -n 1000000\n  \
    softverbs perf scale --qps 10000\n  \
    softverbs perf write_bw --sweep-loss --svg loss.svg\n  \
    softverbs perf write_bw --server            (host A)\n  \
    softverbs perf write_bw --client hostA      (host B)"
)]
pub struct PerfArgs {
    /// The test (perftest's tool name without `ib_`), or `scale`.
    #[arg(value_enum, required_unless_present = "sweep_loss")]
    pub test: Option<TestName>,
    /// Message size in bytes (default 65536 for bandwidth, 2 for latency; atomics: 8).
    #[arg(short = 's', long = "size", value_parser = clap::value_parser!(u64).range(1..))]
    pub size: Option<u64>,
    /// Iterations per QP (default 5000 for write_bw, 1000 otherwise; at least 5).
    #[arg(short = 'n', long = "iters", value_parser = clap::value_parser!(u64).range(5..))]
    pub iters: Option<u64>,
    /// Every size 2, 4, … up to 2^23 (bounded by --max-size).
    #[arg(short = 'a', long = "all", conflicts_with = "size")]
    pub all: bool,
    /// Largest size of `-a`.
    #[arg(long = "max-size", default_value_t = MAX_ALL_SIZE,
          value_parser = clap::value_parser!(u64).range(2..=MAX_ALL_SIZE))]
    pub max_size: u64,
    /// QPs (bandwidth tests; latency tests use one).
    #[arg(short = 'q', long = "qp", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=256))]
    pub qp: u32,
    /// Send queue depth (default 128 for bandwidth, 1 outstanding for latency).
    #[arg(short = 't', long = "tx-depth", value_parser = clap::value_parser!(u32).range(1..=8192))]
    pub tx_depth: Option<u32>,
    /// Receive queue depth (SEND tests).
    #[arg(short = 'r', long = "rx-depth", default_value_t = 512,
          value_parser = clap::value_parser!(u32).range(1..=8192))]
    pub rx_depth: u32,
    /// Signal one completion per N sends.
    #[arg(short = 'Q', long = "cq-mod", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=8192))]
    pub cq_mod: u32,
    /// WRs per post_send call.
    #[arg(short = 'l', long = "post_list", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub post_list: u32,
    /// Path MTU: 256, 512, 1024, 2048 or 4096.
    #[arg(short = 'm', long = "mtu", default_value_t = 4096)]
    pub mtu: u32,
    /// Local ACK timeout code: 4.096 µs × 2^N (14 ≈ 67 ms, perftest's).
    #[arg(short = 'u', long = "qp-timeout", default_value_t = 14,
          value_parser = clap::value_parser!(u8).range(1..=31))]
    pub qp_timeout: u8,
    /// Sleep on CQ events (a completion channel) instead of spinning on the CQ.
    #[arg(short = 'e', long = "events")]
    pub events: bool,
    /// Latency tests: yield the CPU (sched_yield) on every empty spin while waiting for the
    /// peer's WRITE, so that the device's progress thread gets the core on small machines.
    #[arg(long = "spin-yield")]
    pub spin_yield: bool,
    /// Report Gb/s instead of MiB/s.
    #[arg(long = "report_gbits")]
    pub report_gbits: bool,
    /// Run each size for this many seconds instead of -n iterations.
    #[arg(short = 'D', long = "duration", conflicts_with = "iters",
          value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub duration: Option<u32>,
    /// Busy-poll: the UDP devices' progress threads spin instead of sleeping in epoll (and the
    /// baseline spins on nonblocking sockets).
    #[arg(long = "busy-poll")]
    pub busy_poll: bool,
    /// Send with one datagram per system call: no UDP GSO on the devices' sockets (by default
    /// both ends, being softverbs, coalesce runs of equal-size datagrams into GSO sends).
    #[arg(long = "no-gso")]
    pub no_gso: bool,
    /// Also write the results as JSON to FILE.
    #[arg(long = "json", value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Emulator backend.
    #[arg(long = "backend", value_enum, default_value_t = Backend::Udp)]
    pub backend: Backend,
    /// Also run the same sizes and pattern over raw UDP between the same two processes, and
    /// print ours ÷ UDP (bandwidth: GSO→GRO when available, and one datagram per `sendmsg`
    /// with `recvmmsg` receives; latency: a ping-pong that spins when the verbs run spins).
    /// The JSON adds each side's CPU seconds and bytes per CPU-second, ours and the
    /// baseline's. UDP backend only.
    #[arg(long = "baseline")]
    pub baseline: bool,
    /// Drop this fraction (0–1) of the datagrams each side sends (the driver's fault plan).
    #[arg(long = "loss", value_name = "P")]
    pub loss: Option<f64>,
    /// Goodput versus loss rate (0, 0.1, 0.5, 1, 2, 5, 10 %) for a bandwidth test (default
    /// write_bw), in both loss-recovery modes (IBTA and selective repeat), or in the one
    /// `--recovery` names.
    #[arg(long = "sweep-loss")]
    pub sweep_loss: bool,
    /// With --sweep-loss: measure each point this many times and report the median (and the
    /// spread). Each round runs every loss rate once in each mode, in order.
    #[arg(long = "rounds", default_value_t = 1, requires = "sweep_loss",
          value_parser = clap::value_parser!(u32).range(1..=50))]
    pub rounds: u32,
    /// Loss recovery of the QPs: IBTA go-back-N, or selective repeat (a softverbs extension
    /// both ends enable; they do here, the server takes it from the client's configuration).
    /// IBTA when not given; --sweep-loss runs both unless it is given.
    #[arg(long = "recovery", value_enum)]
    pub recovery: Option<RecoveryArg>,
    /// With --sweep-loss: write an SVG plot of goodput versus loss here.
    #[arg(long = "svg", value_name = "FILE", requires = "sweep_loss")]
    pub svg: Option<PathBuf>,
    /// Be the server: wait for one client on -p, run what it asks, exit.
    #[arg(long = "server", conflicts_with = "client")]
    pub server: bool,
    /// Be the client of the server at ADDR (host or host:port; port -p by default).
    #[arg(long = "client", value_name = "ADDR")]
    pub client: Option<String>,
    /// TCP port of the endpoint exchange (server: 0 lets the OS choose).
    #[arg(short = 'p', long = "port", default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// IP address of the UDP device and the server's TCP listener (default: 127.0.0.1 for
    /// the server, the address the TCP connection uses for the client).
    #[arg(long = "bind", value_name = "IP")]
    pub bind: Option<IpAddr>,
    /// Seed of the loss injection.
    #[arg(long = "seed", default_value_t = 1)]
    pub seed: u64,
    /// `scale`: connected QPs to create on the device.
    #[arg(long = "qps", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..=30_000))]
    pub qps: u32,
}

/// An error of a perf run: bad flags (exit 2) or a failed run (exit 1).
#[derive(Debug)]
pub struct PerfError {
    usage: bool,
    msg: String,
}

impl PerfError {
    pub(crate) fn usage(msg: impl Into<String>) -> PerfError {
        PerfError {
            usage: true,
            msg: msg.into(),
        }
    }

    pub(crate) fn run(msg: impl Into<String>) -> PerfError {
        PerfError {
            usage: false,
            msg: msg.into(),
        }
    }
}

impl std::fmt::Display for PerfError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.msg)
    }
}

impl From<verbs_api::Error> for PerfError {
    fn from(e: verbs_api::Error) -> PerfError {
        PerfError::run(e.to_string())
    }
}

impl From<verbs_api::PostError> for PerfError {
    fn from(e: verbs_api::PostError) -> PerfError {
        PerfError::run(e.to_string())
    }
}

impl From<std::io::Error> for PerfError {
    fn from(e: std::io::Error) -> PerfError {
        PerfError::run(e.to_string())
    }
}

/// One measured run: a size at a loss rate. It travels in the client's `config` line as a
/// `[size, loss]` pair: the line holds at most `emu_udp::oob::MAX_LINE` bytes, and a sweep of
/// 7 loss rates × 2 modes' worth of rounds as objects overflowed it from `--rounds 4` on. The
/// server still reads the older `{"size", "loss"}` form.
#[derive(Serialize, Deserialize, Copy, Clone, Debug, PartialEq)]
#[serde(from = "RunSpecWire", into = "(u64, f64)")]
pub(crate) struct RunSpec {
    pub(crate) size: u64,
    pub(crate) loss: f64,
}

/// The forms a [`RunSpec`] is read from.
#[derive(Deserialize)]
#[serde(untagged)]
enum RunSpecWire {
    Pair(u64, f64),
    Object { size: u64, loss: f64 },
}

impl From<RunSpecWire> for RunSpec {
    fn from(w: RunSpecWire) -> RunSpec {
        match w {
            RunSpecWire::Pair(size, loss) | RunSpecWire::Object { size, loss } => {
                RunSpec { size, loss }
            }
        }
    }
}

impl From<RunSpec> for (u64, f64) {
    fn from(r: RunSpec) -> (u64, f64) {
        (r.size, r.loss)
    }
}

/// Everything both sides must agree on; the client sends it to the server.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub(crate) struct Config {
    pub(crate) test: TestName,
    pub(crate) runs: Vec<RunSpec>,
    /// Largest size: each QP's buffer holds two of these (send half, receive half).
    pub(crate) max_size: u64,
    pub(crate) iters: u64,
    pub(crate) duration: Option<u32>,
    pub(crate) qps: u32,
    pub(crate) tx_depth: u32,
    pub(crate) rx_depth: u32,
    pub(crate) cq_mod: u32,
    pub(crate) post_list: u32,
    pub(crate) mtu: u32,
    pub(crate) qp_timeout: u8,
    pub(crate) busy_poll: bool,
    /// UDP GSO off on the devices (`--no-gso`).
    #[serde(default)]
    pub(crate) no_gso: bool,
    pub(crate) events: bool,
    pub(crate) spin_yield: bool,
    pub(crate) baseline: bool,
    pub(crate) seed: u64,
    /// Loss recovery of both sides' QPs (the endpoint exchange carries it to the server).
    #[serde(default)]
    pub(crate) recovery: RecoveryArg,
}

impl Config {
    /// Checks a configuration received from a client against the limits the flags enforce,
    /// so that a server never sizes buffers, queues or loops from unchecked numbers. The
    /// error names the first field out of range.
    pub(crate) fn check(&self) -> Result<(), String> {
        let in_range = |name: &str, v: u64, lo: u64, hi: u64| {
            if (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err(format!("{name} {v} is outside {lo}..={hi}"))
            }
        };
        in_range("max_size", self.max_size, 1, MAX_ALL_SIZE)?;
        in_range("qps", u64::from(self.qps), 1, 256)?;
        if u64::from(self.qps) * self.max_size * 2 > 1 << 30 {
            return Err("qps × max_size needs more than 1 GiB of buffers".to_owned());
        }
        in_range("iters", self.iters, 5, u64::MAX)?;
        if let Some(d) = self.duration {
            in_range("duration", u64::from(d), 1, 3600)?;
        }
        in_range("tx_depth", u64::from(self.tx_depth), 1, 8192)?;
        in_range("rx_depth", u64::from(self.rx_depth), 1, 8192)?;
        in_range("cq_mod", u64::from(self.cq_mod), 1, 8192)?;
        in_range("post_list", u64::from(self.post_list), 1, 1024)?;
        in_range("qp_timeout", u64::from(self.qp_timeout), 1, 31)?;
        if !matches!(self.mtu, 256 | 512 | 1024 | 2048 | 4096) {
            return Err(format!(
                "mtu {} is not one of 256, 512, 1024, 2048, 4096",
                self.mtu
            ));
        }
        in_range("runs", self.runs.len() as u64, 1, 1024)?;
        for r in &self.runs {
            in_range("size", r.size, 1, self.max_size)?;
            if !(0.0..1.0).contains(&r.loss) {
                return Err(format!("loss {} is not a fraction in [0, 1)", r.loss));
            }
        }
        Ok(())
    }

    /// The flags' configuration, or a usage error.
    fn from_args(a: &PerfArgs) -> Result<(Config, TestName), PerfError> {
        let test = match (a.test, a.sweep_loss) {
            (Some(t), _) => t,
            (None, true) => TestName::WriteBw,
            (None, false) => return Err(PerfError::usage("a test name is required")),
        };
        if a.sweep_loss && !test.is_bw() {
            return Err(PerfError::usage(format!(
                "--sweep-loss needs a bandwidth test, not {}",
                test.name()
            )));
        }
        if a.baseline && a.backend == Backend::Inproc {
            return Err(PerfError::usage(
                "--baseline compares with raw UDP: it needs --backend udp",
            ));
        }
        if a.baseline && a.sweep_loss {
            return Err(PerfError::usage("--baseline and --sweep-loss do not mix"));
        }
        if !matches!(a.mtu, 256 | 512 | 1024 | 2048 | 4096) {
            return Err(PerfError::usage(format!(
                "-m/--mtu {} is not one of 256, 512, 1024, 2048, 4096",
                a.mtu
            )));
        }
        if let Some(p) = a.loss {
            if !(0.0..1.0).contains(&p) {
                return Err(PerfError::usage(format!(
                    "--loss {p} is not a fraction in [0, 1)"
                )));
            }
            if a.sweep_loss {
                return Err(PerfError::usage("--loss and --sweep-loss do not mix"));
            }
        }
        if (a.server || a.client.is_some()) && a.backend == Backend::Inproc {
            return Err(PerfError::usage(
                "--server/--client need --backend udp (inproc runs in one process)",
            ));
        }
        let atomic = test.verb() == Verb::Atomic;
        let sizes: Vec<u64> = if atomic {
            if a.size.is_some_and(|s| s != 8) || a.all {
                return Err(PerfError::usage("atomics are 8 bytes: drop -s/-a"));
            }
            vec![8]
        } else if a.all {
            std::iter::successors(Some(2u64), |s| Some(s * 2))
                .take_while(|&s| s <= a.max_size)
                .collect()
        } else {
            vec![a.size.unwrap_or(if test.is_bw() { 65536 } else { 2 })]
        };
        let max_size = sizes.iter().copied().max().unwrap_or(8);
        if max_size > MAX_ALL_SIZE {
            return Err(PerfError::usage(format!(
                "-s {max_size} is above the largest size {MAX_ALL_SIZE}"
            )));
        }
        let qps = if test.is_bw() { a.qp } else { 1 };
        if u64::from(qps) * max_size * 2 > 1 << 30 {
            return Err(PerfError::usage(
                "-q × size needs more than 1 GiB of buffers; lower -q or the size",
            ));
        }
        if a.duration.is_some() && !test.is_bw() && sizes.iter().any(|&s| s < 2) {
            return Err(PerfError::usage(
                "latency tests with -D need sizes of at least 2 bytes",
            ));
        }
        let iters = a.iters.unwrap_or(match test {
            TestName::WriteBw => 5000,
            _ => 1000,
        });
        let losses: Vec<f64> = if a.sweep_loss {
            sweep::LOSS_RATES.to_vec()
        } else {
            vec![a.loss.unwrap_or(0.0)]
        };
        // One round: a sweep's rounds are sessions of their own (`run_inner`).
        let runs = sizes
            .iter()
            .flat_map(|&size| losses.iter().map(move |&loss| RunSpec { size, loss }))
            .collect();
        let tx_depth = a.tx_depth.unwrap_or(if test.is_bw() { 128 } else { 1 });
        Ok((
            Config {
                test,
                runs,
                max_size,
                iters,
                duration: a.duration,
                qps,
                tx_depth,
                rx_depth: a.rx_depth,
                cq_mod: a.cq_mod,
                post_list: a.post_list,
                mtu: a.mtu,
                qp_timeout: a.qp_timeout,
                busy_poll: a.busy_poll,
                no_gso: a.no_gso,
                events: a.events,
                spin_yield: a.spin_yield,
                baseline: a.baseline,
                seed: a.seed,
                recovery: a.recovery.unwrap_or(RecoveryArg::Ibta),
            },
            test,
        ))
    }
}

/// Runs `softverbs perf` and returns the exit code ([`EXIT_OK`], [`EXIT_FAILED`],
/// [`EXIT_USAGE`]). Errors are printed to stderr.
pub fn run(args: PerfArgs) -> u8 {
    match run_inner(&args) {
        Ok(()) => EXIT_OK,
        Err(e) if e.usage => {
            eprintln!("softverbs perf: error: {e}");
            EXIT_USAGE
        }
        Err(e) => {
            eprintln!("softverbs perf: {e}");
            EXIT_FAILED
        }
    }
}

fn run_inner(args: &PerfArgs) -> Result<(), PerfError> {
    if args.test == Some(TestName::Scale) {
        if args.server || args.client.is_some() || args.baseline || args.sweep_loss {
            return Err(PerfError::usage(
                "scale runs in one process: no --server/--client/--baseline/--sweep-loss",
            ));
        }
        return scale::run(args);
    }
    let (cfg, _) = Config::from_args(args)?;
    if args.server {
        return serve_tcp(args);
    }
    let mut out = Output::new(args, &cfg);
    // A sweep without `--recovery` runs both modes; otherwise the one configured.
    let modes = if args.sweep_loss && args.recovery.is_none() {
        vec![RecoveryArg::Ibta, RecoveryArg::Sr]
    } else {
        vec![cfg.recovery]
    };
    // Round by round, each mode in turn: a burst of load on a shared machine spreads over
    // the points and both modes instead of sinking one point's rounds. Round `r` runs with
    // its own seeds (run `i` of the round: seed + r × runs + i), the same in both modes.
    let rounds = if args.sweep_loss { args.rounds } else { 1 };
    let per_round = cfg.runs.len() as u64;
    for round in 0..u64::from(rounds) {
        for &recovery in &modes {
            let cfg = Config {
                recovery,
                seed: cfg.seed.wrapping_add(round * per_round),
                ..cfg.clone()
            };
            run_session(args, &cfg, &mut out)?;
        }
    }
    out.finish(args)
}

/// One client session (a server child for a loopback UDP run): every run of `cfg`.
fn run_session(args: &PerfArgs, cfg: &Config, out: &mut Output) -> Result<(), PerfError> {
    let cfg = cfg.clone();
    let out = &mut *out;
    match args.backend {
        Backend::Inproc => run_inproc(&cfg, out)?,
        Backend::Udp => match &args.client {
            Some(addr) => {
                let server = resolve(addr, args.port)?;
                run_client_tcp(args, &cfg, server, out)?;
            }
            None => {
                let server = ServerChild::spawn(args)?;
                let result = run_client_tcp(args, &cfg, server.addr, out);
                server.finish(result.is_ok())?;
                result?;
            }
        },
    }
    Ok(())
}

fn resolve(addr: &str, port: u16) -> Result<SocketAddr, PerfError> {
    if let Ok(a) = addr.parse::<SocketAddr>() {
        return Ok(a);
    }
    if let Ok(ip) = addr.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    let with_port = if addr.contains(':') {
        addr.to_string()
    } else {
        format!("{addr}:{port}")
    };
    with_port
        .to_socket_addrs()
        .ok()
        .and_then(|mut it| it.next())
        .ok_or_else(|| PerfError::usage(format!("--client {addr:?}: cannot resolve the address")))
}

/// The server process started by a loopback run; killed and reaped on drop.
struct ServerChild {
    child: Option<Child>,
    addr: SocketAddr,
}

impl ServerChild {
    fn spawn(args: &PerfArgs) -> Result<ServerChild, PerfError> {
        let exe = std::env::current_exe()
            .map_err(|e| PerfError::run(format!("cannot find my own executable: {e}")))?;
        let bind = args.bind.unwrap_or(IpAddr::from([127, 0, 0, 1]));
        let test = args.test.unwrap_or(TestName::WriteBw).name();
        let mut child = Command::new(exe)
            .args(["perf", test, "--server", "--port", "0", "--bind"])
            .arg(bind.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| PerfError::run(format!("cannot start the server process: {e}")))?;
        let stdout = child.stdout.take();
        let mut guard = ServerChild {
            child: Some(child),
            addr: SocketAddr::new(bind, 0),
        };
        let stdout = stdout.ok_or_else(|| PerfError::run("server process has no stdout pipe"))?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let first = lines.next();
            let _ = tx.send(first);
            // Drain the rest so the server never blocks on a full pipe.
            for _ in lines {}
        });
        let line = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(Some(Ok(line))) => line,
            _ => return Err(PerfError::run("the server process did not start listening")),
        };
        guard.addr = line
            .strip_prefix("listening on ")
            .and_then(|a| a.trim().parse().ok())
            .ok_or_else(|| PerfError::run(format!("unexpected server output {line:?}")))?;
        Ok(guard)
    }

    /// Waits for the server to exit (briefly), then kills it if it has not.
    fn finish(mut self, expect_clean: bool) -> Result<(), PerfError> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let deadline = Instant::now() + Duration::from_secs(if expect_clean { 10 } else { 1 });
        loop {
            match child.try_wait() {
                Ok(Some(status)) if status.success() || !expect_clean => return Ok(()),
                Ok(Some(status)) => {
                    return Err(PerfError::run(format!("server process failed: {status}")));
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return if expect_clean {
                        Err(PerfError::run("server process did not exit; killed"))
                    } else {
                        Ok(())
                    };
                }
            }
        }
    }
}

impl Drop for ServerChild {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn tune(stream: &TcpStream) -> Result<(), PerfError> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(ctl::LINE_TIMEOUT))?;
    stream.set_write_timeout(Some(ctl::LINE_TIMEOUT))?;
    Ok(())
}

/// `--server`: accept one client, run its configuration, exit.
fn serve_tcp(args: &PerfArgs) -> Result<(), PerfError> {
    let ip = args.bind.unwrap_or(IpAddr::from([127, 0, 0, 1]));
    let listener = oob::listen(SocketAddr::new(ip, args.port))?;
    let local = listener.local_addr()?;
    say!("listening on {local}");
    let _ = std::io::stdout().flush();
    let stream = oob::accept(&listener, Duration::from_secs(120))?;
    tune(&stream)?;
    let udp_ip = args
        .bind
        .unwrap_or_else(|| stream.local_addr().map_or(ip, |a| a.ip()));
    let mut ctl = TcpCtl(stream.try_clone()?);
    let result = serve_session(&mut ctl, udp_ip);
    if let Err(e) = &result {
        let _ = ctl.send(&format!("error {e}"));
    }
    result
}

fn serve_session(ctl: &mut TcpCtl, udp_ip: IpAddr) -> Result<(), PerfError> {
    let cfg: Config = serde_json::from_str(&ctl.expect("config")?)
        .map_err(|e| PerfError::run(format!("bad configuration from the client: {e}")))?;
    // Numbers from the network: refused like bad flags (exit 2), before anything is sized.
    cfg.check()
        .map_err(|e| PerfError::usage(format!("bad configuration from the client: {e}")))?;
    let ctx = udp_context(udp_ip, &cfg)?;
    let udp = cfg
        .baseline
        .then(|| baseline::Endpoint::bind(udp_ip, &cfg))
        .transpose()?;
    verbs::server(ctl, &ctx, &cfg, udp)
}

fn udp_context(ip: IpAddr, cfg: &Config) -> Result<emu_udp::UdpContext, PerfError> {
    let provider = UdpProvider::builder()
        .device(SocketAddr::new(ip, 0))
        .busy_poll(cfg.busy_poll)
        .gso(!cfg.no_gso)
        .seed(cfg.seed)
        .build()?;
    let dev = provider
        .devices()?
        .into_iter()
        .next()
        .ok_or_else(|| PerfError::run("the UDP provider has no device"))?;
    Ok(dev.open()?)
}

fn run_client_tcp(
    args: &PerfArgs,
    cfg: &Config,
    server: SocketAddr,
    out: &mut Output,
) -> Result<(), PerfError> {
    let stream = oob::connect(server, Duration::from_secs(20))?;
    tune(&stream)?;
    let udp_ip = args.bind.unwrap_or(stream.local_addr()?.ip());
    let mut ctl = TcpCtl(stream);
    let json = serde_json::to_string(cfg).map_err(|e| PerfError::run(e.to_string()))?;
    ctl.send(&format!("config {json}"))?;
    let ctx = udp_context(udp_ip, cfg)?;
    let udp = cfg
        .baseline
        .then(|| baseline::Endpoint::bind(udp_ip, cfg))
        .transpose()?;
    out.device = format!("udp0 ({})", ctx.local_addr());
    verbs::client(&mut ctl, &ctx, cfg, udp, out)
}

/// `--backend inproc`: the server side runs on a second thread of this process.
fn run_inproc(cfg: &Config, out: &mut Output) -> Result<(), PerfError> {
    let sim = SimProvider::builder().devices(2).seed(cfg.seed).build()?;
    let a = sim.context(0)?;
    let b = sim.context(1)?;
    out.device = "inproc (emu-sim, virtual time)".to_string();
    let (mut ctl_a, mut ctl_b) = ctl::chan_pair();
    let cfg_b = cfg.clone();
    let server = std::thread::Builder::new()
        .name("perf-server".into())
        .spawn(move || {
            let r = verbs::server(&mut ctl_b, &b, &cfg_b, None);
            if let Err(e) = &r {
                let _ = ctl_b.send(&format!("error {e}"));
            }
            r
        })
        .map_err(|e| PerfError::run(format!("cannot start the server thread: {e}")))?;
    let result = verbs::client(&mut ctl_a, &a, cfg, None, out);
    drop(ctl_a);
    let server_result = server
        .join()
        .map_err(|_| PerfError::run("the server thread panicked"))?;
    result?;
    server_result
}

/// What the client prints and records.
pub(crate) struct Output {
    pub(crate) unit: BwUnit,
    pub(crate) device: String,
    pub(crate) rows: Vec<serde_json::Value>,
    pub(crate) sweep: Vec<sweep::Point>,
    backend: Backend,
    header_done: bool,
}

impl Output {
    fn new(args: &PerfArgs, _cfg: &Config) -> Output {
        Output {
            unit: if args.report_gbits {
                BwUnit::Gbit
            } else {
                BwUnit::MiB
            },
            device: String::new(),
            rows: Vec::new(),
            sweep: Vec::new(),
            backend: args.backend,
            header_done: false,
        }
    }

    /// Prints perftest's header block.
    pub(crate) fn header(&mut self, cfg: &Config, info: &verbs::SetupInfo) {
        let line = stats::RESULT_LINE;
        let title = cfg.test.title();
        say!("{line}");
        say!("{title:^87}");
        let kv = |k: &str, v: &dyn std::fmt::Display| say!(" {k:<20}: {v}");
        kv("Dual-port", &"OFF");
        kv("Device", &self.device);
        kv("Number of qps", &cfg.qps);
        kv(
            "Transport type",
            &match self.backend {
                Backend::Udp => "softverbs UDP (RoCEv2 over UDP sockets)",
                Backend::Inproc => "softverbs in-process",
            },
        );
        kv("Connection type", &"RC");
        kv(
            "Loss recovery",
            &match cfg.recovery {
                RecoveryArg::Ibta => "IBTA go-back-N",
                RecoveryArg::Sr => "selective repeat (softverbs extension)",
            },
        );
        kv("Using SRQ", &"OFF");
        if cfg.test.is_bw() {
            kv("TX depth", &cfg.tx_depth);
            kv("Post List", &cfg.post_list);
        }
        if cfg.test.verb() == Verb::Send {
            kv("RX depth", &cfg.rx_depth);
        }
        kv("CQ Moderation", &cfg.cq_mod);
        kv("Mtu", &format!("{}[B]", cfg.mtu));
        kv("Link type", &"Ethernet");
        kv("Max inline data", &"0[B]");
        if matches!(cfg.test.verb(), Verb::Read | Verb::Atomic) {
            kv("Outstand reads", &16);
        }
        kv(
            "Poll mode",
            &format!(
                "device {}, CQ {}",
                if cfg.busy_poll {
                    "busy-poll"
                } else {
                    "blocking"
                },
                if cfg.events { "events" } else { "polled" }
            ),
        );
        if self.backend == Backend::Udp {
            kv(
                "UDP GSO",
                &if cfg.no_gso {
                    "OFF"
                } else {
                    "ON (if the kernel has it)"
                },
            );
        }
        if cfg.baseline {
            kv("Baseline", &"raw UDP, same processes and addresses");
        }
        kv("rdma_cm QPs", &"OFF");
        kv("Data ex. method", &"Ethernet");
        say!("{line}");
        for (who, eps) in [("local", &info.local), ("remote", &info.remote)] {
            for (ep, mr) in eps {
                say!(
                    " {who} address: LID 0000 QPN {:#06x} PSN {:#08x} RKey {:#010x} VAddr {:#018x}",
                    ep.qpn,
                    ep.psn,
                    mr.rkey,
                    mr.addr
                );
                say!(" GID: {} UDP port: {}", ep.gid, ep.udp_port);
            }
        }
    }

    /// Prints the column header once.
    pub(crate) fn columns(&mut self, cfg: &Config) {
        if self.header_done {
            return;
        }
        self.header_done = true;
        say!("{}", stats::RESULT_LINE);
        if cfg.test.is_bw() {
            say!("{}", stats::bw_header(self.unit, cfg.baseline));
        } else if cfg.duration.is_some() {
            say!("{}", stats::lat_duration_header());
        } else {
            say!("{}", stats::lat_header(cfg.baseline));
        }
    }

    pub(crate) fn line(&mut self, s: &str) {
        say!("{s}");
        let _ = std::io::stdout().flush();
    }

    fn finish(&mut self, args: &PerfArgs) -> Result<(), PerfError> {
        say!("{}", stats::RESULT_LINE);
        if args.sweep_loss {
            sweep::print_and_plot(self, args)?;
        }
        if let Some(path) = &args.json {
            let doc = serde_json::json!({
                "test": args.test.unwrap_or(TestName::WriteBw),
                "backend": args.backend,
                "unit": match self.unit { BwUnit::MiB => "MiB/s", BwUnit::Gbit => "Gb/s" },
                "busy_poll": args.busy_poll,
                "gso": !args.no_gso,
                "rows": self.rows,
                "sweep": args.sweep_loss.then(|| sweep::summary(&self.sweep)),
            });
            let text =
                serde_json::to_string_pretty(&doc).map_err(|e| PerfError::run(e.to_string()))?;
            std::fs::write(path, text + "\n")
                .map_err(|e| PerfError::run(format!("writing {}: {e}", path.display())))?;
        }
        Ok(())
    }
}
