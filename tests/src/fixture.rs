//! What cases run against: the backend's devices ([`Env`]), a ready-made set of objects
//! ([`Fixture`]) and helpers that walk QPs through states, poll with a bounded wait, check flush
//! completions and wait on file descriptors.
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
    PortAttr, Provider, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QueuePair,
    RcConnectOptions, RecvWr, Result, SendOp, SendWr, WcStatus, WorkCompletion,
};

use crate::check::{Outcome, Stop, failure};
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
    let mut got = Vec::with_capacity(n);
    let mut buf = [WorkCompletion::default(); 16];
    let deadline = Instant::now() + WAIT;
    while got.len() < n {
        let want = (n - got.len()).min(buf.len());
        let k = cq.poll(&mut buf[..want])?;
        got.extend_from_slice(&buf[..k]);
        if k == 0 {
            if Instant::now() >= deadline {
                fail!(
                    "expected {n} completions, got {} after {WAIT:?}: {got:?}",
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
