//! The progress engine of one device: the HCA behind a mutex, and the thread that moves its
//! packets and timers.
//!
//! Application threads lock [`Core`] briefly to run a verbs command on the HCA, then ring the
//! doorbell (a [`mio::Waker`]) if the thread is parked. The thread loops:
//!
//! 1. receive up to [`RX_BATCH`] datagrams (nonblocking `recv_from` until `WouldBlock`);
//! 2. with the lock held: feed them to [`Hca::handle_datagram`], fire due timers, pull up to
//!    [`TX_BATCH`] packets from [`Hca::poll_transmit`], deliver channel notifications and async
//!    events, read the next timer deadline;
//! 3. without the lock: rewrite each packet's ICRC for the socket's real source port, pass it
//!    through the fault stage, and `send_to` (on `WouldBlock` the packet stays queued, the socket
//!    is armed for writability and no new packet is pulled until it drains);
//! 4. wait in [`Poll::poll`] until a datagram, the doorbell, writability or the next deadline
//!    (engine timer or delayed datagram) — or not at all if a batch limit left work behind, or
//!    in busy-poll mode.
//!
//! Batching hook: steps 1 and 3 are where GSO/GRO (`UDP_SEGMENT`, `UDP_GRO`) or
//! `sendmmsg`/`recvmmsg` plug in later (the perf issue): the receive loop fills `rx` buffers
//! and the send loop drains `out`, so a batched implementation replaces only those two
//! functions.
//!
//! Datagrams addressed to the device itself skip the socket (rxe's loopback) and are fed back
//! on the next iteration.

use std::collections::{HashMap, VecDeque};
use std::io::ErrorKind as IoKind;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant as StdInstant};

use emu_proto::wire::IpContext;
use emu_proto::wire::fill_icrc;
use emu_proto::{ChannelId, Hca, HcaConfig, Instant, MAX_PACKET_LEN};
use emu_sim::internals::ChannelShared;
use mio::net::UdpSocket;
use mio::{Events, Interest, Poll, Token, Waker};
use verbs_api::{Error, ErrorKind, Result};

use crate::fault::{FaultConfig, FaultStage, OutPacket};
use crate::socket::SocketInfo;
use emu_sim::internals::NodeMemory as DeviceMemory;

/// Datagrams received per loop iteration at most (the bound on work per wake-up).
pub const RX_BATCH: usize = 64;
/// Packets pulled from the engine per loop iteration at most.
pub const TX_BATCH: usize = 64;
/// Receive buffer per datagram: larger than any packet the engine builds, so a longer datagram
/// arrives truncated and fails its ICRC check.
const RX_BUF_LEN: usize = 16 * 1024;
/// Spare packet buffers kept for reuse.
const POOL_MAX: usize = 4 * TX_BATCH;

const SOCKET: Token = Token(0);
const DOORBELL: Token = Token(1);

/// Counters of the driver itself (the transport's are [`emu_proto::Stats`]).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DriverStats {
    /// Iterations of the progress loop (each wake-up counts one).
    pub wakeups: u64,
    /// Datagrams read from the socket.
    pub datagrams_received: u64,
    /// Bytes read from the socket.
    pub bytes_received: u64,
    /// Datagrams written to the socket.
    pub datagrams_sent: u64,
    /// Bytes written to the socket.
    pub bytes_sent: u64,
    /// Datagrams the device sent to itself without the socket.
    pub loopback: u64,
    /// `send_to` calls that found the socket buffer full (the packet was kept and retried).
    pub send_would_block: u64,
    /// `send_to` calls that failed otherwise (the packet was lost; the transport retries).
    pub send_errors: u64,
    /// `recv_from` or `poll` calls that failed other than `WouldBlock`/`EINTR`.
    pub recv_errors: u64,
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
}

fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

/// Everything an application command may touch, behind the device mutex.
#[derive(Debug)]
pub(crate) struct DevState {
    pub(crate) hca: Hca,
    pub(crate) mem: DeviceMemory,
    pub(crate) channels: HashMap<ChannelId, Arc<ChannelShared>>,
    pub(crate) events: emu_proto::EventRouter,
    /// The latest `now` handed to the HCA: engine time never goes backwards.
    last_now: Instant,
    /// The thread is about to wait (or waits): the next command must ring the doorbell.
    parked: bool,
}

impl DevState {
    fn now(&mut self, epoch: StdInstant) -> Instant {
        self.last_now = self.last_now.max(clock(epoch));
        self.last_now
    }

    /// Hands what the HCA produced to the application side: channel notifications (the fd
    /// becomes readable) and async events.
    fn deliver(&mut self) {
        while let Some(n) = self.hca.poll_notification() {
            if let Some(ch) = self.channels.get(&n.channel) {
                ch.signal(n.cq.0);
                self.hca.cq_event_delivered(n.cq);
            }
        }
        while let Some(e) = self.hca.poll_event() {
            self.events.route(e);
        }
    }
}

/// Engine time: nanoseconds since the device was created.
fn clock(epoch: StdInstant) -> Instant {
    Instant::from_nanos(u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX))
}

/// The state shared by the application and the progress thread of one device.
#[derive(Debug)]
pub(crate) struct Core {
    state: Mutex<DevState>,
    waker: Waker,
    epoch: StdInstant,
    pub(crate) info: SocketInfo,
    stop: AtomicBool,
    busy: AtomicBool,
    release_held: AtomicBool,
    stats: AtomicStats,
    faults: Mutex<FaultConfig>,
}

impl Core {
    fn lock(&self) -> MutexGuard<'_, DevState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The fault configuration (plan and node numbers).
    pub(crate) fn faults(&self) -> MutexGuard<'_, FaultConfig> {
        self.faults.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs a command that may give the thread work (post, modify, arm, destroy): the lock is
    /// held only for `f`, then produced notifications are delivered and the doorbell rung if
    /// the thread is parked.
    pub(crate) fn command<R>(&self, f: impl FnOnce(&mut DevState, Instant) -> R) -> R {
        let mut st = self.lock();
        let now = st.now(self.epoch);
        let r = f(&mut st, now);
        st.deliver();
        let ring = std::mem::take(&mut st.parked);
        drop(st);
        if ring {
            self.ring();
        }
        r
    }

    /// Runs a command that gives the thread no work (queries, polling a CQ).
    pub(crate) fn query<R>(&self, f: impl FnOnce(&mut DevState) -> R) -> R {
        let mut st = self.lock();
        let r = f(&mut st);
        st.deliver();
        r
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

    pub(crate) fn release_held(&self) {
        self.release_held.store(true, Ordering::Release);
        self.ring();
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
        }
    }
}

/// A running device: its [`Core`] and progress thread. Dropping it stops and joins the thread,
/// which closes the socket.
#[derive(Debug)]
pub(crate) struct Engine {
    pub(crate) core: Arc<Core>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Engine {
    /// Starts the progress thread of a device whose socket is already bound.
    pub(crate) fn start(
        mut socket: UdpSocket,
        info: SocketInfo,
        config: HcaConfig,
        faults: FaultConfig,
        busy_poll: bool,
    ) -> Result<Engine> {
        let name = config.name.clone();
        let io = |what: &str, e: std::io::Error| {
            Error::new(ErrorKind::Io, format!("{name}: {what}: {e}"))
        };
        let poll = Poll::new().map_err(|e| io("creating the poller", e))?;
        poll.registry()
            .register(&mut socket, SOCKET, Interest::READABLE)
            .map_err(|e| io("registering the socket", e))?;
        let waker =
            Waker::new(poll.registry(), DOORBELL).map_err(|e| io("creating the doorbell", e))?;
        let core = Arc::new(Core {
            state: Mutex::new(DevState {
                hca: Hca::new(config),
                mem: DeviceMemory::default(),
                channels: HashMap::new(),
                events: emu_proto::EventRouter::default(),
                last_now: Instant::ZERO,
                parked: false,
            }),
            waker,
            epoch: StdInstant::now(),
            info,
            stop: AtomicBool::new(false),
            busy: AtomicBool::new(busy_poll),
            release_held: AtomicBool::new(false),
            stats: AtomicStats::default(),
            faults: Mutex::new(faults),
        });
        let progress = Progress {
            core: core.clone(),
            poll,
            events: Events::with_capacity(8),
            local: info.local_addr,
            socket,
            rx: (0..RX_BATCH).map(|_| vec![0; RX_BUF_LEN]).collect(),
            rx_meta: Vec::with_capacity(RX_BATCH),
            staged: Vec::with_capacity(TX_BATCH),
            out: VecDeque::new(),
            self_rx: VecDeque::new(),
            pool: Vec::new(),
            stage: FaultStage::default(),
            writable_armed: false,
        };
        let thread = std::thread::Builder::new()
            .name(format!("softverbs-{name}"))
            .spawn(move || progress.run())
            .map_err(|e| io("starting the progress thread", e))?;
        Ok(Engine {
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

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The progress thread's own state.
struct Progress {
    core: Arc<Core>,
    poll: Poll,
    events: Events,
    socket: UdpSocket,
    local: SocketAddr,
    /// Receive buffers, one per datagram of a batch.
    rx: Vec<Vec<u8>>,
    /// Length and source of each received datagram of the current batch.
    rx_meta: Vec<(usize, SocketAddr)>,
    /// Packets pulled from the engine in this iteration, before the fault stage.
    staged: Vec<OutPacket>,
    /// Packets to write to the socket, in order.
    out: VecDeque<OutPacket>,
    /// Packets the device sent to itself, fed back next iteration.
    self_rx: VecDeque<OutPacket>,
    pool: Vec<Vec<u8>>,
    stage: FaultStage,
    writable_armed: bool,
}

impl Progress {
    fn run(mut self) {
        while !self.core.is_stopped() {
            bump(&self.core.stats.wakeups, 1);
            let rx_more = self.receive();
            let (tx_more, now, deadline) = self.step();
            self.send(now);
            if self.core.busy_poll() {
                std::hint::spin_loop();
                continue;
            }
            let more = rx_more || tx_more || !self.self_rx.is_empty();
            let timeout = if more {
                Some(Duration::ZERO)
            } else {
                deadline
                    .into_iter()
                    .chain(self.stage.next_due())
                    .min()
                    .map(|at| at.saturating_duration_since(clock(self.core.epoch)))
            };
            match self.poll.poll(&mut self.events, timeout) {
                Ok(()) => {}
                Err(e) if e.kind() == IoKind::Interrupted => {}
                Err(_) => {
                    bump(&self.core.stats.recv_errors, 1);
                    // Never spin on a broken poller.
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }

    /// Reads up to [`RX_BATCH`] datagrams; true if the batch filled (more may be waiting).
    fn receive(&mut self) -> bool {
        self.rx_meta.clear();
        while self.rx_meta.len() < RX_BATCH {
            let Some(buf) = self.rx.get_mut(self.rx_meta.len()) else {
                break;
            };
            match self.socket.recv_from(buf) {
                Ok((len, src)) => {
                    bump(&self.core.stats.datagrams_received, 1);
                    bump(&self.core.stats.bytes_received, len as u64);
                    self.rx_meta.push((len, src));
                }
                Err(e) if e.kind() == IoKind::WouldBlock => return false,
                Err(e) if e.kind() == IoKind::Interrupted => {}
                Err(_) => {
                    bump(&self.core.stats.recv_errors, 1);
                    return false;
                }
            }
        }
        true
    }

    /// Runs the engine under the lock; returns whether the transmit batch filled, the engine
    /// time used, and the next timer deadline.
    fn step(&mut self) -> (bool, Instant, Option<Instant>) {
        let core = &*self.core;
        let mut st = core.lock();
        let now = st.now(core.epoch);
        let DevState { hca, mem, .. } = &mut *st;
        for (&(len, src), buf) in self.rx_meta.iter().zip(&self.rx) {
            if let Some(bytes) = buf.get(..len) {
                hca.handle_datagram(now, src, bytes, mem);
            }
        }
        while let Some(p) = self.self_rx.pop_front() {
            hca.handle_datagram(now, self.local, &p.bytes, mem);
            recycle(&mut self.pool, p.bytes);
        }
        if hca.poll_timeout().is_some_and(|t| t <= now) {
            hca.handle_timeout(now, mem);
        }
        let mut more = false;
        // A backlog waiting for writability holds back new packets: the engine keeps them
        // (and its window closes) instead of this queue growing without bound.
        if self.out.len() < TX_BATCH {
            let mut pulled = 0;
            while pulled < TX_BATCH {
                let mut buf = self.pool.pop().unwrap_or_default();
                buf.resize(MAX_PACKET_LEN, 0);
                let Some(tx) = hca.poll_transmit(now, mem, &mut buf) else {
                    recycle(&mut self.pool, buf);
                    break;
                };
                buf.truncate(tx.len);
                self.staged.push(OutPacket {
                    dst: tx.dst,
                    bytes: buf,
                });
                pulled += 1;
            }
            more = pulled == TX_BATCH;
        }
        st.deliver();
        let deadline = st.hca.poll_timeout();
        st.parked = true;
        (more, now, deadline)
    }

    /// Fault stage, then the socket.
    fn send(&mut self, now: Instant) {
        for p in &mut self.staged {
            refill_icrc(self.local, p);
        }
        if !self.staged.is_empty() {
            let mut cfg = self.core.faults();
            for p in self.staged.drain(..) {
                self.stage
                    .apply(&mut cfg, now, p, &mut self.out, &mut self.pool);
            }
        }
        let release = self.core.release_held.swap(false, Ordering::AcqRel);
        self.stage.due(now, release, &mut self.out);
        let stats = &self.core.stats;
        while let Some(p) = self.out.front() {
            if p.dst == self.local {
                if let Some(p) = self.out.pop_front() {
                    bump(&stats.loopback, 1);
                    self.self_rx.push_back(p);
                }
                continue;
            }
            match self.socket.send_to(&p.bytes, p.dst) {
                Ok(n) => {
                    bump(&stats.datagrams_sent, 1);
                    bump(&stats.bytes_sent, n as u64);
                    if let Some(p) = self.out.pop_front() {
                        recycle(&mut self.pool, p.bytes);
                    }
                }
                Err(e) if e.kind() == IoKind::WouldBlock => {
                    bump(&stats.send_would_block, 1);
                    self.arm_writable(true);
                    return;
                }
                Err(e) if e.kind() == IoKind::Interrupted => {}
                Err(_) => {
                    bump(&stats.send_errors, 1);
                    if let Some(p) = self.out.pop_front() {
                        recycle(&mut self.pool, p.bytes);
                    }
                }
            }
        }
        self.arm_writable(false);
    }

    fn arm_writable(&mut self, on: bool) {
        if self.writable_armed == on {
            return;
        }
        let interest = if on {
            Interest::READABLE | Interest::WRITABLE
        } else {
            Interest::READABLE
        };
        if self
            .poll
            .registry()
            .reregister(&mut self.socket, SOCKET, interest)
            .is_ok()
        {
            self.writable_armed = on;
        }
    }
}

fn recycle(pool: &mut Vec<Vec<u8>>, buf: Vec<u8>) {
    if pool.len() < POOL_MAX {
        pool.push(buf);
    }
}

/// Recomputes the ICRC for the headers the packet really travels in: the engine signs it with
/// the per-QP-pair source port of RoCEv2 (rc-transport.md §1.9), but a datagram sent from the
/// device's one socket carries the socket's port, and the ICRC covers the UDP source port.
fn refill_icrc(local: SocketAddr, p: &mut OutPacket) {
    // The engine cannot address another family; then the packet stays as built.
    let Some(ip) = IpContext::between(local, p.dst) else {
        return;
    };
    // Fails only for a packet shorter than BTH + ICRC, which the engine never builds.
    let _ = fill_icrc(&ip, &mut p.bytes);
}
