//! Completion queues of the HCA (rc-transport.md §6.3): bounded FIFO of work completions,
//! overrun detection and one-shot notification arming.

use std::collections::VecDeque;

use verbs_api::{WcStatus, WorkCompletion};

use crate::ids::ChannelId;

/// One CQ.
#[derive(Clone, Debug)]
pub(crate) struct Cq {
    pub(crate) capacity: u32,
    entries: VecDeque<WorkCompletion>,
    pub(crate) overflowed: bool,
    /// Armed for one notification; `Some(true)` means solicited-only.
    armed: Option<bool>,
    pub(crate) channel: Option<ChannelId>,
    /// QPs that use this CQ.
    pub(crate) qp_refs: u32,
    /// Events delivered to the channel and not yet acknowledged.
    pub(crate) unacked_events: u32,
}

/// What pushing one completion did.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// Stored; no notification due.
    Stored,
    /// Stored, and the CQ was armed for it: notify the channel.
    Notify(ChannelId),
    /// The CQ is full (or already overran): the completion was lost and the CQ is now in error.
    Overflow,
}

impl Cq {
    pub(crate) fn new(capacity: u32, channel: Option<ChannelId>) -> Cq {
        Cq {
            capacity,
            entries: VecDeque::new(),
            overflowed: false,
            armed: None,
            channel,
            qp_refs: 0,
            unacked_events: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Appends `wc`. `solicited` says the completion is for a packet with SE set; error
    /// completions satisfy a solicited-only arm as well.
    pub(crate) fn push(&mut self, wc: WorkCompletion, solicited: bool) -> Pushed {
        if self.overflowed || self.entries.len() >= self.capacity as usize {
            self.overflowed = true;
            return Pushed::Overflow;
        }
        self.entries.push_back(wc);
        let due = match self.armed {
            Some(true) => solicited || wc.status != WcStatus::Success,
            Some(false) => true,
            None => false,
        };
        match (due, self.channel) {
            (true, Some(ch)) => {
                self.armed = None;
                Pushed::Notify(ch)
            }
            _ => Pushed::Stored,
        }
    }

    /// Moves completions into `out`; returns how many.
    pub(crate) fn poll(&mut self, out: &mut [WorkCompletion]) -> usize {
        let n = out.len().min(self.entries.len());
        for (slot, wc) in out.iter_mut().zip(self.entries.drain(..n)) {
            *slot = wc;
        }
        n
    }

    pub(crate) fn arm(&mut self, solicited_only: bool) {
        // A later NEXT_COMP arm widens an earlier SOLICITED one, never the reverse.
        self.armed = Some(matches!(self.armed, Some(true) | None) && solicited_only);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wc(id: u64) -> WorkCompletion {
        WorkCompletion {
            wr_id: id,
            ..WorkCompletion::default()
        }
    }

    #[test]
    fn overflow_loses_entry_and_sticks() {
        let mut cq = Cq::new(2, None);
        assert_eq!(cq.push(wc(1), false), Pushed::Stored);
        assert_eq!(cq.push(wc(2), false), Pushed::Stored);
        assert_eq!(cq.push(wc(3), false), Pushed::Overflow);
        let mut out = [WorkCompletion::default(); 4];
        assert_eq!(cq.poll(&mut out), 2);
        assert_eq!(cq.push(wc(4), false), Pushed::Overflow);
    }

    #[test]
    fn arming_is_one_shot_and_solicited_filters() {
        let ch = ChannelId(0);
        let mut cq = Cq::new(8, Some(ch));
        assert_eq!(cq.push(wc(1), false), Pushed::Stored);
        cq.arm(true);
        assert_eq!(cq.push(wc(2), false), Pushed::Stored);
        assert_eq!(cq.push(wc(3), true), Pushed::Notify(ch));
        assert_eq!(cq.push(wc(4), true), Pushed::Stored);
        cq.arm(false);
        assert_eq!(cq.push(wc(5), false), Pushed::Notify(ch));
        cq.arm(true);
        let err = WorkCompletion {
            status: WcStatus::RemAccessErr,
            ..wc(6)
        };
        assert_eq!(cq.push(err, false), Pushed::Notify(ch));
    }
}
