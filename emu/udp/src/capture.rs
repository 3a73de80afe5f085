//! pcap capture of live traffic: what a device writes to its socket (after the send-side fault
//! stage) and what it reads from it (before the receive-side one), through
//! [`emu_capture::Capture`] with the real IP addresses and UDP ports and wall-clock
//! timestamps.
//!
//! One [`Capture`] (one file) may be shared by several devices (a builder's capture): each
//! writes what it sends, and what it receives from a device that is not a member (a datagram
//! between two members was written once, when it was sent). The first error is kept and
//! [`Capture::finish`] reports it; nothing panics.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One pcap file receiving the traffic of one or more devices.
#[derive(Debug)]
pub(crate) struct Capture {
    file: emu_capture::Capture,
    /// Created for one device at run time (closed when that device stops using it).
    pub(crate) per_device: bool,
}

impl Capture {
    /// Creates (or truncates) the file at `path` and writes the pcap header. `members` are the
    /// devices that will write into it.
    pub(crate) fn create(
        path: &Path,
        members: Vec<SocketAddr>,
        per_device: bool,
    ) -> Result<Capture, String> {
        let file = emu_capture::Capture::create(path, members)?;
        Ok(Capture { file, per_device })
    }

    /// Locks the file for a batch of writes.
    pub(crate) fn writer(&self) -> emu_capture::CaptureWriter<'_> {
        self.file.writer()
    }

    /// Stops capturing: flushes and closes the file. Idempotent; returns the first error met
    /// while creating, writing, flushing or closing, naming the file.
    pub(crate) fn finish(&self) -> Result<(), String> {
        self.file.finish()
    }
}

/// The pcap timestamp of a datagram sent or received now: the wall clock.
pub(crate) fn wall_clock() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
}
