//! `emu-trace`: how softverbs turns its `tracing` events into logs and trace files.
//!
//! The engine (`emu-proto`), the fault stage (`emu-fault`), the device handles (`emu-device`)
//! and the backends emit `tracing` events with a `kind` field (`pkt.tx`, `pkt.rx`,
//! `fault.verdict`, `timer.armed`, `verbs.post_send`, `wc`, …, listed in [`kind`]) inside
//! `device` spans (fields `dev`: the device name, `addr`: its `ip:udp_port`, `now`: engine
//! time in ns) and `qp` spans (field `qp`). Without a subscriber these events cost one
//! relaxed load each. This crate installs the subscriber:
//!
//! - [`init_from_env`]: `SOFTVERBS_LOG` (EnvFilter syntax, `RUST_LOG` as fallback) logs to
//!   stderr; `SOFTVERBS_TRACE=FILE` also writes every event as one JSON object per line
//!   ([`JsonLayer`]), the input of `softverbs ladder`; `SOFTVERBS_TRACE_FILTER` (EnvFilter,
//!   default `trace`) chooses what goes in it and `SOFTVERBS_TRACE_MAX_MB` rotates it
//!   ([`RotatingFile`]). Used by the CLI, the node processes of `softverbs run` and the
//!   libibverbs drop-in.
//! - [`testing::capture`]: a thread-local subscriber for tests that prints through the test
//!   harness's captured output and keeps the records for assertions.
//! - [`Record`]: one parsed line of a trace file.
//!
//! What it is not: it emits no events of its own and knows nothing of packets; the ladder
//! renderer is in the CLI.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

mod json;
mod record;
pub mod testing;

pub use json::JsonLayer;
pub use record::{Record, RecordError};

/// The values of the `kind` field of softverbs' trace events.
pub mod kind {
    /// A verbs call: `ibv_post_send` (fields `wrs`, `ok`).
    pub const POST_SEND: &str = "verbs.post_send";
    /// A verbs call: `ibv_post_recv` (fields `wrs`, `ok`).
    pub const POST_RECV: &str = "verbs.post_recv";
    /// A verbs call: `ibv_poll_cq` that returned completions (fields `cq`, `n`).
    pub const POLL_CQ: &str = "verbs.poll_cq";
    /// A verbs call: `ibv_modify_qp` (fields `from`, `to`, `ok`).
    pub const MODIFY_QP: &str = "verbs.modify_qp";
    /// A verbs call: QP created or destroyed (field `op`).
    pub const QP_LIFE: &str = "verbs.qp";
    /// A packet built by the engine (fields `opcode`, `psn`, `ackreq`, `syndrome`, `len`,
    /// `dqp`, `dst`).
    pub const PKT_TX: &str = "pkt.tx";
    /// A packet taken by the engine (same fields as [`PKT_TX`], `src`).
    pub const PKT_RX: &str = "pkt.rx";
    /// A received packet the engine dropped before the transport (field `cause`).
    pub const PKT_DROP: &str = "pkt.drop";
    /// The fault model's verdict on a datagram (fields `verdict`, `opcode`, `psn`, `dqp`,
    /// `src_node`, `dst_node`).
    pub const FAULT: &str = "fault.verdict";
    /// A QP's timer set to a new deadline (field `at`).
    pub const TIMER_ARMED: &str = "timer.armed";
    /// A QP's timer removed before it fired.
    pub const TIMER_CANCELLED: &str = "timer.cancelled";
    /// A QP's timer fired.
    pub const TIMER_FIRED: &str = "timer.fired";
    /// The requester goes back to resend (fields `from_psn`, `reason`).
    pub const RETRANSMIT: &str = "retransmit";
    /// A work completion pushed to a CQ (fields `cq`, `wr_id`, `status`, `opcode`).
    pub const WC: &str = "wc";
    /// An asynchronous event raised (fields `event`, `element`).
    pub const ASYNC: &str = "async";
}

/// Why [`init`] could not install a subscriber.
#[derive(Debug)]
pub struct InitError(String);

impl std::fmt::Display for InitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InitError {}

/// The filter `SOFTVERBS_LOG` asks for, `RUST_LOG` as fallback; `None` if neither is set.
pub fn log_filter_from_env() -> Option<String> {
    ["SOFTVERBS_LOG", "RUST_LOG"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.trim().is_empty()))
}

/// The trace file `SOFTVERBS_TRACE` names, if set.
pub fn trace_file_from_env() -> Option<std::path::PathBuf> {
    std::env::var_os("SOFTVERBS_TRACE")
        .filter(|s| !s.is_empty())
        .map(Into::into)
}

static INSTALLED: OnceLock<Result<bool, String>> = OnceLock::new();

/// [`init`] with [`log_filter_from_env`] and [`trace_file_from_env`]. Idempotent: only the
/// first call in a process installs anything; later calls return its result.
pub fn init_from_env() -> Result<bool, InitError> {
    let log = log_filter_from_env();
    let trace = trace_file_from_env();
    init(log.as_deref(), trace.as_deref())
}

/// Installs the process-wide subscriber: a stderr log with EnvFilter `log`, and a
/// [`JsonLayer`] writing every softverbs event to `trace` (created, truncated). Installs
/// nothing and returns `Ok(false)` when both are `None`, so disabled tracing stays free.
/// Only the first call in a process acts; a later call returns the first one's result.
/// Errors: a bad filter, an unwritable trace file, or another global subscriber already set.
pub fn init(log: Option<&str>, trace: Option<&Path>) -> Result<bool, InitError> {
    INSTALLED
        .get_or_init(|| install(log, trace))
        .clone()
        .map_err(InitError)
}

fn install(log: Option<&str>, trace: Option<&Path>) -> Result<bool, String> {
    if log.is_none() && trace.is_none() {
        return Ok(false);
    }
    let log_layer = log
        .map(|f| {
            let filter = EnvFilter::try_new(f).map_err(|e| format!("bad log filter {f:?}: {e}"))?;
            Ok::<_, String>(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_filter(filter),
            )
        })
        .transpose()?;
    let json_layer = trace
        .map(|path| {
            let file = RotatingFile::create(path, trace_max_bytes_from_env())
                .map_err(|e| format!("cannot create trace file {}: {e}", path.display()))?;
            let filter = trace_filter_from_env();
            let filter = EnvFilter::try_new(&filter)
                .map_err(|e| format!("bad SOFTVERBS_TRACE_FILTER {filter:?}: {e}"))?;
            Ok::<_, String>(JsonLayer::new(file).with_filter(filter))
        })
        .transpose()?;
    tracing_subscriber::registry()
        .with(log_layer)
        .with(json_layer)
        .try_init()
        .map_err(|e| format!("cannot install the tracing subscriber: {e}"))?;
    Ok(true)
}

/// What the trace file records unless `SOFTVERBS_TRACE_FILTER` says otherwise: everything
/// softverbs emits.
pub const TRACE_FILTER: &str = "trace";

/// The trace file's EnvFilter: `SOFTVERBS_TRACE_FILTER`, default [`TRACE_FILTER`]. `debug`
/// keeps every packet, verdict and decision but leaves out timer arming and plain deliveries.
pub fn trace_filter_from_env() -> String {
    std::env::var("SOFTVERBS_TRACE_FILTER")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| TRACE_FILTER.to_owned())
}

/// `SOFTVERBS_TRACE_MAX_MB` in bytes: the size at which the trace file is rotated; `None`
/// (unset or not a number): never.
pub fn trace_max_bytes_from_env() -> Option<u64> {
    std::env::var("SOFTVERBS_TRACE_MAX_MB")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|mb| mb.saturating_mul(1 << 20))
}

/// The file a rotated trace's older half is in: `FILE.1`.
pub fn rotated_path(path: &Path) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".1");
    name.into()
}

/// A trace file that, once `max` bytes are written, is renamed to [`rotated_path`] (replacing
/// the older one) and started afresh, so that at most about `2 × max` bytes of the latest
/// events are kept. Rotation happens at a flush, which [`JsonLayer`] does after each line.
#[derive(Debug)]
pub struct RotatingFile {
    path: std::path::PathBuf,
    file: BufWriter<File>,
    written: u64,
    max: Option<u64>,
}

impl RotatingFile {
    /// Creates (truncates) `path`, readable by its owner only (a trace tells what a program
    /// did).
    pub fn create(path: &Path, max: Option<u64>) -> std::io::Result<RotatingFile> {
        Ok(RotatingFile {
            path: path.to_owned(),
            file: BufWriter::new(private_file(path)?),
            written: 0,
            max,
        })
    }
}

/// Creates or truncates `path` with mode 0600.
fn private_file(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
}

impl Write for RotatingFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()?;
        if self.max.is_some_and(|max| self.written >= max) {
            std::fs::rename(&self.path, rotated_path(&self.path))?;
            self.file = BufWriter::new(private_file(&self.path)?);
            self.written = 0;
        }
        Ok(())
    }
}

/// A writer shared between a layer and its owner (tests read what the layer wrote).
#[derive(Clone, Debug, Default)]
pub struct SharedBuf(Arc<Mutex<Vec<u8>>>);

impl SharedBuf {
    /// A copy of everything written so far.
    pub fn contents(&self) -> Vec<u8> {
        self.0.lock().map(|b| b.clone()).unwrap_or_default()
    }
}

impl Write for SharedBuf {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self.0.lock() {
            Ok(mut b) => b.extend_from_slice(buf),
            Err(p) => p.into_inner().extend_from_slice(buf),
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rotating_file_keeps_the_latest_lines_in_two_parts() {
        let dir = std::env::temp_dir().join(format!("emu-trace-rotate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_default();
        let path = dir.join("t.jsonl");
        let mut f = RotatingFile::create(&path, Some(10)).unwrap_or_else(|e| panic!("{e}"));
        for line in ["aaaaaa\n", "bbbbbb\n", "cccccc\n"] {
            f.write_all(line.as_bytes()).unwrap_or_default();
            f.flush().unwrap_or_default();
        }
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        // Rotated after the second line (14 bytes ≥ 10); the third starts the new file.
        assert_eq!(read(&rotated_path(&path)), "aaaaaa\nbbbbbb\n");
        assert_eq!(read(&path), "cccccc\n");
        for line in ["d\n", "e\n"] {
            f.write_all(line.as_bytes()).unwrap_or_default();
            f.flush().unwrap_or_default();
        }
        // The older part is replaced: at most about twice the limit is kept.
        assert_eq!(read(&rotated_path(&path)), "cccccc\nd\ne\n");
        assert_eq!(read(&path), "");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
