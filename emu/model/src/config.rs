//! What system the explorer builds: the work requests, the connection options and the
//! network's budgets. Named configurations live in [`Config::named`].

use verbs_api::{Mtu, Recovery};

/// Which node.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Side {
    /// Node a (127.0.0.1), seed 1, as in the packet-level harness.
    A,
    /// Node b (127.0.0.2), seed 2.
    B,
}

impl Side {
    /// Index into `[a, b]`.
    pub fn index(self) -> usize {
        match self {
            Side::A => 0,
            Side::B => 1,
        }
    }

    /// The other node.
    pub fn peer(self) -> Side {
        match self {
            Side::A => Side::B,
            Side::B => Side::A,
        }
    }
}

/// The operation of one modelled work request.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `IBV_WR_SEND`: consumes a receive at the peer.
    Send,
    /// `IBV_WR_RDMA_WRITE`.
    Write,
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`: consumes a receive at the peer.
    WriteImm,
    /// `IBV_WR_RDMA_READ`.
    Read,
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
    FetchAdd,
    /// `IBV_WR_ATOMIC_CMP_AND_SWP` (the compare always matches the initial value).
    CmpSwap,
}

impl Op {
    /// True if the operation consumes a receive WQE at the responder.
    pub fn consumes_recv(self) -> bool {
        matches!(self, Op::Send | Op::WriteImm)
    }

    /// True for the two atomics (8 bytes, whatever the configured length).
    pub fn is_atomic(self) -> bool {
        matches!(self, Op::FetchAdd | Op::CmpSwap)
    }
}

/// One work request: its operation, the node that posts it and the connection (QP pair).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct WrSpec {
    /// The operation.
    pub op: Op,
    /// The requester.
    pub from: Side,
    /// The QP pair (0 or 1).
    pub pair: usize,
}

impl WrSpec {
    /// `op` from a on pair 0.
    pub fn a(op: Op) -> WrSpec {
        WrSpec {
            op,
            from: Side::A,
            pair: 0,
        }
    }
}

/// When the responders' receive WQEs are posted.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Recvs {
    /// All before the first send is posted.
    Posted,
    /// Each is one of the explorer's choices (the application posts late: RNR).
    Late,
}

/// What the fairness check runs from.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum FairCheck {
    /// From every reachable state.
    Every,
    /// From terminal states and the states at the depth bound only (cheaper).
    Leaves,
}

/// One configuration of the explorer.
#[derive(Clone, Debug)]
pub struct Config {
    /// Name, for reports.
    pub name: String,
    /// QP pairs (1 or 2).
    pub pairs: usize,
    /// The work requests, posted in this order before the network starts.
    pub wrs: Vec<WrSpec>,
    /// Payload bytes of SEND/WRITE/READ (atomics move 8).
    pub len: u32,
    /// Path MTU.
    pub mtu: Mtu,
    /// When receives are posted.
    pub recvs: Recvs,
    /// Datagrams the network may drop on one path.
    pub loss_budget: u8,
    /// Datagrams the network may duplicate on one path.
    pub dup_budget: u8,
    /// Maximum schedule length explored.
    pub depth: u32,
    /// `timeout` (local ACK timeout exponent) of every QP.
    pub timeout: u8,
    /// `retry_cnt` of every QP.
    pub retry_cnt: u8,
    /// `rnr_retry` of every QP (7: infinite).
    pub rnr_retry: u8,
    /// `min_rnr_timer` of every QP.
    pub min_rnr_timer: u8,
    /// `max_rd_atomic` and `max_dest_rd_atomic` of every QP.
    pub max_rd_atomic: u8,
    /// Where the fairness check runs from.
    pub fair: FairCheck,
    /// Every WRITE and WRITE_WITH_IMM targets the first one's address (single-packet
    /// payloads only), so that a stale duplicate executed again would overwrite a later
    /// write's data and be seen.
    pub shared_target: bool,
    /// Stop after this many distinct states (a safety net for the machine, not a bound the
    /// report may hide: a run that hits it says so).
    pub max_states: usize,
    /// Loss recovery of every QP (`--recovery sr`: selective repeat, the softverbs extension,
    /// on both ends).
    pub recovery: Recovery,
}

impl Config {
    /// The packet-level harness's defaults (`Opts::default()` in emu-proto's tests) and no
    /// work requests.
    pub fn base(name: &str) -> Config {
        Config {
            name: name.to_string(),
            pairs: 1,
            wrs: Vec::new(),
            len: 16,
            mtu: Mtu::Mtu256,
            recvs: Recvs::Posted,
            loss_budget: 1,
            dup_budget: 1,
            depth: 12,
            timeout: 8,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 4,
            fair: FairCheck::Every,
            shared_target: false,
            max_states: 10_000_000,
            recovery: Recovery::Ibta,
        }
    }

    /// The configurations by name: `small` runs in `cargo test`; the others from
    /// `scripts/model-check.sh`.
    pub fn named(name: &str) -> Option<Config> {
        use Op::*;
        let mut c = Config::base(name);
        match name {
            "small" => {
                c.wrs = vec![WrSpec::a(Send), WrSpec::a(Read)];
                c.depth = 10;
            }
            "small-exhaust" => {
                c.wrs = vec![WrSpec::a(Write), WrSpec::a(FetchAdd)];
                c.retry_cnt = 1;
                c.loss_budget = 2;
                c.dup_budget = 0;
                c.depth = 12;
            }
            "rnr" => {
                c.wrs = vec![WrSpec::a(Send), WrSpec::a(WriteImm)];
                c.recvs = Recvs::Late;
                c.rnr_retry = 2;
                c.depth = 12;
            }
            "mix4" => {
                c.wrs = vec![
                    WrSpec::a(Send),
                    WrSpec::a(Write),
                    WrSpec::a(Read),
                    WrSpec::a(FetchAdd),
                ];
                c.depth = 8;
                c.fair = FairCheck::Leaves;
            }
            "atomics" => {
                c.wrs = vec![WrSpec::a(FetchAdd), WrSpec::a(CmpSwap), WrSpec::a(WriteImm)];
                c.max_rd_atomic = 1;
                c.depth = 11;
                c.fair = FairCheck::Leaves;
            }
            "multi-packet" => {
                c.wrs = vec![WrSpec::a(Write), WrSpec::a(Read)];
                c.len = 300;
                c.depth = 9;
                c.fair = FairCheck::Leaves;
            }
            "bidir" => {
                c.wrs = vec![
                    WrSpec::a(Send),
                    WrSpec {
                        op: Read,
                        from: Side::B,
                        pair: 0,
                    },
                    WrSpec::a(FetchAdd),
                ];
                c.depth = 9;
                c.fair = FairCheck::Leaves;
            }
            "two-qps" => {
                c.pairs = 2;
                c.wrs = vec![
                    WrSpec::a(Send),
                    WrSpec {
                        op: Write,
                        from: Side::A,
                        pair: 1,
                    },
                    WrSpec::a(Read),
                ];
                c.depth = 9;
                c.fair = FairCheck::Leaves;
            }
            "overwrite" => {
                c.wrs = vec![WrSpec::a(Write), WrSpec::a(WriteImm), WrSpec::a(Write)];
                c.shared_target = true;
                c.dup_budget = 2;
                c.depth = 8;
                c.fair = FairCheck::Leaves;
            }
            "loss2" => {
                c.wrs = vec![WrSpec::a(Send), WrSpec::a(Read), WrSpec::a(CmpSwap)];
                c.loss_budget = 2;
                c.dup_budget = 0;
                c.depth = 9;
                c.fair = FairCheck::Leaves;
            }
            _ => return None,
        }
        Some(c)
    }

    /// The names [`Config::named`] knows, in the order the script runs them.
    pub const NAMES: [&'static str; 10] = [
        "small",
        "small-exhaust",
        "rnr",
        "mix4",
        "atomics",
        "multi-packet",
        "bidir",
        "two-qps",
        "overwrite",
        "loss2",
    ];

    /// The slot of each work request in both nodes' memory: local buffer at `slot × k`,
    /// remote target (and receive buffer) at `slot × k + slot / 2`.
    pub fn slot(&self) -> u64 {
        (u64::from(self.len.max(8)) * 2).next_multiple_of(64)
    }

    /// Offset of work request `k`'s remote target in the responder's MR: `slot × k + slot / 2`,
    /// or the first WRITE's with [`Config::shared_target`].
    pub fn target(&self, k: usize) -> u64 {
        let own = |k: usize| self.slot() * k as u64 + self.slot() / 2;
        let is_write = |op: Op| matches!(op, Op::Write | Op::WriteImm);
        match self.wrs.get(k) {
            Some(w) if self.shared_target && is_write(w.op) => {
                let first = self.wrs.iter().position(|w| is_write(w.op)).unwrap_or(k);
                own(first)
            }
            _ => own(k),
        }
    }

    /// The work requests after `k` that write `k`'s target too.
    pub fn later_writers(&self, k: usize) -> Vec<usize> {
        (k + 1..self.wrs.len())
            .filter(|&j| {
                matches!(self.wrs[j].op, Op::Write | Op::WriteImm)
                    && self.wrs[j].from == self.wrs[k].from
                    && self.target(j) == self.target(k)
            })
            .collect()
    }

    /// Bytes a work request moves.
    pub fn len_of(&self, op: Op) -> u32 {
        if op.is_atomic() { 8 } else { self.len }
    }
}
