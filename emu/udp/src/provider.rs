//! The UDP provider: one [`emu_proto::Hca`] per device, each driven by its own progress thread
//! and UDP socket (see [`crate::runtime`]); the verbs handles are [`emu_device`]'s, over the
//! port [`UdpDevice`].
//!
//! Every verbs call locks the device briefly, applies the command to the HCA, delivers what it
//! produced (channel notifications, async events), sends the packets it made ready from the
//! caller's thread, and rings the progress thread's doorbell only if the thread has to act
//! (see [`crate::runtime`]). Every handle holds its device, whose last handle stops the
//! thread.

use std::cell::Cell;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant as WallClock};

use emu_device::{ChannelShared, Context, DeviceState, Idle, Port, Waiting};
use emu_fault::{Counters, FaultPlan, Injector, NodeId};
use emu_proto::{HcaConfig, Instant, Stats};
use verbs_api::{Device, Error, ErrorKind, Gid, Provider, Result};

use crate::capture::Capture;
use crate::fault::FaultConfig;
use crate::runtime::{Core, DriverStats, Runtime};
use crate::socket::{self, SocketInfo};

/// An open UDP device; it derefs to its [`UdpDevice`] (fault control, capture, socket
/// information, busy polling).
pub type UdpContext = Context<UdpDevice>;
/// A protection domain of a UDP device.
pub type UdpPd = emu_device::Pd<UdpDevice>;
/// A memory region of a UDP device; its bytes are owned by the emulator (heap or file
/// mapping) or by the caller (`reg_mr_raw`). Reading it runs a progress pass of the device
/// first (see [`UdpDevice::set_busy_poll`]).
pub type UdpMr = emu_device::Mr<UdpDevice>;
/// A completion channel of a UDP device. Its fd (`AsFd`/`AsRawFd`) is readable while events
/// are pending, so it can be registered with epoll, mio or tokio; the progress thread makes it
/// readable when an armed CQ gets a completion.
pub type UdpChannel = emu_device::Channel<UdpDevice>;
/// A completion queue of a UDP device. Completions arrive from the progress thread; poll it
/// (an empty poll runs a progress pass, see [`UdpDevice::set_busy_poll`]) or arm it and wait
/// on its channel.
pub type UdpCq = emu_device::Cq<UdpDevice>;
/// A shared receive queue of a UDP device.
pub type UdpSrq = emu_device::Srq<UdpDevice>;
/// A queue pair of a UDP device. `post_send` sends the packets it makes ready from the
/// caller's thread (up to [`crate::TX_BATCH`]; the progress thread sends the rest), unless
/// another thread is sending for the device at that moment (then that one does) or the post
/// directly follows another `post_send` on the device (then the progress thread, or the
/// application thread's next poll, sends the burst in batches).
pub type UdpQp = emu_device::Qp<UdpDevice>;
/// A memory window of a UDP device.
pub type UdpMw = emu_device::Mw<UdpDevice>;

/// Longest [`emu_device::Cq::next_completion`] waits for a UDP device.
const NEXT_COMPLETION_WAIT: Duration = Duration::from_secs(60);
/// Pause between two empty polls of [`emu_device::Cq::next_completion`].
const POLL_PAUSE: Duration = Duration::from_micros(20);
/// Empty CQ polls in a row a thread makes without yielding its CPU. The usual wait on a
/// completion channel polls, arms the CQ, polls again and sleeps: it never yields, and a
/// thread that keeps polling yields from its third empty poll on.
const YIELD_AFTER: u32 = 2;

/// How long a thread about to block on a completion channel first drives the device itself:
/// it runs progress passes (as an empty CQ poll does, yielding its CPU from the third empty
/// one on) until an event is queued on the channel or this time has passed, and only then
/// hands the device to the progress thread and sleeps. While events come faster than this,
/// a waiting application moves its own traffic, and no wake-up of the progress thread and
/// then of the application sits between a datagram and the event. A sender that signals one
/// send in 100 waits about 100 µs per event at a million messages a second: with 50 µs here
/// `send_bw -e` ran at 0.37–0.53 Mpps and 3.0–4.1 µs of CPU per message, with 1 ms at
/// 0.83–0.92 Mpps and 1.9–2.3 µs. The cost is CPU while an application waits: up to this
/// much per wait, unless the thread's last wait slept longer than this (an application that
/// waits for rare events), when it spins only [`CHANNEL_SPIN_IDLE`]. Real hardware moves the
/// traffic without the host's CPU; an emulator has to spend it somewhere.
pub const CHANNEL_SPIN: Duration = Duration::from_millis(1);
/// How long a thread whose last wait on a completion channel slept longer than
/// [`CHANNEL_SPIN`] drives the device before it sleeps again.
pub const CHANNEL_SPIN_IDLE: Duration = Duration::from_micros(50);

thread_local! {
    /// The calling thread's empty CQ polls since its last poll that found a completion or
    /// its last wait on a completion channel (of any UDP device).
    static EMPTY_POLLS: Cell<u32> = const { Cell::new(0) };
    /// The calling thread's last wait on a completion channel slept longer than
    /// [`CHANNEL_SPIN`].
    static SLEPT_LONG: Cell<bool> = const { Cell::new(false) };
}

/// Counts one more empty poll of the calling thread and, from its third in a row, yields the
/// CPU: a busy-polling application on a loaded machine lets the peer (often another process
/// on the same host) and this device's thread run. (A poll whose pass moved traffic counts as
/// empty too: not yielding after those raised the client's CPU per GiB of a 64 KiB
/// `write_bw`, 0.48 → 0.56 s in 8 interleaved rounds.)
fn empty_poll() {
    let empty = EMPTY_POLLS.get().saturating_add(1);
    EMPTY_POLLS.set(empty);
    if empty > YIELD_AFTER {
        std::thread::yield_now();
    }
}

/// The address a device binds to when none is given: loopback, the RoCEv2 port.
pub const DEFAULT_ADDR: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 4791);

/// Bytes asked for each socket buffer by default; the kernel caps the request at
/// `net.core.rmem_max`/`wmem_max` (see [`SocketInfo`]).
pub const DEFAULT_SOCKET_BUFFER: usize = 64 << 20;

/// Builds a [`UdpProvider`]: its devices' addresses and their shared settings.
#[derive(Clone, Debug)]
pub struct UdpBuilder {
    devices: Vec<SocketAddr>,
    seed: u64,
    socket_buffer: usize,
    faults: Option<FaultPlan>,
    rx_faults: Option<FaultPlan>,
    peers: Vec<(SocketAddr, NodeId)>,
    first_node: u32,
    busy_poll: bool,
    capture: Option<PathBuf>,
    gso: bool,
    gro: bool,
    foreign_ipv4_ident: bool,
    #[cfg(test)]
    no_check: bool,
}

impl Default for UdpBuilder {
    fn default() -> UdpBuilder {
        UdpBuilder {
            devices: Vec::new(),
            seed: 0,
            socket_buffer: DEFAULT_SOCKET_BUFFER,
            faults: None,
            rx_faults: None,
            peers: Vec::new(),
            first_node: 0,
            busy_poll: false,
            capture: None,
            gso: false,
            gro: true,
            foreign_ipv4_ident: false,
            #[cfg(test)]
            no_check: false,
        }
    }
}

impl UdpBuilder {
    /// Peers with an unknown IPv4 identification (Linux rxe, RoCEv2 NICs): an IPv4 packet whose
    /// ICRC does not match with identification 0 is accepted if some identification makes it
    /// match (`HcaConfig::foreign_ipv4_ident`, counted in `Stats::icrc_ident_solved`); a
    /// corrupted one is still dropped with probability 1 − 2⁻¹⁶. Default false: softverbs
    /// peers send 0, and the full 32-bit check applies.
    pub fn foreign_ipv4_ident(mut self, on: bool) -> UdpBuilder {
        self.foreign_ipv4_ident = on;
        self
    }

    /// Adds a device bound to `addr` (port 0 lets the OS choose). Devices are named `udp0`,
    /// `udp1`, … in the order added; with none added, [`build`](Self::build) makes one at
    /// [`DEFAULT_ADDR`]. The address must be a specific unicast one: the device's GID is
    /// derived from it.
    pub fn device(mut self, addr: SocketAddr) -> UdpBuilder {
        self.devices.push(addr);
        self
    }

    /// Adds one device per address of a comma-separated list such as
    /// `127.0.0.1:0,127.0.0.2:0` (the format of `SOFTVERBS_UDP_ADDRS`); an address without a
    /// port gets 4791. `InvalidArgument` names the entry that does not parse.
    pub fn device_list(mut self, list: &str) -> Result<UdpBuilder> {
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let addr = entry
                .parse::<SocketAddr>()
                .or_else(|_| entry.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 4791)))
                .map_err(|_| Error::invalid(format!("{entry:?} is not an address[:port]")))?;
            self.devices.push(addr);
        }
        Ok(self)
    }

    /// Seed of the devices' key generators (device `i` mixes in `i`); default 0.
    pub fn seed(mut self, seed: u64) -> UdpBuilder {
        self.seed = seed;
        self
    }

    /// Bytes to ask for each of `SO_RCVBUF` and `SO_SNDBUF` (default
    /// [`DEFAULT_SOCKET_BUFFER`]); [`UdpDevice::socket_info`] reports what was granted.
    pub fn socket_buffer(mut self, bytes: usize) -> UdpBuilder {
        self.socket_buffer = bytes;
        self
    }

    /// A fault plan every device applies to the datagrams it sends (each device runs its own
    /// injector from the plan). Node numbers: device `i` of this builder is `NodeId(i)`
    /// (`NodeId(first + i)` with [`first_node`](Self::first_node));
    /// other addresses are named with [`peer_node`](Self::peer_node), else
    /// [`crate::UNKNOWN_NODE`].
    pub fn faults(mut self, plan: FaultPlan) -> UdpBuilder {
        self.faults = Some(plan);
        self
    }

    /// A fault plan every device applies to the datagrams it *receives* from its socket, before
    /// the engine sees them (each device runs its own injector from the plan, separate from the
    /// send-side one of [`faults`](Self::faults)). Use it when the peer injects nothing itself,
    /// e.g. a real RoCEv2 NIC or Linux rxe. The plan format, node numbers and verdicts are the
    /// send side's: a received datagram is the link `node of its source → this device`, so
    /// `from`/`to` in rules keep their meaning; delayed and held datagrams reach the engine
    /// later, duplicates twice, corrupted ones fail the engine's ICRC check. Datagrams a device
    /// sends to itself (they skip the socket) are not judged here.
    pub fn rx_faults(mut self, plan: FaultPlan) -> UdpBuilder {
        self.rx_faults = Some(plan);
        self
    }

    /// Names the node number a fault plan uses for datagrams to or from `addr` (a device of
    /// another provider or process). An address with port 0 names every port of its IP (a
    /// peer such as rxe sends from a per-QP source port); an entry with the exact port wins.
    pub fn peer_node(mut self, addr: SocketAddr, node: NodeId) -> UdpBuilder {
        self.peers.push((addr, node));
        self
    }

    /// Numbers this builder's devices from `first` in fault plans: device `i` is
    /// `NodeId(first + i)` (default 0). A process that owns one device of a multi-process
    /// fabric passes its own node number here.
    pub fn first_node(mut self, first: NodeId) -> UdpBuilder {
        self.first_node = first.0;
        self
    }

    /// Starts every device in busy-poll mode (see [`UdpDevice::set_busy_poll`]); default off.
    pub fn busy_poll(mut self, on: bool) -> UdpBuilder {
        self.busy_poll = on;
        self
    }

    /// Writes the live traffic of every device of this builder to one pcap file at `path`
    /// (created or truncated by [`build`](Self::build)): each datagram a device writes to its
    /// socket, after the send-side faults, and each datagram it reads from its socket, before
    /// the receive-side faults — a datagram between two devices of this builder once, when it
    /// is sent. Frames are Ethernet/IP/UDP ([`emu_capture::build_frame`]) with the real IP
    /// addresses and UDP ports, IPv4 identification 0 and DF (what the ICRC assumes), stamped
    /// with the wall clock. Datagrams a device sends to itself skip the socket and are not
    /// captured. Wireshark decodes port 4791 as RoCEv2; for other ports use "Decode As"
    /// (`tshark -d udp.port==PORT,infiniband`).
    ///
    /// The file is complete after [`UdpProvider::shutdown`] or
    /// [`UdpProvider::finish_capture`] (which reports write errors), or once the provider and
    /// every handle are dropped. For one device at run time see [`UdpDevice::set_capture`].
    pub fn capture(mut self, path: impl Into<PathBuf>) -> UdpBuilder {
        self.capture = Some(path.into());
        self
    }

    /// Sends runs of datagrams with UDP GSO (`UDP_SEGMENT`) where the kernel supports it:
    /// consecutive packets to one destination of equal size (the last may be shorter), up to
    /// 64 and 65,507 bytes, leave in one `sendmsg`, and the kernel (or the NIC) cuts them into
    /// datagrams. Default **off**. Where the kernel has no UDP GSO this changes nothing; if it
    /// refuses a GSO send (`EIO`/`EINVAL`), GSO is turned off for that socket, counted in
    /// [`DriverStats::gso_refused`], and the datagrams go out one by one.
    /// [`UdpDevice::socket_info`] tells whether GSO is in use.
    ///
    /// Why it is off by default: what goes on the wire changes for IPv4. Linux numbers the
    /// IPv4 identification of the segments of one GSO send 0, 1, 2, …, while the ICRC is
    /// computed for identification 0 (rc-transport.md §1.8 addendum). softverbs receivers read
    /// through a UDP socket and never see the field, so GSO between softverbs devices is
    /// lossless and much cheaper; but a peer that checks the ICRC over the real IP header
    /// (Linux rxe, a RoCEv2 NIC) drops every segment after the first. And a packet tap on an
    /// interface that segments late (`lo`, NICs with UDP segmentation offload) sees each GSO
    /// send as one oversized frame, which Wireshark does not decode as RoCEv2 (the driver's
    /// own capture, [`capture`](Self::capture), always holds the separate packets). IPv6 has
    /// no identification field: there only the packet-tap caveat applies.
    pub fn gso(mut self, on: bool) -> UdpBuilder {
        self.gso = on;
        self
    }

    /// Keeps UDP GRO (`UDP_GRO`) on for the devices' sockets where the kernel supports it
    /// (default **on**): the kernel may hand over a run of datagrams of one flow in one read
    /// (for example a GSO send of a softverbs peer on loopback, never cut into datagrams), and
    /// the driver splits it at the segment size the kernel reports, before captures and
    /// receive-side faults see it. It changes nothing on the wire. `false` turns it off (then
    /// the kernel cuts such runs itself).
    pub fn gro(mut self, on: bool) -> UdpBuilder {
        self.gro = on;
        self
    }

    /// Tests only: `SO_NO_CHECK` on every socket, with which the kernel refuses GSO sends.
    #[cfg(test)]
    pub(crate) fn no_udp_checksum(mut self) -> UdpBuilder {
        self.no_check = true;
        self
    }

    /// Binds every device's socket and starts its progress thread.
    ///
    /// Errors: an unspecified, multicast or broadcast address, or an invalid fault plan (either
    /// direction) →
    /// `InvalidArgument`; a socket that cannot be bound (address in use, not local), a capture
    /// file that cannot be created or a thread that cannot start → `Io`. On error nothing keeps
    /// running.
    pub fn build(self) -> Result<UdpProvider> {
        let addrs = if self.devices.is_empty() {
            vec![DEFAULT_ADDR]
        } else {
            self.devices.clone()
        };
        let injector = self
            .faults
            .clone()
            .map(Injector::new)
            .transpose()
            .map_err(|e| Error::invalid(format!("fault plan: {e}")))?;
        let rx_injector = self
            .rx_faults
            .clone()
            .map(Injector::new)
            .transpose()
            .map_err(|e| Error::invalid(format!("receive-side fault plan: {e}")))?;
        let opts = socket::Options {
            buffer: self.socket_buffer,
            gso: self.gso,
            gro: self.gro,
            #[cfg(test)]
            no_check: self.no_check,
        };
        let mut bound = Vec::with_capacity(addrs.len());
        for addr in &addrs {
            check_addr(*addr)?;
            let b = socket::bind(*addr, &opts)
                .map_err(|e| Error::new(ErrorKind::Io, format!("binding UDP {addr}: {e}")))?;
            bound.push(b);
        }
        let mut nodes: HashMap<SocketAddr, NodeId> = self.peers.iter().copied().collect();
        let node_id = |i: usize| NodeId(self.first_node.saturating_add(node_number(i)));
        for (i, b) in bound.iter().enumerate() {
            nodes.insert(b.info.local_addr, node_id(i));
        }
        let capture = match &self.capture {
            Some(path) => {
                let members = bound.iter().map(|b| b.info.local_addr).collect();
                let capture = Capture::create(path, members, false)
                    .map_err(|e| Error::new(ErrorKind::Io, e))?;
                Some(Arc::new(capture))
            }
            None => None,
        };
        let mut devices = Vec::with_capacity(bound.len());
        for (i, b) in bound.into_iter().enumerate() {
            let local = b.info.local_addr;
            let gid = Gid::from_ip(local.ip());
            let seed = self.seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let mut config = HcaConfig::new(format!("udp{i}"), gid, seed);
            config.udp_port = local.port();
            // One socket: packets leave from its port, so the engine computes the final ICRC.
            config.source_port = Some(local.port());
            config.foreign_ipv4_ident = self.foreign_ipv4_ident;
            let (name, guid) = (config.name.clone(), config.node_guid);
            let faults = FaultConfig::new(
                injector.clone(),
                rx_injector.clone(),
                nodes.clone(),
                node_id(i),
            );
            let runtime = Runtime::start(b, config, faults, capture.clone(), self.busy_poll)?;
            devices.push(UdpDevice(Arc::new(DeviceShared {
                runtime,
                name,
                guid,
                node: node_id(i),
            })));
        }
        Ok(UdpProvider {
            devices: Arc::new(devices),
            capture,
        })
    }
}

fn node_number(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}

fn check_addr(addr: SocketAddr) -> Result<()> {
    let ip = addr.ip();
    let bad = ip.is_unspecified()
        || ip.is_multicast()
        || matches!(ip, IpAddr::V4(v4) if v4.is_broadcast());
    if bad {
        return Err(Error::invalid(format!(
            "{addr}: a device needs a specific unicast address (its GID is derived from it)"
        )));
    }
    Ok(())
}

/// Emulated RDMA devices, each a UDP socket with its own progress thread.
///
/// Cloning shares the devices. The threads stop when [`shutdown`](Self::shutdown) is called
/// or when the provider, its devices and every handle opened from them are dropped.
#[derive(Clone, Debug)]
pub struct UdpProvider {
    devices: Arc<Vec<UdpDevice>>,
    /// The builder's capture, shared by the devices.
    capture: Option<Arc<Capture>>,
}

impl UdpProvider {
    /// A builder with no device yet (one at [`DEFAULT_ADDR`] if none is added).
    pub fn builder() -> UdpBuilder {
        UdpBuilder::default()
    }

    /// Stops every device's progress thread and closes its socket, waiting for the threads,
    /// then closes every capture file of the devices ([`finish_capture`](Self::finish_capture)
    /// reports their errors afterwards). Objects stay valid afterwards, but no packet moves and
    /// no timer fires.
    pub fn shutdown(&self) {
        for dev in self.devices.iter() {
            dev.shutdown();
        }
        let _ = self.finish_capture();
    }

    /// Stops capturing on every device of the provider — the builder's capture
    /// ([`UdpBuilder::capture`]) and those set with [`UdpDevice::set_capture`] — flushing and
    /// closing the files. Idempotent: the first error each file met (creating, writing,
    /// flushing, closing) is kept and reported again. `Ok` if nothing is captured; `Io`
    /// naming the file otherwise. A device keeps no capture running afterwards until
    /// [`UdpDevice::set_capture`] starts a new one.
    pub fn finish_capture(&self) -> Result<()> {
        let mut captures: Vec<Arc<Capture>> = self.capture.iter().cloned().collect();
        for dev in self.devices.iter() {
            if let Some(c) = dev.core().capture() {
                if !captures.iter().any(|k| Arc::ptr_eq(k, &c)) {
                    captures.push(c);
                }
            }
        }
        let mut first = Ok(());
        for c in captures {
            if let Err(e) = c.finish() {
                if first.is_ok() {
                    first = Err(Error::new(ErrorKind::Io, e));
                }
            }
        }
        first
    }
}

impl Provider for UdpProvider {
    type Device = UdpDevice;

    fn name(&self) -> &'static str {
        "udp"
    }

    fn devices(&self) -> Result<Vec<UdpDevice>> {
        Ok(self.devices.to_vec())
    }
}

#[derive(Debug)]
struct DeviceShared {
    runtime: Runtime,
    name: String,
    guid: u64,
    node: NodeId,
}

/// One emulated device: a UDP socket, an HCA and the progress thread between them; the
/// [`Port`] of the UDP backend. Its methods are reachable from a [`UdpContext`] too.
#[derive(Clone, Debug)]
pub struct UdpDevice(Arc<DeviceShared>);

impl UdpDevice {
    fn core(&self) -> &Core {
        &self.0.runtime.core
    }

    /// The socket's bound address: the device's IP (its GID) and UDP port.
    pub fn local_addr(&self) -> SocketAddr {
        self.core().socket_info().local_addr
    }

    /// What the kernel granted the socket, and the batching in use (GSO, GRO, `recvmmsg`).
    pub fn socket_info(&self) -> SocketInfo {
        self.core().socket_info()
    }

    /// The node number fault plans use for this device.
    pub fn node_id(&self) -> NodeId {
        self.0.node
    }

    /// Stops the progress thread and closes the socket, waiting for the thread; idempotent.
    /// A capture of this device alone ([`UdpDevice::set_capture`]) is closed; one shared with
    /// the provider's other devices stays open for them. Open contexts and handles stay valid,
    /// but no packet moves and no timer fires.
    pub fn shutdown(&self) {
        self.0.runtime.shutdown();
        if let Some(c) = self.core().capture().filter(|c| c.per_device) {
            let _ = c.finish();
        }
    }

    /// Transport counters summed over the device: packets no QP accepted (malformed, bad ICRC,
    /// unknown QP, wrong state or source) plus every live and destroyed QP's counters.
    pub fn device_stats(&self) -> Stats {
        self.core().query(|st| st.hca.stats())
    }

    /// Counters of the driver itself: loop wake-ups, datagrams and bytes through the socket,
    /// send and receive errors.
    pub fn driver_stats(&self) -> DriverStats {
        self.core().driver_stats()
    }

    /// Replaces the device's fault plan at run time (`None` removes it). The injector starts
    /// afresh (counters and rule state reset); datagrams already delayed or held stay so.
    /// `InvalidArgument` for an invalid plan, leaving the old one in place.
    pub fn set_faults(&self, plan: Option<FaultPlan>) -> Result<()> {
        let injector = plan
            .map(Injector::new)
            .transpose()
            .map_err(|e| Error::invalid(format!("fault plan: {e}")))?;
        self.core().faults().injector = injector;
        Ok(())
    }

    /// Names the node number fault plans use for datagrams this device sends to or receives
    /// from `addr` (a device of another process, known only once endpoints are exchanged), as
    /// [`UdpBuilder::peer_node`] does at build time (port 0 names every port of the IP); a
    /// later call for the same address wins.
    pub fn set_peer_node(&self, addr: SocketAddr, node: NodeId) {
        self.core().faults().set_node(addr, node);
    }

    /// The verdict counters of the device's send-side injector, if a plan is installed.
    pub fn fault_counters(&self) -> Option<Counters> {
        self.core()
            .faults()
            .injector
            .as_ref()
            .map(|i| i.counters().clone())
    }

    /// Replaces the device's receive-side fault plan at run time (`None` removes it), as
    /// [`UdpBuilder::rx_faults`] installs one at build time. The injector starts afresh
    /// (counters and rule state reset); received datagrams already delayed or held stay so
    /// until due or [`release_held`](Self::release_held). `InvalidArgument` for an invalid
    /// plan, leaving the old one in place.
    pub fn set_rx_faults(&self, plan: Option<FaultPlan>) -> Result<()> {
        let injector = plan
            .map(Injector::new)
            .transpose()
            .map_err(|e| Error::invalid(format!("receive-side fault plan: {e}")))?;
        self.core().faults().rx_injector = injector;
        Ok(())
    }

    /// The verdict counters of the device's receive-side injector, if a plan is installed:
    /// per link `source node → this device`, as [`fault_counters`](Self::fault_counters)
    /// counts the send side.
    pub fn rx_fault_counters(&self) -> Option<Counters> {
        self.core()
            .faults()
            .rx_injector
            .as_ref()
            .map(|i| i.counters().clone())
    }

    /// Delivers every datagram a hold rule is keeping — sent ones to the socket, received ones
    /// to the engine — and retires the hold rules of both injectors ([`Injector::release`]).
    pub fn release_held(&self) {
        {
            let mut guard = self.core().faults();
            let cfg = &mut *guard;
            for injector in [cfg.injector.as_mut(), cfg.rx_injector.as_mut()]
                .into_iter()
                .flatten()
            {
                injector.release();
            }
        }
        self.core().release_held();
    }

    /// Starts writing this device's live traffic to a pcap file of its own at `path` (created
    /// or truncated), or stops capturing with `None`: what the device writes to its socket
    /// (after the send-side faults) and what it reads from it (before the receive-side faults),
    /// framed as [`UdpBuilder::capture`] describes. It replaces the capture the device wrote to
    /// until now; a previous file of this device alone is closed, a file shared with the
    /// provider's other devices stays open for them.
    ///
    /// Errors (`Io`, naming the file): the new file cannot be created — then nothing changes;
    /// or the replaced file of this device alone met an error while it was written or closed —
    /// the switch is done anyway. [`UdpProvider::finish_capture`] closes the file too.
    pub fn set_capture(&self, path: Option<&Path>) -> Result<()> {
        let capture = match path {
            Some(path) => {
                let c = Capture::create(path, vec![self.local_addr()], true)
                    .map_err(|e| Error::new(ErrorKind::Io, e))?;
                Some(Arc::new(c))
            }
            None => None,
        };
        match self.core().set_capture(capture) {
            Some(old) if old.per_device => old.finish().map_err(|e| Error::new(ErrorKind::Io, e)),
            _ => Ok(()),
        }
    }

    /// Busy-poll mode (off by default): whether the progress thread spins on nonblocking
    /// receives or sleeps in `epoll_wait` while no application thread polls the device.
    ///
    /// In either mode, an application thread that polls the device drives it: a `poll` that
    /// finds a CQ of the device empty, and every `read` of one of its MRs (how `ib_write_lat`
    /// waits for the peer's WRITE), first run one nonblocking pass in the caller's thread —
    /// receive what the socket holds, feed the engine, fire due timers, send — unless another
    /// thread is doing so (then it returns at once). While an application thread has polled
    /// within [`crate::POLL_HANDOFF`] the progress thread leaves the device to it and sleeps
    /// (with the socket out of its poller while polls keep coming); once a poll found
    /// completions, a datagram that arrives wakes it, and it moves the datagram itself if no
    /// application thread has polled for [`crate::APP_GRACE`] (one that went on to spin on
    /// its memory without calling the library, as `ib_write_lat` does). After the hand-off
    /// time (and at once when a thread goes to sleep on a completion channel of the device)
    /// it takes over again. So a process that spins on its CQ or memory keeps one CPU busy,
    /// not two, and a busy-poll device only spins its own thread while nobody polls.
    pub fn set_busy_poll(&self, on: bool) {
        self.core().set_busy_poll(on);
    }

    /// Whether busy-poll mode is on.
    pub fn busy_poll(&self) -> bool {
        self.core().busy_poll()
    }
}

impl Device for UdpDevice {
    type Context = UdpContext;

    fn name(&self) -> String {
        self.0.name.clone()
    }

    fn node_guid(&self) -> u64 {
        self.0.guid
    }

    fn open(&self) -> Result<UdpContext> {
        Context::open(self.clone())
    }
}

impl Port for UdpDevice {
    fn device_name(&self) -> String {
        self.0.name.clone()
    }

    /// A command that may give the thread work: it sends what it made ready from the caller's
    /// thread and rings the progress thread only if it has to act (see the crate docs, "Threads
    /// and time").
    fn command<R>(&self, f: impl FnOnce(&mut DeviceState, Instant) -> R) -> Result<R> {
        Ok(self.core().command(f))
    }

    /// As [`command`](Self::command), except that a post directly following another leaves its
    /// packets to whoever sends next, so that bursts go out in batches.
    fn post_send<R>(&self, f: impl FnOnce(&mut DeviceState, Instant) -> R) -> Result<R> {
        Ok(self.core().post(f))
    }

    /// A receive makes nothing ready to send: it runs as a query (no clock read, no send
    /// from the caller's thread, no doorbell).
    fn post_recv<R>(&self, f: impl FnOnce(&mut DeviceState) -> R) -> Result<R> {
        Ok(self.core().post_recv(f))
    }

    fn query<R>(&self, f: impl FnOnce(&mut DeviceState) -> R) -> Result<R> {
        Ok(self.core().query(f))
    }

    fn flush(&self) -> Result<()> {
        self.core().flush();
        Ok(())
    }

    fn peek<R>(&self, f: impl FnOnce(&mut DeviceState) -> R) -> Result<R> {
        Ok(self.core().query(f))
    }

    /// An empty CQ poll runs one nonblocking progress pass in the caller's thread (see
    /// [`UdpDevice::set_busy_poll`]) and polls again; if the CQ is still empty and the
    /// thread's last two CQ polls found nothing either, the caller yields its CPU
    /// (`sched_yield`) before it returns; async events and channel events are taken as they
    /// are (the progress thread delivers them).
    fn wait_take<R>(
        &self,
        what: Waiting,
        mut take: impl FnMut(&mut DeviceState) -> Result<Option<R>>,
    ) -> Result<Option<R>> {
        match what {
            Waiting::Channel => Ok(None),
            Waiting::AsyncEvent => self.core().query(take),
            Waiting::Cq => {
                if let Some(r) = self.core().query(&mut take)? {
                    EMPTY_POLLS.set(0);
                    self.core().app_found(false);
                    return Ok(Some(r));
                }
                self.core().app_poll();
                let r = self.core().query(take)?;
                if r.is_none() {
                    empty_poll();
                } else {
                    EMPTY_POLLS.set(0);
                    self.core().app_found(true);
                }
                Ok(r)
            }
        }
    }

    /// A wait first drives the device in the caller's thread for up to [`CHANNEL_SPIN`] (or
    /// [`CHANNEL_SPIN_IDLE`], never longer than `timeout`); a wait that then still has to
    /// block hands the device back to its progress thread (the caller stops polling it; see
    /// [`crate::POLL_HANDOFF`]).
    fn wait_channel(
        &self,
        channel: &ChannelShared,
        timeout: Option<Duration>,
    ) -> Result<Option<u32>> {
        if let Some(cq) = channel.try_get() {
            return Ok(Some(cq));
        }
        let most = if SLEPT_LONG.get() {
            CHANNEL_SPIN_IDLE
        } else {
            CHANNEL_SPIN
        };
        let spin = timeout.map_or(most, |t| t.min(most));
        let start = WallClock::now();
        EMPTY_POLLS.set(0);
        while start.elapsed() < spin {
            self.core().app_poll();
            if let Some(cq) = channel.try_get() {
                // The caller may stop calling now: arrivals go back to the progress thread.
                EMPTY_POLLS.set(0);
                SLEPT_LONG.set(false);
                self.core().app_found(true);
                return Ok(Some(cq));
            }
            empty_poll();
        }
        EMPTY_POLLS.set(0);
        self.core().app_sleeps();
        let asleep = WallClock::now();
        let event = channel.wait(timeout);
        SLEPT_LONG.set(asleep.elapsed() > CHANNEL_SPIN);
        Ok(event)
    }

    /// Spinning on an MR byte (how `ib_write_lat` waits for the peer's WRITE) moves the
    /// traffic it waits for: one nonblocking progress pass in the caller's thread.
    fn reading_memory(&self) {
        self.core().app_poll();
    }

    /// The progress thread (or the next poll) moves traffic: pause briefly, give up after
    /// 60 s. A UDP device is never known to be idle (a peer may send at any time).
    fn between_polls(&self, start: WallClock) -> Result<Idle> {
        if start.elapsed() > NEXT_COMPLETION_WAIT {
            return Ok(Idle::TimedOut);
        }
        std::thread::sleep(POLL_PAUSE);
        Ok(Idle::Again)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// A datagram arrives while an application thread polls the device and holds its socket
    /// side (its pass runs, or its thread was preempted in one): the progress thread, woken
    /// to cover the datagram, waits for that pass asleep, and moves the datagram once the
    /// side is free. It used to wait spinning on `sched_yield`, which kept one CPU busy while
    /// the polling application and the peer shared the other (64 KiB `write_bw` at half its
    /// rate). With the side held for 100 ms the thread now spends about 10 ms of CPU in the
    /// test build (it looks again after 10 µs, then twice as late each time up to 160 µs);
    /// spinning, it spent all 100. A wake-up that comes after the application's hand-off ran
    /// out (a loaded machine) never reaches the cover; such a round is run again.
    #[test]
    fn covering_for_an_application_that_holds_the_device_sleeps() {
        let p = UdpProvider::builder()
            .device("127.0.0.123:0".parse().unwrap())
            .build()
            .unwrap();
        let dev = p.devices().unwrap().remove(0);
        let (runtime, core) = (&dev.0.runtime, dev.core());
        let peer = std::net::UdpSocket::bind("127.0.0.124:0").unwrap();
        const HOLD: Duration = Duration::from_millis(100);
        for round in 0..5 {
            let covered = core.driver_stats().covered;
            let guard = core.hold_socket_side();
            // The application polls (it cannot run a pass: the side is held) and its pass
            // is still running when a datagram arrives.
            core.app_poll();
            let cpu = runtime.thread_cpu().unwrap();
            peer.send_to(&[0u8; 64], dev.local_addr()).unwrap();
            std::thread::sleep(HOLD);
            let spent = runtime.thread_cpu().unwrap() - cpu;
            drop(guard);
            let start = WallClock::now();
            while core.driver_stats().covered == covered && start.elapsed() < HOLD {
                std::thread::sleep(Duration::from_millis(1));
            }
            if core.driver_stats().covered == covered {
                eprintln!("round {round}: the thread woke after the hand-off; again");
                continue;
            }
            assert!(
                spent < HOLD * 3 / 10,
                "{spent:?} of CPU while covering for {HOLD:?}"
            );
            p.shutdown();
            return;
        }
        panic!("in 5 rounds the progress thread never covered for the polling thread");
    }
}
