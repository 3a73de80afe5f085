//! The device's UDP socket: bound with socket2, buffers raised toward the system maximum,
//! nonblocking, set up for batched I/O (UDP GSO and GRO, `recvmmsg`), handed to mio.
//!
//! Batched I/O is ours, on libc: `UDP_GRO` turned on where the kernel has it and `UDP_SEGMENT`
//! probed at bind; a GSO send ([`send_gso`]) is one `sendmsg` with an iovec per datagram, so a
//! run goes out from the datagrams' own buffers without first being copied into one; a
//! receive ([`RecvArea::recv`]) is one `recvmmsg` into headers built once per socket, so a
//! poll that finds the socket empty costs the system call alone (quinn-udp, used before,
//! zeroed and rebuilt 32 headers per call and turned on two control messages per datagram
//! that nothing read). This is not a general UDP library: it does what the runtime needs on
//! Linux, and nothing for other systems.

use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;

use socket2::{Domain, Protocol, Socket, Type};

/// Buffers one `recvmmsg` call fills at most.
pub(crate) const RECV_BATCH: usize = 32;
/// Datagrams one GSO send may carry (`UDP_MAX_SEGMENTS` in linux/udp.h).
const UDP_MAX_SEGMENTS: usize = 64;

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
    /// Receive buffers one receive system call (`recvmmsg`) fills at most.
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

/// A bound socket and what it was granted.
#[derive(Debug)]
pub(crate) struct Bound {
    pub(crate) socket: mio::net::UdpSocket,
    /// The same socket (a duplicated descriptor, nonblocking too), for the progress thread to
    /// see whether a datagram is still waiting without taking the socket side.
    pub(crate) peek: std::net::UdpSocket,
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
    let gro_enabled = opts.gro && set_int(&socket, libc::SOL_UDP, libc::UDP_GRO, 1).is_ok();
    // A kernel with UDP GSO (Linux 4.18) takes a socket-wide segment size; it is set back to
    // 0 at once, as every GSO send carries its own in a control message.
    let gso_segments = if set_int(&socket, libc::SOL_UDP, libc::UDP_SEGMENT, 1500).is_ok() {
        let _ = set_int(&socket, libc::SOL_UDP, libc::UDP_SEGMENT, 0);
        UDP_MAX_SEGMENTS
    } else {
        1
    };
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
        recv_batch: RECV_BATCH,
    };
    let peek: std::net::UdpSocket = socket.try_clone()?.into();
    let std_socket: std::net::UdpSocket = socket.into();
    Ok(Bound {
        socket: mio::net::UdpSocket::from_std(std_socket),
        peek,
        info,
    })
}

/// Sets an integer socket option that socket2 0.5 has no setter for (`IP_MTU_DISCOVER`,
/// `IPV6_MTU_DISCOVER`, `UDP_GRO`, `UDP_SEGMENT`).
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

/// CPU time `thread` has used so far (its `pthread_getcpuclockid(3)` clock); `None` if the
/// clock cannot be read. For tests that bound how much CPU the progress thread burns.
#[cfg(test)]
#[allow(unsafe_code)]
pub(crate) fn thread_cpu_time(thread: &std::thread::JoinHandle<()>) -> Option<std::time::Duration> {
    use std::os::unix::thread::JoinHandleExt;
    let mut clock: libc::clockid_t = 0;
    // SAFETY: `thread` is a handle not yet joined, so its `pthread_t` names a thread that has
    // not been reaped; `clock` is a live out parameter.
    let rc = unsafe { libc::pthread_getcpuclockid(thread.as_pthread_t(), &raw mut clock) };
    if rc != 0 {
        return None;
    }
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a clock id the kernel just gave and a live out parameter.
    let rc = unsafe { libc::clock_gettime(clock, &raw mut ts) };
    (rc == 0).then(|| {
        std::time::Duration::new(
            u64::try_from(ts.tv_sec).unwrap_or(0),
            u32::try_from(ts.tv_nsec).unwrap_or(0),
        )
    })
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

/// Leaves `socket` registered in the epoll instance `poller` (under `token`, as mio stores it)
/// with an empty interest: `EPOLLET` alone, to which the kernel adds only the `EPOLLERR` and
/// `EPOLLHUP` it always reports. An arriving datagram's wake-up (keyed `EPOLLIN | EPOLLPRI |
/// EPOLLRDNORM | EPOLLRDBAND`) matches none of these, so it neither queues the socket nor
/// wakes a waiter. mio's `Interest` cannot be empty, and `EPOLLPRI`, the one it can name that
/// a UDP socket never reports, matches that key: every datagram woke the waiter for nothing.
/// Registering again with mio's `reregister` restores an interest. One `EPOLL_CTL_MOD`: 0.3 µs
/// on the build machine, where `EPOLL_CTL_DEL` and a later `EPOLL_CTL_ADD` take 1.6–1.9 µs
/// together.
#[allow(unsafe_code)]
pub(crate) fn mute_in_poller(
    poller: &impl AsRawFd,
    socket: &impl AsRawFd,
    token: usize,
) -> io::Result<()> {
    let mut event = libc::epoll_event {
        events: libc::EPOLLET as u32,
        u64: token as u64,
    };
    // SAFETY: both fds are open and borrowed for the whole call (an epoll instance and a
    // socket registered in it); `event` is a live, initialized `epoll_event` that the kernel
    // only reads.
    let rc = unsafe {
        libc::epoll_ctl(
            poller.as_raw_fd(),
            libc::EPOLL_CTL_MOD,
            socket.as_raw_fd(),
            &raw mut event,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
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

/// Control-message room per receive buffer: the `UDP_GRO` segment size (`CMSG_SPACE(4)`, 24
/// bytes on 64-bit Linux) and room for one more the kernel might add; a control message that
/// does not fit is cut off (`MSG_CTRUNC`), and `UDP_GRO`'s comes first.
const CTRL_LEN: usize = 64;

/// One buffer's control-message room, aligned for `cmsghdr`.
#[repr(C, align(8))]
#[derive(Copy, Clone)]
struct Ctrl([u8; CTRL_LEN]);

/// A socket's receive area: `count` buffers of `len` bytes and, for each, the `mmsghdr` that
/// `recvmmsg` fills, with its source-address slot, iovec and control room, all built once.
/// The kernel writes a header's `msg_len`, `msg_namelen`, `msg_controllen` and `msg_flags`
/// only for the datagrams it returns, and [`recv`](Self::recv) re-arms exactly those, so a
/// call that finds the socket empty touches no header at all.
pub(crate) struct RecvArea {
    buf: Box<[u8]>,
    buf_len: usize,
    hdrs: Box<[libc::mmsghdr]>,
    names: Box<[libc::sockaddr_storage]>,
    ctrls: Box<[Ctrl]>,
    iovs: Box<[libc::iovec]>,
}

// SAFETY: the raw pointers in `hdrs` and `iovs` point only into this area's own heap
// allocations (`buf`, `names`, `ctrls`, `iovs`), which move with it and are reached only
// through `&mut self` (the kernel writes through them during `recv`) or `&self` (reads after
// it): sending the area to another thread sends its exclusive access with it.
#[allow(unsafe_code)]
unsafe impl Send for RecvArea {}

impl std::fmt::Debug for RecvArea {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvArea")
            .field("buffers", &self.hdrs.len())
            .field("buf_len", &self.buf_len)
            .finish()
    }
}

impl RecvArea {
    /// `count` buffers of `len` bytes each (zeroed memory, mapped as the kernel first writes it).
    #[allow(unsafe_code)]
    pub(crate) fn new(count: usize, len: usize) -> RecvArea {
        // SAFETY: `mmsghdr` is plain integers and pointers, for which all-zero bytes (null
        // pointers) are a valid value.
        let hdr: libc::mmsghdr = unsafe { std::mem::zeroed() };
        // SAFETY: as above; `sockaddr_storage` is plain integers.
        let name: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let iov = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        let mut area = RecvArea {
            buf: vec![0; count * len].into_boxed_slice(),
            buf_len: len,
            hdrs: vec![hdr; count].into_boxed_slice(),
            names: vec![name; count].into_boxed_slice(),
            ctrls: vec![Ctrl([0; CTRL_LEN]); count].into_boxed_slice(),
            iovs: vec![iov; count].into_boxed_slice(),
        };
        let RecvArea {
            buf,
            hdrs,
            names,
            ctrls,
            iovs,
            ..
        } = &mut area;
        let chunks = buf.chunks_exact_mut(len.max(1));
        let parts = hdrs.iter_mut().zip(names.iter_mut()).zip(ctrls.iter_mut());
        for (((h, name), ctrl), (iov, chunk)) in parts.zip(iovs.iter_mut().zip(chunks)) {
            iov.iov_base = chunk.as_mut_ptr().cast();
            iov.iov_len = chunk.len();
            h.msg_hdr.msg_name = std::ptr::from_mut(name).cast();
            h.msg_hdr.msg_iov = std::ptr::from_mut(iov);
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = ctrl.0.as_mut_ptr().cast();
            rearm(h);
        }
        area
    }

    /// The bytes of every buffer, back to back (buffer `i` at `i * buf_len`).
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.buf
    }

    pub(crate) fn buf_len(&self) -> usize {
        self.buf_len
    }

    /// Reads into buffers `first..first + count` (at most [`RECV_BATCH`] of them) with one
    /// nonblocking `recvmmsg` and calls `each(buffer, len, stride, source)` for every buffer it
    /// filled, in order: `len` bytes (cut at the buffer's length), datagrams of `stride` bytes
    /// each under GRO (the last may be shorter; `stride == len` otherwise), `source` `None` if
    /// the kernel reported no IP address. Returns how many buffers were filled; `WouldBlock`
    /// if none.
    pub(crate) fn recv(
        &mut self,
        socket: &impl AsRawFd,
        first: usize,
        count: usize,
        mut each: impl FnMut(usize, usize, usize, Option<SocketAddr>),
    ) -> io::Result<usize> {
        let count = count.min(RECV_BATCH);
        let RecvArea {
            buf_len,
            hdrs,
            names,
            ctrls,
            ..
        } = self;
        let hdrs = first
            .checked_add(count)
            .and_then(|end| hdrs.get_mut(first..end))
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        let vlen = libc::c_uint::try_from(hdrs.len())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: the fd is an open socket borrowed for the whole call; `hdrs` holds `vlen`
        // headers, each pointing at its own live name slot, iovec (over its own buffer, of
        // the length it was built with) and control room, sized as the header says; all of
        // them are exclusively borrowed here, so the kernel's writes race with nothing.
        #[allow(unsafe_code)]
        let n = unsafe {
            libc::recvmmsg(
                socket.as_raw_fd(),
                hdrs.as_mut_ptr(),
                vlen,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
        for (k, h) in hdrs.iter_mut().take(n).enumerate() {
            let i = first + k;
            let len = (h.msg_len as usize).min(*buf_len);
            // `socklen_t` on musl, `size_t` on glibc.
            #[allow(clippy::unnecessary_cast)]
            let ctrl_len = (h.msg_hdr.msg_controllen as usize).min(CTRL_LEN);
            let stride = ctrls
                .get(i)
                .and_then(|c| gro_segment_size(&c.0[..ctrl_len]))
                .unwrap_or(len);
            let src = names
                .get(i)
                .and_then(|n| socket_addr(n, h.msg_hdr.msg_namelen));
            rearm(h);
            each(i, len, stride, src);
        }
        Ok(n)
    }
}

/// Restores what `recvmmsg` writes into a header it filled.
fn rearm(h: &mut libc::mmsghdr) {
    h.msg_len = 0;
    h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    h.msg_hdr.msg_controllen = CTRL_LEN as _;
    h.msg_hdr.msg_flags = 0;
}

/// The `UDP_GRO` segment size among the control messages `ctrl` holds (as `recvmsg` wrote
/// them: each a `cmsghdr`, its data, padding to `size_t`), if there is one.
fn gro_segment_size(ctrl: &[u8]) -> Option<usize> {
    const HDR: usize = size_of::<libc::cmsghdr>();
    let align = |n: usize| n.next_multiple_of(size_of::<usize>());
    let mut off = 0;
    while off + HDR <= ctrl.len() {
        let at = ctrl.get(off..off + HDR)?;
        // SAFETY: `at` is `HDR` readable bytes; `cmsghdr` is plain integers, valid for any
        // bytes, and `read_unaligned` needs no alignment.
        #[allow(unsafe_code)]
        let hdr = unsafe { std::ptr::read_unaligned(at.as_ptr().cast::<libc::cmsghdr>()) };
        let len = hdr.cmsg_len as usize;
        if len < HDR {
            return None;
        }
        if hdr.cmsg_level == libc::SOL_UDP && hdr.cmsg_type == libc::UDP_GRO {
            let data = ctrl.get(off + HDR..off + HDR + 4)?;
            let size = i32::from_ne_bytes(data.try_into().ok()?);
            return usize::try_from(size).ok().filter(|&s| s > 0);
        }
        off += align(len);
    }
    None
}

/// The address `recvmsg` wrote into `name` (`len` bytes of it), if it is IPv4 or IPv6.
fn socket_addr(name: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    // SAFETY: `recvmsg` wrote an address of `len` bytes into `name`, and `len` is at most the
    // storage's size (the header offered no more room).
    #[allow(unsafe_code)]
    let addr = unsafe { socket2::SockAddr::new(*name, len) };
    addr.as_socket()
}

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

    /// Everything the area read since the last call, split into datagrams at each buffer's
    /// stride, with its source.
    fn drain(area: &mut RecvArea, sock: &Bound) -> Vec<(Vec<u8>, SocketAddr)> {
        let mut got = Vec::new();
        loop {
            let mut filled = Vec::new();
            let r = area.recv(&sock.socket, 0, 4, |i, len, stride, src| {
                filled.push((i, len, stride, src.unwrap()));
            });
            match r {
                Ok(n) => assert_eq!(n, filled.len()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return got,
                Err(e) => panic!("{e}"),
            }
            for (i, len, stride, src) in filled {
                let bytes = &area.bytes()[i * area.buf_len()..][..len];
                got.extend(bytes.chunks(stride.max(1)).map(|d| (d.to_vec(), src)));
            }
        }
    }

    /// The receive area reads GSO runs (as GRO batches where the kernel keeps them whole)
    /// and single datagrams, reports each source, re-arms its headers for the next call, and
    /// cuts a datagram longer than its buffer; on IPv4 and IPv6.
    #[test]
    fn the_receive_area_reads_batches_and_single_datagrams() {
        for (addr, v6) in [("127.0.0.1:0", false), ("[::1]:0", true)] {
            let Some(tx) = sender(addr, false) else {
                continue;
            };
            let opts = Options {
                buffer: 1 << 20,
                gso: false,
                gro: true,
                no_check: false,
            };
            let Ok(rx) = bind(addr.parse().unwrap(), &opts) else {
                assert!(v6, "binding {addr}");
                eprintln!("SKIP: no IPv6 loopback");
                continue;
            };
            let to = rx.info.local_addr;
            let from = tx.info.local_addr;
            let mut area = RecvArea::new(4, 8192);
            for round in 0..3 {
                // Odd rounds put the batch into a buffer whose header a single datagram (no
                // control message) filled last.
                let run = run();
                let iov: Vec<IoSlice<'_>> = run.iter().map(|d| IoSlice::new(d)).collect();
                let singles = [vec![round; 100], vec![7; 200], vec![8; 9000]];
                let mut want: Vec<Vec<u8>> = Vec::new();
                if round % 2 == 1 {
                    tx.socket.send_to(&singles[0], to).unwrap();
                    want.push(singles[0].clone());
                }
                send_gso(&tx.socket, to, &iov, 1000).unwrap();
                want.extend(run);
                for d in &singles[usize::from(round % 2 == 1)..] {
                    tx.socket.send_to(d, to).unwrap();
                    want.push(d[..d.len().min(8192)].to_vec());
                }
                let got = drain(&mut area, &rx);
                let bytes: Vec<Vec<u8>> = got.iter().map(|(d, _)| d.clone()).collect();
                assert_eq!(bytes, want, "{addr}, round {round}");
                assert!(got.iter().all(|(_, src)| *src == from), "{addr}: {got:?}");
            }
        }
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

    /// This thread's voluntary context switches (`/proc/thread-self/status`): each time it
    /// slept, including sleeps inside one `epoll_wait` that woke and slept again.
    fn my_sleeps() -> u64 {
        std::fs::read_to_string("/proc/thread-self/status")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap()
    }

    /// Waits in `poll` for `wait` while another thread sends `count` datagrams to `socket`,
    /// 1 ms apart; returns how many events the wait reported and how often this thread slept.
    fn wait_while_sent_to(
        poll: &mut mio::Poll,
        socket: &mio::net::UdpSocket,
        count: usize,
        wait: Duration,
    ) -> (usize, u64) {
        let dst = socket.local_addr().unwrap();
        let mut events = mio::Events::with_capacity(8);
        let before = my_sleeps();
        let sender = std::thread::spawn(move || {
            let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            for _ in 0..count {
                std::thread::sleep(Duration::from_millis(1));
                tx.send_to(b"x", dst).unwrap();
            }
        });
        let start = std::time::Instant::now();
        let mut reported = 0;
        while start.elapsed() < wait {
            poll.poll(&mut events, Some(wait.saturating_sub(start.elapsed())))
                .unwrap();
            reported += events.iter().count();
        }
        sender.join().unwrap();
        (reported, my_sleeps() - before)
    }

    /// A muted socket stays registered but neither reports nor wakes: a thread asleep in
    /// `epoll_wait` sleeps through 50 arriving datagrams (with the socket's interest set to
    /// `EPOLLPRI` instead, it woke inside the kernel for each of them and slept again, 50
    /// context switches and no event). Registering again with an interest reports the
    /// datagrams already waiting at once (edge-triggered, as a fresh registration would).
    #[test]
    fn a_muted_socket_wakes_no_waiter_and_reports_again_once_reregistered() {
        const TOKEN: mio::Token = mio::Token(7);
        let mut poll = mio::Poll::new().unwrap();
        let mut socket = mio::net::UdpSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        poll.registry()
            .register(&mut socket, TOKEN, mio::Interest::READABLE)
            .unwrap();
        mute_in_poller(poll.registry(), &socket, TOKEN.0).unwrap();
        let (reported, sleeps) =
            wait_while_sent_to(&mut poll, &socket, 50, Duration::from_millis(300));
        assert_eq!(reported, 0, "a muted socket reported an event");
        assert!(
            sleeps <= 10,
            "the waiter slept {sleeps} times for 50 datagrams"
        );

        poll.registry()
            .reregister(&mut socket, TOKEN, mio::Interest::READABLE)
            .unwrap();
        let mut events = mio::Events::with_capacity(8);
        poll.poll(&mut events, Some(Duration::from_secs(5)))
            .unwrap();
        assert!(
            events.iter().any(|e| e.token() == TOKEN && e.is_readable()),
            "no readable event for the waiting datagrams"
        );
    }
}
