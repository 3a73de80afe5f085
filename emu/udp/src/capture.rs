//! pcap capture of live traffic: what a device writes to its socket (after the send-side fault
//! stage) and what it reads from it (before the receive-side one), framed by
//! [`emu_capture::PcapSink`] with the real IP addresses and UDP ports and wall-clock
//! timestamps.
//!
//! One [`Capture`] (one file) may be shared by several devices (a builder's capture): each
//! writes what it sends, and what it receives from a device that is not a member (a datagram
//! between two members was written once, when it was sent). The first error (creating,
//! writing, flushing) is kept, writing stops, and [`Capture::finish`] reports it; nothing
//! panics.

use std::fs::File;
use std::io::BufWriter;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use emu_capture::{CaptureError, PcapSink};
use emu_proto::wire::IpContext;

/// One pcap file receiving the traffic of one or more devices.
#[derive(Debug)]
pub(crate) struct Capture {
    path: PathBuf,
    /// The devices writing into this file.
    members: Vec<SocketAddr>,
    /// Created for one device at run time (closed when that device stops using it).
    pub(crate) per_device: bool,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// `None` once finished or after an error.
    sink: Option<PcapSink<BufWriter<File>>>,
    /// The first error met, with the file named.
    error: Option<String>,
}

impl Capture {
    /// Creates (or truncates) the file at `path` and writes the pcap header. `members` are the
    /// devices that will write into it.
    pub(crate) fn create(
        path: &Path,
        members: Vec<SocketAddr>,
        per_device: bool,
    ) -> Result<Capture, String> {
        let sink =
            PcapSink::create(path).map_err(|e| format!("capture {}: {e}", path.display()))?;
        Ok(Capture {
            path: path.to_path_buf(),
            members,
            per_device,
            inner: Mutex::new(Inner {
                sink: Some(sink),
                error: None,
            }),
        })
    }

    /// Whether `addr` is a device writing into this file.
    pub(crate) fn is_member(&self, addr: SocketAddr) -> bool {
        self.members.contains(&addr)
    }

    /// Locks the file for a batch of writes.
    pub(crate) fn writer(&self) -> CaptureWriter<'_> {
        CaptureWriter {
            capture: self,
            inner: self.inner.lock().unwrap_or_else(|p| p.into_inner()),
        }
    }

    /// Stops capturing: flushes and closes the file. Idempotent; returns the first error met
    /// while creating, writing, flushing or closing, naming the file.
    pub(crate) fn finish(&self) -> Result<(), String> {
        let mut w = self.writer();
        if let Some(sink) = w.inner.sink.take() {
            if let Err(e) = sink.finish() {
                w.fail(e);
            }
        }
        match &w.inner.error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

/// A capture locked for writing a batch of datagrams.
pub(crate) struct CaptureWriter<'a> {
    capture: &'a Capture,
    inner: MutexGuard<'a, Inner>,
}

impl CaptureWriter<'_> {
    /// Appends the datagram `bytes` from `src` to `dst`, stamped with the wall clock; true if
    /// it was written. A datagram that cannot be framed (mixed IP versions) is skipped; an
    /// I/O error stops the capture and is kept.
    pub(crate) fn write(&mut self, src: SocketAddr, dst: SocketAddr, bytes: &[u8]) -> bool {
        let Some(sink) = self.inner.sink.as_mut() else {
            return false;
        };
        let Some(ip) = IpContext::between(src, dst) else {
            return false;
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        match sink.write_packet(now, &ip, bytes) {
            Ok(()) => true,
            // Only this datagram cannot be framed; the file is fine.
            Err(CaptureError::Wire(_)) => false,
            Err(e) => {
                self.fail(e);
                false
            }
        }
    }

    /// Keeps the first error and stops writing.
    fn fail(&mut self, e: CaptureError) {
        self.inner.sink = None;
        let path = self.capture.path.display();
        self.inner
            .error
            .get_or_insert_with(|| format!("capture {path}: {e}"));
    }
}
