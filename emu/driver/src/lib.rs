//! `emu-driver`: softverbs over real UDP sockets, between threads, processes and hosts.
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
//! use emu_driver::UdpProvider;
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
//! One progress thread per device (see the `engine` module docs): it waits in `epoll_wait`
//! (through mio) for a datagram, the doorbell that verbs calls ring, or the engine's next timer
//! deadline, so an idle device costs no CPU. Work per wake-up is bounded ([`RX_BATCH`]
//! datagrams in, [`TX_BATCH`] packets out). [`UdpContext::set_busy_poll`] makes it spin
//! instead. Engine time is `std::time::Instant` since the device was created. The thread stops
//! (and the socket closes) on [`UdpProvider::shutdown`] / [`UdpDevice::shutdown`] or when the
//! last handle of the device is dropped.
//!
//! # Faults
//!
//! A [`emu_fault::FaultPlan`] (from [`UdpBuilder::faults`] or, at run time,
//! [`UdpContext::set_faults`]) decides every datagram a device sends: drop, duplicate,
//! corrupt, truncate, delay, hold, partition, rate-limit, exactly as in the in-process backend.
//! Device `i` of a builder is node `i`.
//!
//! # What the driver checks
//!
//! Every received datagram goes to the engine, which drops and counts (never answers) a bad
//! ICRC, a malformed packet, an unknown QP, a QP in the wrong state or a source address other
//! than the QP's peer: see [`UdpContext::device_stats`] and [`UdpQp::stats`]. The ICRC is
//! recomputed on send for the real UDP source port (the device's socket port).
//!
//! # Not done yet
//!
//! GSO/GRO and `sendmmsg`/`recvmmsg` batching (the receive and send loops are where they plug
//! in), forcing IPv4 DF (socket2 0.5 has no `IP_MTU_DISCOVER` setter; Linux sets DF by default
//! for datagrams that fit the path MTU), faults on the receive side, pcap capture of live
//! traffic.
#![deny(unsafe_code)]

mod engine;
mod fault;
pub mod oob;
mod provider;
mod socket;

pub use engine::{DriverStats, RX_BATCH, TX_BATCH};
pub use fault::UNKNOWN_NODE;
pub use provider::{
    DEFAULT_ADDR, DEFAULT_SOCKET_BUFFER, UdpBuilder, UdpChannel, UdpContext, UdpCq, UdpDevice,
    UdpMr, UdpPd, UdpProvider, UdpQp, UdpSrq,
};
pub use socket::SocketInfo;
