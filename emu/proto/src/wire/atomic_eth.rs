//! Atomic Extended Transport Header, 28 bytes: VA (8) · R_Key (4) · Swap/Add (8) · Compare (8)
//! (rc-transport.md §1.4).
//!
//! Carried by COMPARE_SWAP and FETCH_ADD. For FETCH_ADD, `swap_add` is the addend and `compare`
//! is unused. The header is packed (not 8-aligned); views read it bytewise. Alignment of the VA
//! (8 bytes) is checked by the responder, not here.

use super::{ATOMIC_ETH_LEN, WireError, header_view, read};

const VA: usize = 0;
const RKEY: usize = 8;
const SWAP_ADD: usize = 12;
const COMPARE: usize = 20;

header_view!(
    /// A view over an AtomicETH (rc-transport.md §1.4).
    AtomicEth,
    ATOMIC_ETH_LEN
);

impl<T: AsRef<[u8]>> AtomicEth<T> {
    /// Bytes 0–7: remote virtual address.
    pub fn va(&self) -> u64 {
        u64::from_be_bytes(read(self.buffer.as_ref(), VA))
    }

    /// Bytes 8–11: R_Key.
    pub fn rkey(&self) -> u32 {
        u32::from_be_bytes(read(self.buffer.as_ref(), RKEY))
    }

    /// Bytes 12–19: swap value (COMPARE_SWAP) or addend (FETCH_ADD).
    pub fn swap_add(&self) -> u64 {
        u64::from_be_bytes(read(self.buffer.as_ref(), SWAP_ADD))
    }

    /// Bytes 20–27: compare value (COMPARE_SWAP only).
    pub fn compare(&self) -> u64 {
        u64::from_be_bytes(read(self.buffer.as_ref(), COMPARE))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicEth<T> {
    /// Sets the virtual address.
    pub fn set_va(&mut self, va: u64) {
        self.buffer.as_mut()[VA..VA + 8].copy_from_slice(&va.to_be_bytes());
    }

    /// Sets the R_Key.
    pub fn set_rkey(&mut self, rkey: u32) {
        self.buffer.as_mut()[RKEY..RKEY + 4].copy_from_slice(&rkey.to_be_bytes());
    }

    /// Sets the swap value / addend.
    pub fn set_swap_add(&mut self, v: u64) {
        self.buffer.as_mut()[SWAP_ADD..SWAP_ADD + 8].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the compare value.
    pub fn set_compare(&mut self, v: u64) {
        self.buffer.as_mut()[COMPARE..COMPARE + 8].copy_from_slice(&v.to_be_bytes());
    }
}

/// Parsed AtomicETH (rc-transport.md §1.4).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct AtomicEthRepr {
    /// Remote virtual address of the 8-byte target.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap value (COMPARE_SWAP) or addend (FETCH_ADD).
    pub swap_add: u64,
    /// Compare value (COMPARE_SWAP; ignored by FETCH_ADD).
    pub compare: u64,
}

impl AtomicEthRepr {
    /// Parses an AtomicETH view; [`WireError::Truncated`] if short.
    pub fn parse<T: AsRef<[u8]>>(eth: &AtomicEth<T>) -> Result<AtomicEthRepr, WireError> {
        eth.check_len()?;
        Ok(AtomicEthRepr {
            va: eth.va(),
            rkey: eth.rkey(),
            swap_add: eth.swap_add(),
            compare: eth.compare(),
        })
    }

    /// Writes all 28 bytes. Panics if the view is shorter than [`ATOMIC_ETH_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, eth: &mut AtomicEth<T>) {
        eth.set_va(self.va);
        eth.set_rkey(self.rkey);
        eth.set_swap_add(self.swap_add);
        eth.set_compare(self.compare);
    }

    /// Emitted length: [`ATOMIC_ETH_LEN`].
    pub const fn buffer_len(&self) -> usize {
        ATOMIC_ETH_LEN
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_and_construct() {
        let bytes: [u8; 28] = [
            0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x08, // va
            0x00, 0x00, 0x12, 0x34, // rkey
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x2A, // swap/add
            0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFE, // compare
        ];
        let repr = AtomicEthRepr {
            va: 0x1000_0008,
            rkey: 0x1234,
            swap_add: 42,
            compare: u64::MAX - 1,
        };
        assert_eq!(
            AtomicEthRepr::parse(&AtomicEth::new_checked(&bytes[..]).unwrap()),
            Ok(repr)
        );
        let mut out = [0; 28];
        repr.emit(&mut AtomicEth::new_unchecked(&mut out));
        assert_eq!(out, bytes);
        assert_eq!(repr.buffer_len(), bytes.len());
        assert!(AtomicEth::new_checked(&bytes[..27]).is_err());
    }
}
