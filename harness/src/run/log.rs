//! The completion log each node appends to (`node{i}.g{gen}.log`): one JSON object per line,
//! one line per work completion the node polled, written before the node acts on it.
//!
//! Lines are buffered and written with one `write(2)` per poll batch, so a node killed by
//! SIGKILL loses at most the batch it was polling (the kernel keeps what was written). Each
//! batch is also `fdatasync`ed within [`SYNC_EVERY`] by a background thread (so a slow disk
//! never stalls the node's completion loop), and synchronously at the end; that only
//! matters if the machine itself fails. A killed node's last line may be cut anywhere:
//! [`read_log`] skips an unterminated last line and reports a malformed line elsewhere
//! instead of failing.

use crossbeam_channel::RecvTimeoutError;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What an operation was.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    /// RDMA WRITE of a record into the peer's write area.
    Write,
    /// SEND with immediate (ping, pong or `mixed` send) into the peer's receive slot `seq`.
    Send,
    /// RDMA READ of the peer's pattern.
    Read,
    /// FETCH_ADD 1 on the peer's counter word.
    Faa,
    /// The final 8-byte WRITE of 1 into the peer's fin word.
    Fin,
}

/// One log line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum Entry {
    /// First line: who wrote the log.
    Start {
        /// Node index.
        node: u32,
        /// Generation.
        generation: u32,
        /// Wall-clock time, ms since the Unix epoch.
        at: u64,
        /// The node's peer list.
        peers: Vec<u32>,
    },
    /// The workload started (after the start barrier).
    Run {
        /// Wall-clock time, ms since the Unix epoch.
        at: u64,
    },
    /// A send-queue completion.
    Send {
        /// Peer index.
        peer: u32,
        /// Which of the QPs to this peer (`--qps-per-peer`; 0, and left out, for the first).
        #[serde(default, skip_serializing_if = "is_zero")]
        qp: u32,
        /// wr_id from the completion (the node numbers the WRs of each QP 1, 2, 3, …).
        wr: u64,
        /// The operation the node posted with that wr_id.
        op: OpKind,
        /// Completion status (rdma-core number).
        status: u32,
        /// When it was posted (ms since the Unix epoch).
        posted: u64,
        /// When it was polled (ms since the Unix epoch).
        at: u64,
        /// Per-op sequence number on this link: record number (write), receive slot (send),
        /// READ number (read), landing slot (faa).
        seq: u64,
        /// Bytes.
        len: u32,
        /// Offset in the peer's area: write area (write), pattern (read).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        roff: Option<u64>,
        /// Offset in this node's READ landing area (read).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        loff: Option<u64>,
        /// Immediate data (send).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        imm: Option<u32>,
        /// Record kind of a send: ping, pong or send.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kind: Option<crate::run::layout::RecordKind>,
        /// Fetched value (faa, on success).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        val: Option<u64>,
    },
    /// A receive-queue completion.
    Recv {
        /// Peer index.
        peer: u32,
        /// Which of the QPs to this peer (`--qps-per-peer`; 0, and left out, for the first).
        #[serde(default, skip_serializing_if = "is_zero")]
        qp: u32,
        /// wr_id (receive slot + 1).
        wr: u64,
        /// Completion status.
        status: u32,
        /// When it was polled.
        at: u64,
        /// Bytes received.
        len: u32,
        /// Immediate data, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        imm: Option<u32>,
    },
    /// Last line of a node that drained: what it posted on each QP.
    End {
        /// Wall-clock time.
        at: u64,
        /// Per peer: send WRs and receive WRs posted.
        posted: Vec<Posted>,
    },
}

/// Work requests posted on one QP.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Posted {
    /// Peer index.
    pub peer: u32,
    /// Which of the QPs to this peer (`--qps-per-peer`; 0, and left out, for the first).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub qp: u32,
    /// Send WRs posted (wr_ids 1..=send).
    pub send: u64,
    /// Receive WRs posted (wr_ids 1..=recv).
    pub recv: u64,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// Minimum time between two `fdatasync`s of a log.
pub const SYNC_EVERY: Duration = Duration::from_millis(100);

/// Appends entries to a log file.
#[derive(Debug)]
pub struct LogWriter {
    file: File,
    buf: Vec<u8>,
    /// Written since the last sync.
    dirty: Arc<AtomicBool>,
    /// Stops the sync thread when dropped.
    stop: Option<crossbeam_channel::Sender<()>>,
    syncer: Option<JoinHandle<()>>,
}

impl LogWriter {
    /// Creates the log at `path` (a new file, mode 0600; an existing one is an error) and
    /// starts its sync thread.
    pub fn create(path: &Path) -> io::Result<LogWriter> {
        // Application data: readable by its owner only; a new file, never one (or a symbolic
        // link) found in its place.
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        let dirty = Arc::new(AtomicBool::new(false));
        let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
        let syncer = {
            let file = file.try_clone()?;
            let dirty = dirty.clone();
            std::thread::Builder::new()
                .name("log-sync".into())
                .spawn(move || {
                    loop {
                        match stopped.recv_timeout(SYNC_EVERY) {
                            Err(RecvTimeoutError::Timeout) => {}
                            _ => return,
                        }
                        if dirty.swap(false, Ordering::AcqRel) {
                            let _ = file.sync_data();
                        }
                    }
                })?
        };
        Ok(LogWriter {
            file,
            buf: Vec::with_capacity(64 * 1024),
            dirty,
            stop: Some(stop),
            syncer: Some(syncer),
        })
    }

    /// Buffers one entry.
    pub fn push(&mut self, entry: &Entry) {
        // Serialising these plain structs cannot fail.
        if serde_json::to_writer(&mut self.buf, entry).is_ok() {
            self.buf.push(b'\n');
        }
    }

    /// Writes the buffered entries (one `write`); the sync thread syncs them within
    /// [`SYNC_EVERY`], or this call does at once if `sync`.
    pub fn flush(&mut self, sync: bool) -> io::Result<()> {
        if !self.buf.is_empty() {
            self.file.write_all(&self.buf)?;
            self.buf.clear();
            self.dirty.store(true, Ordering::Release);
        }
        if sync && self.dirty.swap(false, Ordering::AcqRel) {
            self.file.sync_data()?;
        }
        Ok(())
    }
}

impl Drop for LogWriter {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.syncer.take() {
            let _ = t.join();
        }
    }
}

/// A log as read back.
#[derive(Clone, Debug, Default)]
pub struct LogRead {
    /// The entries that parsed, in file order.
    pub entries: Vec<Entry>,
    /// The file ended without a newline (a node killed mid-write): the cut line was skipped.
    pub truncated_tail: bool,
    /// 1-based numbers of complete lines that did not parse.
    pub bad_lines: Vec<usize>,
    /// The file is larger than [`MAX_LOG`]: only the lines before that offset were read, so
    /// the log cannot be verified whole.
    pub oversize: bool,
}

/// Largest log read. A node writes about 170 bytes per completion (1.7 GB for 10 million),
/// so this is far beyond any run the harness can hold in memory; a bigger file is read up to
/// here and reported as [`LogRead::oversize`], never as a whole log.
pub const MAX_LOG: u64 = 64 << 30;

/// Reads a log line by line (the file is never held whole), tolerating a cut last line.
/// `Err` only if the file cannot be read.
pub fn read_log(path: &Path) -> io::Result<LogRead> {
    read_log_up_to(path, MAX_LOG)
}

/// [`read_log`] with the size limit `max` instead of [`MAX_LOG`].
fn read_log_up_to(path: &Path, max: u64) -> io::Result<LogRead> {
    let file = File::open(path)?;
    let oversize = file.metadata()?.len() > max;
    let mut out = parse_lines(io::BufReader::with_capacity(1 << 20, file.take(max)))?;
    out.oversize = oversize;
    Ok(out)
}

/// Parses log bytes (see [`read_log`]).
pub fn parse_log(bytes: &[u8]) -> LogRead {
    // Reading from a slice cannot fail.
    parse_lines(bytes).unwrap_or_default()
}

/// Parses the lines of `input`: a line that does not parse is recorded by number, text after
/// the last newline is a cut line.
fn parse_lines(mut input: impl io::BufRead) -> io::Result<LogRead> {
    let mut out = LogRead::default();
    let mut line = Vec::new();
    let mut number = 0;
    loop {
        line.clear();
        if input.read_until(b'\n', &mut line)? == 0 {
            return Ok(out);
        }
        number += 1;
        let Some(text) = line.strip_suffix(b"\n") else {
            // Text after the final newline: a cut line.
            out.truncated_tail = true;
            return Ok(out);
        };
        if text.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<Entry>(text) {
            Ok(e) => out.entries.push(e),
            Err(_) => out.bad_lines.push(number),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn send(wr: u64) -> Entry {
        Entry::Send {
            peer: 1,
            qp: 0,
            wr,
            op: OpKind::Write,
            status: 0,
            posted: 1,
            at: 2,
            seq: wr,
            len: 64,
            roff: Some(0),
            loff: None,
            imm: None,
            kind: None,
            val: None,
        }
    }

    #[test]
    fn cut_and_corrupt_lines_are_reported_not_fatal() {
        let mut text = Vec::new();
        for wr in 1..=3 {
            serde_json::to_writer(&mut text, &send(wr)).unwrap();
            text.push(b'\n');
        }
        let whole = parse_log(&text);
        assert_eq!(whole.entries.len(), 3);
        assert!(!whole.truncated_tail && whole.bad_lines.is_empty());
        // Cut anywhere in the last line: two entries and a truncated tail.
        let second_end = text
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == b'\n')
            .nth(1)
            .unwrap()
            .0;
        for cut in second_end + 2..text.len() - 1 {
            let r = parse_log(&text[..cut]);
            assert_eq!(r.entries.len(), 2, "cut at {cut}");
            assert!(r.truncated_tail);
        }
        let mut bad = text.clone();
        bad[5] = b'#';
        let r = parse_log(&bad);
        assert_eq!(r.bad_lines, vec![1]);
        assert_eq!(r.entries.len(), 2);
        let r = parse_log(&[0xff, 0xfe, b'\n', 0x00]);
        assert_eq!(r.bad_lines, vec![1]);
        assert!(r.truncated_tail);
    }

    #[test]
    fn a_log_past_the_limit_is_read_up_to_it_and_reported_oversize() {
        let dir = std::env::temp_dir().join(format!("softverbs-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("node0.g0.log");
        let mut text = Vec::new();
        for wr in 1..=3 {
            serde_json::to_writer(&mut text, &send(wr)).unwrap();
            text.push(b'\n');
        }
        std::fs::write(&path, &text).unwrap();
        let whole = read_log(&path).unwrap();
        assert_eq!(whole.entries.len(), 3);
        assert!(!whole.oversize && !whole.truncated_tail);
        let exact = read_log_up_to(&path, text.len() as u64).unwrap();
        assert_eq!(exact.entries.len(), 3);
        assert!(!exact.oversize);
        // One byte short of the end: the last line is cut by the limit, and the log says so.
        let short = read_log_up_to(&path, text.len() as u64 - 1).unwrap();
        assert_eq!(short.entries.len(), 2);
        assert!(short.oversize && short.truncated_tail);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
