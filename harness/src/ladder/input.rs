//! Reading the ladder's input: a pcap written by softverbs (packets only) or trace files
//! written by `SOFTVERBS_TRACE` (packets, fault verdicts, timers, retransmissions,
//! completions).

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;

use emu_proto::trace::opcode_label;
use emu_proto::wire::{BTH_LEN, Bth};
use emu_trace::{Record, kind};
use pcap_file::DataLink;
use pcap_file::pcap::PcapReader;

use super::model::{Fate, Ladder, NoteKind, Packet};

/// Bad input: the message for exit code 2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputError(pub String);

impl std::fmt::Display for InputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

const PCAP_MAGICS: [[u8; 4]; 4] = [
    [0xd4, 0xc3, 0xb2, 0xa1],
    [0xa1, 0xb2, 0xc3, 0xd4],
    [0x4d, 0x3c, 0xb2, 0xa1],
    [0xa1, 0xb2, 0x3c, 0x4d],
];

/// True if `bytes` start like a classic pcap file.
pub(super) fn is_pcap(bytes: &[u8]) -> bool {
    PCAP_MAGICS.iter().any(|m| bytes.starts_with(m))
}

/// Parses the trace files' lines (`name`, contents). Errors: a line that is not a trace record.
pub(super) fn parse_traces(files: &[(String, String)]) -> Result<Vec<Record>, InputError> {
    let mut records = Vec::new();
    for (name, text) in files {
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let record = Record::parse(line).map_err(|e| {
                InputError(format!(
                    "{name}: line {}: not a softverbs trace record ({e}); the input must be a \
                     pcap written by softverbs or a SOFTVERBS_TRACE file",
                    i + 1
                ))
            })?;
            records.push(record);
        }
    }
    // Several processes' files: one order by wall clock (stable within a file).
    if files.len() > 1 {
        records.sort_by_key(|r| r.t);
    }
    Ok(records)
}

/// The ladder of trace records. The time axis is engine time when every record comes from one
/// process (virtual time in the in-process backend), else wall-clock time.
pub(super) fn from_trace(records: &[Record]) -> Ladder {
    let one_process = records.windows(2).all(|w| w[0].pid == w[1].pid);
    let mut b = TraceBuilder {
        ladder: Ladder {
            clock: if one_process {
                "engine time"
            } else {
                "wall-clock time"
            },
            ..Ladder::default()
        },
        engine: one_process,
        t0: records.first().map_or(0, |r| r.t),
        now: 0,
        in_flight: HashMap::new(),
        last_rx: None,
        unmatched: 0,
        repeat: None,
        repeat_text: String::new(),
    };
    for r in records {
        b.record(r);
    }
    if b.unmatched > 0 {
        b.ladder.remarks.push(format!(
            "{} received packet(s) had no matching send in the input (shown from lane \"?\")",
            b.unmatched
        ));
    }
    b.ladder
}

/// Key of a packet in flight: receiver address, destination QP, PSN, opcode.
type FlightKey = (String, u32, u32, String);

struct TraceBuilder {
    ladder: Ladder,
    engine: bool,
    t0: u64,
    /// The last engine time seen, for records without one.
    now: u64,
    /// Packets sent and not yet received, oldest first; with those already received (for
    /// duplicates), by key.
    in_flight: HashMap<FlightKey, VecDeque<usize>>,
    /// The last packet received (for the receiver's drop record that follows it).
    last_rx: Option<usize>,
    unmatched: usize,
    /// The last note (index, times seen) and its text, to fold repeats.
    repeat: Option<(usize, u32)>,
    repeat_text: String,
}

impl TraceBuilder {
    fn time(&mut self, r: &Record) -> u64 {
        if self.engine {
            if let Some(now) = r.u64("now") {
                self.now = now;
            }
            self.now
        } else {
            r.t.saturating_sub(self.t0)
        }
    }

    fn lane_of(&mut self, r: &Record) -> Option<usize> {
        let addr = r.text("addr")?;
        let dev = r.text("dev");
        let qp = r.u64("qp").and_then(|q| u32::try_from(q).ok());
        Some(self.ladder.lane(&addr, qp, dev.as_deref()))
    }

    fn record(&mut self, r: &Record) {
        let t = self.time(r);
        if let (Some(addr), Some(dev)) = (r.text("addr"), r.text("dev")) {
            self.ladder.name_device(&addr, &dev);
        }
        match r.kind.as_str() {
            kind::PKT_TX => self.tx(r, t),
            kind::PKT_RX => self.rx(r, t),
            kind::PKT_DROP => self.rx_drop(r, t),
            kind::FAULT => self.verdict(r),
            _ => self.note(r, t),
        }
    }

    fn key(r: &Record, addr: String) -> FlightKey {
        let n = |f| r.u64(f).and_then(|v| u32::try_from(v).ok()).unwrap_or(0);
        (
            addr,
            n("dqp"),
            n("psn"),
            r.text("opcode").unwrap_or_default(),
        )
    }

    fn tx(&mut self, r: &Record, t: u64) {
        let (Some(from), Some(peer)) = (self.lane_of(r), r.text("peer")) else {
            return;
        };
        let key = Self::key(r, peer.clone());
        let to = self.ladder.lane(&peer, Some(key.1), None);
        let retransmit = self
            .ladder
            .packets
            .iter()
            .any(|p| p.from == from && p.psn == key.2 && p.opcode == key.3);
        let tx_row = self.ladder.row(t);
        self.ladder.packets.push(Packet {
            from,
            to,
            opcode: key.3.clone(),
            psn: key.2,
            len: r.u64("len").unwrap_or(0),
            ackreq: r.bool("ackreq").unwrap_or(false),
            syndrome: r.u64("syndrome").and_then(|s| u8::try_from(s).ok()),
            tx_row,
            rx_row: None,
            fate: Fate::Delivered,
            rx_drop: None,
            retransmit,
            rx_cut: false,
        });
        let id = self.ladder.packets.len() - 1;
        self.in_flight.entry(key).or_default().push_back(id);
    }

    fn rx(&mut self, r: &Record, t: u64) {
        let Some(addr) = r.text("addr") else { return };
        let key = Self::key(r, addr.clone());
        let row = self.ladder.row(t);
        let queue = self.in_flight.entry(key.clone()).or_default();
        let fresh = queue.iter().position(|&id| {
            let p = &self.ladder.packets[id];
            p.rx_row.is_none() && !matches!(p.fate, Fate::Dropped(_))
        });
        let id = match fresh {
            Some(i) => queue[i],
            None => match queue.back() {
                // A second copy of a packet already received: a duplicate arrow.
                Some(&last) => {
                    let mut copy = self.ladder.packets[last].clone();
                    copy.fate = Fate::Duplicated;
                    copy.rx_drop = None;
                    self.ladder.packets.push(copy);
                    self.ladder.packets.len() - 1
                }
                None => self.unmatched_rx(r, &key, &addr),
            },
        };
        self.ladder.packets[id].rx_row = Some(row);
        self.last_rx = Some(id);
    }

    fn unmatched_rx(&mut self, r: &Record, key: &FlightKey, addr: &str) -> usize {
        self.unmatched += 1;
        let peer = r.text("peer").unwrap_or_else(|| "?".into());
        let peer_ip = peer
            .parse::<std::net::SocketAddr>()
            .map_or(peer, |a| a.ip().to_string());
        let from = self.ladder.lane(&peer_ip, None, None);
        let to = self
            .ladder
            .lane(addr, Some(key.1), r.text("dev").as_deref());
        let tx_row = self.ladder.rows.len().saturating_sub(1);
        self.ladder.packets.push(Packet {
            from,
            to,
            opcode: key.3.clone(),
            psn: key.2,
            len: r.u64("len").unwrap_or(0),
            ackreq: r.bool("ackreq").unwrap_or(false),
            syndrome: r.u64("syndrome").and_then(|s| u8::try_from(s).ok()),
            tx_row,
            rx_row: None,
            fate: Fate::Delivered,
            rx_drop: None,
            retransmit: false,
            rx_cut: false,
        });
        self.ladder.packets.len() - 1
    }

    fn rx_drop(&mut self, r: &Record, t: u64) {
        let cause = r.text("cause").unwrap_or_default();
        match self.last_rx.take() {
            Some(id) => self.ladder.packets[id].rx_drop = Some(cause),
            None => {
                if let Some(lane) = self.lane_of(r) {
                    self.ladder
                        .note(t, lane, format!("drop: {cause}"), NoteKind::Drop);
                }
            }
        }
    }

    fn verdict(&mut self, r: &Record) {
        let verdict = r.text("verdict").unwrap_or_default();
        let fate = fate_of(&verdict);
        if fate == Fate::Delivered {
            return;
        }
        let (dqp, psn) = (r.u64("dqp"), r.u64("psn"));
        let opcode = r.text("opcode").unwrap_or_default();
        // The packet just sent that the verdict is about: the latest with its fields.
        let lanes = &self.ladder.lanes;
        let found = self.ladder.packets.iter_mut().rev().take(256).find(|p| {
            p.fate == Fate::Delivered
                && p.rx_row.is_none()
                && Some(u64::from(p.psn)) == psn
                && p.opcode == opcode
                && lanes[p.to].qp.map(u64::from) == dqp
        });
        if let Some(p) = found {
            p.fate = fate;
        }
    }

    /// A note on its lane; the same note again right after it (500 `post_recv`s in a row)
    /// only counts up on the first.
    fn note(&mut self, r: &Record, t: u64) {
        let Some((text, kind)) = note_text(r) else {
            return;
        };
        let Some(lane) = self.lane_of(r) else { return };
        let last_row = self.ladder.rows.len().checked_sub(1);
        if let Some((index, count)) = &mut self.repeat {
            let note = &self.ladder.notes[*index];
            if Some(note.row) == last_row && note.lane == lane && self.repeat_text == text {
                *count += 1;
                self.ladder.notes[*index].text = format!("{text} (×{count})");
                return;
            }
        }
        self.ladder.note(t, lane, text.clone(), kind);
        self.repeat = Some((self.ladder.notes.len() - 1, 1));
        self.repeat_text = text;
    }
}

/// The fate a `fault.verdict`'s Debug text stands for.
fn fate_of(verdict: &str) -> Fate {
    if let Some(rest) = verdict.strip_prefix("Drop(") {
        return Fate::Dropped(rest.trim_end_matches(')').to_lowercase());
    }
    let head = verdict.split([' ', '{', '(']).next().unwrap_or_default();
    match head {
        "Duplicate" => Fate::Duplicated,
        "Corrupt" => Fate::Corrupted,
        "Truncate" => Fate::Truncated,
        "Hold" => Fate::Delayed,
        "Deliver" if !verdict.contains("delay: 0ns") => Fate::Delayed,
        _ => Fate::Delivered,
    }
}

/// The text and kind of a lane note for a record, or `None` for records not drawn.
fn note_text(r: &Record) -> Option<(String, NoteKind)> {
    let f = |name: &str| r.text(name).unwrap_or_default();
    Some(match r.kind.as_str() {
        kind::TIMER_FIRED => ("timer fired".to_owned(), NoteKind::Timer),
        kind::RETRANSMIT => (
            format!(
                "go back to PSN {} (retries left {})",
                f("from_psn"),
                f("retry_left")
            ),
            NoteKind::Retransmit,
        ),
        "rnr.wait" => (
            format!("RNR wait {} ns", f("delay_ns")),
            NoteKind::Retransmit,
        ),
        kind::WC => {
            let status = f("status");
            let kind = if status == "Success" {
                NoteKind::Completion
            } else {
                NoteKind::Error
            };
            (
                format!("WC {} wr_id={} {status}", f("opcode"), f("wr_id")),
                kind,
            )
        }
        kind::POST_SEND | kind::POST_RECV => (
            format!("{} x{}", r.kind.trim_start_matches("verbs."), f("wrs")),
            NoteKind::Verbs,
        ),
        kind::MODIFY_QP => (
            format!("modify {} -> {}", f("from"), f("to")),
            NoteKind::Verbs,
        ),
        "qp.error" => ("QP -> ERR".to_owned(), NoteKind::Error),
        kind::ASYNC => (format!("async {}", f("event")), NoteKind::Error),
        _ => return None,
    })
}

/// The ladder of a pcap: one packet per RoCEv2 frame, the sender's QP taken from the replies of
/// the same flow (both directions of an RC connection share the UDP source port, rc-transport.md
/// §1.9). Errors: not a pcap, pcapng, an unsupported link type, a truncated record.
pub(super) fn from_pcap(bytes: &[u8]) -> Result<Ladder, InputError> {
    if bytes.starts_with(&[0x0a, 0x0d, 0x0d, 0x0a]) {
        return Err(InputError(
            "pcapng is not supported: convert with `tshark -F pcap`".into(),
        ));
    }
    let mut reader =
        PcapReader::new(bytes).map_err(|e| InputError(format!("not a pcap file: {e}")))?;
    let l2 = match reader.header().datalink {
        DataLink::ETHERNET => 14,
        DataLink::RAW | DataLink::IPV4 => 0,
        other => {
            return Err(InputError(format!(
                "pcap link type {} is not supported (Ethernet or raw IP)",
                u32::from(other)
            )));
        }
    };
    let mut frames = Vec::new();
    let mut index = 0u64;
    while let Some(packet) = reader.next_packet() {
        index += 1;
        let packet = packet.map_err(|e| {
            InputError(format!(
                "record {index} of the pcap is truncated or malformed: {e}"
            ))
        })?;
        let ts = u64::try_from(packet.timestamp.as_nanos()).unwrap_or(u64::MAX);
        if let Some(f) = roce_frame(&packet.data, l2, ts) {
            frames.push(f);
        }
    }
    Ok(ladder_of_frames(&frames))
}

/// One RoCEv2 datagram of a pcap.
struct Frame {
    ts: u64,
    src: IpAddr,
    dst: IpAddr,
    sport: u16,
    payload: Vec<u8>,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// The RoCEv2 datagram of an Ethernet/IP/UDP frame, if it is one (IPv4 or IPv6, UDP).
fn roce_frame(frame: &[u8], l2: usize, ts: u64) -> Option<Frame> {
    let ip = frame.get(l2..)?;
    let (src, dst, udp) = match ip.first()? >> 4 {
        4 => {
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            if *ip.get(9)? != 17 {
                return None;
            }
            let a = |o: usize| -> Option<[u8; 4]> { ip.get(o..o + 4)?.try_into().ok() };
            (IpAddr::from(a(12)?), IpAddr::from(a(16)?), ip.get(ihl..)?)
        }
        6 => {
            if *ip.get(6)? != 17 {
                return None;
            }
            let a = |o: usize| -> Option<[u8; 16]> { ip.get(o..o + 16)?.try_into().ok() };
            (IpAddr::from(a(8)?), IpAddr::from(a(24)?), ip.get(40..)?)
        }
        _ => return None,
    };
    let len = usize::from(u16_at(udp, 4)?);
    let payload = udp.get(8..len.max(8))?.to_vec();
    if payload.len() < BTH_LEN {
        return None;
    }
    Some(Frame {
        ts,
        src,
        dst,
        sport: u16_at(udp, 0)?,
        payload,
    })
}

fn ladder_of_frames(frames: &[Frame]) -> Ladder {
    // (receiver, sender, source port) -> the receiver's QP: the sender's QP is the QP its
    // peer addresses on the same flow.
    let mut qp_of: HashMap<(IpAddr, IpAddr, u16), u32> = HashMap::new();
    for f in frames {
        if let Ok(bth) = Bth::new_checked(&f.payload[..]) {
            qp_of
                .entry((f.dst, f.src, f.sport))
                .or_insert(bth.dest_qp());
        }
    }
    let mut ladder = Ladder {
        clock: "capture time",
        ..Ladder::default()
    };
    let t0 = frames.first().map_or(0, |f| f.ts);
    let mut seen: HashMap<(usize, u32, String), usize> = HashMap::new();
    for f in frames {
        let Ok(bth) = Bth::new_checked(&f.payload[..]) else {
            continue;
        };
        let sender_qp = qp_of.get(&(f.src, f.dst, f.sport)).copied();
        let from = ladder.lane(&f.src.to_string(), sender_qp, None);
        let to = ladder.lane(&f.dst.to_string(), Some(bth.dest_qp()), None);
        let op = bth.opcode();
        let opcode = opcode_label(op);
        let syndrome = op
            .ext_headers()
            .filter(|h| h.aeth)
            .and_then(|_| f.payload.get(BTH_LEN).copied());
        let psn = bth.psn().value();
        let count = seen.entry((from, psn, opcode.clone())).or_insert(0);
        *count += 1;
        let row = ladder.row(f.ts.saturating_sub(t0));
        ladder.packets.push(Packet {
            from,
            to,
            opcode,
            psn,
            len: f.payload.len() as u64,
            ackreq: bth.ack_req(),
            syndrome,
            tx_row: row,
            rx_row: None,
            fate: Fate::Delivered,
            rx_drop: None,
            retransmit: *count > 1,
            rx_cut: false,
        });
    }
    ladder
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_notes_fold_into_one() {
        let line =
            r#"{"t":1,"pid":1,"kind":"verbs.post_recv","addr":"a:1","dev":"d","qp":17,"wrs":1}"#;
        let other =
            r#"{"t":2,"pid":1,"kind":"verbs.post_send","addr":"a:1","dev":"d","qp":17,"wrs":1}"#;
        let records: Vec<Record> = [line, line, line, other, line]
            .iter()
            .map(|l| Record::parse(l).unwrap_or_else(|e| panic!("{e}")))
            .collect();
        let l = from_trace(&records);
        let texts: Vec<&str> = l.notes.iter().map(|n| n.text.as_str()).collect();
        assert_eq!(texts, ["post_recv x1 (×3)", "post_send x1", "post_recv x1"]);
        assert_eq!(l.rows.len(), 3);
    }

    #[test]
    fn verdict_texts_map_to_fates() {
        assert_eq!(fate_of("Drop(Loss)"), Fate::Dropped("loss".into()));
        assert_eq!(
            fate_of("Duplicate { copies: 1, delay: 0ns }"),
            Fate::Duplicated
        );
        assert_eq!(fate_of("Corrupt { bit: 3, delay: 0ns }"), Fate::Corrupted);
        assert_eq!(fate_of("Deliver { delay: 0ns }"), Fate::Delivered);
        assert_eq!(fate_of("Deliver { delay: 2ms }"), Fate::Delayed);
    }
}
