//! `emu-udp`: softverbs over real UDP sockets, between threads, processes and hosts.
//!
//! Each emulated device is a UDP socket bound to an address of the caller's choice (loopback
//! and the RoCEv2 port 4791 by default), an [`emu_proto::Hca`], and a progress thread between
//! them. The device's GID is its IP address (IPv4-mapped for IPv4, as RoCEv2 does) and its
//! endpoints carry the bound UDP port, so two devices may share an IP on different ports.
//! Packets are RoCEv2 UDP payloads (BTH, extension headers, payload, ICRC).
//!
//! Start with [`UdpProvider::builder`], list its devices with [`verbs_api::Provider::devices`]
//! and open one; everything else is the `verbs_api` object model, as with the in-process
//! backend (emu-sim). Two processes connect a QP pair with one call each through [`oob`].
//!
//! ```
//! use emu_udp::UdpProvider;
//! use verbs_api::{Context, Device, Provider};
//!
//! let provider = UdpProvider::builder()
//!     .device("127.0.0.1:0".parse()?)
//!     .device("127.0.0.2:0".parse()?)
//!     .build()?;
//! let devices = provider.devices()?;
//! let ctx = devices[0].open()?;
//! println!("{} at {}, SO_RCVBUF {}", ctx.device_name(), ctx.local_addr(), ctx.socket_info().recv_buffer);
//! provider.shutdown(); // or drop every handle
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Threads and time
//!
//! One progress thread per device (see the `runtime` module docs), but the work runs in the
//! thread that has it at hand when that saves a wake-up:
//!
//! - a verbs call that makes packets ready (`post_send`, `modify`, …) sends them itself, up to
//!   [`TX_BATCH`], through the same path as the thread (send-side faults, capture, GSO); the
//!   thread is rung only if packets are left over or a timer deadline moved earlier than the
//!   one it sleeps on. A `post_send` that directly follows another leaves its packets to
//!   whoever sends next, so that bursts go out in batches;
//! - an application thread that polls the device — a `poll` that finds a CQ empty, a `read`
//!   of an MR (how `ib_write_lat` waits) — runs one nonblocking pass of the engine itself
//!   (receive, engine, send, due timers). While such polls keep coming (within
//!   [`POLL_HANDOFF`]) the progress thread sleeps, so one polling process keeps one CPU
//!   busy, not two; once a poll found completions, a datagram still unread [`APP_GRACE`]
//!   after the last poll (the application spins on its memory instead) wakes it to move it;
//!   a thread going to sleep on a completion
//!   channel of the device hands it back at once. A polling pass that only has ACKs to send
//!   leaves them for the caller's next call, so the application's next request leaves first;
//! - the progress thread does the rest: it waits in `epoll_wait` (through mio) for a
//!   datagram, the doorbell, writability or the engine's next timer deadline, so an idle
//!   device costs no CPU. Work per wake-up is bounded ([`RX_BATCH`] datagrams in,
//!   [`TX_BATCH`] packets out; see [Batching](#batching)). [`UdpDevice::set_busy_poll`]
//!   makes it spin instead while no application thread polls.
//!
//! Engine time is `std::time::Instant` since the device was created. The thread stops (and
//! the socket closes) on [`UdpProvider::shutdown`] / [`UdpDevice::shutdown`] or when the last
//! handle of the device is dropped.
//!
//! # Faults
//!
//! A [`emu_fault::FaultPlan`] (from [`UdpBuilder::faults`] or, at run time,
//! [`UdpDevice::set_faults`]) decides every datagram a device sends: drop, duplicate,
//! corrupt, truncate, delay, hold, partition, rate-limit, exactly as in the in-process backend
//! (the same classifier, [`emu_fault::DatagramMeta::classify`], and the same
//! [`emu_fault::Stage`]; a datagram that does not parse is judged too).
//! A second, independent plan ([`UdpBuilder::rx_faults`], [`UdpDevice::set_rx_faults`])
//! decides every datagram the device reads from its socket before the engine sees it, so
//! faults apply even when the peer is not softverbs (a RoCEv2 NIC, Linux rxe). Device `i` of a
//! builder is node `i`; other addresses are named with [`UdpBuilder::peer_node`]. Verdict
//! counters: [`UdpDevice::fault_counters`] and [`UdpDevice::rx_fault_counters`].
//!
//! # Capture
//!
//! [`UdpBuilder::capture`] writes the live traffic of a provider's devices to one pcap file,
//! [`UdpDevice::set_capture`] that of one device at run time: what the device writes to its
//! socket (after the send-side faults) and what it reads (before the receive-side faults),
//! with the real IP addresses, UDP ports and wall-clock timestamps. Wireshark decodes it as
//! RoCEv2 (for ports other than 4791: `tshark -d udp.port==PORT,infiniband`).
//! [`UdpProvider::shutdown`] and [`UdpProvider::finish_capture`] close the files; write errors
//! are kept and reported, never panicked on.
//!
//! # Batching
//!
//! Receives are batched: up to 32 datagrams per `recvmmsg`, and UDP GRO on by default
//! ([`UdpBuilder::gro`]), which lets the kernel hand over a run of datagrams of one flow in
//! one buffer; the driver splits it before captures, receive-side faults and the engine see
//! it. Sends are one `send_to` per datagram by default. [`UdpBuilder::gso`] (off by default)
//! sends each run of equal-size datagrams to one destination with one UDP GSO `sendmsg`,
//! falling back to one datagram per call where the kernel has no GSO or refuses it. It is
//! opt-in because Linux numbers the IPv4 identification of GSO segments 0, 1, 2, … while the
//! ICRC assumes 0: softverbs peers never see the field, RoCEv2 NICs and rxe drop every segment
//! after the first (see [`UdpBuilder::gso`]). [`UdpDevice::socket_info`] reports what is in
//! use; [`DriverStats`] counts system calls, GSO sends and GRO buffers. Socket setup, the GSO
//! control message and the `recvmmsg` headers (built once per socket) are the driver's own, on
//! libc; IPv4 DF (`IP_PMTUDISC_DO`) is forced as before.
//!
//! # What the driver checks
//!
//! Every received datagram goes to the engine, which drops and counts (never answers) a bad
//! ICRC, a malformed packet, an unknown QP, a QP in the wrong state or a source address other
//! than the QP's peer, per cause (`Stats::rx_drops`): see [`UdpDevice::device_stats`] and
//! [`emu_device::Qp::stats`]. The engine computes each packet's ICRC once, for the UDP source
//! port it really leaves from (the device's socket port, `HcaConfig::source_port`).
//!
//! # Not done yet
//!
//! `sendmmsg`: without GSO every datagram costs one `send_to`. GSO on by
//! default: it would need either peers that ignore the IPv4 identification or the kernel not
//! renumbering segments. Segmentation-aware captures on `lo`: a packet tap there sees a GSO
//! send as one frame (the driver's own capture is per packet).
//!
//! # Handles
//!
//! The verbs handles are [`emu_device`]'s, named here by type aliases over the port
//! [`UdpDevice`] ([`UdpContext`] is `emu_device::Context<UdpDevice>`, …). A context derefs to
//! its device, so the device's methods (fault plans, capture, busy polling, socket
//! information, counters) are called on the context as well. This crate depends on no other
//! backend.
#![deny(unsafe_code)]

mod capture;
mod fault;
pub mod oob;
mod provider;
mod runtime;
mod socket;
mod timer;

pub use fault::UNKNOWN_NODE;
pub use provider::{
    CHANNEL_SPIN, CHANNEL_SPIN_IDLE, DEFAULT_ADDR, DEFAULT_SOCKET_BUFFER, UdpBuilder, UdpChannel,
    UdpContext, UdpCq, UdpDevice, UdpMr, UdpMw, UdpPd, UdpProvider, UdpQp, UdpSrq,
};
pub use runtime::{APP_GRACE, DriverStats, HANDOFF_CHECK_MAX, POLL_HANDOFF, RX_BATCH, TX_BATCH};
pub use socket::SocketInfo;
