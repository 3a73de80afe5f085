//! What differs between emulator backends, as seen from the verbs handles: how a call reaches
//! the device state, and how the device is driven while the application posts, polls or
//! blocks.
//!
//! Where datagrams go (a fabric, a socket) is the port's own business: the handles never see
//! a packet. Backend-specific extras (fault control, sockets, virtual time, capture) are
//! inherent methods of the port type, reachable from a [`crate::Context`] through `Deref`.

use std::fmt::Debug;
use std::time::{Duration, Instant as WallClock};

use emu_proto::Instant;
use verbs_api::Result;

use crate::channel::ChannelShared;
use crate::state::DeviceState;

/// What an application call found empty (see [`Port::wait_take`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Waiting {
    /// A CQ poll (`poll_cq`).
    Cq,
    /// An async event poll (`poll_async_event`).
    AsyncEvent,
    /// A nonblocking completion channel read (`get_cq_event`).
    Channel,
}

/// What a port says between two empty polls of a waiting helper such as
/// [`crate::Cq::next_completion`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Idle {
    /// Something may still arrive: poll again.
    Again,
    /// Nothing is in flight and no timer is armed: nothing can arrive unless another thread
    /// posts work.
    Idle,
    /// The wait went on too long.
    TimedOut,
}

/// One device as a backend exposes it to the verbs handles: the backend's device type.
///
/// Every method runs its closure with the device state locked, exactly once, and returns its
/// result; `Err` only if the device is gone (its state cannot be reached).
pub trait Port: Clone + Debug + Send + Sync + 'static {
    /// The device's name (`ibv_get_device_name`).
    fn device_name(&self) -> String;

    /// Runs a command that may give the device work (make packets ready, move timers): modify,
    /// post a receive, register or destroy. `f` gets the device's current time. The port then
    /// drives the device as its progress model requires.
    fn command<R>(&self, f: impl FnOnce(&mut DeviceState, Instant) -> R) -> Result<R>;

    /// Runs a `post_send`; like [`command`](Self::command) unless the backend batches posts.
    fn post_send<R>(&self, f: impl FnOnce(&mut DeviceState, Instant) -> R) -> Result<R> {
        self.command(f)
    }

    /// Runs a `post_recv` (to a QP or an SRQ). Posting a receive makes no packet ready and
    /// moves no timer (a responder waiting for a receive NAKs, and the peer retries on its
    /// own timer), so a backend may run it as a call that gives the device no work; what it
    /// completes (a receive flushed on a QP in the error state) is delivered as after any
    /// call. Default: a [`command`](Self::command).
    fn post_recv<R>(&self, f: impl FnOnce(&mut DeviceState) -> R) -> Result<R> {
        self.command(|st, _| f(st))
    }

    /// Sends what the device has made ready now, in the caller's thread, waiting for a pass
    /// another thread is running, so that the completions such sends produce (a UD or UC send
    /// completes once its packets are out) exist when this returns. Default: an empty command.
    fn flush(&self) -> Result<()> {
        self.command(|_, _| ())
    }

    /// Runs a call that gives the device no work by itself: a query, creating or destroying
    /// an object that moves no packet, polling.
    fn query<R>(&self, f: impl FnOnce(&mut DeviceState) -> R) -> Result<R>;

    /// Looks at the device without driving it (counters, opening a context).
    fn peek<R>(&self, f: impl FnOnce(&mut DeviceState) -> R) -> Result<R>;

    /// Takes something the application waits for (`what`): calls `take`, and if it returns
    /// `None` drives the device as a waiting application does in this backend (in virtual
    /// time, lets the next timer fire; on a socket, runs a progress pass) and may call it
    /// again.
    fn wait_take<R>(
        &self,
        what: Waiting,
        take: impl FnMut(&mut DeviceState) -> Result<Option<R>>,
    ) -> Result<Option<R>>;

    /// Blocks on completion channel `channel` for its next event, up to `timeout` of wall
    /// time (forever with `None`), driving the device meanwhile as the backend requires.
    fn wait_channel(
        &self,
        channel: &ChannelShared,
        timeout: Option<Duration>,
    ) -> Result<Option<u32>>;

    /// The application reads MR memory (spinning on a byte is how `ib_write_lat` waits): a
    /// chance to drive the device. Default: nothing.
    fn reading_memory(&self) {}

    /// Between two empty polls of a waiting helper that started at `start`: whether anything
    /// can still arrive (sleeping meanwhile if the backend needs wall time to pass).
    fn between_polls(&self, start: WallClock) -> Result<Idle>;
}
