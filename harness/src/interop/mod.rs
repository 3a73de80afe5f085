//! Wire interop with other RoCEv2 implementations (Linux rxe, a real NIC): `softverbs pingpong`
//! ([`pingpong`], `ibv_rc_pingpong`'s protocol and output), `softverbs ud-pingpong`
//! ([`ud_pingpong`], `ibv_ud_pingpong`'s), `softverbs rdma-check`
//! ([`rdma_check`], RDMA WRITE / READ / WRITE_WITH_IMM / atomics in both directions, verified
//! on both sides) and `softverbs icrc-check` ([`icrc_check`], the ICRC of every packet of a
//! capture verified over its real headers).
//!
//! Both programs run on any `verbs-api` provider: `udp` (the emulator on a real UDP socket,
//! the default here since the peer is another process), `hw` (libibverbs, e.g. `rxe0`) or `emu`.
//! `scripts/rxe-interop.sh` runs them against Linux SoftRoCE in the rxe-vm guest.
//!
//! This module holds what both share: opening the device ([`DeviceArgs`]), walking an RC QP to
//! RTS with an explicit source GID index ([`QpPath`]), waiting for completions with a bound
//! ([`Waiter`]) and the device counters of a UDP device ([`udp_report`]).

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use verbs_api::connect::{INIT_MASK, RTR_MASK, RTS_MASK};
use verbs_api::dynamic::{AnyChannel, AnyContext, AnyCq, AnyQp, PROVIDER_ENV};
use verbs_api::{
    AccessFlags, AhAttr, CompletionChannel, CompletionQueue, Context, Device, Gid, Mtu, PostError,
    Provider, QpAttr, QpState, QueuePair, WorkCompletion,
};

pub mod cm_probe;
pub mod icrc_check;
pub mod pingpong;
mod pingpong_shared;
pub mod rdma_check;
pub mod ud_pingpong;
pub mod wire;

pub use pingpong_shared::SharedArgs;

/// An interop failure, with a message for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InteropError(pub String);

impl InteropError {
    /// An error with message `msg`.
    pub fn new(msg: impl Into<String>) -> InteropError {
        InteropError(msg.into())
    }
}

impl fmt::Display for InteropError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InteropError {}

impl From<verbs_api::Error> for InteropError {
    fn from(e: verbs_api::Error) -> InteropError {
        InteropError(e.to_string())
    }
}

impl From<PostError> for InteropError {
    fn from(e: PostError) -> InteropError {
        InteropError(e.to_string())
    }
}

/// Result of the interop programs.
pub type Result<T> = std::result::Result<T, InteropError>;

/// Adds what was being done to an error's message.
pub(crate) trait Context2<T> {
    /// `what: <error>`.
    fn during(self, what: &str) -> Result<T>;
}

impl<T, E: fmt::Display> Context2<T> for std::result::Result<T, E> {
    fn during(self, what: &str) -> Result<T> {
        self.map_err(|e| InteropError(format!("{what}: {e}")))
    }
}

/// Which device to open: the provider, the device name and, for `udp`, the address to bind.
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct DeviceArgs {
    /// Provider: `udp` (emulated device on a UDP socket), `hw` (libibverbs) or `emu`
    /// (in-process). Default: $SOFTVERBS_PROVIDER, else `udp`.
    #[arg(long)]
    pub provider: Option<String>,
    /// Device name (e.g. `rxe0`, `udp0`). Default: $SOFTVERBS_DEVICE, else the provider's first.
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    pub ib_dev: Option<String>,
    /// `udp` provider only: bind the device to this `ip[:port]` (port 4791 when left out)
    /// instead of $SOFTVERBS_UDP_ADDRS. A real RoCEv2 peer sends to port 4791. The device
    /// checks a peer's ICRC up to its IPv4 identification, which the ICRC covers but a UDP
    /// socket cannot see (rxe and NICs number their datagrams): packets that match only with
    /// a non-zero identification are counted as `icrc_ident_solved`; see --strict-icrc.
    #[arg(long, value_name = "ADDR")]
    pub bind: Option<String>,
    /// With --bind: drop every packet whose ICRC does not verify with IPv4 identification 0,
    /// as between softverbs devices (a Linux rxe or NIC peer then never gets through).
    #[arg(long, requires = "bind")]
    pub strict_icrc: bool,
    /// Port number of the device (ibv_rc_pingpong's `-i`).
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    pub ib_port: u8,
    /// Index of the local GID in the port's GID table (0 on a softverbs device; 1 for the
    /// IPv4 address on the rxe-vm guest's rxe0).
    #[arg(short = 'g', long = "gid-idx", default_value_t = 0)]
    pub gid_idx: u8,
    /// `udp` provider only: write what the device sends and receives to this pcap file.
    #[arg(long, value_name = "FILE.pcap")]
    pub pcap: Option<std::path::PathBuf>,
}

impl DeviceArgs {
    /// The provider name: `--provider`, else $SOFTVERBS_PROVIDER, else `udp`.
    pub fn provider_name(&self) -> String {
        self.provider
            .clone()
            .or_else(|| {
                std::env::var(PROVIDER_ENV)
                    .ok()
                    .filter(|v| !v.trim().is_empty())
            })
            .map_or_else(|| "udp".to_string(), |v| v.trim().to_string())
    }

    /// Opens the device and starts the `--pcap` capture. Errors name the provider and device.
    pub fn open(&self) -> Result<AnyContext> {
        let ctx = self.open_device()?;
        if let Some(path) = &self.pcap {
            let udp = ctx
                .downcast_ref::<emu_udp::UdpContext>()
                .ok_or_else(|| InteropError::new("--pcap applies to the udp provider only"))?;
            udp.set_capture(Some(path))
                .during(&format!("--pcap {}", path.display()))?;
        }
        Ok(ctx)
    }

    /// Stops the `--pcap` capture, flushing the file.
    pub fn finish(&self, ctx: &AnyContext) -> Result<()> {
        match (ctx.downcast_ref::<emu_udp::UdpContext>(), &self.pcap) {
            (Some(udp), Some(path)) => udp
                .set_capture(None)
                .during(&format!("--pcap {}", path.display())),
            _ => Ok(()),
        }
    }

    fn open_device(&self) -> Result<AnyContext> {
        let provider = self.provider_name();
        let device = self.ib_dev.clone().or_else(|| {
            std::env::var(verbs_api::dynamic::DEVICE_ENV)
                .ok()
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        });
        match (&self.bind, provider.as_str()) {
            (Some(bind), "udp") => {
                let list = emu_udp::UdpProvider::builder()
                    .device_list(bind)
                    .during(&format!("--bind {bind}"))?
                    .foreign_ipv4_ident(!self.strict_icrc);
                let udp = list.build().during(&format!("binding {bind}"))?;
                let devices = udp.devices()?;
                let found = match &device {
                    None => devices.first(),
                    Some(name) => devices.iter().find(|d| d.name() == *name),
                };
                let dev = found.ok_or_else(|| {
                    InteropError::new(format!(
                        "the udp device bound to {bind} is not called {}",
                        device.as_deref().unwrap_or("?")
                    ))
                })?;
                Ok(AnyContext::new(dev.open()?))
            }
            (Some(_), other) => Err(InteropError::new(format!(
                "--bind applies to the udp provider only, not {other:?}"
            ))),
            (None, _) => Ok(crate::registry()
                .open(&provider, device.as_deref())
                .during(&format!("opening provider {provider}"))?),
        }
    }
}

/// The local GID at `args.gid_idx`, refusing an empty slot (which would mean LID addressing,
/// impossible on RoCE).
pub fn local_gid(ctx: &AnyContext, args: &DeviceArgs) -> Result<Gid> {
    let gid = ctx
        .query_gid(args.ib_port, u32::from(args.gid_idx))
        .during(&format!(
            "GID index {} of port {} on {}",
            args.gid_idx,
            args.ib_port,
            ctx.device_name()
        ))?;
    if gid.is_zero() {
        return Err(InteropError::new(format!(
            "GID index {} of {} is empty; pick another with -g",
            args.gid_idx,
            ctx.device_name()
        )));
    }
    Ok(gid)
}

/// Everything the RESET → INIT → RTR → RTS walk of one RC QP needs.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct QpPath {
    /// Port number.
    pub port: u8,
    /// Local GID index (`ah_attr.grh.sgid_index`).
    pub sgid_index: u8,
    /// The peer's GID.
    pub dgid: Gid,
    /// The peer's QP number.
    pub dest_qpn: u32,
    /// The peer's first PSN (our `rq_psn`).
    pub rq_psn: u32,
    /// Our first PSN (`sq_psn`).
    pub sq_psn: u32,
    /// Path MTU.
    pub mtu: Mtu,
    /// Service level.
    pub sl: u8,
    /// IPv4 TTL / IPv6 hop limit.
    pub hop_limit: u8,
    /// The peer's UDP port (4791 for every real RoCEv2 device).
    pub udp_dport: u16,
    /// Remote access rights granted on the QP.
    pub access: AccessFlags,
    /// Outstanding READ/atomic requests, both ways.
    pub rd_atomic: u8,
}

impl QpPath {
    fn attr(&self, state: QpState) -> QpAttr {
        QpAttr {
            qp_state: state,
            pkey_index: 0,
            port_num: self.port,
            qp_access_flags: self.access,
            path_mtu: self.mtu,
            dest_qp_num: self.dest_qpn,
            rq_psn: self.rq_psn,
            max_dest_rd_atomic: self.rd_atomic,
            min_rnr_timer: 12,
            ah_attr: AhAttr {
                dgid: self.dgid,
                sgid_index: self.sgid_index,
                hop_limit: self.hop_limit,
                sl: self.sl,
                port_num: self.port,
                udp_dport: self.udp_dport,
                ..AhAttr::default()
            },
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            sq_psn: self.sq_psn,
            max_rd_atomic: self.rd_atomic,
            ..QpAttr::default()
        }
    }

    /// RESET → INIT (access flags, port, P_Key index 0).
    pub fn to_init(&self, qp: &AnyQp) -> Result<()> {
        qp.modify(&self.attr(QpState::Init), INIT_MASK)
            .during("modify QP to INIT")
    }

    /// INIT → RTR → RTS (timeout 14, retry and RNR retry 7, min RNR timer 12, as
    /// ibv_rc_pingpong).
    pub fn to_rts(&self, qp: &AnyQp) -> Result<()> {
        qp.modify(&self.attr(QpState::Rtr), RTR_MASK)
            .during("modify QP to RTR")?;
        qp.modify(&self.attr(QpState::Rts), RTS_MASK)
            .during("modify QP to RTS")
    }
}

/// Polls a CQ (or sleeps on its completion channel) until completions arrive, failing when none
/// has arrived for `stall`.
#[derive(Debug)]
pub struct Waiter {
    cq: AnyCq,
    channel: Option<AnyChannel>,
    stall: Duration,
    buf: Vec<WorkCompletion>,
}

impl Waiter {
    /// Waits on `cq`; through `channel` (which `cq` must have been created with) when given.
    /// Arms the CQ for the first event.
    pub fn new(cq: AnyCq, channel: Option<AnyChannel>, stall: Duration) -> Result<Waiter> {
        if channel.is_some() {
            cq.req_notify(false).during("ibv_req_notify_cq")?;
        }
        Ok(Waiter {
            cq,
            channel,
            stall,
            buf: vec![WorkCompletion::default(); 64],
        })
    }

    /// The next batch of completions (at least one), or an error naming `what` was awaited
    /// when nothing completes for the stall time.
    pub fn next(&mut self, what: &dyn Fn() -> String) -> Result<&[WorkCompletion]> {
        let deadline = Instant::now() + self.stall;
        loop {
            let n = self.cq.poll(&mut self.buf).during("ibv_poll_cq")?;
            if n > 0 {
                return Ok(&self.buf[..n]);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(InteropError::new(format!(
                    "no completion in {:?} while waiting for {}",
                    self.stall,
                    what()
                )));
            }
            match &self.channel {
                Some(ch) => {
                    // Events may have been missed between the last poll and arming: re-arm,
                    // then poll again before sleeping (the usual ibv_get_cq_event pattern).
                    if ch
                        .wait_cq_event(Some(left.min(Duration::from_millis(200))))
                        .during("ibv_get_cq_event")?
                        .is_some()
                    {
                        self.cq.ack_events(1);
                    }
                    self.cq.req_notify(false).during("ibv_req_notify_cq")?;
                }
                // Busy polling, as ibv_rc_pingpong does; yield so that a progress thread on
                // the same core is not starved.
                None => std::thread::yield_now(),
            }
        }
    }
}

/// Time bounds of the interop programs.
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct TimeArgs {
    /// Fail when the peer does not answer on TCP, or nothing completes, for this many seconds.
    #[arg(long, default_value_t = 60, value_name = "SECS")]
    pub timeout: u64,
    /// How long a server waits for its client, and a client retries while its server is not
    /// listening yet (default: --timeout).
    #[arg(long, value_name = "SECS")]
    pub connect_timeout: Option<u64>,
}

impl TimeArgs {
    /// The stall bound (at least one second).
    pub fn io(&self) -> Duration {
        Duration::from_secs(self.timeout.max(1))
    }

    /// The connection bound (at least one second).
    pub fn connect(&self) -> Duration {
        Duration::from_secs(self.connect_timeout.unwrap_or(self.timeout).max(1))
    }
}

/// Connects to `host:port`, retrying while nobody listens for [`TimeArgs::connect`]; reads and
/// writes are bounded by [`TimeArgs::io`].
pub fn tcp_client(host: &str, port: u16, time: &TimeArgs) -> Result<TcpStream> {
    let addr = resolve(host, port)?;
    let stream = emu_udp::oob::connect(addr, time.connect())?;
    io_bounds(stream, time)
}

/// Listens on TCP `port` (all addresses) and accepts one client within
/// [`TimeArgs::connect`]; reads and writes are bounded by [`TimeArgs::io`].
pub fn tcp_server(port: u16, time: &TimeArgs) -> Result<TcpStream> {
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))
        .during(&format!("listening on TCP port {port}"))?;
    let stream = emu_udp::oob::accept(&listener, time.connect())
        .during(&format!("waiting for a client on TCP port {port}"))?;
    io_bounds(stream, time)
}

fn io_bounds(stream: TcpStream, time: &TimeArgs) -> Result<TcpStream> {
    stream
        .set_read_timeout(Some(time.io()))
        .and_then(|()| stream.set_write_timeout(Some(time.io())))
        .during("TCP socket options")?;
    Ok(stream)
}

/// Resolves `host:port` (a name or an address), preferring IPv4.
pub fn resolve(host: &str, port: u16) -> Result<SocketAddr> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .during(&format!("resolving {host}"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
        .ok_or_else(|| InteropError::new(format!("{host} has no address")))
}

/// A random 24-bit PSN (from the standard library's per-process random hash keys and the
/// clock; no RNG dependency for one number).
pub fn random_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    (h.finish() & 0xFF_FFFF) as u32
}

/// Every receive drop counter as `name=count`, space-separated, in cause order.
fn rx_drops_line(drops: &emu_proto::RxDrops) -> String {
    let parts: Vec<String> = drops
        .iter()
        .map(|(cause, n)| format!("{}={n}", cause.name()))
        .collect();
    parts.join(" ")
}

/// The device counters of a `udp` context as printable lines, and the number of packets it
/// dropped for a bad ICRC; `None` for other providers.
pub fn udp_report(ctx: &AnyContext) -> Option<(String, u64)> {
    let udp = ctx.downcast_ref::<emu_udp::UdpContext>()?;
    let s = udp.device_stats();
    let d = udp.driver_stats();
    let text = format!(
        "device counters of {} ({}): sent_pkts={} rcvd_pkts={} icrc_errors={} icrc_ident_solved={} \
         dropped={} \
         retransmits_timeout={} retransmits_nak={} timeout_retries={} duplicate_request={} \
         out_of_seq_request={} seq_naks_sent={} rcvd_seq_err={} send_rnr_err={} rcvd_rnr_err={} \
         retry_exceeded_err={} duplicate_response={} acks_sent={}\n\
         receive drops: {}\n\
         socket: datagrams_received={} datagrams_sent={} send_errors={} recv_errors={}",
        ctx.device_name(),
        udp.local_addr(),
        s.sent_pkts,
        s.rcvd_pkts,
        s.icrc_errors,
        s.icrc_ident_solved,
        s.dropped,
        s.retransmits_timeout,
        s.retransmits_nak,
        s.timeout_retries,
        s.duplicate_request,
        s.out_of_seq_request,
        s.seq_naks_sent,
        s.rcvd_seq_err,
        s.send_rnr_err,
        s.rcvd_rnr_err,
        s.retry_exceeded_err,
        s.duplicate_response,
        s.acks_sent,
        rx_drops_line(&s.rx_drops),
        d.datagrams_received,
        d.datagrams_sent,
        d.send_errors,
        d.recv_errors,
    );
    Some((text, s.icrc_errors))
}

/// Parses an MTU in bytes (256, 512, 1024, 2048, 4096), as ibv_rc_pingpong's `-m`.
pub fn mtu_arg(s: &str) -> std::result::Result<Mtu, String> {
    s.parse::<u32>()
        .ok()
        .and_then(Mtu::from_bytes)
        .ok_or_else(|| format!("{s:?} is not an MTU (256, 512, 1024, 2048 or 4096)"))
}
