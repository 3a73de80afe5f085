//! Completion channels: a queue of CQ events plus a socket pair whose read end becomes
//! readable while events are pending, so the channel works with epoll, mio and tokio.
//!
//! Not the verbs handle (that is [`crate::Channel`]): the OS side the device signals and the
//! application waits on.

use std::collections::VecDeque;
use std::io::{ErrorKind as IoKind, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use verbs_api::{Error, ErrorKind, Result};

/// The OS side of one completion channel: the device signals it, the application takes or
/// waits for its events.
#[derive(Debug)]
pub struct ChannelShared {
    queue: Mutex<VecDeque<u32>>,
    cond: Condvar,
    tx: UnixStream,
    rx: UnixStream,
}

impl ChannelShared {
    /// A channel with no pending event; `Io` if the socket pair cannot be made.
    pub fn new() -> Result<ChannelShared> {
        let io = |e: std::io::Error| Error::new(ErrorKind::Io, format!("completion channel: {e}"));
        let (tx, rx) = UnixStream::pair().map_err(io)?;
        tx.set_nonblocking(true).map_err(io)?;
        rx.set_nonblocking(true).map_err(io)?;
        Ok(ChannelShared {
            queue: Mutex::new(VecDeque::new()),
            cond: Condvar::new(),
            tx,
            rx,
        })
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<u32>> {
        self.queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues an event for CQ `cq` and makes the fd readable.
    pub fn signal(&self, cq: u32) {
        let mut queue = self.lock();
        // The byte goes first, so that whoever sees the queue entry also finds the fd
        // readable. A full socket buffer leaves the fd readable anyway.
        let _ = (&self.tx).write(&[1]);
        queue.push_back(cq);
        self.cond.notify_all();
    }

    fn pop(&self, queue: &mut VecDeque<u32>) -> Option<u32> {
        let cq = queue.pop_front()?;
        let mut byte = [0u8; 1];
        match (&self.rx).read(&mut byte) {
            Ok(_) => {}
            Err(e) if e.kind() == IoKind::WouldBlock => {}
            Err(_) => {}
        }
        Some(cq)
    }

    /// How many events for CQ `cq` are queued and not yet taken by the application.
    pub fn queued_for(&self, cq: u32) -> u32 {
        let n = self.lock().iter().filter(|&&c| c == cq).count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// Drops the queued events of CQ `cq` (and their readiness bytes): a destroyed CQ's events
    /// that the application never read are never reported, as with libibverbs, where the kernel
    /// discards them and `ibv_destroy_cq` waits only for the events it handed out.
    pub fn discard(&self, cq: u32) {
        let mut queue = self.lock();
        let before = queue.len();
        queue.retain(|&c| c != cq);
        let mut byte = [0u8; 1];
        for _ in queue.len()..before {
            let _ = (&self.rx).read(&mut byte);
        }
    }

    /// The next event without blocking.
    pub fn try_get(&self) -> Option<u32> {
        let mut queue = self.lock();
        self.pop(&mut queue)
    }

    /// The next event, waiting up to `timeout` (forever with `None`).
    pub fn wait(&self, timeout: Option<Duration>) -> Option<u32> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut queue = self.lock();
        loop {
            if let Some(cq) = self.pop(&mut queue) {
                return Some(cq);
            }
            match deadline {
                None => {
                    queue = self.cond.wait(queue).unwrap_or_else(|p| p.into_inner());
                }
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    queue = self
                        .cond
                        .wait_timeout(queue, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
        }
    }
}

impl AsFd for ChannelShared {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.rx.as_fd()
    }
}

impl AsRawFd for ChannelShared {
    fn as_raw_fd(&self) -> RawFd {
        self.rx.as_raw_fd()
    }
}
