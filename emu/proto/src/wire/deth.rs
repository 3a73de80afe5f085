//! Datagram Extended Transport Header, 8 bytes: Q_Key (4) · reserved (1) · SrcQP (3)
//! (rc-transport.md §1.4). UD only: the RC packet layer never carries it; it is here for UD.

use super::{DETH_LEN, WireError, header_view, read, read_u24, write_u24};

const QKEY: usize = 0;
const RESERVED: usize = 4;
const SRC_QP: usize = 5;

header_view!(
    /// A view over a DETH (rc-transport.md §1.4).
    Deth,
    DETH_LEN
);

impl<T: AsRef<[u8]>> Deth<T> {
    /// Bytes 0–3: Q_Key.
    pub fn qkey(&self) -> u32 {
        u32::from_be_bytes(read(self.buffer.as_ref(), QKEY))
    }

    /// Bytes 5–7: source QP number, 24 bits.
    pub fn src_qp(&self) -> u32 {
        read_u24(self.buffer.as_ref(), SRC_QP)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Deth<T> {
    /// Sets the Q_Key.
    pub fn set_qkey(&mut self, qkey: u32) {
        self.buffer.as_mut()[QKEY..QKEY + 4].copy_from_slice(&qkey.to_be_bytes());
    }

    /// Sets the source QP from the low 24 bits of `qpn`; clears the reserved byte.
    pub fn set_src_qp(&mut self, qpn: u32) {
        self.buffer.as_mut()[RESERVED] = 0;
        write_u24(self.buffer.as_mut(), SRC_QP, qpn);
    }
}

/// Parsed DETH (rc-transport.md §1.4).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct DethRepr {
    /// Queue key.
    pub qkey: u32,
    /// Source QP number, 24 bits; emit uses the low 24 bits.
    pub src_qp: u32,
}

impl DethRepr {
    /// Parses a DETH view; [`WireError::Truncated`] if short. The reserved byte is ignored.
    pub fn parse<T: AsRef<[u8]>>(deth: &Deth<T>) -> Result<DethRepr, WireError> {
        deth.check_len()?;
        Ok(DethRepr {
            qkey: deth.qkey(),
            src_qp: deth.src_qp(),
        })
    }

    /// Writes all 8 bytes (reserved byte zero). Panics if the view is shorter than
    /// [`DETH_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, deth: &mut Deth<T>) {
        deth.set_qkey(self.qkey);
        deth.set_src_qp(self.src_qp);
    }

    /// Emitted length: [`DETH_LEN`].
    pub const fn buffer_len(&self) -> usize {
        DETH_LEN
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_and_construct() {
        let bytes = [0x80, 0x01, 0x00, 0x00, 0x00, 0xAB, 0xCD, 0xEF];
        let repr = DethRepr {
            qkey: 0x8001_0000,
            src_qp: 0xAB_CDEF,
        };
        assert_eq!(
            DethRepr::parse(&Deth::new_checked(&bytes[..]).unwrap()),
            Ok(repr)
        );
        let mut out = [0xFF; 8];
        repr.emit(&mut Deth::new_unchecked(&mut out));
        assert_eq!(out, bytes);
        assert_eq!(repr.buffer_len(), bytes.len());
        // Emit keeps only the low 24 bits of the source QP.
        DethRepr {
            src_qp: 0xFFAB_CDEF,
            ..repr
        }
        .emit(&mut Deth::new_unchecked(&mut out));
        assert_eq!(out, bytes);
        assert!(Deth::new_checked(&bytes[..7]).is_err());
    }
}
