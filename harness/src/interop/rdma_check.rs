//! `softverbs rdma-check`: one-sided RDMA and atomics between two processes on any providers,
//! in both directions, every result verified on both sides. Run against Linux rxe (the peer on
//! the `hw` provider) it proves that the two implementations agree on the wire: rxe silently
//! drops a packet with a bad ICRC, so every completion of ours proves rxe accepted our ICRC,
//! and the UDP device's `icrc_errors` counter (checked to be 0) shows we accepted rxe's.
//!
//! The server (no host argument) listens on TCP, the client connects. They exchange QP
//! endpoints (`emu_udp::oob`'s line format, with the GID of `-g`) and memory regions, walk
//! their RC QPs to RTS and run two phases: in phase 1 the server is the requester and the client
//! the responder, in phase 2 the other way round. The requester, on the responder's region:
//!
//! 1. for each size (8, 13, 1024, 1025, 4096, 65536 B: padding, one MTU, one byte more,
//!    multi-packet): RDMA WRITE a seeded pattern, RDMA READ it back, compare;
//! 2. RDMA WRITE_WITH_IMM of 4096 and 8 B, SEND_WITH_IMM of 1500 and 100 B (the responder checks
//!    each receive completion's opcode, immediate data and length, in order);
//! 3. FETCH_ADD twice, CMP_SWAP that succeeds, CMP_SWAP that fails, READ of the word: every
//!    returned value checked.
//!
//! The responder then compares its whole 128 KiB target area byte for byte with the image the
//! requester's operations must have left (patterns, untouched gaps, the final atomic word).
//!
//! Control lines on the TCP stream (one per step, `key=value` fields):
//! `ready phase=P v0=0x…` (responder: area zeroed, atomic word set to v0, receive posted),
//! `done phase=P seed=S swap=0x… result=ok|failed` (requester), `verified phase=P result=ok|failed`
//! (responder).

use std::collections::VecDeque;
use std::net::TcpStream;
use std::time::Instant;

use emu_udp::oob::{self, RemoteMr};
use verbs_api::dynamic::{AnyContext, AnyMr, AnyQp};
use verbs_api::{
    AccessFlags, Context, Endpoint, MemoryRegion, QpCap, QpInitAttr, QueuePair, RecvWr, SendOp,
    SendWr, WcFlags, WcOpcode, WcStatus, WorkCompletion,
};

use super::{
    Context2, DeviceArgs, InteropError, QpPath, Result, TimeArgs, Waiter, mtu_arg, udp_report,
};

/// The transfer sizes of step 1.
pub const SIZES: [usize; 6] = [8, 13, 1024, 1025, 4096, 65536];
/// Bytes of the area the peer operates on, at offset 0 of the region.
const TARGET_LEN: usize = 128 * 1024;
/// Local scratch: the source of WRITEs.
const SRC_OFF: usize = TARGET_LEN;
/// Local scratch: where READs and atomics land.
const DST_OFF: usize = TARGET_LEN + 64 * 1024;
/// The whole region.
const MR_LEN: usize = TARGET_LEN + 128 * 1024;
/// Offset of the atomic word.
const ATOMIC_OFF: usize = 80 * 1024;
/// Immediate data of operation `i` of [`IMM_OPS`] in phase P: this value + 16 P + i.
const IMM_BASE: u32 = 0x5356_0000;

/// The operations carrying immediate data (step 2), in order; each consumes one receive WR
/// at the responder.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct ImmOp {
    /// SEND_WITH_IMM (into the receive WR's buffer) rather than RDMA WRITE_WITH_IMM.
    send: bool,
    /// Target offset: the WRITE's, or the receive buffer's.
    off: usize,
    /// Bytes sent.
    len: usize,
    /// Receive buffer length (SEND only).
    buf: usize,
    /// The opcodes on the wire at MTU 1024, for the report.
    wire: &'static str,
}

const IMM_OPS: [ImmOp; 4] = [
    ImmOp {
        send: false,
        off: 72 * 1024,
        len: 4096,
        buf: 0,
        wire: "WRITE_FIRST, MIDDLE, LAST_WITH_IMMEDIATE",
    },
    ImmOp {
        send: false,
        off: 76 * 1024,
        len: 8,
        buf: 0,
        wire: "WRITE_ONLY_WITH_IMMEDIATE",
    },
    ImmOp {
        send: true,
        off: 84 * 1024,
        len: 1500,
        buf: 2048,
        wire: "SEND_FIRST, SEND_LAST_WITH_IMMEDIATE",
    },
    ImmOp {
        send: true,
        off: 88 * 1024,
        len: 100,
        buf: 256,
        wire: "SEND_ONLY_WITH_IMMEDIATE",
    },
];

fn imm_value(phase: u32, i: usize) -> u32 {
    IMM_BASE + 16 * phase + i as u32
}

const ALL_ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

/// `softverbs rdma-check` arguments.
#[derive(clap::Args, Clone, Debug)]
pub struct RdmaCheckArgs {
    /// Connect to this server (host name or address); without it, act as the server.
    #[arg(value_name = "HOST")]
    pub host: Option<String>,
    /// TCP port of the control connection.
    #[arg(short = 'p', long, default_value_t = 18600)]
    pub port: u16,
    /// Path MTU in bytes (256, 512, 1024, 2048 or 4096).
    #[arg(short = 'm', long, default_value = "1024", value_parser = mtu_arg)]
    pub mtu: verbs_api::Mtu,
    /// Seed of the data patterns this side writes.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Device selection.
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Time bounds.
    #[command(flatten)]
    pub time: TimeArgs,
}

/// Runs `softverbs rdma-check`: prints a PASS/FAIL line per check and a summary. Exit code 0
/// when every check of both sides passed, 1 otherwise.
pub fn run(args: &RdmaCheckArgs) -> u8 {
    let mut report = Report::default();
    match args.device.open() {
        Err(e) => report.fail("opening the device", &e.0),
        Ok(ctx) => {
            if let Err(e) = check(&ctx, args, &mut report) {
                report.fail("rdma-check stopped", &e.0);
            }
            // Ends the capture whatever the outcome (a failed run is when it is wanted).
            if let Err(e) = args.device.finish(&ctx) {
                report.fail("capture", &e.0);
            }
            if let Some((text, icrc_errors)) = udp_report(&ctx) {
                println!("{text}");
                report.check(
                    "this side's UDP device dropped no packet for a bad ICRC (icrc_errors = 0)",
                    icrc_errors == 0,
                    &format!("icrc_errors = {icrc_errors}"),
                );
            }
        }
    }
    println!(
        "rdma-check: {} checks passed, {} failed",
        report.passed, report.failed
    );
    if report.failed == 0 && report.passed > 0 {
        0
    } else {
        1
    }
}

/// PASS/FAIL lines as they happen, and the counts.
#[derive(Debug, Default)]
struct Report {
    passed: u32,
    failed: u32,
}

impl Report {
    fn check(&mut self, what: &str, ok: bool, detail: &str) -> bool {
        if ok {
            self.passed += 1;
            println!("PASS  {what}");
        } else {
            self.fail(what, detail);
        }
        ok
    }

    fn fail(&mut self, what: &str, detail: &str) {
        self.failed += 1;
        println!("FAIL  {what}: {detail}");
    }

    /// Records `r` as a check; `Ok` passes.
    fn result(&mut self, what: &str, r: Result<()>) -> bool {
        match r {
            Ok(()) => self.check(what, true, ""),
            Err(e) => {
                self.fail(what, &e.0);
                false
            }
        }
    }
}

/// The objects of one side.
struct Side {
    qp: AnyQp,
    mr: AnyMr,
    waiter: Waiter,
    /// Completions polled but not consumed yet.
    backlog: VecDeque<WorkCompletion>,
    stream: TcpStream,
    remote: RemoteMr,
}

fn check(ctx: &AnyContext, args: &RdmaCheckArgs, report: &mut Report) -> Result<()> {
    let gid = super::local_gid(ctx, &args.device)?;
    let pd = ctx.alloc_pd()?;
    let mr = ctx.alloc_mr(&pd, MR_LEN, ALL_ACCESS)?;
    mr.write(0, &vec![0; MR_LEN])?;
    let cq = ctx.create_cq(64, None)?;
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = ctx
        .create_qp(&pd, &cq, &cq, None, &QpInitAttr::rc(cap))
        .during("create QP")?;
    let psn = super::random_psn();
    let mut path = QpPath {
        port: args.device.ib_port,
        sgid_index: args.device.gid_idx,
        dgid: gid,
        dest_qpn: 0,
        rq_psn: 0,
        sq_psn: psn,
        mtu: args.mtu,
        sl: 0,
        hop_limit: 64,
        udp_dport: verbs_api::ROCE_V2_UDP_PORT,
        access: ALL_ACCESS,
        rd_atomic: 16,
    };
    path.to_init(&qp)?;
    // The endpoint carries the UDP port the device receives on; the GID is the one of -g
    // (a hardware provider's endpoint() reports GID index 0).
    let local = Endpoint {
        gid,
        ..qp.endpoint(psn)?
    };
    let server = args.host.is_none();
    let mut stream = match &args.host {
        Some(host) => super::tcp_client(host, args.port, &args.time)?,
        None => super::tcp_server(args.port, &args.time)?,
    };
    let remote = oob::exchange(&mut stream, &local).during("endpoint exchange")?;
    let local_mr = RemoteMr {
        addr: mr.addr(),
        rkey: mr.rkey(),
        len: MR_LEN as u64,
    };
    let remote_mr = oob::exchange_mr(&mut stream, &local_mr).during("MR exchange")?;
    if remote_mr.len < TARGET_LEN as u64 {
        return Err(InteropError::new(format!(
            "the peer's region ({remote_mr}) is shorter than {TARGET_LEN} bytes"
        )));
    }
    println!(
        "rdma-check: {} ({}) on {}, local {local}, remote {remote}, remote MR {remote_mr}",
        if server { "server" } else { "client" },
        ctx.device_name(),
        args.device.provider_name(),
    );
    path.dgid = remote.gid;
    path.dest_qpn = remote.qpn;
    path.rq_psn = remote.psn;
    path.udp_dport = remote.udp_port;
    path.to_rts(&qp)?;
    oob::barrier(&mut stream).during("barrier after RTS")?;

    let mut side = Side {
        qp,
        mr,
        waiter: Waiter::new(cq, None, args.time.io())?,
        backlog: VecDeque::new(),
        stream,
        remote: remote_mr,
    };
    for phase in 1..=2u32 {
        let requester = (phase == 1) == server;
        if requester {
            requester_phase(&mut side, phase, args.seed, report)?;
        } else {
            responder_phase(&mut side, phase, args.seed, report)?;
        }
    }
    Ok(())
}

/// splitmix64: the pattern generator (and the atomic operands).
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `len` pattern bytes for transfer `index` of `phase`.
fn pattern(seed: u64, phase: u32, index: usize, len: usize) -> Vec<u8> {
    let base = mix(seed ^ (u64::from(phase) << 48) ^ ((index as u64) << 32));
    (0..len.div_ceil(8))
        .flat_map(|w| mix(base ^ w as u64).to_le_bytes())
        .take(len)
        .collect()
}

/// Target offsets of the WRITEs of step 1: consecutive, 64-byte aligned.
fn write_offsets() -> [usize; SIZES.len()] {
    let mut out = [0; SIZES.len()];
    let mut off = 0;
    for (slot, size) in out.iter_mut().zip(SIZES) {
        *slot = off;
        off += size.next_multiple_of(64);
    }
    out
}

/// The atomic operands of a phase, from the requester's seed.
struct AtomicPlan {
    add1: u64,
    add2: u64,
    swap: u64,
    wrong: u64,
}

fn atomic_plan(seed: u64, phase: u32) -> AtomicPlan {
    let r = mix(seed ^ 0xA70_0000 ^ u64::from(phase));
    AtomicPlan {
        add1: r & 0xFFFF,
        add2: (r >> 16) & 0xFFFF_FFFF,
        swap: mix(r),
        wrong: mix(r ^ 1),
    }
}

/// The target area the responder must hold after a successful phase.
fn expected_image(seed: u64, phase: u32, swap: u64) -> Vec<u8> {
    let mut img = vec![0u8; TARGET_LEN];
    for (i, (off, size)) in write_offsets().into_iter().zip(SIZES).enumerate() {
        img[off..off + size].copy_from_slice(&pattern(seed, phase, i, size));
    }
    for (i, op) in IMM_OPS.iter().enumerate() {
        img[op.off..op.off + op.len].copy_from_slice(&pattern(
            seed,
            phase,
            SIZES.len() + i,
            op.len,
        ));
    }
    img[ATOMIC_OFF..ATOMIC_OFF + 8].copy_from_slice(&swap.to_ne_bytes());
    img
}

impl Side {
    /// The next completion, from the backlog or the CQ.
    fn next_wc(&mut self, what: &str) -> Result<WorkCompletion> {
        if let Some(wc) = self.backlog.pop_front() {
            return Ok(wc);
        }
        let batch = self.waiter.next(&|| what.to_string())?;
        self.backlog.extend(batch.iter().copied());
        self.backlog
            .pop_front()
            .ok_or_else(|| InteropError::new("empty completion batch"))
    }

    /// Posts one signaled WR with one SGE at local `off`, `len` bytes, and waits for its
    /// successful completion with `opcode`.
    fn op(
        &mut self,
        wr_id: u64,
        op: SendOp,
        off: usize,
        len: usize,
        opcode: WcOpcode,
    ) -> Result<()> {
        let sge = [self.mr.sge(off, len)?];
        self.qp
            .post_send(&[SendWr::new(wr_id, op, &sge)])
            .during("post_send")?;
        let what = format!("the completion of {op:?}");
        let wc = self.next_wc(&what)?;
        if wc.wr_id != wr_id || wc.status != WcStatus::Success || wc.opcode != opcode {
            return Err(InteropError::new(format!(
                "completion wr_id {} status {:?} (vendor_err {:#x}) opcode {:?}, expected wr_id \
                 {wr_id} SUCCESS {opcode:?}",
                wc.wr_id, wc.status, wc.vendor_err, wc.opcode
            )));
        }
        Ok(())
    }

    fn remote_addr(&self, off: usize) -> u64 {
        self.remote.addr + off as u64
    }

    /// An atomic whose returned value must be `expect`.
    fn atomic(&mut self, wr_id: u64, op: SendOp, expect: u64) -> Result<()> {
        self.mr.write(DST_OFF, &[0; 8])?;
        let opcode = match op {
            SendOp::AtomicFetchAndAdd { .. } => WcOpcode::FetchAdd,
            _ => WcOpcode::CompSwap,
        };
        self.op(wr_id, op, DST_OFF, 8, opcode)?;
        let got = self.read_u64(DST_OFF)?;
        if got == expect {
            Ok(())
        } else {
            Err(InteropError::new(format!(
                "returned {got:#018x}, expected {expect:#018x}"
            )))
        }
    }

    fn read_u64(&self, off: usize) -> Result<u64> {
        let mut b = [0u8; 8];
        self.mr.read(off, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    }

    fn send(&mut self, line: &str) -> Result<()> {
        oob::send_line(&mut self.stream, line).during("control connection")
    }

    /// Receives a control line `<verb> phase=P …` and returns its `key=value` fields.
    fn expect(&mut self, verb: &str, phase: u32) -> Result<Fields> {
        let line = oob::recv_line(&mut self.stream).during(&format!(
            "waiting for the peer's \"{verb}\" (phase {phase})"
        ))?;
        let fields = Fields::parse(&line, verb)?;
        let got = fields.u64("phase")?;
        if got != u64::from(phase) {
            return Err(InteropError::new(format!(
                "malformed peer message: {line:?} is for phase {got}, expected {phase}"
            )));
        }
        Ok(fields)
    }
}

/// The `key=value` fields of a control line.
struct Fields {
    line: String,
    fields: Vec<(String, String)>,
}

impl Fields {
    fn parse(line: &str, verb: &str) -> Result<Fields> {
        let mut words = line.split_whitespace();
        if words.next() != Some(verb) {
            return Err(InteropError::new(format!(
                "malformed peer message: expected \"{verb} …\", got {line:?}"
            )));
        }
        let mut fields = Vec::new();
        for w in words {
            let (k, v) = w.split_once('=').ok_or_else(|| {
                InteropError::new(format!(
                    "malformed peer message {line:?}: {w:?} is not key=value"
                ))
            })?;
            fields.push((k.to_string(), v.to_string()));
        }
        Ok(Fields {
            line: line.to_string(),
            fields,
        })
    }

    fn str(&self, key: &str) -> Result<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .ok_or_else(|| {
                InteropError::new(format!("malformed peer message {:?}: no {key}=", self.line))
            })
    }

    fn u64(&self, key: &str) -> Result<u64> {
        let v = self.str(key)?;
        let parsed = match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => v.parse(),
        };
        parsed.map_err(|_| {
            InteropError::new(format!(
                "malformed peer message {:?}: {key}={v:?} is not a number",
                self.line
            ))
        })
    }
}

/// This side operates on the peer's region (see the module docs), then learns the peer's
/// verdict on its memory.
fn requester_phase(side: &mut Side, phase: u32, seed: u64, report: &mut Report) -> Result<()> {
    let dir = "this->peer";
    let ready = side.expect("ready", phase)?;
    let v0 = ready.u64("v0")?;
    let plan = atomic_plan(seed, phase);
    let started = Instant::now();
    let mut ok = true;
    let mut wr_id = u64::from(phase) << 32;
    let mut next_id = || {
        wr_id += 1;
        wr_id
    };
    // Once an operation fails the QP is in the error state and the rest would only flush.
    for (i, (off, size)) in write_offsets().into_iter().zip(SIZES).enumerate() {
        if !ok {
            break;
        }
        let data = pattern(seed, phase, i, size);
        let r = (|| -> Result<()> {
            side.mr.write(SRC_OFF, &data)?;
            let rkey = side.remote.rkey;
            let remote_addr = side.remote_addr(off);
            side.op(
                next_id(),
                SendOp::RdmaWrite { remote_addr, rkey },
                SRC_OFF,
                size,
                WcOpcode::RdmaWrite,
            )
            .during("WRITE")?;
            side.mr.write(DST_OFF, &vec![0; size])?;
            side.op(
                next_id(),
                SendOp::RdmaRead { remote_addr, rkey },
                DST_OFF,
                size,
                WcOpcode::RdmaRead,
            )
            .during("READ")?;
            let mut back = vec![0u8; size];
            side.mr.read(DST_OFF, &mut back)?;
            match back.iter().zip(&data).position(|(a, b)| a != b) {
                None => Ok(()),
                Some(at) => Err(InteropError::new(format!(
                    "READ returned {:#04x} at byte {at}, WRITE put {:#04x}",
                    back[at], data[at]
                ))),
            }
        })();
        ok &= report.result(
            &format!("{dir}  RDMA WRITE {size} B, RDMA READ back, bytes equal"),
            r,
        );
    }
    for (i, imm_op) in IMM_OPS.iter().enumerate() {
        if !ok {
            break;
        }
        let data = pattern(seed, phase, SIZES.len() + i, imm_op.len);
        let imm = imm_value(phase, i);
        let (op, opcode, name) = if imm_op.send {
            (SendOp::SendWithImm { imm }, WcOpcode::Send, "SEND_WITH_IMM")
        } else {
            let op = SendOp::RdmaWriteWithImm {
                remote_addr: side.remote_addr(imm_op.off),
                rkey: side.remote.rkey,
                imm,
            };
            (op, WcOpcode::RdmaWrite, "RDMA WRITE_WITH_IMM")
        };
        let r = side
            .mr
            .write(SRC_OFF, &data)
            .map_err(InteropError::from)
            .and_then(|()| side.op(next_id(), op, SRC_OFF, imm_op.len, opcode));
        ok &= report.result(
            &format!("{dir}  {name} {} B completed ({})", imm_op.len, imm_op.wire),
            r,
        );
    }
    let rkey = side.remote.rkey;
    let addr = side.remote_addr(ATOMIC_OFF);
    let after_adds = v0.wrapping_add(plan.add1).wrapping_add(plan.add2);
    let atomics: [(&str, SendOp, u64); 4] = [
        (
            "FETCH_ADD returns the initial value",
            SendOp::AtomicFetchAndAdd {
                remote_addr: addr,
                rkey,
                add: plan.add1,
            },
            v0,
        ),
        (
            "FETCH_ADD returns the value after the first add",
            SendOp::AtomicFetchAndAdd {
                remote_addr: addr,
                rkey,
                add: plan.add2,
            },
            v0.wrapping_add(plan.add1),
        ),
        (
            "CMP_SWAP (equal: swaps) returns the old value",
            SendOp::AtomicCmpAndSwp {
                remote_addr: addr,
                rkey,
                compare: after_adds,
                swap: plan.swap,
            },
            after_adds,
        ),
        (
            "CMP_SWAP (not equal: no swap) returns the current value",
            SendOp::AtomicCmpAndSwp {
                remote_addr: addr,
                rkey,
                compare: plan.wrong,
                swap: plan.wrong,
            },
            plan.swap,
        ),
    ];
    for (what, op, expect) in atomics {
        if !ok {
            break;
        }
        let r = side.atomic(next_id(), op, expect);
        ok &= report.result(&format!("{dir}  ATOMIC {what}"), r);
    }
    if ok {
        let r = (|| -> Result<()> {
            side.mr.write(DST_OFF, &[0; 8])?;
            side.op(
                next_id(),
                SendOp::RdmaRead {
                    remote_addr: addr,
                    rkey,
                },
                DST_OFF,
                8,
                WcOpcode::RdmaRead,
            )?;
            let got = side.read_u64(DST_OFF)?;
            if got == plan.swap {
                Ok(())
            } else {
                Err(InteropError::new(format!(
                    "READ of the atomic word gave {got:#018x}, expected {:#018x}",
                    plan.swap
                )))
            }
        })();
        ok &= report.result(
            &format!("{dir}  RDMA READ of the atomic word after the swaps"),
            r,
        );
    }
    println!(
        "rdma-check: phase {phase} (this side requester) took {:.2} s",
        started.elapsed().as_secs_f64()
    );
    side.send(&format!(
        "done phase={phase} seed={seed} swap={:#x} result={}",
        plan.swap,
        if ok { "ok" } else { "failed" }
    ))?;
    let verdict = side.expect("verified", phase)?;
    let peer_ok = verdict.str("result")? == "ok";
    report.check(
        &format!("{dir}  the peer verified its memory and its receive completions"),
        peer_ok,
        "the peer reported a failure (see its output)",
    );
    if ok && peer_ok {
        Ok(())
    } else {
        Err(InteropError::new(format!("phase {phase} failed")))
    }
}

/// This side's region is the target: prepare it, let the peer operate, verify.
fn responder_phase(side: &mut Side, phase: u32, seed: u64, report: &mut Report) -> Result<()> {
    let dir = "peer->this";
    let v0 = mix(seed ^ 0x5EED ^ u64::from(phase));
    side.mr.write(0, &vec![0; TARGET_LEN])?;
    side.mr.write(ATOMIC_OFF, &v0.to_ne_bytes())?;
    let recv_id = |i: usize| (u64::from(phase) << 32) | 0xFF00 | i as u64;
    for (i, op) in IMM_OPS.iter().enumerate() {
        let sge = [side.mr.sge(op.off, op.buf)?];
        let sg_list: &[verbs_api::Sge] = if op.send { &sge } else { &[] };
        side.qp
            .post_recv(&[RecvWr::new(recv_id(i), sg_list)])
            .during("post_recv")?;
    }
    side.send(&format!("ready phase={phase} v0={v0:#x}"))?;
    let done = side.expect("done", phase)?;
    let peer_seed = done.u64("seed")?;
    let swap = done.u64("swap")?;
    let peer_ok = done.str("result")? == "ok";
    let mut ok = report.check(
        &format!("{dir}  the peer's operations all completed as expected"),
        peer_ok,
        "the peer reported a failure (see its output)",
    );
    if peer_ok {
        for (i, op) in IMM_OPS.iter().enumerate() {
            let imm = imm_value(phase, i);
            let opcode = if op.send {
                WcOpcode::Recv
            } else {
                WcOpcode::RecvRdmaWithImm
            };
            let r = side
                .next_wc("the receive completions of the operations with immediate data")
                .and_then(|wc| {
                    if wc.wr_id == recv_id(i)
                        && wc.status == WcStatus::Success
                        && wc.opcode == opcode
                        && wc.wc_flags.contains(WcFlags::WITH_IMM)
                        && wc.imm_data == imm
                        && wc.byte_len as usize == op.len
                    {
                        return Ok(());
                    }
                    Err(InteropError::new(format!(
                        "got wr_id {:#x} {:?} {:?} flags {:?} imm {:#x} byte_len {}, expected \
                         wr_id {:#x} SUCCESS {opcode:?} WITH_IMM imm {imm:#x} byte_len {}",
                        wc.wr_id,
                        wc.status,
                        wc.opcode,
                        wc.wc_flags,
                        wc.imm_data,
                        wc.byte_len,
                        recv_id(i),
                        op.len
                    )))
                });
            ok &= report.result(
                &format!(
                    "{dir}  receive completion {} of {}: {opcode:?}, immediate data, {} B",
                    i + 1,
                    IMM_OPS.len(),
                    op.len
                ),
                r,
            );
        }
        let expect = expected_image(peer_seed, phase, swap);
        let mut got = vec![0u8; TARGET_LEN];
        side.mr.read(0, &mut got)?;
        let diff = got.iter().zip(&expect).position(|(a, b)| a != b);
        ok &= report.check(
            &format!(
                "{dir}  target memory equals the expected image ({TARGET_LEN} B: {} WRITEs, {} \
                 WRITE/SEND_WITH_IMM, final atomic word, untouched gaps)",
                SIZES.len(),
                IMM_OPS.len()
            ),
            diff.is_none(),
            &diff.map_or_else(String::new, |at| {
                format!(
                    "first difference at offset {at}: {:#04x}, expected {:#04x}",
                    got[at], expect[at]
                )
            }),
        );
    }
    side.send(&format!(
        "verified phase={phase} result={}",
        if ok { "ok" } else { "failed" }
    ))?;
    if ok {
        Ok(())
    } else {
        Err(InteropError::new(format!("phase {phase} failed")))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn layout_fits_and_does_not_overlap() {
        let offs = write_offsets();
        let end = offs[SIZES.len() - 1] + SIZES[SIZES.len() - 1];
        // Every area: [start, end), sorted; no overlap, all inside the target area.
        let mut areas: Vec<(usize, usize)> =
            offs.iter().zip(SIZES).map(|(&o, s)| (o, o + s)).collect();
        areas.extend(
            IMM_OPS
                .iter()
                .map(|op| (op.off, op.off + op.len.max(op.buf))),
        );
        areas.push((ATOMIC_OFF, ATOMIC_OFF + 8));
        areas.sort_unstable();
        assert!(areas.windows(2).all(|w| w[0].1 <= w[1].0), "{areas:?}");
        assert!(areas.last().unwrap().1 <= TARGET_LEN);
        assert!(end <= areas.last().unwrap().1);
        assert!(IMM_OPS.iter().all(|op| !op.send || op.len <= op.buf));
        const { assert!(ATOMIC_OFF % 8 == 0) };
        assert!(
            SIZES
                .iter()
                .all(|&s| s <= DST_OFF - SRC_OFF && s <= MR_LEN - DST_OFF)
        );
    }

    #[test]
    fn patterns_depend_on_every_input() {
        let p = pattern(1, 1, 0, 64);
        assert_eq!(p, pattern(1, 1, 0, 64));
        assert_ne!(p, pattern(2, 1, 0, 64));
        assert_ne!(p, pattern(1, 2, 0, 64));
        assert_ne!(p, pattern(1, 1, 1, 64));
        assert_eq!(pattern(1, 1, 0, 13), p[..13]);
    }

    #[test]
    fn control_lines_parse_and_reject_garbage() {
        let f = Fields::parse("done phase=1 seed=7 swap=0xff result=ok", "done").unwrap();
        assert_eq!(f.u64("phase").unwrap(), 1);
        assert_eq!(f.u64("swap").unwrap(), 0xff);
        assert_eq!(f.str("result").unwrap(), "ok");
        assert!(f.u64("v0").unwrap_err().0.contains("no v0="));
        assert!(Fields::parse("ready phase=1", "done").is_err());
        assert!(Fields::parse("done phase", "done").is_err());
        let f = Fields::parse("done phase=x", "done").unwrap();
        assert!(f.u64("phase").unwrap_err().0.contains("not a number"));
    }
}
