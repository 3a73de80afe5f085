//! An open device: [`Context`], the `verbs_api::Context` of every emulator backend.

use std::ops::Deref;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use emu_proto::{Instant, Stats};
use mr_region::Region;
use verbs_api::{
    AccessFlags, AhAttr, AsyncEvent, DeviceAttr, Error, ErrorKind, EventElement, Gid, MwBind,
    MwType, PortAttr, QpCap, QpInitAttr, QpType, Result, SrqAttr,
};

use crate::channel::ChannelShared;
use crate::handles::{Ah, AhInner, Mw, MwInner, Srq, SrqInner};
use crate::handles::{Channel, ChannelInner, Cq, CqInner, Mr, MrInner, Pd, PdInner, Qp, QpInner};
use crate::port::{Port, Waiting};
use crate::state::DeviceState;

/// An open emulated device of backend port `P`. Clones share the context.
///
/// It derefs to its device `P`, so the backend's extras (fault control, socket information,
/// virtual time, …) are called on the context directly.
#[derive(Clone, Debug)]
pub struct Context<P: Port> {
    shared: Arc<ContextShared<P>>,
}

#[derive(Debug)]
struct ContextShared<P: Port> {
    port: P,
    /// This context's number in the device's event router.
    id: u64,
}

impl<P: Port> Drop for ContextShared<P> {
    fn drop(&mut self) {
        let id = self.id;
        let _ = self.port.peek(|st| st.events.close(id));
    }
}

impl<P: Port> Deref for Context<P> {
    type Target = P;

    fn deref(&self) -> &P {
        &self.shared.port
    }
}

impl<P: Port> Context<P> {
    /// Opens `device`: a new context with its own async event queue.
    ///
    /// Errors: those of [`Port::peek`] (the device is gone).
    pub fn open(device: P) -> Result<Context<P>> {
        let id = device.peek(|st| st.events.open())?;
        tracing::debug!(kind = "device.open", context = id, "device opened");
        Ok(Context {
            shared: Arc::new(ContextShared { port: device, id }),
        })
    }

    /// The device this context was opened from.
    pub fn device(&self) -> &P {
        &self.shared.port
    }

    /// Counters of `qp` (retransmits, NAKs, duplicates, …), named after rxe's hw counters.
    ///
    /// Errors: `InvalidArgument` if `qp` belongs to another context; `Destroyed` after
    /// `destroy`.
    pub fn qp_stats(&self, qp: &Qp<P>) -> Result<Stats> {
        self.same_context(qp.context(), "QP")?;
        qp.stats()
    }

    /// Like [`Port::command`] for a live handle: `Destroyed` if `alive` was cleared.
    pub(crate) fn command_live<R>(
        &self,
        alive: &AtomicBool,
        what: &str,
        f: impl FnOnce(&mut DeviceState, Instant) -> Result<R>,
    ) -> Result<R> {
        self.command(|st, now| {
            check_alive(alive, what)?;
            f(st, now)
        })?
    }

    /// Like [`Port::query`] for a live handle: `Destroyed` if `alive` was cleared.
    pub(crate) fn query_live<R>(
        &self,
        alive: &AtomicBool,
        what: &str,
        f: impl FnOnce(&mut DeviceState) -> Result<R>,
    ) -> Result<R> {
        self.query(|st| {
            check_alive(alive, what)?;
            f(st)
        })?
    }

    /// `InvalidArgument` unless `other` is this context.
    pub(crate) fn same_context(&self, other: &Context<P>, what: &str) -> Result<()> {
        if Arc::ptr_eq(&self.shared, &other.shared) {
            Ok(())
        } else {
            Err(Error::invalid(format!("{what} belongs to another context")))
        }
    }

    /// Registers `region` (see [`DeviceState::register`] for its address).
    fn register(
        &self,
        pd: &Pd<P>,
        region: Region,
        access: AccessFlags,
        owned: bool,
    ) -> Result<Mr<P>> {
        self.same_context(&pd.0.ctx, "PD")?;
        let region = Arc::new(region);
        let info = self.command_live(&pd.0.alive, "PD", |st, _| {
            st.register(pd.0.id, &region, access, owned)
        })?;
        Ok(Mr(Arc::new(MrInner {
            ctx: self.clone(),
            info,
            region,
            alive: AtomicBool::new(true),
            _pd: pd.clone(),
        })))
    }

    /// Opens the device's GSI: QP number 1, a UD QP already in RTS with Q_Key 0x8001_0000
    /// (`emu_proto::Hca::create_gsi`), which receives the datagrams peers send to QP1 (CM
    /// MADs) and sends like any UD QP. One per device: `Busy` while open, from any context;
    /// destroying or dropping the returned QP closes it. Other errors as `create_qp`.
    pub fn open_gsi(
        &self,
        pd: &Pd<P>,
        send_cq: &Cq<P>,
        recv_cq: &Cq<P>,
        cap: QpCap,
    ) -> Result<Qp<P>> {
        self.check_qp_parts(pd, send_cq, recv_cq, None)?;
        let ctx_id = self.shared.id;
        let qpn = self.command(|st, now| {
            check_alive(&pd.0.alive, "PD")?;
            check_alive(&send_cq.0.alive, "send CQ")?;
            check_alive(&recv_cq.0.alive, "receive CQ")?;
            let init = QpInitAttr::ud(cap);
            let qpn = st
                .hca
                .create_gsi(now, pd.0.id, send_cq.0.id, recv_cq.0.id, &init)?;
            st.events.own(EventElement::Qp(qpn), ctx_id);
            Ok::<_, Error>(qpn)
        })??;
        Ok(self.qp_handle(qpn, QpType::Ud, pd, send_cq, recv_cq, None))
    }

    /// The handle of new QP `qpn`, keeping its PD, CQs and SRQ alive.
    fn qp_handle(
        &self,
        qpn: u32,
        qp_type: QpType,
        pd: &Pd<P>,
        send_cq: &Cq<P>,
        recv_cq: &Cq<P>,
        srq: Option<&Srq<P>>,
    ) -> Qp<P> {
        Qp(Arc::new(QpInner {
            ctx: self.clone(),
            qpn,
            qp_type,
            alive: AtomicBool::new(true),
            _pd: pd.clone(),
            _send_cq: send_cq.clone(),
            _recv_cq: recv_cq.clone(),
            _srq: srq.cloned(),
        }))
    }

    /// Checks that the objects a new QP uses belong to this context and are alive.
    fn check_qp_parts(
        &self,
        pd: &Pd<P>,
        send_cq: &Cq<P>,
        recv_cq: &Cq<P>,
        srq: Option<&Srq<P>>,
    ) -> Result<()> {
        self.same_context(&pd.0.ctx, "PD")?;
        self.same_context(&send_cq.0.ctx, "send CQ")?;
        self.same_context(&recv_cq.0.ctx, "receive CQ")?;
        if let Some(srq) = srq {
            self.same_context(&srq.0.ctx, "SRQ")?;
        }
        Ok(())
    }
}

/// `Destroyed` naming `what` if `alive` was cleared.
pub(crate) fn check_alive(alive: &AtomicBool, what: &str) -> Result<()> {
    if alive.load(Ordering::Acquire) {
        Ok(())
    } else {
        Err(Error::destroyed(what))
    }
}

/// A new MR's length: non-zero.
fn check_len(len: usize) -> Result<()> {
    if len == 0 {
        return Err(Error::invalid("MR length is zero"));
    }
    Ok(())
}

impl<P: Port> verbs_api::Context for Context<P> {
    type Pd = Pd<P>;
    type Mr = Mr<P>;
    type Cq = Cq<P>;
    type Channel = Channel<P>;
    type Srq = Srq<P>;
    type Qp = Qp<P>;
    type Ah = Ah<P>;
    type Mw = Mw<P>;

    fn device_name(&self) -> String {
        self.shared.port.device_name()
    }

    fn query_device(&self) -> Result<DeviceAttr> {
        self.query(|st| st.hca.device_attr())
    }

    fn query_port(&self, port_num: u8) -> Result<PortAttr> {
        self.query(|st| st.hca.port_attr(port_num))?
    }

    fn query_gid(&self, port_num: u8, index: u32) -> Result<Gid> {
        self.query(|st| st.hca.gid(port_num, index))?
    }

    fn query_pkey(&self, port_num: u8, index: u16) -> Result<u16> {
        self.query(|st| st.hca.pkey(port_num, index))?
    }

    fn alloc_pd(&self) -> Result<Pd<P>> {
        let id = self.query(|st| st.hca.alloc_pd())??;
        Ok(Pd(Arc::new(PdInner {
            ctx: self.clone(),
            id,
            alive: AtomicBool::new(true),
        })))
    }

    fn alloc_mr(&self, pd: &Pd<P>, len: usize, access: AccessFlags) -> Result<Mr<P>> {
        check_len(len)?;
        let max = verbs_api::Context::query_device(self)?.max_mr_size;
        if len as u64 > max {
            return Err(Error::invalid("MR length above max_mr_size"));
        }
        // An anonymous mapping: pages are only committed when touched, and a length the
        // machine cannot hold fails here (ENOMEM) instead of aborting the process.
        let region = Region::anon(len).map_err(|e| {
            Error::new(
                ErrorKind::NoMemory,
                format!("cannot map {len} bytes for the MR: {e}"),
            )
        })?;
        self.register(pd, region, access, true)
    }

    fn reg_mr_file(
        &self,
        pd: &Pd<P>,
        path: &Path,
        len: usize,
        access: AccessFlags,
    ) -> Result<Mr<P>> {
        check_len(len)?;
        let region = Region::file(path, len)
            .map_err(|e| Error::new(ErrorKind::Io, format!("mapping {}: {e}", path.display())))?;
        self.register(pd, region, access, true)
    }

    #[allow(unsafe_code)] // implements the trait's `unsafe fn`; the contract passes through
    unsafe fn reg_mr_raw(
        &self,
        pd: &Pd<P>,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<Mr<P>> {
        let ptr = NonNull::new(addr).ok_or_else(|| Error::invalid("MR address is null"))?;
        check_len(len)?;
        // SAFETY: the caller promises, per `Context::reg_mr_raw`, that the range stays valid
        // for reads and writes while the MR is registered; the region lives no longer (the
        // device's memory map drops it at deregistration, the MR handle when it is dropped).
        let region = unsafe { Region::caller(ptr, len) };
        self.register(pd, region, access, false)
    }

    fn create_comp_channel(&self) -> Result<Channel<P>> {
        let shared = Arc::new(ChannelShared::new()?);
        let id = self.query(|st| {
            let id = st.hca.create_comp_channel()?;
            st.channels.insert(id, shared.clone());
            Ok::<_, Error>(id)
        })??;
        Ok(Channel(Arc::new(ChannelInner {
            ctx: self.clone(),
            id,
            shared,
            alive: AtomicBool::new(true),
        })))
    }

    fn create_cq(&self, cqe: u32, channel: Option<&Channel<P>>) -> Result<Cq<P>> {
        if let Some(ch) = channel {
            self.same_context(&ch.0.ctx, "completion channel")?;
        }
        let ctx_id = self.shared.id;
        let id = self.query(|st| {
            if let Some(ch) = channel {
                check_alive(&ch.0.alive, "completion channel")?;
            }
            let id = st.hca.create_cq(cqe, channel.map(|c| c.0.id))?;
            st.events.own(EventElement::Cq(id.0), ctx_id);
            Ok::<_, Error>(id)
        })??;
        Ok(Cq(Arc::new(CqInner {
            ctx: self.clone(),
            id,
            alive: AtomicBool::new(true),
            _channel: channel.cloned(),
        })))
    }

    fn create_srq(&self, pd: &Pd<P>, attr: &SrqAttr) -> Result<Srq<P>> {
        self.same_context(&pd.0.ctx, "PD")?;
        let ctx_id = self.shared.id;
        let id = self.query_live(&pd.0.alive, "PD", |st| {
            let id = st.hca.create_srq(pd.0.id, attr)?;
            st.events.own(EventElement::Srq(id.0), ctx_id);
            Ok(id)
        })?;
        Ok(Srq(Arc::new(SrqInner {
            ctx: self.clone(),
            id,
            alive: AtomicBool::new(true),
            _pd: pd.clone(),
        })))
    }

    fn create_qp(
        &self,
        pd: &Pd<P>,
        send_cq: &Cq<P>,
        recv_cq: &Cq<P>,
        srq: Option<&Srq<P>>,
        attr: &QpInitAttr,
    ) -> Result<Qp<P>> {
        self.check_qp_parts(pd, send_cq, recv_cq, srq)?;
        let ctx_id = self.shared.id;
        let qpn = self.query(|st| {
            check_alive(&pd.0.alive, "PD")?;
            check_alive(&send_cq.0.alive, "send CQ")?;
            check_alive(&recv_cq.0.alive, "receive CQ")?;
            if let Some(srq) = srq {
                check_alive(&srq.0.alive, "SRQ")?;
            }
            let srq = srq.map(|s| s.0.id);
            let qpn = st
                .hca
                .create_qp(pd.0.id, send_cq.0.id, recv_cq.0.id, srq, attr)?;
            st.events.own(EventElement::Qp(qpn), ctx_id);
            Ok::<_, Error>(qpn)
        })??;
        Ok(self.qp_handle(qpn, attr.qp_type, pd, send_cq, recv_cq, srq))
    }

    fn create_ah(&self, pd: &Pd<P>, attr: &AhAttr) -> Result<Ah<P>> {
        self.same_context(&pd.0.ctx, "PD")?;
        let id = self.query_live(&pd.0.alive, "PD", |st| st.hca.create_ah(pd.0.id, attr))?;
        Ok(Ah(Arc::new(AhInner {
            ctx: self.clone(),
            id,
            alive: AtomicBool::new(true),
            _pd: pd.clone(),
        })))
    }

    /// The next event about this context's QPs, CQs and SRQs, or about the port or device;
    /// events of objects another context created go to that context.
    fn poll_async_event(&self) -> Option<AsyncEvent> {
        let id = self.shared.id;
        self.wait_take(Waiting::AsyncEvent, |st| Ok(st.events.pop(id)))
            .ok()
            .flatten()
    }

    fn alloc_mw(&self, pd: &Pd<P>, mw_type: MwType) -> Result<Mw<P>> {
        self.same_context(&pd.0.ctx, "PD")?;
        let (id, _) = self.query_live(&pd.0.alive, "PD", |st| st.hca.alloc_mw(pd.0.id, mw_type))?;
        Ok(Mw(Arc::new(MwInner {
            ctx: self.clone(),
            id,
            mw_type,
            alive: AtomicBool::new(true),
            _pd: pd.clone(),
        })))
    }

    fn bind_mw(&self, qp: &Qp<P>, mw: &Mw<P>, bind: &MwBind) -> Result<u32> {
        self.same_context(qp.context(), "QP")?;
        self.same_context(&mw.0.ctx, "MW")?;
        self.post_send(|st, now| {
            check_alive(&qp.0.alive, "QP")?;
            check_alive(&mw.0.alive, "MW")?;
            st.hca.bind_mw(now, qp.0.qpn, mw.0.id, bind)
        })?
    }
}
