//! The in-process provider: `verbs_api` implemented over [`emu_proto::Hca`] instances that
//! share one fabric.
//!
//! Every verbs call locks the fabric briefly, applies the command to the device's HCA and then
//! runs the fabric (see `fabric`) and delivers what the HCAs produced (completion-channel
//! notifications, async events). Calls that find nothing while the application waits (an empty
//! CQ poll, an empty completion channel or async event queue) also let virtual time reach the
//! next timer deadline. Handles keep their parents alive (a QP holds its PD, CQs and SRQ); an
//! explicitly destroyed handle fails every later call with `ErrorKind::Destroyed`.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use emu_capture::PcapSink;
use emu_fault::{Counters, FaultPlan, Injector, NodeId, PlanError};
use emu_proto::{
    ChannelId, CqId, EventRouter, Hca, HcaConfig, Instant, MrInfo, PdId, SrqId, Stats,
};
use verbs_api::{
    AccessFlags, AsyncEvent, CompletionChannel, CompletionQueue, Context, Device, DeviceAttr,
    Endpoint, Error, ErrorKind, EventElement, Gid, MemoryRegion, PortAttr, PostError,
    ProtectionDomain, Provider, QpAttr, QpAttrMask, QpInitAttr, QpType, QueuePair, RecvWr, Result,
    SendWr, SharedReceiveQueue, SrqAttr, WorkCompletion,
};

use crate::channel::ChannelShared;
use crate::fabric::{
    Goal, NodeMemory, PumpNode, Pumped, TraceRecord, Wire, WireConfig, next_event, node_id, pump,
};
use crate::pair::SimPair;
use crate::region::Region;
use crate::seed::env_seed;

/// One emulated device on the fabric.
#[derive(Debug)]
struct Node {
    hca: Hca,
    mem: NodeMemory,
    addr: SocketAddr,
    channels: HashMap<ChannelId, Arc<ChannelShared>>,
    /// Async events per context (rc-transport.md §5.3; `ibv_get_async_event` is per context).
    events: EventRouter,
    /// Virtual address of the next emulator-owned MR: deterministic, so that the same calls
    /// put the same addresses on the wire in every run.
    next_iova: u64,
}

impl PumpNode for Node {
    fn parts(&mut self) -> (&mut Hca, &NodeMemory, SocketAddr) {
        (&mut self.hca, &self.mem, self.addr)
    }
}

impl Node {
    /// Hands what the HCA produced to the application side: channel notifications and async
    /// events.
    fn deliver(&mut self) {
        while let Some(n) = self.hca.poll_notification() {
            if let Some(ch) = self.channels.get(&n.channel) {
                ch.signal(n.cq.0);
                self.hca.cq_event_delivered(n.cq);
            }
        }
        while let Some(e) = self.hca.poll_event() {
            self.events.route(e);
        }
    }
}

/// The shared state of all devices of one provider.
#[derive(Debug)]
struct FabricState {
    nodes: Vec<Node>,
    wire: Wire,
    seed: u64,
    /// The last pump ran out of budget: work is left even if no event is pending.
    unsettled: bool,
}

impl FabricState {
    /// Runs the fabric toward `goal` and hands notifications and events to the application.
    fn pump(&mut self, goal: Goal) -> Pumped {
        let FabricState { nodes, wire, .. } = self;
        let pumped = pump(wire, nodes, goal);
        for node in nodes.iter_mut() {
            node.deliver();
        }
        self.unsettled = pumped.exhausted;
        pumped
    }

    /// Time from now until the next pending event; `None` if nothing is pending.
    fn next_event_in(&mut self) -> Option<Duration> {
        if self.unsettled {
            return Some(Duration::ZERO);
        }
        let FabricState { nodes, wire, .. } = self;
        wire.tick();
        next_event(wire, nodes).map(|at| at - wire.now)
    }

    fn node_mut(&mut self, node: usize) -> Result<&mut Node> {
        self.nodes
            .get_mut(node)
            .ok_or_else(|| Error::new(ErrorKind::NotFound, "device vanished"))
    }
}

/// Virtual address of a device's first emulator-owned MR.
const FIRST_IOVA: u64 = 0x1000_0000;
/// Page size for synthetic MR addresses.
const PAGE: u64 = 4096;

/// Environment variable that overrides every [`SimBuilder::seed`]: set it to the seed a failing
/// test printed to replay the run (decimal, or hex with `0x`).
pub const SEED_ENV: &str = "SOFTVERBS_SEED";

/// Builds a [`SimProvider`]: number of devices, seed, latency, fault plan, clock, capture.
///
/// One seed drives every random choice of the provider: the fault plan's random streams and
/// the HCAs' key bytes. It is, in order of precedence, the value of the [`SEED_ENV`]
/// environment variable, [`SimBuilder::seed`], the seed of the plan given to
/// [`SimBuilder::faults`], or 0. Same seed, plan and sequence of verbs calls (from one thread)
/// give the same packet trace ([`SimProvider::trace_hash`]).
#[derive(Clone, Debug)]
pub struct SimBuilder {
    devices: usize,
    seed: Option<u64>,
    latency: Duration,
    faults: Option<FaultPlan>,
    capture: Option<PathBuf>,
    real_time: bool,
    record: bool,
}

impl Default for SimBuilder {
    fn default() -> SimBuilder {
        SimBuilder {
            devices: 2,
            seed: None,
            latency: Duration::from_micros(1),
            faults: None,
            capture: None,
            real_time: false,
            record: false,
        }
    }
}

impl SimBuilder {
    /// Number of emulated devices (default 2), named `softverbs0`, `softverbs1`, …, with GIDs
    /// `::ffff:127.0.0.1`, `::ffff:127.0.0.2`, …; device `i` is `NodeId(i)` in fault plans.
    pub fn devices(mut self, n: usize) -> SimBuilder {
        self.devices = n;
        self
    }

    /// The seed of every random choice (fault plan and HCA keys); see the type doc for how it
    /// combines with [`SEED_ENV`] and the plan's own seed.
    pub fn seed(mut self, seed: u64) -> SimBuilder {
        self.seed = Some(seed);
        self
    }

    /// One-way latency of the in-memory wire (default 1 µs), added to every delivery after the
    /// fault plan's delays.
    pub fn latency(mut self, latency: Duration) -> SimBuilder {
        self.latency = latency;
        self
    }

    /// Runs every datagram through `plan` (an [`emu_fault::Injector`]); its seed is replaced by
    /// the provider's (type doc). An invalid plan makes [`SimBuilder::build`] fail with
    /// `InvalidArgument` naming the rule and field.
    pub fn faults(mut self, plan: FaultPlan) -> SimBuilder {
        self.faults = Some(plan);
        self
    }

    /// Like [`SimBuilder::faults`] with a plan in its TOML form (see `emu_fault`).
    ///
    /// Errors: `InvalidArgument` for malformed TOML, unknown keys, opcodes or actions and
    /// out-of-range values; the message names the line, column and field.
    pub fn faults_toml(self, text: &str) -> Result<SimBuilder> {
        let plan = FaultPlan::from_toml(text).map_err(plan_error)?;
        Ok(self.faults(plan))
    }

    /// Writes every delivered datagram to a pcap file at `path` (Ethernet/IPv4/UDP framing, IP
    /// addresses from the device GIDs, port 4791; Wireshark decodes it as RoCEv2). Timestamps
    /// are virtual time since 1970-01-01 (real-time providers: the wall clock). What the fault
    /// plan drops never appears; duplicates appear once per copy and corrupted datagrams with
    /// their flipped bit. Call [`SimProvider::finish_capture`] to flush and check for errors.
    pub fn capture(mut self, path: impl Into<PathBuf>) -> SimBuilder {
        self.capture = Some(path.into());
        self
    }

    /// Keeps a copy of every delivered datagram in memory for [`SimProvider::take_trace`].
    pub fn record_trace(mut self) -> SimBuilder {
        self.record = true;
        self
    }

    /// Uses real time instead of virtual time: `now` is the time since the provider was
    /// created, the fabric delivers what is due and never jumps ahead, and timers fire when
    /// their deadline passes on the wall clock. Progress is still made only inside calls (CQ
    /// polls, `wait_cq_event`, …); there is no background thread.
    pub fn real_time(mut self) -> SimBuilder {
        self.real_time = true;
        self
    }

    /// Creates the provider.
    ///
    /// Errors: `InvalidArgument` for more than 254 devices (the GID scheme holds 254), an
    /// invalid fault plan or an unparsable [`SEED_ENV`]; `Io` if the capture file cannot be
    /// created.
    pub fn build(self) -> Result<SimProvider> {
        if self.devices > 254 {
            return Err(Error::invalid("at most 254 emulated devices"));
        }
        let seed = match env_seed()? {
            Some(seed) => seed,
            None => self
                .seed
                .or(self.faults.as_ref().map(|p| p.seed))
                .unwrap_or(0),
        };
        let mut plan = self.faults.unwrap_or_else(|| FaultPlan::new(seed));
        plan.seed = seed;
        let injector = Injector::new(plan).map_err(plan_error)?;
        let capture = match &self.capture {
            Some(path) => Some(PcapSink::create(path).map_err(|e| {
                Error::new(ErrorKind::Io, format!("capture {}: {e}", path.display()))
            })?),
            None => None,
        };
        let nodes: Vec<Node> = (0..self.devices)
            .map(|i| {
                let octet = u8::try_from(i + 1).unwrap_or(u8::MAX);
                let gid = Gid::from_ip(IpAddr::V4(Ipv4Addr::new(127, 0, 0, octet)));
                let seed = seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                let config = HcaConfig::new(format!("softverbs{i}"), gid, seed);
                Node {
                    addr: SocketAddr::new(gid.to_ip(), config.udp_port),
                    hca: Hca::new(config),
                    mem: NodeMemory::default(),
                    channels: HashMap::new(),
                    events: EventRouter::default(),
                    next_iova: FIRST_IOVA,
                }
            })
            .collect();
        let wire = Wire::new(WireConfig {
            latency: self.latency,
            real_time: self.real_time,
            addrs: nodes.iter().map(|n| n.addr).collect(),
            injector,
            capture,
            record: self.record,
        });
        Ok(SimProvider {
            fabric: Arc::new(Mutex::new(FabricState {
                nodes,
                wire,
                seed,
                unsettled: false,
            })),
        })
    }

    /// Builds the provider and connects an RC QP pair between devices 0 and 1 with
    /// [`crate::PairOptions::default`]; see [`crate::connect_pair`].
    ///
    /// Errors: those of [`SimBuilder::build`] and [`crate::connect_pair`]; `NotFound` with
    /// fewer than two devices.
    pub fn pair(self) -> Result<SimPair> {
        self.build()?.connect_pair(crate::PairOptions::default())
    }
}

/// Converts a rejected fault plan into a verbs error carrying its location.
fn plan_error(e: PlanError) -> Error {
    Error::invalid(format!("fault plan: {e}"))
}

/// The in-process provider: a set of emulated devices connected by an in-memory fabric, with a
/// seeded fault injector, counters, a trace hash and optional pcap capture.
///
/// Clones share the fabric. Every method locks the fabric briefly and may be called from any
/// thread.
#[derive(Clone, Debug)]
pub struct SimProvider {
    fabric: Arc<Mutex<FabricState>>,
}

impl SimProvider {
    /// A builder with defaults (2 devices, virtual time, no faults).
    pub fn builder() -> SimBuilder {
        SimBuilder::default()
    }

    /// A default provider (2 devices, virtual time, no faults) with an RC QP pair connected
    /// between its devices: the one-line fixture of a unit test. See [`crate::connect_pair`].
    ///
    /// Errors: as [`SimBuilder::pair`].
    pub fn pair() -> Result<SimPair> {
        SimBuilder::default().pair()
    }

    /// Connects an RC QP pair between devices 0 and 1 of this provider (fresh PDs, CQs, MRs
    /// and QPs); see [`crate::connect_pair`].
    ///
    /// Errors: `NotFound` with fewer than two devices; those of [`crate::connect_pair`].
    pub fn connect_pair(&self, opts: impl Into<crate::PairOptions>) -> Result<SimPair> {
        let a = self.context(0)?;
        let b = self.context(1)?;
        crate::connect_pair(&a, &b, opts)
    }

    /// Opens device `index` (same as `devices()?[index].open()`).
    ///
    /// Errors: `NotFound` if there is no such device.
    pub fn context(&self, index: usize) -> Result<SimContext> {
        let (name, id) = {
            let mut state = self.lock();
            let count = state.nodes.len();
            let node = state.nodes.get_mut(index).ok_or_else(|| {
                Error::new(
                    ErrorKind::NotFound,
                    format!("no device {index} (the provider has {count})"),
                )
            })?;
            (node.hca.config().name.clone(), node.events.open())
        };
        Ok(SimContext {
            dev: Arc::new(DeviceShared {
                fabric: self.fabric.clone(),
                node: index,
                name,
                id,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, FabricState> {
        lock(&self.fabric)
    }

    /// The seed this provider runs with (see [`SimBuilder`]); print it with a failing test and
    /// set [`SEED_ENV`] to it to replay.
    pub fn seed(&self) -> u64 {
        self.lock().seed
    }

    /// True if the provider runs in real time ([`SimBuilder::real_time`]).
    pub fn is_real_time(&self) -> bool {
        self.lock().wire.is_real_time()
    }

    /// The fabric's current time since the provider was created: virtual time, or elapsed
    /// wall time in real-time mode.
    pub fn now(&self) -> Duration {
        let mut state = self.lock();
        state.wire.tick();
        Duration::from_nanos(state.wire.now.as_nanos())
    }

    /// The fault plan as installed (seed included; rules retired by [`SimProvider::heal`] or
    /// [`SimProvider::release_held`] still listed): print it with a failing test.
    pub fn fault_plan(&self) -> FaultPlan {
        self.lock().wire.injector.plan().clone()
    }

    /// Replaces the fault rules with `plan`'s, from now on. The plan's seed is replaced by the
    /// provider's; the new rules start fresh (counts, random streams). Run-time partitions,
    /// held datagrams, counters and the trace hash carry on.
    ///
    /// Errors: `InvalidArgument` naming the rule and field for an invalid plan; nothing
    /// changes then.
    pub fn set_faults(&self, mut plan: FaultPlan) -> Result<()> {
        let mut state = self.lock();
        plan.seed = state.seed;
        state.wire.injector.set_plan(plan).map_err(plan_error)
    }

    /// Cuts the link between devices `a` and `b` in both directions, from now until
    /// [`SimProvider::repair`] or [`SimProvider::heal`]: every datagram between them is lost.
    pub fn partition(&self, a: NodeId, b: NodeId) {
        self.lock().wire.injector.partition(a, b);
    }

    /// Cuts only the `from → to` direction (see [`SimProvider::partition`]).
    pub fn partition_oneway(&self, from: NodeId, to: NodeId) {
        self.lock().wire.injector.partition_oneway(from, to);
    }

    /// Undoes run-time partitions between `a` and `b` (both directions).
    pub fn repair(&self, a: NodeId, b: NodeId) {
        self.lock().wire.injector.repair(a, b);
    }

    /// Restores a healthy network: removes run-time partitions, retires the plan's partition
    /// and hold rules, and delivers every held datagram (after the link latency). Loss, delay
    /// and other rules keep running; use [`SimProvider::set_faults`] with an empty plan to
    /// stop them too.
    pub fn heal(&self) {
        let mut state = self.lock();
        state.wire.injector.heal();
        state.wire.release_all_held();
        state.pump(Goal::Settle);
    }

    /// Ends every hold: hold rules stop selecting datagrams and every held datagram is
    /// delivered (after the link latency).
    pub fn release_held(&self) {
        let mut state = self.lock();
        state.wire.injector.release();
        state.wire.release_all_held();
        state.pump(Goal::Settle);
    }

    /// Datagrams in flight or held right now.
    pub fn pending_datagrams(&self) -> usize {
        self.lock().wire.pending()
    }

    /// Per-link (`src → dst` device) counts of the fault verdicts given so far: passed,
    /// dropped, duplicated, delayed, corrupted, truncated, held, partitioned.
    pub fn fault_counters(&self) -> Counters {
        self.lock().wire.counters().clone()
    }

    /// A 64-bit hash over every datagram delivered so far: delivery time, source and
    /// destination device, and bytes. Stable across runs and platforms: with the same seed,
    /// fault plan and single-threaded sequence of calls two runs give the same hash.
    pub fn trace_hash(&self) -> u64 {
        self.lock().wire.trace_hash()
    }

    /// Number of datagrams delivered so far.
    pub fn delivered_datagrams(&self) -> u64 {
        self.lock().wire.delivered()
    }

    /// Every datagram delivered since the last call, oldest first; empty unless the provider
    /// was built with [`SimBuilder::record_trace`].
    pub fn take_trace(&self) -> Vec<TraceRecord> {
        self.lock().wire.take_record()
    }

    /// Stops the capture of [`SimBuilder::capture`], flushing and closing the file. Idempotent;
    /// `Ok` without a capture.
    ///
    /// Errors: `Io` with the first error met while writing or closing the file (capturing
    /// stops at the first error).
    pub fn finish_capture(&self) -> Result<()> {
        self.lock()
            .wire
            .finish_capture()
            .map_err(|e| Error::new(ErrorKind::Io, format!("capture: {e}")))
    }

    /// Lets time pass: in virtual time, fires every timer and delivers every datagram due
    /// within `d` from now, then sets the clock to now + `d` (later if a delivery was
    /// processed beyond it). In real time, keeps the fabric running for `d` of wall time.
    pub fn advance(&self, d: Duration) {
        let mut state = self.lock();
        if !state.wire.is_real_time() {
            let until = state.wire.now + d;
            while state.pump(Goal::Until(until)).exhausted {}
            return;
        }
        drop(state);
        let deadline = std::time::Instant::now() + d;
        loop {
            let next = {
                let mut state = self.lock();
                state.pump(Goal::Settle);
                state.next_event_in()
            };
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return;
            }
            std::thread::sleep(next.unwrap_or(left).clamp(Duration::from_micros(10), left));
        }
    }

    /// Runs the fabric until nothing is pending: every datagram delivered, every timer fired
    /// (retries run to the end), in virtual time as fast as possible, in real time as the clock
    /// allows. Held datagrams without a release time stay held.
    ///
    /// Errors: `InvalidState` if the fabric is still busy after 100 000 timer deadlines
    /// (virtual time) or 60 s (real time), e.g. a QP retrying RNR NAKs forever.
    pub fn run_until_idle(&self) -> Result<()> {
        let start = std::time::Instant::now();
        for _ in 0..WAIT_STEPS {
            let (next, real) = {
                let mut state = self.lock();
                state.pump(Goal::NextTimer);
                (state.next_event_in(), state.wire.is_real_time())
            };
            let Some(next) = next else {
                return Ok(());
            };
            if real {
                if start.elapsed() > REAL_TIME_WAIT {
                    break;
                }
                std::thread::sleep(next.clamp(Duration::from_micros(10), WAIT_SLICE));
            }
        }
        Err(Error::state("the fabric did not become idle"))
    }
}

/// Most timer deadlines one waiting helper lets pass in virtual time.
const WAIT_STEPS: usize = 100_000;
/// Longest a waiting helper waits in real time.
const REAL_TIME_WAIT: Duration = Duration::from_secs(60);
/// Longest single sleep of a waiting call before it runs the fabric again.
const WAIT_SLICE: Duration = Duration::from_millis(1);

impl Provider for SimProvider {
    type Device = SimDevice;

    fn name(&self) -> &'static str {
        "emu"
    }

    fn devices(&self) -> Result<Vec<SimDevice>> {
        let state = lock(&self.fabric);
        Ok(state
            .nodes
            .iter()
            .enumerate()
            .map(|(node, n)| SimDevice {
                fabric: self.fabric.clone(),
                node,
                name: n.hca.config().name.clone(),
                guid: n.hca.config().node_guid,
            })
            .collect())
    }
}

fn lock(fabric: &Mutex<FabricState>) -> MutexGuard<'_, FabricState> {
    fabric
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One emulated device.
#[derive(Clone, Debug)]
pub struct SimDevice {
    fabric: Arc<Mutex<FabricState>>,
    node: usize,
    name: String,
    guid: u64,
}

impl Device for SimDevice {
    type Context = SimContext;

    fn name(&self) -> String {
        self.name.clone()
    }

    fn node_guid(&self) -> u64 {
        self.guid
    }

    fn open(&self) -> Result<SimContext> {
        let id = {
            let mut state = lock(&self.fabric);
            state.node_mut(self.node)?.events.open()
        };
        Ok(SimContext {
            dev: Arc::new(DeviceShared {
                fabric: self.fabric.clone(),
                node: self.node,
                name: self.name.clone(),
                id,
            }),
        })
    }
}

#[derive(Debug)]
struct DeviceShared {
    fabric: Arc<Mutex<FabricState>>,
    node: usize,
    name: String,
    /// This context's number in the node's [`EventRouter`].
    id: u64,
}

impl Drop for DeviceShared {
    fn drop(&mut self) {
        let mut state = lock(&self.fabric);
        if let Ok(node) = state.node_mut(self.node) {
            node.events.close(self.id);
        }
    }
}

/// An open emulated device.
#[derive(Clone, Debug)]
pub struct SimContext {
    dev: Arc<DeviceShared>,
}

impl SimContext {
    /// The provider this device belongs to (for fault control, counters and the trace).
    pub fn provider(&self) -> SimProvider {
        SimProvider {
            fabric: self.dev.fabric.clone(),
        }
    }

    /// This device's number in fault plans and counters (its index in `devices()`).
    pub fn node(&self) -> NodeId {
        node_id(self.dev.node)
    }

    /// Counters of `qp` (retransmits, NAKs, duplicates, …), named after rxe's hw counters.
    ///
    /// Errors: `InvalidArgument` if `qp` belongs to another device; `Destroyed` after
    /// `destroy`.
    pub fn qp_stats(&self, qp: &SimQp) -> Result<Stats> {
        self.same_device(&qp.0.ctx, "QP")?;
        qp.stats()
    }

    /// Counters of the whole device: packets no QP accepted (bad ICRC, unknown QP, …) plus the
    /// sum over its live and destroyed QPs.
    ///
    /// Errors: `NotFound` if the device vanished (never for a live provider).
    pub fn device_stats(&self) -> Result<Stats> {
        let mut state = self.lock();
        Ok(state.node_mut(self.dev.node)?.hca.stats())
    }

    /// True if both handles belong to the same provider.
    pub(crate) fn same_fabric(&self, other: &SimContext) -> bool {
        Arc::ptr_eq(&self.dev.fabric, &other.dev.fabric)
    }

    fn lock(&self) -> MutexGuard<'_, FabricState> {
        lock(&self.dev.fabric)
    }

    /// Runs `f` on this device's node with the fabric locked, then runs the fabric (packets,
    /// virtual time up to the next timer) and delivers channel notifications and async events
    /// of every node.
    fn with_node<R>(&self, f: impl FnOnce(&mut Node, Instant) -> R) -> Result<R> {
        let mut state = self.lock();
        state.wire.tick();
        let now = state.wire.now;
        let r = f(state.node_mut(self.dev.node)?, now);
        state.pump(Goal::Settle);
        Ok(r)
    }

    /// Takes something the application waits for with `take`: first what is there (in real
    /// time after running the fabric), then, in virtual time, after letting the fabric reach
    /// its next timer deadline.
    fn wait_take<R>(
        &self,
        mut take: impl FnMut(&mut FabricState) -> Result<Option<R>>,
    ) -> Result<Option<R>> {
        let mut state = self.lock();
        if state.wire.is_real_time() {
            state.pump(Goal::Settle);
            return take(&mut state);
        }
        if let Some(r) = take(&mut state)? {
            return Ok(Some(r));
        }
        state.pump(Goal::NextTimer);
        take(&mut state)
    }

    /// Like `with_node` for a live handle: fails with `Destroyed` if `alive` was cleared.
    fn with_live<R>(
        &self,
        alive: &AtomicBool,
        what: &str,
        f: impl FnOnce(&mut Node, Instant) -> Result<R>,
    ) -> Result<R> {
        self.with_node(|node, now| {
            if !alive.load(Ordering::Acquire) {
                return Err(Error::destroyed(what));
            }
            f(node, now)
        })?
    }

    fn same_device(&self, other: &SimContext, what: &str) -> Result<()> {
        if Arc::ptr_eq(&self.dev, &other.dev) {
            Ok(())
        } else {
            Err(Error::invalid(format!("{what} belongs to another context")))
        }
    }

    /// Registers `region`. Caller memory keeps its own address as the MR's virtual address;
    /// emulator-owned memory (`owned`) gets the device's next synthetic address, page aligned,
    /// so that addresses (which RETHs and AtomicETHs carry) are the same in every run.
    fn register(
        &self,
        pd: &SimPd,
        region: Region,
        access: AccessFlags,
        owned: bool,
    ) -> Result<SimMr> {
        self.same_device(&pd.0.ctx, "PD")?;
        let region = Arc::new(region);
        let len = region.len() as u64;
        let info = self.with_live(&pd.0.alive, "PD", |node, _| {
            let (iova, next) = if owned {
                let iova = node.next_iova;
                // One guard page between regions.
                let next = len
                    .checked_next_multiple_of(PAGE)
                    .and_then(|l| iova.checked_add(l + PAGE))
                    .ok_or_else(|| Error::no_memory("MR address space exhausted"))?;
                (iova, next)
            } else {
                (region.addr(), node.next_iova)
            };
            let info = node.hca.reg_mr(pd.0.id, iova, len, access)?;
            node.next_iova = next;
            node.mem.insert(info.lkey, region.clone());
            Ok(info)
        })?;
        Ok(SimMr(Arc::new(MrInner {
            ctx: self.clone(),
            info,
            region,
            alive: AtomicBool::new(true),
            _pd: pd.clone(),
        })))
    }
}

impl Context for SimContext {
    type Pd = SimPd;
    type Mr = SimMr;
    type Cq = SimCq;
    type Channel = SimChannel;
    type Srq = SimSrq;
    type Qp = SimQp;

    fn device_name(&self) -> String {
        self.dev.name.clone()
    }

    fn query_device(&self) -> Result<DeviceAttr> {
        self.with_node(|node, _| node.hca.device_attr())
    }

    fn query_port(&self, port_num: u8) -> Result<PortAttr> {
        self.with_node(|node, _| node.hca.port_attr(port_num))?
    }

    fn query_gid(&self, port_num: u8, index: u32) -> Result<Gid> {
        self.with_node(|node, _| node.hca.gid(port_num, index))?
    }

    fn query_pkey(&self, port_num: u8, index: u16) -> Result<u16> {
        self.with_node(|node, _| node.hca.pkey(port_num, index))?
    }

    fn alloc_pd(&self) -> Result<SimPd> {
        let id = self.with_node(|node, _| node.hca.alloc_pd())??;
        Ok(SimPd(Arc::new(PdInner {
            ctx: self.clone(),
            id,
            alive: AtomicBool::new(true),
        })))
    }

    fn alloc_mr(&self, pd: &SimPd, len: usize, access: AccessFlags) -> Result<SimMr> {
        if len == 0 {
            return Err(Error::invalid("MR length is zero"));
        }
        let max = self.query_device()?.max_mr_size;
        if len as u64 > max {
            return Err(Error::invalid("MR length above max_mr_size"));
        }
        self.register(pd, Region::heap(len), access, true)
    }

    fn reg_mr_file(
        &self,
        pd: &SimPd,
        path: &Path,
        len: usize,
        access: AccessFlags,
    ) -> Result<SimMr> {
        if len == 0 {
            return Err(Error::invalid("MR length is zero"));
        }
        let region = Region::file(path, len)
            .map_err(|e| Error::new(ErrorKind::Io, format!("mapping {}: {e}", path.display())))?;
        self.register(pd, region, access, true)
    }

    #[allow(unsafe_code)]
    unsafe fn reg_mr_raw(
        &self,
        pd: &SimPd,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<SimMr> {
        let ptr = NonNull::new(addr).ok_or_else(|| Error::invalid("MR address is null"))?;
        if len == 0 {
            return Err(Error::invalid("MR length is zero"));
        }
        // SAFETY: the caller promises, per `Context::reg_mr_raw`, that the range stays valid
        // for reads and writes while the MR is registered; the region lives no longer.
        let region = unsafe { Region::caller(ptr, len) };
        self.register(pd, region, access, false)
    }

    fn create_comp_channel(&self) -> Result<SimChannel> {
        let shared = Arc::new(ChannelShared::new()?);
        let id = self.with_node(|node, _| {
            let id = node.hca.create_comp_channel()?;
            node.channels.insert(id, shared.clone());
            Ok::<_, Error>(id)
        })??;
        Ok(SimChannel(Arc::new(ChannelInner {
            ctx: self.clone(),
            id,
            shared,
            alive: AtomicBool::new(true),
        })))
    }

    fn create_cq(&self, cqe: u32, channel: Option<&SimChannel>) -> Result<SimCq> {
        let ctx_id = self.dev.id;
        if let Some(ch) = channel {
            self.same_device(&ch.0.ctx, "completion channel")?;
        }
        let id = self.with_node(|node, _| {
            if let Some(ch) = channel {
                if !ch.0.alive.load(Ordering::Acquire) {
                    return Err(Error::destroyed("completion channel"));
                }
            }
            let id = node.hca.create_cq(cqe, channel.map(|c| c.0.id))?;
            node.events.own(EventElement::Cq(id.0), ctx_id);
            Ok::<_, Error>(id)
        })??;
        Ok(SimCq(Arc::new(CqInner {
            ctx: self.clone(),
            id,
            alive: AtomicBool::new(true),
            _channel: channel.cloned(),
        })))
    }

    fn create_srq(&self, pd: &SimPd, attr: &SrqAttr) -> Result<SimSrq> {
        self.same_device(&pd.0.ctx, "PD")?;
        let ctx_id = self.dev.id;
        let id = self.with_live(&pd.0.alive, "PD", |node, _| {
            let id = node.hca.create_srq(pd.0.id, attr)?;
            node.events.own(EventElement::Srq(id.0), ctx_id);
            Ok(id)
        })?;
        Ok(SimSrq(Arc::new(SrqInner {
            ctx: self.clone(),
            id,
            alive: AtomicBool::new(true),
            _pd: pd.clone(),
        })))
    }

    fn create_qp(
        &self,
        pd: &SimPd,
        send_cq: &SimCq,
        recv_cq: &SimCq,
        srq: Option<&SimSrq>,
        attr: &QpInitAttr,
    ) -> Result<SimQp> {
        let ctx_id = self.dev.id;
        self.same_device(&pd.0.ctx, "PD")?;
        self.same_device(&send_cq.0.ctx, "send CQ")?;
        self.same_device(&recv_cq.0.ctx, "receive CQ")?;
        if let Some(srq) = srq {
            self.same_device(&srq.0.ctx, "SRQ")?;
        }
        let qpn = self.with_node(|node, _| {
            let live = [
                (&pd.0.alive, "PD"),
                (&send_cq.0.alive, "send CQ"),
                (&recv_cq.0.alive, "receive CQ"),
            ];
            if let Some((_, what)) = live.iter().find(|(a, _)| !a.load(Ordering::Acquire)) {
                return Err(Error::destroyed(what));
            }
            if srq.is_some_and(|s| !s.0.alive.load(Ordering::Acquire)) {
                return Err(Error::destroyed("SRQ"));
            }
            let qpn = node.hca.create_qp(
                pd.0.id,
                send_cq.0.id,
                recv_cq.0.id,
                srq.map(|s| s.0.id),
                attr,
            )?;
            node.events.own(EventElement::Qp(qpn), ctx_id);
            Ok(qpn)
        })??;
        Ok(SimQp(Arc::new(QpInner {
            ctx: self.clone(),
            qpn,
            qp_type: attr.qp_type,
            alive: AtomicBool::new(true),
            _pd: pd.clone(),
            _send_cq: send_cq.clone(),
            _recv_cq: recv_cq.clone(),
            _srq: srq.cloned(),
        })))
    }

    fn poll_async_event(&self) -> Option<AsyncEvent> {
        let node = self.dev.node;
        let id = self.dev.id;
        self.wait_take(|state| Ok(state.node_mut(node)?.events.pop(id)))
            .ok()
            .flatten()
    }
}

/// Destroys an object on drop unless it was destroyed explicitly.
macro_rules! drop_destroys {
    ($inner:ty, |$node:ident, $this:ident| $body:expr) => {
        impl Drop for $inner {
            fn drop(&mut self) {
                let $this = &*self;
                if $this.alive.swap(false, Ordering::AcqRel) {
                    let _ = $this.ctx.with_node(|$node, _| $body);
                }
            }
        }
    };
}

// ---- PD ------------------------------------------------------------------------------------

#[derive(Debug)]
struct PdInner {
    ctx: SimContext,
    id: PdId,
    alive: AtomicBool,
}
drop_destroys!(PdInner, |node, this| node.hca.dealloc_pd(this.id));

/// An emulated protection domain.
#[derive(Clone, Debug)]
pub struct SimPd(Arc<PdInner>);

impl ProtectionDomain for SimPd {
    fn handle(&self) -> u32 {
        self.0.id.0
    }

    fn destroy(&self) -> Result<()> {
        let this = &self.0;
        this.ctx.with_live(&this.alive, "PD", |node, _| {
            node.hca.dealloc_pd(this.id)?;
            this.alive.store(false, Ordering::Release);
            Ok(())
        })
    }
}

// ---- MR ------------------------------------------------------------------------------------

#[derive(Debug)]
struct MrInner {
    ctx: SimContext,
    info: MrInfo,
    region: Arc<Region>,
    alive: AtomicBool,
    _pd: SimPd,
}
drop_destroys!(MrInner, |node, this| {
    node.mem.remove(this.info.lkey);
    node.hca.dereg_mr(this.info.lkey)
});

/// An emulated memory region. Its `addr()` is synthetic and deterministic for MRs the emulator
/// allocates and the caller's address for `reg_mr_raw` (crate doc, "Reproducibility").
#[derive(Clone, Debug)]
pub struct SimMr(Arc<MrInner>);

impl SimMr {
    fn check_alive(&self) -> Result<()> {
        if self.0.alive.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(Error::destroyed("MR"))
        }
    }
}

impl MemoryRegion for SimMr {
    fn lkey(&self) -> u32 {
        self.0.info.lkey
    }

    fn rkey(&self) -> u32 {
        self.0.info.rkey
    }

    fn addr(&self) -> u64 {
        self.0.info.iova
    }

    fn len(&self) -> usize {
        self.0.region.len()
    }

    fn access(&self) -> AccessFlags {
        self.0.info.access
    }

    fn read(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        self.check_alive()?;
        self.0.region.read(offset, buf).map_err(|_| {
            Error::invalid(format!(
                "read {offset}+{} outside MR of {} bytes",
                buf.len(),
                self.len()
            ))
        })
    }

    fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check_alive()?;
        self.0.region.write(offset, data).map_err(|_| {
            Error::invalid(format!(
                "write {offset}+{} outside MR of {} bytes",
                data.len(),
                self.len()
            ))
        })
    }

    fn destroy(&self) -> Result<()> {
        let this = &self.0;
        this.ctx.with_live(&this.alive, "MR", |node, _| {
            node.hca.dereg_mr(this.info.lkey)?;
            node.mem.remove(this.info.lkey);
            this.alive.store(false, Ordering::Release);
            Ok(())
        })
    }
}

// ---- completion channel --------------------------------------------------------------------

#[derive(Debug)]
struct ChannelInner {
    ctx: SimContext,
    id: ChannelId,
    shared: Arc<ChannelShared>,
    alive: AtomicBool,
}
drop_destroys!(ChannelInner, |node, this| {
    node.channels.remove(&this.id);
    node.hca.destroy_comp_channel(this.id)
});

/// An emulated completion channel; its fd is a socket that is readable while events wait.
///
/// The fd only becomes readable when a call into the provider (on any thread) produces the
/// completion: there is no background thread. `get_cq_event` and `wait_cq_event` run the fabric
/// themselves.
#[derive(Clone, Debug)]
pub struct SimChannel(Arc<ChannelInner>);

impl SimChannel {
    fn check_alive(&self) -> Result<()> {
        if self.0.alive.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(Error::destroyed("completion channel"))
        }
    }
}

impl CompletionChannel for SimChannel {
    fn get_cq_event(&self) -> Result<Option<u32>> {
        self.check_alive()?;
        if let Some(cq) = self.0.shared.try_get() {
            return Ok(Some(cq));
        }
        let shared = &self.0.shared;
        self.0.ctx.wait_take(|_| Ok(shared.try_get()))
    }

    /// Waits for the next event, running the fabric meanwhile: in virtual time it lets timer
    /// deadlines pass one by one and, once nothing is pending, sleeps in short slices (another
    /// thread may post work); in real time it runs the fabric in short slices until the next
    /// event is due. `timeout` is wall time.
    fn wait_cq_event(&self, timeout: Option<Duration>) -> Result<Option<u32>> {
        self.check_alive()?;
        let this = &self.0;
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            if let Some(cq) = this.shared.try_get() {
                return Ok(Some(cq));
            }
            let (fired, next) = {
                let mut state = this.ctx.lock();
                let goal = if state.wire.is_real_time() {
                    Goal::Settle
                } else {
                    Goal::NextTimer
                };
                let pumped = state.pump(goal);
                (pumped.fired || pumped.exhausted, state.next_event_in())
            };
            if let Some(cq) = this.shared.try_get() {
                return Ok(Some(cq));
            }
            let left = match deadline {
                Some(d) => d.saturating_duration_since(std::time::Instant::now()),
                None => WAIT_SLICE,
            };
            if left.is_zero() {
                return Ok(None);
            }
            if fired {
                continue;
            }
            let slice = next.unwrap_or(WAIT_SLICE).min(WAIT_SLICE).min(left);
            if let Some(cq) = this.shared.wait(Some(slice)) {
                return Ok(Some(cq));
            }
        }
    }

    fn destroy(&self) -> Result<()> {
        let this = &self.0;
        this.ctx
            .with_live(&this.alive, "completion channel", |node, _| {
                node.hca.destroy_comp_channel(this.id)?;
                node.channels.remove(&this.id);
                this.alive.store(false, Ordering::Release);
                Ok(())
            })
    }
}

impl AsFd for SimChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.shared.as_fd()
    }
}

impl AsRawFd for SimChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.0.shared.as_raw_fd()
    }
}

// ---- CQ ------------------------------------------------------------------------------------

#[derive(Debug)]
struct CqInner {
    ctx: SimContext,
    id: CqId,
    alive: AtomicBool,
    _channel: Option<SimChannel>,
}
drop_destroys!(CqInner, |node, this| {
    let _ = node.hca.ack_cq_events(this.id, u32::MAX);
    node.hca.destroy_cq(this.id)
});

/// An emulated completion queue.
#[derive(Clone, Debug)]
pub struct SimCq(Arc<CqInner>);

impl SimCq {
    /// Polls until one completion arrives and returns it: the usual loop of a unit test. In
    /// virtual time each empty poll lets the fabric reach its next timer deadline, so
    /// retransmissions and retry exhaustion take microseconds of wall time.
    ///
    /// Errors: `InvalidState` if the CQ is empty and the fabric is idle (nothing in flight, no
    /// timer armed: no completion can arrive unless another thread posts work), or if nothing
    /// arrived after 100 000 timer deadlines (virtual time) or 60 s (real time), e.g. a QP
    /// retrying RNR NAKs forever; the errors of [`CompletionQueue::poll`].
    pub fn next_completion(&self) -> Result<WorkCompletion> {
        let mut wc = [WorkCompletion::default(); 1];
        let start = std::time::Instant::now();
        for _ in 0..WAIT_STEPS {
            if self.poll(&mut wc)? == 1 {
                return Ok(wc[0]);
            }
            let (next, real) = {
                let mut state = self.0.ctx.lock();
                (state.next_event_in(), state.wire.is_real_time())
            };
            let Some(next) = next else {
                // Another thread's pump may have delivered this CQ's completion between the
                // poll above and the idle check; the fabric being idle now, one more poll
                // settles it.
                if self.poll(&mut wc)? == 1 {
                    return Ok(wc[0]);
                }
                return Err(Error::state(
                    "CQ is empty and the fabric is idle: no completion can arrive",
                ));
            };
            if real {
                if start.elapsed() > REAL_TIME_WAIT {
                    break;
                }
                std::thread::sleep(next.clamp(Duration::from_micros(1), WAIT_SLICE));
            }
        }
        Err(Error::state("no completion arrived"))
    }
}

impl CompletionQueue for SimCq {
    fn handle(&self) -> u32 {
        self.0.id.0
    }

    fn capacity(&self) -> u32 {
        let this = &self.0;
        this.ctx
            .with_live(&this.alive, "CQ", |node, _| {
                Ok(node.hca.cq_capacity(this.id).unwrap_or(0))
            })
            .unwrap_or(0)
    }

    /// Polls; when the CQ is empty, runs the fabric first (virtual time: up to and including
    /// the next timer deadline; real time: what is due) and polls again.
    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        let this = &self.0;
        let node = this.ctx.dev.node;
        let n = this.ctx.wait_take(|state| {
            if !this.alive.load(Ordering::Acquire) {
                return Err(Error::destroyed("CQ"));
            }
            match state.node_mut(node)?.hca.poll_cq(this.id, out)? {
                0 if !out.is_empty() => Ok(None),
                n => Ok(Some(n)),
            }
        })?;
        Ok(n.unwrap_or(0))
    }

    fn req_notify(&self, solicited_only: bool) -> Result<()> {
        let this = &self.0;
        this.ctx.with_live(&this.alive, "CQ", |node, _| {
            node.hca.req_notify_cq(this.id, solicited_only)
        })
    }

    fn ack_events(&self, n: u32) {
        let this = &self.0;
        let _ = this.ctx.with_live(&this.alive, "CQ", |node, _| {
            node.hca.ack_cq_events(this.id, n)
        });
    }

    fn resize(&self, cqe: u32) -> Result<()> {
        let this = &self.0;
        this.ctx.with_live(&this.alive, "CQ", |node, _| {
            node.hca.resize_cq(this.id, cqe)
        })
    }

    fn destroy(&self) -> Result<()> {
        let this = &self.0;
        this.ctx.with_live(&this.alive, "CQ", |node, _| {
            node.hca.destroy_cq(this.id)?;
            this.alive.store(false, Ordering::Release);
            Ok(())
        })
    }
}

// ---- SRQ -----------------------------------------------------------------------------------

#[derive(Debug)]
struct SrqInner {
    ctx: SimContext,
    id: SrqId,
    alive: AtomicBool,
    _pd: SimPd,
}
drop_destroys!(SrqInner, |node, this| node.hca.destroy_srq(this.id));

/// An emulated shared receive queue.
#[derive(Clone, Debug)]
pub struct SimSrq(Arc<SrqInner>);

impl SharedReceiveQueue for SimSrq {
    fn handle(&self) -> u32 {
        self.0.id.0
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        let this = &self.0;
        let r = this.ctx.with_node(|node, _| {
            if !this.alive.load(Ordering::Acquire) {
                return Err(PostError::new(0, Error::destroyed("SRQ")));
            }
            node.hca.post_srq_recv(this.id, wrs)
        });
        r.map_err(|e| PostError::new(0, e))?
    }

    fn query(&self) -> Result<SrqAttr> {
        let this = &self.0;
        this.ctx
            .with_live(&this.alive, "SRQ", |node, _| node.hca.query_srq(this.id))
    }

    fn arm_limit(&self, srq_limit: u32) -> Result<()> {
        let this = &self.0;
        this.ctx.with_live(&this.alive, "SRQ", |node, _| {
            node.hca.arm_srq_limit(this.id, srq_limit)
        })
    }

    fn destroy(&self) -> Result<()> {
        let this = &self.0;
        this.ctx.with_live(&this.alive, "SRQ", |node, _| {
            node.hca.destroy_srq(this.id)?;
            this.alive.store(false, Ordering::Release);
            Ok(())
        })
    }
}

// ---- QP ------------------------------------------------------------------------------------

#[derive(Debug)]
struct QpInner {
    ctx: SimContext,
    qpn: u32,
    qp_type: QpType,
    alive: AtomicBool,
    _pd: SimPd,
    _send_cq: SimCq,
    _recv_cq: SimCq,
    _srq: Option<SimSrq>,
}
drop_destroys!(QpInner, |node, this| node.hca.destroy_qp(this.qpn));

/// An emulated queue pair.
#[derive(Clone, Debug)]
pub struct SimQp(Arc<QpInner>);

impl SimQp {
    /// Counters of this QP (retransmits, NAKs, duplicates, …); see [`SimContext::qp_stats`].
    ///
    /// Errors: `Destroyed` after `destroy`.
    pub fn stats(&self) -> Result<Stats> {
        let this = &self.0;
        let mut state = this.ctx.lock();
        if !this.alive.load(Ordering::Acquire) {
            return Err(Error::destroyed("QP"));
        }
        state.node_mut(this.ctx.dev.node)?.hca.qp_stats(this.qpn)
    }

    fn post<R>(
        &self,
        f: impl FnOnce(&mut Hca, Instant) -> Result<R, PostError>,
    ) -> Result<R, PostError> {
        let this = &self.0;
        let r = this.ctx.with_node(|node, now| {
            if !this.alive.load(Ordering::Acquire) {
                return Err(PostError::new(0, Error::destroyed("QP")));
            }
            f(&mut node.hca, now)
        });
        r.map_err(|e| PostError::new(0, e))?
    }
}

impl QueuePair for SimQp {
    fn qp_num(&self) -> u32 {
        self.0.qpn
    }

    fn qp_type(&self) -> QpType {
        self.0.qp_type
    }

    fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        let this = &self.0;
        this.ctx.with_live(&this.alive, "QP", |node, now| {
            node.hca.modify_qp(now, this.qpn, attr, mask)
        })
    }

    fn query(&self) -> Result<QpAttr> {
        let this = &self.0;
        this.ctx
            .with_live(&this.alive, "QP", |node, _| node.hca.query_qp(this.qpn))
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        let qpn = self.0.qpn;
        self.post(|hca, now| hca.post_send(now, qpn, wrs))
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        let qpn = self.0.qpn;
        self.post(|hca, _| hca.post_recv(qpn, wrs))
    }

    fn endpoint(&self, psn: u32) -> Result<Endpoint> {
        if psn > verbs_api::MAX_24BIT {
            return Err(Error::invalid("PSN is not a 24-bit number"));
        }
        let this = &self.0;
        this.ctx.with_live(&this.alive, "QP", |node, _| {
            let config = node.hca.config();
            Ok(Endpoint {
                qpn: this.qpn,
                psn,
                gid: config.gid,
                udp_port: config.udp_port,
            })
        })
    }

    fn destroy(&self) -> Result<()> {
        let this = &self.0;
        this.ctx.with_live(&this.alive, "QP", |node, _| {
            node.hca.destroy_qp(this.qpn)?;
            this.alive.store(false, Ordering::Release);
            Ok(())
        })
    }
}
