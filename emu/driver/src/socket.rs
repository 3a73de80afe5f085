//! The device's UDP socket: bound with socket2, buffers raised toward the system maximum,
//! nonblocking, handed to mio.

use std::io;
use std::net::SocketAddr;

use socket2::{Domain, Protocol, Socket, Type};

/// What the kernel granted a device's socket, read back after setting it up.
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
}

/// Opens a nonblocking UDP socket bound to `addr`, with both buffers asked to be `buffer`
/// bytes. A refused buffer size is not an error: [`SocketInfo`] says what was granted.
pub(crate) fn bind(
    addr: SocketAddr,
    buffer: usize,
) -> io::Result<(mio::net::UdpSocket, SocketInfo)> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    // The kernel clamps to net.core.{r,w}mem_max; an error here only means "keep the default".
    let _ = socket.set_recv_buffer_size(buffer);
    let _ = socket.set_send_buffer_size(buffer);
    socket.set_nonblocking(true)?;
    let dont_fragment_forced = addr.is_ipv4() && force_dont_fragment(&socket).is_ok();
    socket.bind(&addr.into())?;
    let local_addr = socket
        .local_addr()?
        .as_socket()
        .ok_or_else(|| io::Error::other("bound socket has no IP address"))?;
    let info = SocketInfo {
        local_addr,
        requested_buffer: buffer,
        recv_buffer: socket.recv_buffer_size()?,
        send_buffer: socket.send_buffer_size()?,
        dont_fragment_forced,
    };
    let std_socket: std::net::UdpSocket = socket.into();
    Ok((mio::net::UdpSocket::from_std(std_socket), info))
}

/// Sets `IP_MTU_DISCOVER = IP_PMTUDISC_DO` on an IPv4 socket (socket2 0.5 has no setter).
#[allow(unsafe_code)]
fn force_dont_fragment(socket: &Socket) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let value: libc::c_int = libc::IP_PMTUDISC_DO;
    let len = libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>())
        .map_err(|_| io::Error::other("socklen_t overflow"))?;
    // SAFETY: the fd is an open socket owned by `socket` for the whole call; the option value
    // points to a live `c_int` and `len` is exactly its size, as setsockopt(2) requires.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
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
