//! A capturing subscriber for tests of any crate: `let trace = emu_trace::testing::capture();`.
//!
//! It is installed for the current thread only (`tracing::subscriber::set_default`), so tests
//! running in parallel do not see each other's events; events of other threads (the UDP
//! backend's progress thread) are not captured. Human-readable lines go through the test
//! harness's captured output (shown for a failing test), filtered by `SOFTVERBS_LOG` /
//! `RUST_LOG` (default `debug`); every event is also kept as a [`Record`] for assertions.

use tracing::subscriber::DefaultGuard;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::{JsonLayer, Record, SharedBuf, TRACE_FILTER, log_filter_from_env};

/// The installed test subscriber; dropping it uninstalls it.
#[derive(Debug)]
pub struct Capture {
    buf: SharedBuf,
    _guard: DefaultGuard,
}

/// Installs the capturing subscriber on this thread until the returned value is dropped.
pub fn capture() -> Capture {
    let buf = SharedBuf::default();
    let filter = log_filter_from_env()
        .and_then(|f| EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| EnvFilter::new("debug"));
    let subscriber = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_test_writer()
                .with_filter(filter),
        )
        .with(JsonLayer::new(buf.clone()).with_filter(EnvFilter::new(TRACE_FILTER)));
    Capture {
        buf,
        _guard: tracing::subscriber::set_default(subscriber),
    }
}

impl Capture {
    /// Every event so far, in order.
    pub fn records(&self) -> Vec<Record> {
        String::from_utf8_lossy(&self.buf.contents())
            .lines()
            .filter_map(|l| Record::parse(l).ok())
            .collect()
    }

    /// The events so far of one `kind`.
    pub fn of_kind(&self, kind: &str) -> Vec<Record> {
        self.records()
            .into_iter()
            .filter(|r| r.kind == kind)
            .collect()
    }

    /// The trace so far as JSON lines (a trace file's contents).
    pub fn jsonl(&self) -> String {
        String::from_utf8_lossy(&self.buf.contents()).into_owned()
    }
}
