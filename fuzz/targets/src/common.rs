//! Pieces shared by the engine targets (`responder`, `completer`, `pair`): a reader that turns
//! fuzz bytes into choices, a [`Memory`] that keeps MR bytes and logs every access, packet
//! crafting with a valid ICRC, and CQ draining.

use core::cell::RefCell;
use core::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::collections::HashMap;

use emu_proto::wire::{IpAddrs, IpContext, PacketRepr, check_icrc};
use emu_proto::{AtomicOp, CqId, Hca, Memory, MemoryFault};
use verbs_api::WorkCompletion;

/// Address of node "a" (the requester in `completer`, the fake peer in `responder`).
pub(crate) const A_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
/// Address of node "b".
pub(crate) const B_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
/// A third address no QP is connected to.
pub(crate) const C_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);
/// The RoCEv2 UDP port every node receives on.
pub(crate) const PORT: u16 = 4791;
/// The QP number of a fake peer (no HCA behind it).
pub(crate) const PEER_QPN: u32 = 0x77;

/// Reads choices from the fuzz input, front to back. An exhausted input reads as zeros, so
/// every choice is encoded such that 0 is the ordinary, valid option.
#[derive(Debug)]
pub(crate) struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Input<'a> {
        Input { data }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub(crate) fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    pub(crate) fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    pub(crate) fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    pub(crate) fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }

    /// Uniform-ish in `0..n`; `n` must be positive. Reads 1, 2 or 4 bytes depending on `n`.
    pub(crate) fn below(&mut self, n: u32) -> u32 {
        let n = n.max(1);
        if n <= 0x100 {
            u32::from(self.u8()) % n
        } else if n <= 0x1_0000 {
            u32::from(self.u16()) % n
        } else {
            self.u32() % n
        }
    }

    /// `below` for `usize` bounds (small ones).
    pub(crate) fn index(&mut self, n: usize) -> usize {
        self.below(u32::try_from(n).unwrap_or(u32::MAX)) as usize
    }

    /// A 24-bit number.
    pub(crate) fn u24(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), 0])
    }

    /// Up to `n` raw bytes.
    pub(crate) fn bytes(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        head
    }
}

/// Kind of a memory access.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum AccessKind {
    Read,
    Write,
    Atomic,
}

/// One access the HCA made through [`Memory`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Access {
    pub(crate) kind: AccessKind,
    pub(crate) key: u32,
    pub(crate) offset: u64,
    pub(crate) len: usize,
}

/// MR bytes by full key (a deregistered key faults even if its index is reused), with bounds
/// checks and, if `recording`, a log of every access.
#[derive(Debug, Default)]
pub(crate) struct TestMemory {
    regions: RefCell<HashMap<u32, Vec<u8>>>,
    log: RefCell<Vec<Access>>,
    recording: bool,
}

impl TestMemory {
    pub(crate) fn recording() -> TestMemory {
        TestMemory {
            recording: true,
            ..TestMemory::default()
        }
    }

    /// Adds zeroed bytes for MR `key`.
    pub(crate) fn insert(&self, key: u32, len: usize) {
        self.regions.borrow_mut().insert(key, vec![0; len]);
    }

    /// Forgets MR `key` (deregistered).
    pub(crate) fn remove(&self, key: u32) {
        self.regions.borrow_mut().remove(&key);
    }

    /// The accesses logged since the last call.
    pub(crate) fn take_log(&self) -> Vec<Access> {
        std::mem::take(&mut *self.log.borrow_mut())
    }

    /// `len` bytes at `offset` of `key`, bypassing the log.
    pub(crate) fn get(&self, key: u32, offset: u64, len: usize) -> Option<Vec<u8>> {
        let regions = self.regions.borrow();
        let r = regions.get(&key)?;
        let start = usize::try_from(offset).ok()?;
        r.get(start..start.checked_add(len)?).map(<[u8]>::to_vec)
    }

    /// Writes `data` at `offset` of `key`, bypassing the log; false if out of range.
    pub(crate) fn put(&self, key: u32, offset: u64, data: &[u8]) -> bool {
        let mut regions = self.regions.borrow_mut();
        let Some(r) = regions.get_mut(&key) else {
            return false;
        };
        let Ok(start) = usize::try_from(offset) else {
            return false;
        };
        match start
            .checked_add(data.len())
            .and_then(|end| r.get_mut(start..end))
        {
            Some(dst) => {
                dst.copy_from_slice(data);
                true
            }
            None => false,
        }
    }

    fn access(
        &self,
        kind: AccessKind,
        key: u32,
        offset: u64,
        len: usize,
    ) -> Result<core::ops::Range<usize>, MemoryFault> {
        if self.recording {
            self.log.borrow_mut().push(Access {
                kind,
                key,
                offset,
                len,
            });
        }
        let regions = self.regions.borrow();
        let r = regions.get(&key).ok_or(MemoryFault)?;
        let start = usize::try_from(offset).map_err(|_| MemoryFault)?;
        let end = start.checked_add(len).ok_or(MemoryFault)?;
        if end > r.len() {
            return Err(MemoryFault);
        }
        Ok(start..end)
    }
}

impl Memory for TestMemory {
    fn read(&self, key: u32, offset: u64, buf: &mut [u8]) -> Result<(), MemoryFault> {
        let range = self.access(AccessKind::Read, key, offset, buf.len())?;
        let regions = self.regions.borrow();
        let r = regions.get(&key).ok_or(MemoryFault)?;
        buf.copy_from_slice(r.get(range).ok_or(MemoryFault)?);
        Ok(())
    }

    fn write(&self, key: u32, offset: u64, data: &[u8]) -> Result<(), MemoryFault> {
        let range = self.access(AccessKind::Write, key, offset, data.len())?;
        let mut regions = self.regions.borrow_mut();
        let r = regions.get_mut(&key).ok_or(MemoryFault)?;
        r.get_mut(range).ok_or(MemoryFault)?.copy_from_slice(data);
        Ok(())
    }

    fn atomic(&self, key: u32, offset: u64, op: AtomicOp) -> Result<u64, MemoryFault> {
        let range = self.access(AccessKind::Atomic, key, offset, 8)?;
        let mut regions = self.regions.borrow_mut();
        let r = regions.get_mut(&key).ok_or(MemoryFault)?;
        let bytes = r.get_mut(range).ok_or(MemoryFault)?;
        let mut word = [0u8; 8];
        word.copy_from_slice(bytes);
        let orig = u64::from_ne_bytes(word);
        if let Some(new) = op.apply(orig) {
            bytes.copy_from_slice(&new.to_ne_bytes());
        }
        Ok(orig)
    }
}

/// The IPv4 context (IP ID 0, as softverbs sends) of a datagram from `src` to `dst`.
pub(crate) fn ip_ctx(src: SocketAddr, dst: SocketAddr) -> Option<IpContext> {
    match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => Some(IpContext {
            addrs: IpAddrs::V4 {
                src: s,
                dst: d,
                ident: 0,
            },
            src_port: src.port(),
            dst_port: dst.port(),
        }),
        _ => None,
    }
}

/// `repr` emitted with a valid ICRC for `src` → `dst`.
pub(crate) fn emit(repr: &PacketRepr<'_>, src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    let Some(ctx) = ip_ctx(src, dst) else {
        panic!("IPv4 addresses expected: {src} -> {dst}");
    };
    let mut bytes = vec![0u8; repr.buffer_len()];
    match repr.emit(&ctx, &mut bytes) {
        Ok(n) => bytes.truncate(n),
        Err(e) => panic!("emitting a crafted packet failed: {e}; {repr:?}"),
    }
    bytes
}

/// True if the receiver at `dst` accepts the ICRC of `bytes` from `src` (always, in the
/// `cfg(fuzzing)` build of `emu-proto`).
pub(crate) fn icrc_ok(src: SocketAddr, dst: SocketAddr, bytes: &[u8]) -> bool {
    ip_ctx(src, dst).is_some_and(|ctx| check_icrc(&ctx, bytes).is_ok())
}

/// Every completion in `cq`.
pub(crate) fn poll_all(hca: &mut Hca, cq: CqId) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut buf = [WorkCompletion::default(); 16];
    loop {
        match hca.poll_cq(cq, &mut buf) {
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                if n < buf.len() {
                    return out;
                }
            }
            Err(e) => panic!("poll_cq failed: {e}"),
        }
    }
}

/// Deterministic bytes for a payload: a function of `seed` and the byte index only.
pub(crate) fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let x = seed.wrapping_mul(0x9E37_79B9).wrapping_add(i as u32);
            (x ^ (x >> 11)) as u8
        })
        .collect()
}
