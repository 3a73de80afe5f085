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
//!   ([`JsonLayer`]), the input of `softverbs ladder`. Used by the CLI, the node processes of
//!   `softverbs run` and the libibverbs drop-in.
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
            let file = File::create(path)
                .map_err(|e| format!("cannot create trace file {}: {e}", path.display()))?;
            Ok::<_, String>(
                JsonLayer::new(BufWriter::new(file)).with_filter(EnvFilter::new(TRACE_FILTER)),
            )
        })
        .transpose()?;
    tracing_subscriber::registry()
        .with(log_layer)
        .with(json_layer)
        .try_init()
        .map_err(|e| format!("cannot install the tracing subscriber: {e}"))?;
    Ok(true)
}

/// What the trace file records: everything softverbs emits.
pub const TRACE_FILTER: &str = "trace";

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
