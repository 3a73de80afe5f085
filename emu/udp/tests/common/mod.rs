//! Helpers shared by the UDP driver's integration tests: devices on 127.0.0.x with OS-chosen
//! ports, connected QP pairs, and event-driven waits (completion channel, never a spin).
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use emu_udp::{UdpChannel, UdpContext, UdpCq, UdpMr, UdpPd, UdpProvider, UdpQp};
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

pub mod tshark;

/// A short RC exchange from `a` to `b` with every result checked: a SEND into a posted
/// receive, a three-packet WRITE (at the default 1024-byte MTU), a READ back, a FETCH_ADD and a
/// COMPARE_SWAP.
pub fn rc_exchange(a: &Node, b: &Node) {
    use verbs_api::{MemoryRegion, RecvWr, SendOp, SendWr, WcOpcode, WcStatus};
    let src = a.mr(8192);
    let dst = b.mr(8192);
    // SEND / RECV.
    let msg = pattern(700, 21);
    src.write(0, &msg).unwrap();
    b.qp.post_recv(&[RecvWr::new(1, &[dst.sge(0, 4096).unwrap()])])
        .unwrap();
    a.qp.post_send(&[SendWr::new(
        1,
        SendOp::Send,
        &[src.sge(0, msg.len()).unwrap()],
    )])
    .unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    let r = b.wc();
    assert_eq!(
        (r.status, r.byte_len as usize),
        (WcStatus::Success, msg.len())
    );
    let mut got = vec![0; msg.len()];
    dst.read(0, &mut got).unwrap();
    assert_eq!(got, msg, "SEND data");
    // WRITE of three packets.
    let data = pattern(3000, 22);
    src.write(0, &data).unwrap();
    let write = SendOp::RdmaWrite {
        remote_addr: dst.addr() + 4096,
        rkey: dst.rkey(),
    };
    a.qp.post_send(&[SendWr::new(2, write, &[src.sge(0, data.len()).unwrap()])])
        .unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    let mut got = vec![0; data.len()];
    dst.read(4096, &mut got).unwrap();
    assert_eq!(got, data, "WRITE data");
    // READ it back into another place.
    let read = SendOp::RdmaRead {
        remote_addr: dst.addr() + 4096,
        rkey: dst.rkey(),
    };
    a.qp.post_send(&[SendWr::new(3, read, &[src.sge(4096, data.len()).unwrap()])])
        .unwrap();
    let wc = a.wc();
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::RdmaRead)
    );
    let mut got = vec![0; data.len()];
    src.read(4096, &mut got).unwrap();
    assert_eq!(got, data, "READ data");
    // Atomics on an aligned word of b.
    dst.write(8000, &41u64.to_ne_bytes()).unwrap();
    let word = dst.addr() + 8000;
    let fadd = SendOp::AtomicFetchAndAdd {
        remote_addr: word,
        rkey: dst.rkey(),
        add: 1,
    };
    a.qp.post_send(&[SendWr::new(4, fadd, &[src.sge(8000, 8).unwrap()])])
        .unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    let cas = SendOp::AtomicCmpAndSwp {
        remote_addr: word,
        rkey: dst.rkey(),
        compare: 42,
        swap: 7,
    };
    a.qp.post_send(&[SendWr::new(5, cas, &[src.sge(8008, 8).unwrap()])])
        .unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    let mut old = [0u8; 16];
    src.read(8000, &mut old).unwrap();
    assert_eq!(
        u64::from_ne_bytes(old[..8].try_into().unwrap()),
        41,
        "FETCH_ADD result"
    );
    assert_eq!(
        u64::from_ne_bytes(old[8..].try_into().unwrap()),
        42,
        "CMP_SWAP result"
    );
    let mut now = [0u8; 8];
    dst.read(8000, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), 7, "target word");
}
