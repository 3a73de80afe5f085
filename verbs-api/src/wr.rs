//! Work requests: what an application posts to a send or receive queue (`ibv_send_wr`,
//! `ibv_recv_wr`, `ibv_sge`).
//!
//! Work requests borrow their scatter/gather lists, so posting allocates nothing on the
//! caller's side.

use crate::types::SendFlags;

/// One scatter/gather element: `length` bytes at virtual address `addr` inside the memory
/// region whose lkey is `lkey` (`ibv_sge`).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Sge {
    /// Start address, inside the MR (`Mr::addr()` + offset).
    pub addr: u64,
    /// Byte count; zero-length SGEs are skipped (rc-transport.md §7.4).
    pub length: u32,
    /// Local key of the MR.
    pub lkey: u32,
}

/// The operation of a send work request (`ibv_wr_opcode` plus its `wr` union).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum SendOp {
    /// `IBV_WR_SEND`: consumes a receive WR at the peer.
    Send,
    /// `IBV_WR_SEND_WITH_IMM`: as Send, delivering 32 bits of immediate data.
    SendWithImm {
        /// Immediate data, delivered verbatim in the peer's receive completion.
        imm: u32,
    },
    /// `IBV_WR_RDMA_WRITE`: writes the gathered data at the peer's `remote_addr`.
    RdmaWrite {
        /// Peer virtual address.
        remote_addr: u64,
        /// Peer memory key.
        rkey: u32,
    },
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`: as RdmaWrite, then consumes a receive WR at the peer.
    RdmaWriteWithImm {
        /// Peer virtual address.
        remote_addr: u64,
        /// Peer memory key.
        rkey: u32,
        /// Immediate data.
        imm: u32,
    },
    /// `IBV_WR_RDMA_READ`: reads the peer's memory into the local scatter list.
    RdmaRead {
        /// Peer virtual address.
        remote_addr: u64,
        /// Peer memory key.
        rkey: u32,
    },
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`: if the peer's 8 bytes at `remote_addr` equal `compare`,
    /// replace them by `swap`; the original value lands in the local 8-byte SGE.
    AtomicCmpAndSwp {
        /// Peer virtual address, 8-byte aligned.
        remote_addr: u64,
        /// Peer memory key.
        rkey: u32,
        /// Value to compare with.
        compare: u64,
        /// Value to store on equality.
        swap: u64,
    },
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`: adds `add` to the peer's 8 bytes at `remote_addr`; the
    /// original value lands in the local 8-byte SGE.
    AtomicFetchAndAdd {
        /// Peer virtual address, 8-byte aligned.
        remote_addr: u64,
        /// Peer memory key.
        rkey: u32,
        /// Value to add (wrapping).
        add: u64,
    },
}

impl SendOp {
    /// rdma-core's `ibv_wr_opcode` value.
    pub const fn raw(&self) -> u32 {
        match self {
            SendOp::RdmaWrite { .. } => 0,
            SendOp::RdmaWriteWithImm { .. } => 1,
            SendOp::Send => 2,
            SendOp::SendWithImm { .. } => 3,
            SendOp::RdmaRead { .. } => 4,
            SendOp::AtomicCmpAndSwp { .. } => 5,
            SendOp::AtomicFetchAndAdd { .. } => 6,
        }
    }

    /// True for the two atomics, which need exactly one 8-byte local SGE and an 8-byte aligned
    /// remote address.
    pub const fn is_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::AtomicCmpAndSwp { .. } | SendOp::AtomicFetchAndAdd { .. }
        )
    }

    /// True for operations that read peer memory (READ and atomics), limited by
    /// `max_rd_atomic`.
    pub const fn is_read_or_atomic(&self) -> bool {
        matches!(self, SendOp::RdmaRead { .. }) || self.is_atomic()
    }

    /// The immediate data, for the `*_WITH_IMM` operations.
    pub const fn imm(&self) -> Option<u32> {
        match self {
            SendOp::SendWithImm { imm } | SendOp::RdmaWriteWithImm { imm, .. } => Some(*imm),
            _ => None,
        }
    }
}

/// The destination of a send on a UD QP (`ibv_send_wr.wr.ud`): an address handle, the remote QP
/// number and the Q_Key.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct UdDest {
    /// The address handle's [`handle`](crate::AddressHandle::handle), from the same context as
    /// the QP. A destroyed or unknown handle fails the post with `InvalidArgument`.
    pub ah: u32,
    /// The destination QP number (24-bit).
    pub remote_qpn: u32,
    /// The Q_Key sent in the DETH. With the high bit set ([`QKEY_CONTROLLED`]) the QP's own Q_Key
    /// is sent instead (IBTA 10.2.4, controlled Q_Keys).
    pub remote_qkey: u32,
}

/// A Q_Key with this bit set in a work request is a controlled Q_Key: the sending QP's Q_Key
/// replaces it.
pub const QKEY_CONTROLLED: u32 = 0x8000_0000;

/// A send work request (`ibv_send_wr`).
///
/// The payload is the concatenation of `sg_list`, or `inline_data` when
/// [`SendFlags::INLINE`] is set (then `sg_list` must be empty and no lkey is checked). On a UD
/// QP `ud` names the destination and is required; other QP types ignore it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct SendWr<'a> {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Operation and its remote arguments.
    pub op: SendOp,
    /// Local buffers: gathered for SEND/WRITE, scattered into for READ/atomics.
    pub sg_list: &'a [Sge],
    /// Inline payload, used only with [`SendFlags::INLINE`]; copied at post time.
    pub inline_data: &'a [u8],
    /// Flags.
    pub flags: SendFlags,
    /// UD destination (`wr.ud`); `None` for connected QPs.
    pub ud: Option<UdDest>,
}

impl<'a> SendWr<'a> {
    /// A signaled work request with the given operation and SGEs.
    pub fn new(wr_id: u64, op: SendOp, sg_list: &'a [Sge]) -> SendWr<'a> {
        SendWr {
            wr_id,
            op,
            sg_list,
            inline_data: &[],
            flags: SendFlags::SIGNALED,
            ud: None,
        }
    }

    /// A signaled inline work request carrying `data`.
    pub fn inline(wr_id: u64, op: SendOp, data: &'a [u8]) -> SendWr<'a> {
        SendWr {
            wr_id,
            op,
            sg_list: &[],
            inline_data: data,
            flags: SendFlags::SIGNALED | SendFlags::INLINE,
            ud: None,
        }
    }

    /// The same request with `flags` replaced.
    pub fn with_flags(self, flags: SendFlags) -> SendWr<'a> {
        SendWr { flags, ..self }
    }

    /// The same request sent as a datagram to `ud` (for UD QPs).
    pub fn with_ud(self, ud: UdDest) -> SendWr<'a> {
        SendWr {
            ud: Some(ud),
            ..self
        }
    }

    /// Total payload length: the inline length or the sum of the SGE lengths (saturating).
    pub fn total_len(&self) -> u64 {
        if self.flags.contains(SendFlags::INLINE) {
            self.inline_data.len() as u64
        } else {
            self.sg_list.iter().map(|s| u64::from(s.length)).sum()
        }
    }
}

/// A receive work request (`ibv_recv_wr`): where an incoming SEND's payload is scattered.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RecvWr<'a> {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Buffers to scatter into, in order.
    pub sg_list: &'a [Sge],
}

impl<'a> RecvWr<'a> {
    /// A receive work request.
    pub fn new(wr_id: u64, sg_list: &'a [Sge]) -> RecvWr<'a> {
        RecvWr { wr_id, sg_list }
    }
}
