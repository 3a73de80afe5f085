//! The runtime of one UDP device: its state (HCA, MR memory, channels) behind a mutex, the
//! socket side behind another, and the progress thread that moves packets and timers when no
//! application thread does. The protocol engine itself is [`emu_proto::Hca`].
//!
//! # Who drives the device
//!
//! Run-to-completion where it pays, the progress thread for everything else:
//!
//! - **Verbs commands** (post_send, modify, destroy, …; a `post_recv` makes nothing ready and
//!   runs as a query, [`Core::post_recv`]) lock [`Io`] (without waiting: if another
//!   thread holds it, the command leaves its packets to that thread), then the [`DeviceState`],
//!   run the command, pull up to [`TX_BATCH`] packets from [`Hca::poll_transmit`] and send
//!   them from the caller's thread, through exactly the path the thread uses (ICRC fix-up,
//!   send-side faults, capture, GSO). The doorbell (a [`mio::Waker`]) rings only when the
//!   thread has to act: packets are left over, a device-to-itself packet waits to be fed
//!   back, or a timer deadline (engine or delayed datagram) moved earlier than the one the
//!   parked thread sleeps on. While traffic moves the thread never sleeps longer than
//!   [`ACTIVE_TICK`], so a retransmission timer a post arms (milliseconds away) rings
//!   nothing. A `post_send` right after another one ([`Core::post`]) sends nothing itself:
//!   bursts go out in batches from the next pass.
//! - **Polling application threads**: a `poll_cq` that finds the CQ empty and an MR read
//!   ([`Core::app_poll`]) run one nonblocking pass (steps 1–4 below) in the caller's thread,
//!   if no one else holds [`Io`]. While one has polled within [`POLL_HANDOFF`] the thread
//!   leaves the device to it and sleeps (looking again at doubling intervals, up to
//!   [`HANDOFF_CHECK_MAX`]); while an application thread keeps polling, the
//!   socket is out of the thread's poller (no wake-up per datagram). A poll that finds
//!   completions ([`Core::app_found`]) puts it back, as the application may now stop calling:
//!   a datagram that arrives then wakes the thread, which moves it itself if it is still
//!   unread and no application thread has polled for [`APP_GRACE`] ([`Progress::cover`]: the
//!   application went on to spin on its memory without calling the library, as
//!   `ib_write_lat` does). A thread about to sleep on a completion channel first drives the
//!   device itself for a while (`CHANNEL_SPIN` in the provider), then hands it back at once
//!   ([`Core::app_sleeps`]).
//!   If such a pass has nothing but ACKs to send, they wait for the caller's next call on the
//!   device that sends or polls, and leave after the packets that call makes
//!   ([`Io::release_acks`]; a receive posted meanwhile sends nothing): the
//!   application sees what arrived one `sendto` earlier and its answer is not queued behind
//!   an ACK. A poll that finds completions sends the ACKs an earlier call held at once
//!   ([`Core::app_found`]: the application may stop calling now); those its own pass held
//!   stay for the next call, as the answer to what arrived is likely to follow.
//! - **The progress thread** does everything else: it waits in `epoll_wait` (through mio) for
//!   a datagram, the doorbell, writability or the next deadline, so an idle device costs no
//!   CPU; in busy-poll mode ([`Core::busy_poll`]) it spins instead while no application
//!   thread polls. One spinning thread per process, not two.
//!
//! # One pass
//!
//! 1. receive up to [`RX_BATCH`] datagrams: `recvmmsg` (up to [`RECV_BATCH`] buffers per
//!    call, headers built once: [`RecvArea`]) until `WouldBlock`; with `UDP_GRO` a buffer
//!    may hold several datagrams of one flow, split at the segment size the kernel reports;
//! 2. without the device lock: pass each received datagram through the receive-side fault
//!    stage (datagrams it passes unchanged stay in the receive buffer; the others are copied
//!    into pooled buffers, delayed, held or duplicated);
//! 3. with the device lock held: feed them to [`Hca::handle_datagram`], fire due timers, pull
//!    up to [`TX_BATCH`] packets from [`Hca::poll_transmit`], deliver channel notifications
//!    and async events, read the next timer deadline;
//! 4. without the device lock: rewrite each packet's ICRC if the engine signed it for another
//!    source port, pass it through the send-side fault stage, and write it: with GSO on, each
//!    run of datagrams to one destination of equal size (the last may be shorter) goes out in
//!    one `sendmsg` with `UDP_SEGMENT`, otherwise one `send_to` per datagram (on `WouldBlock`
//!    the packets stay queued, the socket is armed for writability and no new packet is
//!    pulled until it drains; a GSO send the kernel refuses with `EIO`/`EINVAL` turns GSO off
//!    for the socket and its datagrams go out one by one);
//! 5. (the thread only) wait in [`Poll::poll`] until a datagram, the doorbell, writability or
//!    the next deadline (engine timer or delayed datagram of either direction; a `timerfd` in
//!    the poller ends the wait at it to the microsecond, see [`crate::timer`]) — or not at all
//!    if a batch limit left work behind, or in busy-poll mode; or, while application threads
//!    poll, sleep up to [`POLL_HANDOFF`], woken by a datagram only to cover it (see above).
//!
//! # Locks and the parking protocol
//!
//! Lock order: [`Io`], then [`DeviceState`], then the fault configuration, then a capture. The
//! thread holds [`Io`] for a whole pass and decides to park while still holding it, so a
//! thread that holds [`Io`] sees the thread either parked (on `Io::sleep_until`) or about to
//! run a full pass. A command that could not get [`Io`] sets `Core::dirty` (under the device
//! lock); the thread clears it when it pulls, and re-checks it after announcing `parked`
//! (sequentially consistent on both sides, so either the thread sees the flag or the command
//! sees the thread parked and rings).
//!
//! Packet buffers come from a pool and keep their full length while in use (a datagram's
//! length is carried next to its buffer), so no buffer is cleared or resized per packet.
//!
//! Datagrams addressed to the device itself skip the socket (rxe's loopback) and are fed back
//! on the next pass; the receive-side fault stage does not see them.

use std::collections::VecDeque;
use std::io::{ErrorKind as IoKind, IoSlice};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant as StdInstant};

use emu_device::{DeviceMemory, DeviceState, MrAddresses};
use emu_proto::{Hca, HcaConfig, Instant, PacketClass};
use mio::net::UdpSocket;
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use verbs_api::{Error, ErrorKind, Result};

use crate::capture::{Capture, wall_clock};
use crate::fault::{Datagram, Direction, FaultConfig, FaultStage, Pool};
use crate::socket::{Bound, RECV_BATCH, RecvArea, SocketInfo};
use crate::timer::Timer;

/// Datagrams received per pass at most (the bound on work per wake-up). Each receive call
/// asks for at most as many buffers as datagrams are still missing, so without UDP GRO the
/// bound is exact; with GRO a buffer may hold a batch of up to 64 datagrams of one flow
/// (64 KiB), never split, and the last call may read that many more.
pub const RX_BATCH: usize = 64;
/// Packets pulled from the engine per pass (or per verbs call sending inline) at most.
pub const TX_BATCH: usize = 64;
/// While an application thread has polled a device (a `poll` that found a CQ empty, an MR
/// `read`) within this time, the device's progress runs in the polling threads and the
/// progress thread sleeps, with the socket out of its poller while they keep polling and in
/// it once a poll found completions (see [`APP_GRACE`]); after it, the thread takes over
/// again (and spins in busy-poll mode) — as soon as it next looks, within
/// [`HANDOFF_CHECK_MAX`]. An application thread that goes to sleep on a
/// completion channel of the device hands over at once.
pub const POLL_HANDOFF: Duration = Duration::from_millis(1);
/// A datagram that arrives while application threads drive the device (see
/// [`POLL_HANDOFF`]) wakes the progress thread; if no application thread has polled for this
/// long (it went on to spin on its memory, as `ib_write_lat` does), the thread moves the
/// datagram itself, at once or as soon as the time has passed.
pub const APP_GRACE: Duration = Duration::from_micros(10);
/// The longest the progress thread sleeps between two looks while it covers a datagram for
/// an application thread that holds the socket side (see [`APP_GRACE`]): a datagram such a
/// thread leaves unread when it stops calling waits at most about this much longer.
const COVER_NAP_MAX: Duration = Duration::from_micros(160);
/// While application threads drive the device, the progress thread wakes after
/// [`POLL_HANDOFF`] to see whether they stopped, and after twice as long each time it finds
/// them still polling, up to this. Each such wake-up lands on a CPU that a spinning
/// application thread holds and costs it two context switches: at one per millisecond that
/// was about one 8-byte `write_lat` round trip in 80 per process, enough to set the p99. So an
/// application that stops calling the library without sleeping on a completion channel (and
/// without a poll that found completions, which hands arrivals back to the thread at once) is
/// taken over within this time rather than within [`POLL_HANDOFF`].
pub const HANDOFF_CHECK_MAX: Duration = Duration::from_millis(8);
/// The longest the progress thread sleeps while traffic moves (a pass, or a verbs call, sent
/// or received something since it last parked): a timer a verbs call arms further away than
/// this needs no doorbell. Once a whole tick passes without traffic the thread sleeps until
/// the next deadline (forever if none).
pub(crate) const ACTIVE_TICK: Duration = Duration::from_millis(1);
/// Receive buffer per datagram without GRO: larger than any packet the engine builds, so a
/// longer datagram arrives truncated and fails its ICRC check.
const RX_BUF_LEN: usize = 16 * 1024;
/// Receive buffer with GRO: room for the largest UDP datagram, which bounds a GRO batch too.
const RX_BUF_LEN_GRO: usize = 64 * 1024;
/// Receive buffers: one per datagram of a batch without GRO.
const RX_BUFS: usize = RX_BATCH;
/// The most UDP payload one GSO send may carry (an IPv4 datagram's limit; IPv6 allows a little
/// more, unused).
const GSO_MAX_BYTES: usize = 65_507;
/// The most segments one GSO send may carry (Linux's `UDP_MAX_SEGMENTS` of older kernels).
const GSO_MAX_SEGMENTS: usize = 64;

const SOCKET: Token = Token(0);
const DOORBELL: Token = Token(1);
/// The progress thread's deadline timer ([`Timer`]).
const TIMER: Token = Token(2);

/// Counters of the driver itself (the transport's are [`emu_proto::Stats`]).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DriverStats {
    /// Iterations of the progress thread's loop (each wake-up counts one).
    pub wakeups: u64,
    /// Datagrams read from the socket (each datagram of a GRO buffer counts).
    pub datagrams_received: u64,
    /// Bytes read from the socket.
    pub bytes_received: u64,
    /// Datagrams written to the socket.
    pub datagrams_sent: u64,
    /// Bytes written to the socket.
    pub bytes_sent: u64,
    /// Datagrams the device sent to itself without the socket.
    pub loopback: u64,
    /// Send calls that found the socket buffer full (the packets were kept and retried).
    pub send_would_block: u64,
    /// Send calls that failed otherwise (the packets were lost; the transport retries). A GSO
    /// send the kernel refused is counted in [`gso_refused`](Self::gso_refused) instead.
    pub send_errors: u64,
    /// Receive or `poll` calls that failed other than `WouldBlock`/`EINTR`, and failed
    /// armings of the progress thread's deadline timer.
    pub recv_errors: u64,
    /// Datagrams this device wrote to a pcap capture (see [`crate::UdpBuilder::capture`]).
    pub captured: u64,
    /// Send system calls made (`sendmsg`/`sendto`, each carrying one datagram or a GSO run;
    /// those that would block or failed count too).
    pub send_syscalls: u64,
    /// Receive system calls made (`recvmmsg`/`recvfrom`; the one that finds the socket empty
    /// counts too).
    pub recv_syscalls: u64,
    /// Sends that carried more than one datagram (UDP GSO).
    pub gso_sends: u64,
    /// GSO sends the kernel refused (`EIO`/`EINVAL`, e.g. a device without segmentation
    /// offload): the first one turns GSO off for the socket, and the datagrams of each are
    /// sent again one by one.
    pub gso_refused: u64,
    /// Receive buffers that held more than one datagram (UDP GRO).
    pub gro_receives: u64,
    /// Verbs calls (`post_send`, `modify`, …) that sent the packets they made ready from the
    /// caller's thread, without waking the progress thread, and CQ polls that found
    /// completions and sent the ACKs the caller's earlier polls held back.
    pub inline_sends: u64,
    /// Times a verbs call rang the progress thread's doorbell (packets left over, a timer
    /// earlier than the thread's sleep, the socket side busy while the thread was parked, or
    /// an application thread that drove the device going to sleep on a completion channel).
    pub doorbells: u64,
    /// Progress passes (receive, engine, send, timers) run by application threads polling the
    /// device: a CQ poll that found the CQ empty, an MR read (see
    /// [`crate::UdpDevice::set_busy_poll`]).
    pub app_passes: u64,
    /// Datagrams that arrived while application threads drove the device but that none of
    /// them picked up within [`APP_GRACE`], so the progress thread ran the passes itself
    /// (counted once per such wake-up).
    pub covered: u64,
}

#[derive(Debug, Default)]
struct AtomicStats {
    wakeups: AtomicU64,
    datagrams_received: AtomicU64,
    bytes_received: AtomicU64,
    datagrams_sent: AtomicU64,
    bytes_sent: AtomicU64,
    loopback: AtomicU64,
    send_would_block: AtomicU64,
    send_errors: AtomicU64,
    recv_errors: AtomicU64,
    captured: AtomicU64,
    send_syscalls: AtomicU64,
    recv_syscalls: AtomicU64,
    gso_sends: AtomicU64,
    gso_refused: AtomicU64,
    gro_receives: AtomicU64,
    inline_sends: AtomicU64,
    doorbells: AtomicU64,
    app_passes: AtomicU64,
    covered: AtomicU64,
}

fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

/// Engine time: nanoseconds since the device was created.
fn clock(epoch: StdInstant) -> Instant {
    Instant::from_nanos(u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX))
}

/// The earlier of two optional deadlines (`None` is "never").
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The state shared by the application and the progress thread of one device.
#[derive(Debug)]
pub(crate) struct Core {
    state: Mutex<DeviceState>,
    /// The latest engine time handed out (nanoseconds): engine time never goes backwards.
    last_now: AtomicU64,
    /// The socket side; `None` once the progress thread stopped (the socket is closed).
    io: Mutex<Option<Io>>,
    waker: Waker,
    epoch: StdInstant,
    info: SocketInfo,
    /// GSO in use (starts as `info.gso_enabled`; cleared when the kernel refuses a GSO send).
    gso_active: AtomicBool,
    stop: AtomicBool,
    busy: AtomicBool,
    release_held: AtomicBool,
    stats: AtomicStats,
    faults: Mutex<FaultConfig>,
    /// The pcap capture the device writes to, and a counter bumped on every change (whoever
    /// sends or receives re-reads the capture only when it moved).
    capture: Mutex<Option<Arc<Capture>>>,
    capture_gen: AtomicU64,
    /// The thread waits (or is about to) for a datagram, the doorbell or `Io::sleep_until`:
    /// whoever gives it earlier work clears this and rings.
    parked: AtomicBool,
    /// A command made work ready since the last pull that no one sent (the socket side was
    /// busy): the thread must pull again before it parks.
    dirty: AtomicBool,
    /// Engine time in nanoseconds (at least 1) of the last time an application thread polled
    /// the device; 0 when none has since one went to sleep on a completion channel.
    app_poll: AtomicU64,
    /// The thread sleeps, leaving the device to the polling application threads.
    deferring: AtomicBool,
    /// The last call on the device was a `post_send` (see [`Core::post`]).
    posting: AtomicBool,
    /// The socket is out of the progress thread's poller (an application thread polls).
    socket_out: AtomicBool,
    /// ACKs an application thread's pass held back wait in [`Io`] (set and cleared with the
    /// socket side held; read without it as a hint, by the thread that polled).
    acks_held: AtomicBool,
}

impl Core {
    fn lock(&self) -> MutexGuard<'_, DeviceState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Engine time now: the time since the device was created, never less than what an
    /// earlier call got.
    fn now(&self) -> Instant {
        let now = clock(self.epoch).as_nanos();
        Instant::from_nanos(self.last_now.fetch_max(now, Ordering::AcqRel).max(now))
    }

    /// The socket side, waiting for it.
    fn io(&self) -> MutexGuard<'_, Option<Io>> {
        self.io.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Holds the socket side until the returned guard drops, as a pass does.
    #[cfg(test)]
    pub(crate) fn hold_socket_side(&self) -> impl Sized + '_ {
        self.io()
    }

    /// The socket side if no other thread holds it.
    fn try_io(&self) -> Option<MutexGuard<'_, Option<Io>>> {
        match self.io.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// The fault configuration (plans and node numbers).
    pub(crate) fn faults(&self) -> MutexGuard<'_, FaultConfig> {
        self.faults.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs a command that may make packets ready or move timers (post, modify, destroy, …):
    /// `f` runs under the device lock, then the packets it made ready (up to [`TX_BATCH`]) are
    /// sent from the caller's thread, produced notifications are delivered, and the progress
    /// thread is woken only if it has to act (see the module docs). If another thread holds the
    /// socket side, the packets are left to it (the progress thread is rung if parked).
    pub(crate) fn command<R>(&self, f: impl FnOnce(&mut DeviceState, Instant) -> R) -> R {
        self.posting.store(false, Ordering::Relaxed);
        self.run_with(f, self.try_io(), Clock::Read)
    }

    /// Runs a `post_send`: as [`command`](Self::command), except that a post that directly
    /// follows another post on the device (a burst: no poll, read or other call between them)
    /// leaves its packets to whoever sends next — the progress thread (rung if parked) or the
    /// polling application thread — so that a burst goes out in batches (GSO runs) rather
    /// than one system call per post.
    ///
    /// A post that sends nothing itself gets the last engine time handed out instead of a
    /// clock read: queueing WQEs arms no timer (the packets' timers start when they are
    /// pulled), so the time only stamps the post's trace span.
    pub(crate) fn post<R>(&self, f: impl FnOnce(&mut DeviceState, Instant) -> R) -> R {
        let burst = self.posting.swap(true, Ordering::Relaxed);
        let io = if burst { None } else { self.try_io() };
        self.run_with(f, io, Clock::Cached)
    }

    /// Runs a `post_receive` (see `Port::post_recv`): it makes nothing ready to send, so it
    /// runs as a query — no clock read, no pull, no doorbell. ACKs an application pass held
    /// back stay held for the caller's next call that sends or polls.
    pub(crate) fn post_recv<R>(&self, f: impl FnOnce(&mut DeviceState) -> R) -> R {
        self.query(f)
    }

    /// The last engine time handed out (never more than [`Core::now`]).
    fn last_time(&self) -> Instant {
        Instant::from_nanos(self.last_now.load(Ordering::Acquire))
    }

    /// Sends what the device made ready, in the caller's thread, waiting for the socket side
    /// if another thread holds it (see `Port::flush`).
    pub(crate) fn flush(&self) {
        self.posting.store(false, Ordering::Relaxed);
        self.run_with(|_, _| (), Some(self.io()), Clock::Read);
    }

    /// Runs `f` on the device state, then, with the socket side `io`, sends what is ready in
    /// this thread; without it, leaves that to the progress thread (woken). `f` gets the
    /// engine time now, or with [`Clock::Cached`] and no socket side the last time handed out.
    fn run_with<R>(
        &self,
        f: impl FnOnce(&mut DeviceState, Instant) -> R,
        mut io: Option<MutexGuard<'_, Option<Io>>>,
        clock: Clock,
    ) -> R {
        let mut st = self.lock();
        let now = match (clock, &io) {
            (Clock::Cached, None) => self.last_time(),
            _ => self.now(),
        };
        let r = f(&mut st, now);
        match io.as_mut().and_then(|g| g.as_mut()) {
            Some(io) => {
                let DeviceState { hca, mem, .. } = &mut *st;
                let more = io.pull(hca, mem, now) == Pull::Full;
                io.release_acks();
                self.acks_held.store(false, Ordering::Release);
                st.deliver();
                let deadline = st.hca.poll_timeout();
                drop(st);
                if io.transmit(self, now) {
                    bump(&self.stats.inline_sends, 1);
                }
                if more || !io.self_rx.is_empty() || io.wakes_earlier(deadline) {
                    self.wake();
                }
            }
            None => {
                st.deliver();
                // Set under the device lock, and cleared under it by the pull that takes
                // these packets: if it is set already, the command that set it has rung (or
                // is about to ring) the thread, which has not pulled since.
                let rung = self.dirty.load(Ordering::Relaxed);
                if !rung {
                    self.dirty.store(true, Ordering::SeqCst);
                }
                drop(st);
                if !rung {
                    self.wake();
                }
            }
        }
        r
    }

    /// Runs a command that gives the thread no work (queries, polling a CQ).
    pub(crate) fn query<R>(&self, f: impl FnOnce(&mut DeviceState) -> R) -> R {
        self.posting.store(false, Ordering::Relaxed);
        let mut st = self.lock();
        let r = f(&mut st);
        st.deliver();
        r
    }

    /// An application thread polls the device (a CQ it found empty, an MR it reads). Notes
    /// the time (the progress thread keeps away while polls keep coming, see
    /// [`POLL_HANDOFF`]) and runs one nonblocking pass in the caller's thread, unless another
    /// thread holds the socket side (then it returns at once).
    pub(crate) fn app_poll(&self) {
        self.posting.store(false, Ordering::Relaxed);
        // One clock read serves the hand-off's timestamp and the pass.
        let now = self.now();
        self.app_poll
            .store(now.as_nanos().max(1), Ordering::Release);
        let Some(mut guard) = self.try_io() else {
            return;
        };
        let Some(io) = guard.as_mut() else {
            return;
        };
        bump(&self.stats.app_passes, 1);
        if self.deferring.load(Ordering::Acquire) {
            // The progress thread left the device to the polling threads and this one reads
            // the socket now: arrivals need not wake it. (A thread parked otherwise keeps
            // the socket: it has no other wake-up for it; its next pass puts it back.)
            self.socket_in(io, false);
        }
        let release = self.release_held.swap(false, Ordering::AcqRel);
        io.pass(self, now, release, true, true);
    }

    /// An application thread's poll found completions: it may stop polling now (and, say,
    /// spin on its memory), so the socket goes back into the progress thread's poller, where
    /// an arriving datagram wakes the thread (see [`APP_GRACE`]).
    ///
    /// ACKs held back go out now if an earlier call's pass held them (`pass_ran` false: this
    /// call found what an earlier pass delivered, and the application did not send since).
    /// ACKs the pass of this very call held stay held for the caller's next call, which
    /// sends them after its own packets ([`Io::release_acks`]): the request and the ACK that
    /// completes the peer's own request arrived together, and a ping-pong whose answer leaves
    /// before its ACK stays one in which each side's application moves both packets itself.
    /// Sent at once, the ACK completed the peer's send before the answer arrived; the peer
    /// then spun on its memory, and every answer after that waited for its progress thread
    /// (perftest's `ib_write_lat` on the drop-in: 22.8–39 µs against 8.2–11.5, 5 rounds). If
    /// the application never calls again, the progress thread sends them when it next looks
    /// (within [`HANDOFF_CHECK_MAX`]) or when a datagram arrives. Nothing to do (two atomic
    /// loads) unless an earlier poll took the socket out or held an ACK.
    pub(crate) fn app_found(&self, pass_ran: bool) {
        let socket_out = self.socket_out.load(Ordering::Acquire);
        let acks_held = self.acks_held.load(Ordering::Acquire) && !pass_ran;
        if !socket_out && !acks_held {
            return;
        }
        // Waiting for the socket side: a pass that holds it sends held ACKs first, so they
        // have left when this returns.
        let mut guard = self.io();
        let Some(io) = guard.as_mut() else {
            return;
        };
        if socket_out {
            self.socket_in(io, true);
        }
        if acks_held {
            io.release_acks();
            if io.transmit(self, clock(self.epoch)) {
                bump(&self.stats.inline_sends, 1);
            }
            self.acks_held.store(false, Ordering::Release);
        }
    }

    /// Puts the socket into the progress thread's poller or takes it out, and notes which.
    fn socket_in(&self, io: &mut Io, on: bool) {
        io.register(on);
        self.socket_out.store(!io.registered, Ordering::Release);
    }

    /// An application thread is about to sleep (on a completion channel): ACKs its passes
    /// held back go out, and the progress thread takes over now rather than after
    /// [`POLL_HANDOFF`].
    pub(crate) fn app_sleeps(&self) {
        self.app_poll.store(0, Ordering::Release);
        self.app_found(false);
        if self.deferring.swap(false, Ordering::AcqRel) {
            bump(&self.stats.doorbells, 1);
            self.ring();
        }
    }

    /// Rings the doorbell if the thread is parked (and marks it unparked, so the next caller
    /// does not ring again).
    fn wake(&self) {
        if self.parked.swap(false, Ordering::SeqCst) {
            bump(&self.stats.doorbells, 1);
            self.ring();
        }
    }

    /// Wakes the progress thread.
    pub(crate) fn ring(&self) {
        // Fails only if the eventfd is gone, i.e. never while `self` lives.
        let _ = self.waker.wake();
    }

    pub(crate) fn set_busy_poll(&self, on: bool) {
        self.busy.store(on, Ordering::Release);
        self.ring();
    }

    pub(crate) fn busy_poll(&self) -> bool {
        self.busy.load(Ordering::Acquire)
    }

    /// How much longer the polling application threads keep the device (`None`: no
    /// application thread polled within [`POLL_HANDOFF`]).
    fn app_driving(&self) -> Option<Duration> {
        let last = self.app_poll.load(Ordering::Acquire);
        if last == 0 {
            return None;
        }
        let until = last.saturating_add(u64::try_from(POLL_HANDOFF.as_nanos()).unwrap_or(0));
        let now = clock(self.epoch).as_nanos();
        (now < until).then(|| Duration::from_nanos(until - now))
    }

    /// Makes the thread deliver every held datagram of both directions on its next pass.
    pub(crate) fn release_held(&self) {
        self.release_held.store(true, Ordering::Release);
        self.ring();
    }

    /// The capture the device writes to.
    pub(crate) fn capture(&self) -> Option<Arc<Capture>> {
        self.capture
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the capture the device writes to; returns the previous one.
    pub(crate) fn set_capture(&self, capture: Option<Arc<Capture>>) -> Option<Arc<Capture>> {
        let old = std::mem::replace(
            &mut *self.capture.lock().unwrap_or_else(|p| p.into_inner()),
            capture,
        );
        self.capture_gen.fetch_add(1, Ordering::AcqRel);
        self.ring();
        old
    }

    /// What the kernel granted the socket, with the current GSO state.
    pub(crate) fn socket_info(&self) -> SocketInfo {
        SocketInfo {
            gso_enabled: self.gso_active.load(Ordering::Acquire),
            ..self.info
        }
    }

    pub(crate) fn is_stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    pub(crate) fn driver_stats(&self) -> DriverStats {
        let s = &self.stats;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        DriverStats {
            wakeups: get(&s.wakeups),
            datagrams_received: get(&s.datagrams_received),
            bytes_received: get(&s.bytes_received),
            datagrams_sent: get(&s.datagrams_sent),
            bytes_sent: get(&s.bytes_sent),
            loopback: get(&s.loopback),
            send_would_block: get(&s.send_would_block),
            send_errors: get(&s.send_errors),
            recv_errors: get(&s.recv_errors),
            captured: get(&s.captured),
            send_syscalls: get(&s.send_syscalls),
            recv_syscalls: get(&s.recv_syscalls),
            gso_sends: get(&s.gso_sends),
            gso_refused: get(&s.gso_refused),
            gro_receives: get(&s.gro_receives),
            inline_sends: get(&s.inline_sends),
            doorbells: get(&s.doorbells),
            app_passes: get(&s.app_passes),
            covered: get(&s.covered),
        }
    }
}

/// A running device: its [`Core`] and progress thread. Dropping it stops and joins the thread,
/// which closes the socket.
#[derive(Debug)]
pub(crate) struct Runtime {
    pub(crate) core: Arc<Core>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Runtime {
    /// Starts the progress thread of a device whose socket is already bound.
    pub(crate) fn start(
        bound: Bound,
        config: HcaConfig,
        faults: FaultConfig,
        capture: Option<Arc<Capture>>,
        busy_poll: bool,
    ) -> Result<Runtime> {
        let Bound {
            mut socket,
            peek,
            info,
        } = bound;
        let name = config.name.clone();
        let io = |what: &str, e: std::io::Error| {
            Error::new(ErrorKind::Io, format!("{name}: {what}: {e}"))
        };
        let poll = Poll::new().map_err(|e| io("creating the poller", e))?;
        poll.registry()
            .register(&mut socket, SOCKET, Interest::READABLE)
            .map_err(|e| io("registering the socket", e))?;
        let registry = poll
            .registry()
            .try_clone()
            .map_err(|e| io("sharing the poller", e))?;
        let waker =
            Waker::new(poll.registry(), DOORBELL).map_err(|e| io("creating the doorbell", e))?;
        let rx_buf_len = if info.gro_enabled {
            RX_BUF_LEN_GRO
        } else {
            RX_BUF_LEN
        };
        let socket_side = Io {
            registry,
            registered: true,
            writable_armed: false,
            local: info.local_addr,
            socket,
            gso: info.gso_enabled,
            gso_segments: info.gso_segments.clamp(1, GSO_MAX_SEGMENTS),
            // Zeroed memory is mapped lazily: untouched buffer pages cost nothing.
            rx: RecvArea::new(RX_BUFS, rx_buf_len),
            rx_meta: Vec::with_capacity(RX_BATCH),
            feed: Vec::with_capacity(RX_BATCH),
            rx_owned: VecDeque::new(),
            staged: Vec::with_capacity(TX_BATCH),
            out: VecDeque::new(),
            self_rx: VecDeque::new(),
            pool: Pool::default(),
            tx_stage: FaultStage::default(),
            rx_stage: FaultStage::default(),
            capture: None,
            capture_gen: 0,
            sleep_until: None,
            active: false,
            held_acks: Vec::new(),
        };
        let core = Arc::new(Core {
            state: Mutex::new(DeviceState::new(Hca::new(config), MrAddresses::Host)),
            last_now: AtomicU64::new(0),
            io: Mutex::new(Some(socket_side)),
            waker,
            epoch: StdInstant::now(),
            info,
            gso_active: AtomicBool::new(info.gso_enabled),
            stop: AtomicBool::new(false),
            busy: AtomicBool::new(busy_poll),
            release_held: AtomicBool::new(false),
            stats: AtomicStats::default(),
            faults: Mutex::new(faults),
            capture: Mutex::new(capture),
            capture_gen: AtomicU64::new(1),
            parked: AtomicBool::new(false),
            dirty: AtomicBool::new(false),
            app_poll: AtomicU64::new(0),
            deferring: AtomicBool::new(false),
            posting: AtomicBool::new(false),
            socket_out: AtomicBool::new(false),
            acks_held: AtomicBool::new(false),
        });
        // Without a timerfd (never on a Linux this runs on) the poll timeout alone bounds
        // the waits, in whole milliseconds.
        let timer = Timer::new(core.epoch, poll.registry(), TIMER).ok();
        let progress = Progress {
            core: core.clone(),
            peek,
            poll,
            events: Events::with_capacity(8),
            timer,
        };
        let thread = std::thread::Builder::new()
            .name(format!("softverbs-{name}"))
            .spawn(move || progress.run())
            .map_err(|e| io("starting the progress thread", e))?;
        Ok(Runtime {
            core,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Stops the progress thread and waits for it; idempotent. The socket closes with it.
    pub(crate) fn shutdown(&self) {
        self.core.stop.store(true, Ordering::Release);
        self.core.ring();
        let handle = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(handle) = handle {
            if handle.thread().id() != std::thread::current().id() {
                let _ = handle.join();
            }
        }
    }
}

#[cfg(test)]
impl Runtime {
    /// CPU time the progress thread has used so far (`None` once it stopped).
    pub(crate) fn thread_cpu(&self) -> Option<Duration> {
        let guard = self.thread.lock().unwrap_or_else(|p| p.into_inner());
        guard.as_ref().and_then(crate::socket::thread_cpu_time)
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// One buffer's worth of received bytes: `len` bytes at `start` in the receive area, from
/// `src`, datagrams of `stride` bytes each (the last may be shorter; `stride == len` without
/// GRO).
#[derive(Copy, Clone, Debug)]
struct RxMeta {
    start: usize,
    len: usize,
    stride: usize,
    src: SocketAddr,
}

impl RxMeta {
    /// The datagrams of the buffer, as (start, len) in the receive area; an empty datagram
    /// is one datagram too.
    fn segments(&self) -> impl Iterator<Item = (usize, usize)> {
        let (start, len, stride) = (self.start, self.len, self.stride.max(1));
        (0..len.max(1))
            .step_by(stride)
            .map(move |off| (start + off, stride.min(len - off)))
    }
}

/// A received datagram on its way to the engine.
#[derive(Debug)]
enum Feed {
    /// Still in the receive area (the fault stage passed it unchanged).
    Slice {
        start: usize,
        len: usize,
        src: SocketAddr,
    },
    /// Copied out by the fault stage (a duplicate, an edit, or a delayed or held datagram
    /// that is now due).
    Owned(Datagram),
}

/// Which engine time a call on the device gets (see [`Core::run_with`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Clock {
    /// A clock read: the call may arm timers.
    Read,
    /// The last time handed out, if the call sends nothing itself (a post that only queues).
    Cached,
}

/// What [`Io::pull`] left behind.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Pull {
    /// Nothing: the engine had no more packets (some may have been pulled).
    Drained,
    /// The batch filled: the engine may have more.
    Full,
    /// Nothing was pulled: a backlog waits for the socket to drain.
    Blocked,
}

/// What one [`Io::pass`] did.
#[derive(Copy, Clone, Debug)]
struct Pass {
    /// A batch limit left work behind (received or engine packets, or a packet the device
    /// sent to itself to feed back).
    more: bool,
    /// The next deadline: engine timer or delayed datagram of either direction.
    deadline: Option<Instant>,
    /// Something was received or sent.
    moved: bool,
}

/// The socket side of a device: the socket, the receive area, the fault stages and the queue
/// of packets to write. Locked by whichever thread runs a pass or sends inline.
#[derive(Debug)]
pub(crate) struct Io {
    /// The progress thread's poller, to arm writability and take the socket in and out.
    registry: Registry,
    /// The socket is in the poller, its interest on (it is out, registered with an empty
    /// interest, while application threads poll, see [`Core::app_poll`] and
    /// [`Core::app_found`]).
    registered: bool,
    /// Writability is (or, once registered again, will be) asked for.
    writable_armed: bool,
    socket: UdpSocket,
    /// Coalesce runs into GSO sends.
    gso: bool,
    /// Datagrams per GSO send at most.
    gso_segments: usize,
    local: SocketAddr,
    /// The receive area: [`RX_BUFS`] buffers.
    rx: RecvArea,
    /// What each filled receive buffer of the current batch holds.
    rx_meta: Vec<RxMeta>,
    /// Received datagrams to hand to the engine this pass, in order.
    feed: Vec<Feed>,
    /// Scratch queue of the receive-side fault stage.
    rx_owned: VecDeque<Datagram>,
    /// Packets pulled from the engine, before the fault stage, with the class the engine gave
    /// each.
    staged: Vec<(PacketClass, Datagram)>,
    /// Packets to write to the socket, in order.
    out: VecDeque<Datagram>,
    /// Packets the device sent to itself, fed back next pass.
    self_rx: VecDeque<Datagram>,
    pool: Pool,
    tx_stage: FaultStage,
    rx_stage: FaultStage,
    /// The device's capture as last read from [`Core`], and the generation read.
    capture: Option<Arc<Capture>>,
    capture_gen: u64,
    /// What the parked thread sleeps until (`None`: no deadline); valid while
    /// [`Core::parked`] is set.
    sleep_until: Option<Instant>,
    /// A verbs call sent packets since the thread last parked.
    active: bool,
    /// ACKs an application thread's pass left for its next call (see [`Io::pass`]).
    held_acks: Vec<(PacketClass, Datagram)>,
}

/// The progress thread's own state.
struct Progress {
    core: Arc<Core>,
    /// The socket, to peek at (see [`Progress::cover`]).
    peek: std::net::UdpSocket,
    poll: Poll,
    events: Events,
    /// Ends a wait at the next deadline to the microsecond (the poll timeout counts whole
    /// milliseconds); `None` if it could not be created.
    timer: Option<Timer>,
}

impl Progress {
    fn run(mut self) {
        let core = self.core.clone();
        // Skip the receive call of a pass that only re-runs for a command (the socket was
        // drained by the pass before, and a datagram since then is a new poller event).
        let mut skip_rx = false;
        // How long the next check on polling application threads sleeps at least.
        let mut check = POLL_HANDOFF;
        while !core.is_stopped() {
            bump(&core.stats.wakeups, 1);
            core.parked.store(false, Ordering::SeqCst);
            if let Some(left) = core.app_driving() {
                // The application threads drive the device: sleep until they stop polling.
                // The socket is out of the poller while they keep polling (`app_poll`) and
                // back in once a poll found completions (`app_found`), so that a datagram
                // none of them picks up (the application went on to spin on its memory) is
                // not left waiting.
                skip_rx = false;
                // A datagram that woke the thread before an application thread polled (from
                // a park, or the last wait here) is covered before it sleeps again.
                if !self.socket_ready() {
                    core.deferring.store(true, Ordering::Release);
                    self.wait(Some(left.max(check)));
                    core.deferring.store(false, Ordering::Release);
                    check = check.saturating_mul(2).min(HANDOFF_CHECK_MAX);
                }
                if self.socket_ready() {
                    self.events.clear();
                    if self.cover().is_none() {
                        break;
                    }
                }
                continue;
            }
            check = POLL_HANDOFF;
            if core.busy_poll() {
                skip_rx = false;
                let alive = self.with_io(|io| {
                    let release = core.release_held.swap(false, Ordering::AcqRel);
                    io.pass(&core, core.now(), release, true, false);
                });
                if alive.is_none() {
                    break;
                }
                std::hint::spin_loop();
                continue;
            }
            let (timeout, deadline) = {
                let mut guard = core.io();
                let Some(io) = guard.as_mut() else {
                    break;
                };
                core.socket_in(io, true);
                let release = core.release_held.swap(false, Ordering::AcqRel);
                let pass = io.pass(&core, core.now(), release, !skip_rx, false);
                skip_rx = false;
                if pass.more {
                    (Some(Duration::ZERO), None)
                } else {
                    let now = clock(core.epoch);
                    let active = pass.moved || std::mem::take(&mut io.active);
                    let tick = active.then(|| now + ACTIVE_TICK);
                    let until = earliest(pass.deadline, tick);
                    io.sleep_until = until;
                    core.parked.store(true, Ordering::SeqCst);
                    if core.dirty.load(Ordering::SeqCst) {
                        // A command left packets while we held the socket side: pull them.
                        core.parked.store(false, Ordering::SeqCst);
                        skip_rx = true;
                        (Some(Duration::ZERO), None)
                    } else {
                        (
                            until.map(|at| at.saturating_duration_since(now)),
                            pass.deadline,
                        )
                    }
                }
            };
            if timeout != Some(Duration::ZERO) {
                // The timer wakes the thread at the deadline (engine timer or delayed
                // datagram); the timeout, rounded up to whole milliseconds, is the backstop
                // and the only bound of the active tick, which needs no precision.
                if let Some(timer) = self.timer.as_mut() {
                    if timer.arm(deadline).is_err() {
                        bump(&core.stats.recv_errors, 1);
                    }
                }
                self.wait(timeout);
            }
        }
        // Closes the socket; later commands find no socket side and move nothing.
        core.io().take();
    }

    /// Whether the last wait returned because the socket became readable.
    fn socket_ready(&self) -> bool {
        self.events
            .iter()
            .any(|e| e.token() == SOCKET && e.is_readable())
    }

    /// A datagram arrived while application threads drive the device: it is theirs if one
    /// polls before [`APP_GRACE`] has passed since the last poll (its pass reads the socket);
    /// otherwise this thread runs passes until the socket is drained, waiting asleep while an
    /// application thread holds the socket side. An application that stopped polling long ago
    /// (it spins on its memory) gets its datagram at once. `None` if the socket side is gone.
    fn cover(&self) -> Option<()> {
        let core = &self.core;
        let arrived = clock(core.epoch).as_nanos();
        let grace = u64::try_from(APP_GRACE.as_nanos()).unwrap_or(u64::MAX);
        // How long the next look waits while an application thread holds the socket side.
        let mut nap = APP_GRACE;
        loop {
            let last = core.app_poll.load(Ordering::Acquire);
            if last >= arrived || !self.datagram_waits() {
                // An application thread polled since (its pass reads the socket), or one
                // already read it.
                return Some(());
            }
            if clock(core.epoch).as_nanos().saturating_sub(last) < grace {
                // An application thread polled within the grace: its next pass reads the
                // socket. At most a grace of this, so a datagram for an application that went
                // on to spin on its memory waits no longer (a sleep would take 50 µs or more,
                // the kernel's timer slack).
                std::thread::yield_now();
                continue;
            }
            // Without waiting for the socket side: an application thread that holds it runs a
            // pass, and the next round sees its poll or gets the side.
            if let Some(mut guard) = core.try_io() {
                let io = guard.as_mut()?;
                bump(&core.stats.covered, 1);
                loop {
                    let release = core.release_held.swap(false, Ordering::AcqRel);
                    if !io.pass(core, core.now(), release, true, false).more {
                        return Some(());
                    }
                }
            }
            // An application thread holds the socket side (its pass runs now, or its thread
            // was preempted in one): look again asleep, a grace later and twice as late each
            // time up to COVER_NAP_MAX. Spinning here, even with `sched_yield`, kept a CPU busy
            // for as long as that pass took while the application thread and the peer shared
            // the other one: the scheduler moves no thread to a CPU that looks busy (64 KiB
            // `write_bw`: this thread at 100 % of one CPU, the polling application and the
            // peer's thread halves of the other, half the rate).
            std::thread::sleep(nap);
            nap = nap.saturating_mul(2).min(COVER_NAP_MAX);
        }
    }

    /// Whether a datagram waits in the socket (a one-byte peek; an error counts as yes, and
    /// the pass that reads it reports it).
    fn datagram_waits(&self) -> bool {
        let mut byte = [0u8; 1];
        match self.peek.peek_from(&mut byte) {
            Ok(_) => true,
            Err(e) => e.kind() != IoKind::WouldBlock,
        }
    }

    /// Runs `f` on the socket side; `None` if it is gone.
    fn with_io<R>(&self, f: impl FnOnce(&mut Io) -> R) -> Option<R> {
        self.core.io().as_mut().map(f)
    }

    /// Waits in the poller until an event or `timeout`.
    fn wait(&mut self, timeout: Option<Duration>) {
        match self.poll.poll(&mut self.events, timeout) {
            Ok(()) => {
                if let Some(timer) = self.timer.as_mut() {
                    if self.events.iter().any(|e| e.token() == timer.token()) {
                        timer.expired();
                    }
                }
            }
            Err(e) if e.kind() == IoKind::Interrupted => {}
            Err(_) => {
                bump(&self.core.stats.recv_errors, 1);
                // Never spin on a broken poller.
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

impl Io {
    /// One pass: receive (if `receive`), the receive-side faults, the engine (datagrams,
    /// timers, up to [`TX_BATCH`] packets out), delivery, the send-side faults and the socket,
    /// all at engine time `now` ([`Core::now`], read once by the caller before the pass).
    /// `release` delivers every held datagram of both directions.
    ///
    /// `hold_acks` (a pass run by an application thread that polls): if everything the engine
    /// had to send is ACKs (or NAKs), they stay in `held_acks` until the caller's next call
    /// on the device, so that the application sees what arrived one `sendto` sooner and its
    /// next request leaves before them (see [`Io::release_acks`]). ACKs held by an earlier
    /// pass always go out in this one, first: an ACK waits one call at most (or, if the
    /// application stops calling, until the progress thread takes over).
    fn pass(
        &mut self,
        core: &Core,
        now: Instant,
        release: bool,
        receive: bool,
        hold_acks: bool,
    ) -> Pass {
        self.refresh_capture(core);
        let held_before = !self.held_acks.is_empty();
        self.staged.append(&mut self.held_acks);
        let rx_more = receive && self.receive(&core.stats);
        self.ingest(core, now, release);
        let received = !self.feed.is_empty() || !self.self_rx.is_empty();
        let mut st = core.lock();
        let DeviceState { hca, mem, .. } = &mut *st;
        for item in self.feed.drain(..) {
            match item {
                Feed::Slice { start, len, src } => {
                    if let Some(bytes) = self.rx.bytes().get(start..start + len) {
                        hca.handle_datagram(now, src, bytes, mem);
                    }
                }
                Feed::Owned(d) => {
                    hca.handle_datagram(now, d.peer, d.bytes(), mem);
                    self.pool.give(d.buf);
                }
            }
        }
        while let Some(p) = self.self_rx.pop_front() {
            hca.handle_datagram(now, self.local, p.bytes(), mem);
            self.pool.give(p.buf);
        }
        if hca.poll_timeout().is_some_and(|t| t <= now) {
            hca.handle_timeout(now, mem);
        }
        // Everything a command made ready so far is pulled now (or left for the next pass).
        core.dirty.store(false, Ordering::SeqCst);
        let pulled = self.pull(hca, mem, now);
        st.deliver();
        let deadline = st.hca.poll_timeout();
        drop(st);
        if hold_acks
            && !held_before
            && pulled == Pull::Drained
            && !self.staged.is_empty()
            && self
                .staged
                .iter()
                .all(|(class, _)| *class == PacketClass::Ack)
        {
            std::mem::swap(&mut self.staged, &mut self.held_acks);
        }
        let sent = !self.staged.is_empty() || !self.held_acks.is_empty();
        core.acks_held
            .store(!self.held_acks.is_empty(), Ordering::Release);
        self.send(core, now, release);
        Pass {
            more: rx_more || pulled == Pull::Full || !self.self_rx.is_empty(),
            deadline: self.next_deadline(deadline),
            moved: received || sent,
        }
    }

    /// Pulls up to [`TX_BATCH`] packets from the engine into `staged`. A backlog waiting for
    /// writability holds back new packets: the engine keeps them (and its window closes)
    /// instead of the queue growing without bound.
    fn pull(&mut self, hca: &mut Hca, mem: &DeviceMemory, now: Instant) -> Pull {
        if self.out.len() >= TX_BATCH {
            return Pull::Blocked;
        }
        for _ in 0..TX_BATCH {
            let mut buf = self.pool.take();
            let Some(tx) = hca.poll_transmit(now, mem, &mut buf) else {
                self.pool.give(buf);
                return Pull::Drained;
            };
            // The engine signs for the socket's port (`HcaConfig::source_port`): its ICRC is
            // final.
            let datagram = Datagram {
                peer: tx.dst,
                buf,
                len: tx.len,
            };
            self.staged.push((tx.class, datagram));
        }
        Pull::Full
    }

    /// Adds the ACKs an application pass held back to what a verbs call pulled: after the
    /// call's own packets if none of them is a response (an ACK only trails requests, never
    /// another response of its QP), before them otherwise.
    fn release_acks(&mut self) {
        if self.held_acks.is_empty() {
            return;
        }
        let responses = self
            .staged
            .iter()
            .any(|(class, _)| *class != PacketClass::Request);
        if responses {
            self.staged.splice(0..0, self.held_acks.drain(..));
        } else {
            self.staged.append(&mut self.held_acks);
        }
    }

    /// Sends what a verbs call pulled, from the caller's thread (due delayed datagrams too,
    /// but no held one is released: the thread does that); true if any packet was pulled.
    fn transmit(&mut self, core: &Core, now: Instant) -> bool {
        if self.staged.is_empty() && self.out.is_empty() {
            return false;
        }
        let pulled = !self.staged.is_empty();
        if pulled {
            self.active = true;
        }
        self.refresh_capture(core);
        self.send(core, now, false);
        pulled
    }

    /// Whether the parked thread must wake for the deadline `engine` (the HCA's next timer)
    /// or one of the fault stages: it is earlier than what the thread sleeps until.
    fn wakes_earlier(&self, engine: Option<Instant>) -> bool {
        match (self.next_deadline(engine), self.sleep_until) {
            (Some(d), Some(until)) => d < until,
            (Some(_), None) => true,
            (None, _) => false,
        }
    }

    /// The earliest of `engine` and the fault stages' next delayed datagram.
    fn next_deadline(&self, engine: Option<Instant>) -> Option<Instant> {
        earliest(
            engine,
            earliest(self.tx_stage.next_due(), self.rx_stage.next_due()),
        )
    }

    /// Re-reads the device's capture if it changed.
    fn refresh_capture(&mut self, core: &Core) {
        let generation = core.capture_gen.load(Ordering::Acquire);
        if generation != self.capture_gen {
            self.capture_gen = generation;
            self.capture = core.capture();
        }
    }

    /// Puts the socket into the thread's poller or takes it out. It stays registered
    /// throughout: out, its interest is empty ([`crate::socket::mute_in_poller`]), so going
    /// out and back in is two `EPOLL_CTL_MOD`s (0.6 µs on the build machine) where
    /// deregistering and registering again took 1.6–1.9 µs. A SEND ping-pong pays one such
    /// pair per message on each side: the poll that finds the answer puts the socket back,
    /// the next empty poll takes it out.
    fn register(&mut self, on: bool) {
        if self.registered == on {
            return;
        }
        let done = if on {
            self.registry
                .reregister(&mut self.socket, SOCKET, interest(self.writable_armed))
                .is_ok()
        } else {
            crate::socket::mute_in_poller(&self.registry, &self.socket, SOCKET.0).is_ok()
        };
        if done {
            self.registered = on;
        }
    }

    /// Reads up to [`RX_BATCH`] datagrams, or [`RX_BATCH`] receive buffers with GRO batches
    /// in them (never split); true if the batch filled (more may be waiting).
    fn receive(&mut self, stats: &AtomicStats) -> bool {
        self.rx_meta.clear();
        let buf_len = self.rx.buf_len();
        let mut datagrams = 0;
        while datagrams < RX_BATCH && self.rx_meta.len() < RX_BUFS {
            let used = self.rx_meta.len();
            bump(&stats.recv_syscalls, 1);
            // Without GRO one buffer is one datagram: never ask for more than the batch needs.
            let count = (RX_BUFS - used).min(RX_BATCH - datagrams).min(RECV_BATCH);
            let rx_meta = &mut self.rx_meta;
            let each = |i: usize, len, stride, src: Option<SocketAddr>| {
                let Some(src) = src else {
                    bump(&stats.recv_errors, 1);
                    return;
                };
                let meta = RxMeta {
                    start: i * buf_len,
                    len,
                    stride,
                    src,
                };
                let segments = meta.segments().count();
                if segments > 1 {
                    bump(&stats.gro_receives, 1);
                }
                datagrams += segments;
                bump(&stats.datagrams_received, segments as u64);
                bump(&stats.bytes_received, len as u64);
                rx_meta.push(meta);
            };
            match self.rx.recv(&self.socket, used, count, each) {
                // Fewer than asked for: the socket had no more.
                Ok(n) if n < count => return false,
                Ok(_) => {}
                Err(e) if e.kind() == IoKind::WouldBlock => return false,
                Err(e) if e.kind() == IoKind::Interrupted => {}
                Err(_) => {
                    bump(&stats.recv_errors, 1);
                    return false;
                }
            }
        }
        true
    }

    /// The receive-side fault stage: turns the received batch, and delayed or held datagrams
    /// now due, into the ordered list the engine is fed.
    fn ingest(&mut self, core: &Core, now: Instant, release: bool) {
        self.feed.clear();
        self.rx_stage.due(now, release, &mut self.rx_owned);
        self.feed.extend(self.rx_owned.drain(..).map(Feed::Owned));
        if self.rx_meta.is_empty() {
            return;
        }
        // Hold the fault configuration only while a receive-side plan is installed.
        let mut cfg = Some(core.faults()).filter(|c| c.active(Direction::Rx));
        // Lock order: the fault configuration, then the capture (never the other way).
        let mut writer = self.capture.as_deref().map(Capture::writer);
        let mut captured = 0;
        for m in &self.rx_meta {
            for (start, len) in m.segments() {
                let Some(bytes) = self.rx.bytes().get(start..start + len) else {
                    continue;
                };
                if let Some(w) = writer.as_mut() {
                    // A member's datagram was written when it was sent.
                    if w.write_received(wall_clock(), m.src, self.local, bytes) {
                        captured += 1;
                    }
                }
                let plan = cfg.as_deref_mut();
                let (owned, pool) = (&mut self.rx_owned, &mut self.pool);
                if self.rx_stage.receive(plan, now, m.src, bytes, owned, pool) {
                    self.feed.push(Feed::Slice {
                        start,
                        len,
                        src: m.src,
                    });
                } else {
                    self.feed.extend(self.rx_owned.drain(..).map(Feed::Owned));
                }
            }
        }
        self.rx_meta.clear();
        bump(&core.stats.captured, captured);
    }

    /// Fault stage, then the socket.
    fn send(&mut self, core: &Core, now: Instant, release: bool) {
        if !self.staged.is_empty() {
            let mut cfg = core.faults();
            for (_, s) in self.staged.drain(..) {
                self.tx_stage.apply(
                    &mut cfg,
                    Direction::Tx,
                    now,
                    s,
                    &mut self.out,
                    &mut self.pool,
                );
            }
        }
        self.tx_stage.due(now, release, &mut self.out);
        self.flush(core);
    }

    /// Writes the queued packets to the socket, in order, until it is empty or full.
    fn flush(&mut self, core: &Core) {
        let stats = &core.stats;
        while let Some(p) = self.out.front() {
            if p.peer == self.local {
                if let Some(p) = self.out.pop_front() {
                    bump(&stats.loopback, 1);
                    self.self_rx.push_back(p);
                }
                continue;
            }
            let run = if self.gso {
                gso_run(&self.out, self.gso_segments, GSO_MAX_BYTES)
            } else {
                1
            };
            let (dst, seg) = (p.peer, p.len);
            bump(&stats.send_syscalls, 1);
            let result = if run > 1 {
                self.send_run(run, dst, seg)
            } else {
                self.socket.send_to(p.bytes(), dst)
            };
            match result {
                Ok(n) => {
                    bump(&stats.datagrams_sent, run as u64);
                    bump(&stats.bytes_sent, n as u64);
                    if run > 1 {
                        bump(&stats.gso_sends, 1);
                    }
                    let mut writer = self.capture.as_deref().map(Capture::writer);
                    for _ in 0..run {
                        let Some(p) = self.out.pop_front() else {
                            break;
                        };
                        if let Some(w) = writer.as_mut() {
                            if w.write(wall_clock(), self.local, p.peer, p.bytes()) {
                                bump(&stats.captured, 1);
                            }
                        }
                        self.pool.give(p.buf);
                    }
                }
                Err(e) if e.kind() == IoKind::WouldBlock => {
                    bump(&stats.send_would_block, 1);
                    self.arm_writable(true);
                    return;
                }
                Err(e) if e.kind() == IoKind::Interrupted => {}
                Err(e) if run > 1 && matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL)) => {
                    // The kernel (or the device) has no segmentation offload for this path:
                    // send everything one by one from now on, starting with this run.
                    bump(&stats.gso_refused, 1);
                    self.gso = false;
                    core.gso_active.store(false, Ordering::Release);
                }
                Err(_) => {
                    bump(&stats.send_errors, 1);
                    for _ in 0..run {
                        if let Some(p) = self.out.pop_front() {
                            self.pool.give(p.buf);
                        }
                    }
                }
            }
        }
        self.arm_writable(false);
    }

    /// Sends the first `run` queued datagrams (all to `dst`, each `seg` bytes but the last,
    /// which may be shorter: a [`gso_run`]) in one GSO `sendmsg`, straight from their buffers.
    fn send_run(&self, run: usize, dst: SocketAddr, seg: usize) -> std::io::Result<usize> {
        let seg = u16::try_from(seg).map_err(|_| std::io::Error::from(IoKind::InvalidInput))?;
        let mut iov = [IoSlice::new(&[]); GSO_MAX_SEGMENTS];
        let mut n = 0;
        for (slot, q) in iov.iter_mut().zip(self.out.iter().take(run)) {
            *slot = IoSlice::new(q.bytes());
            n += 1;
        }
        crate::socket::send_gso(&self.socket, dst, &iov[..n], seg)
    }

    /// Asks the poller for writability (a backlog waits) or stops asking. Out of the poller,
    /// it is only noted for when the socket goes back in.
    fn arm_writable(&mut self, on: bool) {
        if self.writable_armed == on {
            return;
        }
        if !self.registered {
            self.writable_armed = on;
            return;
        }
        if self
            .registry
            .reregister(&mut self.socket, SOCKET, interest(on))
            .is_ok()
        {
            self.writable_armed = on;
        }
    }
}

/// The poller interest of the socket: readable, and writable while a backlog waits.
fn interest(writable: bool) -> Interest {
    if writable {
        Interest::READABLE | Interest::WRITABLE
    } else {
        Interest::READABLE
    }
}

/// How many datagrams at the front of `out` one GSO send can carry: a run to one destination
/// whose datagrams all have the first one's length, except that the last may be shorter, at
/// most `max_segments` of them and `max_bytes` in all (at least 1: the front itself).
fn gso_run(out: &VecDeque<Datagram>, max_segments: usize, max_bytes: usize) -> usize {
    let Some(first) = out.front() else {
        return 0;
    };
    let (mut count, mut total) = (1, first.len);
    for p in out.iter().skip(1) {
        if count == max_segments
            || p.peer != first.peer
            || p.len > first.len
            || p.len == 0
            || total + p.len > max_bytes
        {
            break;
        }
        count += 1;
        total += p.len;
        if p.len < first.len {
            break;
        }
    }
    count
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Instant as WallClock;

    use emu_proto::MAX_PACKET_LEN;
    use verbs_api::{
        AccessFlags, CompletionQueue, Context, Device, MemoryRegion, Mtu, Provider, QpCap,
        QpInitAttr, QueuePair, RcConnectOptions, SendOp, SendWr, WcStatus, WorkCompletion,
        connect_rc,
    };

    use super::*;

    fn d(peer: &str, len: usize) -> Datagram {
        Datagram {
            peer: peer.parse().unwrap(),
            buf: vec![0; MAX_PACKET_LEN],
            len,
        }
    }

    #[test]
    fn gso_runs_are_equal_sized_datagrams_to_one_peer() {
        let (x, y) = ("127.0.0.1:1", "127.0.0.2:2");
        let run = |q: &[Datagram], segs, bytes| {
            let q: VecDeque<Datagram> = q.iter().map(|p| d(&p.peer.to_string(), p.len)).collect();
            gso_run(&q, segs, bytes)
        };
        assert_eq!(run(&[], 64, GSO_MAX_BYTES), 0);
        assert_eq!(run(&[d(x, 100)], 64, GSO_MAX_BYTES), 1);
        // Equal sizes, then a shorter last one ends the run.
        let q = [d(x, 100), d(x, 100), d(x, 60), d(x, 100)];
        assert_eq!(run(&q, 64, GSO_MAX_BYTES), 3);
        // A longer one, or another peer, ends it before.
        assert_eq!(run(&[d(x, 100), d(x, 101)], 64, GSO_MAX_BYTES), 1);
        assert_eq!(run(&[d(x, 100), d(y, 100)], 64, GSO_MAX_BYTES), 1);
        // Bounded by segments and bytes.
        let q: Vec<Datagram> = (0..100).map(|_| d(x, 4112)).collect();
        assert_eq!(run(&q, 64, GSO_MAX_BYTES), GSO_MAX_BYTES / 4112);
        assert_eq!(run(&q, 4, GSO_MAX_BYTES), 4);
        assert_eq!(run(&q[..3], 64, GSO_MAX_BYTES), 3);
        // An empty datagram never joins a run.
        assert_eq!(run(&[d(x, 100), d(x, 0)], 64, GSO_MAX_BYTES), 1);
    }

    fn wait(cq: &crate::UdpCq) -> WorkCompletion {
        let deadline = WallClock::now() + Duration::from_secs(10);
        let mut wc = [WorkCompletion::default()];
        while WallClock::now() < deadline {
            if cq.poll(&mut wc).unwrap() == 1 {
                return wc[0];
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("no completion in time");
    }

    /// The kernel refuses every GSO send of a socket with `SO_NO_CHECK` (`EINVAL`): the first
    /// refusal turns GSO off, and every datagram still arrives, one per call.
    #[test]
    fn a_refused_gso_send_falls_back_to_one_datagram_per_call() {
        let p = crate::UdpProvider::builder()
            .device("127.0.0.91:0".parse().unwrap())
            .device("127.0.0.92:0".parse().unwrap())
            .gso(true)
            .no_udp_checksum()
            .build()
            .unwrap();
        let devs = p.devices().unwrap();
        let (ca, cb) = (devs[0].open().unwrap(), devs[1].open().unwrap());
        if !ca.socket_info().gso_enabled {
            eprintln!("SKIP: this kernel has no UDP GSO ({:?})", ca.socket_info());
            return;
        }
        let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let cap = QpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let side = |ctx: &crate::UdpContext| {
            let pd = ctx.alloc_pd().unwrap();
            let cq = ctx.create_cq(16, None).unwrap();
            let qp = ctx
                .create_qp(&pd, &cq, &cq, None, &QpInitAttr::rc(cap))
                .unwrap();
            let mr = ctx.alloc_mr(&pd, 64 * 1024, all).unwrap();
            (pd, cq, qp, mr)
        };
        let (_pda, cqa, qpa, mra) = side(&ca);
        let (_pdb, _cqb, qpb, mrb) = side(&cb);
        let opts = RcConnectOptions {
            path_mtu: Mtu::Mtu1024,
            ..RcConnectOptions::default()
        };
        connect_rc(&qpa, 1, &qpb.endpoint(2).unwrap(), &opts).unwrap();
        connect_rc(&qpb, 2, &qpa.endpoint(1).unwrap(), &opts).unwrap();
        let data: Vec<u8> = (0..64 * 1024).map(|i| (i * 7 % 251) as u8).collect();
        mra.write(0, &data).unwrap();
        let op = SendOp::RdmaWrite {
            remote_addr: mrb.addr(),
            rkey: mrb.rkey(),
        };
        qpa.post_send(&[SendWr::new(1, op, &[mra.sge(0, data.len()).unwrap()])])
            .unwrap();
        assert_eq!(wait(&cqa).status, WcStatus::Success);
        let mut got = vec![0; data.len()];
        mrb.read(0, &mut got).unwrap();
        assert!(got == data, "WRITE data differs");
        let s = ca.driver_stats();
        assert_eq!(s.gso_refused, 1, "{s:?}");
        assert_eq!(s.gso_sends, 0, "{s:?}");
        assert_eq!(s.send_errors, 0, "{s:?}");
        // The refused call, then one call per datagram.
        assert!(s.send_syscalls > s.datagrams_sent, "{s:?}");
        assert!(!ca.socket_info().gso_enabled);
        p.shutdown();
    }
}
