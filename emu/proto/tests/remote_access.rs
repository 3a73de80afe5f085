//! Property: remote requests can never touch bytes outside a registered MR, or touch an MR
//! without the right it needs, whatever rkey, address and length a peer sends
//! (issue 4, item 7; rc-transport.md §4.4, §7.5).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};

use emu_proto::wire::{
    AtomicEthRepr, BthRepr, IpContext, NakCode, Opcode, Packet, PacketRepr, Psn, RethRepr, Syndrome,
};
use emu_proto::{AtomicOp, Hca, HcaConfig, Instant, MAX_PACKET_LEN, Memory, MemoryFault, MrInfo};
use proptest::prelude::*;
use verbs_api::{AccessFlags, AhAttr, Gid, QpAttr, QpCap, QpInitAttr, QpState, connect};

const A: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const PEER_QPN: u32 = 0x77;
const RQ_PSN: u32 = 0x100;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
    Atomic,
}

/// Memory that records every access and refuses ranges outside its regions.
#[derive(Default)]
struct Recording {
    regions: HashMap<u32, Vec<u8>>,
    log: RefCell<Vec<(u32, u64, usize, Kind)>>,
}

impl Recording {
    fn access(&self, key: u32, offset: u64, len: usize, kind: Kind) -> Result<(), MemoryFault> {
        self.log.borrow_mut().push((key, offset, len, kind));
        let r = self.regions.get(&key).ok_or(MemoryFault)?;
        let end = offset.checked_add(len as u64).ok_or(MemoryFault)?;
        if end > r.len() as u64 {
            Err(MemoryFault)
        } else {
            Ok(())
        }
    }
}

impl Memory for Recording {
    fn read(&self, key: u32, offset: u64, buf: &mut [u8]) -> Result<(), MemoryFault> {
        self.access(key, offset, buf.len(), Kind::Read)
    }
    fn write(&self, key: u32, offset: u64, data: &[u8]) -> Result<(), MemoryFault> {
        self.access(key, offset, data.len(), Kind::Write)
    }
    fn atomic(&self, key: u32, offset: u64, _op: AtomicOp) -> Result<u64, MemoryFault> {
        self.access(key, offset, 8, Kind::Atomic).map(|_| 0)
    }
}

/// One MR of the layout: length, access bits (REMOTE_* subset, LOCAL_WRITE always), PD 0 or 1.
#[derive(Clone, Debug)]
struct MrSpec {
    len: u64,
    access: u8,
    other_pd: bool,
}

fn mr_spec() -> impl Strategy<Value = MrSpec> {
    (1u64..5000, 0u8..8, prop::bool::weighted(0.2)).prop_map(|(len, access, other_pd)| MrSpec {
        len,
        access,
        other_pd,
    })
}

#[derive(Clone, Debug)]
struct Request {
    kind: Kind,
    /// Which MR the rkey is derived from, and how it is mangled (0: exact, 1: flip key byte,
    /// 2: random key).
    mr: usize,
    mangle: u8,
    random_key: u32,
    /// Offset from that MR's iova (may be negative or beyond it).
    offset: i64,
    len: u32,
}

fn request() -> impl Strategy<Value = Request> {
    (
        prop_oneof![Just(Kind::Read), Just(Kind::Write), Just(Kind::Atomic)],
        0usize..4,
        prop_oneof![6 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8)],
        any::<u32>(),
        -64i64..6000,
        prop_oneof![0u32..300, 300u32..5000, Just(u32::MAX), Just(0x8000_0001)],
    )
        .prop_map(|(kind, mr, mangle, random_key, offset, len)| Request {
            kind,
            mr,
            mangle,
            random_key,
            offset,
            len,
        })
}

fn access_bits(b: u8) -> AccessFlags {
    let mut a = AccessFlags::LOCAL_WRITE;
    if b & 1 != 0 {
        a |= AccessFlags::REMOTE_WRITE;
    }
    if b & 2 != 0 {
        a |= AccessFlags::REMOTE_READ;
    }
    if b & 4 != 0 {
        a |= AccessFlags::REMOTE_ATOMIC;
    }
    a
}

/// Sets up an HCA with the MRs and one RC QP (PD 0) connected to the fake peer.
fn setup(mrs: &[MrSpec]) -> (Hca, Recording, Vec<MrInfo>, u32, emu_proto::PdId) {
    let mut hca = Hca::new(HcaConfig::new("a", Gid::from_ip(A.into()), 7));
    let pds = [hca.alloc_pd().unwrap(), hca.alloc_pd().unwrap()];
    let mut mem = Recording::default();
    let mut infos = Vec::new();
    for (i, m) in mrs.iter().enumerate() {
        let iova = 0x1000_0000 * (i as u64 + 1);
        let info = hca
            .reg_mr(
                pds[usize::from(m.other_pd)],
                iova,
                m.len,
                access_bits(m.access),
            )
            .unwrap();
        mem.regions.insert(info.lkey, vec![0; m.len as usize]);
        infos.push(info);
    }
    let cq = hca.create_cq(64, None).unwrap();
    let cap = QpCap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qpn = hca
        .create_qp(pds[0], cq, cq, None, &QpInitAttr::rc(cap))
        .unwrap();
    let attr = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
        dest_qp_num: PEER_QPN,
        rq_psn: RQ_PSN,
        max_dest_rd_atomic: 4,
        max_rd_atomic: 4,
        min_rnr_timer: 1,
        timeout: 10,
        retry_cnt: 3,
        rnr_retry: 3,
        ah_attr: AhAttr {
            dgid: Gid::from_ip(PEER.into()),
            ..AhAttr::default()
        },
        ..QpAttr::default()
    };
    let now = Instant::ZERO;
    hca.modify_qp(now, qpn, &attr, connect::INIT_MASK).unwrap();
    hca.modify_qp(
        now,
        qpn,
        &QpAttr {
            qp_state: QpState::Rtr,
            ..attr
        },
        connect::RTR_MASK,
    )
    .unwrap();
    hca.modify_qp(
        now,
        qpn,
        &QpAttr {
            qp_state: QpState::Rts,
            ..attr
        },
        connect::RTS_MASK,
    )
    .unwrap();
    (hca, mem, infos, qpn, pds[0])
}

fn packet(qpn: u32, req: &Request, rkey: u32, va: u64, payload: &[u8]) -> Vec<u8> {
    let bth = BthRepr {
        ack_req: true,
        ..BthRepr::new(Opcode::RdmaReadRequest, qpn, Psn::new(RQ_PSN))
    };
    let reth = Some(RethRepr {
        va,
        rkey,
        dma_len: req.len,
    });
    let repr = match req.kind {
        Kind::Read => PacketRepr {
            reth,
            ..PacketRepr::new(bth, &[])
        },
        Kind::Write => PacketRepr {
            reth: Some(RethRepr {
                va,
                rkey,
                dma_len: payload.len() as u32,
            }),
            ..PacketRepr::new(
                BthRepr {
                    opcode: Opcode::RdmaWriteOnly,
                    ..bth
                },
                payload,
            )
        },
        Kind::Atomic => PacketRepr {
            atomic_eth: Some(AtomicEthRepr {
                va,
                rkey,
                swap_add: 1,
                compare: 0,
            }),
            ..PacketRepr::new(
                BthRepr {
                    opcode: Opcode::FetchAdd,
                    ..bth
                },
                &[],
            )
        },
    };
    let ip = IpContext {
        dst_port: 4791,
        ..IpContext::v4(PEER, A, 0xC000)
    };
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit(&ip, &mut buf).unwrap();
    buf
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, rng_seed: proptest::test_runner::RngSeed::Fixed(0x5eed), ..ProptestConfig::default() })]

    #[test]
    fn remote_access_stays_inside_registered_memory(
        mrs in prop::collection::vec(mr_spec(), 1..4),
        req in request(),
    ) {
        let (mut hca, mem, infos, qpn, qp_pd) = setup(&mrs);
        let target = infos[req.mr % infos.len()];
        let rkey = match req.mangle {
            0 => target.rkey,
            1 => target.rkey ^ 0x01,
            _ => req.random_key,
        };
        let va = target.iova.wrapping_add_signed(req.offset);
        // Writes carry their payload (at most one MTU so the packet is well formed).
        let payload = vec![0xAB; (req.len as usize).min(1024)];
        let bytes = packet(qpn, &req, rkey, va, &payload);
        let src = SocketAddr::new(PEER.into(), 0xC000);
        hca.handle_datagram(Instant::ZERO, src, &bytes, &mem);
        let mut out = vec![0u8; MAX_PACKET_LEN];
        let mut responses = Vec::new();
        while let Some(tx) = hca.poll_transmit(Instant::ZERO, &mem, &mut out) {
            let repr = PacketRepr::parse(&Packet::new_unchecked(&out[..tx.len])).unwrap();
            responses.push((repr.bth.opcode, repr.aeth.map(|a| a.syndrome)));
        }
        // Every access the engine made lies inside an MR of the QP's PD with the right rights.
        for &(key, offset, len, kind) in mem.log.borrow().iter() {
            let mr = infos.iter().find(|m| m.lkey == key).expect("access to an unregistered key");
            prop_assert!(offset + len as u64 <= mr.length, "access {offset}+{len} beyond MR of {}", mr.length);
            prop_assert_eq!(mr.pd, qp_pd, "access in another PD");
            let need = match kind {
                Kind::Read => AccessFlags::REMOTE_READ,
                Kind::Write => AccessFlags::REMOTE_WRITE,
                Kind::Atomic => AccessFlags::REMOTE_ATOMIC,
            };
            prop_assert!(mr.access.contains(need), "{kind:?} without {need:?}");
        }
        // A refused request is answered with a NAK (never silently executed).
        let legal_len = match req.kind {
            Kind::Read => u64::from(req.len),
            Kind::Write => payload.len() as u64,
            Kind::Atomic => 8,
        };
        let need = match req.kind {
            Kind::Read => AccessFlags::REMOTE_READ,
            Kind::Write => AccessFlags::REMOTE_WRITE,
            Kind::Atomic => AccessFlags::REMOTE_ATOMIC,
        };
        let in_mr = rkey == target.rkey
            && va >= target.iova
            && va.checked_add(legal_len).is_some_and(|end| end <= target.iova + target.length);
        let legal = (legal_len == 0 && req.kind != Kind::Atomic)
            || (in_mr
                && target.access.contains(need)
                && target.pd == qp_pd
                && (req.kind != Kind::Atomic || va % 8 == 0)
                && (req.kind != Kind::Read || req.len <= 0x8000_0000));
        let nak = responses.iter().any(|(_, s)| matches!(s, Some(Syndrome::Nak(_))));
        if legal {
            prop_assert!(!nak, "legal request NAKed: {responses:?}");
        } else {
            prop_assert!(nak, "illegal request not NAKed: {responses:?}");
            let code_ok = responses.iter().any(|(_, s)| matches!(s,
                Some(Syndrome::Nak(NakCode::RemoteAccessError | NakCode::InvalidRequest))));
            prop_assert!(code_ok);
        }
    }
}

/// A WRITE packet from the fake peer at `psn`: FIRST (with its RETH) or MIDDLE.
fn write_packet(qpn: u32, op: Opcode, psn: u32, reth: Option<RethRepr>, payload: &[u8]) -> Vec<u8> {
    let bth = BthRepr {
        ack_req: true,
        ..BthRepr::new(op, qpn, Psn::new(psn))
    };
    let repr = PacketRepr {
        reth,
        ..PacketRepr::new(bth, payload)
    };
    let ip = IpContext {
        dst_port: 4791,
        ..IpContext::v4(PEER, A, 0xC000)
    };
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit(&ip, &mut buf).unwrap();
    buf
}

/// Found by the `responder` fuzz target (fuzz/corpus/responder/crash-write-after-dereg*.bin):
/// WRITE_MIDDLE/LAST reused the key resolved on WRITE_FIRST after its MR was deregistered. The
/// stale key's index is reused by a later registration (after 64 more frees), and drivers
/// map memory by key index (emu-sim), so the payload went into another MR, without its
/// rights. Now the continuation finds the MR gone: remote access NAK, QP in ERR, no access.
#[test]
fn write_continuation_after_deregistration_touches_no_memory() {
    let mrs = [MrSpec {
        len: 4096,
        access: 7,
        other_pd: false,
    }];
    let (mut hca, mut mem, infos, qpn, pd) = setup(&mrs);
    let mr = infos[0];
    let src = SocketAddr::new(PEER.into(), 0xC000);
    let now = Instant::ZERO;
    let mut out = vec![0u8; MAX_PACKET_LEN];
    let mut drain = |hca: &mut Hca, mem: &Recording| {
        let mut got = Vec::new();
        while let Some(tx) = hca.poll_transmit(now, mem, &mut out) {
            let repr = PacketRepr::parse(&Packet::new_unchecked(&out[..tx.len])).unwrap();
            got.push((repr.bth.psn.value(), repr.aeth.map(|a| a.syndrome)));
        }
        got
    };
    let first = write_packet(
        qpn,
        Opcode::RdmaWriteFirst,
        RQ_PSN,
        Some(RethRepr {
            va: mr.iova,
            rkey: mr.rkey,
            dma_len: 3 * 1024,
        }),
        // The path MTU is the default 1024: FIRST and MIDDLE carry exactly 1024 bytes.
        &[0x11; 1024],
    );
    hca.handle_datagram(now, src, &first, &mem);
    assert_eq!(
        drain(&mut hca, &mem),
        [(RQ_PSN, Some(Syndrome::ACK_UNLIMITED))]
    );

    // Deregister the target, then free enough indices that the next MR reuses its index (a
    // local-write-only MR the peer may not write): the table reuses an index after 64 frees.
    hca.dereg_mr(mr.lkey).unwrap();
    mem.regions.remove(&mr.lkey);
    for _ in 0..64 {
        let tmp = hca
            .reg_mr(pd, 0x7000_0000, 64, AccessFlags::LOCAL_WRITE)
            .unwrap();
        hca.dereg_mr(tmp.lkey).unwrap();
    }
    let reused = hca
        .reg_mr(pd, mr.iova, 4096, AccessFlags::LOCAL_WRITE)
        .unwrap();
    assert_eq!(reused.lkey >> 8, mr.lkey >> 8, "index not reused");
    assert_ne!(reused.lkey, mr.lkey);
    mem.regions.insert(reused.lkey, vec![0; 4096]);
    mem.log.borrow_mut().clear();

    let middle = write_packet(
        qpn,
        Opcode::RdmaWriteMiddle,
        RQ_PSN + 1,
        None,
        &[0x22; 1024],
    );
    hca.handle_datagram(now, src, &middle, &mem);
    assert_eq!(
        drain(&mut hca, &mem),
        [(RQ_PSN + 1, Some(Syndrome::Nak(NakCode::RemoteAccessError)))]
    );
    assert!(
        mem.log.borrow().is_empty(),
        "memory accessed with a stale key: {:?}",
        mem.log.borrow()
    );
    assert_eq!(hca.query_qp(qpn).unwrap().qp_state, QpState::Err);
}
