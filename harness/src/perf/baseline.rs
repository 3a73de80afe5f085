//! The raw UDP baseline: the same sizes and pattern as the verbs run, between the same two
//! processes and IP addresses, with the best syscall strategy available.
//!
//! * Bandwidth: each message is cut into datagrams of at most the path MTU, as the emulator
//!   cuts it into packets, and sent one way as fast as the sender can: with UDP GSO
//!   (`UDP_SEGMENT`, up to 64 segments and 65,507 bytes per `sendmsg`) to a receiver with UDP
//!   GRO (`UDP_GRO`), through `quinn-udp`, which sets the socket options and control messages
//!   safely; and without GSO, one datagram per `sendmsg`, received with `recvmmsg` (up to
//!   [`quinn_udp::BATCH_SIZE`] datagrams per call) — the system calls softverbs itself makes
//!   with `--no-gso`. Both receivers read [`quinn_udp::BATCH_SIZE`] buffers per call, as the
//!   devices do, and wait as they do (epoll, then read until the socket is empty; or spin
//!   with `--busy-poll`). Loopback never blocks the sender, so the rate is taken at the receiver
//!   (payload bytes from the start signal to the last datagram) and drops are counted. Each
//!   side's process CPU time (all threads) over each strategy is recorded, for bytes moved
//!   per CPU-second.
//! * Latency: a ping-pong of `size`-byte datagrams (READ/atomics: a 16-byte request and a
//!   `size`- or 8-byte answer) in the poll mode of the verbs run it is compared with: spinning
//!   on a nonblocking socket when the application spins (every `write_lat`, and the other
//!   tests without `-e`) or the devices busy-poll; blocking receives otherwise.

use std::io::{ErrorKind as IoKind, IoSliceMut};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd as _;
use std::time::{Duration, Instant};

use quinn_udp::{BATCH_SIZE, RecvMeta, Transmit, UdpSocketState};
use serde::Serialize;

use super::cpu;
use super::ctl::Ctl;
use super::stats::{self, BwUnit, LatResult};
use super::{Config, PerfError, Verb};

/// Socket buffers asked for (the kernel caps at net.core.{r,w}mem_max).
const SOCKET_BUFFER: usize = 64 << 20;
/// The largest UDP payload of one IPv4 datagram (and so of one GSO send).
const MAX_UDP_PAYLOAD: usize = 65_507;
/// How long a receiver waits for the first datagram, and then between datagrams.
const FIRST_WAIT: Duration = Duration::from_secs(5);
const IDLE_WAIT: Duration = Duration::from_millis(200);
/// A lost ping-pong datagram ends the baseline run after this.
const PING_WAIT: Duration = Duration::from_secs(1);
/// One receive buffer: room for a full GRO batch (at most 64 KiB of UDP payload).
const RX_BUF: usize = 64 * 1024;

/// One side's baseline sockets: one with GSO/GRO state, one without segmentation offload
/// (`plain`: one datagram per send, `recvmmsg` batches on receive).
pub(crate) struct Endpoint {
    gso: UdpSocket,
    state: UdpSocketState,
    plain: UdpSocket,
    plain_state: UdpSocketState,
    peer_gso: Option<SocketAddr>,
    peer_plain: Option<SocketAddr>,
    /// Bandwidth receivers spin on a nonblocking socket (`--busy-poll`).
    busy: bool,
    /// The latency ping-pong spins (the verbs run it is compared with spins).
    ping_spin: bool,
    /// [`BATCH_SIZE`] receive buffers of [`RX_BUF`] bytes, back to back.
    buf: Vec<u8>,
    /// Readiness of both sockets (tokens [`GSO`] and [`PLAIN`]) for blocking receivers.
    poll: mio::Poll,
    events: mio::Events,
}

/// Poll tokens of the two sockets.
const GSO: mio::Token = mio::Token(0);
const PLAIN: mio::Token = mio::Token(1);

fn socket(ip: IpAddr) -> Result<UdpSocket, PerfError> {
    let sock = UdpSocket::bind(SocketAddr::new(ip, 0))
        .map_err(|e| PerfError::run(format!("baseline: binding UDP on {ip}: {e}")))?;
    let s2 = socket2::SockRef::from(&sock);
    let _ = s2.set_recv_buffer_size(SOCKET_BUFFER);
    let _ = s2.set_send_buffer_size(SOCKET_BUFFER);
    Ok(sock)
}

impl Endpoint {
    /// Binds both sockets on `ip` (OS-chosen ports).
    pub(crate) fn bind(ip: IpAddr, cfg: &Config) -> Result<Endpoint, PerfError> {
        let gso = socket(ip)?;
        let state = UdpSocketState::new((&gso).into())
            .map_err(|e| PerfError::run(format!("baseline: GSO/GRO socket state: {e}")))?;
        let plain = socket(ip)?;
        // Sends on this socket never ask for segmentation; the state gives it `recvmmsg`.
        // (Its UDP_GRO, if any, has nothing to merge: loopback hands unsegmented datagrams
        // over one by one.)
        let plain_state = UdpSocketState::new((&plain).into())
            .map_err(|e| PerfError::run(format!("baseline: socket state: {e}")))?;
        let poll = mio::Poll::new()?;
        for (sock, token) in [(&gso, GSO), (&plain, PLAIN)] {
            poll.registry().register(
                &mut mio::unix::SourceFd(&sock.as_raw_fd()),
                token,
                mio::Interest::READABLE,
            )?;
        }
        Ok(Endpoint {
            gso,
            state,
            plain,
            plain_state,
            peer_gso: None,
            peer_plain: None,
            busy: cfg.busy_poll,
            ping_spin: ping_spins(cfg),
            buf: vec![0; RX_BUF * BATCH_SIZE],
            poll,
            events: mio::Events::with_capacity(4),
        })
    }

    /// How the latency ping-pong waits: `"spin"` or `"block"`.
    pub(crate) fn ping_mode(&self) -> &'static str {
        if self.ping_spin { "spin" } else { "block" }
    }

    /// Tells the peer our addresses and learns its.
    pub(crate) fn exchange(&mut self, ctl: &mut dyn Ctl) -> Result<(), PerfError> {
        ctl.send(&format!(
            "udp {} {}",
            self.gso.local_addr()?,
            self.plain.local_addr()?
        ))?;
        let line = ctl.expect("udp")?;
        let mut it = line.split_whitespace().map(str::parse::<SocketAddr>);
        match (it.next(), it.next()) {
            (Some(Ok(g)), Some(Ok(p))) => {
                self.peer_gso = Some(g);
                self.peer_plain = Some(p);
                Ok(())
            }
            _ => Err(PerfError::run(format!("bad baseline addresses {line:?}"))),
        }
    }

    fn peers(&self) -> Result<(SocketAddr, SocketAddr), PerfError> {
        match (self.peer_gso, self.peer_plain) {
            (Some(g), Some(p)) => Ok((g, p)),
            _ => Err(PerfError::run("baseline: peer addresses not exchanged")),
        }
    }

    /// Segments per GSO send for `seg`-byte datagrams; 1 without GSO.
    fn gso_batch(&self, seg: usize) -> usize {
        self.state
            .max_gso_segments()
            .min(64)
            .min(MAX_UDP_PAYLOAD / seg.max(1))
            .max(1)
    }

    fn gso_available(&self) -> bool {
        self.state.max_gso_segments() > 1 && self.state.gro_segments() > 1
    }

    /// Bandwidth baseline, client side; returns every strategy's result.
    pub(crate) fn bw_client(
        &mut self,
        ctl: &mut dyn Ctl,
        cfg: &Config,
        size: u64,
        messages: u64,
    ) -> Result<BwBaseline, PerfError> {
        ctl.send(&format!("blbw {messages}"))?;
        self.bw_common(ctl, cfg, size, messages, true)
    }

    /// Bandwidth baseline, server side.
    pub(crate) fn bw_server(
        &mut self,
        ctl: &mut dyn Ctl,
        cfg: &Config,
        size: u64,
    ) -> Result<(), PerfError> {
        let messages: u64 = ctl
            .expect("blbw")?
            .parse()
            .map_err(|_| PerfError::run("bad baseline message count"))?;
        self.bw_common(ctl, cfg, size, messages, false)?;
        Ok(())
    }

    fn bw_common(
        &mut self,
        ctl: &mut dyn Ctl,
        cfg: &Config,
        size: u64,
        messages: u64,
        is_client: bool,
    ) -> Result<BwBaseline, PerfError> {
        // READ moves data from the server to the client; everything else the other way.
        let client_sends = cfg.test.verb() != Verb::Read;
        let sending = client_sends == is_client;
        let seg = usize::try_from(size.min(u64::from(cfg.mtu)))
            .unwrap_or(1)
            .max(1);
        let size_us = usize::try_from(size).unwrap_or(usize::MAX);
        let shape = Shape {
            seg,
            full: size_us / seg,
            rem: size_us % seg,
            messages,
        };
        let gso = self.gso_available();
        let mut out = BwBaseline {
            gso_available: gso,
            strategies: Vec::new(),
        };
        let strategies: &[&str] = if gso {
            &["gso_gro", "no_gso"]
        } else {
            &["no_gso"]
        };
        for &name in strategies {
            self.drain()?;
            ctl.sync(&format!("bl {name}"))?;
            let cpu_start = cpu::process_seconds();
            let (bytes, datagrams, secs) = if sending {
                if name == "gso_gro" {
                    self.send_gso(&shape)?;
                } else {
                    self.send_plain(&shape)?;
                }
                let res = ctl.expect("blres")?;
                let v: Vec<f64> = res
                    .split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect();
                match v[..] {
                    [b, d, s] => (b, d, s),
                    _ => return Err(PerfError::run(format!("bad baseline result {res:?}"))),
                }
            } else {
                let (b, d, s) = self.receive(name == "gso_gro", shape.bytes())?;
                ctl.send(&format!("blres {b} {d} {s}"))?;
                (b as f64, d as f64, s)
            };
            let cpu_local = cpu::process_seconds() - cpu_start;
            let cpu_peer = cpu::exchange(ctl, &format!("bl {name}"), cpu_local)?;
            let expected = shape.datagrams() as f64;
            out.strategies.push(Strategy {
                name,
                cpu: cpu::Use::new(bytes, is_client, cpu_local, cpu_peer),
                bytes_per_sec: if secs > 0.0 { bytes / secs } else { 0.0 },
                bytes_received: bytes as u64,
                datagrams_expected: expected as u64,
                datagrams_received: datagrams as u64,
                dropped_pct: if expected > 0.0 {
                    (100.0 * (1.0 - datagrams / expected)).max(0.0)
                } else {
                    0.0
                },
            });
        }
        Ok(out)
    }

    /// Throws away anything left in the receive queues.
    fn drain(&mut self) -> Result<(), PerfError> {
        for s in [&self.gso, &self.plain] {
            s.set_nonblocking(true)?;
            while s.recv_from(&mut self.buf[..RX_BUF]).is_ok() {}
        }
        Ok(())
    }

    fn send_gso(&mut self, shape: &Shape) -> Result<u64, PerfError> {
        let (dst, _) = self.peers()?;
        self.gso.set_nonblocking(false)?;
        let cap = self.gso_batch(shape.seg);
        let payload = vec![0x5au8; cap * shape.seg];
        let mut sent = 0u64;
        let mut batch = 0usize; // full segments pending
        let send = |len: usize, seg: usize| -> Result<(), PerfError> {
            let t = Transmit {
                destination: dst,
                ecn: None,
                contents: &payload[..len],
                segment_size: (len > seg).then_some(seg),
                src_ip: None,
            };
            loop {
                match self.state.try_send((&self.gso).into(), &t) {
                    Ok(()) => return Ok(()),
                    Err(e) if matches!(e.kind(), IoKind::WouldBlock | IoKind::Interrupted) => {}
                    // ENOBUFS and the like: the datagrams are lost, as on a full socket.
                    Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => return Ok(()),
                    Err(e) => return Err(PerfError::run(format!("baseline GSO send: {e}"))),
                }
            }
        };
        for _ in 0..shape.messages {
            for _ in 0..shape.full {
                batch += 1;
                sent += 1;
                if batch == cap {
                    send(batch * shape.seg, shape.seg)?;
                    batch = 0;
                }
            }
            if shape.rem > 0 {
                // A shorter datagram may only end a GSO batch.
                if batch + 1 > cap {
                    send(batch * shape.seg, shape.seg)?;
                    batch = 0;
                }
                send_tail(&self.state, &self.gso, dst, &payload, batch, shape)?;
                batch = 0;
                sent += 1;
            }
        }
        if batch > 0 {
            send(batch * shape.seg, shape.seg)?;
        }
        Ok(sent)
    }

    /// One datagram per `sendmsg`, as the devices send with `--no-gso`.
    fn send_plain(&mut self, shape: &Shape) -> Result<u64, PerfError> {
        let (_, dst) = self.peers()?;
        self.plain.set_nonblocking(false)?;
        let payload = vec![0x5au8; shape.seg];
        let mut sent = 0u64;
        for _ in 0..shape.messages {
            for k in 0..shape.full + usize::from(shape.rem > 0) {
                let len = if k < shape.full { shape.seg } else { shape.rem };
                let t = Transmit {
                    destination: dst,
                    ecn: None,
                    contents: &payload[..len],
                    segment_size: None,
                    src_ip: None,
                };
                try_send(&self.plain_state, &self.plain, &t)?;
                sent += 1;
            }
        }
        Ok(sent)
    }

    /// Receives until `total` payload bytes arrived or the sender went quiet; returns bytes,
    /// datagrams and seconds from the start signal to the last datagram.
    fn receive(&mut self, gro: bool, total: u64) -> Result<(u64, u64, f64), PerfError> {
        let sock = if gro { &self.gso } else { &self.plain };
        let state = if gro { &self.state } else { &self.plain_state };
        // Nonblocking reads: a blocking `recvmmsg` would wait for a full batch.
        sock.set_nonblocking(true)?;
        let start = Instant::now();
        let mut last = start;
        let (mut bytes, mut datagrams) = (0u64, 0u64);
        let mut meta = [RecvMeta::default(); BATCH_SIZE];
        while bytes < total {
            let wait = if datagrams == 0 {
                FIRST_WAIT
            } else {
                IDLE_WAIT
            };
            let mut bufs: Vec<IoSliceMut<'_>> =
                self.buf.chunks_mut(RX_BUF).map(IoSliceMut::new).collect();
            match state.recv(sock.into(), &mut bufs, &mut meta) {
                Ok(n) => {
                    last = Instant::now();
                    for m in &meta[..n] {
                        bytes += m.len as u64;
                        datagrams += m.len.div_ceil(m.stride.max(1)).max(1) as u64;
                    }
                }
                Err(e) if e.kind() == IoKind::WouldBlock => {
                    let more = if self.busy {
                        last.elapsed() <= wait
                    } else {
                        // Edge-triggered: the socket was read empty, so the next datagram
                        // is an edge.
                        self.events.clear();
                        match self.poll.poll(&mut self.events, Some(wait)) {
                            Ok(()) => !self.events.is_empty(),
                            Err(e) if e.kind() == IoKind::Interrupted => true,
                            Err(e) => return Err(PerfError::run(format!("baseline poll: {e}"))),
                        }
                    };
                    if !more {
                        break;
                    }
                }
                Err(e) if e.kind() == IoKind::Interrupted => {}
                Err(e) => return Err(PerfError::run(format!("baseline receive: {e}"))),
            }
        }
        Ok((
            bytes,
            datagrams,
            last.saturating_duration_since(start).as_secs_f64(),
        ))
    }

    /// Latency baseline, client side: `iters` round trips; `None` if a datagram was lost.
    pub(crate) fn lat_client(
        &mut self,
        ctl: &mut dyn Ctl,
        cfg: &Config,
        size: u64,
    ) -> Result<Option<LatResult>, PerfError> {
        let (req, resp) = ping_sizes(cfg, size);
        let (_, dst) = self.peers()?;
        self.drain()?;
        self.prepare_ping()?;
        ctl.sync("blping")?;
        let mut posts = Vec::with_capacity(usize::try_from(cfg.iters).unwrap_or(0));
        let payload = vec![0xa5u8; req.min(MAX_UDP_PAYLOAD)];
        let mut ok = true;
        for _ in 0..cfg.iters {
            posts.push(Instant::now());
            send_message(&self.plain, &payload, req, dst)?;
            if !self.recv_message(resp)? {
                ok = false;
                break;
            }
        }
        posts.push(Instant::now());
        ctl.sync("blping end")?;
        Ok(ok
            .then(|| stats::latency(size, &posts, cfg.test.rtt_factor()))
            .flatten()
            .map(|mut r| {
                r.iterations = cfg.iters;
                r
            }))
    }

    /// Latency baseline, server side: answers every request.
    pub(crate) fn lat_server(
        &mut self,
        ctl: &mut dyn Ctl,
        cfg: &Config,
        size: u64,
    ) -> Result<(), PerfError> {
        let (req, resp) = ping_sizes(cfg, size);
        let (_, dst) = self.peers()?;
        self.drain()?;
        self.prepare_ping()?;
        ctl.sync("blping")?;
        let payload = vec![0x5au8; resp.min(MAX_UDP_PAYLOAD)];
        for _ in 0..cfg.iters {
            if !self.recv_message(req)? {
                break;
            }
            send_message(&self.plain, &payload, resp, dst)?;
        }
        ctl.sync("blping end")
    }

    fn prepare_ping(&mut self) -> Result<(), PerfError> {
        self.plain.set_nonblocking(self.ping_spin)?;
        if !self.ping_spin {
            self.plain.set_read_timeout(Some(PING_WAIT))?;
        }
        Ok(())
    }

    /// Receives one message of `len` bytes (possibly several datagrams); false on timeout.
    fn recv_message(&mut self, len: usize) -> Result<bool, PerfError> {
        let mut got = 0usize;
        let t = Instant::now();
        while got < len.max(1) {
            match self.plain.recv_from(&mut self.buf[..RX_BUF]) {
                Ok((n, _)) => got += n.max(1),
                Err(e) if matches!(e.kind(), IoKind::WouldBlock | IoKind::TimedOut) => {
                    if !self.ping_spin || t.elapsed() > PING_WAIT {
                        return Ok(false);
                    }
                }
                Err(e) if e.kind() == IoKind::Interrupted => {}
                Err(e) => return Err(PerfError::run(format!("baseline receive: {e}"))),
            }
        }
        Ok(true)
    }
}

/// How the messages of a bandwidth baseline are cut.
struct Shape {
    seg: usize,
    full: usize,
    rem: usize,
    messages: u64,
}

impl Shape {
    fn bytes(&self) -> u64 {
        self.messages * (self.full * self.seg + self.rem) as u64
    }

    fn datagrams(&self) -> u64 {
        self.messages * (self.full + usize::from(self.rem > 0)) as u64
    }
}

/// Sends `batch` full segments followed by the message's shorter tail in one GSO call.
fn send_tail(
    state: &UdpSocketState,
    sock: &UdpSocket,
    dst: SocketAddr,
    payload: &[u8],
    batch: usize,
    shape: &Shape,
) -> Result<(), PerfError> {
    let len = batch * shape.seg + shape.rem;
    let t = Transmit {
        destination: dst,
        ecn: None,
        contents: &payload[..len],
        segment_size: (batch > 0).then_some(shape.seg),
        src_ip: None,
    };
    loop {
        match state.try_send(sock.into(), &t) {
            Ok(()) => return Ok(()),
            Err(e) if matches!(e.kind(), IoKind::WouldBlock | IoKind::Interrupted) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => return Ok(()),
            Err(e) => return Err(PerfError::run(format!("baseline GSO send: {e}"))),
        }
    }
}

fn send_to(sock: &UdpSocket, data: &[u8], dst: SocketAddr) -> Result<(), PerfError> {
    loop {
        match sock.send_to(data, dst) {
            Ok(_) => return Ok(()),
            Err(e) if matches!(e.kind(), IoKind::WouldBlock | IoKind::Interrupted) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => return Ok(()),
            Err(e) => return Err(PerfError::run(format!("baseline send: {e}"))),
        }
    }
}

/// Sends a `len`-byte message as datagrams of at most 65,507 bytes.
fn send_message(
    sock: &UdpSocket,
    payload: &[u8],
    len: usize,
    dst: SocketAddr,
) -> Result<(), PerfError> {
    let mut left = len.max(1);
    while left > 0 {
        let n = left.min(payload.len()).max(1);
        send_to(sock, &payload[..n.min(payload.len())], dst)?;
        left = left.saturating_sub(n);
    }
    Ok(())
}

/// Whether the verbs run a latency baseline is compared with spins: `write_lat` always
/// spins on the buffer, the others on the CQ unless `-e`; busy-poll devices spin too.
fn ping_spins(cfg: &Config) -> bool {
    cfg.busy_poll || cfg.test.verb() == Verb::Write || !cfg.events
}

/// Sends one transmit, retrying while the socket is full.
fn try_send(state: &UdpSocketState, sock: &UdpSocket, t: &Transmit<'_>) -> Result<(), PerfError> {
    loop {
        match state.try_send(sock.into(), t) {
            Ok(()) => return Ok(()),
            Err(e) if matches!(e.kind(), IoKind::WouldBlock | IoKind::Interrupted) => {}
            // ENOBUFS and the like: the datagrams are lost, as on a full socket.
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => return Ok(()),
            Err(e) => return Err(PerfError::run(format!("baseline send: {e}"))),
        }
    }
}

/// Request and answer sizes of the latency ping-pong.
fn ping_sizes(cfg: &Config, size: u64) -> (usize, usize) {
    let s = usize::try_from(size).unwrap_or(usize::MAX);
    match cfg.test.verb() {
        Verb::Write | Verb::Send => (s, s),
        Verb::Read => (16, s),
        Verb::Atomic => (16, 8),
    }
}

/// One strategy's result.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Strategy {
    pub(crate) name: &'static str,
    /// CPU time of both processes over this strategy.
    pub(crate) cpu: cpu::Use,
    pub(crate) bytes_per_sec: f64,
    pub(crate) bytes_received: u64,
    pub(crate) datagrams_expected: u64,
    pub(crate) datagrams_received: u64,
    pub(crate) dropped_pct: f64,
}

/// Every strategy's result for one size.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct BwBaseline {
    pub(crate) gso_available: bool,
    pub(crate) strategies: Vec<Strategy>,
}

impl BwBaseline {
    /// The best strategy's goodput.
    pub(crate) fn best_bytes_per_sec(&self) -> f64 {
        self.strategies
            .iter()
            .map(|s| s.bytes_per_sec)
            .fold(0.0, f64::max)
    }

    /// One line for the human report.
    pub(crate) fn describe(&self, unit: BwUnit) -> String {
        let mut parts: Vec<String> = self
            .strategies
            .iter()
            .map(|s| {
                format!(
                    "{} {:.2} {} ({:.0} kdgram/s, {:.1}% dropped)",
                    s.name
                        .replace("gso_gro", "GSO→GRO")
                        .replace("no_gso", "no GSO"),
                    unit.from_bytes_per_sec(s.bytes_per_sec),
                    match unit {
                        BwUnit::MiB => "MiB/s",
                        BwUnit::Gbit => "Gb/s",
                    },
                    if s.bytes_per_sec > 0.0 && s.bytes_received > 0 {
                        s.datagrams_received as f64 * s.bytes_per_sec
                            / s.bytes_received as f64
                            / 1e3
                    } else {
                        0.0
                    },
                    s.dropped_pct
                )
            })
            .collect();
        if !self.gso_available {
            parts.push("GSO/GRO unavailable: one datagram per send only".into());
        }
        parts.join("; ")
    }
}
