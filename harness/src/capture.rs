//! `softverbs capture`: a scripted two-device RC exchange through the real engine, written as a
//! pcap file.
//!
//! [`write_demo_capture`] runs a fixed script on the in-process backend (`emu_sim`, virtual
//! time) with capture on, so every packet in the file was produced by the RC engine and
//! delivered by the fabric: device A (127.0.0.1) is the requester, device B (127.0.0.2) the
//! responder, both on UDP port 4791, path MTU 256 so that messages span several packets. A's
//! PSNs start at [`FIRST_PSN`] and wrap through 0. The script shows:
//!
//! * SEND first/middle/last/only, with and without immediate; RDMA WRITE first/middle/last/only,
//!   with and without immediate; RDMA READ request and responses first/middle/last/only;
//!   COMPARE_SWAP and FETCH_ADD with their ATOMIC_ACKNOWLEDGEs; ACKs;
//! * a PSN-sequence NAK: the fault plan drops one RDMA_WRITE_MIDDLE, B NAKs the gap and A goes
//!   back to it (the dropped packet is not in the file: the capture shows what was delivered);
//! * an RNR NAK: A sends before B posted a receive, and resends after the RNR timer;
//! * a remote-access NAK: a WRITE with a bad R_Key on a second QP pair, so the first survives.
//!
//! The file is deterministic for a given seed (`SOFTVERBS_SEED`, default [`DEMO_SEED`]): the
//! seed only changes the random key bytes. Timestamps are virtual time since 1970-01-01.

use std::net::Ipv4Addr;
use std::path::Path;

pub use emu_capture::CaptureError;
use emu_proto::wire::{Opcode, Packet, PacketRepr, Psn, Syndrome};
use emu_sim::fault::{FaultPlan, drop_nth};
use emu_sim::{PairOptions, SimPair, SimProvider, connect_pair};
use verbs_api::{
    MemoryRegion, Mtu, QueuePair, RcConnectOptions, RecvWr, SendOp, SendWr, WcStatus,
    WorkCompletion,
};

/// Device A's (requester's) address.
pub const NODE_A: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
/// Device B's (responder's) address.
pub const NODE_B: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
/// QP number of the main pair on both devices (each device numbers its QPs from 0x11).
pub const QPN_A: u32 = 0x11;
/// B's QP number of the main pair.
pub const QPN_B: u32 = 0x11;
/// A's first request PSN: close to 2^24 so the script crosses the PSN wrap.
pub const FIRST_PSN: u32 = 0xFF_FFF8;
/// B's first request PSN (B sends no requests in the script).
const FIRST_PSN_B: u32 = 0x10;
/// The provider seed unless `SOFTVERBS_SEED` overrides it.
pub const DEMO_SEED: u64 = 2026;

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

/// Runs the exchange described in the module doc with capture to `out` (created or
/// truncated; pcap, Ethernet, nanosecond timestamps) and returns what was written.
///
/// Errors: [`CaptureError::Io`] if the file cannot be written or if the exchange does not go as
/// scripted (a verbs call fails or a completion has an unexpected status; the message says
/// which); [`CaptureError::Wire`] if a captured packet does not parse.
pub fn write_demo_capture(out: &Path) -> Result<CaptureSummary, CaptureError> {
    let sim = SimProvider::builder()
        .seed(DEMO_SEED)
        .capture(out)
        .record_trace()
        .build()
        .map_err(|e| failed("building the provider", e))?;
    Demo::new(&sim)?.run()?;
    sim.finish_capture()
        .map_err(|e| failed("writing the capture", e))?;
    let mut summary = CaptureSummary::default();
    for record in sim.take_trace() {
        let repr = PacketRepr::parse(&Packet::new_checked(&record.bytes[..])?)?;
        summary.packets.push(CapturedPacket {
            opcode: repr.bth.opcode,
            psn: repr.bth.psn,
            dest_qp: repr.bth.dest_qp,
            syndrome: repr.aeth.map(|a| a.syndrome),
        });
    }
    Ok(summary)
}

/// A failed step of the script, as a capture error.
fn failed(what: &str, e: impl std::fmt::Display) -> CaptureError {
    CaptureError::Io(std::io::Error::other(format!("demo exchange: {what}: {e}")))
}

/// The two QP pairs of the script.
struct Demo {
    main: SimPair,
    spare: SimPair,
}

/// Offsets in B's MR.
const RECV_AT: usize = 0;
const WRITE_AT: usize = 2048;
const ATOMIC_AT: usize = 4096;

impl Demo {
    fn new(sim: &SimProvider) -> Result<Demo, CaptureError> {
        let opts = PairOptions {
            rc: RcConnectOptions {
                path_mtu: Mtu::Mtu256,
                ..RcConnectOptions::default()
            },
            mr_len: 8192,
            psn_a: FIRST_PSN,
            psn_b: FIRST_PSN_B,
            ..PairOptions::default()
        };
        let a = sim.context(0).map_err(|e| failed("opening device A", e))?;
        let b = sim.context(1).map_err(|e| failed("opening device B", e))?;
        let main = connect_pair(&a, &b, opts).map_err(|e| failed("connecting", e))?;
        let spare = connect_pair(&a, &b, opts).map_err(|e| failed("connecting", e))?;
        let pattern: Vec<u8> = (0..=u8::MAX).cycle().take(2048).collect();
        main.mr_a
            .write(0, &pattern)
            .map_err(|e| failed("filling A's MR", e))?;
        main.mr_b
            .write(WRITE_AT, &pattern)
            .map_err(|e| failed("filling B's MR", e))?;
        Ok(Demo { main, spare })
    }

    fn run(&self) -> Result<(), CaptureError> {
        let p = &self.main;
        let remote = |offset: usize| p.mr_b.addr() + offset as u64;
        let rkey = p.mr_b.rkey();

        // SENDs of every shape, each into a receive posted just before.
        for (len, op) in [
            (600, SendOp::Send),
            (300, SendOp::SendWithImm { imm: 0x1234_5678 }),
            (64, SendOp::Send),
            (16, SendOp::SendWithImm { imm: 0x9abc_def0 }),
        ] {
            self.post_recv(1)?;
            self.send(len, op, WcStatus::Success)?;
            self.expect_b("receive", WcStatus::Success)?;
        }

        // WRITEs of every shape; those with immediate consume a receive.
        for (len, imm) in [(600, None), (300, Some(7)), (100, None), (8, Some(8))] {
            let op = match imm {
                Some(imm) => {
                    self.post_recv(2)?;
                    SendOp::RdmaWriteWithImm {
                        remote_addr: remote(WRITE_AT),
                        rkey,
                        imm,
                    }
                }
                None => SendOp::RdmaWrite {
                    remote_addr: remote(WRITE_AT),
                    rkey,
                },
            };
            self.send(len, op, WcStatus::Success)?;
            if imm.is_some() {
                self.expect_b("write-with-immediate receive", WcStatus::Success)?;
            }
        }

        // READs: 600 bytes (responses first/middle/last) and 64 (response only).
        for len in [600, 64] {
            let op = SendOp::RdmaRead {
                remote_addr: remote(WRITE_AT),
                rkey,
            };
            self.send(len, op, WcStatus::Success)?;
        }

        // Atomics: CAS 0 -> 1, then FETCH_ADD 5.
        for op in [
            SendOp::AtomicCmpAndSwp {
                remote_addr: remote(ATOMIC_AT),
                rkey,
                compare: 0,
                swap: 1,
            },
            SendOp::AtomicFetchAndAdd {
                remote_addr: remote(ATOMIC_AT),
                rkey,
                add: 5,
            },
        ] {
            self.send(8, op, WcStatus::Success)?;
        }

        // PSN sequence NAK: the fabric loses the next RDMA_WRITE_MIDDLE; B NAKs the gap at the
        // LAST packet and A resends from the lost PSN.
        let lose = FaultPlan::new(0).rule(drop_nth(1).opcode(Opcode::RdmaWriteMiddle));
        p.sim
            .set_faults(lose)
            .map_err(|e| failed("installing the fault plan", e))?;
        let op = SendOp::RdmaWrite {
            remote_addr: remote(WRITE_AT),
            rkey,
        };
        self.send(600, op, WcStatus::Success)?;
        p.sim
            .set_faults(FaultPlan::new(0))
            .map_err(|e| failed("clearing the fault plan", e))?;

        // RNR NAK: the SEND arrives before B posted a receive; A waits out B's RNR timer
        // (min_rnr_timer 12, 0.64 ms) and resends.
        self.post_send(16, SendOp::Send)?;
        self.post_recv(3)?;
        self.expect_a("send after RNR", WcStatus::Success)?;
        self.expect_b("receive after RNR", WcStatus::Success)?;

        // Remote access NAK on the spare pair: a WRITE with an R_Key B never issued.
        let s = &self.spare;
        let sge = [s.mr_a.sge(0, 32).map_err(|e| failed("SGE", e))?];
        let bad = SendOp::RdmaWrite {
            remote_addr: s.mr_b.addr(),
            rkey: 0xDEAD_0001,
        };
        s.qp_a
            .post_send(&[SendWr::new(99, bad, &sge)])
            .map_err(|e| failed("posting the bad WRITE", e))?;
        expect(&s.cq_a, "WRITE with a bad R_Key", WcStatus::RemAccessErr)
    }

    fn post_recv(&self, wr_id: u64) -> Result<(), CaptureError> {
        let p = &self.main;
        let sge = [p.mr_b.sge(RECV_AT, 1024).map_err(|e| failed("SGE", e))?];
        p.qp_b
            .post_recv(&[RecvWr::new(wr_id, &sge)])
            .map_err(|e| failed("posting a receive", e))
    }

    fn post_send(&self, len: usize, op: SendOp) -> Result<(), CaptureError> {
        let p = &self.main;
        let sge = [p.mr_a.sge(0, len).map_err(|e| failed("SGE", e))?];
        p.qp_a
            .post_send(&[SendWr::new(len as u64, op, &sge)])
            .map_err(|e| failed("posting a send WR", e))
    }

    /// Posts `op` with `len` bytes of A's MR and waits for its completion.
    fn send(&self, len: usize, op: SendOp, want: WcStatus) -> Result<(), CaptureError> {
        self.post_send(len, op)?;
        self.expect_a(&format!("{op:?}"), want)
    }

    fn expect_a(&self, what: &str, want: WcStatus) -> Result<(), CaptureError> {
        expect(&self.main.cq_a, what, want)
    }

    fn expect_b(&self, what: &str, want: WcStatus) -> Result<(), CaptureError> {
        expect(&self.main.cq_b, what, want)
    }
}

/// Waits for the next completion on `cq` and checks its status.
fn expect(cq: &emu_sim::SimCq, what: &str, want: WcStatus) -> Result<(), CaptureError> {
    let wc: WorkCompletion = cq.next_completion().map_err(|e| failed(what, e))?;
    if wc.status != want {
        return Err(failed(
            what,
            format!("completed with {:?}, expected {want:?}", wc.status),
        ));
    }
    Ok(())
}
