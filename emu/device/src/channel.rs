//! Completion channels: a queue of CQ events plus a socket pair whose read end becomes
//! readable while events are pending, so the channel works with epoll, mio and tokio.
//!
//! The socket holds one byte while the queue holds events, none while it is empty: a byte is
//! written when the queue gets its first event and read when its last is taken, so a burst of
//! events costs two system calls, not two per event. A thread blocked in
//! [`ChannelShared::wait`] is woken only if one is there.
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
    queue: Mutex<Queue>,
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
            queue: Mutex::new(Queue::default()),
            cond: Condvar::new(),
            tx,
            rx,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues an event for CQ `cq` and makes the fd readable.
    pub fn signal(&self, cq: u32) {
        let mut queue = self.lock();
        if queue.events.is_empty() {
            // The byte goes first, so that whoever sees the queue entry also finds the fd
            // readable.
            let _ = (&self.tx).write(&[1]);
        }
        queue.events.push_back(cq);
        let waiters = queue.waiters > 0;
        // Notified after the lock is released, so that a woken waiter does not block on it
        // at once (a futex wait and wake more per event). A thread that starts waiting
        // after the unlock finds the event before it sleeps.
        drop(queue);
        if waiters {
            self.cond.notify_all();
        }
    }

    fn pop(&self, queue: &mut Queue) -> Option<u32> {
        let cq = queue.events.pop_front()?;
        if queue.events.is_empty() {
            self.unready();
        }
        Some(cq)
    }

    /// Reads the readiness byte: the queue became empty.
    fn unready(&self) {
        let mut byte = [0u8; 1];
        match (&self.rx).read(&mut byte) {
            Ok(_) => {}
            Err(e) if e.kind() == IoKind::WouldBlock => {}
            Err(_) => {}
        }
    }

    /// How many events for CQ `cq` are queued and not yet taken by the application.
    pub fn queued_for(&self, cq: u32) -> u32 {
        let n = self.lock().events.iter().filter(|&&c| c == cq).count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// Drops the queued events of CQ `cq` (and their readiness bytes): a destroyed CQ's events
    /// that the application never read are never reported, as with libibverbs, where the kernel
    /// discards them and `ibv_destroy_cq` waits only for the events it handed out.
    pub fn discard(&self, cq: u32) {
        let mut queue = self.lock();
        let before = queue.events.len();
        queue.events.retain(|&c| c != cq);
        if before > 0 && queue.events.is_empty() {
            self.unready();
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
            queue.waiters += 1;
            match deadline {
                None => {
                    queue = self.cond.wait(queue).unwrap_or_else(|p| p.into_inner());
                }
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        queue.waiters -= 1;
                        return None;
                    }
                    queue = self
                        .cond
                        .wait_timeout(queue, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
            queue.waiters -= 1;
        }
    }
}

/// The events of a channel and the threads blocked on them.
#[derive(Debug, Default)]
struct Queue {
    /// CQ handles, oldest first.
    events: VecDeque<u32>,
    /// Threads in [`ChannelShared::wait`] (signalled only if there are any).
    waiters: usize,
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::Arc;

    use super::*;

    /// Bytes waiting in the channel's socket (up to 8: read, then written back).
    fn pending_bytes(ch: &ChannelShared) -> usize {
        let mut buf = [0u8; 8];
        let n = match (&ch.rx).read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == IoKind::WouldBlock => 0,
            Err(e) => panic!("read: {e}"),
        };
        (&ch.tx).write_all(&buf[..n]).unwrap();
        n
    }

    #[test]
    fn the_fd_holds_one_byte_while_events_are_queued() {
        let ch = ChannelShared::new().unwrap();
        assert_eq!(pending_bytes(&ch), 0);
        ch.signal(1);
        ch.signal(2);
        ch.signal(1);
        assert_eq!(pending_bytes(&ch), 1, "one byte for a burst of events");
        assert_eq!(ch.queued_for(1), 2);
        assert_eq!(ch.try_get(), Some(1));
        assert_eq!(pending_bytes(&ch), 1, "readable while events remain");
        assert_eq!(ch.try_get(), Some(2));
        assert_eq!(ch.try_get(), Some(1));
        assert_eq!(pending_bytes(&ch), 0, "not readable once empty");
        assert_eq!(ch.try_get(), None);
        ch.signal(3);
        assert_eq!(pending_bytes(&ch), 1);
    }

    #[test]
    fn discarding_the_last_events_makes_the_fd_unreadable() {
        let ch = ChannelShared::new().unwrap();
        ch.signal(1);
        ch.signal(2);
        ch.discard(1);
        assert_eq!(pending_bytes(&ch), 1, "CQ 2's event is still queued");
        ch.discard(2);
        assert_eq!(pending_bytes(&ch), 0);
        ch.discard(2);
        assert_eq!(pending_bytes(&ch), 0);
        ch.signal(4);
        assert_eq!(ch.wait(Some(Duration::ZERO)), Some(4));
        assert_eq!(pending_bytes(&ch), 0);
    }

    #[test]
    fn a_blocked_waiter_is_woken_by_a_signal() {
        let ch = Arc::new(ChannelShared::new().unwrap());
        let waiter = {
            let ch = ch.clone();
            std::thread::spawn(move || ch.wait(Some(Duration::from_secs(10))))
        };
        // Signal only once the waiter is blocked (it counted itself under the lock).
        while ch.lock().waiters == 0 {
            std::thread::yield_now();
        }
        ch.signal(7);
        assert_eq!(waiter.join().unwrap(), Some(7));
        assert_eq!(ch.lock().waiters, 0);
        assert_eq!(ch.wait(Some(Duration::from_millis(1))), None);
        assert_eq!(ch.lock().waiters, 0, "a timed-out wait is no waiter");
    }
}
