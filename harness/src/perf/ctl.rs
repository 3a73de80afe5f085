//! The control channel between the two sides of a test: text lines over the out-of-band TCP
//! stream (two processes), or over in-process channels (`--backend inproc`).

use std::net::TcpStream;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::Duration;

use emu_udp::oob;

use super::PerfError;

/// How long one side waits for a line from the other (a size of `-a` may take a while).
pub(crate) const LINE_TIMEOUT: Duration = Duration::from_secs(300);

/// A line-based, ordered, reliable channel to the peer.
pub(crate) trait Ctl: Send {
    /// Sends one line (no newline inside).
    fn send(&mut self, line: &str) -> Result<(), PerfError>;
    /// Receives the next line.
    fn recv(&mut self) -> Result<String, PerfError>;

    /// Waits until the peer reaches its matching `sync` call with the same `tag`.
    fn sync(&mut self, tag: &str) -> Result<(), PerfError> {
        self.send(&format!("sync {tag}"))?;
        let line = self.recv()?;
        if line == format!("sync {tag}") {
            Ok(())
        } else {
            Err(PerfError::run(format!(
                "control channel: peer sent {line:?}, expected \"sync {tag}\""
            )))
        }
    }

    /// Receives a line that must start with `key ` and returns the rest.
    fn expect(&mut self, key: &str) -> Result<String, PerfError> {
        let line = self.recv()?;
        match line.strip_prefix(key).and_then(|r| r.strip_prefix(' ')) {
            Some(rest) => Ok(rest.to_string()),
            None if line.starts_with("error ") => Err(PerfError::run(format!(
                "peer failed: {}",
                &line["error ".len()..]
            ))),
            None => Err(PerfError::run(format!(
                "control channel: expected {key:?}, got {line:?}"
            ))),
        }
    }
}

/// The out-of-band TCP stream of `emu_udp::oob`.
pub(crate) struct TcpCtl(pub(crate) TcpStream);

impl Ctl for TcpCtl {
    fn send(&mut self, line: &str) -> Result<(), PerfError> {
        oob::send_line(&mut self.0, line).map_err(PerfError::from)
    }

    fn recv(&mut self) -> Result<String, PerfError> {
        oob::recv_line(&mut self.0).map_err(PerfError::from)
    }
}

/// One end of an in-process channel pair.
pub(crate) struct ChanCtl {
    tx: Sender<String>,
    rx: Receiver<String>,
}

/// Two connected in-process ends.
pub(crate) fn chan_pair() -> (ChanCtl, ChanCtl) {
    let (tx_a, rx_b) = channel();
    let (tx_b, rx_a) = channel();
    (
        ChanCtl { tx: tx_a, rx: rx_a },
        ChanCtl { tx: tx_b, rx: rx_b },
    )
}

impl Ctl for ChanCtl {
    fn send(&mut self, line: &str) -> Result<(), PerfError> {
        self.tx
            .send(line.to_string())
            .map_err(|_| PerfError::run("control channel: peer thread is gone"))
    }

    fn recv(&mut self) -> Result<String, PerfError> {
        match self.rx.recv_timeout(LINE_TIMEOUT) {
            Ok(line) => Ok(line),
            Err(RecvTimeoutError::Timeout) => Err(PerfError::run(
                "control channel: no word from the peer thread in time",
            )),
            Err(RecvTimeoutError::Disconnected) => {
                Err(PerfError::run("control channel: peer thread is gone"))
            }
        }
    }
}
