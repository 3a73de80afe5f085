//! Immediate Data header, 4 bytes (rc-transport.md §1.4).
//!
//! The value is opaque and copied verbatim; [`ImmDtRepr::imm`] is the four wire bytes read as a
//! big-endian `u32` (the verbs `imm_data` keeps network order, so a driver converts with
//! `to_be`/`from_be` at that boundary, not here).

use super::{IMMDT_LEN, WireError, header_view, read};

header_view!(
    /// A view over an ImmDt header (rc-transport.md §1.4).
    ImmDt,
    IMMDT_LEN
);

impl<T: AsRef<[u8]>> ImmDt<T> {
    /// Bytes 0–3, big-endian.
    pub fn imm(&self) -> u32 {
        u32::from_be_bytes(read(self.buffer.as_ref(), 0))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ImmDt<T> {
    /// Sets the immediate data.
    pub fn set_imm(&mut self, imm: u32) {
        self.buffer.as_mut()[..4].copy_from_slice(&imm.to_be_bytes());
    }
}

/// Parsed ImmDt (rc-transport.md §1.4).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct ImmDtRepr {
    /// Immediate data, wire bytes as a big-endian integer.
    pub imm: u32,
}

impl ImmDtRepr {
    /// Parses an ImmDt view; [`WireError::Truncated`] if short.
    pub fn parse<T: AsRef<[u8]>>(immdt: &ImmDt<T>) -> Result<ImmDtRepr, WireError> {
        immdt.check_len()?;
        Ok(ImmDtRepr { imm: immdt.imm() })
    }

    /// Writes all 4 bytes. Panics if the view is shorter than [`IMMDT_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, immdt: &mut ImmDt<T>) {
        immdt.set_imm(self.imm);
    }

    /// Emitted length: [`IMMDT_LEN`].
    pub const fn buffer_len(&self) -> usize {
        IMMDT_LEN
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_and_construct() {
        let bytes = [0xCA, 0xFE, 0x00, 0x01];
        let repr = ImmDtRepr { imm: 0xCAFE_0001 };
        assert_eq!(
            ImmDtRepr::parse(&ImmDt::new_checked(&bytes[..]).unwrap()),
            Ok(repr)
        );
        let mut out = [0; 4];
        repr.emit(&mut ImmDt::new_unchecked(&mut out));
        assert_eq!(out, bytes);
        assert_eq!(repr.buffer_len(), bytes.len());
        assert!(ImmDt::new_checked(&bytes[..2]).is_err());
    }
}
