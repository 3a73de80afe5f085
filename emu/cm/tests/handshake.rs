//! Two CMs through a seeded lossy, duplicating, reordering link in virtual time: the
//! handshake, rejects, retries, disconnects and timewait at the MAD level.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use emu_cm::wire::{CmMad, MAD_LEN, Mad, MadHeaderRepr, attr, method};
use emu_cm::{
    AcceptParams, Cm, CmConfig, CmEvent, CmId, ConnState, ConnectParams, Instant, MadAddr, ib_time,
    reason, service_id,
};
use proptest::prelude::*;

const SERVICE: u64 = service_id(0x0106, 20000);
const A_GID: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 0, 0, 1];
const B_GID: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 0, 0, 2];
const RESP: u8 = 10;
const ACK: u8 = 10;
const RETRIES: u8 = 5;

fn gsi(gid: [u8; 16]) -> MadAddr {
    MadAddr { gid, qpn: 1 }
}

/// What the link does to MADs (a tiny seeded model: xorshift draws).
#[derive(Clone, Debug, Default)]
struct Faults {
    loss: f64,
    dup: f64,
    /// Extra delay drawn uniformly up to this: MADs overtake each other.
    jitter: Duration,
    /// Drop the first MAD with this attribute ID (per direction given by `drop_from_a`).
    drop_first: Option<(u16, bool)>,
    /// Drop everything A sends.
    cut_a: bool,
}

#[derive(Copy, Clone, PartialEq, Eq, Debug)]
enum Side {
    A,
    B,
}

/// How each side's user reacts to events.
#[derive(Clone, Debug)]
struct Users {
    accept: bool,
    /// Accept only after this long (a slow server: MRAs).
    accept_after: Duration,
    reject_pd: Vec<u8>,
}

impl Default for Users {
    fn default() -> Self {
        Users {
            accept: true,
            accept_after: Duration::ZERO,
            reject_pd: Vec::new(),
        }
    }
}

struct Net {
    a: Cm,
    b: Cm,
    now: Instant,
    flight: Vec<(Instant, u64, Side, MadAddr, Vec<u8>)>,
    seq: u64,
    rng: u64,
    faults: Faults,
    users: Users,
    dropped_first: bool,
    ev_a: Vec<(Instant, CmEvent)>,
    ev_b: Vec<(Instant, CmEvent)>,
    sent_a: Vec<(Instant, u16)>,
    sent_b: Vec<(Instant, u16)>,
    to_accept: Vec<(Instant, CmId)>,
}

impl Net {
    fn new(seed: u64, faults: Faults) -> Net {
        let cfg = |gid, guid| CmConfig {
            local_gid: gid,
            ca_guid: guid,
            seed,
        };
        let mut b = Cm::new(cfg(B_GID, 0xB));
        b.listen(SERVICE).unwrap();
        Net {
            a: Cm::new(cfg(A_GID, 0xA)),
            b,
            now: Instant::ZERO,
            flight: Vec::new(),
            seq: 0,
            rng: seed | 1,
            faults,
            users: Users::default(),
            dropped_first: false,
            ev_a: Vec::new(),
            ev_b: Vec::new(),
            sent_a: Vec::new(),
            sent_b: Vec::new(),
            to_accept: Vec::new(),
        }
    }

    fn draw(&mut self) -> f64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (self.rng >> 11) as f64 / (1u64 << 53) as f64
    }

    fn params() -> ConnectParams {
        ConnectParams {
            service_id: SERVICE,
            remote: gsi(B_GID),
            local_qpn: 0x11,
            starting_psn: 0x123,
            reliable: true,
            responder_resources: 4,
            initiator_depth: 4,
            path_mtu: 3,
            retry_count: 7,
            rnr_retry_count: 7,
            local_ack_timeout: ACK,
            cm_response_timeout: RESP,
            max_cm_retries: RETRIES,
            private_data: b"hello".to_vec(),
        }
    }

    fn connect(&mut self) -> CmId {
        let id = self.a.connect(self.now, Net::params()).unwrap();
        self.pump();
        id
    }

    fn cm(&mut self, side: Side) -> &mut Cm {
        match side {
            Side::A => &mut self.a,
            Side::B => &mut self.b,
        }
    }

    /// Moves MADs from both CMs onto the link and reacts to events, until quiet.
    fn pump(&mut self) {
        loop {
            let mut busy = false;
            for side in [Side::A, Side::B] {
                while let Some((to, mad)) = self.cm(side).poll_transmit() {
                    busy = true;
                    assert_eq!(mad.len(), MAD_LEN);
                    assert_eq!(to.qpn, 1);
                    self.launch(side, mad);
                }
                while let Some(ev) = self.cm(side).poll_event() {
                    busy = true;
                    self.react(side, ev);
                }
            }
            let due: Vec<CmId> = self
                .to_accept
                .iter()
                .filter(|(t, _)| *t <= self.now)
                .map(|(_, id)| *id)
                .collect();
            self.to_accept.retain(|(t, _)| *t > self.now);
            for id in due {
                busy = true;
                self.accept(id);
            }
            if !busy {
                return;
            }
        }
    }

    fn accept(&mut self, id: CmId) {
        let p = AcceptParams {
            local_qpn: 0x22,
            starting_psn: 0x456,
            responder_resources: 2,
            initiator_depth: 2,
            rnr_retry_count: 6,
            private_data: b"welcome".to_vec(),
        };
        self.b.accept(self.now, id, p).unwrap();
    }

    fn react(&mut self, side: Side, ev: CmEvent) {
        let now = self.now;
        match (&ev, side) {
            (CmEvent::ReqReceived { id, .. }, Side::B) if self.users.accept => {
                self.to_accept.push((now + self.users.accept_after, *id));
            }
            (CmEvent::ReqReceived { id, .. }, Side::B) => {
                let pd = self.users.reject_pd.clone();
                self.b.reject(now, *id, reason::CONSUMER, &pd).unwrap();
            }
            (CmEvent::RepReceived { id, .. }, Side::A) => self.a.establish(now, *id).unwrap(),
            _ => {}
        }
        match side {
            Side::A => self.ev_a.push((now, ev)),
            Side::B => self.ev_b.push((now, ev)),
        }
    }

    fn launch(&mut self, from: Side, mad: Vec<u8>) {
        let attr_id = Mad::new_checked(&mad[..]).unwrap().attr_id();
        match from {
            Side::A => self.sent_a.push((self.now, attr_id)),
            Side::B => self.sent_b.push((self.now, attr_id)),
        }
        if let Some((a, from_a)) = self.faults.drop_first {
            if !self.dropped_first && a == attr_id && from_a == (from == Side::A) {
                self.dropped_first = true;
                return;
            }
        }
        if self.faults.cut_a && from == Side::A {
            return;
        }
        let copies = if self.draw() < self.faults.dup { 2 } else { 1 };
        for _ in 0..copies {
            if self.draw() < self.faults.loss {
                continue;
            }
            let jitter = self.faults.jitter.as_nanos() as f64 * self.draw();
            let at = self.now + Duration::from_micros(5) + Duration::from_nanos(jitter as u64);
            let (to, src) = match from {
                Side::A => (Side::B, gsi(A_GID)),
                Side::B => (Side::A, gsi(B_GID)),
            };
            self.seq += 1;
            self.flight.push((at, self.seq, to, src, mad.clone()));
        }
    }

    /// Runs until nothing is in flight and no timer is armed, or `limit` of virtual time.
    fn run(&mut self, limit: Duration) {
        let end = self.now + limit;
        loop {
            self.pump();
            let next_mad = self.flight.iter().map(|f| (f.0, f.1)).min();
            let timers = [self.a.poll_timeout(), self.b.poll_timeout()];
            let next_timer = timers.into_iter().flatten().min();
            let next_accept = self.to_accept.iter().map(|(t, _)| *t).min();
            let next = [next_mad.map(|m| m.0), next_timer, next_accept]
                .into_iter()
                .flatten()
                .min();
            let Some(t) = next.filter(|t| *t <= end) else {
                return;
            };
            self.now = self.now.max(t);
            if let Some(m) = next_mad.filter(|m| m.0 <= self.now) {
                let i = self.flight.iter().position(|f| (f.0, f.1) == m).unwrap();
                let (_, _, to, src, mad) = self.flight.remove(i);
                let now = self.now;
                self.cm(to).handle_mad(now, src, &mad);
            }
            let now = self.now;
            self.a.handle_timeout(now);
            self.b.handle_timeout(now);
        }
    }

    fn count(events: &[(Instant, CmEvent)], f: impl Fn(&CmEvent) -> bool) -> usize {
        events.iter().filter(|(_, e)| f(e)).count()
    }

    fn established(&self) -> (usize, usize) {
        let is = |e: &CmEvent| matches!(e, CmEvent::Established { .. });
        (Net::count(&self.ev_a, is), Net::count(&self.ev_b, is))
    }

    fn b_id(&self) -> CmId {
        self.ev_b
            .iter()
            .find_map(|(_, e)| match e {
                CmEvent::ReqReceived { id, .. } => Some(*id),
                _ => None,
            })
            .unwrap()
    }

    fn sent(list: &[(Instant, u16)], attr_id: u16) -> usize {
        list.iter().filter(|(_, a)| *a == attr_id).count()
    }
}

const LONG: Duration = Duration::from_secs(60);

fn mad_timeout() -> Duration {
    ib_time(RESP) + ib_time(ACK)
}

#[test]
fn handshake_carries_the_parameters() {
    let mut net = Net::new(1, Faults::default());
    let id = net.connect();
    net.run(LONG);
    assert_eq!(net.established(), (1, 1));
    let req = net
        .ev_b
        .iter()
        .find_map(|(_, e)| match e {
            CmEvent::ReqReceived { req, .. } => Some(req.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        (req.remote_qpn, req.starting_psn, req.path_mtu),
        (0x11, 0x123, 3)
    );
    assert_eq!(
        (req.service_id, req.remote, req.reliable),
        (SERVICE, gsi(A_GID), true)
    );
    assert_eq!(&req.private_data[..5], b"hello");
    assert_eq!(req.private_data.len(), 92);
    let rep = net
        .ev_a
        .iter()
        .find_map(|(_, e)| match e {
            CmEvent::RepReceived { rep, .. } => Some(rep.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        (rep.remote_qpn, rep.starting_psn, rep.rnr_retry_count),
        (0x22, 0x456, 6)
    );
    assert_eq!(&rep.private_data[..7], b"welcome");
    assert_eq!(net.a.state(id), Some(ConnState::Established));
    assert_eq!(net.b.state(net.b_id()), Some(ConnState::Established));
    assert_eq!(Net::sent(&net.sent_a, attr::REQ), 1);
    assert_eq!(Net::sent(&net.sent_a, attr::RTU), 1);
    assert_eq!(Net::sent(&net.sent_b, attr::REP), 1);
    assert_eq!(net.a.poll_timeout(), None);
}

/// REQ, REP and RTU share the REQ's transaction ID; a DREQ opens a new one, its DREP echoes it.
#[test]
fn transaction_ids() {
    let mut net = Net::new(2, Faults::default());
    let id = net.connect();
    let req = net.flight[0].4.clone();
    let tid = Mad::new_checked(&req[..]).unwrap().tid();
    net.run(LONG);
    net.a.disconnect(net.now, id, &[]).unwrap();
    let (_, dreq) = net.a.poll_transmit().unwrap();
    let dreq_tid = Mad::new_checked(&dreq[..]).unwrap().tid();
    assert_ne!(dreq_tid, tid);
    net.b.handle_mad(net.now, gsi(A_GID), &dreq);
    let (_, drep) = net.b.poll_transmit().unwrap();
    let drep_hdr = MadHeaderRepr::parse(&Mad::new_checked(&drep[..]).unwrap());
    assert_eq!((drep_hdr.attr_id, drep_hdr.tid), (attr::DREP, dreq_tid));
    // Same seed, same IDs: a run is reproducible.
    let mut again = Net::new(2, Faults::default());
    assert_eq!(again.connect(), id);
}

#[test]
fn consumer_reject_reaches_the_active_side() {
    let mut net = Net::new(3, Faults::default());
    net.users.accept = false;
    net.users.reject_pd = b"go away".to_vec();
    let id = net.connect();
    net.run(LONG);
    let rej = net.ev_a.iter().find_map(|(_, e)| match e {
        CmEvent::Rejected {
            id: i,
            reason,
            private_data,
        } if *i == id => Some((*reason, private_data[..7].to_vec())),
        _ => None,
    });
    assert_eq!(rej, Some((reason::CONSUMER, b"go away".to_vec())));
    assert_eq!(net.a.state(id), Some(ConnState::Idle));
    assert_eq!(net.established(), (0, 0));
}

#[test]
fn unlistened_service_gets_rej_invalid_service_id() {
    let mut net = Net::new(4, Faults::default());
    net.b.unlisten(SERVICE);
    let id = net.connect();
    net.run(LONG);
    let reasons: Vec<u16> = net
        .ev_a
        .iter()
        .filter_map(|(_, e)| match e {
            CmEvent::Rejected { id: i, reason, .. } if *i == id => Some(*reason),
            _ => None,
        })
        .collect();
    assert_eq!(reasons, vec![reason::INVALID_SERVICE_ID]);
    assert!(net.ev_b.is_empty());
}

#[test]
fn unreachable_after_retries_within_the_timeout_bound() {
    let mut net = Net::new(
        5,
        Faults {
            loss: 1.0,
            ..Faults::default()
        },
    );
    let id = net.connect();
    net.run(LONG);
    let at = net
        .ev_a
        .iter()
        .find_map(|(t, e)| matches!(e, CmEvent::Unreachable { id: i } if *i == id).then_some(*t))
        .expect("unreachable");
    let bound = mad_timeout() * (u32::from(RETRIES) + 1);
    assert_eq!(at - Instant::ZERO, bound);
    assert_eq!(Net::sent(&net.sent_a, attr::REQ), usize::from(RETRIES) + 1);
    assert_eq!(net.a.state(id), Some(ConnState::Idle));
    assert_eq!(net.a.poll_timeout(), None);
}

/// The passive side never hears the RTU nor any retry of it: its REP runs out of retries.
#[test]
fn passive_side_unreachable_when_rtu_never_comes() {
    let mut net = Net::new(6, Faults::default());
    net.connect();
    // Let the REQ through, then cut A.
    net.run(Duration::from_micros(6));
    net.faults.cut_a = true;
    net.run(LONG);
    let b = net.b_id();
    assert!(
        net.ev_b
            .iter()
            .any(|(_, e)| matches!(e, CmEvent::Unreachable { id } if *id == b))
    );
    assert_eq!(Net::sent(&net.sent_b, attr::REP), usize::from(RETRIES) + 1);
}

fn connected(seed: u64, faults: Faults) -> (Net, CmId, CmId) {
    let mut net = Net::new(seed, faults);
    let a = net.connect();
    net.run(LONG);
    assert_eq!(net.established(), (1, 1));
    let b = net.b_id();
    (net, a, b)
}

fn disconnect_from(side: Side, faults: Faults) {
    let (mut net, a, b) = connected(7, faults);
    let (me, peer) = match side {
        Side::A => (a, b),
        Side::B => (b, a),
    };
    let now = net.now;
    net.cm(side).disconnect(now, me, b"bye").unwrap();
    net.pump();
    net.run(LONG);
    let disc = |e: &CmEvent| matches!(e, CmEvent::Disconnected { .. });
    let exit = |e: &CmEvent| matches!(e, CmEvent::TimewaitExit { .. });
    assert_eq!(Net::count(&net.ev_a, disc), 1);
    assert_eq!(Net::count(&net.ev_b, disc), 1);
    assert_eq!(Net::count(&net.ev_a, exit), 1);
    assert_eq!(Net::count(&net.ev_b, exit), 1);
    let peer_events = match side {
        Side::A => &net.ev_b,
        Side::B => &net.ev_a,
    };
    let pd = peer_events.iter().find_map(|(_, e)| match e {
        CmEvent::Disconnected { private_data, .. } => Some(private_data.clone()),
        _ => None,
    });
    assert_eq!(&pd.unwrap()[..3], b"bye");
    let other = match side {
        Side::A => Side::B,
        Side::B => Side::A,
    };
    assert_eq!(net.cm(side).state(me), Some(ConnState::Idle));
    assert_eq!(net.cm(other).state(peer), Some(ConnState::Idle));
    // A second disconnect is harmless.
    let now = net.now;
    assert!(net.cm(other).disconnect(now, peer, &[]).is_err());
}

#[test]
fn disconnect_from_the_active_side() {
    disconnect_from(Side::A, Faults::default());
}

#[test]
fn disconnect_from_the_passive_side() {
    disconnect_from(Side::B, Faults::default());
}

#[test]
fn timewait_lasts_the_local_ack_timeout() {
    let (mut net, a, _) = connected(8, Faults::default());
    let start = net.now;
    net.a.disconnect(start, a, &[]).unwrap();
    net.run(LONG);
    let exit = net
        .ev_a
        .iter()
        .find_map(|(t, e)| matches!(e, CmEvent::TimewaitExit { .. }).then_some(*t))
        .unwrap();
    let drep_at = net
        .ev_a
        .iter()
        .find_map(|(t, e)| matches!(e, CmEvent::Disconnected { .. }).then_some(*t))
        .unwrap();
    assert_eq!(exit - drep_at, ib_time(ACK));
    assert!(drep_at > start);
}

fn lost_first(attr_id: u16, from_a: bool) -> Net {
    let (mut net, a, _) = connected(
        9,
        Faults {
            drop_first: Some((attr_id, from_a)),
            ..Faults::default()
        },
    );
    net.a.disconnect(net.now, a, &[]).unwrap();
    net.run(LONG);
    assert!(net.dropped_first, "the MAD was dropped");
    let exit = |e: &CmEvent| matches!(e, CmEvent::TimewaitExit { .. });
    assert_eq!(Net::count(&net.ev_a, exit), 1);
    assert_eq!(Net::count(&net.ev_b, exit), 1);
    net
}

#[test]
fn lost_req_is_resent() {
    let net = lost_first(attr::REQ, true);
    assert_eq!(Net::sent(&net.sent_a, attr::REQ), 2);
}

/// A lost REP: the REQ is resent, the passive side answers the duplicate with its REP again.
#[test]
fn lost_rep_is_answered_by_the_resent_req() {
    let net = lost_first(attr::REP, false);
    assert_eq!(Net::sent(&net.sent_a, attr::REQ), 2);
    // The REP's own retry timer fires about when the resent REQ arrives: 2 or 3 REPs.
    assert!(Net::sent(&net.sent_b, attr::REP) >= 2);
}

/// A lost RTU: the passive side resends the REP, the active side answers with the RTU again.
#[test]
fn lost_rtu_is_answered_by_the_resent_rep() {
    let net = lost_first(attr::RTU, true);
    assert_eq!(Net::sent(&net.sent_b, attr::REP), 2);
    assert_eq!(Net::sent(&net.sent_a, attr::RTU), 2);
}

#[test]
fn lost_dreq_is_resent() {
    let net = lost_first(attr::DREQ, true);
    assert_eq!(Net::sent(&net.sent_a, attr::DREQ), 2);
}

/// A lost DREP: the DREQ is resent, the peer answers with the DREP again (in timewait, or
/// after it as for any DREQ it cannot match).
#[test]
fn lost_drep_is_answered_by_the_resent_dreq() {
    let net = lost_first(attr::DREP, false);
    assert_eq!(Net::sent(&net.sent_a, attr::DREQ), 2);
    assert_eq!(Net::sent(&net.sent_b, attr::DREP), 2);
}

/// Every MAD delivered twice: one connection, one event of each kind per side.
#[test]
fn duplicated_mads_are_answered_idempotently() {
    let (mut net, a, _) = connected(
        10,
        Faults {
            dup: 1.0,
            ..Faults::default()
        },
    );
    net.a.disconnect(net.now, a, &[]).unwrap();
    net.run(LONG);
    let req = |e: &CmEvent| matches!(e, CmEvent::ReqReceived { .. });
    let disc = |e: &CmEvent| matches!(e, CmEvent::Disconnected { .. });
    assert_eq!(Net::count(&net.ev_b, req), 1);
    assert_eq!(Net::count(&net.ev_a, disc), 1);
    assert_eq!(Net::count(&net.ev_b, disc), 1);
    assert_eq!(net.established(), (1, 1));
}

/// MADs overtake each other by up to 3 response timeouts.
#[test]
fn reordered_mads_still_connect_and_disconnect() {
    for seed in 0..20 {
        let (mut net, a, _) = connected(
            100 + seed,
            Faults {
                jitter: mad_timeout() * 3,
                dup: 0.3,
                ..Faults::default()
            },
        );
        net.a.disconnect(net.now, a, &[]).unwrap();
        net.run(LONG);
        let exit = |e: &CmEvent| matches!(e, CmEvent::TimewaitExit { .. });
        assert_eq!(Net::count(&net.ev_a, exit), 1, "seed {seed}");
        assert_eq!(Net::count(&net.ev_b, exit), 1, "seed {seed}");
    }
}

/// A slow server: the resent REQ gets an MRA, which stretches the wait; the late REP connects.
#[test]
fn mra_extends_the_wait() {
    let mut net = Net::new(11, Faults::default());
    net.users.accept_after = mad_timeout() * 3;
    let id = net.connect();
    net.run(LONG);
    assert!(Net::sent(&net.sent_b, attr::MRA) >= 1);
    assert_eq!(net.established(), (1, 1));
    assert_eq!(net.a.state(id), Some(ConnState::Established));
}

#[test]
fn destroy_rejects_a_pending_request() {
    let mut net = Net::new(12, Faults::default());
    net.users.accept_after = LONG;
    let id = net.connect();
    net.run(Duration::from_micros(100));
    let b = net.b_id();
    net.to_accept.clear();
    net.b.destroy(net.now, b);
    assert_eq!(net.b.state(b), None);
    net.run(LONG);
    assert!(net.ev_a.iter().any(|(_, e)| matches!(
        e,
        CmEvent::Rejected { id: i, reason: reason::CONSUMER, .. } if *i == id
    )));
}

#[test]
fn calls_check_state_and_parameters() {
    let mut net = Net::new(13, Faults::default());
    let mut p = Net::params();
    p.private_data = vec![0; 93];
    assert!(net.a.connect(net.now, p).is_err());
    let mut p = Net::params();
    p.max_cm_retries = 16;
    assert!(net.a.connect(net.now, p).is_err());
    assert_eq!(net.b.listen(SERVICE), Err(emu_cm::CmError::AddressInUse));
    let id = net.connect();
    assert_eq!(
        net.a.establish(net.now, id),
        Err(emu_cm::CmError::InvalidState)
    );
    assert_eq!(
        net.a.disconnect(net.now, id, &[]),
        Err(emu_cm::CmError::InvalidState)
    );
    assert_eq!(
        net.a.establish(net.now, CmId(0)),
        Err(emu_cm::CmError::NoSuchId)
    );
}

/// A CM-class Get for an attribute the CM does not serve gets a GetResp with a status; a
/// Send of an unknown attribute, a response and other classes are dropped.
#[test]
fn unknown_mads_are_answered_or_dropped() {
    let mut cm = Cm::new(CmConfig {
        local_gid: B_GID,
        ca_guid: 1,
        seed: 1,
    });
    let mut get = vec![0u8; MAD_LEN];
    let mut hdr = MadHeaderRepr::cm_send(0x0001, 99);
    hdr.method = method::GET;
    hdr.emit(&mut Mad::new_unchecked(&mut get[..]));
    cm.handle_mad(Instant::ZERO, gsi(A_GID), &get);
    let (to, resp) = cm.poll_transmit().unwrap();
    let r = MadHeaderRepr::parse(&Mad::new_checked(&resp[..]).unwrap());
    assert_eq!(to, gsi(A_GID));
    assert_eq!((r.method, r.status, r.tid), (method::GET_RESP, 0x000C, 99));
    for (class, version, m) in [
        (0x07, 2, method::SEND),
        (0x07, 2, method::GET_RESP),
        (0x04, 1, method::GET),
    ] {
        let mut b = get.clone();
        b[1] = class;
        b[2] = version;
        b[3] = m;
        cm.handle_mad(Instant::ZERO, gsi(A_GID), &b);
        assert!(cm.poll_transmit().is_none());
    }
    let mut b = get.clone();
    b[2] = 1;
    cm.handle_mad(Instant::ZERO, gsi(A_GID), &b);
    let (_, resp) = cm.poll_transmit().unwrap();
    assert_eq!(Mad::new_checked(&resp[..]).unwrap().status(), 0x0004);
    assert!(cm.poll_event().is_none());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// 10 % MAD loss (with duplicates and reordering): the CM's retries still connect and
    /// disconnect, one event of each kind per side.
    #[test]
    fn ten_percent_loss_still_connects(seed in any::<u64>()) {
        let mut net = Net::new(seed, Faults {
            loss: 0.10,
            dup: 0.05,
            jitter: Duration::from_micros(200),
            ..Faults::default()
        });
        let a = net.connect();
        net.run(LONG);
        prop_assert_eq!(net.established(), (1, 1));
        net.a.disconnect(net.now, a, &[]).unwrap();
        net.run(LONG);
        let exit = |e: &CmEvent| matches!(e, CmEvent::TimewaitExit { .. });
        prop_assert_eq!(Net::count(&net.ev_a, exit), 1);
        prop_assert_eq!(Net::count(&net.ev_b, exit), 1);
    }

    /// Arbitrary MADs (a CM header with any attribute, any data, or any bytes) into a CM with
    /// live connections: no panic, and every MAD it sends is 256 bytes.
    #[test]
    fn arbitrary_mads_never_panic(
        attr_id in 0x0010u16..=0x0017,
        data in proptest::collection::vec(any::<u8>(), 232),
        raw in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        let (mut net, _, _) = connected(14, Faults::default());
        let mut b = vec![0u8; MAD_LEN];
        MadHeaderRepr::cm_send(attr_id, 1).emit(&mut Mad::new_unchecked(&mut b[..]));
        b[24..].copy_from_slice(&data);
        for cm in [&mut net.a, &mut net.b] {
            cm.handle_mad(net.now, gsi(A_GID), &b);
            cm.handle_mad(net.now, gsi(B_GID), &b);
            cm.handle_mad(net.now, gsi(A_GID), &raw);
            cm.handle_timeout(net.now + LONG);
            while let Some((_, m)) = cm.poll_transmit() {
                prop_assert_eq!(m.len(), MAD_LEN);
                prop_assert!(CmMad::parse(&m).is_ok() || m[3] == method::GET_RESP);
            }
        }
    }
}
