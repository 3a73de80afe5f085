//! Base Transport Header, 12 bytes (rc-transport.md §1.2).
//!
//! The view reads and writes every BTH field in place. [`BthRepr`] is the parsed form; it drops
//! the reserved bits (Resv6, Resv7), which receivers ignore and emit writes as zero, and rejects
//! TVer ≠ 0. It does not interpret the opcode beyond decoding it.

use super::{BTH_LEN, Opcode, Psn, WireError, header_view, read, read_u24, write_u24};

const OPCODE: usize = 0;
const FLAGS: usize = 1;
const PKEY: usize = 2;
const RESV8A: usize = 4;
const DEST_QP: usize = 5;
const ACK: usize = 8;
const PSN: usize = 9;

const SE: u8 = 0x80;
const MIG_REQ: u8 = 0x40;
const PAD_MASK: u8 = 0x30;
const PAD_SHIFT: u8 = 4;
const TVER_MASK: u8 = 0x0F;
const FECN: u8 = 0x80;
const BECN: u8 = 0x40;
const ACK_REQ: u8 = 0x80;

header_view!(
    /// A view over a BTH (rc-transport.md §1.2).
    Bth,
    BTH_LEN
);

impl<T: AsRef<[u8]>> Bth<T> {
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    fn flag(&self, at: usize, mask: u8) -> bool {
        self.b()[at] & mask != 0
    }

    /// Byte 0: the opcode; unknown values decode to [`Opcode::Unknown`].
    pub fn opcode(&self) -> Opcode {
        Opcode::from(self.b()[OPCODE])
    }

    /// Byte 1 bit 7: SE, solicited event.
    pub fn solicited(&self) -> bool {
        self.flag(FLAGS, SE)
    }

    /// Byte 1 bit 6: MigReq.
    pub fn mig_req(&self) -> bool {
        self.flag(FLAGS, MIG_REQ)
    }

    /// Byte 1 bits 5–4: PadCnt, 0..=3 (rc-transport.md §1.6).
    pub fn pad_count(&self) -> u8 {
        (self.b()[FLAGS] & PAD_MASK) >> PAD_SHIFT
    }

    /// Byte 1 bits 3–0: TVer, must be 0.
    pub fn tver(&self) -> u8 {
        self.b()[FLAGS] & TVER_MASK
    }

    /// Bytes 2–3: P_Key.
    pub fn pkey(&self) -> u16 {
        u16::from_be_bytes(read(self.b(), PKEY))
    }

    /// Byte 4 bit 7: FECN (masked in the ICRC).
    pub fn fecn(&self) -> bool {
        self.flag(RESV8A, FECN)
    }

    /// Byte 4 bit 6: BECN (masked in the ICRC).
    pub fn becn(&self) -> bool {
        self.flag(RESV8A, BECN)
    }

    /// Bytes 5–7: DestQP, 24 bits.
    pub fn dest_qp(&self) -> u32 {
        read_u24(self.b(), DEST_QP)
    }

    /// Byte 8 bit 7: AckReq (rc-transport.md §2.7).
    pub fn ack_req(&self) -> bool {
        self.flag(ACK, ACK_REQ)
    }

    /// Bytes 9–11: PSN.
    pub fn psn(&self) -> Psn {
        Psn::new(read_u24(self.b(), PSN))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Bth<T> {
    fn b_mut(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    fn set_flag(&mut self, at: usize, mask: u8, on: bool) {
        let byte = &mut self.b_mut()[at];
        *byte = if on { *byte | mask } else { *byte & !mask };
    }

    /// Sets byte 0.
    pub fn set_opcode(&mut self, op: Opcode) {
        self.b_mut()[OPCODE] = op.into();
    }

    /// Sets SE.
    pub fn set_solicited(&mut self, on: bool) {
        self.set_flag(FLAGS, SE, on);
    }

    /// Sets MigReq.
    pub fn set_mig_req(&mut self, on: bool) {
        self.set_flag(FLAGS, MIG_REQ, on);
    }

    /// Sets PadCnt from the low 2 bits of `pad`.
    pub fn set_pad_count(&mut self, pad: u8) {
        let byte = &mut self.b_mut()[FLAGS];
        *byte = (*byte & !PAD_MASK) | ((pad << PAD_SHIFT) & PAD_MASK);
    }

    /// Sets TVer from the low 4 bits of `tver`.
    pub fn set_tver(&mut self, tver: u8) {
        let byte = &mut self.b_mut()[FLAGS];
        *byte = (*byte & !TVER_MASK) | (tver & TVER_MASK);
    }

    /// Sets P_Key.
    pub fn set_pkey(&mut self, pkey: u16) {
        self.b_mut()[PKEY..PKEY + 2].copy_from_slice(&pkey.to_be_bytes());
    }

    /// Sets FECN.
    pub fn set_fecn(&mut self, on: bool) {
        self.set_flag(RESV8A, FECN, on);
    }

    /// Sets BECN.
    pub fn set_becn(&mut self, on: bool) {
        self.set_flag(RESV8A, BECN, on);
    }

    /// Sets DestQP from the low 24 bits of `qpn`.
    pub fn set_dest_qp(&mut self, qpn: u32) {
        write_u24(self.b_mut(), DEST_QP, qpn);
    }

    /// Sets AckReq.
    pub fn set_ack_req(&mut self, on: bool) {
        self.set_flag(ACK, ACK_REQ, on);
    }

    /// Sets the PSN.
    pub fn set_psn(&mut self, psn: Psn) {
        write_u24(self.b_mut(), PSN, psn.value());
    }
}

/// Parsed BTH (rc-transport.md §1.2), without the reserved bits.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct BthRepr {
    /// Opcode; may be [`Opcode::Unknown`] at this level.
    pub opcode: Opcode,
    /// SE bit.
    pub solicited: bool,
    /// MigReq bit (rxe sends 0).
    pub mig_req: bool,
    /// PadCnt, 0..=3; emit uses the low 2 bits.
    pub pad_count: u8,
    /// P_Key ([`BthRepr::DEFAULT_PKEY`] for rxe interop).
    pub pkey: u16,
    /// FECN bit.
    pub fecn: bool,
    /// BECN bit.
    pub becn: bool,
    /// Destination QP number, 24 bits; emit uses the low 24 bits.
    pub dest_qp: u32,
    /// AckReq bit.
    pub ack_req: bool,
    /// Packet sequence number.
    pub psn: Psn,
}

impl BthRepr {
    /// The default partition key rxe sends (rc-transport.md §1.2).
    pub const DEFAULT_PKEY: u16 = 0xFFFF;

    /// A BTH for `opcode` to `dest_qp` at `psn` with every other field at what softverbs and
    /// rxe send by default: SE, MigReq, FECN, BECN and AckReq clear, PadCnt 0, P_Key
    /// [`BthRepr::DEFAULT_PKEY`]. Set the rest with struct update syntax.
    pub const fn new(opcode: Opcode, dest_qp: u32, psn: Psn) -> BthRepr {
        BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: BthRepr::DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: false,
            psn,
        }
    }

    /// Parses a BTH view: [`WireError::Truncated`] if short, [`WireError::BadTver`] if TVer ≠ 0.
    pub fn parse<T: AsRef<[u8]>>(bth: &Bth<T>) -> Result<BthRepr, WireError> {
        bth.check_len()?;
        if bth.tver() != 0 {
            return Err(WireError::BadTver(bth.tver()));
        }
        Ok(BthRepr {
            opcode: bth.opcode(),
            solicited: bth.solicited(),
            mig_req: bth.mig_req(),
            pad_count: bth.pad_count(),
            pkey: bth.pkey(),
            fecn: bth.fecn(),
            becn: bth.becn(),
            dest_qp: bth.dest_qp(),
            ack_req: bth.ack_req(),
            psn: bth.psn(),
        })
    }

    /// Writes all 12 bytes, TVer and reserved bits zero. Panics if the view is shorter than
    /// [`BTH_LEN`] (build it with `new_checked`).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, bth: &mut Bth<T>) {
        bth.b_mut()[..BTH_LEN].fill(0);
        bth.set_opcode(self.opcode);
        bth.set_solicited(self.solicited);
        bth.set_mig_req(self.mig_req);
        bth.set_pad_count(self.pad_count);
        bth.set_pkey(self.pkey);
        bth.set_fecn(self.fecn);
        bth.set_becn(self.becn);
        bth.set_dest_qp(self.dest_qp);
        bth.set_ack_req(self.ack_req);
        bth.set_psn(self.psn);
    }

    /// Emitted length: [`BTH_LEN`].
    pub const fn buffer_len(&self) -> usize {
        BTH_LEN
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The BTH of the synthetic UC SEND_ONLY vector in rc-transport.md §1.8.
    const UC_SEND: [u8; 12] = [
        0x24, 0x60, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0xD3, 0x00, 0xCF, 0x17, 0x10,
    ];

    #[test]
    fn deconstruct_vector() {
        let bth = Bth::new_checked(&UC_SEND[..]).unwrap();
        assert_eq!(bth.opcode(), Opcode::Unknown(0x24));
        assert!(!bth.solicited());
        assert!(bth.mig_req());
        assert_eq!(bth.pad_count(), 2);
        assert_eq!(bth.tver(), 0);
        assert_eq!(bth.pkey(), 0xFFFF);
        assert_eq!(bth.dest_qp(), 0xD3);
        assert!(!bth.ack_req());
        assert_eq!(bth.psn().value(), 13_571_856);
    }

    #[test]
    fn construct_bytes() {
        let repr = BthRepr {
            opcode: Opcode::RdmaWriteOnlyWithImmediate,
            solicited: true,
            mig_req: false,
            pad_count: 3,
            pkey: BthRepr::DEFAULT_PKEY,
            fecn: true,
            becn: false,
            dest_qp: 0x12_3456,
            ack_req: true,
            psn: Psn::new(0xFF_FFFE),
        };
        let mut buf = [0xAA; 12];
        repr.emit(&mut Bth::new_unchecked(&mut buf));
        assert_eq!(
            buf,
            [
                0x0B, 0xB0, 0xFF, 0xFF, 0x80, 0x12, 0x34, 0x56, 0x80, 0xFF, 0xFF, 0xFE
            ]
        );
        assert_eq!(BthRepr::parse(&Bth::new_unchecked(&buf)), Ok(repr));
    }

    /// `BthRepr::new` sets only opcode, destination QP and PSN; the rest is what rxe sends by
    /// default (P_Key 0xFFFF, every flag clear, PadCnt 0), as in the §1.8 vector's SE-less form.
    #[test]
    fn new_sets_only_opcode_dest_qp_and_psn() {
        let repr = BthRepr::new(Opcode::SendOnly, 0x12_3456, Psn::new(0xAB_CDEF));
        let mut buf = [0u8; BTH_LEN];
        repr.emit(&mut Bth::new_unchecked(&mut buf));
        assert_eq!(
            buf,
            [
                0x04, 0x00, 0xFF, 0xFF, 0x00, 0x12, 0x34, 0x56, 0x00, 0xAB, 0xCD, 0xEF
            ]
        );
    }

    #[test]
    fn errors() {
        assert_eq!(
            Bth::new_checked(&UC_SEND[..11]),
            Err(WireError::Truncated { need: 12, have: 11 })
        );
        let mut buf = UC_SEND;
        buf[1] |= 0x01;
        assert_eq!(
            BthRepr::parse(&Bth::new_unchecked(&buf)),
            Err(WireError::BadTver(1))
        );
        assert!(BthRepr::parse(&Bth::new_unchecked(&buf[..3])).is_err());
    }

    /// Each BTH field at its place in rc-transport.md §1.2: a repr with only that field set
    /// emits exactly those bits (everything else, reserved bits and TVer included, zero) and
    /// parses back.
    #[test]
    fn each_field_at_its_spec_position() {
        let zero = BthRepr {
            opcode: Opcode::SendFirst,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: 0,
            fecn: false,
            becn: false,
            dest_qp: 0,
            ack_req: false,
            psn: Psn::new(0),
        };
        let rows: [(BthRepr, usize, &[u8]); 11] = [
            (zero, 0, &[]),
            (
                BthRepr {
                    opcode: Opcode::FetchAdd,
                    ..zero
                },
                0,
                &[0x14],
            ),
            (
                BthRepr {
                    solicited: true,
                    ..zero
                },
                1,
                &[0x80],
            ),
            (
                BthRepr {
                    mig_req: true,
                    ..zero
                },
                1,
                &[0x40],
            ),
            (
                BthRepr {
                    pad_count: 2,
                    ..zero
                },
                1,
                &[0x20],
            ),
            (
                BthRepr {
                    pkey: 0x1234,
                    ..zero
                },
                2,
                &[0x12, 0x34],
            ),
            (BthRepr { fecn: true, ..zero }, 4, &[0x80]),
            (BthRepr { becn: true, ..zero }, 4, &[0x40]),
            (
                BthRepr {
                    dest_qp: 0xAB_CDEF,
                    ..zero
                },
                5,
                &[0xAB, 0xCD, 0xEF],
            ),
            (
                BthRepr {
                    ack_req: true,
                    ..zero
                },
                8,
                &[0x80],
            ),
            (
                BthRepr {
                    psn: Psn::new(0x12_3456),
                    ..zero
                },
                9,
                &[0x12, 0x34, 0x56],
            ),
        ];
        for (repr, at, field) in rows {
            let mut want = [0; BTH_LEN];
            want[at..at + field.len()].copy_from_slice(field);
            let mut buf = [0xFF; BTH_LEN];
            repr.emit(&mut Bth::new_unchecked(&mut buf));
            assert_eq!(buf, want, "{repr:?}");
            assert_eq!(BthRepr::parse(&Bth::new_unchecked(&buf)), Ok(repr));
            assert_eq!(repr.buffer_len(), BTH_LEN);
        }
    }

    /// The view's bit-field setters change only their own bits, and setting a value twice
    /// leaves it set (rc-transport.md §1.2 layout).
    #[test]
    fn setters_touch_only_their_own_bits() {
        type Set = fn(&mut Bth<&mut [u8; BTH_LEN]>, u8);
        // (setter, byte, the field's mask, a value, the bits it sets)
        let fields: [(Set, usize, u8, u8, u8); 9] = [
            (|b, v| b.set_solicited(v != 0), 1, 0x80, 1, 0x80),
            (|b, v| b.set_mig_req(v != 0), 1, 0x40, 1, 0x40),
            (|b, v| b.set_pad_count(v), 1, 0x30, 3, 0x30),
            (|b, v| b.set_pad_count(v), 1, 0x30, 1, 0x10),
            (|b, v| b.set_tver(v), 1, 0x0F, 0x0F, 0x0F),
            (|b, v| b.set_tver(v), 1, 0x0F, 0x05, 0x05),
            (|b, v| b.set_fecn(v != 0), 4, 0x80, 1, 0x80),
            (|b, v| b.set_becn(v != 0), 4, 0x40, 1, 0x40),
            (|b, v| b.set_ack_req(v != 0), 8, 0x80, 1, 0x80),
        ];
        for (set, at, mask, value, bits) in fields {
            for start in [0x00, 0xFF] {
                for (v, on) in [(value, bits), (0, 0)] {
                    let mut buf = [start; BTH_LEN];
                    let mut bth = Bth::new_unchecked(&mut buf);
                    set(&mut bth, v);
                    set(&mut bth, v);
                    let mut want = [start; BTH_LEN];
                    want[at] = (start & !mask) | on;
                    assert_eq!(
                        buf, want,
                        "byte {at} mask {mask:#04x} value {v} on {start:#04x}"
                    );
                }
            }
        }
    }
}
