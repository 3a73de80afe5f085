//! Fuzz target `cm_mad`: arbitrary MADs into two connection managers (`emu_cm::Cm`) in the
//! middle of a real handshake, in virtual time.

use core::time::Duration;

use emu_cm::wire::{CmMad, MAD_LEN, method};
use emu_cm::{
    AcceptParams, Cm, CmConfig, CmEvent, CmId, ConnectParams, Instant, MadAddr, service_id,
};

use super::common::Input;

const A_GID: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 127, 0, 0, 1];
const B_GID: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 127, 0, 0, 2];
const STRANGER: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 127, 0, 0, 3];

fn gsi(gid: [u8; 16]) -> MadAddr {
    MadAddr { gid, qpn: 1 }
}

/// Fuzz target `cm_mad`: CM A connects to CM B (listening); the input is a sequence of steps,
/// each a control byte and up to 256 MAD bytes (short MADs padded with zeros only when the
/// control byte asks). Control bits: 0 — deliver to B (else A); 1 — from a stranger (else the
/// peer); 2 — pass the CMs' own queued MADs to each other first; 3 — keep the MAD's length as
/// given; 4–7 — advance virtual time by that many milliseconds first (timers fire).
///
/// Asserts, for every input: no panic; every MAD a CM sends is 256 bytes and either parses as
/// a CM message or is a GetResp; each connection reports `Established` at most once and no
/// event after `TimewaitExit`.
pub fn cm_mad(data: &[u8]) {
    let mut input = Input::new(data);
    let cfg = |gid, seed| CmConfig {
        local_gid: gid,
        ca_guid: seed,
        seed,
    };
    let mut a = Cm::new(cfg(A_GID, 1));
    let mut b = Cm::new(cfg(B_GID, 2));
    let mut now = Instant::ZERO;
    let _ = b.listen(service_id(0x0106, 1));
    let _ = a.connect(now, connect_params());
    let mut log = Log::default();
    while !input.is_empty() {
        let ctl = input.u8();
        now += Duration::from_millis(u64::from(ctl >> 4));
        a.handle_timeout(now);
        b.handle_timeout(now);
        if ctl & 4 != 0 {
            exchange(now, &mut a, &mut b, &mut log);
        }
        let mut mad: Vec<u8> = (0..MAD_LEN).map(|_| input.u8()).collect();
        if ctl & 8 != 0 {
            let keep = usize::from(mad[0]);
            mad.truncate(keep);
        }
        let from = match (ctl & 2 != 0, ctl & 1 != 0) {
            (true, _) => STRANGER,
            (false, true) => A_GID,
            (false, false) => B_GID,
        };
        let to = if ctl & 1 != 0 { &mut b } else { &mut a };
        to.handle_mad(now, gsi(from), &mad);
    }
    exchange(now, &mut a, &mut b, &mut log);
}

fn connect_params() -> ConnectParams {
    ConnectParams {
        service_id: service_id(0x0106, 1),
        remote: gsi(B_GID),
        local_qpn: 0x11,
        starting_psn: 1,
        reliable: true,
        responder_resources: 1,
        initiator_depth: 1,
        path_mtu: 3,
        retry_count: 7,
        rnr_retry_count: 7,
        local_ack_timeout: 4,
        cm_response_timeout: 4,
        max_cm_retries: 3,
        private_data: Vec::new(),
    }
}

/// Per connection (side, id): established count and whether timewait ended.
#[derive(Default)]
struct Log {
    seen: Vec<(bool, CmId, u32, bool)>,
}

impl Log {
    fn entry(&mut self, side_b: bool, id: CmId) -> &mut (bool, CmId, u32, bool) {
        let i = match self.seen.iter().position(|e| e.0 == side_b && e.1 == id) {
            Some(i) => i,
            None => {
                self.seen.push((side_b, id, 0, false));
                self.seen.len() - 1
            }
        };
        &mut self.seen[i]
    }
}

fn event_id(ev: &CmEvent) -> CmId {
    match ev {
        CmEvent::ReqReceived { id, .. }
        | CmEvent::RepReceived { id, .. }
        | CmEvent::Established { id }
        | CmEvent::Rejected { id, .. }
        | CmEvent::Unreachable { id }
        | CmEvent::Disconnected { id, .. }
        | CmEvent::TimewaitExit { id } => *id,
    }
}

/// Delivers each CM's queued MADs to the other and answers events (accept, establish).
fn exchange(now: Instant, a: &mut Cm, b: &mut Cm, log: &mut Log) {
    for _ in 0..8 {
        let mut moved = false;
        while let Some((to, mad)) = a.poll_transmit() {
            check_out(&mad);
            moved = true;
            if to.gid == B_GID {
                b.handle_mad(now, gsi(A_GID), &mad);
            }
        }
        while let Some((to, mad)) = b.poll_transmit() {
            check_out(&mad);
            moved = true;
            if to.gid == A_GID {
                a.handle_mad(now, gsi(B_GID), &mad);
            }
        }
        moved |= events(now, a, false, log);
        moved |= events(now, b, true, log);
        if !moved {
            return;
        }
    }
}

fn check_out(mad: &[u8]) {
    assert_eq!(mad.len(), MAD_LEN, "a CM sent a MAD of {} bytes", mad.len());
    assert!(
        CmMad::parse(mad).is_ok() || mad[3] == method::GET_RESP,
        "a CM sent a MAD that is neither a CM message nor a GetResp"
    );
}

fn events(now: Instant, cm: &mut Cm, side_b: bool, log: &mut Log) -> bool {
    let mut any = false;
    while let Some(ev) = cm.poll_event() {
        any = true;
        let entry = log.entry(side_b, event_id(&ev));
        assert!(!entry.3, "event after TimewaitExit: {ev:?}");
        match &ev {
            CmEvent::Established { .. } => {
                entry.2 += 1;
                assert!(entry.2 <= 1, "Established twice");
            }
            CmEvent::TimewaitExit { .. } => entry.3 = true,
            _ => {}
        }
        match ev {
            CmEvent::ReqReceived { id, .. } => {
                let p = AcceptParams {
                    local_qpn: 0x22,
                    starting_psn: 2,
                    responder_resources: 1,
                    initiator_depth: 1,
                    rnr_retry_count: 7,
                    private_data: Vec::new(),
                };
                let _ = cm.accept(now, id, p);
            }
            CmEvent::RepReceived { id, .. } => {
                let _ = cm.establish(now, id);
            }
            _ => {}
        }
    }
    any
}
