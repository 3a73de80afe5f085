//! What `softverbs pingpong` ([`super::pingpong`]) and `softverbs ud-pingpong`
//! ([`super::ud_pingpong`]) share: the flags both take ([`SharedArgs`]), the device's life
//! around a run with its UDP report, the 52-byte TCP address exchange of `ibv_*_pingpong`, the
//! completion queue and QP capacities, receive posting, and the ping-pong loop with its closing
//! throughput lines.
//!
//! What it is not: the QP transitions, buffers and receive checks, which differ between RC and
//! UD and stay in each tool.

use std::time::Instant;

use verbs_api::dynamic::{AnyChannel, AnyContext, AnyCq, AnyQp};
use verbs_api::{Context, QpCap, QueuePair, RecvWr, Sge, WcStatus, WorkCompletion};

use super::wire::{self, DONE, PpDest};
use super::{Context2, DeviceArgs, InteropError, Result, TimeArgs, Waiter, udp_report};

/// The flags both tools take after their own (`-r`, `-n`, `-l`, `-e`), with the device
/// selection of [`DeviceArgs`] and the time bounds.
#[derive(clap::Args, Clone, Debug)]
pub struct SharedArgs {
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

/// wr_id of every receive WR.
pub(super) const RECV_WRID: u64 = 1;
/// wr_id of every send WR.
pub(super) const SEND_WRID: u64 = 2;

/// The exit code of `tool` for `result`: 0 on success; 1 with the error on stderr otherwise.
pub(super) fn exit_code(tool: &str, result: Result<()>) -> u8 {
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("softverbs {tool}: {e}");
            1
        }
    }
}

/// Opens the device `device` selects, runs `body` on it and finishes the device. A UDP
/// device's report goes to stderr (the real tools print nothing like it, so stdout keeps their
/// format), and packets it dropped for a bad ICRC fail an otherwise good run.
pub(super) fn on_device(
    device: &DeviceArgs,
    body: impl FnOnce(&AnyContext) -> Result<()>,
) -> Result<()> {
    let ctx = device.open()?;
    let result = body(&ctx);
    let finished = device.finish(&ctx);
    let result = result.and(finished);
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

/// The completion channel (with `events`) and the CQ of `rx_depth + 1` entries both tools use.
pub(super) fn cq_and_channel(
    ctx: &AnyContext,
    rx_depth: u32,
    events: bool,
) -> Result<(AnyCq, Option<AnyChannel>)> {
    let channel = if events {
        Some(ctx.create_comp_channel()?)
    } else {
        None
    };
    let cq = ctx.create_cq(rx_depth + 1, channel.as_ref())?;
    Ok((cq, channel))
}

/// The QP capacities of both tools: one send WR, `rx_depth` receive WRs, one SGE each.
pub(super) fn qp_cap(rx_depth: u32) -> QpCap {
    QpCap {
        max_send_wr: 1,
        max_recv_wr: rx_depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

/// Prints our address `me`, swaps addresses with the peer over TCP and prints the peer's.
///
/// With `host` we are the client: we send first, read the peer's address, send "done", then
/// call `connect`. Without it we are the server: we read the client's address, `connect`,
/// answer with ours and wait for "done".
pub(super) fn exchange(
    host: Option<&str>,
    port: u16,
    time: &TimeArgs,
    me: &PpDest,
    connect: impl FnOnce(&PpDest) -> Result<()>,
) -> Result<PpDest> {
    println!("  local address:  {}", me.describe());
    let peer = match host {
        Some(host) => {
            let mut stream = super::tcp_client(host, port, time)?;
            wire::write_msg(&mut stream, &me.encode(), "our address message")?;
            let peer = wire::read_dest(&mut stream)?;
            wire::write_msg(&mut stream, DONE, "\"done\"")?;
            connect(&peer)?;
            peer
        }
        None => {
            let mut stream = super::tcp_server(port, time)?;
            let peer = wire::read_dest(&mut stream)?;
            connect(&peer)?;
            wire::write_msg(&mut stream, &me.encode(), "our address message")?;
            wire::read_done(&mut stream)?;
            peer
        }
    };
    println!("  remote address: {}", peer.describe());
    Ok(peer)
}

/// Posts `n` receives with wr_id [`RECV_WRID`] on `qp`, each into `sge`; returns `n`.
pub(super) fn post_recvs(qp: &AnyQp, sge: &[Sge], n: u32) -> Result<u32> {
    for _ in 0..n {
        qp.post_recv(&[RecvWr::new(RECV_WRID, sge)])
            .during("post_recv")?;
    }
    Ok(n)
}

/// One ping-pong run of `ibv_*_pingpong`: what the loop needs from its tool.
pub(super) struct PingPong<'a> {
    /// Iterations, receive depth and the stall bound of the loop.
    pub(super) args: &'a SharedArgs,
    /// Message size in bytes, for the throughput line.
    pub(super) size: u32,
    /// The client posts the first SEND.
    pub(super) client: bool,
    /// Whether a failed completion's message names its vendor error.
    pub(super) vendor_err: bool,
    /// The QP receives are reposted on, into `recv_sge`.
    pub(super) qp: &'a AnyQp,
    /// The buffer of every receive.
    pub(super) recv_sge: &'a [Sge],
    /// Receive WRs posted before the loop.
    pub(super) routs: u32,
    /// Posts one SEND with wr_id [`SEND_WRID`].
    pub(super) send: &'a dyn Fn() -> Result<()>,
    /// Checks receive completion number `rcnt` (successful, wr_id [`RECV_WRID`]).
    pub(super) check_recv: &'a dyn Fn(&WorkCompletion, u32) -> Result<()>,
}

impl PingPong<'_> {
    /// Runs the loop on `cq` (through `channel` when given; no completion for the I/O time
    /// bound fails): each side sends again once both its last SEND and a receive have
    /// completed, until it has counted `iters` of each; receives are reposted when at most one
    /// is left. Then prints the throughput and latency lines of the real tools.
    pub(super) fn run(&self, cq: AnyCq, channel: Option<AnyChannel>) -> Result<()> {
        let start = Instant::now();
        let mut pending = RECV_WRID;
        if self.client {
            (self.send)()?;
            pending |= SEND_WRID;
        }
        let (mut scnt, mut rcnt) = (0u32, 0u32);
        let mut routs = self.routs;
        let mut waiter = Waiter::new(cq, channel, self.args.time.io())?;
        let iters = self.args.iters;
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
                    return Err(self.failed(&wc, scnt, rcnt));
                }
                match wc.wr_id {
                    SEND_WRID => scnt += 1,
                    RECV_WRID => {
                        (self.check_recv)(&wc, rcnt)?;
                        routs = routs.saturating_sub(1);
                        if routs <= 1 {
                            let n = self.args.rx_depth - routs;
                            routs += post_recvs(self.qp, self.recv_sge, n)?;
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
                    (self.send)()?;
                    pending = RECV_WRID | SEND_WRID;
                }
            }
        }
        self.report(start.elapsed().as_secs_f64().max(1e-9));
        Ok(())
    }

    /// The error for the failed completion `wc` after `scnt` sends and `rcnt` receives.
    fn failed(&self, wc: &WorkCompletion, scnt: u32, rcnt: u32) -> InteropError {
        let vendor = if self.vendor_err {
            format!(" (vendor_err {:#x})", wc.vendor_err)
        } else {
            String::new()
        };
        InteropError::new(format!(
            "failed status {:?} ({}) for wr_id {}{vendor} after {scnt} sends, {rcnt} receives",
            wc.status, wc.status as u32, wc.wr_id
        ))
    }

    /// Prints the real tools' two closing lines for a run of `secs` seconds.
    fn report(&self, secs: f64) {
        let usec = secs * 1e6;
        let iters = self.args.iters;
        let bytes = u64::from(self.size) * u64::from(iters) * 2;
        println!(
            "{bytes} bytes in {secs:.2} seconds = {:.2} Mbit/sec",
            bytes as f64 * 8.0 / usec
        );
        println!(
            "{iters} iters in {secs:.2} seconds = {:.2} usec/iter",
            usec / f64::from(iters)
        );
    }
}
