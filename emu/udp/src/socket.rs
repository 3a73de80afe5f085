//! The device's UDP socket: bound with socket2, buffers raised toward the system maximum,
//! nonblocking, set up for batched I/O by `quinn-udp` (UDP GSO/GRO, `recvmmsg`), handed to
//! mio.
//!
//! `quinn-udp` sets the socket options and control messages of segmentation offload safely:
//! [`quinn_udp::UdpSocketState::new`] turns `UDP_GRO` on where the kernel has it and probes
//! `UDP_SEGMENT`; its `recv` reads up to [`quinn_udp::BATCH_SIZE`] buffers per `recvmmsg` and
//! reports each buffer's segment size. A GSO send is ours ([`send_gso`]): one `sendmsg` with
//! an iovec per datagram, so a run goes out from the datagrams' own buffers without first
//! being copied into one. If the state cannot be set up the socket falls back to
//! `recv_from`/`send_to`, one datagram per system call.

use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;

use quinn_udp::UdpSocketState;
use socket2::{Domain, Protocol, Socket, Type};

/// What the kernel granted a device's socket, read back after setting it up, and the batching
/// strategy in use.
///
/// Linux doubles the value asked for `SO_RCVBUF`/`SO_SNDBUF` (bookkeeping overhead) and caps
/// the request at `net.core.rmem_max`/`net.core.wmem_max`, so the granted sizes are usually
/// twice those sysctls.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct SocketInfo {
    /// The address the socket is bound to (with the OS-chosen port if port 0 was asked for).
    pub local_addr: SocketAddr,
    /// Bytes asked for each of `SO_RCVBUF` and `SO_SNDBUF`.
    pub requested_buffer: usize,
    /// `SO_RCVBUF` as the kernel reports it after the request.
    pub recv_buffer: usize,
    /// `SO_SNDBUF` as the kernel reports it after the request.
    pub send_buffer: usize,
    /// Whether IPv4 "don't fragment" was forced with `IP_MTU_DISCOVER = IP_PMTUDISC_DO`.
    ///
    /// With it, Linux sends every datagram of an unconnected socket with DF set and IPv4
    /// identification 0 — the values the ICRC (which covers both) assumes, so a real RoCEv2
    /// peer's check passes (rc-transport.md §1.8 addendum). `false` for IPv6 sockets, which
    /// have no identification field, or if the kernel refused the option.
    pub dont_fragment_forced: bool,
    /// Datagrams the kernel takes in one UDP GSO (`UDP_SEGMENT`) send on this socket; 1 if it
    /// has no UDP GSO.
    pub gso_segments: usize,
    /// Whether sends coalesce runs of equal-size datagrams to one destination into GSO sends:
    /// asked for ([`crate::UdpBuilder::gso`]), supported (`gso_segments > 1`), and not turned
    /// off after the kernel refused one ([`crate::DriverStats::gso_refused`]).
    pub gso_enabled: bool,
    /// Whether `UDP_GRO` is on: the kernel may hand over several datagrams of one flow in one
    /// read, which the driver splits at the segment size the kernel reports.
    pub gro_enabled: bool,
    /// Receive buffers filled per receive system call: [`quinn_udp::BATCH_SIZE`] with
    /// `recvmmsg`, 1 on the `recv_from` fallback.
    pub recv_batch: usize,
}

/// How to set a socket up.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Options {
    /// Bytes to ask for each socket buffer.
    pub(crate) buffer: usize,
    /// Use UDP GSO for sends if the kernel has it.
    pub(crate) gso: bool,
    /// Keep `UDP_GRO` on if the kernel has it.
    pub(crate) gro: bool,
    /// Tests only: `SO_NO_CHECK`, with which the kernel refuses every GSO send (`EINVAL`).
    #[cfg(test)]
    pub(crate) no_check: bool,
}

/// A bound socket and its batching state.
#[derive(Debug)]
pub(crate) struct Bound {
    pub(crate) socket: mio::net::UdpSocket,
    /// The same socket (a duplicated descriptor, nonblocking too), for the progress thread to
    /// see whether a datagram is still waiting without taking the socket side.
    pub(crate) peek: std::net::UdpSocket,
    /// `None`: batching could not be set up; plain `recv_from`/`send_to`.
    pub(crate) state: Option<UdpSocketState>,
    pub(crate) info: SocketInfo,
}

/// Opens a nonblocking UDP socket bound to `addr` and sets it up per `opts`. A refused buffer
/// size or option is not an error: [`SocketInfo`] says what was granted.
pub(crate) fn bind(addr: SocketAddr, opts: &Options) -> io::Result<Bound> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    // The kernel clamps to net.core.{r,w}mem_max; an error here only means "keep the default".
    let _ = socket.set_recv_buffer_size(opts.buffer);
    let _ = socket.set_send_buffer_size(opts.buffer);
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    let local_addr = socket
        .local_addr()?
        .as_socket()
        .ok_or_else(|| io::Error::other("bound socket has no IP address"))?;
    // Turns UDP_GRO on and probes UDP_SEGMENT; it also sets IP_MTU_DISCOVER to
    // IP_PMTUDISC_PROBE, which the DF setting below replaces.
    let state = UdpSocketState::new((&socket).into()).ok();
    let mut gro_enabled = state.as_ref().is_some_and(|s| s.gro_segments() > 1);
    if gro_enabled && !opts.gro {
        gro_enabled = set_int(&socket, libc::SOL_UDP, libc::UDP_GRO, 0).is_err();
    }
    let gso_segments = state.as_ref().map_or(1, |s| s.max_gso_segments());
    let dont_fragment_forced = if addr.is_ipv4() {
        set_int(
            &socket,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )
        .is_ok()
    } else {
        // No DF in IPv6; never fragment locally either, as for IPv4.
        let _ = set_int(
            &socket,
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DO,
        );
        false
    };
    #[cfg(test)]
    if opts.no_check {
        // Linux's SO_NO_CHECK (asm-generic/socket.h): UDP checksum 0, and no GSO.
        set_int(&socket, libc::SOL_SOCKET, 11, 1)?;
    }
    let info = SocketInfo {
        local_addr,
        requested_buffer: opts.buffer,
        recv_buffer: socket.recv_buffer_size()?,
        send_buffer: socket.send_buffer_size()?,
        dont_fragment_forced,
        gso_segments,
        gso_enabled: opts.gso && gso_segments > 1,
        gro_enabled,
        recv_batch: if state.is_some() {
            quinn_udp::BATCH_SIZE
        } else {
            1
        },
    };
    let peek: std::net::UdpSocket = socket.try_clone()?.into();
    let std_socket: std::net::UdpSocket = socket.into();
    Ok(Bound {
        socket: mio::net::UdpSocket::from_std(std_socket),
        peek,
        state,
        info,
    })
}

/// Sets an integer socket option that socket2 0.5 has no setter for (`IP_MTU_DISCOVER`,
/// `IPV6_MTU_DISCOVER`, `UDP_GRO`).
#[allow(unsafe_code)]
fn set_int(
    socket: &Socket,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let len = libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>())
        .map_err(|_| io::Error::other("socklen_t overflow"))?;
    // SAFETY: the fd is an open socket owned by `socket` for the whole call; the option value
    // points to a live `c_int` and `len` is exactly its size, as setsockopt(2) requires.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            (&raw const value).cast(),
            len,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The control message of a GSO send: one `UDP_SEGMENT` header and its `u16`, laid out as
/// `CMSG_FIRSTHDR`/`CMSG_DATA` find them (the data right after the header, which is already
/// aligned to `size_t`), its size (with `repr(C)`'s trailing padding) `CMSG_SPACE(2)`; the
/// kernel reads `cmsg_len` bytes of it and skips the padding.
#[repr(C)]
struct SegmentCmsg {
    hdr: libc::cmsghdr,
    segment_size: u16,
}

/// Sends `segments` to `dst` with one `sendmsg(2)` carrying a `UDP_SEGMENT` control message of
/// `segment_size`: the kernel gathers the slices (one iovec each, no copy here) and cuts the
/// whole into datagrams of `segment_size` bytes, the last one possibly shorter — so every
/// slice but the last must be exactly `segment_size` long and the last no longer.
///
/// Nonblocking (`MSG_DONTWAIT`, as the socket is). Returns the bytes sent (all of them: UDP
/// does not send partially). Errors are `sendmsg`'s: `WouldBlock` when the send buffer is full,
/// `Interrupted`, and `EIO`/`EINVAL` where the path has no segmentation offload. No `IP_TOS`
/// or source-address control message is sent (the socket's defaults apply, as for `send_to`).
#[allow(unsafe_code)]
pub(crate) fn send_gso(
    socket: &impl AsRawFd,
    dst: SocketAddr,
    segments: &[IoSlice<'_>],
    segment_size: u16,
) -> io::Result<usize> {
    let addr = socket2::SockAddr::from(dst);
    let mut cmsg = SegmentCmsg {
        // SAFETY: `cmsghdr` is plain integers (and private padding on some targets), for which
        // all-zero bytes are a valid value.
        hdr: unsafe { std::mem::zeroed() },
        segment_size,
    };
    cmsg.hdr.cmsg_level = libc::SOL_UDP;
    cmsg.hdr.cmsg_type = libc::UDP_SEGMENT;
    cmsg.hdr.cmsg_len = SEGMENT_CMSG_LEN as _;
    // SAFETY: as above, `msghdr` is integers and pointers, all-zero (null) being valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = addr.as_ptr().cast_mut().cast();
    msg.msg_namelen = addr.len();
    // `IoSlice` is ABI-compatible with `iovec` on Unix; sendmsg does not write through these.
    msg.msg_iov = segments.as_ptr().cast_mut().cast();
    msg.msg_iovlen = segments.len() as _;
    msg.msg_control = (&raw mut cmsg).cast();
    msg.msg_controllen = size_of::<SegmentCmsg>() as _;
    // SAFETY: the fd is an open socket borrowed for the whole call; `msg` points to the
    // destination address, `segments.len()` live iovecs and one well-formed control message,
    // all of which outlive the call; the kernel only reads them.
    let n = unsafe { libc::sendmsg(socket.as_raw_fd(), &raw const msg, libc::MSG_DONTWAIT) };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// `CMSG_LEN(2)`: the `UDP_SEGMENT` header and its `u16`, without the trailing padding.
const SEGMENT_CMSG_LEN: usize = std::mem::offset_of!(SegmentCmsg, segment_size) + size_of::<u16>();

// The layout above is what the C macros compute: data right after the header, padded length.
#[allow(unsafe_code)]
// SAFETY: `CMSG_LEN` and `CMSG_SPACE` are arithmetic on their argument only.
const _: () = assert!(
    unsafe { libc::CMSG_LEN(2) } as usize == SEGMENT_CMSG_LEN
        && unsafe { libc::CMSG_SPACE(2) } as usize == size_of::<SegmentCmsg>()
);

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Duration;

    use super::*;

    fn sender(addr: &str, no_check: bool) -> Option<Bound> {
        let opts = Options {
            buffer: 1 << 20,
            gso: true,
            gro: false,
            no_check,
        };
        let bound = bind(addr.parse().unwrap(), &opts).ok()?;
        if bound.info.gso_segments < 2 {
            eprintln!("SKIP: no UDP GSO here ({:?})", bound.info);
            return None;
        }
        Some(bound)
    }

    /// A plain socket: no `UDP_GRO`, so each datagram is one read.
    fn receiver(addr: &str) -> std::net::UdpSocket {
        let rx = std::net::UdpSocket::bind(addr).unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        rx
    }

    /// Five datagrams of 1,000 bytes and a last one of 300, each its own pattern.
    fn run() -> Vec<Vec<u8>> {
        (0..6u8)
            .map(|i| {
                let len = if i == 5 { 300 } else { 1000 };
                (0..len).map(|j| (j as u8).wrapping_mul(31) ^ i).collect()
            })
            .collect()
    }

    fn send_and_check(tx: &Bound, rx: &std::net::UdpSocket) {
        let run = run();
        let iov: Vec<IoSlice<'_>> = run.iter().map(|d| IoSlice::new(d)).collect();
        let n = send_gso(&tx.socket, rx.local_addr().unwrap(), &iov, 1000).unwrap();
        assert_eq!(n, 5300);
        let mut buf = [0; 4096];
        for want in &run {
            let (len, from) = rx.recv_from(&mut buf).unwrap();
            assert_eq!(from, tx.info.local_addr);
            assert!(
                &buf[..len] == want.as_slice(),
                "datagram of {len} B differs"
            );
        }
        rx.set_nonblocking(true).unwrap();
        assert!(rx.recv_from(&mut buf).is_err(), "more datagrams than sent");
    }

    #[test]
    fn a_gso_send_from_separate_buffers_arrives_as_separate_datagrams() {
        let Some(tx) = sender("127.0.0.1:0", false) else {
            return;
        };
        send_and_check(&tx, &receiver("127.0.0.1:0"));
    }

    #[test]
    fn a_gso_send_reaches_an_ipv6_peer() {
        let Some(tx) = sender("[::1]:0", false) else {
            eprintln!("SKIP: no IPv6 loopback");
            return;
        };
        send_and_check(&tx, &receiver("[::1]:0"));
    }

    /// `SO_NO_CHECK` makes the kernel refuse GSO: the error the runtime turns GSO off on.
    #[test]
    fn a_refused_gso_send_returns_einval_or_eio() {
        let Some(tx) = sender("127.0.0.1:0", true) else {
            return;
        };
        let rx = receiver("127.0.0.1:0");
        let run = run();
        let iov: Vec<IoSlice<'_>> = run.iter().map(|d| IoSlice::new(d)).collect();
        let e = send_gso(&tx.socket, rx.local_addr().unwrap(), &iov, 1000).unwrap_err();
        assert!(
            matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EIO)),
            "{e}"
        );
    }
}
