//! `softverbs run --self-test KIND`: after the run, and before the check, plants one failure of
//! a kind the verifier must catch in the evidence (the nodes' logs and MR files), so that a
//! run that would pass fails. Each kind stands for a device bug: a lost receive completion, a
//! FETCH_ADD executed twice, a WRITE byte placed at the wrong address, an ACK sent for a WRITE
//! that was never placed, a PSN gap the responder accepted (the next SEND landed in the
//! receive WR meant for the lost one). A test-only switch: it never changes what the nodes do,
//! only the evidence they leave.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::run::layout::{self, Workload};
use crate::run::log::{Entry, OpKind, read_log};

/// A failure kind `--self-test` plants.
#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SelfTest {
    /// Removes a successful receive completion from the receiver's log.
    LostReceive,
    /// Adds one to a FETCH_ADD target's counter: an atomic executed twice.
    DuplicatedAtomic,
    /// Moves a successful WRITE record one byte up at its target.
    MisplacedWrite,
    /// Zeroes a successful WRITE record at its target: ACKed but never placed.
    AckWithoutDelivery,
    /// Puts the record of a node's second SEND in the receive slot of its first: the first
    /// was lost and its PSN gap accepted.
    AcceptedPsnGap,
}

impl SelfTest {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            SelfTest::LostReceive => "lost-receive",
            SelfTest::DuplicatedAtomic => "duplicated-atomic",
            SelfTest::MisplacedWrite => "misplaced-write",
            SelfTest::AckWithoutDelivery => "ack-without-delivery",
            SelfTest::AcceptedPsnGap => "accepted-psn-gap",
        }
    }
}

/// Where a run's evidence is.
#[derive(Copy, Clone, Debug)]
pub struct Run<'a> {
    /// The run directory.
    pub dir: &'a Path,
    /// Node count.
    pub nodes: u32,
    /// Workload.
    pub workload: Workload,
    /// RC QPs per pair of peers (`--qps-per-peer`).
    pub qps_per_peer: u32,
}

impl Run<'_> {
    /// The link position of node `i`'s QP `q` to `j`.
    fn position(&self, i: u32, j: u32, q: u32) -> Option<usize> {
        layout::link_position(self.nodes, self.workload, self.qps_per_peer.max(1), i, j, q)
    }
}

/// One successful send-queue completion of node `i`: (i, peer, op, seq, len, roff, qp).
type Done = (u32, u32, OpKind, u64, u32, Option<u64>, u32);

/// Every successful send-queue completion of every node, in node and log order.
fn successes(run: Run<'_>) -> Vec<Done> {
    let mut all = Vec::new();
    for i in 0..run.nodes {
        let Ok(log) = read_log(&run.dir.join(layout::log_file(i, 0))) else {
            continue;
        };
        for e in &log.entries {
            if let Entry::Send {
                peer,
                qp,
                op,
                status: 0,
                seq,
                len,
                roff,
                ..
            } = *e
            {
                all.push((i, peer, op, seq, len, roff, qp));
            }
        }
    }
    all
}

/// Plants `kind` in the evidence of `run`; says what it changed.
///
/// Errors: the run has no operation of the kind needed (say which), or a file could not be
/// read or written.
pub fn plant(kind: SelfTest, run: Run<'_>) -> Result<String, String> {
    let done = successes(run);
    let find = |op: OpKind| done.iter().rev().find(|d| d.2 == op).copied();
    let none = |what: &str| format!("self-test {}: the run has no {what}", kind.name());
    match kind {
        SelfTest::LostReceive => {
            let d = find(OpKind::Send).ok_or_else(|| none("successful SEND"))?;
            drop_receive(run, d)
        }
        SelfTest::DuplicatedAtomic => {
            let d = find(OpKind::Faa).ok_or_else(|| none("successful FETCH_ADD"))?;
            let path = run.dir.join(layout::mr_file(d.1, 0));
            let mut word = [0u8; 8];
            read_at(&path, layout::COUNTER_OFF, &mut word)?;
            let counter = u64::from_ne_bytes(word) + 1;
            write_at(&path, layout::COUNTER_OFF, &counter.to_ne_bytes())?;
            Ok(format!("node {}'s counter, now {counter}", d.1))
        }
        SelfTest::MisplacedWrite | SelfTest::AckWithoutDelivery => {
            let d = find(OpKind::Write).ok_or_else(|| none("successful WRITE"))?;
            let pos = run
                .position(d.1, d.0, d.6)
                .ok_or_else(|| none("WRITE between peers"))?;
            let off = layout::link_base(pos) + layout::WRITE_OFF + d.5.unwrap_or(0);
            let path = run.dir.join(layout::mr_file(d.1, 0));
            let mut record = vec![0u8; d.4 as usize + 1];
            read_at(&path, off, &mut record[..d.4 as usize])?;
            if kind == SelfTest::MisplacedWrite {
                record.rotate_right(1);
            } else {
                record.fill(0);
            }
            write_at(&path, off, &record)?;
            Ok(format!(
                "node {} → node {} WRITE record {} at +{off:#x}",
                d.0, d.1, d.3
            ))
        }
        SelfTest::AcceptedPsnGap => {
            let (first, second) = two_sends(&done).ok_or_else(|| none("two SENDs on a QP"))?;
            let pos = run
                .position(first.1, first.0, first.6)
                .ok_or_else(|| none("SEND between peers"))?;
            let slot =
                |seq: u64| layout::link_base(pos) + layout::RECV_OFF + seq * layout::RECV_SLOT;
            let path = run.dir.join(layout::mr_file(first.1, 0));
            let mut bytes = vec![0u8; layout::RECV_SLOT as usize];
            read_at(&path, slot(second.3), &mut bytes)?;
            write_at(&path, slot(first.3), &bytes)?;
            Ok(format!(
                "node {}'s receive slot {} from node {} now holds record {}",
                first.1, first.3, first.0, second.3
            ))
        }
    }
}

/// The last two successful SENDs of one node on one QP, in order, if any node has two.
fn two_sends(done: &[Done]) -> Option<(Done, Done)> {
    let sends: Vec<&Done> = done.iter().filter(|d| d.2 == OpKind::Send).collect();
    sends.windows(2).rev().find_map(|w| {
        (w[0].0 == w[1].0 && w[0].1 == w[1].1 && w[0].6 == w[1].6 && w[1].3 == w[0].3 + 1)
            .then(|| (*w[0], *w[1]))
    })
}

/// Removes the receive completion of SEND `d` from its receiver's log.
fn drop_receive(run: Run<'_>, d: Done) -> Result<String, String> {
    let path = run.dir.join(layout::log_file(d.1, 0));
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let wanted = |line: &str| {
        matches!(
            serde_json::from_str::<Entry>(line),
            Ok(Entry::Recv { peer, qp, wr, status: 0, .. })
                if peer == d.0 && qp == d.6 && wr == d.3 + 1
        )
    };
    let kept: Vec<&str> = text.lines().filter(|l| !wanted(l)).collect();
    if kept.len() == text.lines().count() {
        return Err(format!(
            "self-test lost-receive: node {} logged no receive completion for slot {}",
            d.1, d.3
        ));
    }
    let mut out = kept.join("\n");
    out.push('\n');
    std::fs::write(&path, out).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(format!(
        "node {}'s receive completion of node {}'s SEND in slot {}",
        d.1, d.0, d.3
    ))
}

fn read_at(path: &Path, off: u64, buf: &mut [u8]) -> Result<(), String> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    file.read_exact_at(buf, off)
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn write_at(path: &Path, off: u64, buf: &[u8]) -> Result<(), String> {
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    file.write_all_at(buf, off)
        .map_err(|e| format!("{}: {e}", path.display()))
}
