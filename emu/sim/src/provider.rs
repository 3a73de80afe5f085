//! The in-process provider: `verbs_api` implemented over [`emu_proto::Hca`] instances that
//! share one fabric.
//!
//! Every verbs call locks the fabric briefly, applies the command to the device's HCA and then
//! delivers what the HCA produced (completion-channel notifications, async events). Handles
//! keep their parents alive (a QP holds its PD, CQs and SRQ); an explicitly destroyed handle
//! fails every later call with `ErrorKind::Destroyed`.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use emu_proto::{ChannelId, CqId, Hca, HcaConfig, Instant, MrInfo, PdId, SrqId};
use verbs_api::{
    AccessFlags, AsyncEvent, CompletionChannel, CompletionQueue, Context, Device, DeviceAttr,
    Endpoint, Error, ErrorKind, Gid, MemoryRegion, PortAttr, PostError, ProtectionDomain, Provider,
    QpAttr, QpAttrMask, QpInitAttr, QpType, QueuePair, RecvWr, Result, SendWr, SharedReceiveQueue,
    SrqAttr, WorkCompletion,
};

use crate::channel::ChannelShared;
use crate::fabric::{NodeMemory, PumpNode, Wire, pump};
use crate::region::Region;

/// One emulated device on the fabric.
#[derive(Debug)]
struct Node {
    hca: Hca,
    mem: NodeMemory,
    addr: SocketAddr,
    channels: HashMap<ChannelId, Arc<ChannelShared>>,
    events: VecDeque<AsyncEvent>,
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
            self.events.push_back(e);
        }
    }
}

/// The shared state of all devices of one provider.
#[derive(Debug)]
struct FabricState {
    nodes: Vec<Node>,
    wire: Wire,
}

/// Builds a [`SimProvider`].
#[derive(Clone, Debug)]
pub struct SimBuilder {
    devices: usize,
    seed: u64,
    latency: Duration,
}

impl Default for SimBuilder {
    fn default() -> SimBuilder {
        SimBuilder {
            devices: 2,
            seed: 0,
            latency: Duration::from_micros(1),
        }
    }
}

impl SimBuilder {
    /// Number of emulated devices (default 2), named `softverbs0`, `softverbs1`, …, with GIDs
    /// `::ffff:127.0.0.1`, `::ffff:127.0.0.2`, ….
    pub fn devices(mut self, n: usize) -> SimBuilder {
        self.devices = n;
        self
    }

    /// Seed for every random choice of the fabric (key bytes today); default 0.
    pub fn seed(mut self, seed: u64) -> SimBuilder {
        self.seed = seed;
        self
    }

    /// One-way latency of the in-memory wire, in virtual time (default 1 µs).
    pub fn latency(mut self, latency: Duration) -> SimBuilder {
        self.latency = latency;
        self
    }

    /// Creates the provider. `InvalidArgument` for more than 254 devices (the GID scheme
    /// holds 254).
    pub fn build(self) -> Result<SimProvider> {
        if self.devices > 254 {
            return Err(Error::invalid("at most 254 emulated devices"));
        }
        let nodes = (0..self.devices)
            .map(|i| {
                let octet = u8::try_from(i + 1).unwrap_or(u8::MAX);
                let gid = Gid::from_ip(IpAddr::V4(Ipv4Addr::new(127, 0, 0, octet)));
                let seed = self.seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                let config = HcaConfig::new(format!("softverbs{i}"), gid, seed);
                Node {
                    addr: SocketAddr::new(gid.to_ip(), config.udp_port),
                    hca: Hca::new(config),
                    mem: NodeMemory::default(),
                    channels: HashMap::new(),
                    events: VecDeque::new(),
                }
            })
            .collect();
        Ok(SimProvider {
            fabric: Arc::new(Mutex::new(FabricState {
                nodes,
                wire: Wire::new(self.latency),
            })),
        })
    }
}

/// The in-process provider: a set of emulated devices connected by an in-memory fabric.
#[derive(Clone, Debug)]
pub struct SimProvider {
    fabric: Arc<Mutex<FabricState>>,
}

impl SimProvider {
    /// A builder with defaults (2 devices, seed 0).
    pub fn builder() -> SimBuilder {
        SimBuilder::default()
    }
}

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
        Ok(SimContext {
            dev: Arc::new(DeviceShared {
                fabric: self.fabric.clone(),
                node: self.node,
                name: self.name.clone(),
            }),
        })
    }
}

#[derive(Debug)]
struct DeviceShared {
    fabric: Arc<Mutex<FabricState>>,
    node: usize,
    name: String,
}

/// An open emulated device.
#[derive(Clone, Debug)]
pub struct SimContext {
    dev: Arc<DeviceShared>,
}

impl SimContext {
    /// Runs `f` on this device's node with the fabric locked, then pumps the fabric (packets,
    /// virtual time, timers) and delivers channel notifications and async events of every node.
    fn with_node<R>(&self, f: impl FnOnce(&mut Node, Instant) -> R) -> Result<R> {
        let mut state = lock(&self.dev.fabric);
        let now = state.wire.now;
        let node = state
            .nodes
            .get_mut(self.dev.node)
            .ok_or_else(|| Error::new(ErrorKind::NotFound, "device vanished"))?;
        let r = f(node, now);
        let FabricState { nodes, wire } = &mut *state;
        pump(wire, nodes);
        for node in nodes.iter_mut() {
            node.deliver();
        }
        Ok(r)
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

    fn register(&self, pd: &SimPd, region: Region, access: AccessFlags) -> Result<SimMr> {
        self.same_device(&pd.0.ctx, "PD")?;
        let region = Arc::new(region);
        let info = self.with_live(&pd.0.alive, "PD", |node, _| {
            let info = node
                .hca
                .reg_mr(pd.0.id, region.addr(), region.len() as u64, access)?;
            node.mem.regions.insert(info.lkey >> 8, region.clone());
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
        self.register(pd, Region::heap(len), access)
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
        self.register(pd, region, access)
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
        self.register(pd, region, access)
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
        if let Some(ch) = channel {
            self.same_device(&ch.0.ctx, "completion channel")?;
        }
        let id = self.with_node(|node, _| {
            if let Some(ch) = channel {
                if !ch.0.alive.load(Ordering::Acquire) {
                    return Err(Error::destroyed("completion channel"));
                }
            }
            node.hca.create_cq(cqe, channel.map(|c| c.0.id))
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
        let id = self.with_live(&pd.0.alive, "PD", |node, _| {
            node.hca.create_srq(pd.0.id, attr)
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
            node.hca.create_qp(
                pd.0.id,
                send_cq.0.id,
                recv_cq.0.id,
                srq.map(|s| s.0.id),
                attr,
            )
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
        self.with_node(|node, _| node.events.pop_front())
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
    node.mem.regions.remove(&(this.info.lkey >> 8));
    node.hca.dereg_mr(this.info.lkey)
});

/// An emulated memory region.
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
            node.mem.regions.remove(&(this.info.lkey >> 8));
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
#[derive(Clone, Debug)]
pub struct SimChannel(Arc<ChannelInner>);

impl CompletionChannel for SimChannel {
    fn get_cq_event(&self) -> Result<Option<u32>> {
        if !self.0.alive.load(Ordering::Acquire) {
            return Err(Error::destroyed("completion channel"));
        }
        Ok(self.0.shared.try_get())
    }

    fn wait_cq_event(&self, timeout: Option<Duration>) -> Result<Option<u32>> {
        if !self.0.alive.load(Ordering::Acquire) {
            return Err(Error::destroyed("completion channel"));
        }
        Ok(self.0.shared.wait(timeout))
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

    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        let this = &self.0;
        this.ctx
            .with_live(&this.alive, "CQ", |node, _| node.hca.poll_cq(this.id, out))
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
