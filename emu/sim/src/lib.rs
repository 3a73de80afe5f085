//! `emu-sim`: the in-process softverbs backend for unit tests.
//!
//! Any number of emulated devices live in one process on an in-memory fabric: no sockets, no
//! threads, **deterministic**, with **reproducible faults**. Start with [`SimProvider::pair`]
//! (a connected RC QP pair in one call) or [`SimProvider::builder`]; everything else is the
//! `verbs_api` object model, so code written against `verbs_api::Context` runs unchanged.
//!
//! What is emulated: the whole RC transport of `emu_proto` (SEND, WRITE, READ, atomics, ACK
//! coalescing, go-back-N retransmission, RNR, NAKs, flush), PDs, MRs owned by the emulator
//! (heap, shared file mapping or caller memory), CQs with completion channels, SRQs, memory
//! windows of type 1 and 2. Rejected: UC/UD QPs (`NotSupported`), alternate paths.
//!
//! # Time and progress
//!
//! There is no background thread: the fabric runs inside the calls the application makes, under
//! one mutex, so handles may be used from any number of threads.
//!
//! * **Virtual time** (default). Every verbs call transmits what the HCAs queued and delivers
//!   datagrams in timestamp order, jumping virtual time forward to each delivery, until only
//!   timers (local ACK timeout, RNR wait) are left. Virtual time jumps to a *timer* deadline
//!   only when the application waits: a CQ poll that finds the CQ empty, `get_cq_event` or
//!   `poll_async_event` finding nothing, `wait_cq_event`, [`emu_device::Cq::next_completion`],
//!   [`SimProvider::advance`] and [`SimProvider::run_until_idle`]. Each empty poll passes one
//!   deadline, so a 7-retry timeout (≈ 0.5 s of virtual time) takes a few polls and
//!   microseconds of wall time, and a test can change faults between polls.
//! * **Bursts**, in both modes. A `post_send` that directly follows another on its device (no
//!   poll, MR read or other call on that device between them) leaves its packets in the HCA
//!   for the next call that runs the fabric, as a NIC batches the WQEs of one doorbell: the
//!   burst crosses together and the responder ACKs it as one (`softverbs perf write_bw
//!   --backend inproc -s 8`: 7.4 k instructions per WRITE with its share of ACK and completion
//!   when each post crossed alone, 4.6 k in bursts; callgrind). A send buffer therefore must
//!   not change until its WR completes, as on hardware. Reading an MR (spinning on a byte), a
//!   device's counters and every [`SimProvider`] method (fault control, pending datagrams,
//!   time, the trace) move a burst first, so nothing observes a post that has not run.
//!   Another thread blocked in `wait_cq_event` meanwhile sees the burst within its wait slice
//!   (1 ms of wall time) if the posting thread makes no further call.
//! * **Real time** ([`SimBuilder::real_time`]). `now` is the time since the provider was
//!   created; calls deliver what is due and fire due timers, never jumping ahead. CQ polling
//!   drives progress; `wait_cq_event` runs the fabric in short slices while it waits.
//!
//! # Faults
//!
//! Every datagram goes through one [`fault::Injector`] per provider (the `emu_fault` crate,
//! re-exported as [`fault`]), built from a [`fault::FaultPlan`] given to
//! [`SimBuilder::faults`] (or [`SimBuilder::faults_toml`]): drop, duplicate, delay with jitter
//! (which reorders), corrupt (one flipped bit: the receiver's ICRC check counts it in
//! [`Stats::icrc_errors`] and drops it), truncate, partition, hold and rate limit, matched on
//! direction, QPN, opcode or class, PSN range, n-th packet and time window. Device `i` is
//! `NodeId(i)`; [`SimDevice::node`] names it. At run time: [`SimProvider::set_faults`],
//! [`SimProvider::partition`], [`SimProvider::partition_oneway`], [`SimProvider::repair`],
//! [`SimProvider::heal`], [`SimProvider::release_held`].
//!
//! # Reproducibility
//!
//! One seed drives every random choice (fault streams, HCA keys): [`SimBuilder::seed`], or the
//! plan's seed, overridden by the environment variable `SOFTVERBS_SEED` ([`SEED_ENV`]). The
//! same seed, plan and single-threaded call sequence give the same packet trace:
//! [`SimProvider::trace_hash`] hashes every delivered datagram (time, source, destination,
//! bytes). For that, MRs the emulator allocates (`alloc_mr`, `reg_mr_file`) get synthetic,
//! deterministic virtual addresses per device (from `0x1000_0000`, page aligned), not host
//! pointers; `reg_mr_raw` keeps the caller's address, so traces that carry it (RETH, AtomicETH)
//! are only as reproducible as that address. [`seed_from_env`] picks a test's seed and prints
//! `SOFTVERBS_SEED=<n>`, which the test harness shows when the test fails; rerun with
//! `SOFTVERBS_SEED=<n> cargo test <name>`.
//!
//! # Observing
//!
//! [`emu_device::Context::qp_stats`] / [`emu_device::Qp::stats`] /
//! [`SimDevice::device_stats`] return the transport counters ([`Stats`]: retransmits,
//! timeouts, sequence and RNR NAKs, duplicates, ICRC errors, …);
//! [`SimProvider::fault_counters`] the per-link verdict counts;
//! [`SimBuilder::capture`] writes every delivered datagram to a pcap file that Wireshark
//! decodes as RoCEv2; [`SimBuilder::record_trace`] keeps them in memory.
//!
//! # Examples
//!
//! A plain unit test:
//!
//! ```
//! use emu_sim::SimProvider;
//! use verbs_api::{MemoryRegion, QueuePair, SendOp, SendWr, WcStatus};
//!
//! let p = SimProvider::pair()?; // two devices, an RC QP pair in RTS, a CQ and an MR per side
//! p.mr_a.write(0, b"hello, peer")?;
//! let sge = [p.mr_a.sge(0, 11)?];
//! let write = SendOp::RdmaWrite { remote_addr: p.mr_b.addr() + 64, rkey: p.mr_b.rkey() };
//! p.qp_a.post_send(&[SendWr::new(1, write, &sge)])?;
//! let wc = p.cq_a.next_completion()?;
//! assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));
//! let mut got = [0u8; 11];
//! p.mr_b.read(64, &mut got)?;
//! assert_eq!(&got, b"hello, peer");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Drop the first ACK and check that the requester retransmitted after its ACK timeout:
//!
//! ```
//! use emu_sim::fault::{FaultPlan, drop_nth};
//! use emu_sim::{Opcode, SimProvider};
//! use verbs_api::{MemoryRegion, QueuePair, SendOp, SendWr, WcStatus};
//!
//! let seed = emu_sim::seed_from_env(7); // prints SOFTVERBS_SEED=7 (shown if the test fails)
//! let plan = FaultPlan::new(seed).rule(drop_nth(1).opcode(Opcode::Acknowledge));
//! let p = SimProvider::builder().faults(plan).pair()?;
//! let sge = [p.mr_a.sge(0, 8)?];
//! let write = SendOp::RdmaWrite { remote_addr: p.mr_b.addr(), rkey: p.mr_b.rkey() };
//! p.qp_a.post_send(&[SendWr::new(1, write, &sge)])?;
//! assert_eq!(p.cq_a.next_completion()?.status, WcStatus::Success);
//! let stats = p.a.qp_stats(&p.qp_a)?;
//! assert_eq!(stats.timeout_retries, 1); // one local ACK timeout ...
//! assert_eq!(stats.retransmits_timeout, 1); // ... resent one packet
//! assert_eq!(p.b.qp_stats(&p.qp_b)?.duplicate_request, 1); // which b saw twice
//! assert_eq!(p.sim.fault_counters().total().dropped, 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Partition the peer for longer than the retry budget: the first WR fails with
//! `RETRY_EXC_ERR`, the QP enters ERR and the next WR is flushed:
//!
//! ```
//! use std::time::Duration;
//!
//! use emu_sim::SimProvider;
//! use verbs_api::{MemoryRegion, QpState, QueuePair, SendOp, SendWr, WcStatus};
//!
//! let p = SimProvider::pair()?;
//! p.sim.partition(p.a.node(), p.b.node());
//! let sge = [p.mr_a.sge(0, 8)?];
//! let write = SendOp::RdmaWrite { remote_addr: p.mr_b.addr(), rkey: p.mr_b.rkey() };
//! p.qp_a.post_send(&[SendWr::new(1, write, &sge), SendWr::new(2, write, &sge)])?;
//! let wc = p.cq_a.next_completion()?;
//! assert_eq!((wc.wr_id, wc.status), (1, WcStatus::RetryExcErr));
//! let wc = p.cq_a.next_completion()?;
//! assert_eq!((wc.wr_id, wc.status), (2, WcStatus::WrFlushErr));
//! assert_eq!(p.qp_a.state()?, QpState::Err);
//! assert_eq!(p.qp_a.stats()?.retry_exceeded_err, 1);
//! // 1 + 7 attempts 67 ms apart: half a second of virtual time, microseconds of wall time.
//! assert!(p.sim.now() > Duration::from_millis(500));
//! p.sim.heal(); // too late for this QP: it stays in ERR
//! assert_eq!(p.qp_a.state()?, QpState::Err);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The verbs handles are [`emu_device`]'s, named here by type aliases over the port
//! [`SimDevice`]; a [`SimContext`] derefs to its [`SimDevice`] ([`SimDevice::node`],
//! [`SimDevice::provider`], [`SimDevice::device_stats`]). The crate has no `unsafe` code (MR
//! memory is the `mr-region` crate's).
#![deny(unsafe_code)]

mod fabric;
mod pair;
mod provider;
mod seed;

pub use emu_fault as fault;
pub use emu_proto::Stats;
pub use emu_proto::wire::Opcode;
pub use fabric::TraceRecord;
pub use pair::{PairOptions, SimPair, connect_pair};
pub use provider::{
    SEED_ENV, SimBuilder, SimChannel, SimContext, SimCq, SimDevice, SimMr, SimMw, SimPd,
    SimProvider, SimQp, SimSrq,
};
pub use seed::seed_from_env;
