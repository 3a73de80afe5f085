//! CPU time of a perf run: each process's CPU seconds (user + system, every thread, as
//! `getrusage(RUSAGE_SELF)` sums them, read from `CLOCK_PROCESS_CPUTIME_ID` for nanosecond
//! resolution), exchanged between client and server so the client can report bytes moved per
//! CPU-second of both processes. Not a profiler: it does not say where the time went.

use serde::Serialize;

use super::PerfError;
use super::ctl::Ctl;

/// CPU seconds this process has used so far (all threads, user + system).
pub(crate) fn process_seconds() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// Sends our CPU seconds of the step `tag` to the peer and returns the peer's.
pub(crate) fn exchange(ctl: &mut dyn Ctl, tag: &str, mine: f64) -> Result<f64, PerfError> {
    let tag = tag.replace(' ', "_");
    ctl.send(&format!("cpu {tag} {mine}"))?;
    let line = ctl.expect("cpu")?;
    match line.split_once(' ') {
        Some((t, v)) if t == tag => v
            .parse()
            .map_err(|_| PerfError::run(format!("bad CPU time from the peer: {line:?}"))),
        _ => Err(PerfError::run(format!(
            "control channel: expected the CPU time of {tag:?}, got {line:?}"
        ))),
    }
}

/// The CPU both processes spent moving `bytes`.
#[derive(Copy, Clone, Debug, Serialize)]
pub(crate) struct Use {
    /// Client process CPU seconds.
    pub(crate) client_s: f64,
    /// Server process CPU seconds.
    pub(crate) server_s: f64,
    /// Payload bytes moved per CPU-second of both processes together.
    pub(crate) bytes_per_cpu_s: f64,
    /// CPU seconds per GiB moved, client then server.
    pub(crate) client_s_per_gib: f64,
    /// See `client_s_per_gib`.
    pub(crate) server_s_per_gib: f64,
}

impl Use {
    /// From this side's and the peer's CPU seconds over a transfer of `bytes`.
    pub(crate) fn new(bytes: f64, is_client: bool, local: f64, peer: f64) -> Use {
        let (client_s, server_s) = if is_client {
            (local, peer)
        } else {
            (peer, local)
        };
        Use::of(bytes, client_s, server_s)
    }

    /// From the client's and the server's CPU seconds over a transfer of `bytes`.
    pub(crate) fn of(bytes: f64, client_s: f64, server_s: f64) -> Use {
        let total = client_s + server_s;
        let gib = bytes / f64::from(1u32 << 30);
        let per_gib = |s: f64| if gib > 0.0 { s / gib } else { 0.0 };
        Use {
            client_s,
            server_s,
            bytes_per_cpu_s: if total > 0.0 { bytes / total } else { 0.0 },
            client_s_per_gib: per_gib(client_s),
            server_s_per_gib: per_gib(server_s),
        }
    }
}
