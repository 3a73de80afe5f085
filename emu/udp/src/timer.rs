//! The progress thread's deadline timer: a `timerfd` on `CLOCK_MONOTONIC`, in the thread's
//! poller, so that the thread wakes at an engine deadline with microsecond precision.
//!
//! `epoll_wait` (under [`mio::Poll::poll`]) counts its timeout in whole milliseconds and
//! rounds a shorter one up: without this timer every deadline under 1 ms (selective repeat's
//! probe, its minimum probe interval) fires after about 1.09 ms. The poll timeout stays as
//! the backstop; the timer only makes the wait end sooner.
//!
//! The engine's clock is the time since the device's epoch (a [`std::time::Instant`], which
//! on Linux reads `CLOCK_MONOTONIC`). [`Timer::new`] maps it to `CLOCK_MONOTONIC` once; the
//! timer is armed to the absolute time (`TFD_TIMER_ABSTIME`), so a deadline armed once needs
//! no rearming however many waits it spans, and a deadline already passed fires at once.

use std::io;
use std::time::Instant as StdInstant;

use emu_proto::Instant;
use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};
use rustix::fd::{AsRawFd, OwnedFd};
use rustix::time::{
    ClockId, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec, clock_gettime,
    timerfd_create, timerfd_settime,
};

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// What the timer must do before a wait, given the deadline the thread waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arm {
    /// The timer already runs to this deadline (or has none and needs none): no syscall.
    Keep,
    /// Arm the timer to expire at this engine time.
    Set(Instant),
    /// Disarm the timer: the thread waits for no deadline.
    Clear,
}

/// The arming decisions, without the file descriptor: which deadline the timer runs to.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Plan {
    /// The deadline the timer is armed to and has not yet reported (`None`: disarmed or
    /// expired).
    armed: Option<Instant>,
}

impl Plan {
    /// The change that makes the timer run to `deadline` (`None`: no deadline). The timer
    /// is rearmed only when `deadline` differs from the armed one; an expired timer (see
    /// [`Plan::expired`]) counts as disarmed, so a deadline it reported early is armed anew.
    pub(crate) fn update(&mut self, deadline: Option<Instant>) -> Arm {
        if deadline == self.armed {
            return Arm::Keep;
        }
        self.armed = deadline;
        match deadline {
            Some(at) => Arm::Set(at),
            None => Arm::Clear,
        }
    }

    /// The timer reported its expiry: it no longer runs.
    pub(crate) fn expired(&mut self) {
        self.armed = None;
    }

    /// A failed arming: whatever the timer runs to is unknown, so the next update rearms.
    fn forget(&mut self) {
        self.armed = None;
    }
}

/// The absolute `CLOCK_MONOTONIC` time of engine time `at`, given `base`, the monotonic
/// time of the engine's epoch in nanoseconds. Never zero (a zero `it_value` disarms).
pub(crate) fn expiry(base: u64, at: Instant) -> Timespec {
    let nanos = base.saturating_add(at.as_nanos()).max(1);
    Timespec {
        tv_sec: i64::try_from(nanos / NANOS_PER_SEC).unwrap_or(i64::MAX),
        tv_nsec: i64::try_from(nanos % NANOS_PER_SEC).unwrap_or(0),
    }
}

/// Nanoseconds of a `Timespec` read from `CLOCK_MONOTONIC` (never negative).
fn timespec_nanos(t: Timespec) -> u64 {
    let secs = u64::try_from(t.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(t.tv_nsec).unwrap_or(0);
    secs.saturating_mul(NANOS_PER_SEC).saturating_add(nanos)
}

/// The progress thread's timer: a nonblocking `timerfd` registered with the thread's poller.
#[derive(Debug)]
pub(crate) struct Timer {
    fd: OwnedFd,
    /// `CLOCK_MONOTONIC` at the engine's epoch, in nanoseconds; rounded late (by the time
    /// between two clock reads), never early, so the timer never fires before the engine
    /// clock reaches the deadline.
    base: u64,
    plan: Plan,
    token: Token,
}

impl Timer {
    /// A disarmed timer for an engine clock that counts from `epoch`, registered with
    /// `registry` under `token`.
    pub(crate) fn new(epoch: StdInstant, registry: &Registry, token: Token) -> io::Result<Timer> {
        let fd = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        // The engine clock first, then CLOCK_MONOTONIC: the difference is at least the
        // epoch's monotonic time.
        let since = u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let now = timespec_nanos(clock_gettime(ClockId::Monotonic));
        let base = now.saturating_sub(since);
        registry.register(&mut SourceFd(&fd.as_raw_fd()), token, Interest::READABLE)?;
        Ok(Timer {
            fd,
            base,
            plan: Plan::default(),
            token,
        })
    }

    /// Makes the timer run to `deadline` (`None`: disarmed); a syscall only if the deadline
    /// changed. On error the timer's state is unknown and the next call rearms; the caller's
    /// poll timeout still bounds the wait.
    pub(crate) fn arm(&mut self, deadline: Option<Instant>) -> io::Result<()> {
        let value = match self.plan.update(deadline) {
            Arm::Keep => return Ok(()),
            Arm::Set(at) => expiry(self.base, at),
            Arm::Clear => Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
        };
        let spec = Itimerspec {
            it_interval: Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: value,
        };
        match timerfd_settime(&self.fd, TimerfdTimerFlags::ABSTIME, &spec) {
            Ok(_) => Ok(()),
            Err(e) => {
                self.plan.forget();
                Err(e.into())
            }
        }
    }

    /// The poller's token for this timer.
    pub(crate) fn token(&self) -> Token {
        self.token
    }

    /// The poller reported the timer readable: consume the expiry (so the descriptor is not
    /// readable again until the next one) and note that the timer no longer runs.
    pub(crate) fn expired(&mut self) {
        let mut count = [0u8; 8];
        // WouldBlock: a rearm since the event reset the count; nothing to consume.
        let _ = rustix::io::read(&self.fd, &mut count);
        self.plan.expired();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]

    use std::time::Duration;

    use mio::{Events, Poll};

    use super::*;

    fn at_micros(us: u64) -> Instant {
        Instant::from_nanos(us * 1_000)
    }

    #[test]
    fn a_sub_millisecond_deadline_expires_at_its_microsecond() {
        // Epoch at monotonic 5 s + 123 ns; a deadline 300 µs after it.
        let base = 5 * NANOS_PER_SEC + 123;
        let t = expiry(base, at_micros(300));
        assert_eq!(t.tv_sec, 5);
        assert_eq!(t.tv_nsec, 300_123);
        // Carries into seconds.
        let t = expiry(NANOS_PER_SEC - 100_000, at_micros(300));
        assert_eq!((t.tv_sec, t.tv_nsec), (1, 200_000));
        // Never the zero that disarms.
        let t = expiry(0, Instant::from_nanos(0));
        assert_eq!((t.tv_sec, t.tv_nsec), (0, 1));
    }

    #[test]
    fn the_timer_is_rearmed_only_when_the_deadline_changes() {
        let mut plan = Plan::default();
        assert_eq!(plan.update(None), Arm::Keep);
        assert_eq!(plan.update(Some(at_micros(300))), Arm::Set(at_micros(300)));
        assert_eq!(plan.update(Some(at_micros(300))), Arm::Keep);
        assert_eq!(plan.update(Some(at_micros(200))), Arm::Set(at_micros(200)));
        assert_eq!(plan.update(Some(at_micros(900))), Arm::Set(at_micros(900)));
        assert_eq!(plan.update(None), Arm::Clear);
        assert_eq!(plan.update(None), Arm::Keep);
    }

    #[test]
    fn an_expired_timer_is_armed_again_for_the_same_deadline() {
        let mut plan = Plan::default();
        assert_eq!(plan.update(Some(at_micros(300))), Arm::Set(at_micros(300)));
        plan.expired();
        // Nothing runs any more: no deadline needs no disarming...
        assert_eq!(plan.update(None), Arm::Keep);
        assert_eq!(plan.update(Some(at_micros(300))), Arm::Set(at_micros(300)));
        plan.expired();
        // ...and the same deadline is armed anew.
        assert_eq!(plan.update(Some(at_micros(300))), Arm::Set(at_micros(300)));
        plan.forget();
        assert_eq!(plan.update(Some(at_micros(300))), Arm::Set(at_micros(300)));
    }

    /// Waits (with a long backstop) and returns whether the timer's event came.
    fn timer_fired(poll: &mut Poll, timer: &mut Timer, backstop: Duration) -> bool {
        let mut events = Events::with_capacity(4);
        poll.poll(&mut events, Some(backstop)).expect("poll");
        let fired = events.iter().any(|e| e.token() == timer.token());
        if fired {
            timer.expired();
        }
        fired
    }

    #[test]
    fn a_passed_deadline_fires_at_once_and_a_disarmed_timer_never() {
        let epoch = StdInstant::now();
        let mut poll = Poll::new().expect("poller");
        let mut timer = Timer::new(epoch, poll.registry(), Token(7)).expect("timer");
        // Engine time 0 has passed.
        timer.arm(Some(Instant::from_nanos(0))).expect("arm");
        assert!(timer_fired(&mut poll, &mut timer, Duration::from_secs(60)));
        // Consumed: not readable again.
        assert!(!timer_fired(&mut poll, &mut timer, Duration::ZERO));
        // Armed 200 µs away, then disarmed (expired or not, the disarm resets it): nothing
        // is reported within a 20 ms wait.
        let now = u64::try_from(epoch.elapsed().as_nanos()).expect("elapsed");
        timer
            .arm(Some(Instant::from_nanos(now + 200_000)))
            .expect("arm");
        timer.arm(None).expect("disarm");
        assert!(!timer_fired(
            &mut poll,
            &mut timer,
            Duration::from_millis(20)
        ));
    }

    #[test]
    fn a_sub_millisecond_deadline_ends_the_wait() {
        let epoch = StdInstant::now();
        let mut poll = Poll::new().expect("poller");
        let mut timer = Timer::new(epoch, poll.registry(), Token(7)).expect("timer");
        let now = u64::try_from(epoch.elapsed().as_nanos()).expect("elapsed");
        timer
            .arm(Some(Instant::from_nanos(now + 300_000)))
            .expect("arm");
        // The event, not the (minute-long) backstop, ends the wait; no timing is asserted.
        assert!(timer_fired(&mut poll, &mut timer, Duration::from_secs(60)));
    }
}
