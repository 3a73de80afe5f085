//! What a rule sees about one datagram: [`DatagramMeta`], the one classifier that reads it from
//! the datagram's bytes ([`DatagramMeta::classify`]), and the opcode selectors rules match on.

use core::fmt;

use emu_proto::wire::{BTH_LEN, Bth, Opcode, Psn};

/// A node (one HCA endpoint) on the fabric, as the caller numbers them.
///
/// The fault model gives the number no meaning beyond identity: the in-process fabric uses its
/// node index, the UDP driver and the harness map addresses to numbers of their own.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub u32);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {}", self.0)
    }
}

/// One direction of the path between two nodes. Counters, random streams and rate limiters are
/// kept per link, so `a → b` and `b → a` are distinct.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Link {
    /// The sending node.
    pub src: NodeId,
    /// The receiving node.
    pub dst: NodeId,
}

impl Link {
    /// The link from `src` to `dst`.
    pub const fn new(src: NodeId, dst: NodeId) -> Link {
        Link { src, dst }
    }
}

/// What a rule may know about one datagram: its link, BTH fields, AETH syndrome and length.
///
/// Every backend builds it with [`DatagramMeta::classify`], so a plan counts and selects the
/// same datagrams on each of them; the rules themselves never look at bytes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct DatagramMeta {
    /// The sending node.
    pub src: NodeId,
    /// The receiving node.
    pub dst: NodeId,
    /// The BTH destination QP number.
    pub dest_qpn: u32,
    /// The BTH opcode.
    pub opcode: Opcode,
    /// The BTH packet sequence number.
    pub psn: Psn,
    /// The AETH syndrome byte, if the packet carries an AETH. Bits 6–5 tell ACK (`00`),
    /// RNR NAK (`01`) and NAK (`11`) apart.
    pub aeth_syndrome: Option<u8>,
    /// The datagram length in bytes: the bytes a corruption or truncation applies to.
    pub len: usize,
}

impl DatagramMeta {
    /// The opcode given to a datagram too short to hold a BTH.
    pub const UNPARSABLE: Opcode = Opcode::Unknown(0xFF);

    /// What the fault model sees of the datagram `bytes` (a RoCEv2 UDP payload) sent from `src`
    /// to `dst`: the one packet classifier of softverbs.
    ///
    /// It reads the BTH only as far as the rules need, and never rejects a datagram, so every
    /// datagram is judged and counts toward [`crate::Nth`] on every backend:
    ///
    /// * with a BTH (at least 12 bytes): its opcode (an unknown one as [`Opcode::Unknown`]),
    ///   destination QPN and PSN, whatever the rest of the datagram holds;
    /// * without one: opcode [`DatagramMeta::UNPARSABLE`] (`Unknown(0xFF)`, selected by the
    ///   plan-file opcode `"0xff"` and by class `"any"`), QPN 0, PSN 0;
    /// * `aeth_syndrome`: the byte after the BTH when the opcode carries an AETH and the byte is
    ///   there, else `None`;
    /// * `len`: `bytes.len()`.
    pub fn classify(src: NodeId, dst: NodeId, bytes: &[u8]) -> DatagramMeta {
        let (opcode, dest_qpn, psn) = match Bth::new_checked(bytes) {
            Ok(bth) => (bth.opcode(), bth.dest_qp(), bth.psn()),
            Err(_) => (Self::UNPARSABLE, 0, Psn::new(0)),
        };
        let aeth_syndrome = opcode
            .ext_headers()
            .filter(|h| h.aeth)
            .and_then(|_| bytes.get(BTH_LEN).copied());
        DatagramMeta {
            src,
            dst,
            dest_qpn,
            opcode,
            psn,
            aeth_syndrome,
            len: bytes.len(),
        }
    }

    /// The link this datagram travels on.
    pub const fn link(&self) -> Link {
        Link::new(self.src, self.dst)
    }

    /// True if the AETH syndrome says RNR NAK (bits 6–5 = `01`) or NAK (`11`).
    pub fn is_nak(&self) -> bool {
        self.aeth_syndrome
            .is_some_and(|s| matches!((s >> 5) & 0b11, 0b01 | 0b11))
    }
}

/// A family of opcodes a rule can select instead of a single [`Opcode`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum OpcodeClass {
    /// Requester-to-responder packets ([`Opcode::is_request`]).
    Requests,
    /// `ACKNOWLEDGE` packets whose AETH says ACK, or that carry no syndrome; NAKs excluded.
    Acks,
    /// Packets whose AETH says NAK or RNR NAK.
    Naks,
    /// The four `RDMA_READ_RESPONSE_*` opcodes.
    ReadResponses,
    /// `COMPARE_SWAP`, `FETCH_ADD` and `ATOMIC_ACKNOWLEDGE`.
    Atomics,
    /// Every datagram.
    Any,
}

impl OpcodeClass {
    /// Every class, in declaration order.
    pub const ALL: [OpcodeClass; 6] = [
        OpcodeClass::Requests,
        OpcodeClass::Acks,
        OpcodeClass::Naks,
        OpcodeClass::ReadResponses,
        OpcodeClass::Atomics,
        OpcodeClass::Any,
    ];

    /// The lowercase name used in plan files, e.g. `"read_responses"`.
    pub const fn name(self) -> &'static str {
        match self {
            OpcodeClass::Requests => "requests",
            OpcodeClass::Acks => "acks",
            OpcodeClass::Naks => "naks",
            OpcodeClass::ReadResponses => "read_responses",
            OpcodeClass::Atomics => "atomics",
            OpcodeClass::Any => "any",
        }
    }

    /// Inverse of [`OpcodeClass::name`] (exact, lowercase).
    pub fn from_name(name: &str) -> Option<OpcodeClass> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }

    /// True if `meta` belongs to this class.
    pub fn contains(self, meta: &DatagramMeta) -> bool {
        match self {
            OpcodeClass::Requests => meta.opcode.is_request(),
            OpcodeClass::Acks => meta.opcode.is_ack() && !meta.is_nak(),
            OpcodeClass::Naks => meta.is_nak(),
            OpcodeClass::ReadResponses => meta.opcode.is_read_response(),
            OpcodeClass::Atomics => meta.opcode.is_atomic(),
            OpcodeClass::Any => true,
        }
    }
}

/// The opcode selector of a rule: one opcode or a class.
///
/// In plan files it is one string: an opcode name as [`Opcode::name`] spells it
/// (`"ACKNOWLEDGE"`, matched case-insensitively), a class name ([`OpcodeClass::name`]), or a raw
/// BTH opcode byte in hex (`"0x64"`, how [`Opcode::Unknown`] values are written).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum OpcodeMatch {
    /// Exactly this opcode.
    Opcode(Opcode),
    /// Any opcode of this class.
    Class(OpcodeClass),
}

impl OpcodeMatch {
    /// True if `meta` is selected.
    pub fn contains(self, meta: &DatagramMeta) -> bool {
        match self {
            OpcodeMatch::Opcode(op) => meta.opcode == op,
            OpcodeMatch::Class(class) => class.contains(meta),
        }
    }

    /// Parses the plan-file spelling (see the type doc); `None` if it names nothing.
    pub fn parse(text: &str) -> Option<OpcodeMatch> {
        if let Some(class) = OpcodeClass::from_name(text) {
            return Some(OpcodeMatch::Class(class));
        }
        if let Some(hex) = text.strip_prefix("0x") {
            let digits = !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit());
            return u8::from_str_radix(hex, 16)
                .ok()
                .filter(|_| digits)
                .map(|b| OpcodeMatch::Opcode(Opcode::from(b)));
        }
        Opcode::from_name(text).map(OpcodeMatch::Opcode)
    }
}

impl fmt::Display for OpcodeMatch {
    /// The plan-file spelling, which [`OpcodeMatch::parse`] reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpcodeMatch::Opcode(op @ Opcode::Unknown(_)) => write!(f, "{:#04x}", u8::from(*op)),
            OpcodeMatch::Opcode(op) => f.write_str(op.name()),
            OpcodeMatch::Class(class) => f.write_str(class.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(opcode: Opcode, aeth_syndrome: Option<u8>) -> DatagramMeta {
        DatagramMeta {
            src: NodeId(0),
            dst: NodeId(1),
            dest_qpn: 0x11,
            opcode,
            psn: Psn::new(0),
            aeth_syndrome,
            len: 64,
        }
    }

    #[test]
    fn classify_reads_bth_and_aeth() {
        let mut ack = [0u8; 20];
        ack[0] = 0x11; // ACKNOWLEDGE
        ack[5..8].copy_from_slice(&[0, 0, 0x12]);
        ack[9..12].copy_from_slice(&[0, 0, 7]);
        ack[12] = 0x60; // NAK PSN sequence error
        let m = DatagramMeta::classify(NodeId(1), NodeId(0), &ack);
        assert_eq!((m.src, m.dst), (NodeId(1), NodeId(0)));
        assert_eq!(m.opcode, Opcode::Acknowledge);
        assert_eq!(m.dest_qpn, 0x12);
        assert_eq!(m.psn, Psn::new(7));
        assert_eq!(m.aeth_syndrome, Some(0x60));
        assert_eq!(m.len, 20);
        // An ACK cut right after its BTH has no syndrome; the BTH fields still count.
        let m = DatagramMeta::classify(NodeId(1), NodeId(0), &ack[..12]);
        assert_eq!(
            (m.opcode, m.aeth_syndrome, m.len),
            (Opcode::Acknowledge, None, 12)
        );
    }

    #[test]
    fn classify_judges_what_does_not_parse() {
        let m = DatagramMeta::classify(NodeId(0), NodeId(1), &[4; 3]);
        assert_eq!(m.opcode, DatagramMeta::UNPARSABLE);
        assert_eq!((m.dest_qpn, m.psn, m.aeth_syndrome), (0, Psn::new(0), None));
        assert_eq!(m.len, 3);
        assert_eq!(
            OpcodeMatch::parse("0xff"),
            Some(OpcodeMatch::Opcode(m.opcode))
        );
        assert!(OpcodeClass::Any.contains(&m));
        let empty = DatagramMeta::classify(NodeId(0), NodeId(1), &[]);
        assert_eq!((empty.opcode, empty.len), (DatagramMeta::UNPARSABLE, 0));
        // A BTH with an opcode no engine sends keeps its fields.
        let mut odd = [0u8; 12];
        odd[0] = 0x64;
        odd[7] = 9;
        let m = DatagramMeta::classify(NodeId(0), NodeId(1), &odd);
        assert_eq!((m.opcode, m.dest_qpn), (Opcode::Unknown(0x64), 9));
    }

    #[test]
    fn ack_nak_rnr_classes_follow_syndrome_bits() {
        let ack = meta(Opcode::Acknowledge, Some(0x1f));
        let rnr = meta(Opcode::Acknowledge, Some(0x20 | 0x0e));
        let nak = meta(Opcode::Acknowledge, Some(0x60));
        let reserved = meta(Opcode::Acknowledge, Some(0x40));
        assert!(OpcodeClass::Acks.contains(&ack) && !OpcodeClass::Naks.contains(&ack));
        assert!(OpcodeClass::Naks.contains(&rnr) && !OpcodeClass::Acks.contains(&rnr));
        assert!(OpcodeClass::Naks.contains(&nak) && !OpcodeClass::Acks.contains(&nak));
        assert!(OpcodeClass::Acks.contains(&reserved));
        assert!(OpcodeClass::Acks.contains(&meta(Opcode::Acknowledge, None)));
        assert!(!OpcodeClass::Acks.contains(&meta(Opcode::AtomicAcknowledge, Some(0))));
    }

    #[test]
    fn classes_select_their_opcodes() {
        use OpcodeClass::*;
        let cases = [
            (Opcode::SendOnly, Requests),
            (Opcode::RdmaReadRequest, Requests),
            (Opcode::RdmaReadResponseMiddle, ReadResponses),
            (Opcode::CompareSwap, Atomics),
            (Opcode::FetchAdd, Atomics),
            (Opcode::AtomicAcknowledge, Atomics),
        ];
        for (op, class) in cases {
            assert!(class.contains(&meta(op, None)), "{op:?} in {class:?}");
            assert!(Any.contains(&meta(op, None)));
        }
        assert!(!ReadResponses.contains(&meta(Opcode::SendOnly, None)));
        assert!(!Requests.contains(&meta(Opcode::Acknowledge, None)));
    }

    #[test]
    fn opcode_match_spellings_round_trip() {
        let all = OpcodeClass::ALL
            .into_iter()
            .map(OpcodeMatch::Class)
            .chain((0..=u8::MAX).map(|b| OpcodeMatch::Opcode(Opcode::from(b))));
        for m in all {
            assert_eq!(OpcodeMatch::parse(&m.to_string()), Some(m), "{m}");
        }
        assert_eq!(
            OpcodeMatch::parse("acknowledge"),
            Some(OpcodeMatch::Opcode(Opcode::Acknowledge))
        );
        assert_eq!(OpcodeMatch::parse("ACKS"), None);
        assert_eq!(OpcodeMatch::parse("0x100"), None);
        assert_eq!(OpcodeMatch::parse("0x+5"), None);
        assert_eq!(OpcodeMatch::parse("UNKNOWN"), None);
    }
}
