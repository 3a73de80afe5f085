//! The CM's state: connections, listeners, MADs in flight and their timers (IBTA vol. 1
//! §12.9 state diagrams), behind the calls of [`crate::Cm`].
//!
//! One connection per local communication ID. A MAD that expects an answer (REQ, REP, DREQ)
//! is kept as `pending` and resent at its deadline until `max_cm_retries` resends are used up
//! (§12.9.4 timers); the last answer sent (RTU, DREP, MRA, REJ) is kept as `answer` and sent
//! again when the MAD it answered arrives again (duplicates are answered idempotently). MADs
//! that fit no connection in a state expecting them are dropped.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

use crate::api::{
    AcceptParams, CmConfig, CmError, CmEvent, CmId, ConnectParams, Instant, MadAddr, RepInfo,
    ReqInfo,
};
use crate::wire::{
    CmMad, CmMessage, DREQ_PRIVATE_DATA, DrepRepr, DreqRepr, MAD_LEN, Mad, MadHeaderRepr, MraRepr,
    MsgTarget, REJ_PRIVATE_DATA, REP_PRIVATE_DATA, REQ_PRIVATE_DATA, RejRepr, RepRepr, ReqPath,
    ReqRepr, RtuRepr, TransportType, attr, method, status,
};

/// REJ reasons (IBTA table 112) the CM itself sends.
pub mod reason {
    /// The peer did not answer within its CM response timeout and retries.
    pub const TIMEOUT: u16 = 4;
    /// No listener for the REQ's service ID.
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// The REQ asks for a transport other than RC or UC.
    pub const INVALID_TRANSPORT: u16 = 9;
    /// The consumer rejected (rdma_reject, rdma_destroy_id of an unanswered request).
    pub const CONSUMER: u16 = 28;
}

/// 4.096 µs × 2^exp, the IBTA time encoding of CM response and ACK timeouts (exp ≤ 31).
pub fn ib_time(exp: u8) -> Duration {
    Duration::from_nanos(4096u64 << exp.min(31))
}

/// How long to wait for the answer to a MAD: the peer's CM response time plus a path round
/// trip (the local ACK timeout covers twice the packet life time, §9.7.6.1.3).
fn answer_timeout(resp_exp: u8, ack_exp: u8) -> Duration {
    ib_time(resp_exp) + ib_time(ack_exp)
}

/// Where a connection is (IBTA §12.9 state diagrams, without LAP/APR and RD); exported as
/// `ConnState`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// Active: REQ sent, waiting for REP.
    ReqSent,
    /// Active: the peer's MRA asked for more time.
    MraReceived,
    /// Active: REP received; the user moves the QP and calls establish or reject.
    RepReceived,
    /// Passive: REQ received; the user accepts or rejects.
    ReqReceived,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    /// Both: connected.
    Established,
    /// Both: DREQ sent, waiting for DREP.
    DreqSent,
    /// Both: disconnected, waiting before the QP and ID are reused.
    TimeWait,
    /// Rejected, unreachable or out of timewait: only destroy remains.
    Idle,
}

/// A MAD waiting for its answer.
#[derive(Clone, Debug)]
struct Pending {
    mad: Vec<u8>,
    retries_left: u8,
    timeout: Duration,
}

/// One connection.
#[derive(Clone, Debug)]
struct Conn {
    state: State,
    remote: MadAddr,
    /// The peer's communication ID, 0 until its first message.
    remote_id: u32,
    remote_qpn: u32,
    /// The establishment transaction (REQ, MRA, REP, RTU, REJ).
    tid: u64,
    /// The peer's CM response timeout exponent (how long it may take to answer us).
    resp_timeout: u8,
    max_retries: u8,
    local_ack_timeout: u8,
    pending: Option<Pending>,
    answer: Option<Vec<u8>>,
    deadline: Option<Instant>,
    /// Passive connections: the key of `Machine::passive`.
    passive_key: Option<([u8; 16], u32)>,
}

/// Everything the CM holds (see the module docs).
#[derive(Debug)]
pub(crate) struct Machine {
    rng: ChaCha8Rng,
    tid_hi: u64,
    tid_next: u32,
    conns: BTreeMap<u32, Conn>,
    /// Passive connections by (active side's GID, active side's comm ID): finds duplicate REQs.
    passive: BTreeMap<([u8; 16], u32), u32>,
    listens: BTreeSet<u64>,
    tx: VecDeque<(MadAddr, Vec<u8>)>,
    events: VecDeque<CmEvent>,
}

impl Machine {
    pub(crate) fn new(config: &CmConfig) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
        let tid_hi = u64::from(rng.next_u32()) << 32;
        let tid_next = rng.next_u32();
        Machine {
            rng,
            tid_hi,
            tid_next,
            conns: BTreeMap::new(),
            passive: BTreeMap::new(),
            listens: BTreeSet::new(),
            tx: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    // ---- identifiers ---------------------------------------------------------------------

    /// A fresh, non-zero local communication ID no live connection uses.
    fn new_comm_id(&mut self) -> u32 {
        loop {
            let id = self.rng.next_u32();
            if id != 0 && !self.conns.contains_key(&id) {
                return id;
            }
        }
    }

    /// A fresh transaction ID: a seeded high half and a counter (IBTA 13.4.6.4: unique per
    /// requester).
    fn new_tid(&mut self) -> u64 {
        self.tid_next = self.tid_next.wrapping_add(1);
        self.tid_hi | u64::from(self.tid_next)
    }

    // ---- calls ---------------------------------------------------------------------------

    pub(crate) fn listen(&mut self, service_id: u64) -> Result<(), CmError> {
        if !self.listens.insert(service_id) {
            return Err(CmError::AddressInUse);
        }
        Ok(())
    }

    pub(crate) fn unlisten(&mut self, service_id: u64) {
        self.listens.remove(&service_id);
    }

    pub(crate) fn connect(
        &mut self,
        now: Instant,
        config: &CmConfig,
        p: &ConnectParams,
    ) -> Result<CmId, CmError> {
        check_connect(p)?;
        let id = self.new_comm_id();
        let tid = self.new_tid();
        let req = build_req(config, id, p);
        let mad = CmMad::send(tid, CmMessage::Req(req)).emit();
        let timeout = answer_timeout(p.cm_response_timeout, p.local_ack_timeout);
        let conn = Conn {
            state: State::ReqSent,
            remote: p.remote,
            remote_id: 0,
            remote_qpn: 0,
            tid,
            resp_timeout: p.cm_response_timeout,
            max_retries: p.max_cm_retries,
            local_ack_timeout: p.local_ack_timeout,
            pending: None,
            answer: None,
            deadline: None,
            passive_key: None,
        };
        self.conns.insert(id, conn);
        self.send_pending(now, id, mad, timeout);
        Ok(CmId(id))
    }

    pub(crate) fn accept(
        &mut self,
        now: Instant,
        config: &CmConfig,
        id: CmId,
        p: &AcceptParams,
    ) -> Result<(), CmError> {
        check_accept(p)?;
        let conn = self.conn(id)?;
        if conn.state != State::ReqReceived {
            return Err(CmError::InvalidState);
        }
        let rep = RepRepr {
            local_comm_id: id.0,
            remote_comm_id: conn.remote_id,
            local_qkey: 0,
            local_qpn: p.local_qpn,
            vendor_id: 0,
            local_eecn: 0,
            starting_psn: p.starting_psn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: 0,
            failover_accepted: 2,
            e2e_flow_control: true,
            rnr_retry_count: p.rnr_retry_count,
            srq: false,
            local_ca_guid: config.ca_guid,
            private_data: p.private_data.clone(),
        };
        let mad = CmMad::send(conn.tid, CmMessage::Rep(rep)).emit();
        let timeout = answer_timeout(conn.resp_timeout, conn.local_ack_timeout);
        self.set_state(id.0, State::RepSent);
        self.send_pending(now, id.0, mad, timeout);
        Ok(())
    }

    pub(crate) fn establish(&mut self, id: CmId) -> Result<(), CmError> {
        let conn = self.conn(id)?;
        match conn.state {
            State::RepReceived => {
                let rtu = RtuRepr {
                    local_comm_id: id.0,
                    remote_comm_id: conn.remote_id,
                    private_data: Vec::new(),
                };
                let mad = CmMad::send(conn.tid, CmMessage::Rtu(rtu)).emit();
                self.send_answer(id.0, mad);
            }
            State::RepSent => {}
            State::Established => return Ok(()),
            _ => return Err(CmError::InvalidState),
        }
        self.clear_timer(id.0);
        self.set_state(id.0, State::Established);
        self.events.push_back(CmEvent::Established { id });
        Ok(())
    }

    pub(crate) fn reject(
        &mut self,
        id: CmId,
        reason: u16,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        if private_data.len() > REJ_PRIVATE_DATA {
            return Err(CmError::InvalidParam("REJ private data above 148 bytes"));
        }
        let target = match self.conn(id)?.state {
            State::ReqReceived | State::RepSent => MsgTarget::REQ,
            State::RepReceived => MsgTarget::REP,
            _ => return Err(CmError::InvalidState),
        };
        self.send_rej(id.0, target, reason, &[], private_data);
        self.clear_timer(id.0);
        self.set_state(id.0, State::Idle);
        Ok(())
    }

    pub(crate) fn disconnect(
        &mut self,
        now: Instant,
        id: CmId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        if private_data.len() > DREQ_PRIVATE_DATA {
            return Err(CmError::InvalidParam("DREQ private data above 220 bytes"));
        }
        let conn = self.conn(id)?;
        match conn.state {
            State::Established => {}
            // The DREQ already came (and got its DREP) or ours is out: nothing more to send.
            State::DreqSent | State::TimeWait => return Ok(()),
            _ => return Err(CmError::InvalidState),
        }
        let dreq = DreqRepr {
            local_comm_id: id.0,
            remote_comm_id: conn.remote_id,
            remote_qpn: conn.remote_qpn,
            private_data: private_data.to_vec(),
        };
        let timeout = answer_timeout(conn.resp_timeout, conn.local_ack_timeout);
        let tid = self.new_tid();
        let mad = CmMad::send(tid, CmMessage::Dreq(dreq)).emit();
        self.set_state(id.0, State::DreqSent);
        self.send_pending(now, id.0, mad, timeout);
        Ok(())
    }

    /// Forgets `id`; an unanswered REQ is rejected (timeout, as a REQ given up on), an
    /// unfinished handshake rejected (consumer), an established connection gets one DREQ.
    pub(crate) fn destroy(&mut self, config: &CmConfig, id: CmId) {
        let Some(conn) = self.conns.get(&id.0) else {
            return;
        };
        let guid = config.ca_guid.to_be_bytes();
        match conn.state {
            State::ReqSent | State::MraReceived => {
                self.send_rej(id.0, MsgTarget::REQ, reason::TIMEOUT, &guid, &[]);
            }
            State::ReqReceived | State::RepSent => {
                self.send_rej(id.0, MsgTarget::REQ, reason::CONSUMER, &[], &[]);
            }
            State::RepReceived => self.send_rej(id.0, MsgTarget::REP, reason::CONSUMER, &[], &[]),
            State::Established => {
                let dreq = DreqRepr {
                    local_comm_id: id.0,
                    remote_comm_id: conn.remote_id,
                    remote_qpn: conn.remote_qpn,
                    private_data: Vec::new(),
                };
                let remote = conn.remote;
                let tid = self.new_tid();
                self.tx
                    .push_back((remote, CmMad::send(tid, CmMessage::Dreq(dreq)).emit()));
            }
            State::DreqSent | State::TimeWait | State::Idle => {}
        }
        if let Some(conn) = self.conns.remove(&id.0) {
            if let Some(key) = conn.passive_key {
                self.passive.remove(&key);
            }
        }
    }

    // ---- outputs -------------------------------------------------------------------------

    pub(crate) fn poll_transmit(&mut self) -> Option<(MadAddr, Vec<u8>)> {
        self.tx.pop_front()
    }

    pub(crate) fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.conns.values().filter_map(|c| c.deadline).min()
    }

    /// The state of connection `id` (tests and diagnostics).
    pub(crate) fn state(&self, id: CmId) -> Option<State> {
        self.conns.get(&id.0).map(|c| c.state)
    }

    // ---- timers --------------------------------------------------------------------------

    pub(crate) fn handle_timeout(&mut self, now: Instant, config: &CmConfig) {
        let due: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|d| d <= now))
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            self.fire(now, config, id);
        }
    }

    fn fire(&mut self, now: Instant, config: &CmConfig, id: u32) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        conn.deadline = None;
        if conn.state == State::TimeWait {
            conn.state = State::Idle;
            self.events
                .push_back(CmEvent::TimewaitExit { id: CmId(id) });
            return;
        }
        let Some(p) = conn.pending.as_mut() else {
            return;
        };
        if p.retries_left > 0 {
            p.retries_left -= 1;
            conn.deadline = Some(now + p.timeout);
            if conn.state == State::MraReceived {
                conn.state = State::ReqSent;
            }
            let out = (conn.remote, p.mad.clone());
            self.tx.push_back(out);
            return;
        }
        conn.pending = None;
        self.give_up(now, config, id);
    }

    /// The retries of the pending MAD ran out (§12.9.4): an unanswered REQ or REP makes the
    /// connection unreachable (and the peer gets REJ "timeout" with our CA GUID as ARI); an
    /// unanswered DREQ disconnects anyway.
    fn give_up(&mut self, now: Instant, config: &CmConfig, id: u32) {
        let Some(state) = self.conns.get(&id).map(|c| c.state) else {
            return;
        };
        match state {
            State::ReqSent | State::MraReceived | State::RepSent => {
                let target = if state == State::RepSent {
                    MsgTarget::REP
                } else {
                    MsgTarget::REQ
                };
                let guid = config.ca_guid.to_be_bytes();
                self.send_rej(id, target, reason::TIMEOUT, &guid, &[]);
                self.set_state(id, State::Idle);
                self.events.push_back(CmEvent::Unreachable { id: CmId(id) });
            }
            State::DreqSent => {
                self.events.push_back(CmEvent::Disconnected {
                    id: CmId(id),
                    private_data: Vec::new(),
                });
                self.enter_timewait(now, id);
            }
            _ => {}
        }
    }

    // ---- input ---------------------------------------------------------------------------

    pub(crate) fn handle_mad(&mut self, now: Instant, from: MadAddr, bytes: &[u8]) {
        let Ok(view) = Mad::new_checked(bytes) else {
            return;
        };
        let hdr = MadHeaderRepr::parse(&view);
        if hdr.mgmt_class != crate::wire::MGMT_CLASS_CM
            || hdr.base_version != crate::wire::BASE_VERSION
        {
            return;
        }
        let msg = match CmMad::parse(bytes) {
            Ok(m) if hdr.method == method::SEND => m.msg,
            Ok(_) => return self.answer_status(from, bytes, status::METHOD_UNSUPPORTED),
            Err(crate::wire::MadError::NotCm { .. }) => {
                return self.answer_status(from, bytes, status::BAD_VERSION);
            }
            Err(crate::wire::MadError::UnknownAttribute(_)) => {
                return self.answer_status(from, bytes, status::METHOD_ATTR_UNSUPPORTED);
            }
            Err(crate::wire::MadError::Truncated(_)) => return,
        };
        match msg {
            CmMessage::Req(m) => self.on_req(from, hdr.tid, m),
            CmMessage::Mra(m) => self.on_mra(now, from, m),
            CmMessage::Rej(m) => self.on_rej(from, m),
            CmMessage::Rep(m) => self.on_rep(from, m),
            CmMessage::Rtu(m) => self.on_rtu(from, m),
            CmMessage::Dreq(m) => self.on_dreq(now, from, hdr.tid, m),
            CmMessage::Drep(m) => self.on_drep(now, from, m),
        }
    }

    /// A Get or Set the CM cannot serve gets a GetResp with `code` (IBTA 13.4.7); anything
    /// else, responses included, is dropped.
    fn answer_status(&mut self, from: MadAddr, bytes: &[u8], code: u16) {
        let m = bytes.get(3).copied().unwrap_or(0);
        if m != method::GET && m != method::SET {
            return;
        }
        let mut out = bytes.get(..MAD_LEN).map(<[u8]>::to_vec).unwrap_or_default();
        if out.len() < MAD_LEN {
            return;
        }
        let mut view = Mad::new_unchecked(&mut out[..]);
        let hdr = MadHeaderRepr::parse(&view);
        view.set_class(
            hdr.base_version,
            hdr.mgmt_class,
            hdr.class_version,
            method::GET_RESP,
        );
        view.set_status(code);
        self.tx.push_back((from, out));
    }

    fn on_req(&mut self, from: MadAddr, tid: u64, req: ReqRepr) {
        let key = (from.gid, req.local_comm_id);
        if let Some(&id) = self.passive.get(&key) {
            return self.on_dup_req(id, &req);
        }
        let rej = |reason| RejRepr {
            local_comm_id: 0,
            remote_comm_id: req.local_comm_id,
            message: MsgTarget::REQ,
            ari_len: 0,
            reason,
            ari: Vec::new(),
            private_data: Vec::new(),
        };
        if !self.listens.contains(&req.service_id) {
            let mad = CmMad::send(tid, CmMessage::Rej(rej(reason::INVALID_SERVICE_ID)));
            return self.tx.push_back((from, mad.emit()));
        }
        if !matches!(req.transport, TransportType::Rc | TransportType::Uc) {
            let mad = CmMad::send(tid, CmMessage::Rej(rej(reason::INVALID_TRANSPORT)));
            return self.tx.push_back((from, mad.emit()));
        }
        let id = self.new_comm_id();
        let conn = Conn {
            state: State::ReqReceived,
            remote: from,
            remote_id: req.local_comm_id,
            remote_qpn: req.local_qpn,
            tid,
            resp_timeout: req.local_cm_response_timeout,
            max_retries: req.max_cm_retries,
            local_ack_timeout: req.primary.local_ack_timeout,
            pending: None,
            answer: None,
            deadline: None,
            passive_key: Some(key),
        };
        self.conns.insert(id, conn);
        self.passive.insert(key, id);
        self.events.push_back(CmEvent::ReqReceived {
            id: CmId(id),
            req: req_info(from, req),
        });
    }

    /// A REQ seen before: an MRA while the user decides, the REP again while it is
    /// unanswered, the REJ again if we rejected; dropped once established (stale).
    fn on_dup_req(&mut self, id: u32, req: &ReqRepr) {
        let Some(conn) = self.conns.get(&id) else {
            return;
        };
        match conn.state {
            State::ReqReceived => {
                let mra = MraRepr {
                    local_comm_id: id,
                    remote_comm_id: conn.remote_id,
                    message: MsgTarget::REQ,
                    service_timeout: req.remote_cm_response_timeout,
                    private_data: Vec::new(),
                };
                let mad = CmMad::send(conn.tid, CmMessage::Mra(mra)).emit();
                self.send_answer(id, mad);
            }
            State::RepSent => self.resend_pending(id),
            State::Idle => self.resend_answer(id, attr::REJ),
            _ => {}
        }
    }

    fn on_mra(&mut self, now: Instant, from: MadAddr, mra: MraRepr) {
        let Some(conn) = self.matching(from, mra.remote_comm_id, mra.local_comm_id) else {
            return;
        };
        let waits = matches!(
            (conn.state, mra.message),
            (State::ReqSent | State::MraReceived, MsgTarget::REQ)
                | (State::RepSent, MsgTarget::REP)
        );
        if !waits {
            return;
        }
        if conn.state != State::RepSent {
            conn.state = State::MraReceived;
        }
        conn.deadline = Some(now + answer_timeout(mra.service_timeout, conn.local_ack_timeout));
    }

    fn on_rej(&mut self, from: MadAddr, rej: RejRepr) {
        let id = rej.remote_comm_id;
        let Some(conn) = self.matching(from, id, rej.local_comm_id) else {
            return;
        };
        let rejected = matches!(
            conn.state,
            State::ReqSent | State::MraReceived | State::RepSent | State::RepReceived
        );
        if !rejected {
            return;
        }
        conn.state = State::Idle;
        conn.pending = None;
        conn.deadline = None;
        self.events.push_back(CmEvent::Rejected {
            id: CmId(id),
            reason: rej.reason,
            private_data: rej.private_data,
        });
    }

    fn on_rep(&mut self, from: MadAddr, rep: RepRepr) {
        let id = rep.remote_comm_id;
        let Some(conn) = self.matching(from, id, rep.local_comm_id) else {
            return;
        };
        match conn.state {
            State::ReqSent | State::MraReceived => {}
            State::Established => return self.resend_answer(id, attr::RTU),
            State::Idle => return self.resend_answer(id, attr::REJ),
            _ => return,
        }
        conn.state = State::RepReceived;
        conn.remote_id = rep.local_comm_id;
        conn.remote_qpn = rep.local_qpn;
        conn.pending = None;
        conn.deadline = None;
        self.events.push_back(CmEvent::RepReceived {
            id: CmId(id),
            rep: RepInfo {
                remote_qpn: rep.local_qpn,
                starting_psn: rep.starting_psn,
                responder_resources: rep.responder_resources,
                initiator_depth: rep.initiator_depth,
                rnr_retry_count: rep.rnr_retry_count,
                private_data: rep.private_data,
            },
        });
    }

    fn on_rtu(&mut self, from: MadAddr, rtu: RtuRepr) {
        let id = rtu.remote_comm_id;
        let Some(conn) = self.matching(from, id, rtu.local_comm_id) else {
            return;
        };
        if conn.state != State::RepSent {
            return;
        }
        conn.state = State::Established;
        conn.pending = None;
        conn.deadline = None;
        self.events.push_back(CmEvent::Established { id: CmId(id) });
    }

    /// A DREQ: answered with a DREP at once (the CM's, not the user's), the user told, then
    /// timewait; a duplicate DREQ in timewait gets the DREP again.
    /// A DREQ for no connection of ours (or one out of timewait) gets a DREP too, so a peer
    /// whose DREP was lost stops resending (the kernel CM does the same).
    fn on_dreq(&mut self, now: Instant, from: MadAddr, tid: u64, dreq: DreqRepr) {
        let id = dreq.remote_comm_id;
        let drep = DrepRepr {
            local_comm_id: id,
            remote_comm_id: dreq.local_comm_id,
            private_data: Vec::new(),
        };
        let mad = CmMad::send(tid, CmMessage::Drep(drep)).emit();
        let state = match self.conns.get(&id) {
            None => None,
            Some(_) => match self.matching(from, id, dreq.local_comm_id) {
                Some(conn) if conn.remote_id != 0 => Some(conn.state),
                _ => return,
            },
        };
        match state {
            Some(State::Established | State::RepSent | State::DreqSent) => {}
            None | Some(State::TimeWait | State::Idle) => return self.tx.push_back((from, mad)),
            Some(_) => return,
        }
        self.send_answer(id, mad);
        self.events.push_back(CmEvent::Disconnected {
            id: CmId(id),
            private_data: dreq.private_data,
        });
        self.enter_timewait(now, id);
    }

    fn on_drep(&mut self, now: Instant, from: MadAddr, drep: DrepRepr) {
        let id = drep.remote_comm_id;
        let Some(conn) = self.matching(from, id, drep.local_comm_id) else {
            return;
        };
        if conn.state != State::DreqSent {
            return;
        }
        self.events.push_back(CmEvent::Disconnected {
            id: CmId(id),
            private_data: Vec::new(),
        });
        self.enter_timewait(now, id);
    }

    // ---- helpers -------------------------------------------------------------------------

    fn conn(&self, id: CmId) -> Result<&Conn, CmError> {
        self.conns.get(&id.0).ok_or(CmError::NoSuchId)
    }

    /// Our connection `local` if the MAD comes from its peer's GSI and, once the peer's ID is
    /// known, names it as `remote` (a MAD from someone else or for an older connection is
    /// stale).
    fn matching(&mut self, from: MadAddr, local: u32, remote: u32) -> Option<&mut Conn> {
        let conn = self.conns.get_mut(&local)?;
        let known = conn.remote_id == 0 || remote == 0 || conn.remote_id == remote;
        (conn.remote.gid == from.gid && known).then_some(conn)
    }

    fn set_state(&mut self, id: u32, state: State) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = state;
        }
    }

    fn clear_timer(&mut self, id: u32) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.pending = None;
            c.deadline = None;
        }
    }

    fn enter_timewait(&mut self, now: Instant, id: u32) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = State::TimeWait;
            c.pending = None;
            c.deadline = Some(now + ib_time(c.local_ack_timeout));
        }
    }

    /// Sends `mad`, keeps it for resending until answered, arms the retry timer.
    fn send_pending(&mut self, now: Instant, id: u32, mad: Vec<u8>, timeout: Duration) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        self.tx.push_back((c.remote, mad.clone()));
        c.pending = Some(Pending {
            mad,
            retries_left: c.max_retries,
            timeout,
        });
        c.deadline = Some(now + timeout);
    }

    fn resend_pending(&mut self, id: u32) {
        if let Some(c) = self.conns.get(&id) {
            if let Some(p) = &c.pending {
                self.tx.push_back((c.remote, p.mad.clone()));
            }
        }
    }

    /// Sends `mad` and keeps it as the answer to duplicates.
    fn send_answer(&mut self, id: u32, mad: Vec<u8>) {
        if let Some(c) = self.conns.get_mut(&id) {
            self.tx.push_back((c.remote, mad.clone()));
            c.answer = Some(mad);
        }
    }

    /// Sends the kept answer again if it is a `attr_id` message (an RTU for a REP, a REJ
    /// for what it rejected).
    fn resend_answer(&mut self, id: u32, attr_id: u16) {
        if let Some(c) = self.conns.get(&id) {
            if let Some(a) = &c.answer {
                if Mad::new_checked(&a[..]).is_ok_and(|m| m.attr_id() == attr_id) {
                    self.tx.push_back((c.remote, a.clone()));
                }
            }
        }
    }

    fn send_rej(&mut self, id: u32, message: MsgTarget, reason: u16, ari: &[u8], pd: &[u8]) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let rej = RejRepr {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            message,
            ari_len: u8::try_from(ari.len()).unwrap_or(0),
            reason,
            ari: ari.to_vec(),
            private_data: pd.to_vec(),
        };
        let mad = CmMad::send(c.tid, CmMessage::Rej(rej)).emit();
        self.send_answer(id, mad);
    }
}

fn check_connect(p: &ConnectParams) -> Result<(), CmError> {
    let bad = [
        (
            p.private_data.len() > REQ_PRIVATE_DATA,
            "REQ private data above 92 bytes",
        ),
        (p.local_qpn > 0xFF_FFFF, "local_qpn wider than 24 bits"),
        (
            p.starting_psn > 0xFF_FFFF,
            "starting_psn wider than 24 bits",
        ),
        (!(1..=5).contains(&p.path_mtu), "path_mtu outside 1..=5"),
        (p.retry_count > 7, "retry_count wider than 3 bits"),
        (p.rnr_retry_count > 7, "rnr_retry_count wider than 3 bits"),
        (
            p.local_ack_timeout > 31,
            "local_ack_timeout wider than 5 bits",
        ),
        (
            p.cm_response_timeout > 31,
            "cm_response_timeout wider than 5 bits",
        ),
        (p.max_cm_retries > 15, "max_cm_retries wider than 4 bits"),
    ];
    match bad.iter().find(|(b, _)| *b) {
        Some((_, why)) => Err(CmError::InvalidParam(why)),
        None => Ok(()),
    }
}

fn check_accept(p: &AcceptParams) -> Result<(), CmError> {
    let bad = [
        (
            p.private_data.len() > REP_PRIVATE_DATA,
            "REP private data above 196 bytes",
        ),
        (p.local_qpn > 0xFF_FFFF, "local_qpn wider than 24 bits"),
        (
            p.starting_psn > 0xFF_FFFF,
            "starting_psn wider than 24 bits",
        ),
        (p.rnr_retry_count > 7, "rnr_retry_count wider than 3 bits"),
    ];
    match bad.iter().find(|(b, _)| *b) {
        Some((_, why)) => Err(CmError::InvalidParam(why)),
        None => Ok(()),
    }
}

/// The REQ of a connect: primary path between the two GIDs (RoCE: permissive LIDs, hop limit
/// 64, not subnet-local), no alternate path, the rest from the parameters.
fn build_req(config: &CmConfig, id: u32, p: &ConnectParams) -> ReqRepr {
    ReqRepr {
        local_comm_id: id,
        vendor_id: 0,
        service_id: p.service_id,
        local_ca_guid: config.ca_guid,
        local_qkey: 0,
        local_qpn: p.local_qpn,
        responder_resources: p.responder_resources,
        local_eecn: 0,
        initiator_depth: p.initiator_depth,
        remote_eecn: 0,
        remote_cm_response_timeout: p.cm_response_timeout,
        transport: if p.reliable {
            TransportType::Rc
        } else {
            TransportType::Uc
        },
        e2e_flow_control: true,
        starting_psn: p.starting_psn,
        local_cm_response_timeout: p.cm_response_timeout,
        retry_count: p.retry_count,
        pkey: 0xFFFF,
        path_mtu: p.path_mtu,
        rdc_exists: false,
        rnr_retry_count: p.rnr_retry_count,
        max_cm_retries: p.max_cm_retries,
        srq: false,
        ext_transport: 0,
        primary: ReqPath {
            local_lid: 0xFFFF,
            remote_lid: 0xFFFF,
            local_gid: config.local_gid,
            remote_gid: p.remote.gid,
            flow_label: 0,
            packet_rate: 3,
            traffic_class: 0,
            hop_limit: 64,
            sl: 0,
            subnet_local: false,
            local_ack_timeout: p.local_ack_timeout,
        },
        alternate: ReqPath::default(),
        sap_supported: false,
        private_data: p.private_data.clone(),
    }
}

fn req_info(from: MadAddr, req: ReqRepr) -> ReqInfo {
    ReqInfo {
        service_id: req.service_id,
        remote: from,
        remote_qpn: req.local_qpn,
        starting_psn: req.starting_psn,
        reliable: req.transport == TransportType::Rc,
        responder_resources: req.responder_resources,
        initiator_depth: req.initiator_depth,
        path_mtu: req.path_mtu,
        retry_count: req.retry_count,
        rnr_retry_count: req.rnr_retry_count,
        local_ack_timeout: req.primary.local_ack_timeout,
        private_data: req.private_data,
    }
}
