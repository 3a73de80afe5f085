//! CM MAD codec (IBTA vol. 1 §13.4.2 common MAD header, §12.6 CM message layouts).
//!
//! What it is: sans-IO parsing and emission of 256-byte management datagrams of the
//! communication management class, in the style of `emu_proto::wire` (smoltcp):
//!
//! * [`Mad`] is a *view* over a MAD buffer: it reads and writes the common header's fields in
//!   place and hands out the 232-byte attribute data;
//! * [`MadHeaderRepr`] is the parsed header; [`ReqRepr`], [`RepRepr`], [`RejRepr`],
//!   [`MraRepr`], [`RtuRepr`], [`DreqRepr`], [`DrepRepr`] are the CM messages with every field
//!   at its IBTA offset (tables 106–113) and [`CmaHdrRepr`] the rdma_cm private-data header;
//! * [`CmMad`] is a whole CM MAD: header plus the message its attribute ID names.
//!
//! Parsing is total: any byte string yields `Ok` or a [`MadError`], unknown attribute IDs,
//! reasons and versions decode as numbers, never a panic.
//!
//! What it is not: no state, no retries, no transaction bookkeeping (that is the CM, `api`),
//! no other management classes than CM (their headers parse; their payloads are not decoded).

mod cma;
mod msgs;

pub use cma::{CMA_HDR_LEN, CMA_VERSION, CmaHdrRepr};
pub use msgs::{
    DREP_PRIVATE_DATA, DREQ_PRIVATE_DATA, DrepRepr, DreqRepr, MRA_PRIVATE_DATA, MraRepr, MsgTarget,
    REJ_ARI_LEN, REJ_PRIVATE_DATA, REP_PRIVATE_DATA, REQ_PRIVATE_DATA, RTU_PRIVATE_DATA, RejRepr,
    RepRepr, ReqPath, ReqRepr, RtuRepr, TransportType,
};

/// Every MAD is 256 bytes (IBTA 13.4.2).
pub const MAD_LEN: usize = 256;
/// The common MAD header's length.
pub const MAD_HDR_LEN: usize = 24;
/// The attribute data's length (the CM message).
pub const MAD_DATA_LEN: usize = MAD_LEN - MAD_HDR_LEN;

/// BaseVersion of every MAD this codec emits.
pub const BASE_VERSION: u8 = 1;
/// Management class: communication management.
pub const MGMT_CLASS_CM: u8 = 0x07;
/// ClassVersion of the CM class (IBTA 1.2 and later).
pub const CM_CLASS_VERSION: u8 = 2;

/// MAD methods the CM speaks or answers (IBTA table 104).
pub mod method {
    /// Get (a request).
    pub const GET: u8 = 0x01;
    /// Set (a request).
    pub const SET: u8 = 0x02;
    /// Send: every CM message.
    pub const SEND: u8 = 0x03;
    /// GetResp: the answer to Get or Set.
    pub const GET_RESP: u8 = 0x81;
}

/// CM attribute IDs (IBTA table 103).
pub mod attr {
    /// Request for communication.
    pub const REQ: u16 = 0x0010;
    /// Message receipt acknowledgement.
    pub const MRA: u16 = 0x0011;
    /// Reject.
    pub const REJ: u16 = 0x0012;
    /// Reply to request for communication.
    pub const REP: u16 = 0x0013;
    /// Ready to use.
    pub const RTU: u16 = 0x0014;
    /// Request for disconnection.
    pub const DREQ: u16 = 0x0015;
    /// Reply to request for disconnection.
    pub const DREP: u16 = 0x0016;
}

/// MAD status codes (IBTA table 105: bits 2–4 of the status field).
pub mod status {
    /// Bad base or class version.
    pub const BAD_VERSION: u16 = 1 << 2;
    /// Method not supported.
    pub const METHOD_UNSUPPORTED: u16 = 2 << 2;
    /// Method/attribute combination not supported.
    pub const METHOD_ATTR_UNSUPPORTED: u16 = 3 << 2;
}

/// Why bytes are not a CM MAD.
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MadError {
    /// Shorter than the 256 bytes of a MAD.
    #[error("MAD truncated: {0} bytes")]
    Truncated(usize),
    /// Not base version 1, class CM, class version 2.
    #[error("not a CM MAD: base version {base}, class {class:#04x}, class version {version}")]
    NotCm {
        /// BaseVersion.
        base: u8,
        /// MgmtClass.
        class: u8,
        /// ClassVersion.
        version: u8,
    },
    /// A CM class attribute this codec does not decode (LAP, APR, SIDR, ClassPortInfo, …).
    #[error("unknown CM attribute {0:#06x}")]
    UnknownAttribute(u16),
}

/// A view over a MAD: the common header's fields in place (IBTA figure 144).
#[derive(Debug, Clone)]
pub struct Mad<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Mad<T> {
    /// Wraps `buffer` without checking its length; accessors panic on a short buffer.
    pub fn new_unchecked(buffer: T) -> Self {
        Mad { buffer }
    }

    /// Wraps `buffer` if it holds at least [`MAD_LEN`] bytes.
    pub fn new_checked(buffer: T) -> Result<Self, MadError> {
        let len = buffer.as_ref().len();
        if len < MAD_LEN {
            return Err(MadError::Truncated(len));
        }
        Ok(Mad { buffer })
    }

    /// Byte 0: BaseVersion.
    pub fn base_version(&self) -> u8 {
        self.buffer.as_ref()[0]
    }
    /// Byte 1: MgmtClass.
    pub fn mgmt_class(&self) -> u8 {
        self.buffer.as_ref()[1]
    }
    /// Byte 2: ClassVersion.
    pub fn class_version(&self) -> u8 {
        self.buffer.as_ref()[2]
    }
    /// Byte 3: R bit and Method (7 bits), as one byte (0x81 = GetResp).
    pub fn method(&self) -> u8 {
        self.buffer.as_ref()[3]
    }
    /// Bytes 4–5: Status.
    pub fn status(&self) -> u16 {
        be16(self.buffer.as_ref(), 4)
    }
    /// Bytes 6–7: ClassSpecific.
    pub fn class_specific(&self) -> u16 {
        be16(self.buffer.as_ref(), 6)
    }
    /// Bytes 8–15: TransactionID.
    pub fn tid(&self) -> u64 {
        be64(self.buffer.as_ref(), 8)
    }
    /// Bytes 16–17: AttributeID.
    pub fn attr_id(&self) -> u16 {
        be16(self.buffer.as_ref(), 16)
    }
    /// Bytes 20–23: AttributeModifier.
    pub fn attr_mod(&self) -> u32 {
        be32(self.buffer.as_ref(), 20)
    }
    /// Bytes 24–255: the attribute data (the CM message).
    pub fn data(&self) -> &[u8] {
        &self.buffer.as_ref()[MAD_HDR_LEN..MAD_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Mad<T> {
    /// Sets bytes 0–3: versions, class and method.
    pub fn set_class(&mut self, base: u8, class: u8, version: u8, method: u8) {
        self.buffer.as_mut()[..4].copy_from_slice(&[base, class, version, method]);
    }
    /// Sets the Status.
    pub fn set_status(&mut self, status: u16) {
        put(self.buffer.as_mut(), 4, &status.to_be_bytes());
    }
    /// Sets ClassSpecific.
    pub fn set_class_specific(&mut self, v: u16) {
        put(self.buffer.as_mut(), 6, &v.to_be_bytes());
    }
    /// Sets the TransactionID.
    pub fn set_tid(&mut self, tid: u64) {
        put(self.buffer.as_mut(), 8, &tid.to_be_bytes());
    }
    /// Sets the AttributeID; clears the reserved bytes 18–19.
    pub fn set_attr_id(&mut self, id: u16) {
        put(self.buffer.as_mut(), 16, &id.to_be_bytes());
        put(self.buffer.as_mut(), 18, &[0, 0]);
    }
    /// Sets the AttributeModifier.
    pub fn set_attr_mod(&mut self, v: u32) {
        put(self.buffer.as_mut(), 20, &v.to_be_bytes());
    }
    /// The attribute data, writable.
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[MAD_HDR_LEN..MAD_LEN]
    }
}

/// The parsed common MAD header.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct MadHeaderRepr {
    /// BaseVersion (1).
    pub base_version: u8,
    /// MgmtClass (0x07 for CM).
    pub mgmt_class: u8,
    /// ClassVersion (2 for CM).
    pub class_version: u8,
    /// R bit and method (see [`method`]).
    pub method: u8,
    /// Status.
    pub status: u16,
    /// ClassSpecific.
    pub class_specific: u16,
    /// TransactionID.
    pub tid: u64,
    /// AttributeID.
    pub attr_id: u16,
    /// AttributeModifier.
    pub attr_mod: u32,
}

impl MadHeaderRepr {
    /// A CM Send header for `attr_id` with transaction `tid`.
    pub const fn cm_send(attr_id: u16, tid: u64) -> Self {
        MadHeaderRepr {
            base_version: BASE_VERSION,
            mgmt_class: MGMT_CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: method::SEND,
            status: 0,
            class_specific: 0,
            tid,
            attr_id,
            attr_mod: 0,
        }
    }

    /// Reads the header of a checked view.
    pub fn parse<T: AsRef<[u8]>>(mad: &Mad<T>) -> Self {
        MadHeaderRepr {
            base_version: mad.base_version(),
            mgmt_class: mad.mgmt_class(),
            class_version: mad.class_version(),
            method: mad.method(),
            status: mad.status(),
            class_specific: mad.class_specific(),
            tid: mad.tid(),
            attr_id: mad.attr_id(),
            attr_mod: mad.attr_mod(),
        }
    }

    /// Writes the 24 header bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, mad: &mut Mad<T>) {
        mad.set_class(
            self.base_version,
            self.mgmt_class,
            self.class_version,
            self.method,
        );
        mad.set_status(self.status);
        mad.set_class_specific(self.class_specific);
        mad.set_tid(self.tid);
        mad.set_attr_id(self.attr_id);
        mad.set_attr_mod(self.attr_mod);
    }

    /// True for base version 1, class CM, class version 2.
    pub fn is_cm(&self) -> bool {
        self.base_version == BASE_VERSION
            && self.mgmt_class == MGMT_CLASS_CM
            && self.class_version == CM_CLASS_VERSION
    }
}

/// A CM message, by attribute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CmMessage {
    /// REQ.
    Req(ReqRepr),
    /// MRA.
    Mra(MraRepr),
    /// REJ.
    Rej(RejRepr),
    /// REP.
    Rep(RepRepr),
    /// RTU.
    Rtu(RtuRepr),
    /// DREQ.
    Dreq(DreqRepr),
    /// DREP.
    Drep(DrepRepr),
}

impl CmMessage {
    /// The attribute ID of this message.
    pub fn attr_id(&self) -> u16 {
        match self {
            CmMessage::Req(_) => attr::REQ,
            CmMessage::Mra(_) => attr::MRA,
            CmMessage::Rej(_) => attr::REJ,
            CmMessage::Rep(_) => attr::REP,
            CmMessage::Rtu(_) => attr::RTU,
            CmMessage::Dreq(_) => attr::DREQ,
            CmMessage::Drep(_) => attr::DREP,
        }
    }
}

/// A whole CM MAD: the header and the message its attribute names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CmMad {
    /// The common MAD header.
    pub hdr: MadHeaderRepr,
    /// The message.
    pub msg: CmMessage,
}

impl CmMad {
    /// A CM Send MAD carrying `msg` in transaction `tid`.
    pub fn send(tid: u64, msg: CmMessage) -> Self {
        CmMad {
            hdr: MadHeaderRepr::cm_send(msg.attr_id(), tid),
            msg,
        }
    }

    /// Parses a CM MAD: any bytes give `Ok` or an error, never a panic.
    pub fn parse(bytes: &[u8]) -> Result<Self, MadError> {
        let mad = Mad::new_checked(bytes)?;
        let hdr = MadHeaderRepr::parse(&mad);
        if !hdr.is_cm() {
            return Err(MadError::NotCm {
                base: hdr.base_version,
                class: hdr.mgmt_class,
                version: hdr.class_version,
            });
        }
        let d = mad.data();
        let msg = match hdr.attr_id {
            attr::REQ => CmMessage::Req(ReqRepr::parse(d)?),
            attr::MRA => CmMessage::Mra(MraRepr::parse(d)?),
            attr::REJ => CmMessage::Rej(RejRepr::parse(d)?),
            attr::REP => CmMessage::Rep(RepRepr::parse(d)?),
            attr::RTU => CmMessage::Rtu(RtuRepr::parse(d)?),
            attr::DREQ => CmMessage::Dreq(DreqRepr::parse(d)?),
            attr::DREP => CmMessage::Drep(DrepRepr::parse(d)?),
            other => return Err(MadError::UnknownAttribute(other)),
        };
        Ok(CmMad { hdr, msg })
    }

    /// The 256 bytes of this MAD (the header's attribute ID is written as given).
    pub fn emit(&self) -> Vec<u8> {
        let mut out = vec![0u8; MAD_LEN];
        let mut mad = Mad::new_unchecked(&mut out[..]);
        self.hdr.emit(&mut mad);
        let d = mad.data_mut();
        match &self.msg {
            CmMessage::Req(m) => m.emit(d),
            CmMessage::Mra(m) => m.emit(d),
            CmMessage::Rej(m) => m.emit(d),
            CmMessage::Rep(m) => m.emit(d),
            CmMessage::Rtu(m) => m.emit(d),
            CmMessage::Dreq(m) => m.emit(d),
            CmMessage::Drep(m) => m.emit(d),
        }
        out
    }
}

// ---- field helpers: big-endian, IBTA bit numbering (bit offset 0 = the byte's MSB) --------

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(x)
}

fn put(b: &mut [u8], at: usize, v: &[u8]) {
    b[at..at + v.len()].copy_from_slice(v);
}

/// The top 24 bits of the big-endian word at `at` (a QPN, EECN or PSN field).
fn be24(b: &[u8], at: usize) -> u32 {
    be32(b, at) >> 8
}

/// Writes the low 24 bits of `v` as the top 24 bits of the word at `at`, keeping byte `at + 3`.
fn put24(b: &mut [u8], at: usize, v: u32) {
    put(b, at, &(v & 0xFF_FFFF).to_be_bytes()[1..]);
}

/// `width` bits of byte `at` starting `off` bits below its MSB.
fn bits(b: &[u8], at: usize, off: u32, width: u32) -> u8 {
    let mask = (1u16 << width) - 1;
    ((u16::from(b[at]) >> (8 - off - width)) & mask) as u8
}

/// Sets `width` bits of byte `at` starting `off` bits below its MSB to the low bits of `v`.
fn put_bits(b: &mut [u8], at: usize, off: u32, width: u32, v: u8) {
    let shift = 8 - off - width;
    let mask = (((1u16 << width) - 1) << shift) as u8;
    b[at] = (b[at] & !mask) | ((v << shift) & mask);
}

/// The `len` private-data bytes at `at`.
fn take(b: &[u8], at: usize, len: usize) -> Vec<u8> {
    b[at..at + len].to_vec()
}

/// Writes `v` (truncated to `len`) at `at` and zero-fills the rest of the `len` bytes.
fn put_padded(b: &mut [u8], at: usize, len: usize, v: &[u8]) {
    let n = v.len().min(len);
    b[at..at + n].copy_from_slice(&v[..n]);
    b[at + n..at + len].fill(0);
}

#[cfg(test)]
mod tests;
