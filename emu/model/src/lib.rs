//! `emu-model`: a bounded, exhaustive model checker for emu-proto's RC engine (issue 21).
//!
//! Two [`emu_proto::Hca`]s with one or two connected RC QP pairs run up to four work requests
//! (SEND, WRITE, WRITE_WITH_IMM, READ, FETCH_ADD, CMP_SWAP; receives posted up front or late,
//! for RNR). At every step the network chooses: deliver any datagram in flight (so any
//! reordering), drop it or duplicate it (within a loss and a duplication budget), fire the
//! earliest timer (retransmit, RNR wait) or — with late receives — let an application post its
//! next receive. The explorer visits every state reachable within a depth bound and checks the
//! properties of [`props`] in each; from every state (or only the leaves, for the larger
//! configurations) it also runs the network fairly to quiescence and checks that every work
//! request completed, successfully unless the retry budget could have been spent.
//!
//! ## Why a purpose-built breadth-first search and not `stateright`
//!
//! `stateright` is not among the packages this project vendors, and it would not save much:
//! - the state is two engines behind a public API; identity is a fingerprint of a canonical
//!   encoding ([`emu_proto::Hca::canonical_state`], rebased to the current time, plus memory,
//!   flight multiset and polled completions), not a `Hash + Eq` value type it could own;
//! - the liveness property we need is "from *every* reachable state, a lossless fair network
//!   completes everything", a deterministic run per state, which stateright's `eventually`
//!   (checked along terminal paths only) does not express;
//! - a violation must come out as a schedule for emu-proto's packet-level harness, with
//!   datagram indices in that harness's order, which needs the concrete in-flight order of
//!   the path's states (kept here, forgotten by a generic checker's hashing);
//! - breadth-first order gives the shortest schedule, and the loop is 150 lines.
//!
//! ## Time
//!
//! Delivery takes no time; time moves only when a timer fires, to the earliest deadline. The
//! fingerprint holds deadlines as offsets from the current time (never absolute time), so
//! states that differ only by when they happened are one state.
//!
//! ## What this is not
//!
//! A proof: the bounds (depth, budgets, four work requests, small payloads) are the limits of
//! every claim. It checks the engine through its public API, so it says nothing of drivers.

pub mod config;
pub mod explore;
pub mod props;
pub mod scenario;
pub mod system;

pub use config::{Config, FairCheck, Op, Recvs, Side, WrSpec};
pub use explore::{Report, Violation, explore};
