//! The in-process provider: `verbs_api` implemented over [`emu_proto::Hca`] instances that
//! share one fabric; the verbs handles themselves are [`emu_device`]'s, over the port
//! [`SimDevice`].
//!
//! Every verbs call locks the fabric briefly, applies the command to the device's HCA and then
//! runs the fabric (see `fabric`) and delivers what the HCAs produced (completion-channel
//! notifications, async events); a `post_send` that follows a post on its device leaves that
//! to the next call (a burst, see the crate doc). Calls that find nothing while the
//! application waits (an empty CQ poll, an empty completion channel or async event queue) also
//! let virtual time reach the next timer deadline.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use emu_capture::PcapSink;
use emu_device::{
    ChannelShared, Context, DeviceMemory, DeviceState, Idle, MrAddresses, Port, Waiting,
};
use emu_fault::{Counters, FaultPlan, Injector, NodeId, PlanError};
use emu_proto::{Hca, HcaConfig, Instant, Stats};
use verbs_api::{Device, Error, ErrorKind, Gid, Provider, Result};

use crate::fabric::{
    Goal, PumpNode, Pumped, TraceRecord, Wire, WireConfig, next_event, node_id, pump,
};
use crate::pair::SimPair;
use crate::seed::env_seed;

/// An open emulated device of the in-process provider.
pub type SimContext = Context<SimDevice>;
/// An emulated protection domain.
pub type SimPd = emu_device::Pd<SimDevice>;
/// An emulated memory region. Its `addr()` is synthetic and deterministic for MRs the emulator
/// allocates and the caller's address for `reg_mr_raw` (crate doc, "Reproducibility").
pub type SimMr = emu_device::Mr<SimDevice>;
/// An emulated completion channel; its fd is a socket that is readable while events wait.
///
/// The fd only becomes readable when a call into the provider (on any thread) produces the
/// completion: there is no background thread. `get_cq_event` and `wait_cq_event` run the
/// fabric themselves.
pub type SimChannel = emu_device::Channel<SimDevice>;
/// An emulated completion queue; [`emu_device::Cq::next_completion`] polls until one arrives,
/// letting virtual time pass.
pub type SimCq = emu_device::Cq<SimDevice>;
/// An emulated shared receive queue.
pub type SimSrq = emu_device::Srq<SimDevice>;
/// An emulated queue pair.
pub type SimQp = emu_device::Qp<SimDevice>;
/// A memory window of an emulated device.
pub type SimMw = emu_device::Mw<SimDevice>;

impl PumpNode for DeviceState {
    fn parts(&mut self) -> (&mut Hca, &DeviceMemory) {
        (&mut self.hca, &self.mem)
    }
}

/// The shared state of all devices of one provider.
#[derive(Debug)]
struct FabricState {
    devices: Vec<DeviceState>,
    wire: Wire,
    seed: u64,
    /// The last pump ran out of budget: work is left even if no event is pending.
    unsettled: bool,
    /// Per device: the last call on it was a `post_send` (see `Port::post_send`).
    posting: Vec<bool>,
    /// A post of a burst left its packets for the next call that runs the fabric.
    deferred: bool,
}

impl FabricState {
    /// Runs the fabric toward `goal` and hands notifications and events to the application.
    fn pump(&mut self, goal: Goal) -> Pumped {
        let FabricState { devices, wire, .. } = self;
        let pumped = pump(wire, devices, goal);
        for device in devices.iter_mut() {
            device.deliver();
        }
        self.unsettled = pumped.exhausted;
        self.deferred = false;
        pumped
    }

    /// Runs the fabric if a burst's posts left packets in it (see `Port::post_send`).
    fn move_burst(&mut self) {
        if self.deferred {
            self.pump(Goal::Settle);
        }
    }

    /// Notes the kind of the call on device `index` that runs now; true if it is a post that
    /// directly follows a post on that device (a burst).
    fn note_call(&mut self, index: usize, post: bool) -> bool {
        self.posting
            .get_mut(index)
            .is_some_and(|p| std::mem::replace(p, post) && post)
    }

    /// Time from now until the next pending event; `None` if nothing is pending.
    fn next_event_in(&mut self) -> Option<Duration> {
        if self.unsettled || self.deferred {
            return Some(Duration::ZERO);
        }
        let FabricState { devices, wire, .. } = self;
        wire.tick();
        next_event(wire, devices).map(|at| at - wire.now)
    }

    fn device_mut(&mut self, index: usize) -> Result<&mut DeviceState> {
        self.devices
            .get_mut(index)
            .ok_or_else(|| Error::new(ErrorKind::NotFound, "device vanished"))
    }
}

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
        let devices: Vec<DeviceState> = (0..self.devices)
            .map(|i| {
                let octet = u8::try_from(i + 1).unwrap_or(u8::MAX);
                let gid = Gid::from_ip(IpAddr::V4(Ipv4Addr::new(127, 0, 0, octet)));
                let seed = seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                let config = HcaConfig::new(format!("softverbs{i}"), gid, seed);
                DeviceState::new(Hca::new(config), MrAddresses::Synthetic)
            })
            .collect();
        let wire = Wire::new(WireConfig {
            latency: self.latency,
            real_time: self.real_time,
            addrs: devices.iter().map(DeviceState::addr).collect(),
            injector,
            capture,
            record: self.record,
        });
        Ok(SimProvider {
            fabric: Arc::new(Mutex::new(FabricState {
                devices,
                wire,
                seed,
                unsettled: false,
                posting: vec![false; self.devices],
                deferred: false,
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
        let mut devices = self.devices()?;
        let count = devices.len();
        if index >= count {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!("no device {index} (the provider has {count})"),
            ));
        }
        devices.swap_remove(index).open()
    }

    /// The fabric, a burst's deferred packets moved first (see [`settled`]).
    fn lock(&self) -> MutexGuard<'_, FabricState> {
        settled(&self.fabric)
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
            .devices
            .iter()
            .enumerate()
            .map(|(index, d)| SimDevice {
                fabric: self.fabric.clone(),
                index,
                name: d.hca.config().name.clone(),
                guid: d.hca.config().node_guid,
            })
            .collect())
    }
}

fn lock(fabric: &Mutex<FabricState>) -> MutexGuard<'_, FabricState> {
    fabric
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The fabric, with the packets a burst's posts left in it moved first: whatever observes the
/// fabric or a device without a verbs call that runs it (counters, pending datagrams, time,
/// the trace, fault control) sees every post made so far on the wire, as if each post had run
/// the fabric itself.
fn settled(fabric: &Mutex<FabricState>) -> MutexGuard<'_, FabricState> {
    let mut state = lock(fabric);
    state.move_burst();
    state
}

/// One emulated device on the in-memory fabric: the [`Port`] of the in-process backend. Its
/// methods are reachable from a [`SimContext`] too.
#[derive(Clone, Debug)]
pub struct SimDevice {
    fabric: Arc<Mutex<FabricState>>,
    index: usize,
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
        Context::open(self.clone())
    }
}

impl SimDevice {
    /// The provider this device belongs to (for fault control, counters and the trace).
    pub fn provider(&self) -> SimProvider {
        SimProvider {
            fabric: self.fabric.clone(),
        }
    }

    /// This device's number in fault plans and counters (its index in `devices()`).
    pub fn node(&self) -> NodeId {
        node_id(self.index)
    }

    /// Counters of the whole device: packets no QP accepted (bad ICRC, unknown QP, …) plus the
    /// sum over its live and destroyed QPs.
    ///
    /// Errors: `NotFound` if the device vanished (never for a live provider).
    pub fn device_stats(&self) -> Result<Stats> {
        self.peek(|st| st.hca.stats())
    }

    /// True if both devices belong to the same provider.
    pub(crate) fn same_fabric(&self, other: &SimDevice) -> bool {
        Arc::ptr_eq(&self.fabric, &other.fabric)
    }

    fn lock(&self) -> MutexGuard<'_, FabricState> {
        lock(&self.fabric)
    }

    /// Takes something the application waits for with `take`: first what is there (in real
    /// time after running the fabric), then, in virtual time, after letting the fabric reach
    /// its next timer deadline.
    fn wait_take_in<R>(
        &self,
        state: &mut FabricState,
        mut take: impl FnMut(&mut DeviceState) -> Result<Option<R>>,
    ) -> Result<Option<R>> {
        if state.wire.is_real_time() {
            state.pump(Goal::Settle);
            return take(state.device_mut(self.index)?);
        }
        // A burst's packets first: what they complete needs no timer to fire.
        state.move_burst();
        if let Some(r) = take(state.device_mut(self.index)?)? {
            return Ok(Some(r));
        }
        state.pump(Goal::NextTimer);
        take(state.device_mut(self.index)?)
    }
}

impl Port for SimDevice {
    fn device_name(&self) -> String {
        self.name.clone()
    }

    /// Runs `f` on this device with the fabric locked, then runs the fabric (packets, virtual
    /// time up to the next timer) and delivers channel notifications and async events of
    /// every device.
    fn command<R>(&self, f: impl FnOnce(&mut DeviceState, Instant) -> R) -> Result<R> {
        let mut state = self.lock();
        state.note_call(self.index, false);
        state.wire.tick();
        let now = state.wire.now;
        let r = f(state.device_mut(self.index)?, now);
        state.pump(Goal::Settle);
        Ok(r)
    }

    /// As [`command`](Self::command), except that a post that directly follows another post
    /// on the device (a burst: no poll, read or other call on it between them) leaves its
    /// packets to the next call that runs the fabric, as a doorbell batch does on a NIC:
    /// the burst crosses the fabric together and the responder ACKs it as one.
    fn post_send<R>(&self, f: impl FnOnce(&mut DeviceState, Instant) -> R) -> Result<R> {
        let mut state = self.lock();
        let burst = state.note_call(self.index, true);
        state.wire.tick();
        let now = state.wire.now;
        let device = state.device_mut(self.index)?;
        let r = f(device, now);
        if burst {
            device.deliver();
            state.deferred = true;
        } else {
            state.pump(Goal::Settle);
        }
        Ok(r)
    }

    /// As [`command`](Self::command): every call runs the fabric.
    fn query<R>(&self, f: impl FnOnce(&mut DeviceState) -> R) -> Result<R> {
        self.command(|st, _| f(st))
    }

    fn peek<R>(&self, f: impl FnOnce(&mut DeviceState) -> R) -> Result<R> {
        Ok(f(settled(&self.fabric).device_mut(self.index)?))
    }

    fn wait_take<R>(
        &self,
        _what: Waiting,
        take: impl FnMut(&mut DeviceState) -> Result<Option<R>>,
    ) -> Result<Option<R>> {
        let mut state = self.lock();
        state.note_call(self.index, false);
        self.wait_take_in(&mut state, take)
    }

    /// Runs the fabric if a burst's posts left packets in it, so that an application
    /// spinning on an MR byte sees the traffic of the posts it made.
    fn reading_memory(&self) {
        settled(&self.fabric).note_call(self.index, false);
    }

    /// Waits for the next event, running the fabric meanwhile: in virtual time it lets timer
    /// deadlines pass one by one and, once nothing is pending, sleeps in short slices (another
    /// thread may post work); in real time it runs the fabric in short slices until the next
    /// event is due. `timeout` is wall time.
    fn wait_channel(
        &self,
        channel: &ChannelShared,
        timeout: Option<Duration>,
    ) -> Result<Option<u32>> {
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            if let Some(cq) = channel.try_get() {
                return Ok(Some(cq));
            }
            let (fired, next) = {
                let mut state = self.lock();
                state.note_call(self.index, false);
                // A burst's packets first: what they complete needs no timer to fire.
                let deferred = state.deferred;
                let goal = if state.wire.is_real_time() || deferred {
                    Goal::Settle
                } else {
                    Goal::NextTimer
                };
                let pumped = state.pump(goal);
                (
                    pumped.fired || pumped.exhausted || deferred,
                    state.next_event_in(),
                )
            };
            if let Some(cq) = channel.try_get() {
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
            if let Some(cq) = channel.wait(Some(slice)) {
                return Ok(Some(cq));
            }
        }
    }

    /// Idle once nothing is pending; in real time sleeps until the next event (at most
    /// 1 ms) and gives up after 60 s.
    fn between_polls(&self, start: std::time::Instant) -> Result<Idle> {
        let (next, real) = {
            let mut state = self.lock();
            (state.next_event_in(), state.wire.is_real_time())
        };
        let Some(next) = next else {
            return Ok(Idle::Idle);
        };
        if real {
            if start.elapsed() > REAL_TIME_WAIT {
                return Ok(Idle::TimedOut);
            }
            std::thread::sleep(next.clamp(Duration::from_micros(1), WAIT_SLICE));
        }
        Ok(Idle::Again)
    }
}
