//! Invalidate Extended Transport Header, 4 bytes: the R_Key to invalidate
//! (rc-transport.md §1.4). Carried by SEND_LAST/ONLY_WITH_INVALIDATE.

use super::{IETH_LEN, WireError, header_view, read};

header_view!(
    /// A view over an IETH (rc-transport.md §1.4).
    Ieth,
    IETH_LEN
);

impl<T: AsRef<[u8]>> Ieth<T> {
    /// Bytes 0–3: the R_Key to invalidate.
    pub fn rkey(&self) -> u32 {
        u32::from_be_bytes(read(self.buffer.as_ref(), 0))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ieth<T> {
    /// Sets the R_Key to invalidate.
    pub fn set_rkey(&mut self, rkey: u32) {
        self.buffer.as_mut()[..4].copy_from_slice(&rkey.to_be_bytes());
    }
}

/// Parsed IETH (rc-transport.md §1.4).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct IethRepr {
    /// The R_Key to invalidate at the responder.
    pub rkey: u32,
}

impl IethRepr {
    /// Parses an IETH view; [`WireError::Truncated`] if short.
    pub fn parse<T: AsRef<[u8]>>(ieth: &Ieth<T>) -> Result<IethRepr, WireError> {
        ieth.check_len()?;
        Ok(IethRepr { rkey: ieth.rkey() })
    }

    /// Writes all 4 bytes. Panics if the view is shorter than [`IETH_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, ieth: &mut Ieth<T>) {
        ieth.set_rkey(self.rkey);
    }

    /// Emitted length: [`IETH_LEN`].
    pub const fn buffer_len(&self) -> usize {
        IETH_LEN
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_and_construct() {
        let bytes = [0x00, 0x01, 0x02, 0x03];
        let repr = IethRepr { rkey: 0x0001_0203 };
        assert_eq!(
            IethRepr::parse(&Ieth::new_checked(&bytes[..]).unwrap()),
            Ok(repr)
        );
        let mut out = [0; 4];
        repr.emit(&mut Ieth::new_unchecked(&mut out));
        assert_eq!(out, bytes);
        assert_eq!(repr.buffer_len(), bytes.len());
        assert!(IethRepr::parse(&Ieth::new_unchecked(&bytes[..0])).is_err());
    }
}
