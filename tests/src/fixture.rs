//! What cases run against: the backend's devices ([`Env`]), a ready-made set of objects
//! ([`Fixture`]), a connected RC pair with memory on both sides ([`Pair`]) and helpers that
//! walk QPs through states, poll with a bounded wait, check completions, flushes and data, and
//! wait on file descriptors.
//!
//! Everything here is generic over [`Context`]; no backend type is named. Waits are bounded
//! (one second) and spin with `yield_now` rather than sleep, so the in-process emulator, which
//! completes everything synchronously, never waits at all, while backends that complete
//! asynchronously (rxe's flush runs in a kernel task) get time to catch up.

use std::fmt;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use verbs_api::connect::{INIT_MASK, RTR_MASK, RTS_MASK};
use verbs_api::{
    AccessFlags, AhAttr, AsyncEvent, CompletionQueue, Context, Device, DeviceAttr, Endpoint,
    MemoryRegion, PortAttr, Provider, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QueuePair,
    RcConnectOptions, RecvWr, Result, SendFlags, SendOp, SendWr, Sge, SharedReceiveQueue, SrqAttr,
    WcFlags, WcOpcode, WcStatus, WorkCompletion,
};

use crate::check::{Outcome, Stop, failure, needs};
use crate::{check_eq, ensure, fail};

/// How long a case waits for something a backend may deliver asynchronously.
pub const WAIT: Duration = Duration::from_secs(1);

/// The CQ size of [`Fixture::cq`].
pub const DEFAULT_CQE: u32 = 64;

type Opener<C> = Arc<dyn Fn() -> Result<C> + Send + Sync>;

/// One device of the backend under test.
struct DeviceEntry<C> {
    name: String,
    guid: u64,
    open: Opener<C>,
}

/// The backend under test: its devices, each openable any number of times.
///
/// Built from any [`Provider`] whose devices open into `C`; the instantiation builds a fresh
/// `Env` for every case, so cases do not share objects.
pub struct Env<C: Context> {
    provider: &'static str,
    devices: Vec<DeviceEntry<C>>,
}

impl<C: Context> fmt::Debug for Env<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Env")
            .field("provider", &self.provider)
            .field(
                "devices",
                &self.devices.iter().map(|d| &d.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl<C: Context> Env<C> {
    /// The devices `provider` lists, at the time of the call.
    pub fn from_provider<P>(provider: &P) -> Result<Env<C>>
    where
        P: Provider,
        P::Device: Device<Context = C>,
    {
        let devices = provider
            .devices()?
            .into_iter()
            .map(|dev| DeviceEntry {
                name: dev.name(),
                guid: dev.node_guid(),
                open: Arc::new(move || dev.open()) as Opener<C>,
            })
            .collect();
        Ok(Env {
            provider: provider.name(),
            devices,
        })
    }

    /// The provider's short name.
    pub fn provider_name(&self) -> &'static str {
        self.provider
    }

    /// Number of devices.
    pub fn device_count(&self) -> usize {
        self.devices.len()
    }

    /// The device names, in the provider's order.
    pub fn device_names(&self) -> Vec<String> {
        self.devices.iter().map(|d| d.name.clone()).collect()
    }

    /// The node GUID the device list reports for device `index`.
    pub fn device_guid(&self, index: usize) -> Option<u64> {
        self.devices.get(index).map(|d| d.guid)
    }

    /// Opens device `index` (a new context each call).
    pub fn open(&self, index: usize) -> Result<C, Stop> {
        let dev = self
            .devices
            .get(index)
            .ok_or_else(|| failure(format!("the backend has no device {index}")))?;
        Ok((dev.open)()?)
    }

    /// A context on the second device, or a second context on the first when there is only
    /// one: the "remote" side of connections.
    pub fn open_peer(&self) -> Result<C, Stop> {
        self.open(if self.devices.len() > 1 { 1 } else { 0 })
    }
}

/// A QP with its own send and receive CQs.
pub struct TestQp<C: Context> {
    /// The QP.
    pub qp: C::Qp,
    /// Its send CQ.
    pub send_cq: C::Cq,
    /// Its receive CQ.
    pub recv_cq: C::Cq,
}

impl<C: Context> TestQp<C> {
    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.qp.qp_num()
    }

    /// The QP's current state, from `query`.
    pub fn state(&self) -> Result<QpState, Stop> {
        Ok(self.qp.query()?.qp_state)
    }
}

/// A context on device 0 with a PD, device limits and port attributes, plus a peer context
/// (device 1 if there is one) with a QP in RESET whose endpoint QPs connect to.
pub struct Fixture<C: Context> {
    /// The context under test (device 0).
    pub ctx: C,
    /// The peer context (device 1, or device 0 again).
    pub peer_ctx: C,
    /// `ctx.query_device()`.
    pub dev: DeviceAttr,
    /// `ctx.query_port(1)`.
    pub port: PortAttr,
    /// A PD of `ctx`.
    pub pd: C::Pd,
    /// A PD of `peer_ctx`.
    pub peer_pd: C::Pd,
    /// A QP of `peer_ctx` that stays in RESET: the remote end of QPs walked to RTR/RTS.
    pub peer: TestQp<C>,
    /// The endpoint of `peer`, starting at PSN [`Fixture::PEER_PSN`].
    pub peer_ep: Endpoint,
}

impl<C: Context> Fixture<C> {
    /// The PSN the peer endpoint announces (our `rq_psn`).
    pub const PEER_PSN: u32 = 0x00AB_CDEF;
    /// The PSN our QPs start sending at (`sq_psn`).
    pub const LOCAL_PSN: u32 = 0x0012_3456;

    /// Opens the contexts and allocates the PDs and the peer QP.
    pub fn new(env: &Env<C>) -> Result<Fixture<C>, Stop> {
        let ctx = env.open(0)?;
        let peer_ctx = env.open_peer()?;
        let dev = ctx.query_device()?;
        let port = ctx.query_port(1)?;
        let pd = ctx.alloc_pd()?;
        let peer_pd = peer_ctx.alloc_pd()?;
        let peer = make_qp(&peer_ctx, &peer_pd, &default_cap(&dev), DEFAULT_CQE)?;
        let peer_ep = peer.qp.endpoint(Self::PEER_PSN)?;
        Ok(Fixture {
            ctx,
            peer_ctx,
            dev,
            port,
            pd,
            peer_pd,
            peer,
            peer_ep,
        })
    }

    /// The default QP capacities (16 WRs, 2 SGEs, 64 inline bytes, capped by the device).
    pub fn cap(&self) -> QpCap {
        default_cap(&self.dev)
    }

    /// A CQ of [`DEFAULT_CQE`] entries without a channel.
    pub fn cq(&self) -> Result<C::Cq, Stop> {
        Ok(self.ctx.create_cq(DEFAULT_CQE, None)?)
    }

    /// An RC QP with the default capacities and two fresh CQs.
    pub fn qp(&self) -> Result<TestQp<C>, Stop> {
        self.qp_with_cap(&self.cap())
    }

    /// An RC QP with capacities `cap` and two fresh CQs.
    pub fn qp_with_cap(&self, cap: &QpCap) -> Result<TestQp<C>, Stop> {
        make_qp(&self.ctx, &self.pd, cap, DEFAULT_CQE)
    }

    /// An RC QP with the default capacities on the given CQs and SRQ.
    pub fn qp_on(
        &self,
        send_cq: &C::Cq,
        recv_cq: &C::Cq,
        srq: Option<&C::Srq>,
    ) -> Result<TestQp<C>, Stop> {
        let qp =
            self.ctx
                .create_qp(&self.pd, send_cq, recv_cq, srq, &QpInitAttr::rc(self.cap()))?;
        Ok(TestQp {
            qp,
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
        })
    }

    /// Connection options used by [`Fixture::connect_pair`] and [`Fixture::walk`]: the
    /// defaults of [`RcConnectOptions`] with a `max_rd_atomic` the device supports.
    pub fn connect_options(&self) -> RcConnectOptions {
        let defaults = RcConnectOptions::default();
        let cap = |dev: u32, want: u8| u8::try_from(dev.min(u32::from(want))).unwrap_or(want);
        RcConnectOptions {
            max_rd_atomic: cap(self.dev.max_qp_init_rd_atom, defaults.max_rd_atomic),
            max_dest_rd_atomic: cap(self.dev.max_qp_rd_atom, defaults.max_dest_rd_atomic),
            ..defaults
        }
    }

    /// Every attribute a RESET → RTS walk towards `remote` sets, valid for this device: the
    /// attributes `connect_rc` uses, with `cur_qp_state` = `cur`.
    pub fn full_attr(&self, to: QpState, cur: QpState, remote: &Endpoint) -> QpAttr {
        let opts = self.connect_options();
        QpAttr {
            qp_state: to,
            cur_qp_state: cur,
            pkey_index: 0,
            port_num: opts.port_num,
            qp_access_flags: opts.access,
            path_mtu: opts.path_mtu,
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: opts.max_dest_rd_atomic,
            min_rnr_timer: opts.min_rnr_timer,
            ah_attr: AhAttr {
                dgid: remote.gid,
                hop_limit: opts.hop_limit,
                port_num: opts.port_num,
                udp_dport: remote.udp_port,
                ..AhAttr::default()
            },
            timeout: opts.timeout,
            retry_cnt: opts.retry_cnt,
            rnr_retry: opts.rnr_retry,
            sq_psn: Self::LOCAL_PSN,
            max_rd_atomic: opts.max_rd_atomic,
            ..QpAttr::default()
        }
    }

    /// Walks a QP in RESET to `to` with the exact masks of rc-transport.md §5.1, towards the
    /// peer endpoint: INIT, RTR, RTS, SQD (via RTS, waiting until drained) or ERR (via INIT).
    pub fn walk(&self, qp: &C::Qp, to: QpState) -> Outcome {
        let ep = self.peer_ep;
        let step = |state: QpState, mask: QpAttrMask| -> Outcome {
            let from = qp.query()?.qp_state;
            qp.modify(&self.full_attr(state, from, &ep), mask)
                .map_err(|e| failure(format!("walking {from} -> {state}: {e}")))
        };
        match to {
            QpState::Reset => return Ok(()),
            QpState::Sqe => fail!("SQE cannot be entered by an RC QP"),
            QpState::Err => {
                step(QpState::Init, INIT_MASK)?;
                step(QpState::Err, QpAttrMask::STATE)?;
            }
            QpState::Init | QpState::Rtr | QpState::Rts | QpState::Sqd => {
                step(QpState::Init, INIT_MASK)?;
                if to != QpState::Init {
                    step(QpState::Rtr, RTR_MASK)?;
                }
                if matches!(to, QpState::Rts | QpState::Sqd) {
                    step(QpState::Rts, RTS_MASK)?;
                }
                if to == QpState::Sqd {
                    step(QpState::Sqd, QpAttrMask::STATE)?;
                    wait_drained(qp)?;
                }
            }
        }
        check_eq!(qp.query()?.qp_state, to, "state after walking to {to}");
        Ok(())
    }

    /// A fresh QP walked to `to`.
    pub fn qp_in(&self, to: QpState) -> Result<TestQp<C>, Stop> {
        let t = self.qp()?;
        self.walk(&t.qp, to)?;
        Ok(t)
    }

    /// Two fresh QPs, one on each context, connected to each other with
    /// [`verbs_api::connect_rc`] after exchanging [`Endpoint`]s: `(a, b, a_psn, b_psn)`.
    pub fn connect_pair(&self) -> Result<(TestQp<C>, TestQp<C>, u32, u32), Stop> {
        let a = self.qp()?;
        let b = make_qp(&self.peer_ctx, &self.peer_pd, &self.cap(), DEFAULT_CQE)?;
        let (a_psn, b_psn) = (0x0000_1234, 0x00FE_DCBA);
        let a_ep = a.qp.endpoint(a_psn)?;
        let b_ep = b.qp.endpoint(b_psn)?;
        let opts = self.connect_options();
        verbs_api::connect_rc(&a.qp, a_psn, &b_ep, &opts)?;
        verbs_api::connect_rc(&b.qp, b_psn, &a_ep, &opts)?;
        Ok((a, b, a_psn, b_psn))
    }
}

/// Default QP capacities for `dev`.
pub fn default_cap(dev: &DeviceAttr) -> QpCap {
    QpCap {
        max_send_wr: dev.max_qp_wr.min(16),
        max_recv_wr: dev.max_qp_wr.min(16),
        max_send_sge: dev.max_sge.min(2),
        max_recv_sge: dev.max_sge.min(2),
        max_inline_data: dev.max_inline_data.min(64),
    }
}

fn make_qp<C: Context>(ctx: &C, pd: &C::Pd, cap: &QpCap, cqe: u32) -> Result<TestQp<C>, Stop> {
    let send_cq = ctx.create_cq(cqe, None)?;
    let recv_cq = ctx.create_cq(cqe, None)?;
    let qp = ctx.create_qp(pd, &send_cq, &recv_cq, None, &QpInitAttr::rc(*cap))?;
    Ok(TestQp {
        qp,
        send_cq,
        recv_cq,
    })
}

/// Waits (bounded) until a QP in SQD reports its send queue drained; rxe clears `sq_draining`
/// from its send task, after `modify` returned.
pub fn wait_drained<Q: QueuePair>(qp: &Q) -> Outcome {
    let deadline = Instant::now() + WAIT;
    loop {
        let attr = qp.query()?;
        if attr.qp_state != QpState::Sqd || !attr.sq_draining {
            return Ok(());
        }
        if Instant::now() >= deadline {
            fail!("SQD: send queue still draining after {WAIT:?}");
        }
        std::thread::yield_now();
    }
}

/// Collects exactly `n` completions from `cq`, waiting up to [`WAIT`] for them, then checks
/// that no further completion is there.
pub fn poll_exact<Q: CompletionQueue>(cq: &Q, n: usize) -> Result<Vec<WorkCompletion>, Stop> {
    poll_exact_within(cq, n, WAIT)
}

/// As [`poll_exact`], waiting up to `wait` instead of [`WAIT`] (for the few cases whose
/// completion depends on transport timers of real hardware, e.g. [`RETRY_WAIT`]).
pub fn poll_exact_within<Q: CompletionQueue>(
    cq: &Q,
    n: usize,
    wait: Duration,
) -> Result<Vec<WorkCompletion>, Stop> {
    let mut got = Vec::with_capacity(n);
    let mut buf = [WorkCompletion::default(); 16];
    let deadline = Instant::now() + wait;
    while got.len() < n {
        let want = (n - got.len()).min(buf.len());
        let k = cq.poll(&mut buf[..want])?;
        got.extend_from_slice(&buf[..k]);
        if k == 0 {
            if Instant::now() >= deadline {
                fail!(
                    "expected {n} completions, got {} after {wait:?}: {got:?}",
                    got.len()
                );
            }
            std::thread::yield_now();
        }
    }
    let extra = cq.poll(&mut buf[..1])?;
    ensure!(
        extra == 0,
        "expected exactly {n} completions, found one more: {:?}",
        buf[0]
    );
    Ok(got)
}

/// Checks that `wcs` are `WR_FLUSH_ERR` completions of QP `qpn` for `ids`, in that order.
pub fn check_flushed(wcs: &[WorkCompletion], ids: &[u64], qpn: u32) -> Outcome {
    let got: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    check_eq!(got, ids.to_vec(), "flushed wr_ids in order");
    for wc in wcs {
        check_eq!(
            wc.status,
            WcStatus::WrFlushErr,
            "status of wr_id {}",
            wc.wr_id
        );
        check_eq!(wc.qp_num, qpn, "qp_num of wr_id {}", wc.wr_id);
    }
    Ok(())
}

/// Polls `n` completions and checks they are flushes of `ids` on QP `qpn`.
pub fn expect_flushed<Q: CompletionQueue>(cq: &Q, ids: &[u64], qpn: u32) -> Outcome {
    let wcs = poll_exact(cq, ids.len())?;
    check_flushed(&wcs, ids, qpn)
}

/// A signaled SEND without payload.
pub fn send_wr(wr_id: u64) -> SendWr<'static> {
    SendWr::new(wr_id, SendOp::Send, &[])
}

/// A receive WR without buffers.
pub fn recv_wr(wr_id: u64) -> RecvWr<'static> {
    RecvWr::new(wr_id, &[])
}

/// Posts a signaled SEND `sentinel` on a QP in ERR and expects its flush to be the only
/// completion left on the send CQ: proves (in completion order) that nothing else was queued.
pub fn expect_only_send_sentinel<C: Context>(t: &TestQp<C>, sentinel: u64) -> Outcome {
    check_eq!(t.state()?, QpState::Err, "sentinel needs ERR");
    t.qp.post_send(&[send_wr(sentinel)])?;
    expect_flushed(&t.send_cq, &[sentinel], t.qpn())
}

/// Posts a receive `sentinel` on a QP in ERR and expects its flush to be the only completion
/// left on the receive CQ.
pub fn expect_only_recv_sentinel<C: Context>(t: &TestQp<C>, sentinel: u64) -> Outcome {
    check_eq!(t.state()?, QpState::Err, "sentinel needs ERR");
    t.qp.post_recv(&[recv_wr(sentinel)])?;
    expect_flushed(&t.recv_cq, &[sentinel], t.qpn())
}

/// Waits up to [`WAIT`] for an async event of `ctx` matching `pred`, discarding others.
pub fn wait_async<C: Context>(
    ctx: &C,
    what: &str,
    pred: impl Fn(&AsyncEvent) -> bool,
) -> Result<AsyncEvent, Stop> {
    let deadline = Instant::now() + WAIT;
    let mut seen = Vec::new();
    loop {
        match ctx.poll_async_event() {
            Some(e) if pred(&e) => return Ok(e),
            Some(e) => seen.push(e),
            None if Instant::now() >= deadline => {
                fail!("no {what} async event within {WAIT:?}; other events: {seen:?}")
            }
            None => std::thread::yield_now(),
        }
    }
}

/// Whether `fd` becomes readable within `timeout` (`poll(2)` with `POLLIN`): the real
/// file-descriptor test of completion channels, as epoll/mio/tokio users rely on.
#[allow(unsafe_code)]
pub fn fd_readable(fd: BorrowedFd<'_>, timeout: Duration) -> Result<bool, Stop> {
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: `pfd` is one initialised `pollfd` that outlives the call (nfds = 1), and its fd
        // is kept open by the `BorrowedFd` borrow for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n >= 0 {
            return Ok(n > 0 && pfd.revents & libc::POLLIN != 0);
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(failure(format!("poll(2) failed: {err}")));
        }
    }
}

/// A directory for a case's files, unique per process and call, removed on drop.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates `$TMPDIR/softverbs-conformance-<pid>-<n>-<tag>`.
    pub fn new(tag: &str) -> Result<TempDir, Stop> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "softverbs-conformance-{}-{n}-{tag}",
            std::process::id()
        ));
        std::fs::create_dir_all(&path)
            .map_err(|e| failure(format!("creating {}: {e}", path.display())))?;
        Ok(TempDir { path })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// The access rights of a fully remote-accessible MR or QP.
pub fn all_remote() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

// ---- connected pairs (checklist items 5 and 6) ------------------------------------------

/// The wait bound of the one case that needs the requester's local ACK timer to expire
/// `retry_cnt + 1` times (`errors::retry_exceeded_peer_gone`). On paper that is
/// (2 + 1) × 4.096 µs × 2^8 ≈ 3.2 ms, but rxe rounds every timer up to at least one jiffy
/// (up to 10 ms, rc-transport.md §3.5) and HCAs may clamp small `timeout` codes to a firmware
/// minimum; five seconds covers both. The emulator runs it in virtual time, instantly.
pub const RETRY_WAIT: Duration = Duration::from_secs(5);

/// How [`Pair::with`] builds a connected pair. [`Pair::with`] hands the defaults to a closure
/// that may change any field; [`Pair::new`] keeps them.
#[derive(Clone, Debug)]
pub struct PairConfig {
    /// Connection options of side `a` (the requester in most cases): its `timeout`,
    /// `retry_cnt` and `rnr_retry` govern what `a` sends.
    pub opts_a: RcConnectOptions,
    /// Connection options of side `b`: its `access` flags and `min_rnr_timer` govern how `b`
    /// answers requests.
    pub opts_b: RcConnectOptions,
    /// Capacities of every QP of the pair.
    pub cap: QpCap,
    /// Entries of each CQ.
    pub cqe: u32,
    /// Length of each side's MR.
    pub mr_len: usize,
    /// Access rights of each side's MR.
    pub mr_access: AccessFlags,
    /// If set, `b`'s QPs receive through one SRQ created with these attributes.
    pub srq_b: Option<SrqAttr>,
    /// If true, each side's receive CQ reports to a completion channel of its own.
    pub recv_channel: bool,
    /// `sq_sig_all` of every QP of the pair: every send WR completes, signaled or not.
    pub sq_sig_all: bool,
}

impl PairConfig {
    /// Applies `f` to the connection options of both sides.
    pub fn both(&mut self, f: impl Fn(&mut RcConnectOptions)) {
        f(&mut self.opts_a);
        f(&mut self.opts_b);
    }
}

/// One end of a [`Pair`]: a context with its PD, MR, CQs and RC QP (and optionally a
/// completion channel and an SRQ).
pub struct Side<C: Context> {
    /// The context (device 0 for `a`, the peer device for `b`).
    pub ctx: C,
    /// `ctx.query_device()`.
    pub dev: DeviceAttr,
    /// The PD of everything below.
    pub pd: C::Pd,
    /// A zeroed MR of [`PairConfig::mr_len`] bytes with [`PairConfig::mr_access`].
    pub mr: C::Mr,
    /// The QP, in RTS once the pair is built.
    pub qp: C::Qp,
    /// The QP's send CQ.
    pub send_cq: C::Cq,
    /// The QP's receive CQ.
    pub recv_cq: C::Cq,
    /// The receive CQ's completion channel, with [`PairConfig::recv_channel`].
    pub channel: Option<C::Channel>,
    /// The SRQ the QP receives through, with [`PairConfig::srq_b`] (side `b` only).
    pub srq: Option<C::Srq>,
    /// The PSN this side's QP starts sending at.
    pub psn: u32,
}

impl<C: Context> Side<C> {
    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.qp.qp_num()
    }

    /// The QP's current state.
    pub fn state(&self) -> Result<QpState, Stop> {
        Ok(self.qp.query()?.qp_state)
    }

    /// An SGE for `len` bytes at `offset` of this side's MR.
    pub fn sge(&self, offset: usize, len: usize) -> Result<Sge, Stop> {
        Ok(self.mr.sge(offset, len)?)
    }

    /// Copies `data` into the MR at `offset`.
    pub fn fill(&self, offset: usize, data: &[u8]) -> Outcome {
        Ok(self.mr.write(offset, data)?)
    }

    /// The MR's `len` bytes at `offset`.
    pub fn bytes(&self, offset: usize, len: usize) -> Result<Vec<u8>, Stop> {
        let mut out = vec![0u8; len];
        self.mr.read(offset, &mut out)?;
        Ok(out)
    }

    /// The host-order 64-bit word at `offset` (atomics operate on host-native words,
    /// rc-transport.md §4.6).
    pub fn word(&self, offset: usize) -> Result<u64, Stop> {
        let mut b = [0u8; 8];
        self.mr.read(offset, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    }

    /// Stores a host-order 64-bit word at `offset`.
    pub fn set_word(&self, offset: usize, value: u64) -> Outcome {
        Ok(self.mr.write(offset, &value.to_ne_bytes())?)
    }

    /// This side's MR address at `offset`, as a peer targets it.
    pub fn addr(&self, offset: usize) -> u64 {
        self.mr.addr() + offset as u64
    }

    /// An RDMA WRITE into this side's MR at `offset`.
    pub fn write_op(&self, offset: usize) -> SendOp {
        SendOp::RdmaWrite {
            remote_addr: self.addr(offset),
            rkey: self.mr.rkey(),
        }
    }

    /// An RDMA WRITE with immediate into this side's MR at `offset`.
    pub fn write_imm_op(&self, offset: usize, imm: u32) -> SendOp {
        SendOp::RdmaWriteWithImm {
            remote_addr: self.addr(offset),
            rkey: self.mr.rkey(),
            imm,
        }
    }

    /// An RDMA READ of this side's MR at `offset`.
    pub fn read_op(&self, offset: usize) -> SendOp {
        SendOp::RdmaRead {
            remote_addr: self.addr(offset),
            rkey: self.mr.rkey(),
        }
    }

    /// A fetch-and-add on this side's word at `offset`.
    pub fn faa_op(&self, offset: usize, add: u64) -> SendOp {
        SendOp::AtomicFetchAndAdd {
            remote_addr: self.addr(offset),
            rkey: self.mr.rkey(),
            add,
        }
    }

    /// A compare-and-swap on this side's word at `offset`.
    pub fn cas_op(&self, offset: usize, compare: u64, swap: u64) -> SendOp {
        SendOp::AtomicCmpAndSwp {
            remote_addr: self.addr(offset),
            rkey: self.mr.rkey(),
            compare,
            swap,
        }
    }

    /// Posts one receive of `len` bytes at `offset` of the MR, on the QP or its SRQ.
    pub fn post_recv_at(&self, wr_id: u64, offset: usize, len: usize) -> Outcome {
        let sge = [self.sge(offset, len)?];
        let wr = [RecvWr::new(wr_id, &sge)];
        match &self.srq {
            Some(srq) => srq.post_recv(&wr)?,
            None => self.qp.post_recv(&wr)?,
        }
        Ok(())
    }

    /// Polls exactly one completion from the send CQ (bounded wait) and checks it is a success
    /// of `wr_id` with `opcode` and `byte_len` on this QP.
    pub fn expect_send(
        &self,
        wr_id: u64,
        opcode: WcOpcode,
        byte_len: u32,
    ) -> Result<WorkCompletion, Stop> {
        let wc = poll_one(&self.send_cq)?;
        check_success(&wc, wr_id, opcode, byte_len, self.qpn())?;
        Ok(wc)
    }

    /// Polls exactly one completion from the send CQ and checks its `wr_id`, `status` and
    /// `qp_num` (the only fields valid on error, rc-transport.md §6.1).
    pub fn expect_send_status(&self, wr_id: u64, status: WcStatus) -> Result<WorkCompletion, Stop> {
        let wc = poll_one(&self.send_cq)?;
        check_status(&wc, wr_id, status, self.qpn())?;
        Ok(wc)
    }

    /// Polls exactly one completion from the receive CQ and checks it is a successful receive
    /// of `wr_id` from `from`: `opcode`, `byte_len`, the immediate (`WITH_IMM` set exactly when
    /// `imm` is some), `qp_num` and `src_qp` (see [`check_recv`]).
    pub fn expect_recv(
        &self,
        from: &Side<C>,
        wr_id: u64,
        opcode: WcOpcode,
        byte_len: u32,
        imm: Option<u32>,
    ) -> Result<WorkCompletion, Stop> {
        let wc = poll_one(&self.recv_cq)?;
        check_recv(&wc, wr_id, opcode, byte_len, imm, self.qpn(), from.qpn())?;
        Ok(wc)
    }

    /// Polls exactly one completion from the receive CQ and checks `wr_id`, `status`, `qp_num`.
    pub fn expect_recv_status(&self, wr_id: u64, status: WcStatus) -> Result<WorkCompletion, Stop> {
        let wc = poll_one(&self.recv_cq)?;
        check_status(&wc, wr_id, status, self.qpn())?;
        Ok(wc)
    }

    /// Expects the send CQ to yield exactly the flushes of `ids`, in order.
    pub fn expect_send_flushed(&self, ids: &[u64]) -> Outcome {
        expect_flushed(&self.send_cq, ids, self.qpn())
    }

    /// Expects the receive CQ to yield exactly the flushes of `ids`, in order.
    pub fn expect_recv_flushed(&self, ids: &[u64]) -> Outcome {
        expect_flushed(&self.recv_cq, ids, self.qpn())
    }

    /// Expects both CQs to be empty now.
    pub fn expect_no_completions(&self) -> Outcome {
        poll_exact(&self.send_cq, 0)?;
        poll_exact(&self.recv_cq, 0)?;
        Ok(())
    }

    /// Waits (bounded by [`WAIT`]) until the QP reports `state`: a responder moves to ERR in
    /// rxe's kernel task, possibly after the requester saw the NAK.
    pub fn wait_state(&self, state: QpState) -> Outcome {
        wait_state(&self.qp, state)
    }
}

/// Two RC QPs in RTS connected to each other, one per context (device 0 and the peer device,
/// or device 0 twice), each with its own PD, CQs and MR.
pub struct Pair<C: Context> {
    /// The first side, on device 0.
    pub a: Side<C>,
    /// The second side, on the peer device.
    pub b: Side<C>,
    /// The configuration the pair was built with.
    pub config: PairConfig,
}

impl<C: Context> Pair<C> {
    /// A pair with the default configuration (see [`Pair::with`]).
    pub fn new(env: &Env<C>) -> Result<Pair<C>, Stop> {
        Pair::with(env, |_| {})
    }

    /// A pair whose configuration is the default, changed by `tune`. Defaults: the options of
    /// [`RcConnectOptions::default`] (path MTU 1024, all remote access, `timeout` 14,
    /// `retry_cnt` 7, `rnr_retry` 7, `min_rnr_timer` 12) with `max_rd_atomic` and
    /// `max_dest_rd_atomic` capped by both devices; 32 WRs and 4 SGEs per queue and 64 inline
    /// bytes (capped by the devices); CQs of [`DEFAULT_CQE`]; MRs of 64 KiB with every
    /// access right; no SRQ, no channel, no `sq_sig_all`. `a` sends from PSN 0xFFFFF8, so its
    /// PSNs wrap past 2^24 within the first messages.
    pub fn with(env: &Env<C>, tune: impl FnOnce(&mut PairConfig)) -> Result<Pair<C>, Stop> {
        let ctx_a = env.open(0)?;
        let ctx_b = env.open_peer()?;
        let dev_a = ctx_a.query_device()?;
        let dev_b = ctx_b.query_device()?;
        let mut config = default_pair_config(&dev_a, &dev_b);
        tune(&mut config);
        let a = make_side(ctx_a, dev_a, &config, false, 0x00FF_FFF8)?;
        let b = make_side(ctx_b, dev_b, &config, config.srq_b.is_some(), 0x0000_0100)?;
        connect_qps(&a.qp, a.psn, &b.qp, b.psn, &config)?;
        Ok(Pair { a, b, config })
    }

    /// The fatal-error scenario of rc-transport.md §3.9 and §6.1 for a request of `a`.
    ///
    /// Posts receive 900 on `a` and 901 on `b`, then on `a` in one call: WR 1 = `op` over
    /// `sges` (signaled or not as `flags` say), WR 2 = a valid signaled 8-byte RDMA WRITE into
    /// the last 8 bytes of `b`'s MR, WR 3 = an unsignaled SEND. Expects WR 1 to complete with
    /// `status` (unsignaled or not: "an error always generates a WC"), WRs 2 and 3 to flush in
    /// order, `a` to be in ERR with receive 900 flushed, and the WRITE's target untouched
    /// (those bytes must be zero). Then posts WR 4 (a valid WRITE) and expects it to flush: no
    /// later WR succeeds.
    ///
    /// With `peer_fails` (the responder rejected the request: NAK, class C of §4.3) `b` must
    /// reach ERR too and flush receive 901; without (a local error at `a`), `b` stays in RTS
    /// with receive 901 still posted.
    pub fn expect_fatal_error(
        &self,
        op: SendOp,
        sges: &[Sge],
        flags: SendFlags,
        status: WcStatus,
        peer_fails: bool,
    ) -> Outcome {
        let (a, b) = (&self.a, &self.b);
        let tail = self.config.mr_len - 8;
        a.post_recv_at(900, 0, 8)?;
        b.post_recv_at(901, 0, 8)?;
        let src = [a.sge(0, 8)?];
        let wrs = [
            SendWr::new(1, op, sges).with_flags(flags),
            SendWr::new(2, b.write_op(tail), &src),
            SendWr::new(3, SendOp::Send, &src).with_flags(SendFlags::empty()),
        ];
        a.qp.post_send(&wrs)?;
        expect_error_then_flush(&a.send_cq, a.qpn(), 1, status, &[2, 3])?;
        check_eq!(a.state()?, QpState::Err, "requester state after {status}");
        a.expect_recv_flushed(&[900])?;
        if peer_fails {
            b.wait_state(QpState::Err)?;
            b.expect_recv_flushed(&[901])?;
        } else {
            check_eq!(
                b.state()?,
                QpState::Rts,
                "responder state after a local error"
            );
            poll_exact(&b.recv_cq, 0)?;
        }
        check_bytes(&b.bytes(tail, 8)?, &[0; 8], "target of the flushed WRITE")?;
        a.qp.post_send(&[SendWr::new(4, b.write_op(tail), &src)])?;
        a.expect_send_flushed(&[4])?;
        check_bytes(
            &b.bytes(tail, 8)?,
            &[0; 8],
            "target of the WRITE posted in ERR",
        )
    }

    /// Another connected QP pair on the same PDs, CQs and (for `b`) SRQ: `(qp on a, qp on b)`.
    pub fn connect_another(&self) -> Result<(C::Qp, C::Qp), Stop> {
        let qa = self.a.ctx.create_qp(
            &self.a.pd,
            &self.a.send_cq,
            &self.a.recv_cq,
            self.a.srq.as_ref(),
            &qp_init(&self.config),
        )?;
        let qb = self.b.ctx.create_qp(
            &self.b.pd,
            &self.b.send_cq,
            &self.b.recv_cq,
            self.b.srq.as_ref(),
            &qp_init(&self.config),
        )?;
        connect_qps(&qa, 0x0000_2000, &qb, 0x0000_3000, &self.config)?;
        Ok((qa, qb))
    }
}

fn default_pair_config(dev_a: &DeviceAttr, dev_b: &DeviceAttr) -> PairConfig {
    let defaults = RcConnectOptions::default();
    let cap8 = |limit: u32, want: u8| u8::try_from(limit.min(u32::from(want))).unwrap_or(want);
    let opts = RcConnectOptions {
        max_rd_atomic: cap8(
            dev_a.max_qp_init_rd_atom.min(dev_b.max_qp_init_rd_atom),
            defaults.max_rd_atomic,
        ),
        max_dest_rd_atomic: cap8(
            dev_a.max_qp_rd_atom.min(dev_b.max_qp_rd_atom),
            defaults.max_dest_rd_atomic,
        ),
        ..defaults
    };
    let wr = dev_a.max_qp_wr.min(dev_b.max_qp_wr).min(32);
    let sge = dev_a.max_sge.min(dev_b.max_sge).min(4);
    PairConfig {
        opts_a: opts,
        opts_b: opts,
        cap: QpCap {
            max_send_wr: wr,
            max_recv_wr: wr,
            max_send_sge: sge,
            max_recv_sge: sge,
            max_inline_data: dev_a.max_inline_data.min(dev_b.max_inline_data).min(64),
        },
        cqe: DEFAULT_CQE,
        mr_len: 64 * 1024,
        mr_access: all_remote(),
        srq_b: None,
        recv_channel: false,
        sq_sig_all: false,
    }
}

fn make_side<C: Context>(
    ctx: C,
    dev: DeviceAttr,
    config: &PairConfig,
    with_srq: bool,
    psn: u32,
) -> Result<Side<C>, Stop> {
    let pd = ctx.alloc_pd()?;
    let mr = ctx.alloc_mr(&pd, config.mr_len, config.mr_access)?;
    let channel = if config.recv_channel {
        Some(ctx.create_comp_channel()?)
    } else {
        None
    };
    let send_cq = ctx.create_cq(config.cqe, None)?;
    let recv_cq = ctx.create_cq(config.cqe, channel.as_ref())?;
    let srq = match (with_srq, config.srq_b) {
        (true, Some(attr)) => Some(needs(ctx.create_srq(&pd, &attr), "SRQ")?),
        _ => None,
    };
    let qp = ctx.create_qp(&pd, &send_cq, &recv_cq, srq.as_ref(), &qp_init(config))?;
    Ok(Side {
        ctx,
        dev,
        pd,
        mr,
        qp,
        send_cq,
        recv_cq,
        channel,
        srq,
        psn,
    })
}

fn qp_init(config: &PairConfig) -> QpInitAttr {
    QpInitAttr {
        sq_sig_all: config.sq_sig_all,
        ..QpInitAttr::rc(config.cap)
    }
}

/// Connects `qa` (options `opts_a`, sending from `psn_a`) and `qb` (`opts_b`, from `psn_b`)
/// to each other with [`verbs_api::connect_rc`], after exchanging endpoints.
fn connect_qps<Q: QueuePair>(
    qa: &Q,
    psn_a: u32,
    qb: &Q,
    psn_b: u32,
    config: &PairConfig,
) -> Outcome {
    let ep_a = qa.endpoint(psn_a)?;
    let ep_b = qb.endpoint(psn_b)?;
    verbs_api::connect_rc(qa, psn_a, &ep_b, &config.opts_a)
        .map_err(|e| failure(format!("connect_rc of side a: {e}")))?;
    verbs_api::connect_rc(qb, psn_b, &ep_a, &config.opts_b)
        .map_err(|e| failure(format!("connect_rc of side b: {e}")))?;
    Ok(())
}

/// Polls exactly one completion from `cq` (bounded wait; no second one may be there).
pub fn poll_one<Q: CompletionQueue>(cq: &Q) -> Result<WorkCompletion, Stop> {
    let wcs = poll_exact(cq, 1)?;
    wcs.first()
        .copied()
        .ok_or_else(|| failure("poll_exact returned no completion"))
}

/// Checks a completion's `wr_id`, `status` and `qp_num`: all that is valid on an error
/// completion (rc-transport.md §6.1).
pub fn check_status(wc: &WorkCompletion, wr_id: u64, status: WcStatus, qpn: u32) -> Outcome {
    check_eq!(wc.wr_id, wr_id, "wr_id of {wc:?}");
    check_eq!(wc.status, status, "status of wr_id {wr_id}");
    check_eq!(wc.qp_num, qpn, "qp_num of wr_id {wr_id}");
    Ok(())
}

/// Checks a successful send-side completion: `wr_id`, status, `opcode`, `byte_len` (the WR's
/// total length, rc-transport.md §6.2) and `qp_num`.
pub fn check_success(
    wc: &WorkCompletion,
    wr_id: u64,
    opcode: WcOpcode,
    byte_len: u32,
    qpn: u32,
) -> Outcome {
    check_status(wc, wr_id, WcStatus::Success, qpn)?;
    check_eq!(wc.opcode, opcode, "opcode of wr_id {wr_id}");
    check_eq!(wc.byte_len, byte_len, "byte_len of wr_id {wr_id}");
    Ok(())
}

/// Checks a successful receive completion: `wr_id`, status, `opcode`, `byte_len`, `qp_num`
/// (the receiving QP), the immediate data with `WITH_IMM` set exactly when `imm` is some, and
/// no `WITH_INV`.
///
/// Not checked exactly, because the verbs contract leaves them open for RC: `src_qp` ("UD
/// only") must be 0 (rxe) or the sender's QPN (what the emulator and some HCAs report); the
/// `GRH` flag is ignored (rxe sets it on every receive, RoCE HCAs set it as their CQE says;
/// DIVERGENCES.md #7).
pub fn check_recv(
    wc: &WorkCompletion,
    wr_id: u64,
    opcode: WcOpcode,
    byte_len: u32,
    imm: Option<u32>,
    qpn: u32,
    src_qpn: u32,
) -> Outcome {
    check_success(wc, wr_id, opcode, byte_len, qpn)?;
    let flags = wc.wc_flags.difference(WcFlags::GRH);
    let want = if imm.is_some() {
        WcFlags::WITH_IMM
    } else {
        WcFlags::empty()
    };
    check_eq!(flags, want, "wc_flags (less GRH) of wr_id {wr_id}");
    if let Some(imm) = imm {
        check_eq!(wc.imm_data, imm, "imm_data of wr_id {wr_id}");
    }
    ensure!(
        wc.src_qp == 0 || wc.src_qp == src_qpn,
        "src_qp of wr_id {wr_id}: {:#x}, neither 0 nor the sender's QPN {src_qpn:#x}",
        wc.src_qp
    );
    Ok(())
}

/// Waits (bounded by [`WAIT`]) until `qp` reports `state`.
pub fn wait_state<Q: QueuePair>(qp: &Q, state: QpState) -> Outcome {
    let deadline = Instant::now() + WAIT;
    loop {
        let now = qp.query()?.qp_state;
        if now == state {
            return Ok(());
        }
        if Instant::now() >= deadline {
            fail!(
                "QP {:#x} in {now}, not {state}, after {WAIT:?}",
                qp.qp_num()
            );
        }
        std::thread::yield_now();
    }
}

/// `len` bytes of a recognisable pattern seeded by `seed` (no two seeds alike at any offset).
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i >> 8) as u8))
        .collect()
}

/// How many times the RNR cases poll an empty CQ while the responder has no receive: on the
/// emulator each empty poll lets virtual time reach the next RNR timer, so this is 32 RNR
/// rounds, far more than any finite `rnr_retry` (7 is infinite, §3.7).
pub const RNR_ROUNDS: usize = 32;

/// Polls `cq` [`RNR_ROUNDS`] times expecting nothing.
pub fn expect_nothing_for_a_while<Q: CompletionQueue>(cq: &Q, what: &str) -> Outcome {
    let mut out = [WorkCompletion::default(); 1];
    for round in 0..RNR_ROUNDS {
        let n = cq.poll(&mut out)?;
        ensure!(
            n == 0,
            "{what}: completion after {round} empty polls: {:?}",
            out[0]
        );
        std::thread::yield_now();
    }
    Ok(())
}

/// Polls exactly `1 + flushed.len()` completions from `cq`: `wr_id` with `status`, then the
/// flushes of `flushed` in order, all on QP `qpn`.
pub fn expect_error_then_flush<Q: CompletionQueue>(
    cq: &Q,
    qpn: u32,
    wr_id: u64,
    status: WcStatus,
    flushed: &[u64],
) -> Outcome {
    let wcs = poll_exact(cq, 1 + flushed.len())?;
    let (first, rest) = wcs
        .split_first()
        .ok_or_else(|| failure("poll_exact returned no completion"))?;
    check_status(first, wr_id, status, qpn)?;
    check_flushed(rest, flushed, qpn)
}

/// Compares two byte strings, reporting the first difference (not the whole buffers).
pub fn check_bytes(got: &[u8], want: &[u8], what: &str) -> Outcome {
    check_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(g, w)| g != w) {
        let end = (i + 8).min(got.len());
        fail!(
            "{what}: first difference at byte {i} of {}: got {:02x?}, want {:02x?}",
            got.len(),
            &got[i..end],
            &want[i..end]
        );
    }
    Ok(())
}
