//! Routing asynchronous events to the context that owns their object.
//!
//! `ibv_get_async_event` is per context: an event about a QP, CQ or SRQ goes to the context that
//! created it; port and device events go to every context. Drivers keep one [`EventRouter`] per
//! device and feed it what [`crate::Hca::poll_event`] returns. This is bookkeeping only; it does
//! not block or signal.

use std::collections::{HashMap, VecDeque};

use verbs_api::{AsyncEvent, EventElement};

/// Per-context event queues of one device.
#[derive(Debug, Default)]
pub struct EventRouter {
    queues: HashMap<u64, VecDeque<AsyncEvent>>,
    owners: HashMap<EventElement, u64>,
    next: u64,
}

impl EventRouter {
    /// Opens a queue for a new context and returns the context's number.
    pub fn open(&mut self) -> u64 {
        self.next += 1;
        self.queues.insert(self.next, VecDeque::new());
        self.next
    }

    /// Forgets a closed context, its queue and what it owned.
    pub fn close(&mut self, ctx: u64) {
        self.queues.remove(&ctx);
        self.owners.retain(|_, owner| *owner != ctx);
    }

    /// Records that context `ctx` created `element`; a number reused later is overwritten.
    pub fn own(&mut self, element: EventElement, ctx: u64) {
        self.owners.insert(element, ctx);
    }

    /// The next event of context `ctx`, if any.
    pub fn pop(&mut self, ctx: u64) -> Option<AsyncEvent> {
        self.queues.get_mut(&ctx)?.pop_front()
    }

    /// Queues `e` for its owner (QP, CQ, SRQ) or for every context (port, device). An event
    /// whose object no open context owns is dropped.
    pub fn route(&mut self, e: AsyncEvent) {
        match e.element {
            EventElement::Port(_) | EventElement::Device => {
                for q in self.queues.values_mut() {
                    q.push_back(e);
                }
            }
            element => {
                let owner = self.owners.get(&element).copied();
                if let Some(q) = owner.and_then(|o| self.queues.get_mut(&o)) {
                    q.push_back(e);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use verbs_api::AsyncEventKind;

    #[test]
    fn events_reach_only_their_owner_and_ports_reach_all() {
        let mut r = EventRouter::default();
        let (a, b) = (r.open(), r.open());
        r.own(EventElement::Qp(0x11), a);
        let qp_event = AsyncEvent {
            kind: AsyncEventKind::SqDrained,
            element: EventElement::Qp(0x11),
        };
        r.route(qp_event);
        let port = AsyncEvent {
            kind: AsyncEventKind::PortActive,
            element: EventElement::Port(1),
        };
        r.route(port);
        assert_eq!(r.pop(b), Some(port));
        assert_eq!(r.pop(b), None);
        assert_eq!(r.pop(a), Some(qp_event));
        assert_eq!(r.pop(a), Some(port));
        r.close(a);
        r.route(qp_event);
        assert_eq!(r.pop(a), None);
        assert_eq!(r.pop(b), None);
    }
}
