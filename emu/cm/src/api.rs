//! The types and calls the connection manager shares with its user (see the crate docs).

pub use emu_proto::Instant;

use crate::machine::Machine;
pub use crate::machine::State as ConnState;

/// A local communication ID (IBTA 12.6.1): names one connection of this CM.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CmId(pub u32);

/// Where a MAD goes or came from: the peer port's GID and QP (1 for the GSI), as a UD
/// address handle and remote QPN would name it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct MadAddr {
    /// The peer port's GID (an IPv4-mapped GID on RoCEv2).
    pub gid: [u8; 16],
    /// The peer's QP number: 1 for the GSI.
    pub qpn: u32,
}

/// This CM's identity and seed.
#[derive(Clone, Debug)]
pub struct CmConfig {
    /// The local port's GID (carried in REQ's primary path).
    pub local_gid: [u8; 16],
    /// The local CA GUID (REQ/REP's local CA GUID field).
    pub ca_guid: u64,
    /// Seed of communication IDs and transaction IDs: one seed reproduces a run.
    pub seed: u64,
}

/// What the active side asks for in its REQ (IBTA 12.6.5) — rdma_connect's parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectParams {
    /// The service the peer listens on (rdma_cm: port space and port, see `service_id`).
    pub service_id: u64,
    /// The peer's GSI. Its GID must be the one the peer's MADs arrive from (for RoCEv2 over
    /// IPv4 the IPv4-mapped GID, as the GRH gives it): answers from another GID are dropped.
    pub remote: MadAddr,
    /// The local QP's number.
    pub local_qpn: u32,
    /// The REQ's starting PSN (24 bits): as Linux's CM uses it, the PSN the local QP expects
    /// to receive first (the passive side sends from it).
    pub starting_psn: u32,
    /// `true` for an RC QP, `false` for UC.
    pub reliable: bool,
    /// Incoming RDMA READs/atomics the local QP accepts (max_dest_rd_atomic).
    pub responder_resources: u8,
    /// Outstanding RDMA READs/atomics the local QP issues (max_rd_atomic).
    pub initiator_depth: u8,
    /// Path MTU, IBTA encoding (1 = 256 … 5 = 4096).
    pub path_mtu: u8,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// RNR retry count (3 bits; 7 = infinite).
    pub rnr_retry_count: u8,
    /// Local ACK timeout exponent (5 bits: 4.096 µs × 2^t).
    pub local_ack_timeout: u8,
    /// How long the peer may take to answer a CM MAD, exponent (5 bits: 4.096 µs × 2^t).
    pub cm_response_timeout: u8,
    /// How many times a CM MAD is resent before the connection is unreachable (4 bits).
    pub max_cm_retries: u8,
    /// REQ private data (at most 92 bytes, IBTA 12.6.5); rdma_cm puts its header first.
    pub private_data: Vec<u8>,
}

/// What the passive side answers in its REP (IBTA 12.6.8) — rdma_accept's parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcceptParams {
    /// The local QP's number.
    pub local_qpn: u32,
    /// The REP's starting PSN (24 bits): as Linux's CM uses it, the PSN the local QP expects
    /// to receive first (the active side sends from it).
    pub starting_psn: u32,
    /// Incoming RDMA READs/atomics the local QP accepts.
    pub responder_resources: u8,
    /// Outstanding RDMA READs/atomics the local QP issues.
    pub initiator_depth: u8,
    /// RNR retry count the peer's requester uses (3 bits).
    pub rnr_retry_count: u8,
    /// REP private data (at most 196 bytes, IBTA 12.6.8).
    pub private_data: Vec<u8>,
}

/// A received REQ's contents, for the passive side's QP (RTR: dest QPN, rq PSN, MTU, …).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReqInfo {
    /// The service ID the REQ names.
    pub service_id: u64,
    /// The active side's GSI (where replies go).
    pub remote: MadAddr,
    /// The active side's QP number.
    pub remote_qpn: u32,
    /// The REQ's starting PSN: the PSN the active side expects first, so the passive side's
    /// starting send PSN (Linux's CM convention).
    pub starting_psn: u32,
    /// `true` for RC, `false` for UC.
    pub reliable: bool,
    /// The active side's responder resources.
    pub responder_resources: u8,
    /// The active side's initiator depth.
    pub initiator_depth: u8,
    /// Path MTU, IBTA encoding.
    pub path_mtu: u8,
    /// Transport retry count.
    pub retry_count: u8,
    /// RNR retry count.
    pub rnr_retry_count: u8,
    /// Local ACK timeout exponent of the primary path.
    pub local_ack_timeout: u8,
    /// REQ private data.
    pub private_data: Vec<u8>,
}

/// A received REP's contents, for the active side's QP (RTR then RTS).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepInfo {
    /// The passive side's QP number.
    pub remote_qpn: u32,
    /// The REP's starting PSN: the PSN the passive side expects first, so the active side's
    /// starting send PSN (Linux's CM convention).
    pub starting_psn: u32,
    /// The passive side's responder resources.
    pub responder_resources: u8,
    /// The passive side's initiator depth.
    pub initiator_depth: u8,
    /// RNR retry count for our requester.
    pub rnr_retry_count: u8,
    /// REP private data.
    pub private_data: Vec<u8>,
}

/// What the CM tells its user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CmEvent {
    /// A REQ for a listened service created passive connection `id`: accept or reject it.
    ReqReceived {
        /// The new passive connection.
        id: CmId,
        /// What the REQ asks.
        req: ReqInfo,
    },
    /// The REP for active connection `id` arrived: move the QP to RTR and RTS with it, then
    /// [`Cm::establish`] (sends the RTU) or [`Cm::reject`].
    RepReceived {
        /// The active connection.
        id: CmId,
        /// What the REP carries.
        rep: RepInfo,
    },
    /// The connection is established (passive: RTU or first data; active: after establish).
    Established {
        /// The connection.
        id: CmId,
    },
    /// The peer rejected the connection (REJ, IBTA 12.6.7).
    Rejected {
        /// The connection.
        id: CmId,
        /// The REJ reason code (IBTA table 112; 28 = consumer reject).
        reason: u16,
        /// REJ private data.
        private_data: Vec<u8>,
    },
    /// The CM MADs' retries ran out without an answer.
    Unreachable {
        /// The connection.
        id: CmId,
    },
    /// The connection is disconnected: a DREQ arrived (the DREP is the CM's), or our DREQ
    /// was answered or timed out.
    Disconnected {
        /// The connection.
        id: CmId,
        /// DREQ private data, when a DREQ arrived.
        private_data: Vec<u8>,
    },
    /// The connection left timewait; its ID and QP may be reused.
    TimewaitExit {
        /// The connection.
        id: CmId,
    },
}

/// Why a CM call was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CmError {
    /// No such connection.
    #[error("no such CM connection")]
    NoSuchId,
    /// The call is not allowed in the connection's state.
    #[error("CM call not allowed in the connection's state")]
    InvalidState,
    /// The service ID is already listened on.
    #[error("service ID already in use")]
    AddressInUse,
    /// A parameter is out of range (private data too long, a field wider than its bits).
    #[error("CM parameter out of range: {0}")]
    InvalidParam(&'static str),
    /// Not implemented yet.
    #[error("not implemented")]
    Unsupported,
}

/// The rdma_cm service ID of a port space and port: `0x0000_0000_01PS_PPPP`
/// (RDMA_PS_TCP = 0x0106, RDMA_PS_UDP = 0x0111, RDMA_PS_IPOIB = 0x0002, RDMA_PS_IB = 0x013F).
pub const fn service_id(port_space: u16, port: u16) -> u64 {
    0x0000_0000_0100_0000 | ((port_space as u64 & 0xFF) << 16) | port as u64
}

/// The connection manager of one port: connections, listeners, MADs in flight, timers.
#[derive(Debug)]
pub struct Cm {
    config: CmConfig,
    machine: Machine,
}

impl Cm {
    /// A CM with no connections and no listeners.
    pub fn new(config: CmConfig) -> Self {
        let machine = Machine::new(&config);
        Cm { config, machine }
    }

    /// The configuration this CM was made with.
    pub fn config(&self) -> &CmConfig {
        &self.config
    }

    /// Accept REQs for `service_id` ([`CmEvent::ReqReceived`]). `AddressInUse` if already
    /// listened on.
    pub fn listen(&mut self, service_id: u64) -> Result<(), CmError> {
        self.machine.listen(service_id)
    }

    /// Stop accepting REQs for `service_id`; later REQs get REJ "invalid service ID".
    pub fn unlisten(&mut self, service_id: u64) {
        self.machine.unlisten(service_id);
    }

    /// Send a REQ: a new active connection. It is resent every
    /// `4.096 µs × (2^cm_response_timeout + 2^local_ack_timeout)` up to `max_cm_retries`
    /// times; then [`CmEvent::Unreachable`]. `InvalidParam` for a field wider than its bits
    /// or private data above 92 bytes.
    pub fn connect(&mut self, now: Instant, params: ConnectParams) -> Result<CmId, CmError> {
        self.machine.connect(now, &self.config, &params)
    }

    /// Answer passive connection `id`'s REQ with a REP (resent, like the REQ, with the active
    /// side's CM response timeout and retries, until the RTU). Only after
    /// [`CmEvent::ReqReceived`] (`InvalidState` otherwise).
    pub fn accept(&mut self, now: Instant, id: CmId, params: AcceptParams) -> Result<(), CmError> {
        self.machine.accept(now, &self.config, id, &params)
    }

    /// Active side, after the QP is in RTS: send the RTU; the connection is established
    /// ([`CmEvent::Established`]). Passive side, while waiting for the RTU: the QP saw the
    /// peer's first packet (communication established), the connection is established without
    /// the RTU. Established already: nothing.
    pub fn establish(&mut self, now: Instant, id: CmId) -> Result<(), CmError> {
        let _ = now;
        self.machine.establish(id)
    }

    /// Reject connection `id` (its REQ or REP) with `reason` and private data (≤ 148 bytes).
    /// Allowed after [`CmEvent::ReqReceived`] (also once accepted, before the RTU) and after
    /// [`CmEvent::RepReceived`].
    pub fn reject(
        &mut self,
        now: Instant,
        id: CmId,
        reason: u16,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let _ = now;
        self.machine.reject(id, reason, private_data)
    }

    /// Disconnect: send a DREQ (≤ 220 bytes of private data; resent until the DREP, then
    /// [`CmEvent::Disconnected`] and timewait). When a DREQ arrived the CM has already sent the
    /// DREP, and this call (like a second one) does nothing and succeeds.
    pub fn disconnect(
        &mut self,
        now: Instant,
        id: CmId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        self.machine.disconnect(now, id, private_data)
    }

    /// Forget connection `id` (rdma_destroy_id); a live connection is rejected or
    /// disconnected first as the spec requires: an unanswered REQ gets REJ "timeout", an
    /// unfinished handshake REJ "consumer reject", an established connection one DREQ.
    pub fn destroy(&mut self, now: Instant, id: CmId) {
        let _ = now;
        self.machine.destroy(&self.config, id);
    }

    /// A MAD arrived on the GSI from `from`. Malformed or unknown MADs are dropped or
    /// answered as IBTA 13.4 requires; never a panic: a CM-class Get/Set the CM cannot serve
    /// gets a GetResp with the status "bad version", "method unsupported" or "method/attribute
    /// unsupported"; other classes, responses and stale CM messages are dropped.
    pub fn handle_mad(&mut self, now: Instant, from: MadAddr, mad: &[u8]) {
        self.machine.handle_mad(now, from, mad);
    }

    /// The next MAD to send (256 bytes, to the GSI at the address).
    pub fn poll_transmit(&mut self) -> Option<(MadAddr, Vec<u8>)> {
        self.machine.poll_transmit()
    }

    /// The next event for the user.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.machine.poll_event()
    }

    /// When [`Cm::handle_timeout`] must next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.machine.poll_timeout()
    }

    /// Resend MADs whose answer is late, give up after the retries, leave timewait.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.machine.handle_timeout(now, &self.config);
    }

    /// Where connection `id` is; `None` once destroyed (additive: tests and diagnostics).
    pub fn state(&self, id: CmId) -> Option<ConnState> {
        self.machine.state(id)
    }
}
