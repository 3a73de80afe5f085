//! The CM agent and the connection calls.
//!
//! One process-wide [`State`] (behind a mutex) holds every id's private state and, per
//! device, an `emu_cm::Cm` and its GSI: UD QP 1 opened with libibverbs' softverbs-private
//! `softverbs_open_gsi`, receive buffers, an AH per peer GID. The agent thread (started with
//! the first GSI) polls the GSIs' completions every millisecond: received MADs (the GRH gives
//! the source GID) go to `Cm::handle_mad`, expired deadlines to `Cm::handle_timeout`. After
//! every CM input, from the agent or from an application call, [`pump`] sends what
//! `Cm::poll_transmit` returns (UD sends to the peer's QP 1, Q_Key 0x8001_0000) and turns
//! `CmEvent`s into rdma_cm events, moving QPs to RTR/RTS with the negotiated values (as
//! librdmacm does when the id has a QP) and to ERR on disconnect.
//!
//! Without `softverbs_open_gsi` in the loaded libibverbs, `rdma_listen` and `rdma_connect`
//! fail with `ENODEV`. What it is not: the CM protocol (that is `emu-cm`), SIDR (UD
//! connections: `ENOSYS`), or alternate paths.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::net::SocketAddrV4;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use emu_cm::{
    AcceptParams, Cm, CmConfig, CmError, CmEvent, CmId, ConnState, ConnectParams, Instant, MadAddr,
    RepInfo, ReqInfo,
};
use ibverbs_sys::*;

use crate::abi::*;
use crate::addr::{self, CMA_HDR_LEN, MAX_REQ_USER_PRIVATE_DATA};
use crate::channel::{self, SvEvent};
use crate::devices::{self, Dev};
use crate::qp::{Path, qp_to_err};
use crate::verbs::*;
use crate::{fail, guard, ret};

/// The GSI's Q_Key (IBTA 13.5.2: QP1's well-known Q_Key).
pub const GSI_QKEY: u32 = 0x8001_0000;
/// Bytes of a MAD.
pub const MAD_LEN: usize = 256;
/// Bytes of the GRH at the start of every UD receive buffer.
const GRH_LEN: usize = 40;
/// Receive WQEs kept posted on each GSI.
const RECV_SLOTS: usize = 64;
/// MADs in flight on each GSI's send queue.
const SEND_SLOTS: usize = 32;
/// `wr_id` bit of a send slot.
const SEND_TAG: u64 = 1 << 32;
/// How often the agent polls.
const TICK: Duration = Duration::from_millis(1);
/// The CM response timeout exponent rdma_cm uses (the kernel's `CMA_CM_RESPONSE_TIMEOUT`).
pub const CM_RESPONSE_TIMEOUT: u8 = 20;
/// CM MAD retries before UNREACHABLE (the kernel's `CMA_MAX_CM_RETRIES`).
pub const MAX_CM_RETRIES: u8 = 15;
/// Local ACK timeout exponent when `RDMA_OPTION_ID_ACK_TIMEOUT` is not set.
pub const DEFAULT_ACK_TIMEOUT: u8 = 14;
/// REJ reason "consumer reject" (IBTA table 112).
pub const REJ_CONSUMER: u16 = 28;
/// REP private data limit (IBTA 12.6.8).
pub const MAX_REP_PRIVATE_DATA: usize = 196;
/// REJ private data limit (IBTA 12.6.7).
pub const MAX_REJ_PRIVATE_DATA: usize = 148;

/// Environment variable overriding [`CM_RESPONSE_TIMEOUT`] (an exponent, 0–31) in the REQs
/// this process sends: how long its active side waits for each answer. For tests of the
/// unreachable bound; the default is rdma_cm's.
pub const RESPONSE_TIMEOUT_ENV: &str = "SOFTVERBS_CM_RESPONSE_TIMEOUT";
/// Environment variable overriding [`MAX_CM_RETRIES`] (0–15) in the REQs this process sends.
pub const CM_RETRIES_ENV: &str = "SOFTVERBS_CM_RETRIES";

/// A numeric environment variable at most `max`; `None` when unset or invalid.
fn env_u8(name: &str, max: u8) -> Option<u8> {
    let v = std::env::var(name).ok()?.trim().parse::<u8>().ok()?;
    if v <= max {
        Some(v)
    } else {
        crate::debug(|| format!("{name}={v} is above {max}: ignored"));
        None
    }
}

/// What this library keeps per `rdma_cm_id` (the public struct is the program's view).
#[derive(Default)]
pub struct IdState {
    /// The device the id is bound or resolved to.
    pub dev: Option<usize>,
    /// The id was created without a channel: calls wait for their own events.
    pub sync: bool,
    /// An address (possibly the wildcard) is bound.
    pub bound: bool,
    /// The route is resolved (connect allowed).
    pub routed: bool,
    /// The CM connection.
    pub cm: Option<CmId>,
    /// The service listened on.
    pub listen: Option<u64>,
    /// Passive side: the REQ.
    pub req: Option<ReqInfo>,
    /// Active side: the REQ we sent.
    pub connect: Option<ConnectParams>,
    /// Active side: the REP received.
    pub rep: Option<RepInfo>,
    /// `RDMA_OPTION_ID_ACK_TIMEOUT`.
    pub ack_timeout: Option<u8>,
    /// `RDMA_OPTION_ID_TOS`.
    pub tos: u8,
    /// Passive side: the starting PSN of the local QP (chosen with the REQ, so that
    /// `rdma_init_qp_attr` and `rdma_accept` agree).
    pub psn: u32,
    /// The send/recv CQs (and channels) were created by `rdma_create_qp`.
    pub own_cqs: bool,
    /// `rdma_create_ep` on a passive id: the QP each `rdma_get_request` id gets.
    pub qp_template: Option<ibv_qp_init_attr>,
}

/// One device's CM and GSI.
struct DevCm {
    cm: Cm,
    gsi: Gsi,
}

/// A device's GSI QP with its buffers.
struct Gsi {
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    cq: *mut ibv_cq,
    qp: *mut ibv_qp,
    lkey: u32,
    buf: Box<[u8]>,
    free_send: Vec<usize>,
    ahs: HashMap<[u8; 16], usize>,
}

/// The process's rdma_cm state.
pub struct State {
    /// Private state of each live id (by `rdma_cm_id` address).
    pub ids: HashMap<usize, IdState>,
    cms: HashMap<usize, DevCm>,
    conns: HashMap<(usize, u32), usize>,
    listeners: HashMap<(usize, u64), usize>,
    /// Connections of destroyed ids still disconnecting: their DREQ is retried until the DREP
    /// (or the retry bound), then they are destroyed.
    lingering: Vec<(usize, CmId)>,
    start: std::time::Instant,
    agent: bool,
}

// SAFETY: the raw pointers are libibverbs objects and buffers owned by this state, used only
// under the STATE mutex (libibverbs' calls are thread-safe).
unsafe impl Send for State {}

static STATE: Mutex<Option<State>> = Mutex::new(None);

/// Locks the state (created on first use).
pub fn lock() -> StateGuard {
    let mut g = STATE.lock().unwrap_or_else(|p| p.into_inner());
    if g.is_none() {
        *g = Some(State {
            ids: HashMap::new(),
            cms: HashMap::new(),
            conns: HashMap::new(),
            listeners: HashMap::new(),
            lingering: Vec::new(),
            start: std::time::Instant::now(),
            agent: false,
        });
    }
    StateGuard(g)
}

/// The locked state.
pub struct StateGuard(MutexGuard<'static, Option<State>>);

impl std::ops::Deref for StateGuard {
    type Target = State;
    fn deref(&self) -> &State {
        self.0
            .as_ref()
            .unwrap_or_else(|| unreachable!("created by lock"))
    }
}

impl std::ops::DerefMut for StateGuard {
    fn deref_mut(&mut self) -> &mut State {
        self.0
            .as_mut()
            .unwrap_or_else(|| unreachable!("created by lock"))
    }
}

impl State {
    fn now(&self) -> Instant {
        Instant::from_nanos(self.start.elapsed().as_nanos() as u64)
    }

    /// Forgets `id`'s connection and listens (rdma_destroy_id).
    pub fn forget(&mut self, id: usize) {
        let now = self.now();
        let Some(st) = self.ids.remove(&id) else {
            return;
        };
        if let (Some(dev), Some(cid)) = (st.dev, st.cm) {
            self.conns.remove(&(dev, cid.0));
            if let Some(dc) = self.cms.get_mut(&dev) {
                if disconnecting(&mut dc.cm, now, cid) {
                    self.lingering.push((dev, cid));
                } else {
                    dc.cm.destroy(now, cid);
                }
            }
            pump(self, dev);
        }
        let mine: Vec<_> = self
            .listeners
            .iter()
            .filter(|(_, v)| **v == id)
            .map(|(k, _)| *k)
            .collect();
        for (dev, service) in mine {
            self.listeners.remove(&(dev, service));
            if let Some(dc) = self.cms.get_mut(&dev) {
                dc.cm.unlisten(service);
            }
        }
    }
}

/// For a destroyed id's connection: an established one starts its disconnect (DREQ); true
/// while the DREQ awaits its DREP, so that the connection lingers (the kernel CM's DREQ
/// outlives the process; here the agent retries it while the process lives, and
/// [`linger_at_exit`] gives it a bounded time to finish).
fn disconnecting(cm: &mut Cm, now: Instant, cid: CmId) -> bool {
    if cm.state(cid) == Some(ConnState::Established) {
        let _ = cm.disconnect(now, cid, &[]);
    }
    cm.state(cid) == Some(ConnState::DreqSent)
}

/// Destroys the lingering connections that finished disconnecting.
fn reap_lingering(s: &mut State, now: Instant) {
    let State { lingering, cms, .. } = s;
    lingering.retain(|&(dev, cid)| {
        let Some(dc) = cms.get_mut(&dev) else {
            return false;
        };
        if dc.cm.state(cid) == Some(ConnState::DreqSent) {
            return true;
        }
        dc.cm.destroy(now, cid);
        false
    });
}

/// How long the process's exit waits for disconnects still awaiting their DREP: three DREQ
/// attempts at rdma_cm's timeouts (`ib_time(CM_RESPONSE_TIMEOUT)` + `ib_time(ACK timeout)`).
pub const EXIT_LINGER: Duration = Duration::from_secs(14);

/// `atexit` handler (registered with the agent): waits, at most [`EXIT_LINGER`], until no
/// connection is awaiting a DREP — the peer then sees DISCONNECTED even when the DREQ or
/// DREP was lost (a program like rping's client calls `rdma_disconnect`, destroys the id and
/// exits at once).
pub extern "C" fn linger_at_exit() {
    // A forked child inherits the handler but neither the agent thread nor its connections.
    // SAFETY: getpid has no preconditions.
    if unsafe { libc::getpid() } != AGENT_PID.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let deadline = std::time::Instant::now() + EXIT_LINGER;
    while std::time::Instant::now() < deadline && awaiting_drep() {
        std::thread::sleep(TICK);
    }
    // The agent stops touching libibverbs before the process's exit goes on to tear it down:
    // it sees the flag under the lock before its next poll.
    let _s = lock();
    AGENT_STOP.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Set at exit: the agent thread returns instead of polling again.
static AGENT_STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The process that started the agent (and registered [`linger_at_exit`]).
static AGENT_PID: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Whether some connection, live or lingering, is awaiting a DREP.
fn awaiting_drep() -> bool {
    let s = lock();
    let dreq = |dev: usize, cid: CmId| {
        s.cms
            .get(&dev)
            .is_some_and(|dc| dc.cm.state(cid) == Some(ConnState::DreqSent))
    };
    s.lingering.iter().any(|&(dev, cid)| dreq(dev, cid))
        || s.conns.keys().any(|&(dev, cid)| dreq(dev, CmId(cid)))
}

/// The errno of a CM refusal.
pub fn errno_of(e: &CmError) -> i32 {
    match e {
        CmError::NoSuchId | CmError::InvalidState | CmError::InvalidParam(_) => libc::EINVAL,
        CmError::AddressInUse => libc::EADDRINUSE,
        CmError::Unsupported => libc::ENOSYS,
    }
}

/// A random 24-bit PSN.
pub fn random_psn() -> u32 {
    let mut v: u32 = 0;
    // SAFETY: getrandom writes at most 4 bytes into `v`.
    let n = unsafe { libc::getrandom(&mut v as *mut u32 as *mut c_void, 4, 0) };
    if n != 4 {
        v = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.subsec_nanos());
    }
    v & 0x00FF_FFFF
}

/// Makes sure device `dev` has its CM and GSI (and the agent runs): `Err(ENODEV)` without
/// `softverbs_open_gsi`.
fn ensure_cm(s: &mut State, dev: usize) -> Result<(), i32> {
    if s.cms.contains_key(&dev) {
        return Ok(());
    }
    let d = devices::dev(dev).ok_or(libc::ENODEV)?;
    let Some(open) = open_gsi_fn() else {
        crate::debug(|| {
            "the loaded libibverbs.so.1 does not export softverbs_open_gsi: no CM (ENODEV)".into()
        });
        return Err(libc::ENODEV);
    };
    // SAFETY: an open context of this process; the GSI's objects live as long as the process.
    let gsi = unsafe { Gsi::open(d, open) }?;
    let guid = u64::from_be_bytes([
        d.gid[8], d.gid[9], d.gid[10], d.gid[11], d.gid[12], d.gid[13], d.gid[14], d.gid[15],
    ]);
    let cm = Cm::new(CmConfig {
        local_gid: d.gid,
        ca_guid: guid,
        seed: u64::from(random_psn()) << 24 | u64::from(random_psn()),
    });
    s.cms.insert(dev, DevCm { cm, gsi });
    if !s.agent {
        s.agent = true;
        // SAFETY: getpid has no preconditions; the handler only locks the state and sleeps.
        unsafe {
            AGENT_PID.store(libc::getpid(), std::sync::atomic::Ordering::Relaxed);
            libc::atexit(linger_at_exit);
        }
        std::thread::Builder::new()
            .name("softverbs-cm".into())
            .spawn(agent_loop)
            .map_err(|_| libc::EAGAIN)?;
    }
    Ok(())
}

impl Gsi {
    /// # Safety
    /// `d`'s context is open.
    unsafe fn open(d: &Dev, open: OpenGsiFn) -> Result<Gsi, i32> {
        let ctx = d.ctx();
        let slots = RECV_SLOTS * (GRH_LEN + MAD_LEN) + SEND_SLOTS * MAD_LEN;
        let mut buf = vec![0u8; slots].into_boxed_slice();
        let err = || {
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::ENOMEM)
        };
        // SAFETY: libibverbs calls on the open context; the buffer outlives its MR (the Gsi
        // lives until the process exits).
        unsafe {
            let pd = ibv_alloc_pd(ctx);
            if pd.is_null() {
                return Err(err());
            }
            let cq = ibv_create_cq(
                ctx,
                (RECV_SLOTS + SEND_SLOTS) as c_int,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            );
            if cq.is_null() {
                return Err(err());
            }
            let qp = open(pd, cq, cq, SEND_SLOTS as u32, RECV_SLOTS as u32);
            if qp.is_null() {
                return Err(err());
            }
            let mr = ibv_reg_mr(
                pd,
                buf.as_mut_ptr() as *mut c_void,
                buf.len(),
                IBV_ACCESS_LOCAL_WRITE,
            );
            if mr.is_null() {
                return Err(err());
            }
            let mut gsi = Gsi {
                ctx,
                pd,
                cq,
                qp,
                lkey: (*mr).lkey,
                buf,
                free_send: (0..SEND_SLOTS).collect(),
                ahs: HashMap::new(),
            };
            for i in 0..RECV_SLOTS {
                gsi.post_recv(i)?;
            }
            Ok(gsi)
        }
    }

    fn recv_off(i: usize) -> usize {
        i * (GRH_LEN + MAD_LEN)
    }

    fn send_off(j: usize) -> usize {
        RECV_SLOTS * (GRH_LEN + MAD_LEN) + j * MAD_LEN
    }

    fn post_recv(&mut self, i: usize) -> Result<(), i32> {
        let mut sge = ibv_sge {
            addr: self.buf[Self::recv_off(i)..].as_mut_ptr() as u64,
            length: (GRH_LEN + MAD_LEN) as u32,
            lkey: self.lkey,
        };
        let mut wr = ibv_recv_wr {
            wr_id: i as u64,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: the GSI's context, QP and registered buffer.
        let r = unsafe {
            match (*self.ctx).ops.post_recv {
                Some(f) => f(self.qp, &mut wr, &mut bad),
                None => libc::ENOSYS,
            }
        };
        if r == 0 { Ok(()) } else { Err(r) }
    }

    fn ah(&mut self, gid: [u8; 16]) -> *mut ibv_ah {
        if let Some(a) = self.ahs.get(&gid) {
            return *a as *mut ibv_ah;
        }
        let mut attr = ibv_ah_attr {
            is_global: 1,
            port_num: 1,
            ..Default::default()
        };
        attr.grh.dgid.raw = gid;
        attr.grh.hop_limit = 64;
        // SAFETY: the GSI's PD and an initialised attribute.
        let ah = unsafe { ibv_create_ah(self.pd, &mut attr) };
        if !ah.is_null() {
            self.ahs.insert(gid, ah as usize);
        }
        ah
    }

    /// Sends one MAD; dropped (the CM retries) when no slot or AH is available.
    fn send(&mut self, to: MadAddr, mad: &[u8]) {
        let ah = self.ah(to.gid);
        let Some(j) = self.free_send.pop() else {
            return;
        };
        if ah.is_null() {
            self.free_send.push(j);
            return;
        }
        let len = mad.len().min(MAD_LEN);
        let off = Self::send_off(j);
        self.buf[off..off + len].copy_from_slice(&mad[..len]);
        let mut sge = ibv_sge {
            addr: self.buf[off..].as_mut_ptr() as u64,
            length: len as u32,
            lkey: self.lkey,
        };
        let mut wr = ibv_send_wr {
            wr_id: SEND_TAG | j as u64,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
            opcode: IBV_WR_SEND,
            send_flags: IBV_SEND_SIGNALED,
            imm_data: 0,
            wr: ibv_send_wr_wr {
                ud: ibv_send_wr_ud {
                    ah: ah as *mut c_void,
                    remote_qpn: to.qpn,
                    remote_qkey: GSI_QKEY,
                },
            },
            qp_type_xrc_remote_srqn: 0,
            bind_mw_or_tso: [0; 6],
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: the GSI's context, QP, AH and registered buffer.
        let r = unsafe {
            match (*self.ctx).ops.post_send {
                Some(f) => f(self.qp, &mut wr, &mut bad),
                None => libc::ENOSYS,
            }
        };
        if r != 0 {
            self.free_send.push(j);
        }
    }

    /// Received MADs with their source GSI; send slots of completed sends are freed.
    fn poll(&mut self) -> Vec<(MadAddr, Vec<u8>)> {
        let mut out = Vec::new();
        let mut wc = [ibv_wc::default(); 16];
        // SAFETY: the GSI's context and CQ; `wc` holds 16 entries.
        let n = unsafe {
            match (*self.ctx).ops.poll_cq {
                Some(f) => f(self.cq, wc.len() as c_int, wc.as_mut_ptr()),
                None => 0,
            }
        };
        for w in &wc[..usize::try_from(n).unwrap_or(0)] {
            if w.wr_id & SEND_TAG != 0 {
                self.free_send.push((w.wr_id & 0xFFFF_FFFF) as usize);
                continue;
            }
            let i = w.wr_id as usize;
            if w.status == IBV_WC_SUCCESS && w.opcode == IBV_WC_RECV {
                let off = Self::recv_off(i);
                let end = off + (w.byte_len as usize).min(GRH_LEN + MAD_LEN);
                let slot = &self.buf[off..end];
                if slot.len() > GRH_LEN {
                    let gid = source_gid(&slot[..GRH_LEN]);
                    out.push((MadAddr { gid, qpn: w.src_qp }, slot[GRH_LEN..].to_vec()));
                }
            }
            let _ = self.post_recv(i);
        }
        out
    }
}

/// The source GID of a receive buffer's GRH: an IPv6 header's SGID, or for RoCEv2 over IPv4
/// (20 zero bytes, then the IPv4 header) the IPv4-mapped source address.
pub fn source_gid(grh: &[u8]) -> [u8; 16] {
    let mut gid = [0u8; 16];
    if grh[..20].iter().all(|b| *b == 0) {
        gid.copy_from_slice(&addr::gid_of(std::net::Ipv4Addr::new(
            grh[32], grh[33], grh[34], grh[35],
        )));
    } else {
        gid.copy_from_slice(&grh[8..24]);
    }
    gid
}

fn agent_loop() {
    loop {
        std::thread::sleep(TICK);
        let mut s = lock();
        if AGENT_STOP.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let now = s.now();
        let devs: Vec<usize> = s.cms.keys().copied().collect();
        for dev in devs {
            if let Some(dc) = s.cms.get_mut(&dev) {
                for (from, mad) in dc.gsi.poll() {
                    dc.cm.handle_mad(now, from, &mad);
                }
                if dc.cm.poll_timeout().is_some_and(|t| t <= now) {
                    dc.cm.handle_timeout(now);
                }
            }
            pump(&mut s, dev);
        }
        reap_lingering(&mut s, now);
    }
}

/// Sends device `dev`'s pending MADs and turns its CM events into rdma_cm events until the
/// CM has nothing more.
pub fn pump(s: &mut State, dev: usize) {
    loop {
        let Some(dc) = s.cms.get_mut(&dev) else {
            return;
        };
        while let Some((to, mad)) = dc.cm.poll_transmit() {
            dc.gsi.send(to, &mad);
        }
        let Some(ev) = dc.cm.poll_event() else {
            return;
        };
        crate::debug(|| format!("device {dev}: {ev:?}"));
        on_event(s, dev, ev);
    }
}

fn conn_param(resp: u8, init: u8, retry: u8, rnr: u8, qpn: u32) -> rdma_conn_param {
    rdma_conn_param {
        private_data: std::ptr::null(),
        private_data_len: 0,
        responder_resources: resp,
        initiator_depth: init,
        flow_control: 1,
        retry_count: retry,
        rnr_retry_count: rnr,
        srq: 0,
        qp_num: qpn,
    }
}

/// Posts an event to `id`'s channel.
fn post(id: usize, ev: Box<SvEvent>) {
    let idp = id as *mut rdma_cm_id;
    // SAFETY: a live id of this library (listed in State.ids), whose channel is live.
    unsafe {
        let ch = (*idp).channel;
        if !ch.is_null() {
            channel::post(ch, ev);
        }
    }
}

fn on_event(s: &mut State, dev: usize, ev: CmEvent) {
    let id_of = |s: &State, cid: CmId| s.conns.get(&(dev, cid.0)).copied();
    match ev {
        CmEvent::ReqReceived { id, req } => on_req(s, dev, id, req),
        CmEvent::RepReceived { id, rep } => {
            let Some(idp) = id_of(s, id) else { return };
            on_rep(s, dev, idp, id, rep);
        }
        CmEvent::Established { id } => {
            let Some(idp) = id_of(s, id) else { return };
            let rep = s.ids.get(&idp).and_then(|st| st.rep.clone());
            let mut e = SvEvent::new(idp as *mut _, RDMA_CM_EVENT_ESTABLISHED, 0);
            if let Some(r) = rep {
                let p = conn_param(
                    r.initiator_depth,
                    r.responder_resources,
                    0,
                    r.rnr_retry_count,
                    r.remote_qpn,
                );
                e = e.with_conn(p, &r.private_data);
            }
            post(idp, e);
        }
        CmEvent::Rejected {
            id,
            reason,
            private_data,
        } => {
            let Some(idp) = id_of(s, id) else { return };
            let e = SvEvent::new(idp as *mut _, RDMA_CM_EVENT_REJECTED, c_int::from(reason));
            post(idp, e.with_conn(conn_param(0, 0, 0, 0, 0), &private_data));
        }
        CmEvent::Unreachable { id } => {
            let Some(idp) = id_of(s, id) else { return };
            post(
                idp,
                SvEvent::new(idp as *mut _, RDMA_CM_EVENT_UNREACHABLE, -libc::ETIMEDOUT),
            );
        }
        CmEvent::Disconnected { id, private_data } => {
            let Some(idp) = id_of(s, id) else { return };
            // SAFETY: a live id; its QP (if any) is the program's live QP.
            unsafe { qp_to_err((*(idp as *mut rdma_cm_id)).qp) };
            let e = SvEvent::new(idp as *mut _, RDMA_CM_EVENT_DISCONNECTED, 0);
            post(idp, e.with_conn(conn_param(0, 0, 0, 0, 0), &private_data));
        }
        CmEvent::TimewaitExit { id } => {
            let Some(idp) = id_of(s, id) else { return };
            post(
                idp,
                SvEvent::new(idp as *mut _, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0),
            );
        }
    }
}

/// A REQ for a listened service: a new id on the listener's channel (or its own, for a
/// synchronous listener) and CONNECT_REQUEST; without a listener or a CMA header, REJ.
fn on_req(s: &mut State, dev: usize, cid: CmId, req: ReqInfo) {
    let now = s.now();
    let listener = s.listeners.get(&(dev, req.service_id)).copied();
    let hdr = addr::parse_cma_header(&req.private_data);
    let (Some(lid), Some((peer, dst_ip)), Some(d)) = (listener, hdr, devices::dev(dev)) else {
        if let Some(dc) = s.cms.get_mut(&dev) {
            let _ = dc.cm.reject(now, cid, REJ_CONSUMER, &[]);
        }
        return;
    };
    let l = lid as *mut rdma_cm_id;
    let sync = s.ids.get(&lid).is_some_and(|st| st.sync);
    // SAFETY: the listener is a live id of this library.
    let (ctx, ps, qpt, channel) = unsafe { ((*l).context, (*l).ps, (*l).qp_type, (*l).channel) };
    let own = if sync { channel::new_channel() } else { None };
    let ch = own.map_or(channel, |c| c as *mut rdma_event_channel);
    let local = SocketAddrV4::new(dst_ip, addr::port_of_service(req.service_id));
    let idp = crate::id::new_id(ch, ctx, ps, qpt);
    // SAFETY: the id was just allocated by new_id.
    unsafe { crate::id::set_route(idp, d, local, peer, req.remote.gid) };
    s.ids.insert(
        idp as usize,
        IdState {
            dev: Some(dev),
            sync,
            bound: true,
            routed: true,
            cm: Some(cid),
            req: Some(req.clone()),
            psn: random_psn(),
            ..Default::default()
        },
    );
    s.conns.insert((dev, cid.0), idp as usize);
    let p = conn_param(
        req.initiator_depth,
        req.responder_resources,
        req.retry_count,
        req.rnr_retry_count,
        req.remote_qpn,
    );
    let mut e = SvEvent::new(idp, RDMA_CM_EVENT_CONNECT_REQUEST, 0)
        .with_conn(p, &req.private_data[CMA_HDR_LEN..]);
    e.ev.listen_id = l;
    post(lid, e);
}

fn on_rep(s: &mut State, dev: usize, idp: usize, cid: CmId, rep: RepInfo) {
    let now = s.now();
    let Some(st) = s.ids.get_mut(&idp) else {
        return;
    };
    st.rep = Some(rep.clone());
    let Some(c) = st.connect.clone() else { return };
    let tos = st.tos;
    // SAFETY: a live id of this library.
    let qp = unsafe { (*(idp as *mut rdma_cm_id)).qp };
    let Some(dc) = s.cms.get_mut(&dev) else {
        return;
    };
    if qp.is_null() {
        let p = conn_param(
            rep.initiator_depth,
            rep.responder_resources,
            0,
            rep.rnr_retry_count,
            rep.remote_qpn,
        );
        let e = SvEvent::new(idp as *mut _, RDMA_CM_EVENT_CONNECT_RESPONSE, 0)
            .with_conn(p, &rep.private_data);
        post(idp, e);
        return;
    }
    let path = Path::active(&c, &rep, tos);
    // SAFETY: the id's live QP.
    match unsafe { path.rtr_rts(qp) } {
        Ok(()) => {
            if let Err(e) = dc.cm.establish(now, cid) {
                crate::debug(|| format!("establish: {e}"));
            }
        }
        Err(e) => {
            let _ = dc.cm.reject(now, cid, REJ_CONSUMER, &[]);
            post(
                idp,
                SvEvent::new(idp as *mut _, RDMA_CM_EVENT_CONNECT_ERROR, -e),
            );
        }
    }
}

/// # Safety
/// `p` is NULL or points to `len` readable bytes.
unsafe fn bytes<'a>(p: *const c_void, len: usize) -> &'a [u8] {
    if p.is_null() || len == 0 {
        &[]
    } else {
        // SAFETY: per the contract.
        unsafe { std::slice::from_raw_parts(p as *const u8, len) }
    }
}

/// Waits, for a synchronous id, for event `want` on its private channel.
///
/// # Safety
/// `id` is a live id of this library.
unsafe fn sync_wait(id: *mut rdma_cm_id, sync: bool, want: c_int) -> Result<(), i32> {
    if !sync {
        return Ok(());
    }
    // SAFETY: per the contract; a synchronous id's channel is its own.
    unsafe { channel::wait_for((*id).channel, want) }.map(drop)
}

/// `rdma_listen`: accept REQs for the id's port (bound to a device: on that device;
/// to the wildcard: on every device). Unbound ids are bound to the wildcard and an
/// ephemeral port. `ENODEV` without the GSI export, `EADDRINUSE` for a port listened on.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, _backlog: c_int) -> c_int {
    guard(-1, || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: a live id of this library, per librdmacm's contract.
        ret(unsafe { listen(id) })
    })
}

/// # Safety
/// `id` is a live id of this library.
unsafe fn listen(id: *mut rdma_cm_id) -> Result<(), i32> {
    // SAFETY: per the contract.
    unsafe { crate::id::bind_default(id) }?;
    let mut s = lock();
    let st = s.ids.get(&(id as usize)).ok_or(libc::EINVAL)?;
    if st.listen.is_some() || st.cm.is_some() {
        return Err(libc::EINVAL);
    }
    // SAFETY: per the contract.
    let (ps, src) = unsafe { ((*id).ps, addr::load(&(*id).route.addr.src_storage)) };
    let port = src.map_or(0, |a| a.port());
    let service = emu_cm::service_id(ps as u16, port);
    let devs: Vec<usize> = match st.dev {
        Some(d) => vec![d],
        None => (0..devices::devices(None).len()).collect(),
    };
    if devs.is_empty() {
        return Err(libc::ENODEV);
    }
    for &d in &devs {
        ensure_cm(&mut s, d)?;
        if s.listeners.contains_key(&(d, service)) {
            return Err(libc::EADDRINUSE);
        }
    }
    for &d in &devs {
        if let Some(dc) = s.cms.get_mut(&d) {
            dc.cm.listen(service).map_err(|e| errno_of(&e))?;
        }
        s.listeners.insert((d, service), id as usize);
    }
    if let Some(st) = s.ids.get_mut(&(id as usize)) {
        st.listen = Some(service);
    }
    Ok(())
}

/// `rdma_connect`: sends a REQ to the resolved destination (service ID of the id's port space
/// and the destination port; private data = the CMA header + the caller's, at most 56 bytes).
/// The QP, if the id has one, moves to RTR/RTS when the REP arrives; then ESTABLISHED.
/// `EINVAL` before `rdma_resolve_route` or with too much private data, `ENODEV` without the
/// GSI export, `ENOSYS` for UD ids (SIDR).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_connect(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    guard(-1, || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: the caller's live id and optional parameters.
        ret(unsafe { connect(id, param.as_ref()) })
    })
}

/// # Safety
/// `id` is a live id of this library.
unsafe fn connect(id: *mut rdma_cm_id, param: Option<&rdma_conn_param>) -> Result<(), i32> {
    let mut s = lock();
    let now = s.now();
    let st = s.ids.get(&(id as usize)).ok_or(libc::EINVAL)?;
    let (Some(dev), true, None) = (st.dev, st.routed, st.cm) else {
        return Err(libc::EINVAL);
    };
    let (sync, ack) = (st.sync, st.ack_timeout);
    let d = devices::dev(dev).ok_or(libc::ENODEV)?;
    // SAFETY: per the contract.
    let (qp, qpt, ps, src, dst, dgid) = unsafe {
        let r = &(*id).route.addr;
        (
            (*id).qp,
            (*id).qp_type as u32,
            (*id).ps,
            addr::load(&r.src_storage),
            addr::load(&r.dst_storage),
            r.ibaddr.dgid.raw,
        )
    };
    let (qpn, qpt) = if qp.is_null() {
        (param.map_or(0, |p| p.qp_num), qpt)
    } else {
        // SAFETY: the id's live QP.
        unsafe { ((*qp).qp_num, (*qp).qp_type) }
    };
    if qpt == IBV_QPT_UD {
        return Err(libc::ENOSYS);
    }
    let (Some(src), Some(dst)) = (src, dst) else {
        return Err(libc::EINVAL);
    };
    // SAFETY: the caller's private data of the length it gives.
    let user = param.map_or(&[][..], |p| unsafe {
        bytes(p.private_data, p.private_data_len.into())
    });
    if user.len() > MAX_REQ_USER_PRIVATE_DATA {
        return Err(libc::EINVAL);
    }
    let mut pd = addr::cma_header(src, dst).to_vec();
    pd.extend_from_slice(user);
    let p = param.copied().unwrap_or(conn_param(255, 255, 7, 7, 0));
    let params = ConnectParams {
        service_id: emu_cm::service_id(ps as u16, dst.port()),
        remote: MadAddr { gid: dgid, qpn: 1 },
        local_qpn: qpn,
        starting_psn: random_psn(),
        reliable: qpt == IBV_QPT_RC,
        responder_resources: p.responder_resources.min(d.max_rd_atom),
        initiator_depth: p.initiator_depth.min(d.max_init_rd_atom),
        path_mtu: addr::roce_mtu_from(*src.ip()).map_or(d.active_mtu, |m| m.min(d.active_mtu)),
        retry_count: p.retry_count.min(7),
        rnr_retry_count: p.rnr_retry_count.min(7),
        local_ack_timeout: ack.unwrap_or(DEFAULT_ACK_TIMEOUT),
        cm_response_timeout: env_u8(RESPONSE_TIMEOUT_ENV, 31).unwrap_or(CM_RESPONSE_TIMEOUT),
        max_cm_retries: env_u8(CM_RETRIES_ENV, 15).unwrap_or(MAX_CM_RETRIES),
        private_data: pd,
    };
    ensure_cm(&mut s, dev)?;
    let dc = s.cms.get_mut(&dev).ok_or(libc::ENODEV)?;
    let cid = dc
        .cm
        .connect(now, params.clone())
        .map_err(|e| errno_of(&e))?;
    s.conns.insert((dev, cid.0), id as usize);
    if let Some(st) = s.ids.get_mut(&(id as usize)) {
        st.cm = Some(cid);
        st.connect = Some(params);
    }
    pump(&mut s, dev);
    drop(s);
    // SAFETY: per the contract.
    unsafe { sync_wait(id, sync, RDMA_CM_EVENT_ESTABLISHED) }
}

/// `rdma_accept`: answers a CONNECT_REQUEST id's REQ with a REP; the id's QP, if any, moves to
/// RTR/RTS with the REQ's values first. NULL parameters take the request's. ESTABLISHED
/// follows the RTU. `EINVAL` on an id without a pending REQ or with too much private data.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_accept(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    guard(-1, || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: the caller's live id and optional parameters.
        ret(unsafe { accept(id, param.as_ref()) })
    })
}

/// # Safety
/// `id` is a live id of this library.
unsafe fn accept(id: *mut rdma_cm_id, param: Option<&rdma_conn_param>) -> Result<(), i32> {
    let mut s = lock();
    let now = s.now();
    let st = s.ids.get(&(id as usize)).ok_or(libc::EINVAL)?;
    let (Some(dev), Some(cid), Some(req)) = (st.dev, st.cm, st.req.clone()) else {
        return Err(libc::EINVAL);
    };
    let (sync, tos, psn) = (st.sync, st.tos, st.psn);
    let d = devices::dev(dev).ok_or(libc::ENODEV)?;
    let (resp, init) = passive_rd_atomic(&req, d, param);
    // SAFETY: the caller's private data of the length it gives.
    let pd = param.map_or(&[][..], |p| unsafe {
        bytes(p.private_data, p.private_data_len.into())
    });
    if pd.len() > MAX_REP_PRIVATE_DATA {
        return Err(libc::EINVAL);
    }
    // SAFETY: per the contract.
    let qp = unsafe { (*id).qp };
    let qpn = if qp.is_null() {
        param.map_or(0, |p| p.qp_num)
    } else {
        let path = Path::passive(&req, d, resp, init, psn, tos);
        // SAFETY: the id's live QP, in INIT since rdma_create_qp.
        unsafe { path.rtr_rts(qp) }?;
        // SAFETY: as above.
        unsafe { (*qp).qp_num }
    };
    let params = AcceptParams {
        local_qpn: qpn,
        starting_psn: psn,
        responder_resources: resp,
        initiator_depth: init,
        rnr_retry_count: param.map_or(7, |p| p.rnr_retry_count.min(7)),
        private_data: pd.to_vec(),
    };
    let dc = s.cms.get_mut(&dev).ok_or(libc::ENODEV)?;
    dc.cm.accept(now, cid, params).map_err(|e| errno_of(&e))?;
    pump(&mut s, dev);
    drop(s);
    // SAFETY: per the contract.
    unsafe { sync_wait(id, sync, RDMA_CM_EVENT_ESTABLISHED) }
}

/// The passive side's (responder resources, initiator depth): the accept's values (NULL
/// parameters: the REQ's, seen from this side), capped by the REQ and the device.
pub fn passive_rd_atomic(req: &ReqInfo, d: &Dev, param: Option<&rdma_conn_param>) -> (u8, u8) {
    let resp = param
        .map_or(req.initiator_depth, |p| p.responder_resources)
        .min(d.max_rd_atom);
    let init = param
        .map_or(req.responder_resources, |p| p.initiator_depth)
        .min(req.responder_resources)
        .min(d.max_init_rd_atom);
    (resp, init)
}

/// Runs `f` on the CM of `id`'s connection, then pumps.
fn with_conn(
    id: *mut rdma_cm_id,
    f: impl FnOnce(&mut Cm, Instant, CmId) -> Result<(), CmError>,
) -> Result<(), i32> {
    let mut s = lock();
    let now = s.now();
    let st = s.ids.get(&(id as usize)).ok_or(libc::EINVAL)?;
    let (Some(dev), Some(cid)) = (st.dev, st.cm) else {
        return Err(libc::EINVAL);
    };
    let dc = s.cms.get_mut(&dev).ok_or(libc::EINVAL)?;
    f(&mut dc.cm, now, cid).map_err(|e| errno_of(&e))?;
    pump(&mut s, dev);
    Ok(())
}

/// `rdma_reject`: REJ (consumer reject, private data ≤ 148 bytes) for a CONNECT_REQUEST id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    guard(-1, || {
        // SAFETY: the caller's private data of the length it gives.
        let pd = unsafe { bytes(private_data, private_data_len.into()) }.to_vec();
        ret(with_conn(id, |cm, now, cid| {
            cm.reject(now, cid, REJ_CONSUMER, &pd)
        }))
    })
}

/// `rdma_disconnect`: moves the id's QP to ERR and sends a DREQ (or the DREP to a received
/// DREQ); DISCONNECTED follows. `EINVAL` on an id without a connection.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: the caller's live id; its QP (if any) is live.
        unsafe { qp_to_err((*id).qp) };
        ret(with_conn(id, |cm, now, cid| cm.disconnect(now, cid, &[])))
    })
}

/// `rdma_establish`: for an active id without a QP, after CONNECT_RESPONSE: sends the RTU.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        ret(with_conn(id, |cm, now, cid| cm.establish(now, cid)))
    })
}

/// `rdma_get_request`: for a synchronous listener (`rdma_create_ep` with `RAI_PASSIVE`), waits
/// for a CONNECT_REQUEST and returns its new id (with a QP when the endpoint was created with
/// QP attributes). `EINVAL` for an asynchronous or non-listening id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    guard(-1, || {
        if listen.is_null() || id.is_null() {
            return fail(libc::EINVAL);
        }
        let (sync, template) = {
            let s = lock();
            match s.ids.get(&(listen as usize)) {
                Some(st) if st.listen.is_some() => (st.sync, st.qp_template),
                _ => return fail(libc::EINVAL),
            }
        };
        if !sync {
            return fail(libc::EINVAL);
        }
        // SAFETY: a synchronous listener's own channel.
        let ev =
            match unsafe { channel::wait_for((*listen).channel, RDMA_CM_EVENT_CONNECT_REQUEST) } {
                Ok(ev) => ev,
                Err(e) => return fail(e),
            };
        let new = ev.ev.id;
        // SAFETY: the new id is live; its event stays until rdma_destroy_id frees it.
        unsafe {
            (*new).event = Box::into_raw(ev) as *mut rdma_cm_event;
            if let Some(mut t) = template {
                let pd = (*listen).pd;
                if crate::id::rdma_create_qp(new, pd, &mut t) != 0 {
                    return -1;
                }
            }
            *id = new;
        }
        0
    })
}

#[cfg(test)]
mod gsi_tests {
    #![allow(clippy::unwrap_used)]

    use softverbs_ibverbs as _;

    use super::*;

    /// The two devices of this test binary (127.0.73.1 and .2).
    pub(super) fn test_devices() -> &'static [Dev] {
        static ONCE: std::sync::Once = std::sync::Once::new();
        // SAFETY: set once, before this test binary opens its devices.
        ONCE.call_once(|| unsafe {
            std::env::set_var(devices::UDP_ADDRS_ENV, "127.0.73.1:4791,127.0.73.2:4791")
        });
        let devs = devices::devices(None);
        assert_eq!(devs.len(), 2);
        devs
    }

    /// A stand-in for libibverbs' `softverbs_open_gsi`: an ordinary UD QP with the GSI's
    /// Q_Key, in RTS (its number is not 1, so the test addresses it by number).
    pub(super) unsafe extern "C" fn fake_gsi(
        pd: *mut ibv_pd,
        send_cq: *mut ibv_cq,
        recv_cq: *mut ibv_cq,
        max_send_wr: u32,
        max_recv_wr: u32,
    ) -> *mut ibv_qp {
        let mut attr = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq,
            recv_cq,
            srq: std::ptr::null_mut(),
            cap: ibv_qp_cap {
                max_send_wr,
                max_recv_wr,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: IBV_QPT_UD,
            sq_sig_all: 0,
        };
        // SAFETY: the caller's PD and CQs.
        unsafe {
            let qp = ibv_create_qp(pd, &mut attr);
            let mut a = ibv_qp_attr {
                qp_state: IBV_QPS_INIT,
                port_num: 1,
                qkey: GSI_QKEY,
                ..Default::default()
            };
            let m = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
            assert_eq!(ibv_modify_qp(qp, &mut a, m), 0);
            a.qp_state = IBV_QPS_RTR;
            assert_eq!(ibv_modify_qp(qp, &mut a, IBV_QP_STATE), 0);
            a.qp_state = IBV_QPS_RTS;
            assert_eq!(ibv_modify_qp(qp, &mut a, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
            qp
        }
    }

    /// A MAD sent from one device's GSI arrives at the other's with the sender's GID (from
    /// the GRH) and QP, byte for byte; the send slot comes back with the completion.
    #[test]
    fn a_mad_crosses_between_two_gsis_with_its_source_gid() {
        let devs = test_devices();
        // SAFETY: the devices' open contexts; the fake opener has OpenGsiFn's signature.
        let (mut a, mut b) = unsafe {
            (
                Gsi::open(&devs[0], fake_gsi).unwrap(),
                Gsi::open(&devs[1], fake_gsi).unwrap(),
            )
        };
        // SAFETY: live QPs.
        let (qa, qb) = unsafe { ((*a.qp).qp_num, (*b.qp).qp_num) };
        let mad: Vec<u8> = (0..MAD_LEN).map(|i| i as u8).collect();
        a.send(
            MadAddr {
                gid: devs[1].gid,
                qpn: qb,
            },
            &mad,
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mut got = Vec::new();
        while got.is_empty() || a.free_send.len() < SEND_SLOTS {
            assert!(std::time::Instant::now() < deadline, "no MAD after 5 s");
            got.extend(b.poll());
            a.poll();
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(got.len(), 1);
        let (from, body) = &got[0];
        assert_eq!(
            *from,
            MadAddr {
                gid: devs[0].gid,
                qpn: qa
            }
        );
        assert_eq!(body, &mad);
    }
}

#[cfg(test)]
mod event_tests {
    #![allow(clippy::unwrap_used)]

    use std::net::Ipv4Addr;

    use super::gsi_tests::test_devices;
    use super::*;

    fn readable(ch: *mut rdma_event_channel) -> bool {
        // SAFETY: a live channel of this test.
        let fd = unsafe { (*ch).fd };
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    fn next(ch: *mut rdma_event_channel) -> Box<SvEvent> {
        assert!(readable(ch));
        // SAFETY: a live channel.
        unsafe { channel::next_event(ch) }.unwrap()
    }

    fn pd_of(ev: &SvEvent) -> Vec<u8> {
        // SAFETY: every event's param is a conn param here.
        let c = unsafe { ev.ev.param.conn };
        ev.private_data[..c.private_data_len as usize].to_vec()
    }

    /// The agent's translation of CM events into rdma_cm events, from a REQ on a listener of
    /// device 1 to the connection's end (the CM itself is not involved).
    #[test]
    fn cm_events_become_rdma_cm_events_on_the_right_ids() {
        let devs = test_devices();
        let ch = channel::new_channel().unwrap() as *mut rdma_event_channel;
        let service = emu_cm::service_id(RDMA_PS_TCP as u16, 7400);
        let l = crate::id::new_id(ch, 0x5a as *mut c_void, RDMA_PS_TCP, IBV_QPT_RC as c_int);
        let src = SocketAddrV4::new(Ipv4Addr::new(127, 0, 73, 1), 5555);
        let dst = SocketAddrV4::new(Ipv4Addr::new(127, 0, 73, 2), 7400);
        let mut pd = addr::cma_header(src, dst).to_vec();
        pd.extend_from_slice(b"hi");
        pd.resize(92, 0);
        let req = ReqInfo {
            service_id: service,
            remote: MadAddr {
                gid: devs[0].gid,
                qpn: 1,
            },
            remote_qpn: 77,
            starting_psn: 5,
            reliable: true,
            responder_resources: 3,
            initiator_depth: 2,
            path_mtu: 5,
            retry_count: 6,
            rnr_retry_count: 7,
            local_ack_timeout: 14,
            private_data: pd,
        };
        let mut s = lock();
        s.ids.insert(
            l as usize,
            IdState {
                dev: Some(1),
                bound: true,
                listen: Some(service),
                ..Default::default()
            },
        );
        s.listeners.insert((1, service), l as usize);
        on_event(
            &mut s,
            1,
            CmEvent::ReqReceived {
                id: CmId(9),
                req: req.clone(),
            },
        );
        // A REQ for a service nobody listens on here, or without a CMA header, makes no id
        // (the CM is told to reject it).
        let elsewhere = ReqInfo {
            service_id: service + 1,
            ..req.clone()
        };
        on_event(
            &mut s,
            1,
            CmEvent::ReqReceived {
                id: CmId(11),
                req: elsewhere,
            },
        );
        let headless = ReqInfo {
            private_data: vec![0xff; 92],
            ..req
        };
        on_event(
            &mut s,
            1,
            CmEvent::ReqReceived {
                id: CmId(12),
                req: headless,
            },
        );
        assert!(!s.conns.contains_key(&(1, 11)) && !s.conns.contains_key(&(1, 12)));
        drop(s);

        let ev = next(ch);
        assert_eq!(
            (ev.ev.event, ev.ev.status, ev.ev.listen_id),
            (RDMA_CM_EVENT_CONNECT_REQUEST, 0, l)
        );
        // SAFETY: the event's param is a conn param.
        let c = unsafe { ev.ev.param.conn };
        assert_eq!(
            (c.responder_resources, c.initiator_depth),
            (2, 3),
            "seen from the passive side"
        );
        assert_eq!((c.retry_count, c.rnr_retry_count, c.qp_num), (6, 7, 77));
        let user = pd_of(&ev);
        assert_eq!(user.len(), 92 - addr::CMA_HDR_LEN);
        assert_eq!(&user[..2], b"hi");
        let child = ev.ev.id;
        assert_ne!(child, l);
        // SAFETY: the new id the agent made.
        unsafe {
            assert_eq!((*child).verbs, devs[1].ctx());
            assert_eq!((*child).context, 0x5a as *mut c_void);
            assert_eq!(addr::load(&(*child).route.addr.src_storage), Some(dst));
            assert_eq!(addr::load(&(*child).route.addr.dst_storage), Some(src));
            assert_eq!((*child).route.addr.ibaddr.dgid.raw, devs[0].gid);
            assert_eq!((*(*child).route.path_rec).dgid.raw, devs[0].gid);
        }

        let mut s = lock();
        let rej = CmEvent::Rejected {
            id: CmId(9),
            reason: 28,
            private_data: b"no".to_vec(),
        };
        on_event(&mut s, 1, rej);
        on_event(&mut s, 1, CmEvent::Established { id: CmId(9) });
        on_event(
            &mut s,
            1,
            CmEvent::Disconnected {
                id: CmId(9),
                private_data: vec![],
            },
        );
        on_event(&mut s, 1, CmEvent::Unreachable { id: CmId(9) });
        on_event(&mut s, 1, CmEvent::TimewaitExit { id: CmId(9) });
        // Events of connections this library does not know are dropped.
        on_event(&mut s, 0, CmEvent::Established { id: CmId(9) });
        on_event(&mut s, 1, CmEvent::Established { id: CmId(10) });
        drop(s);
        let kinds: Vec<_> = (0..5)
            .map(|_| {
                let e = next(ch);
                assert_eq!(e.ev.id, child);
                (e.ev.event, e.ev.status, pd_of(&e))
            })
            .collect();
        assert_eq!(
            kinds,
            [
                (RDMA_CM_EVENT_REJECTED, 28, b"no".to_vec()),
                (RDMA_CM_EVENT_ESTABLISHED, 0, vec![]),
                (RDMA_CM_EVENT_DISCONNECTED, 0, vec![]),
                (RDMA_CM_EVENT_UNREACHABLE, -libc::ETIMEDOUT, vec![]),
                (RDMA_CM_EVENT_TIMEWAIT_EXIT, 0, vec![]),
            ]
        );
        assert!(!readable(ch));
        let mut s = lock();
        s.forget(child as usize);
        s.forget(l as usize);
        assert!(!s.listeners.contains_key(&(1, service)));
        drop(s);
        // SAFETY: ids and channel of this test, no longer referenced.
        unsafe {
            drop(Box::from_raw(child));
            drop(Box::from_raw(l));
            channel::free_channel(ch);
        }
    }

    /// The active side's ESTABLISHED carries the REP's private data and parameters, seen from
    /// this side.
    #[test]
    fn active_established_carries_the_rep() {
        let devs = test_devices();
        let ch = channel::new_channel().unwrap() as *mut rdma_event_channel;
        let id = crate::id::new_id(ch, std::ptr::null_mut(), RDMA_PS_TCP, IBV_QPT_RC as c_int);
        let rep = RepInfo {
            remote_qpn: 88,
            starting_psn: 1,
            responder_resources: 4,
            initiator_depth: 1,
            rnr_retry_count: 5,
            private_data: b"welcome".to_vec(),
        };
        let mut s = lock();
        s.ids.insert(
            id as usize,
            IdState {
                dev: Some(0),
                cm: Some(CmId(3)),
                rep: Some(rep),
                ..Default::default()
            },
        );
        s.conns.insert((0, 3), id as usize);
        on_event(&mut s, 0, CmEvent::Established { id: CmId(3) });
        drop(s);
        let e = next(ch);
        // SAFETY: the event's param is a conn param.
        let c = unsafe { e.ev.param.conn };
        assert_eq!(
            (e.ev.event, c.responder_resources, c.initiator_depth),
            (RDMA_CM_EVENT_ESTABLISHED, 1, 4)
        );
        assert_eq!((c.rnr_retry_count, c.qp_num), (5, 88));
        assert_eq!(pd_of(&e), b"welcome");
        let _ = devs;
        lock().forget(id as usize);
        // SAFETY: the id and channel of this test.
        unsafe {
            drop(Box::from_raw(id));
            channel::free_channel(ch);
        }
    }
}

#[cfg(test)]
mod qp_tests {
    #![allow(clippy::unwrap_used)]

    use ibverbs_sys::ibv_qp_init_attr;

    use super::gsi_tests::{fake_gsi, test_devices};
    use super::*;

    /// Gives device `dev` a CM and a stand-in GSI (no agent thread).
    fn with_cm(s: &mut State, dev: usize) {
        if s.cms.contains_key(&dev) {
            return;
        }
        let d = devices::dev(dev).unwrap();
        // SAFETY: the device's open context; the stand-in has OpenGsiFn's signature.
        let gsi = unsafe { Gsi::open(d, fake_gsi) }.unwrap();
        let cm = Cm::new(CmConfig {
            local_gid: d.gid,
            ca_guid: 1,
            seed: 1,
        });
        s.cms.insert(dev, DevCm { cm, gsi });
    }

    /// An id on device `dev` routed to the other device, with an RC QP in INIT.
    fn routed_id(dev: usize, st: IdState) -> *mut rdma_cm_id {
        let devs = test_devices();
        let ch = channel::new_channel().unwrap() as *mut rdma_event_channel;
        let id = crate::id::new_id(ch, std::ptr::null_mut(), RDMA_PS_TCP, IBV_QPT_RC as c_int);
        let me = SocketAddrV4::new(devs[dev].ip, 7500);
        let peer = SocketAddrV4::new(devs[1 - dev].ip, 7501);
        // SAFETY: the new id.
        unsafe { crate::id::set_route(id, &devs[dev], me, peer, devs[1 - dev].gid) };
        lock().ids.insert(id as usize, st);
        // SAFETY: all-zero init attributes are valid; the id has a device.
        let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.cap.max_send_wr = 2;
        attr.cap.max_recv_wr = 2;
        attr.cap.max_send_sge = 1;
        attr.cap.max_recv_sge = 1;
        attr.qp_type = IBV_QPT_RC;
        // SAFETY: as above.
        let r = unsafe { crate::id::rdma_create_qp(id, std::ptr::null_mut(), &mut attr) };
        assert_eq!(r, 0);
        id
    }

    fn query(id: *mut rdma_cm_id) -> ibv_qp_attr {
        let mut a = ibv_qp_attr::default();
        // SAFETY: all-zero init attributes are valid; the id's live QP.
        unsafe {
            let mut init: ibv_qp_init_attr = std::mem::zeroed();
            let mask = 0x1f_ffff;
            assert_eq!(
                softverbs_ibverbs::qp::ibv_query_qp((*id).qp, &mut a, mask, &mut init),
                0
            );
        }
        a
    }

    fn destroy(id: *mut rdma_cm_id) {
        // SAFETY: the test's id, its QP and private channel.
        unsafe {
            let ch = (*id).channel;
            crate::id::rdma_destroy_qp(id);
            crate::id::rdma_destroy_id(id);
            channel::free_channel(ch);
        }
    }

    /// The REP moves the active side's QP to RTS with the negotiated values (softverbs'
    /// libibverbs accepts the attributes and masks), before the CM is asked for the RTU.
    #[test]
    fn rep_moves_the_active_qp_to_rts() {
        let devs = test_devices();
        let c = ConnectParams {
            service_id: emu_cm::service_id(RDMA_PS_TCP as u16, 7501),
            remote: MadAddr {
                gid: devs[1].gid,
                qpn: 1,
            },
            local_qpn: 0,
            starting_psn: 100,
            reliable: true,
            responder_resources: 2,
            initiator_depth: 2,
            path_mtu: 3,
            retry_count: 6,
            rnr_retry_count: 7,
            local_ack_timeout: 15,
            cm_response_timeout: CM_RESPONSE_TIMEOUT,
            max_cm_retries: MAX_CM_RETRIES,
            private_data: vec![],
        };
        let st = IdState {
            dev: Some(0),
            cm: Some(CmId(5)),
            connect: Some(c),
            ..Default::default()
        };
        let id = routed_id(0, st);
        let rep = RepInfo {
            remote_qpn: 0x44,
            starting_psn: 0x1234,
            responder_resources: 1,
            initiator_depth: 1,
            rnr_retry_count: 5,
            private_data: vec![],
        };
        let mut s = lock();
        with_cm(&mut s, 0);
        s.conns.insert((0, 5), id as usize);
        on_event(&mut s, 0, CmEvent::RepReceived { id: CmId(5), rep });
        drop(s);
        let a = query(id);
        assert_eq!(a.qp_state, IBV_QPS_RTS);
        assert_eq!((a.dest_qp_num, a.rq_psn, a.sq_psn), (0x44, 100, 0x1234));
        assert_eq!(
            (a.path_mtu, a.max_rd_atomic, a.max_dest_rd_atomic),
            (3, 1, 2)
        );
        assert_eq!((a.timeout, a.retry_cnt, a.rnr_retry), (15, 6, 5));
        assert_eq!(a.ah_attr.grh.dgid.raw, devs[1].gid);
        destroy(id);
    }

    /// `rdma_accept` moves the passive side's QP to RTS with the REQ's values and the PSN
    /// chosen with the REQ, then asks the CM for the REP.
    #[test]
    fn accept_moves_the_passive_qp_to_rts() {
        let devs = test_devices();
        let req = ReqInfo {
            service_id: emu_cm::service_id(RDMA_PS_TCP as u16, 7500),
            remote: MadAddr {
                gid: devs[0].gid,
                qpn: 1,
            },
            remote_qpn: 0x99,
            starting_psn: 7,
            reliable: true,
            responder_resources: 4,
            initiator_depth: 1,
            path_mtu: 2,
            retry_count: 5,
            rnr_retry_count: 6,
            local_ack_timeout: 16,
            private_data: vec![],
        };
        let st = IdState {
            dev: Some(1),
            cm: Some(CmId(21)),
            req: Some(req),
            psn: 0x4321,
            ..Default::default()
        };
        let id = routed_id(1, st);
        with_cm(&mut lock(), 1);
        // SAFETY: the test's live id.
        let r = unsafe { accept(id, None) };
        // The CM never saw connection 21: EINVAL (no such connection); the QP moved before
        // the CM was asked.
        assert_eq!(r, Err(libc::EINVAL));
        let a = query(id);
        assert_eq!(a.qp_state, IBV_QPS_RTS);
        assert_eq!((a.dest_qp_num, a.rq_psn, a.sq_psn), (0x99, 0x4321, 7));
        assert_eq!(
            (a.path_mtu, a.max_dest_rd_atomic, a.max_rd_atomic),
            (2, 1, 4)
        );
        assert_eq!((a.timeout, a.retry_cnt, a.rnr_retry), (16, 5, 6));
        destroy(id);
    }
}
