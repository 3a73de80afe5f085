//! The verbs objects of an emulated device — PD, MR, completion channel, CQ, SRQ, QP, AH, MW —
//! written once over a [`Port`].
//!
//! Handles keep their parents alive (a QP holds its PD, CQs and SRQ, an MR or AH its PD; every
//! handle holds its context); an explicitly destroyed handle fails every later call with
//! `ErrorKind::Destroyed`, and dropping the last clone of a live one destroys it.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant as WallClock};

use emu_proto::{AhId, ChannelId, CqId, MrInfo, PdId, SrqId, Stats};
use mr_region::Region;
use verbs_api::{
    AccessFlags, Endpoint, Error, MwType, PostError, QpAttr, QpAttrMask, QpType, RecvWr, Result,
    SendWr, SrqAttr, WorkCompletion,
};

use crate::channel::ChannelShared;
use crate::context::{Context, check_alive};
use crate::port::{Idle, Port, Waiting};

/// Most empty polls a waiting helper ([`Cq::next_completion`]) makes.
const WAIT_STEPS: usize = 100_000;

/// Destroys an object on drop unless it was destroyed explicitly.
macro_rules! drop_destroys {
    ($inner:ident, |$st:ident, $this:ident| $body:expr) => {
        impl<P: Port> Drop for $inner<P> {
            fn drop(&mut self) {
                let $this = &*self;
                if $this.alive.swap(false, Ordering::AcqRel) {
                    let _ = $this.ctx.command(|$st, _| $body);
                }
            }
        }
    };
}

// ---- PD ------------------------------------------------------------------------------------

#[derive(Debug)]
pub(crate) struct PdInner<P: Port> {
    pub(crate) ctx: Context<P>,
    pub(crate) id: PdId,
    pub(crate) alive: AtomicBool,
}
drop_destroys!(PdInner, |st, this| st.hca.dealloc_pd(this.id));

/// A protection domain of an emulated device.
#[derive(Clone, Debug)]
pub struct Pd<P: Port>(pub(crate) Arc<PdInner<P>>);

impl<P: Port> verbs_api::ProtectionDomain for Pd<P> {
    fn handle(&self) -> u32 {
        self.0.id.0
    }

    fn destroy(&self) -> Result<()> {
        let this = &self.0;
        this.ctx.query_live(&this.alive, "PD", |st| {
            st.hca.dealloc_pd(this.id)?;
            this.alive.store(false, Ordering::Release);
            Ok(())
        })
    }
}

// ---- AH ------------------------------------------------------------------------------------

#[derive(Debug)]
pub(crate) struct AhInner<P: Port> {
    pub(crate) ctx: Context<P>,
    pub(crate) id: AhId,
    pub(crate) alive: AtomicBool,
    pub(crate) _pd: Pd<P>,
}
drop_destroys!(AhInner, |st, this| st.hca.destroy_ah(this.id));

/// An address handle of an emulated device: where a UD send goes.
#[derive(Clone, Debug)]
pub struct Ah<P: Port>(pub(crate) Arc<AhInner<P>>);

impl<P: Port> verbs_api::AddressHandle for Ah<P> {
    fn handle(&self) -> u32 {
        self.0.id.0
    }

    fn destroy(&self) -> Result<()> {
        let this = &self.0;
        this.ctx.query_live(&this.alive, "AH", |st| {
            st.hca.destroy_ah(this.id)?;
            this.alive.store(false, Ordering::Release);
            Ok(())
        })
    }
}

// ---- MR ------------------------------------------------------------------------------------

#[derive(Debug)]
pub(crate) struct MrInner<P: Port> {
    pub(crate) ctx: Context<P>,
    pub(crate) info: MrInfo,
    pub(crate) region: Arc<Region>,
    pub(crate) alive: AtomicBool,
    pub(crate) _pd: Pd<P>,
}
drop_destroys!(MrInner, |st, this| {
    st.mem.remove(this.info.lkey);
    st.hca.dereg_mr(this.info.lkey)
});

/// A memory region of an emulated device; its bytes are owned by the emulator (heap or file
/// mapping) or by the caller (`reg_mr_raw`). Its `addr()` depends on the device's
/// [`crate::MrAddresses`].
#[derive(Clone, Debug)]
pub struct Mr<P: Port>(pub(crate) Arc<MrInner<P>>);

impl<P: Port> Mr<P> {
    /// `InvalidArgument` naming the access `what` if `offset + len` leaves the MR.
    fn out_of_bounds(&self, what: &str, offset: usize, len: usize) -> Error {
        Error::invalid(format!(
            "{what} {offset}+{len} outside MR of {} bytes",
            self.0.region.len()
        ))
    }
}

impl<P: Port> verbs_api::MemoryRegion for Mr<P> {
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

    /// Copies MR bytes at `offset` into `buf`. The port may drive the device first
    /// ([`Port::reading_memory`]), so that spinning on an MR byte moves the traffic it waits
    /// for.
    fn read(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        check_alive(&self.0.alive, "MR")?;
        self.0.ctx.reading_memory();
        self.0
            .region
            .read(offset, buf)
            .map_err(|_| self.out_of_bounds("read", offset, buf.len()))
    }

    fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        check_alive(&self.0.alive, "MR")?;
        self.0
            .region
            .write(offset, data)
            .map_err(|_| self.out_of_bounds("write", offset, data.len()))
    }

    fn destroy(&self) -> Result<()> {
        let this = &self.0;
        this.ctx.command_live(&this.alive, "MR", |st, _| {
            st.hca.dereg_mr(this.info.lkey)?;
            st.mem.remove(this.info.lkey);
            this.alive.store(false, Ordering::Release);
            Ok(())
        })
    }
}

// ---- completion channel --------------------------------------------------------------------

#[derive(Debug)]
pub(crate) struct ChannelInner<P: Port> {
    pub(crate) ctx: Context<P>,
    pub(crate) id: ChannelId,
    pub(crate) shared: Arc<ChannelShared>,
    pub(crate) alive: AtomicBool,
}
drop_destroys!(ChannelInner, |st, this| {
    st.channels.remove(&this.id);
    st.hca.destroy_comp_channel(this.id)
});

/// A completion channel of an emulated device. Its fd (`AsFd`/`AsRawFd`) is readable while
/// events are pending, so it can be registered with epoll, mio or tokio; it becomes readable
/// when the device delivers a notification of an armed CQ (see the backend for who drives
/// the device).
#[derive(Clone, Debug)]
pub struct Channel<P: Port>(pub(crate) Arc<ChannelInner<P>>);

impl<P: Port> verbs_api::CompletionChannel for Channel<P> {
    fn get_cq_event(&self) -> Result<Option<u32>> {
        check_alive(&self.0.alive, "completion channel")?;
        let shared = &self.0.shared;
        if let Some(cq) = shared.try_get() {
            return Ok(Some(cq));
        }
        self.0
            .ctx
            .wait_take(Waiting::Channel, |_| Ok(shared.try_get()))
    }

    /// Waits for the next event, driving the device as the backend does for a blocked
    /// application ([`Port::wait_channel`]). `timeout` is wall time.
    fn wait_cq_event(&self, timeout: Option<Duration>) -> Result<Option<u32>> {
        check_alive(&self.0.alive, "completion channel")?;
        self.0.ctx.wait_channel(&self.0.shared, timeout)
    }

    fn destroy(&self) -> Result<()> {
        let this = &self.0;
        this.ctx
            .query_live(&this.alive, "completion channel", |st| {
                st.hca.destroy_comp_channel(this.id)?;
                st.channels.remove(&this.id);
                this.alive.store(false, Ordering::Release);
                Ok(())
            })
    }
}

impl<P: Port> AsFd for Channel<P> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.shared.as_fd()
    }
}

impl<P: Port> AsRawFd for Channel<P> {
    fn as_raw_fd(&self) -> RawFd {
        self.0.shared.as_raw_fd()
    }
}

// ---- CQ ------------------------------------------------------------------------------------

#[derive(Debug)]
pub(crate) struct CqInner<P: Port> {
    pub(crate) ctx: Context<P>,
    pub(crate) id: CqId,
    pub(crate) alive: AtomicBool,
    pub(crate) _channel: Option<Channel<P>>,
}
drop_destroys!(CqInner, |st, this| {
    let _ = st.hca.ack_cq_events(this.id, u32::MAX);
    st.hca.destroy_cq(this.id)
});

/// A completion queue of an emulated device: poll it, or arm it and wait on its channel.
#[derive(Clone, Debug)]
pub struct Cq<P: Port>(pub(crate) Arc<CqInner<P>>);

impl<P: Port> Cq<P> {
    /// Polls until one completion arrives and returns it: the usual loop of a unit test.
    /// Between empty polls the port drives the device ([`Port::between_polls`]); in virtual
    /// time each empty poll lets the next timer deadline pass, so retransmissions and retry
    /// exhaustion take microseconds of wall time.
    ///
    /// Errors: `InvalidState` if the CQ is empty and the device is idle (nothing in flight,
    /// no timer armed: no completion can arrive unless another thread posts work), or if
    /// nothing arrived after 100 000 polls or the port's time limit (60 s of wall time), e.g.
    /// a QP retrying RNR NAKs forever; the errors of `CompletionQueue::poll`.
    pub fn next_completion(&self) -> Result<WorkCompletion> {
        let mut wc = [WorkCompletion::default(); 1];
        let start = WallClock::now();
        for _ in 0..WAIT_STEPS {
            if verbs_api::CompletionQueue::poll(self, &mut wc)? == 1 {
                return Ok(wc[0]);
            }
            match self.0.ctx.between_polls(start)? {
                Idle::Again => {}
                Idle::TimedOut => break,
                Idle::Idle => {
                    // Another thread may have delivered this CQ's completion between the poll
                    // above and the idle check; the device being idle now, one more poll
                    // settles it.
                    if verbs_api::CompletionQueue::poll(self, &mut wc)? == 1 {
                        return Ok(wc[0]);
                    }
                    return Err(Error::state(
                        "CQ is empty and the fabric is idle: no completion can arrive",
                    ));
                }
            }
        }
        Err(Error::state("no completion arrived"))
    }
}

impl<P: Port> verbs_api::CompletionQueue for Cq<P> {
    fn handle(&self) -> u32 {
        self.0.id.0
    }

    fn capacity(&self) -> u32 {
        let this = &self.0;
        this.ctx
            .query_live(&this.alive, "CQ", |st| {
                Ok(st.hca.cq_capacity(this.id).unwrap_or(0))
            })
            .unwrap_or(0)
    }

    /// Takes up to `out.len()` completions. An empty CQ lets the port drive the device as for
    /// a waiting application ([`Port::wait_take`]) and is polled again.
    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        let this = &self.0;
        let n = this.ctx.wait_take(Waiting::Cq, |st| {
            check_alive(&this.alive, "CQ")?;
            match st.hca.poll_cq(this.id, out)? {
                0 if !out.is_empty() => Ok(None),
                n => Ok(Some(n)),
            }
        })?;
        Ok(n.unwrap_or(0))
    }

    fn req_notify(&self, solicited_only: bool) -> Result<()> {
        let this = &self.0;
        this.ctx.command_live(&this.alive, "CQ", |st, _| {
            st.hca.req_notify_cq(this.id, solicited_only)
        })
    }

    fn ack_events(&self, n: u32) {
        let this = &self.0;
        let _ = this
            .ctx
            .query_live(&this.alive, "CQ", |st| st.hca.ack_cq_events(this.id, n));
    }

    /// Resizes the CQ. Work the device has already made ready to send goes out first
    /// ([`Port::flush`]), so that completions a NIC would have written by now — a UD or UC send
    /// completes once its packets leave — count against the new size (`ibv_resize_cq` fails
    /// with `EINVAL` below the completions the CQ holds).
    fn resize(&self, cqe: u32) -> Result<()> {
        let this = &self.0;
        check_alive(&this.alive, "CQ")?;
        this.ctx.flush()?;
        this.ctx
            .query_live(&this.alive, "CQ", |st| st.hca.resize_cq(this.id, cqe))
    }

    fn destroy(&self) -> Result<()> {
        let this = &self.0;
        this.ctx.query_live(&this.alive, "CQ", |st| {
            // Events still queued in the channel were never handed to the application, so
            // they do not hold the CQ (libibverbs waits only for the events it reported);
            // they go with it, or stay if the CQ cannot be destroyed.
            let channel = this._channel.as_ref().map(|ch| &ch.0.shared);
            let queued = channel.map_or(0, |ch| ch.queued_for(this.id.0));
            st.hca.ack_cq_events(this.id, queued)?;
            if let Err(e) = st.hca.destroy_cq(this.id) {
                for _ in 0..queued {
                    st.hca.cq_event_delivered(this.id);
                }
                return Err(e);
            }
            if let Some(ch) = channel {
                ch.discard(this.id.0);
            }
            this.alive.store(false, Ordering::Release);
            Ok(())
        })
    }
}

// ---- SRQ -----------------------------------------------------------------------------------

#[derive(Debug)]
pub(crate) struct SrqInner<P: Port> {
    pub(crate) ctx: Context<P>,
    pub(crate) id: SrqId,
    pub(crate) alive: AtomicBool,
    pub(crate) _pd: Pd<P>,
}
drop_destroys!(SrqInner, |st, this| st.hca.destroy_srq(this.id));

/// A shared receive queue of an emulated device.
#[derive(Clone, Debug)]
pub struct Srq<P: Port>(pub(crate) Arc<SrqInner<P>>);

impl<P: Port> verbs_api::SharedReceiveQueue for Srq<P> {
    fn handle(&self) -> u32 {
        self.0.id.0
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        let this = &self.0;
        let r = this.ctx.post_recv(|st| {
            if !this.alive.load(Ordering::Acquire) {
                return Err(PostError::new(0, Error::destroyed("SRQ")));
            }
            st.hca.post_srq_recv(this.id, wrs)
        });
        r.map_err(|e| PostError::new(0, e))?
    }

    fn query(&self) -> Result<SrqAttr> {
        let this = &self.0;
        this.ctx
            .query_live(&this.alive, "SRQ", |st| st.hca.query_srq(this.id))
    }

    fn arm_limit(&self, srq_limit: u32) -> Result<()> {
        let this = &self.0;
        this.ctx.query_live(&this.alive, "SRQ", |st| {
            st.hca.arm_srq_limit(this.id, srq_limit)
        })
    }

    fn destroy(&self) -> Result<()> {
        let this = &self.0;
        this.ctx.query_live(&this.alive, "SRQ", |st| {
            st.hca.destroy_srq(this.id)?;
            this.alive.store(false, Ordering::Release);
            Ok(())
        })
    }
}

// ---- QP ------------------------------------------------------------------------------------

#[derive(Debug)]
pub(crate) struct QpInner<P: Port> {
    pub(crate) ctx: Context<P>,
    pub(crate) qpn: u32,
    pub(crate) qp_type: QpType,
    pub(crate) alive: AtomicBool,
    pub(crate) _pd: Pd<P>,
    pub(crate) _send_cq: Cq<P>,
    pub(crate) _recv_cq: Cq<P>,
    pub(crate) _srq: Option<Srq<P>>,
}
drop_destroys!(QpInner, |st, this| st.hca.destroy_qp(this.qpn));

/// A queue pair of an emulated device. How posted work reaches the wire is the port's
/// progress model ([`Port::post_send`], [`Port::command`]).
#[derive(Clone, Debug)]
pub struct Qp<P: Port>(pub(crate) Arc<QpInner<P>>);

impl<P: Port> Qp<P> {
    /// This QP's transport counters (packets, retransmissions, NAKs, duplicates, drops).
    ///
    /// Errors: `Destroyed` after `destroy`.
    pub fn stats(&self) -> Result<Stats> {
        let this = &self.0;
        this.ctx.peek(|st| {
            check_alive(&this.alive, "QP")?;
            st.hca.qp_stats(this.qpn)
        })?
    }

    pub(crate) fn context(&self) -> &Context<P> {
        &self.0.ctx
    }

    /// `Destroyed` once the QP is destroyed: what a post finds first.
    fn check_post(&self) -> Result<(), PostError> {
        if self.0.alive.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(PostError::new(0, Error::destroyed("QP")))
        }
    }
}

impl<P: Port> verbs_api::QueuePair for Qp<P> {
    fn qp_num(&self) -> u32 {
        self.0.qpn
    }

    fn qp_type(&self) -> QpType {
        self.0.qp_type
    }

    fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        let this = &self.0;
        this.ctx.command_live(&this.alive, "QP", |st, now| {
            st.hca.modify_qp(now, this.qpn, attr, mask)
        })
    }

    fn query(&self) -> Result<QpAttr> {
        let this = &self.0;
        this.ctx
            .query_live(&this.alive, "QP", |st| st.hca.query_qp(this.qpn))
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        let qpn = self.0.qpn;
        let r = self.0.ctx.post_send(|st, now| {
            self.check_post()?;
            st.hca.post_send(now, qpn, wrs)
        });
        r.map_err(|e| PostError::new(0, e))?
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        let qpn = self.0.qpn;
        let r = self.0.ctx.post_recv(|st| {
            self.check_post()?;
            st.hca.post_recv(qpn, wrs)
        });
        r.map_err(|e| PostError::new(0, e))?
    }

    fn endpoint(&self, psn: u32) -> Result<Endpoint> {
        if psn > verbs_api::MAX_24BIT {
            return Err(Error::invalid("PSN is not a 24-bit number"));
        }
        let this = &self.0;
        this.ctx.query_live(&this.alive, "QP", |st| {
            let config = st.hca.config();
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
        this.ctx.command_live(&this.alive, "QP", |st, _| {
            st.hca.destroy_qp(this.qpn)?;
            this.alive.store(false, Ordering::Release);
            Ok(())
        })
    }
}

// ---- MW ------------------------------------------------------------------------------------

#[derive(Debug)]
pub(crate) struct MwInner<P: Port> {
    pub(crate) ctx: Context<P>,
    pub(crate) id: u32,
    pub(crate) mw_type: MwType,
    pub(crate) alive: AtomicBool,
    pub(crate) _pd: Pd<P>,
}
drop_destroys!(MwInner, |st, this| st.hca.dealloc_mw(this.id));

/// A memory window of an emulated device; it keeps its PD alive.
#[derive(Clone, Debug)]
pub struct Mw<P: Port>(pub(crate) Arc<MwInner<P>>);

impl<P: Port> verbs_api::MemoryWindow for Mw<P> {
    fn handle(&self) -> u32 {
        self.0.id
    }

    fn mw_type(&self) -> MwType {
        self.0.mw_type
    }

    /// The engine's current key; 0 once the window is destroyed.
    fn rkey(&self) -> u32 {
        let this = &self.0;
        this.ctx
            .query_live(&this.alive, "MW", |st| st.hca.mw_rkey(this.id))
            .unwrap_or(0)
    }

    fn destroy(&self) -> Result<()> {
        let this = &self.0;
        this.ctx.command_live(&this.alive, "MW", |st, _| {
            st.hca.dealloc_mw(this.id)?;
            this.alive.store(false, Ordering::Release);
            Ok(())
        })
    }
}
