//! `softverbs capture`: a scripted two-node RC exchange written as a pcap file.
//!
//! [`write_demo_capture`] drives the RoCEv2 codec (`emu_proto::wire`) directly with a fixed
//! script, so the capture is byte-for-byte deterministic: node A (127.0.0.1, QPN 0x11) is the
//! requester, node B (127.0.0.2, QPN 0x12) the responder, both on UDP port 4791 with the
//! §1.9 source port, path MTU 256. A's PSNs start at 0xFFFFF8 and wrap through 0. The script
//! uses every RC opcode (rc-transport.md §1.3) and shows ACK coalescing per message, a
//! PSN-sequence NAK with go-back-N retry, an RNR NAK with retry after the timer, and a fatal
//! remote-access NAK. Every packet carries a valid ICRC.
//!
//! It is not an RC engine run: no queue pair state machine is involved, and the script is the
//! only source of truth for what the packets mean.

use std::net::Ipv4Addr;
use std::ops::Range;
use std::path::Path;
use std::time::Duration;

pub use emu_capture::CaptureError;
use emu_capture::PcapSink;
use emu_proto::wire::ip::udp_sport;
use emu_proto::wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, IethRepr, ImmDtRepr, IpContext, NakCode,
    Opcode, PacketRepr, Position, Psn, RethRepr, RnrTimer, Syndrome,
};

/// Node A's (requester's) address.
pub const NODE_A: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
/// Node B's (responder's) address.
pub const NODE_B: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
/// Node A's QP number.
pub const QPN_A: u32 = 0x11;
/// Node B's QP number.
pub const QPN_B: u32 = 0x12;
/// A's first request PSN: close to 2^24 so the script crosses the PSN wrap.
pub const FIRST_PSN: u32 = 0xFF_FFF8;

/// Path MTU of the scripted connection, in payload bytes.
const PMTU: usize = 256;
/// Timestamp of the first packet: 2026-01-01T00:00:00Z.
const START: Duration = Duration::from_secs(1_767_225_600);
/// Gap between consecutive packets.
const GAP: Duration = Duration::from_micros(10);
/// The RNR timer code B advertises (rc_pingpong's `min_rnr_timer`, 0.64 ms; §3.6).
const MIN_RNR_TIMER: u8 = 12;
/// R_Key of B's memory region.
const RKEY_B: u32 = 0x0000_1A02;
/// Base virtual address of B's memory region.
const VA_B: u64 = 0x7F00_0000_0000;

/// One packet of the demo capture, in capture order.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CapturedPacket {
    /// BTH opcode.
    pub opcode: Opcode,
    /// BTH PSN.
    pub psn: Psn,
    /// BTH destination QP.
    pub dest_qp: u32,
    /// AETH syndrome, for packets that carry an AETH.
    pub syndrome: Option<Syndrome>,
}

/// What [`write_demo_capture`] wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CaptureSummary {
    /// Every packet, in file order.
    pub packets: Vec<CapturedPacket>,
}

impl CaptureSummary {
    /// Number of packets in the file.
    pub fn packet_count(&self) -> usize {
        self.packets.len()
    }
}

/// Writes the scripted exchange described in the module doc to `out` (created or truncated)
/// as a pcap file (Ethernet, nanosecond timestamps), and returns what it wrote.
pub fn write_demo_capture(out: &Path) -> Result<CaptureSummary, CaptureError> {
    let mut demo = Demo {
        sink: PcapSink::create(out)?,
        now: START,
        psn: Psn::new(FIRST_PSN),
        msn: 0,
        data: (0..=u8::MAX).cycle().take(2 * 1024).collect(),
        buf: Vec::new(),
        summary: CaptureSummary::default(),
    };
    demo.run()?;
    let Demo { sink, summary, .. } = demo;
    sink.finish()?;
    Ok(summary)
}

/// The four opcodes a segmented operation uses for its first, middle, last and only packets.
struct Family([Opcode; 4]);

impl Family {
    fn opcode(&self, pos: Position) -> Opcode {
        let [first, middle, last, only] = self.0;
        match pos {
            Position::First => first,
            Position::Middle => middle,
            Position::Last => last,
            Position::Only => only,
        }
    }
}

const SEND: Family = Family([
    Opcode::SendFirst,
    Opcode::SendMiddle,
    Opcode::SendLast,
    Opcode::SendOnly,
]);
const SEND_IMM: Family = Family([
    Opcode::SendFirst,
    Opcode::SendMiddle,
    Opcode::SendLastWithImmediate,
    Opcode::SendOnlyWithImmediate,
]);
const SEND_INV: Family = Family([
    Opcode::SendFirst,
    Opcode::SendMiddle,
    Opcode::SendLastWithInvalidate,
    Opcode::SendOnlyWithInvalidate,
]);
const WRITE: Family = Family([
    Opcode::RdmaWriteFirst,
    Opcode::RdmaWriteMiddle,
    Opcode::RdmaWriteLast,
    Opcode::RdmaWriteOnly,
]);
const WRITE_IMM: Family = Family([
    Opcode::RdmaWriteFirst,
    Opcode::RdmaWriteMiddle,
    Opcode::RdmaWriteLastWithImmediate,
    Opcode::RdmaWriteOnlyWithImmediate,
]);
const READ_RESPONSE: Family = Family([
    Opcode::RdmaReadResponseFirst,
    Opcode::RdmaReadResponseMiddle,
    Opcode::RdmaReadResponseLast,
    Opcode::RdmaReadResponseOnly,
]);

/// Extension header values; each packet takes the ones its opcode carries.
#[derive(Copy, Clone)]
struct Ext {
    reth: RethRepr,
    aeth: AethRepr,
    atomic_eth: AtomicEthRepr,
    orig: u64,
    imm: u32,
    inv_rkey: u32,
}

impl Ext {
    fn new(len: usize) -> Ext {
        Ext {
            reth: RethRepr {
                va: VA_B,
                rkey: RKEY_B,
                dma_len: len as u32,
            },
            aeth: AethRepr {
                syndrome: Syndrome::ACK_UNLIMITED,
                msn: 0,
            },
            atomic_eth: AtomicEthRepr {
                va: VA_B + 0x1000,
                rkey: RKEY_B,
                swap_add: 0,
                compare: 0,
            },
            orig: 0,
            imm: 0x1234_5678,
            inv_rkey: 0x0000_2B03,
        }
    }
}

/// `len` bytes cut into path-MTU segments with their positions (at least one, for len 0).
fn segments(len: usize) -> impl Iterator<Item = (Position, Range<usize>)> {
    let n = len.div_ceil(PMTU).max(1);
    (0..n).map(move |i| {
        let pos = match (i, n) {
            (_, 1) => Position::Only,
            (0, _) => Position::First,
            (i, n) if i + 1 == n => Position::Last,
            _ => Position::Middle,
        };
        (pos, i * PMTU..((i + 1) * PMTU).min(len))
    })
}

struct Demo {
    sink: PcapSink<std::io::BufWriter<std::fs::File>>,
    now: Duration,
    /// A's next request PSN.
    psn: Psn,
    /// B's message sequence number (completed inbound messages).
    msn: u32,
    /// Payload source pattern.
    data: Vec<u8>,
    /// Scratch buffer for emission.
    buf: Vec<u8>,
    summary: CaptureSummary,
}

impl Demo {
    fn run(&mut self) -> Result<(), CaptureError> {
        // Sends of every shape, each acknowledged (AckReq on the last packet, §2.7).
        for (family, len) in [
            (&SEND, 600),
            (&SEND_IMM, 300),
            (&SEND, 64),
            (&SEND_IMM, 16),
            (&SEND_INV, 300),
            (&SEND_INV, 32),
            (&WRITE, 600),
            (&WRITE_IMM, 300),
            (&WRITE, 100),
            (&WRITE_IMM, 8),
        ] {
            let last = self.request(family, len, Ext::new(len))?;
            self.msn += 1;
            self.ack(last, Syndrome::ACK_UNLIMITED)?;
        }

        // RDMA READs: 600 B (3 responses, 3 PSNs) and 64 B (one response).
        for len in [600, 64] {
            let ext = Ext::new(len);
            let first = self.single(Opcode::RdmaReadRequest, ext)?;
            self.msn += 1; // bumped when the READ is accepted (§1.5)
            for (pos, range) in segments(len) {
                let psn = first.wrapping_add((range.start / PMTU) as u32);
                let ext = Ext {
                    aeth: AethRepr {
                        syndrome: Syndrome::ACK_UNLIMITED,
                        msn: self.msn,
                    },
                    ..ext
                };
                self.emit(false, READ_RESPONSE.opcode(pos), psn, false, range, &ext)?;
            }
            self.psn = first.wrapping_add(len.div_ceil(PMTU).max(1) as u32); // §2.4
        }

        // Atomics: CAS 0 -> 1, then FETCH_ADD 5, each answered with the original value.
        for (op, swap_add, compare, orig) in
            [(Opcode::CompareSwap, 1, 0, 0), (Opcode::FetchAdd, 5, 0, 1)]
        {
            let mut ext = Ext::new(0);
            ext.atomic_eth.swap_add = swap_add;
            ext.atomic_eth.compare = compare;
            let psn = self.single(op, ext)?;
            self.msn += 1;
            ext.orig = orig;
            ext.aeth.msn = self.msn;
            self.emit(false, Opcode::AtomicAcknowledge, psn, false, 0..0, &ext)?;
        }

        // A WRITE_ONLY is lost in the fabric (not captured); the next SEND_ONLY is out of
        // sequence, so B NAKs with its expected PSN and A goes back to it (§2.6, §2.9, §3.8).
        let lost = self.psn;
        let send = self.psn.wrapping_add(1);
        let write_ext = Ext::new(100);
        let send_ext = Ext::new(64);
        self.emit(true, Opcode::SendOnly, send, true, 0..64, &send_ext)?;
        self.ack(lost, Syndrome::Nak(NakCode::PsnSequenceError))?;
        self.emit(true, Opcode::RdmaWriteOnly, lost, true, 0..100, &write_ext)?;
        self.emit(true, Opcode::SendOnly, send, true, 0..64, &send_ext)?;
        self.msn += 2;
        self.ack(send, Syndrome::ACK_UNLIMITED)?;
        self.psn = send.wrapping_add(1);

        // B has no receive WQE posted: RNR NAK carrying the refused PSN; A retries after the
        // advertised timer (§3.6).
        let rnr = self.next_psn();
        self.emit(true, Opcode::SendOnly, rnr, true, 0..16, &Ext::new(16))?;
        let timer = RnrTimer::from_code(MIN_RNR_TIMER);
        self.ack(rnr, Syndrome::RnrNak { timer })?;
        self.now += timer.duration();
        self.emit(true, Opcode::SendOnly, rnr, true, 0..16, &Ext::new(16))?;
        self.msn += 1;
        self.ack(rnr, Syndrome::ACK_UNLIMITED)?;

        // A WRITE with a wrong R_Key: remote access NAK, fatal for the QP (§3.9).
        let mut bad = Ext::new(32);
        bad.reth.rkey = 0xDEAD_0001;
        let psn = self.single(Opcode::RdmaWriteOnly, bad)?;
        self.ack(psn, Syndrome::Nak(NakCode::RemoteAccessError))
    }

    /// A's next PSN, advancing it.
    fn next_psn(&mut self) -> Psn {
        let psn = self.psn;
        self.psn = psn.wrapping_add(1);
        psn
    }

    /// Sends a segmented request of `len` bytes from A; returns its last PSN.
    fn request(&mut self, family: &Family, len: usize, ext: Ext) -> Result<Psn, CaptureError> {
        let mut last = self.psn;
        for (pos, range) in segments(len) {
            last = self.next_psn();
            let ack_req = matches!(pos, Position::Last | Position::Only);
            self.emit(true, family.opcode(pos), last, ack_req, range, &ext)?;
        }
        Ok(last)
    }

    /// Sends a payload-less single-packet request from A; returns its PSN.
    fn single(&mut self, op: Opcode, ext: Ext) -> Result<Psn, CaptureError> {
        let psn = self.next_psn();
        self.emit(true, op, psn, true, 0..0, &ext)?;
        Ok(psn)
    }

    /// B acknowledges (or NAKs) `psn` with its current MSN.
    fn ack(&mut self, psn: Psn, syndrome: Syndrome) -> Result<(), CaptureError> {
        let mut ext = Ext::new(0);
        ext.aeth = AethRepr {
            syndrome,
            msn: self.msn,
        };
        self.emit(false, Opcode::Acknowledge, psn, false, 0..0, &ext)
    }

    /// Emits one packet (A→B if `from_a`, else B→A) with the payload bytes `payload` of the
    /// pattern and the extension headers its opcode carries, and records it.
    fn emit(
        &mut self,
        from_a: bool,
        opcode: Opcode,
        psn: Psn,
        ack_req: bool,
        payload: Range<usize>,
        ext: &Ext,
    ) -> Result<(), CaptureError> {
        let sport = udp_sport(QPN_A, QPN_B);
        let (ip, dest_qp) = if from_a {
            (IpContext::v4(NODE_A, NODE_B, sport), QPN_B)
        } else {
            (IpContext::v4(NODE_B, NODE_A, sport), QPN_A)
        };
        let h = opcode.ext_headers().unwrap_or_default();
        let bth = BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: BthRepr::DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req,
            psn,
        };
        let repr = PacketRepr {
            reth: h.reth.then_some(ext.reth),
            aeth: h.aeth.then_some(ext.aeth),
            atomic_eth: h.atomic_eth.then_some(ext.atomic_eth),
            atomic_ack_eth: h.atomic_ack_eth.then_some(AtomicAckEthRepr {
                orig_remote_data: ext.orig,
            }),
            immdt: h.immdt.then_some(ImmDtRepr { imm: ext.imm }),
            ieth: h.ieth.then_some(IethRepr { rkey: ext.inv_rkey }),
            ..PacketRepr::new(bth, &self.data[payload])
        };
        self.buf.resize(repr.buffer_len(), 0);
        repr.emit(&ip, &mut self.buf)?;
        self.sink.write_packet(self.now, &ip, &self.buf)?;
        self.now += GAP;
        self.summary.packets.push(CapturedPacket {
            opcode,
            psn,
            dest_qp,
            syndrome: repr.aeth.map(|a| a.syndrome),
        });
        Ok(())
    }
}
