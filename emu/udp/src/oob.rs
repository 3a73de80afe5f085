//! Out-of-band connection setup over TCP, as perftest and `ibv_rc_pingpong` do it: the two
//! sides exchange their [`Endpoint`]s as text lines on a TCP connection, connect their QPs,
//! and synchronise once more before traffic starts.
//!
//! One call per process sets up a connected RC QP:
//!
//! ```no_run
//! use emu_udp::{UdpProvider, oob};
//! use verbs_api::{Device, Provider};
//!
//! // Process A (server)
//! let provider = UdpProvider::builder().device("127.0.0.1:0".parse()?).build()?;
//! let ctx = provider.devices()?[0].open()?;
//! let listener = oob::listen("127.0.0.1:18515".parse()?)?;
//! let conn = oob::connect_server(&ctx, &listener, &oob::ConnectOptions::default())?;
//!
//! // Process B (client), elsewhere:
//! // let conn = oob::connect_client(&ctx, "127.0.0.1:18515".parse()?, &Default::default())?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The protocol is line-based text: each side writes its endpoint's `Display` form
//! (`qpn=0x000011 psn=0x000000 gid=::ffff:127.0.0.1 port=4791`) followed by `\n` and reads
//! the peer's; then both write and read `ready`. [`exchange_mr`] and [`send_line`] /
//! [`recv_line`] carry anything else an application needs to tell its peer (MR addresses and
//! keys, "done" markers). Every read and write is bounded by a timeout.
//!
//! The connection helpers are generic over [`Context`], so they work with any backend.

use std::fmt;
use std::io::{ErrorKind as IoKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::str::FromStr;
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use verbs_api::{
    Context, Endpoint, Error, ErrorKind, QpCap, QpInitAttr, QueuePair, RcConnectOptions, Result,
    connect_rc,
};

/// How long each step of the exchange may take by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest line accepted from a peer, newline excluded.
pub const MAX_LINE: usize = 1024;

/// The line both sides send once their QP is in RTS.
const READY: &str = "ready";

fn io_err(what: &str, e: std::io::Error) -> Error {
    Error::new(ErrorKind::Io, format!("out-of-band {what}: {e}"))
}

/// Writes `line` and a newline. `InvalidArgument` if `line` holds a newline or is longer than
/// [`MAX_LINE`]; `Io` if the write fails or times out.
pub fn send_line(stream: &mut TcpStream, line: &str) -> Result<()> {
    if line.contains('\n') || line.len() > MAX_LINE {
        return Err(Error::invalid(
            "an out-of-band line holds no newline and at most MAX_LINE bytes",
        ));
    }
    let mut bytes = Vec::with_capacity(line.len() + 1);
    bytes.extend_from_slice(line.as_bytes());
    bytes.push(b'\n');
    stream.write_all(&bytes).map_err(|e| io_err("write", e))?;
    stream.flush().map_err(|e| io_err("write", e))
}

/// Reads one line (without its newline). `Io` if the peer closes the connection first or the
/// stream's read timeout passes; `InvalidArgument` for a line longer than [`MAX_LINE`] or not
/// UTF-8.
pub fn recv_line(stream: &mut TcpStream) -> Result<String> {
    // Byte by byte, so that nothing after the newline is consumed: lines are short and few.
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match stream.read(&mut byte) {
            Ok(0) => {
                return Err(Error::new(
                    ErrorKind::Io,
                    "out-of-band peer closed the connection",
                ));
            }
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) => {
                if line.len() >= MAX_LINE {
                    return Err(Error::invalid("out-of-band line longer than MAX_LINE"));
                }
                line.push(byte[0]);
            }
            Err(e) if e.kind() == IoKind::Interrupted => {}
            Err(e) => return Err(io_err("read", e)),
        }
    }
    String::from_utf8(line).map_err(|_| Error::invalid("out-of-band line is not UTF-8"))
}

/// Sends `local` and returns the peer's endpoint. Both sides call it; the order does not
/// matter. Errors: those of [`send_line`] and [`recv_line`], and `InvalidArgument` if the
/// peer's line is not an endpoint.
pub fn exchange(stream: &mut TcpStream, local: &Endpoint) -> Result<Endpoint> {
    send_line(stream, &local.to_string())?;
    let line = recv_line(stream)?;
    line.parse::<Endpoint>()
}

/// Waits until the peer calls `barrier` too. Errors: those of [`send_line`] and
/// [`recv_line`]; `InvalidArgument` if the peer sent something else.
pub fn barrier(stream: &mut TcpStream) -> Result<()> {
    send_line(stream, READY)?;
    let line = recv_line(stream)?;
    if line == READY {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "out-of-band peer sent {line:?}, expected {READY:?}"
        )))
    }
}

/// What a peer needs to reach a memory region with RDMA READ, WRITE or atomics.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RemoteMr {
    /// The region's start address, as the peer puts it in `remote_addr`.
    pub addr: u64,
    /// Its rkey.
    pub rkey: u32,
    /// Its length in bytes.
    pub len: u64,
}

impl fmt::Display for RemoteMr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "addr={:#x} rkey={:#x} len={}",
            self.addr, self.rkey, self.len
        )
    }
}

impl FromStr for RemoteMr {
    type Err = Error;

    /// Parses the `Display` form; `InvalidArgument` for a missing, repeated or bad field.
    fn from_str(s: &str) -> Result<RemoteMr> {
        let (mut addr, mut rkey, mut len) = (None, None, None);
        for field in s.split_whitespace() {
            let (key, value) = field
                .split_once('=')
                .ok_or_else(|| Error::invalid(format!("MR field {field:?} lacks '='")))?;
            let number = |v: &str| -> Result<u64> {
                let parsed = match v.strip_prefix("0x") {
                    Some(hex) => u64::from_str_radix(hex, 16),
                    None => v.parse(),
                };
                parsed.map_err(|_| Error::invalid(format!("MR field {key}={v:?} is not a number")))
            };
            let taken = match key {
                "addr" => addr.replace(number(value)?).is_some(),
                "rkey" => {
                    let k = u32::try_from(number(value)?)
                        .map_err(|_| Error::invalid("MR rkey above 32 bits"))?;
                    rkey.replace(k).is_some()
                }
                "len" => len.replace(number(value)?).is_some(),
                other => return Err(Error::invalid(format!("unknown MR field {other:?}"))),
            };
            if taken {
                return Err(Error::invalid(format!("MR field {key:?} given twice")));
            }
        }
        match (addr, rkey, len) {
            (Some(addr), Some(rkey), Some(len)) => Ok(RemoteMr { addr, rkey, len }),
            _ => Err(Error::invalid("MR line needs addr, rkey and len")),
        }
    }
}

/// Sends `local` and returns the peer's region. Errors: as [`exchange`].
pub fn exchange_mr(stream: &mut TcpStream, local: &RemoteMr) -> Result<RemoteMr> {
    send_line(stream, &local.to_string())?;
    recv_line(stream)?.parse()
}

/// Binds a TCP listener for [`accept`] / [`connect_server`]; port 0 lets the OS choose (read
/// it back with `local_addr`). `Io` if the address cannot be bound.
pub fn listen(addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr).map_err(|e| io_err(&format!("listen on {addr}"), e))
}

/// Accepts one connection, waiting at most `timeout` (through mio, not by polling). The
/// returned stream is blocking, with `TCP_NODELAY` and read/write timeouts of `timeout`.
/// `Io` if nobody connects in time or the listener fails.
pub fn accept(listener: &TcpListener, timeout: Duration) -> Result<TcpStream> {
    listener
        .set_nonblocking(true)
        .map_err(|e| io_err("listener", e))?;
    let result = accept_nonblocking(listener, timeout);
    let _ = listener.set_nonblocking(false);
    let stream = result?;
    tune(&stream, timeout)?;
    Ok(stream)
}

fn accept_nonblocking(listener: &TcpListener, timeout: Duration) -> Result<TcpStream> {
    let deadline = Instant::now() + timeout;
    let mut poll = Poll::new().map_err(|e| io_err("poller", e))?;
    let fd = listener.as_raw_fd();
    poll.registry()
        .register(&mut SourceFd(&fd), Token(0), Interest::READABLE)
        .map_err(|e| io_err("poller", e))?;
    let mut events = Events::with_capacity(4);
    loop {
        match listener.accept() {
            Ok((stream, _)) => return Ok(stream),
            Err(e) if e.kind() == IoKind::WouldBlock || e.kind() == IoKind::Interrupted => {}
            Err(e) => return Err(io_err("accept", e)),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::new(
                ErrorKind::Io,
                "out-of-band accept: nobody connected in time",
            ));
        }
        match poll.poll(&mut events, Some(left)) {
            Ok(()) => {}
            Err(e) if e.kind() == IoKind::Interrupted => {}
            Err(e) => return Err(io_err("poll", e)),
        }
    }
}

/// [`listen`] on `addr` and [`accept`] one connection.
pub fn serve(addr: SocketAddr, timeout: Duration) -> Result<TcpStream> {
    accept(&listen(addr)?, timeout)
}

/// Connects to `addr`, retrying every 20 ms while the server is not listening yet, for at most
/// `timeout`. The stream is set up as [`accept`] does. `Io` if no connection is made in time.
pub fn connect(addr: SocketAddr, timeout: Duration) -> Result<TcpStream> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::new(
                ErrorKind::Io,
                format!("out-of-band connect to {addr}: no answer in {timeout:?}"),
            ));
        }
        match TcpStream::connect_timeout(&addr, left) {
            Ok(stream) => {
                tune(&stream, timeout)?;
                return Ok(stream);
            }
            Err(e) if matches!(e.kind(), IoKind::ConnectionRefused | IoKind::Interrupted) => {
                std::thread::sleep(Duration::from_millis(20).min(left));
            }
            Err(e) => return Err(io_err(&format!("connect to {addr}"), e)),
        }
    }
}

fn tune(stream: &TcpStream, timeout: Duration) -> Result<()> {
    let t = Some(timeout.max(Duration::from_millis(1)));
    stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_nodelay(true))
        .and_then(|()| stream.set_read_timeout(t))
        .and_then(|()| stream.set_write_timeout(t))
        .map_err(|e| io_err("socket options", e))
}

/// What [`connect_server`] and [`connect_client`] create and how they connect it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ConnectOptions {
    /// Transport parameters of the RESET → RTS walk (perftest's by default).
    pub rc: RcConnectOptions,
    /// Entries of the CQ shared by the send and receive queues (default 256).
    pub cqe: u32,
    /// Queue capacities (default 128 WRs each way, 1 SGE each, no inline data).
    pub cap: QpCap,
    /// The first PSN this side sends (default 0).
    pub psn: u32,
    /// Bound on each step of the exchange (default [`DEFAULT_TIMEOUT`]).
    pub timeout: Duration,
    /// Give the CQ a completion channel, so completions can be waited for on its fd
    /// (default false).
    pub channel: bool,
}

impl Default for ConnectOptions {
    fn default() -> ConnectOptions {
        ConnectOptions {
            rc: RcConnectOptions::default(),
            cqe: 256,
            cap: QpCap {
                max_send_wr: 128,
                max_recv_wr: 128,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            psn: 0,
            timeout: DEFAULT_TIMEOUT,
            channel: false,
        }
    }
}

/// A connected RC QP with the objects it uses and the TCP stream to its peer.
#[derive(Debug)]
pub struct Connection<C: Context> {
    /// The QP's protection domain; register MRs in it.
    pub pd: C::Pd,
    /// The CQ of both the send and the receive queue.
    pub cq: C::Cq,
    /// The CQ's completion channel, if [`ConnectOptions::channel`] asked for one.
    pub channel: Option<C::Channel>,
    /// The QP, in RTS and connected to the peer's.
    pub qp: C::Qp,
    /// What this side told the peer.
    pub local: Endpoint,
    /// What the peer told this side.
    pub remote: Endpoint,
    /// The out-of-band stream, for [`exchange_mr`], [`barrier`] and the like.
    pub stream: TcpStream,
}

/// Accepts one client on `listener` and sets up a connected RC QP with it: creates a PD, a CQ
/// (with a channel if asked) and an RC QP on `ctx`, exchanges endpoints, walks the QP to RTS and waits until the client
/// has done the same. Errors: those of [`accept`], [`exchange`], [`barrier`] and of the verbs
/// calls (the objects made so far are released).
pub fn connect_server<C: Context>(
    ctx: &C,
    listener: &TcpListener,
    opts: &ConnectOptions,
) -> Result<Connection<C>> {
    let stream = accept(listener, opts.timeout)?;
    establish(ctx, stream, opts)
}

/// Connects to the server at `server` (retrying while it is not listening yet, up to
/// `opts.timeout`) and sets up a connected RC QP as [`connect_server`] does.
pub fn connect_client<C: Context>(
    ctx: &C,
    server: SocketAddr,
    opts: &ConnectOptions,
) -> Result<Connection<C>> {
    let stream = connect(server, opts.timeout)?;
    establish(ctx, stream, opts)
}

fn establish<C: Context>(
    ctx: &C,
    mut stream: TcpStream,
    opts: &ConnectOptions,
) -> Result<Connection<C>> {
    let pd = ctx.alloc_pd()?;
    let channel = opts
        .channel
        .then(|| ctx.create_comp_channel())
        .transpose()?;
    let cq = ctx.create_cq(opts.cqe, channel.as_ref())?;
    let qp = ctx.create_qp(&pd, &cq, &cq, None, &QpInitAttr::rc(opts.cap))?;
    let local = qp.endpoint(opts.psn)?;
    let remote = exchange(&mut stream, &local)?;
    connect_rc(&qp, opts.psn, &remote, &opts.rc)?;
    barrier(&mut stream)?;
    Ok(Connection {
        pd,
        cq,
        channel,
        qp,
        local,
        remote,
        stream,
    })
}
