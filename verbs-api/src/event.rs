//! Asynchronous events (`ibv_async_event`, rc-transport.md §5.3).

use core::fmt;

/// Kind of asynchronous event, numbered as `ibv_event_type`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum AsyncEventKind {
    /// 0: a CQ overran; it cannot be used any more.
    CqErr = 0,
    /// 1: a QP hit a fatal error and moved to ERR.
    QpFatal = 1,
    /// 2: invalid request on a QP.
    QpReqErr = 2,
    /// 3: access violation on a QP.
    QpAccessErr = 3,
    /// 4: communication established (first packet received in RTR).
    CommEst = 4,
    /// 5: the send queue drained in SQD.
    SqDrained = 5,
    /// 8: device fatal error.
    DeviceFatal = 8,
    /// 9: port became active.
    PortActive = 9,
    /// 10: port went down.
    PortErr = 10,
    /// 14: SRQ error.
    SrqErr = 14,
    /// 15: an SRQ fell below its armed limit.
    SrqLimitReached = 15,
    /// 16: the last WQE of a QP attached to an SRQ was consumed after ERR.
    QpLastWqeReached = 16,
}

/// The object an asynchronous event is about.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum EventElement {
    /// A QP, by number.
    Qp(u32),
    /// A CQ, by handle.
    Cq(u32),
    /// An SRQ, by handle.
    Srq(u32),
    /// A port, by number.
    Port(u8),
    /// The device itself.
    Device,
}

/// One asynchronous event.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct AsyncEvent {
    /// What happened.
    pub kind: AsyncEventKind,
    /// To which object.
    pub element: EventElement,
}

impl fmt::Display for AsyncEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} on {:?}", self.kind, self.element)
    }
}
