//! Helpers shared by the UDP driver's integration tests: devices on 127.0.0.x with OS-chosen
//! ports, connected QP pairs, and event-driven waits (completion channel, never a spin).
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use emu_driver::{UdpChannel, UdpContext, UdpCq, UdpMr, UdpPd, UdpProvider, UdpQp};
use verbs_api::{
    AccessFlags, CompletionChannel, CompletionQueue, Context, Device, Provider, QpCap, QpInitAttr,
    QueuePair, RcConnectOptions, WorkCompletion, connect_rc,
};

/// Bound on every wait of the tests.
pub const WAIT: Duration = Duration::from_secs(10);

/// Every access right.
pub const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

pub fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A provider with one device per address.
pub fn provider(addrs: &[&str]) -> UdpProvider {
    addrs
        .iter()
        .fold(UdpProvider::builder(), |b, a| b.device(addr(a)))
        .build()
        .unwrap()
}

/// One side of a connection: a CQ with a channel, shared by both queues of an RC QP.
pub struct Node {
    pub ctx: UdpContext,
    pub pd: UdpPd,
    pub ch: UdpChannel,
    pub cq: UdpCq,
    pub qp: UdpQp,
}

impl Node {
    pub fn new(ctx: UdpContext) -> Node {
        let pd = ctx.alloc_pd().unwrap();
        let ch = ctx.create_comp_channel().unwrap();
        let cq = ctx.create_cq(512, Some(&ch)).unwrap();
        let cap = QpCap {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 64,
        };
        let qp = ctx
            .create_qp(&pd, &cq, &cq, None, &QpInitAttr::rc(cap))
            .unwrap();
        Node {
            ctx,
            pd,
            ch,
            cq,
            qp,
        }
    }

    pub fn mr(&self, len: usize) -> UdpMr {
        self.ctx.alloc_mr(&self.pd, len, ALL).unwrap()
    }

    /// The next completion, waiting on the channel; panics after `WAIT`.
    pub fn wc(&self) -> WorkCompletion {
        wait_wc(&self.cq, &self.ch, WAIT).expect("no completion in time")
    }
}

/// Opens the two devices of `p` and connects an RC QP pair between them.
pub fn pair(p: &UdpProvider, opts: &RcConnectOptions) -> (Node, Node) {
    let devs = p.devices().unwrap();
    let a = Node::new(devs[0].open().unwrap());
    let b = Node::new(devs[1].open().unwrap());
    connect(&a, &b, opts);
    (a, b)
}

pub fn connect(a: &Node, b: &Node, opts: &RcConnectOptions) {
    let ea = a.qp.endpoint(100).unwrap();
    let eb = b.qp.endpoint(200).unwrap();
    connect_rc(&a.qp, 100, &eb, opts).unwrap();
    connect_rc(&b.qp, 200, &ea, opts).unwrap();
}

/// The next completion of `cq`: polls, and otherwise arms the CQ and sleeps on the channel.
pub fn wait_wc<Q: CompletionQueue, H: CompletionChannel>(
    cq: &Q,
    ch: &H,
    timeout: Duration,
) -> Option<WorkCompletion> {
    let deadline = Instant::now() + timeout;
    let mut wc = [WorkCompletion::default()];
    loop {
        if cq.poll(&mut wc).unwrap() == 1 {
            return Some(wc[0]);
        }
        cq.req_notify(false).unwrap();
        // A completion may have arrived before the CQ was armed.
        if cq.poll(&mut wc).unwrap() == 1 {
            return Some(wc[0]);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        if ch.wait_cq_event(Some(left)).unwrap().is_some() {
            cq.ack_events(1);
        }
    }
}

/// Waits (sleeping 2 ms between checks) until `cond` holds; false after `timeout`.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A deterministic byte pattern.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}
