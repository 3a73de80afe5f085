//! RDMA Extended Transport Header, 16 bytes: VA (8) · R_Key (4) · DMA length (4)
//! (rc-transport.md §1.4).
//!
//! Carried by RDMA_WRITE_FIRST/ONLY(_WITH_IMMEDIATE) and RDMA_READ_REQUEST. The codec does not
//! validate the fields (length ≤ 2^31, R_Key): that is the responder's job (§1.7, §4.4).

use super::{RETH_LEN, WireError, header_view, read};

const VA: usize = 0;
const RKEY: usize = 8;
const DMA_LEN: usize = 12;

header_view!(
    /// A view over a RETH (rc-transport.md §1.4).
    Reth,
    RETH_LEN
);

impl<T: AsRef<[u8]>> Reth<T> {
    /// Bytes 0–7: remote virtual address.
    pub fn va(&self) -> u64 {
        u64::from_be_bytes(read(self.buffer.as_ref(), VA))
    }

    /// Bytes 8–11: R_Key.
    pub fn rkey(&self) -> u32 {
        u32::from_be_bytes(read(self.buffer.as_ref(), RKEY))
    }

    /// Bytes 12–15: DMA length, the whole message length (rc-transport.md §3.1).
    pub fn dma_len(&self) -> u32 {
        u32::from_be_bytes(read(self.buffer.as_ref(), DMA_LEN))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Reth<T> {
    /// Sets the virtual address.
    pub fn set_va(&mut self, va: u64) {
        self.buffer.as_mut()[VA..VA + 8].copy_from_slice(&va.to_be_bytes());
    }

    /// Sets the R_Key.
    pub fn set_rkey(&mut self, rkey: u32) {
        self.buffer.as_mut()[RKEY..RKEY + 4].copy_from_slice(&rkey.to_be_bytes());
    }

    /// Sets the DMA length.
    pub fn set_dma_len(&mut self, len: u32) {
        self.buffer.as_mut()[DMA_LEN..DMA_LEN + 4].copy_from_slice(&len.to_be_bytes());
    }
}

/// Parsed RETH (rc-transport.md §1.4).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct RethRepr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Total message length in bytes.
    pub dma_len: u32,
}

impl RethRepr {
    /// Parses a RETH view; [`WireError::Truncated`] if short.
    pub fn parse<T: AsRef<[u8]>>(reth: &Reth<T>) -> Result<RethRepr, WireError> {
        reth.check_len()?;
        Ok(RethRepr {
            va: reth.va(),
            rkey: reth.rkey(),
            dma_len: reth.dma_len(),
        })
    }

    /// Writes all 16 bytes. Panics if the view is shorter than [`RETH_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, reth: &mut Reth<T>) {
        reth.set_va(self.va);
        reth.set_rkey(self.rkey);
        reth.set_dma_len(self.dma_len);
    }

    /// Emitted length: [`RETH_LEN`].
    pub const fn buffer_len(&self) -> usize {
        RETH_LEN
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const BYTES: [u8; 16] = [
        0x00, 0x00, 0x7F, 0x12, 0x34, 0x56, 0x78, 0x9A, 0xDE, 0xAD, 0xBE, 0xEF, 0x00, 0x00, 0x10,
        0x00,
    ];
    const REPR: RethRepr = RethRepr {
        va: 0x7F12_3456_789A,
        rkey: 0xDEAD_BEEF,
        dma_len: 0x1000,
    };

    #[test]
    fn deconstruct_and_construct() {
        assert_eq!(
            RethRepr::parse(&Reth::new_checked(&BYTES[..]).unwrap()),
            Ok(REPR)
        );
        let mut out = [0; 16];
        REPR.emit(&mut Reth::new_unchecked(&mut out));
        assert_eq!(out, BYTES);
        assert_eq!(REPR.buffer_len(), BYTES.len());
        assert_eq!(
            RethRepr::parse(&Reth::new_unchecked(&BYTES[..15])),
            Err(WireError::Truncated { need: 16, have: 15 })
        );
    }
}
