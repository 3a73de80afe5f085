//! Fabricated evidence for the invariants' unit tests: a run of a few nodes whose logs and
//! MR contents are built in memory, operation by operation, as a correct device would leave
//! them ([`Fixture::write`], [`Fixture::send`], …). A test then damages one thing (a byte, a
//! status, a fact) and checks that exactly the invariant concerned reports it. Not used
//! outside tests; it writes files only in [`Fixture::save`].

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use super::mr::MrFile;
use super::{Evidence, Input, NodeData, NodeFacts, SUCCESS};
use crate::run::layout::{self, RecordKind, Workload};
use crate::run::log::{Entry, LogRead, OpKind, Posted};
use crate::run::proto::QpParams;

/// The seed of every fixture run.
pub(super) const SEED: u64 = 0x5eed;

/// When every fixture run starts (ms since the Unix epoch).
pub(super) const T0: u64 = 1_000_000;

/// The QP parameters of every fixture run: ACK timeout ≈ 67 ms, retry budget ≈ 536 ms.
pub(super) const QP: QpParams = QpParams {
    timeout: 14,
    retry_cnt: 7,
    rnr_retry: 7,
    recovery: crate::recovery::RecoveryArg::Ibta,
};

/// The fields of a send-queue completion, to build [`Entry::Send`] from.
#[derive(Clone, Debug)]
pub(super) struct Wc {
    pub(super) peer: u32,
    pub(super) wr: u64,
    pub(super) op: OpKind,
    pub(super) status: u32,
    pub(super) posted: u64,
    pub(super) at: u64,
    pub(super) seq: u64,
    pub(super) len: u32,
    pub(super) roff: Option<u64>,
    pub(super) loff: Option<u64>,
    pub(super) imm: Option<u32>,
    pub(super) kind: Option<RecordKind>,
    pub(super) val: Option<u64>,
}

impl Wc {
    pub(super) fn entry(self) -> Entry {
        Entry::Send {
            peer: self.peer,
            qp: 0,
            wr: self.wr,
            op: self.op,
            status: self.status,
            posted: self.posted,
            at: self.at,
            seq: self.seq,
            len: self.len,
            roff: self.roff,
            loff: self.loff,
            imm: self.imm,
            kind: self.kind,
            val: self.val,
        }
    }
}

/// A fabricated run: evidence plus every node's log and MR contents.
pub(super) struct Fixture {
    pub(super) ev: Evidence,
    pub(super) data: Vec<NodeData>,
    /// The fabricated clock, ms since the Unix epoch.
    pub(super) now: u64,
}

impl Fixture {
    /// A two-node `mixed` run that did one of everything on each link (its READs from remote
    /// offset `read_roff`), and drained.
    pub(super) fn busy(read_roff: u64) -> Fixture {
        let mut fx = Fixture::new(2, Workload::Mixed);
        for (i, j) in [(0, 1), (1, 0)] {
            fx.write(i, j);
            fx.send(i, j, 7);
            fx.read(i, j, read_roff);
            fx.faa(i, j);
            fx.fin(i, j);
        }
        fx.end_all();
        fx
    }

    /// A clean run of `nodes` nodes that has done nothing yet: every node finished, drained
    /// and exited 0; its log holds a start line; its MR holds its READ pattern and zeros.
    pub(super) fn new(nodes: u32, workload: Workload) -> Fixture {
        let healthy = NodeFacts {
            finished: true,
            drained: true,
            exited_cleanly: true,
            ..NodeFacts::default()
        };
        let data = (0..nodes)
            .map(|i| {
                let peers = layout::peers(nodes, workload, i);
                let mut mr = vec![0u8; layout::region_len(peers.len()) as usize];
                let at = layout::PATTERN_OFF as usize;
                let pattern = layout::pattern(SEED, i, 0, layout::PATTERN_LEN as usize);
                mr[at..at + pattern.len()].copy_from_slice(&pattern);
                let start = Entry::Start {
                    node: i,
                    generation: 0,
                    at: T0,
                    peers,
                };
                NodeData {
                    log: Some(LogRead {
                        entries: vec![start],
                        ..LogRead::default()
                    }),
                    mr: Some(MrFile::Memory(mr)),
                }
            })
            .collect();
        Fixture {
            ev: Evidence {
                nodes,
                workload,
                qps_per_peer: 1,
                seed: SEED,
                qp: QP,
                slack: Duration::from_millis(500),
                run_dir: std::env::temp_dir(),
                expect_errors: false,
                max_copies: 1,
                facts: vec![healthy; nodes as usize],
            },
            data,
            now: T0,
        }
    }

    /// What the invariant functions take.
    pub(super) fn input(&self) -> Input<'_> {
        Input {
            ev: &self.ev,
            data: &self.data,
        }
    }

    /// Node `i`'s facts.
    pub(super) fn fact(&mut self, i: u32) -> &mut NodeFacts {
        &mut self.ev.facts[i as usize]
    }

    /// Node `i`'s log.
    pub(super) fn log(&mut self, i: u32) -> &mut LogRead {
        self.data[i as usize].log.as_mut().unwrap()
    }

    /// Node `i`'s MR contents.
    pub(super) fn mr(&mut self, i: u32) -> &mut Vec<u8> {
        match self.data[i as usize].mr.as_mut().unwrap() {
            MrFile::Memory(bytes) => bytes,
            MrFile::File { .. } => panic!("the fixture holds its MR files in memory"),
        }
    }

    /// Appends `e` to node `i`'s log.
    pub(super) fn push(&mut self, i: u32, e: Entry) {
        self.log(i).entries.push(e);
    }

    /// Puts `bytes` at `off` in node `i`'s MR.
    pub(super) fn put(&mut self, i: u32, off: u64, bytes: &[u8]) {
        let off = off as usize;
        self.mr(i)[off..off + bytes.len()].copy_from_slice(bytes);
    }

    /// Flips one bit of the byte at `off` in node `i`'s MR.
    pub(super) fn flip(&mut self, i: u32, off: u64) {
        self.mr(i)[off as usize] ^= 1;
    }

    /// Start of the link block for `peer` in node `i`'s MR.
    pub(super) fn link_base(&self, i: u32, peer: u32) -> u64 {
        let pos = layout::position(self.ev.nodes, self.ev.workload, i, peer).unwrap();
        layout::link_base(pos)
    }

    /// Completions logged by node `i` for `peer` so far, on its send queue (`recv` false)
    /// or its receive queue.
    fn logged(&mut self, i: u32, peer: u32, recv: bool) -> Vec<Entry> {
        let on_link = |e: &&Entry| match e {
            Entry::Send { peer: p, .. } => !recv && *p == peer,
            Entry::Recv { peer: p, .. } => recv && *p == peer,
            _ => false,
        };
        self.log(i)
            .entries
            .iter()
            .filter(on_link)
            .cloned()
            .collect()
    }

    /// The next successful send-queue completion of node `i` to `j` for `op`: wr_id and
    /// sequence number follow the ones already logged; posted and polled at the next tick.
    pub(super) fn next_wc(&mut self, i: u32, j: u32, op: OpKind) -> Wc {
        let done = self.logged(i, j, false);
        let seq = done
            .iter()
            .filter(|e| matches!(e, Entry::Send { op: o, .. } if *o == op))
            .count() as u64;
        self.now += 1;
        Wc {
            peer: j,
            wr: done.len() as u64 + 1,
            op,
            status: SUCCESS,
            posted: self.now,
            at: self.now,
            seq,
            len: 8,
            roff: None,
            loff: None,
            imm: None,
            kind: None,
            val: None,
        }
    }

    /// A successful WRITE of a 64-byte record from `i` to `j`; returns where it landed.
    pub(super) fn write(&mut self, i: u32, j: u32) -> u64 {
        let mut wc = self.next_wc(i, j, OpKind::Write);
        wc.len = 64;
        wc.roff = Some(wc.seq * 64);
        let record = layout::record(SEED, RecordKind::Write, i, j, wc.seq, 0, 64);
        let off = self.link_base(j, i) + layout::WRITE_OFF + wc.seq * 64;
        self.put(j, off, &record);
        self.push(i, wc.entry());
        off
    }

    /// A successful fin WRITE from `i` to `j`; returns the fin word's offset.
    pub(super) fn fin(&mut self, i: u32, j: u32) -> u64 {
        let pos = layout::position(self.ev.nodes, self.ev.workload, j, i).unwrap();
        let off = layout::FIN_OFF + 8 * pos as u64;
        self.put(j, off, &1u64.to_le_bytes());
        let wc = self.next_wc(i, j, OpKind::Fin);
        self.push(i, wc.entry());
        off
    }

    /// A successful SEND with immediate `imm` of a 48-byte record from `i` to `j`, received
    /// by `j`; returns where it landed.
    pub(super) fn send(&mut self, i: u32, j: u32, imm: u32) -> u64 {
        self.send_as(i, j, RecordKind::Send, imm)
    }

    /// A successful SEND of a `kind` record (send, ping or pong) with immediate `imm` from `i`
    /// to `j`, received by `j`; returns where it landed.
    pub(super) fn send_as(&mut self, i: u32, j: u32, kind: RecordKind, imm: u32) -> u64 {
        let mut wc = self.next_wc(i, j, OpKind::Send);
        (wc.len, wc.imm, wc.kind) = (48, Some(imm), Some(kind));
        let record = layout::record(SEED, kind, i, j, wc.seq, imm, 48);
        let off = self.link_base(j, i) + layout::RECV_OFF + wc.seq * layout::RECV_SLOT;
        self.put(j, off, &record);
        let recv = Entry::Recv {
            peer: i,
            qp: 0,
            wr: wc.seq + 1,
            status: SUCCESS,
            at: wc.at,
            len: 48,
            imm: Some(imm),
        };
        self.push(i, wc.entry());
        self.push(j, recv);
        off
    }

    /// A successful READ by `i` of 32 bytes of `j`'s pattern at +`roff`; returns where it
    /// landed in `i`'s MR.
    pub(super) fn read(&mut self, i: u32, j: u32, roff: u64) -> u64 {
        let mut wc = self.next_wc(i, j, OpKind::Read);
        (wc.len, wc.roff, wc.loff) = (32, Some(roff), Some(wc.seq * 32));
        let off = self.link_base(i, j) + layout::READ_OFF + wc.seq * 32;
        self.put(i, off, &layout::pattern(SEED, j, roff, 32));
        self.push(i, wc.entry());
        off
    }

    /// A successful FETCH_ADD by `i` on `j`'s counter; returns the landing slot's offset.
    pub(super) fn faa(&mut self, i: u32, j: u32) -> u64 {
        let mut wc = self.next_wc(i, j, OpKind::Faa);
        let counter = layout::COUNTER_OFF as usize;
        let mut word = [0u8; 8];
        word.copy_from_slice(&self.mr(j)[counter..counter + 8]);
        let val = u64::from_ne_bytes(word);
        self.put(j, layout::COUNTER_OFF, &(val + 1).to_ne_bytes());
        wc.val = Some(val);
        let off = self.link_base(i, j) + layout::FAA_OFF + 8 * wc.seq;
        self.put(i, off, &val.to_ne_bytes());
        self.push(i, wc.entry());
        off
    }

    /// A completion of node `i` to `j` for `op` with error `status`; nothing lands.
    pub(super) fn fail(&mut self, i: u32, j: u32, op: OpKind, status: u32) {
        let mut wc = self.next_wc(i, j, op);
        wc.status = status;
        self.push(i, wc.entry());
    }

    /// Node `i`'s end line: what it posted is what it logged, per peer.
    pub(super) fn end(&mut self, i: u32) {
        let peers = layout::peers(self.ev.nodes, self.ev.workload, i);
        let posted = peers
            .into_iter()
            .map(|peer| Posted {
                peer,
                qp: 0,
                send: self.logged(i, peer, false).len() as u64,
                recv: self.logged(i, peer, true).len() as u64,
            })
            .collect();
        self.now += 1;
        let end = Entry::End {
            at: self.now,
            posted,
        };
        self.push(i, end);
    }

    /// Every node's end line.
    pub(super) fn end_all(&mut self) {
        for i in 0..self.ev.nodes {
            self.end(i);
        }
    }

    /// Writes every node's log and MR file into `dir`, as the nodes of a run would.
    pub(super) fn save(&self, dir: &Path) {
        for (i, d) in self.data.iter().enumerate() {
            let mut text = Vec::new();
            for e in &d.log.as_ref().unwrap().entries {
                serde_json::to_writer(&mut text, e).unwrap();
                text.push(b'\n');
            }
            std::fs::write(dir.join(layout::log_file(i as u32, 0)), text).unwrap();
            let MrFile::Memory(mr) = d.mr.as_ref().unwrap() else {
                panic!("the fixture holds its MR files in memory");
            };
            std::fs::write(dir.join(layout::mr_file(i as u32, 0)), mr).unwrap();
        }
    }
}
