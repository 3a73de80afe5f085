//! Atomic ACK Extended Transport Header, 8 bytes: the original remote value
//! (rc-transport.md §1.4). Follows the AETH in ATOMIC_ACKNOWLEDGE.

use super::{ATOMIC_ACK_ETH_LEN, WireError, header_view, read};

header_view!(
    /// A view over an AtomicAckETH (rc-transport.md §1.4).
    AtomicAckEth,
    ATOMIC_ACK_ETH_LEN
);

impl<T: AsRef<[u8]>> AtomicAckEth<T> {
    /// Bytes 0–7: the value at the target before the atomic operation.
    pub fn orig_remote_data(&self) -> u64 {
        u64::from_be_bytes(read(self.buffer.as_ref(), 0))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicAckEth<T> {
    /// Sets the original remote value.
    pub fn set_orig_remote_data(&mut self, v: u64) {
        self.buffer.as_mut()[..8].copy_from_slice(&v.to_be_bytes());
    }
}

/// Parsed AtomicAckETH (rc-transport.md §1.4).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct AtomicAckEthRepr {
    /// The value at the target before the atomic operation.
    pub orig_remote_data: u64,
}

impl AtomicAckEthRepr {
    /// Parses an AtomicAckETH view; [`WireError::Truncated`] if short.
    pub fn parse<T: AsRef<[u8]>>(eth: &AtomicAckEth<T>) -> Result<AtomicAckEthRepr, WireError> {
        eth.check_len()?;
        Ok(AtomicAckEthRepr {
            orig_remote_data: eth.orig_remote_data(),
        })
    }

    /// Writes all 8 bytes. Panics if the view is shorter than [`ATOMIC_ACK_ETH_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, eth: &mut AtomicAckEth<T>) {
        eth.set_orig_remote_data(self.orig_remote_data);
    }

    /// Emitted length: [`ATOMIC_ACK_ETH_LEN`].
    pub const fn buffer_len(&self) -> usize {
        ATOMIC_ACK_ETH_LEN
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_and_construct() {
        let bytes = [0x01, 0x23, 0x45, 0x67, 0x89, 0xAB, 0xCD, 0xEF];
        let repr = AtomicAckEthRepr {
            orig_remote_data: 0x0123_4567_89AB_CDEF,
        };
        assert_eq!(
            AtomicAckEthRepr::parse(&AtomicAckEth::new_checked(&bytes[..]).unwrap()),
            Ok(repr)
        );
        let mut out = [0; 8];
        repr.emit(&mut AtomicAckEth::new_unchecked(&mut out));
        assert_eq!(out, bytes);
        assert_eq!(repr.buffer_len(), bytes.len());
        assert!(AtomicAckEthRepr::parse(&AtomicAckEth::new_unchecked(&bytes[..7])).is_err());
    }
}
