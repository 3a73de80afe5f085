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
    /// Always `false` today: socket2 0.5 has no setter for it and this crate has no `unsafe`
    /// code to call `setsockopt` itself. Linux's default for UDP (`IP_PMTUDISC_WANT` with
    /// `net.ipv4.ip_no_pmtu_disc = 0`) already sets DF on every datagram that fits the path
    /// MTU, and the largest datagram the engine builds (4160 bytes) fits loopback's 65536.
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
        dont_fragment_forced: false,
    };
    let std_socket: std::net::UdpSocket = socket.into();
    Ok((mio::net::UdpSocket::from_std(std_socket), info))
}
