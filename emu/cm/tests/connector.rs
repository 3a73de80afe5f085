//! Nodes' connectors through a lossy in-memory GSI network in virtual time: every pair ends up
//! established with matching QPNs and PSNs.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use emu_cm::connector::{Connector, ConnectorEvent, LinkParams, PeerLink, QpReady};
use emu_cm::{CmConfig, Instant, MadAddr};

fn gid(node: u16) -> [u8; 16] {
    [
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0xFF,
        0xFF,
        10,
        0,
        0,
        node as u8 + 1,
    ]
}

fn qpn(local: u16, peer: u16) -> u32 {
    0x100 + u32::from(local) * 16 + u32::from(peer)
}

fn psn(local: u16, peer: u16) -> u32 {
    0x1000 * (u32::from(local) + 1) + u32::from(peer)
}

/// Runs `n` nodes; drops every `drop_every`-th MAD (0: none). Returns each node's Ready list.
fn run(n: u16, drop_every: usize) -> Vec<Vec<QpReady>> {
    let now = Instant::ZERO;
    let mut nodes: Vec<Connector> = (0..n)
        .map(|i| {
            let peers = (0..n)
                .filter(|&p| p != i)
                .map(|p| PeerLink {
                    node: p,
                    gsi: MadAddr {
                        gid: gid(p),
                        qpn: 1,
                    },
                    local_qpn: qpn(i, p),
                    recv_psn: psn(i, p),
                })
                .collect();
            let config = CmConfig {
                local_gid: gid(i),
                ca_guid: 0x10 + u64::from(i),
                seed: u64::from(i) + 7,
            };
            Connector::new(now, config, i, LinkParams::default(), peers).unwrap()
        })
        .collect();
    let mut ready = vec![Vec::new(); n as usize];
    let mut now = now;
    let mut sent = 0usize;
    for _ in 0..10_000 {
        let mut moved = false;
        for i in 0..n as usize {
            while let Some(ev) = nodes[i].poll_event() {
                match ev {
                    ConnectorEvent::Ready(r) => ready[i].push(r),
                    ConnectorEvent::Failed { peer, why } => panic!("{i}->{peer}: {why}"),
                    ConnectorEvent::Established { .. } => {}
                }
            }
            while let Some((to, mad)) = nodes[i].poll_transmit() {
                moved = true;
                sent += 1;
                if drop_every != 0 && sent % drop_every == 0 {
                    continue;
                }
                let dst = usize::from(to.gid[15] - 1);
                let from = MadAddr {
                    gid: gid(i as u16),
                    qpn: 1,
                };
                nodes[dst].handle_mad(now, from, &mad);
            }
        }
        if nodes.iter().all(Connector::all_established) {
            for (i, node) in nodes.iter_mut().enumerate() {
                while let Some(ev) = node.poll_event() {
                    if let ConnectorEvent::Ready(r) = ev {
                        ready[i].push(r);
                    }
                }
            }
            return ready;
        }
        if !moved {
            now = nodes
                .iter()
                .filter_map(Connector::poll_timeout)
                .min()
                .expect("stuck");
            for node in &mut nodes {
                node.handle_timeout(now);
            }
        }
    }
    panic!("not established");
}

fn check(n: u16, ready: &[Vec<QpReady>]) {
    for i in 0..n {
        assert_eq!(ready[usize::from(i)].len(), usize::from(n - 1), "node {i}");
        for r in &ready[usize::from(i)] {
            let p = r.peer;
            assert_eq!(r.local_qpn, qpn(i, p));
            assert_eq!(r.remote_qpn, qpn(p, i));
            assert_eq!(r.recv_psn, psn(i, p));
            assert_eq!(r.send_psn, psn(p, i));
        }
    }
}

#[test]
fn two_nodes_connect() {
    check(2, &run(2, 0));
}

#[test]
fn three_nodes_connect() {
    check(3, &run(3, 0));
}

#[test]
fn three_nodes_connect_through_loss() {
    check(3, &run(3, 3));
}

/// A REQ from a node the listener does not expect is rejected: the requester's link fails.
#[test]
fn a_req_from_an_unknown_node_is_rejected() {
    let now = Instant::ZERO;
    let link = |local: u16, peer: u16| PeerLink {
        node: peer,
        gsi: MadAddr {
            gid: gid(peer),
            qpn: 1,
        },
        local_qpn: qpn(local, peer),
        recv_psn: psn(local, peer),
    };
    let config = |i: u16| CmConfig {
        local_gid: gid(i),
        ca_guid: u64::from(i),
        seed: u64::from(i),
    };
    // Node 0 expects only node 1; node 2 connects to it anyway.
    let mut a = Connector::new(now, config(0), 0, LinkParams::default(), vec![link(0, 1)]).unwrap();
    let mut c = Connector::new(now, config(2), 2, LinkParams::default(), vec![link(2, 0)]).unwrap();
    let from_c = MadAddr {
        gid: gid(2),
        qpn: 1,
    };
    let from_a = MadAddr {
        gid: gid(0),
        qpn: 1,
    };
    for _ in 0..4 {
        while let Some((_, mad)) = c.poll_transmit() {
            a.handle_mad(now, from_c, &mad);
        }
        while let Some((_, mad)) = a.poll_transmit() {
            c.handle_mad(now, from_a, &mad);
        }
    }
    assert!(!a.all_established() && !c.all_established());
    let failed = std::iter::from_fn(|| c.poll_event())
        .any(|e| matches!(e, ConnectorEvent::Failed { peer: 0, .. }));
    assert!(failed);
    assert!(std::iter::from_fn(|| a.poll_event()).next().is_none());
}
