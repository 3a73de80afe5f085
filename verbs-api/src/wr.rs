//! Work requests: what an application posts to a send or receive queue (`ibv_send_wr`,
//! `ibv_recv_wr`, `ibv_sge`).
//!
//! Work requests borrow their scatter/gather lists, so posting allocates nothing on the
//! caller's side.

use crate::types::{AccessFlags, SendFlags};

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
    /// `IBV_WR_LOCAL_INV`: invalidates the type 2 memory window whose R_Key is `rkey` (IBTA
    /// §10.6.7.2.4); no packet goes out. A type 1 window, an unknown key or a window of another
    /// PD fails the WR (`LOC_QP_OP_ERR` here, rxe's status too).
    LocalInv {
        /// The R_Key of the window to invalidate.
        rkey: u32,
    },
    /// `IBV_WR_BIND_MW`: binds type 2 window `mw` to `length` bytes at `addr` of the MR whose
    /// lkey is `mr`, with R_Key `rkey` (same key index as the window's, any key byte) and
    /// rights `access`, for use through this QP only (IBTA §10.6.7.2.2). The window must be
    /// unbound (never bound, or invalidated) and `length` non-zero. A bind that breaks a rule
    /// completes with `MW_BIND_ERR` and the QP enters ERR.
    BindMw {
        /// The window's [`handle`](crate::MemoryWindow::handle).
        mw: u32,
        /// The R_Key the window has once bound (`ibv_inc_rkey` of the current one, typically).
        rkey: u32,
        /// The lkey of the MR the window is bound to.
        mr: u32,
        /// Start of the window: a virtual address inside the MR. With
        /// [`AccessFlags::ZERO_BASED`] in `access`, peers address the window from 0.
        addr: u64,
        /// Length in bytes.
        length: u64,
        /// Remote rights through the window (a subset of REMOTE_READ, REMOTE_WRITE,
        /// REMOTE_ATOMIC, plus ZERO_BASED and LOCAL_WRITE which are ignored for access).
        access: AccessFlags,
    },
    /// `IBV_WR_SEND_WITH_INV`: as Send; the responder invalidates the type 2 window (or
    /// MR) whose R_Key is `invalidate_rkey` before completing the receive, and reports it in the
    /// completion (`IBV_WC_WITH_INV`, `invalidated_rkey`). A key it cannot invalidate fails the
    /// receive (`REM_INV_REQ_ERR`, the responder's QP enters ERR) while the sender's WR
    /// succeeds, as rxe does.
    SendWithInv {
        /// The R_Key the responder invalidates.
        invalidate_rkey: u32,
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
            SendOp::LocalInv { .. } => 7,
            SendOp::BindMw { .. } => 8,
            SendOp::SendWithInv { .. } => 9,
        }
    }

    /// True for the operations the local HCA carries out without a packet (BIND_MW,
    /// LOCAL_INV).
    pub const fn is_local(&self) -> bool {
        matches!(self, SendOp::BindMw { .. } | SendOp::LocalInv { .. })
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

/// A type 1 memory window bind (`ibv_mw_bind` with its `ibv_mw_bind_info`): what
/// [`Context::bind_mw`](crate::Context::bind_mw) posts on a QP's send queue.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct MwBind {
    /// Caller's identifier, returned in the BIND_MW completion.
    pub wr_id: u64,
    /// `IBV_SEND_SIGNALED` asks for a completion on success.
    pub flags: SendFlags,
    /// The lkey of the MR to bind to (ignored when `length` is 0).
    pub mr: u32,
    /// Start of the window: a virtual address inside the MR.
    pub addr: u64,
    /// Length in bytes; 0 unbinds the window.
    pub length: u64,
    /// Remote rights through the window.
    pub access: AccessFlags,
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
