//! A pairwise connector: one RC QP per pair of harness nodes, connected through the CM.
//!
//! What it is: a sans-IO driver over [`Cm`] for a fixed set of nodes that each own one RC QP
//! per peer. The lower-numbered node of a pair listens on its own service ID
//! ([`node_service_id`]); the higher-numbered one sends the REQ with its QP's number and
//! receive PSN and its node index as private data. A [`ConnectorEvent::Ready`] tells the user
//! the values to move that QP to RTR and RTS with; the active side's RTU follows on its own.
//!
//! What it is not: it owns no GSI, QP, clock or socket. Its user pumps the GSI's receive
//! completions into [`Connector::handle_mad`], sends [`Connector::poll_transmit`]'s MADs as UD
//! sends to the peer's GSI (QPN 1, Q_Key 0x8001_0000), applies each `Ready` before sending the
//! next MAD, and honours [`Connector::poll_timeout`].

use std::collections::{BTreeMap, VecDeque};

use crate::{
    AcceptParams, Cm, CmConfig, CmError, CmEvent, CmId, ConnectParams, Instant, MadAddr, service_id,
};

/// rdma_cm's TCP port space (`RDMA_PS_TCP`).
pub const RDMA_PS_TCP: u16 = 0x0106;

/// The first port of the harness nodes' services: node `n` listens on `BASE_PORT + n`.
pub const BASE_PORT: u16 = 18515;

/// The service ID node `node` listens on.
pub const fn node_service_id(node: u16) -> u64 {
    service_id(RDMA_PS_TCP, BASE_PORT.wrapping_add(node))
}

/// One peer of this node: where its GSI is and the local QP that connects to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerLink {
    /// The peer's node index.
    pub node: u16,
    /// The peer's GSI.
    pub gsi: MadAddr,
    /// The local RC QP's number for this peer.
    pub local_qpn: u32,
    /// The PSN the local QP expects to receive first (24 bits).
    pub recv_psn: u32,
}

/// Transport parameters every link's REQ carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkParams {
    /// Path MTU, IBTA encoding (1 = 256 … 5 = 4096).
    pub path_mtu: u8,
    /// Outstanding RDMA READs/atomics, both directions.
    pub rd_atomic: u8,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// RNR retry count (3 bits; 7 = infinite).
    pub rnr_retry_count: u8,
    /// Local ACK timeout exponent.
    pub local_ack_timeout: u8,
    /// CM response timeout exponent (4.096 µs × 2^t).
    pub cm_response_timeout: u8,
    /// CM MAD retries before a link is unreachable.
    pub max_cm_retries: u8,
}

impl Default for LinkParams {
    fn default() -> Self {
        LinkParams {
            path_mtu: 3,
            rd_atomic: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            local_ack_timeout: 14,
            cm_response_timeout: 14,
            max_cm_retries: 15,
        }
    }
}

/// What a link's QP needs for RTR and RTS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QpReady {
    /// The peer's node index.
    pub peer: u16,
    /// The local QP's number.
    pub local_qpn: u32,
    /// The peer QP's number (RTR's dest QPN).
    pub remote_qpn: u32,
    /// The PSN the local QP sends from (RTS's sq PSN).
    pub send_psn: u32,
    /// The PSN the local QP expects first (RTR's rq PSN).
    pub recv_psn: u32,
}

/// What the connector tells its user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConnectorEvent {
    /// Move this QP to RTR and RTS now, before sending the next MAD.
    Ready(QpReady),
    /// The link to `peer` is established.
    Established {
        /// The peer's node index.
        peer: u16,
    },
    /// The link to `peer` failed (rejected or unreachable).
    Failed {
        /// The peer's node index.
        peer: u16,
        /// Why.
        why: String,
    },
}

/// The CM of one node and its links to every peer.
#[derive(Debug)]
pub struct Connector {
    cm: Cm,
    node: u16,
    params: LinkParams,
    links: BTreeMap<u16, PeerLink>,
    by_id: BTreeMap<CmId, u16>,
    established: BTreeMap<u16, bool>,
    events: VecDeque<ConnectorEvent>,
}

impl Connector {
    /// Node `node`'s connector: listens if a peer has a higher index and sends a REQ to each
    /// lower-indexed peer.
    pub fn new(
        now: Instant,
        config: CmConfig,
        node: u16,
        params: LinkParams,
        peers: Vec<PeerLink>,
    ) -> Result<Self, CmError> {
        let mut c = Connector {
            cm: Cm::new(config),
            node,
            params,
            links: peers.into_iter().map(|p| (p.node, p)).collect(),
            by_id: BTreeMap::new(),
            established: BTreeMap::new(),
            events: VecDeque::new(),
        };
        if c.links.keys().any(|&p| p > node) {
            c.cm.listen(node_service_id(node))?;
        }
        let lower: Vec<PeerLink> = c.links.range(..node).map(|(_, l)| l.clone()).collect();
        for link in lower {
            let id = c.cm.connect(now, c.connect_params(&link))?;
            c.by_id.insert(id, link.node);
        }
        c.established = c.links.keys().map(|&p| (p, false)).collect();
        Ok(c)
    }

    fn connect_params(&self, link: &PeerLink) -> ConnectParams {
        let p = &self.params;
        ConnectParams {
            service_id: node_service_id(link.node),
            remote: link.gsi,
            local_qpn: link.local_qpn,
            starting_psn: link.recv_psn,
            reliable: true,
            responder_resources: p.rd_atomic,
            initiator_depth: p.rd_atomic,
            path_mtu: p.path_mtu,
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
            local_ack_timeout: p.local_ack_timeout,
            cm_response_timeout: p.cm_response_timeout,
            max_cm_retries: p.max_cm_retries,
            private_data: self.node.to_be_bytes().to_vec(),
        }
    }

    /// A MAD received on the GSI from `from`.
    pub fn handle_mad(&mut self, now: Instant, from: MadAddr, mad: &[u8]) {
        self.cm.handle_mad(now, from, mad);
        self.drain(now);
    }

    /// The next MAD to send as a UD send to `MadAddr`'s GSI.
    pub fn poll_transmit(&mut self) -> Option<(MadAddr, Vec<u8>)> {
        self.cm.poll_transmit()
    }

    /// The next event for the user.
    pub fn poll_event(&mut self) -> Option<ConnectorEvent> {
        self.events.pop_front()
    }

    /// When [`Connector::handle_timeout`] is due next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.cm.poll_timeout()
    }

    /// Runs the CM's timers (MAD retries) due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.cm.handle_timeout(now);
        self.drain(now);
    }

    /// `true` once every link is established.
    pub fn all_established(&self) -> bool {
        self.established.values().all(|&e| e)
    }

    fn drain(&mut self, now: Instant) {
        while let Some(ev) = self.cm.poll_event() {
            self.on_event(now, ev);
        }
    }

    fn on_event(&mut self, now: Instant, ev: CmEvent) {
        match ev {
            CmEvent::ReqReceived { id, req } => self.on_req(now, id, &req),
            CmEvent::RepReceived { id, rep } => {
                let Some(link) = self.by_id.get(&id).and_then(|p| self.links.get(p)) else {
                    return;
                };
                let ready = QpReady {
                    peer: link.node,
                    local_qpn: link.local_qpn,
                    remote_qpn: rep.remote_qpn,
                    send_psn: rep.starting_psn,
                    recv_psn: link.recv_psn,
                };
                self.events.push_back(ConnectorEvent::Ready(ready));
                if let Err(e) = self.cm.establish(now, id) {
                    self.fail(id, format!("establish: {e}"));
                }
            }
            CmEvent::Established { id } => {
                if let Some(&peer) = self.by_id.get(&id) {
                    self.established.insert(peer, true);
                    self.events.push_back(ConnectorEvent::Established { peer });
                }
            }
            CmEvent::Rejected { id, reason, .. } => self.fail(id, format!("rejected ({reason})")),
            CmEvent::Unreachable { id } => self.fail(id, "unreachable".into()),
            _ => {}
        }
    }

    fn on_req(&mut self, now: Instant, id: CmId, req: &crate::ReqInfo) {
        let peer = match req.private_data.get(..2) {
            Some(&[hi, lo]) => u16::from_be_bytes([hi, lo]),
            _ => return self.reject(now, id),
        };
        let Some(link) = self.links.get(&peer).filter(|_| peer > self.node) else {
            return self.reject(now, id);
        };
        if self.by_id.values().any(|&p| p == peer) {
            return self.reject(now, id);
        }
        let ready = QpReady {
            peer,
            local_qpn: link.local_qpn,
            remote_qpn: req.remote_qpn,
            send_psn: req.starting_psn,
            recv_psn: link.recv_psn,
        };
        let accept = AcceptParams {
            local_qpn: link.local_qpn,
            starting_psn: link.recv_psn,
            responder_resources: self.params.rd_atomic,
            initiator_depth: self.params.rd_atomic,
            rnr_retry_count: self.params.rnr_retry_count,
            private_data: Vec::new(),
        };
        self.by_id.insert(id, peer);
        self.events.push_back(ConnectorEvent::Ready(ready));
        if let Err(e) = self.cm.accept(now, id, accept) {
            self.fail(id, format!("accept: {e}"));
        }
    }

    fn reject(&mut self, now: Instant, id: CmId) {
        // A REQ from no expected peer: refuse it; a failure to refuse leaves nothing to undo.
        let _ = self.cm.reject(now, id, crate::reason::CONSUMER, &[]);
    }

    fn fail(&mut self, id: CmId, why: String) {
        if let Some(&peer) = self.by_id.get(&id) {
            self.events.push_back(ConnectorEvent::Failed { peer, why });
        }
    }
}
