//! `ibv_rc_pingpong`'s TCP exchange (rdma-core; written from its documented format, see the
//! rxe-vm README): each side sends one fixed 52-byte message `LLLL:QQQQQQ:PPPPPP:GGGG…G\0` —
//! LID (4 hex digits), QPN and PSN (6 hex digits each) and the GID as 32 lowercase hex digits
//! (its 16 bytes in network order) — and the client ends with `done\0`.
//!
//! Client: connect, write its message, read the server's, write `done\0`. Server: accept, read
//! the client's message, connect its QP, write its message, read `done\0`. Each message goes
//! out in one `write`, because rdma-core reads each with a single `read()`.

use std::io::{ErrorKind as IoKind, Read, Write};
use std::net::{Ipv6Addr, TcpStream};

use verbs_api::Gid;

use super::{InteropError, Result};

/// Length of one message, the terminating NUL included.
pub const MSG_LEN: usize = 52;

/// What the client sends after the exchange.
pub const DONE: &[u8; 5] = b"done\0";

/// One side's address as ibv_rc_pingpong exchanges it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PpDest {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// QP number (24 bits).
    pub qpn: u32,
    /// First PSN (24 bits).
    pub psn: u32,
    /// GID (all zero when the peer runs without `-g`, i.e. with LID addressing).
    pub gid: Gid,
}

impl PpDest {
    /// The 52-byte message. QPN and PSN are truncated to 24 bits.
    pub fn encode(&self) -> [u8; MSG_LEN] {
        let mut text = format!(
            "{:04x}:{:06x}:{:06x}:",
            self.lid,
            self.qpn & 0xFF_FFFF,
            self.psn & 0xFF_FFFF
        );
        for b in self.gid.0 {
            text.push_str(&format!("{b:02x}"));
        }
        let mut out = [0u8; MSG_LEN];
        // 4 + 1 + 6 + 1 + 6 + 1 + 32 = 51 characters, then the NUL already in `out`.
        let n = text.len().min(MSG_LEN - 1);
        out[..n].copy_from_slice(&text.as_bytes()[..n]);
        out
    }

    /// Parses a message. Errors (malformed peer input) quote the bytes received.
    pub fn decode(bytes: &[u8]) -> Result<PpDest> {
        let bad = |why: &str| {
            InteropError::new(format!(
                "malformed peer message ({why}): expected 52 bytes \
                 \"LLLL:QQQQQQ:PPPPPP:<32 hex GID>\\0\", got {} bytes \"{}\"",
                bytes.len(),
                bytes.escape_ascii()
            ))
        };
        if bytes.len() != MSG_LEN {
            return Err(bad("wrong length"));
        }
        if bytes[MSG_LEN - 1] != 0 {
            return Err(bad("not NUL-terminated"));
        }
        let text = std::str::from_utf8(&bytes[..MSG_LEN - 1]).map_err(|_| bad("not text"))?;
        let mut fields = text.split(':');
        let mut field = |width: usize, name: &str| -> Result<&str> {
            let f = fields.next().ok_or_else(|| bad(&format!("no {name}")))?;
            if f.len() != width || !f.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(bad(&format!("{name} is not {width} hex digits")));
            }
            Ok(f)
        };
        let lid = u16::from_str_radix(field(4, "LID")?, 16).map_err(|_| bad("LID"))?;
        let qpn = u32::from_str_radix(field(6, "QPN")?, 16).map_err(|_| bad("QPN"))?;
        let psn = u32::from_str_radix(field(6, "PSN")?, 16).map_err(|_| bad("PSN"))?;
        let gid_hex = field(32, "GID")?;
        if fields.next().is_some() {
            return Err(bad("extra fields"));
        }
        let mut gid = [0u8; 16];
        for (i, byte) in gid.iter_mut().enumerate() {
            let pair = gid_hex.get(2 * i..2 * i + 2).ok_or_else(|| bad("GID"))?;
            *byte = u8::from_str_radix(pair, 16).map_err(|_| bad("GID"))?;
        }
        Ok(PpDest {
            lid,
            qpn,
            psn,
            gid: Gid(gid),
        })
    }

    /// `LID 0x0000, QPN 0x000011, PSN 0x6c1b4c, GID ::ffff:10.99.0.2`, as ibv_rc_pingpong
    /// prints addresses.
    pub fn describe(&self) -> String {
        format!(
            "LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
            self.lid,
            self.qpn,
            self.psn,
            Ipv6Addr::from(self.gid.0)
        )
    }
}

/// Reads exactly `buf.len()` bytes (the peer wrote them in one `write`, but TCP may still
/// split them). Errors say what was expected and how many bytes came before the peer closed or
/// the stream's read timeout passed.
pub fn read_exact(stream: &mut TcpStream, buf: &mut [u8], what: &str) -> Result<()> {
    let mut got = 0;
    while got < buf.len() {
        match stream.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(InteropError::new(format!(
                    "peer closed the connection after {got} of the {} bytes of {what}",
                    buf.len()
                )));
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == IoKind::Interrupted => {}
            Err(e) if matches!(e.kind(), IoKind::WouldBlock | IoKind::TimedOut) => {
                return Err(InteropError::new(format!(
                    "timed out reading {what} ({got} of {} bytes received)",
                    buf.len()
                )));
            }
            Err(e) => return Err(InteropError::new(format!("reading {what}: {e}"))),
        }
    }
    Ok(())
}

/// Writes `bytes` in one `write_all` (one segment for a message this short).
pub fn write_msg(stream: &mut TcpStream, bytes: &[u8], what: &str) -> Result<()> {
    stream
        .write_all(bytes)
        .and_then(|()| stream.flush())
        .map_err(|e| InteropError::new(format!("writing {what}: {e}")))
}

/// Reads the peer's 52-byte message.
pub fn read_dest(stream: &mut TcpStream) -> Result<PpDest> {
    let mut msg = [0u8; MSG_LEN];
    read_exact(stream, &mut msg, "the peer's address message")?;
    PpDest::decode(&msg)
}

/// Reads `done\0`; anything else is a malformed peer message.
pub fn read_done(stream: &mut TcpStream) -> Result<()> {
    let mut msg = [0u8; DONE.len()];
    read_exact(stream, &mut msg, "\"done\"")?;
    if &msg == DONE {
        Ok(())
    } else {
        Err(InteropError::new(format!(
            "malformed peer message: expected \"done\\0\", got \"{}\"",
            msg.escape_ascii()
        )))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn encodes_the_documented_example() {
        let d = PpDest {
            lid: 0,
            qpn: 0x11,
            psn: 0x694530,
            gid: Gid::from_ip("10.99.0.2".parse().unwrap()),
        };
        let msg = d.encode();
        assert_eq!(
            &msg[..],
            &b"0000:000011:694530:00000000000000000000ffff0a630002\x00"[..]
        );
        assert_eq!(PpDest::decode(&msg).unwrap(), d);
        assert_eq!(
            d.describe(),
            "LID 0x0000, QPN 0x000011, PSN 0x694530, GID ::ffff:10.99.0.2"
        );
    }

    #[test]
    fn round_trips_extremes() {
        let d = PpDest {
            lid: 0xffff,
            qpn: 0xff_ffff,
            psn: 0xab_cdef,
            gid: Gid([0xfe; 16]),
        };
        assert_eq!(PpDest::decode(&d.encode()).unwrap(), d);
        // Upper-case hex is accepted (sscanf's %x would).
        let upper: Vec<u8> = d.encode().iter().map(u8::to_ascii_uppercase).collect();
        assert_eq!(PpDest::decode(&upper).unwrap(), d);
    }

    #[test]
    fn rejects_malformed_messages_with_a_clear_error() {
        let good = PpDest {
            lid: 0,
            qpn: 1,
            psn: 2,
            gid: Gid([1; 16]),
        }
        .encode();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (good[..51].to_vec(), "wrong length"),
            ([&good[..], b"x"].concat(), "wrong length"),
            (
                {
                    let mut m = good;
                    m[51] = b'0';
                    m.to_vec()
                },
                "not NUL-terminated",
            ),
            (
                {
                    let mut m = good;
                    m[4] = b'-';
                    m.to_vec()
                },
                "LID is not 4 hex digits",
            ),
            (
                {
                    let mut m = good;
                    m[7] = b'g';
                    m.to_vec()
                },
                "QPN is not 6 hex digits",
            ),
            (
                {
                    let mut m = good;
                    m[20] = 0xff;
                    m.to_vec()
                },
                "not text",
            ),
            (
                {
                    let mut m = good;
                    m[30] = b':';
                    m.to_vec()
                },
                "GID is not 32 hex digits",
            ),
            (b"done\0".to_vec(), "wrong length"),
            (vec![0u8; 52], "LID is not 4 hex digits"),
        ];
        for (msg, why) in cases {
            let err = PpDest::decode(&msg).unwrap_err().0;
            assert!(err.contains(why), "{err:?} should say {why:?}");
            assert!(err.starts_with("malformed peer message"), "{err}");
        }
    }
}
