//! The ladder's model: lanes (one per device/QP), packets (one arrow each, with the fate the
//! fault model or the receiver gave it) and notes on lanes, in rows of time order.

use std::collections::HashMap;

/// One lane: a QP of a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lane {
    /// The device's address (`ip:port` from a trace, `ip` from a pcap).
    pub addr: String,
    /// The device's name, when the input says it.
    pub dev: Option<String>,
    /// The QP number; `None` when a pcap does not show the sender's QP.
    pub qp: Option<u32>,
}

impl Lane {
    /// The lane heading: device (or address) and QP.
    pub fn label(&self) -> (String, String) {
        let dev = self.dev.clone().unwrap_or_else(|| self.addr.clone());
        let qp = self
            .qp
            .map_or_else(|| "QP ?".to_owned(), |q| format!("QP {q:#x}"));
        (dev, qp)
    }
}

/// What became of a packet on its way, as the fault model decided or the receiver saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Fate {
    /// Delivered as sent (or not known otherwise).
    #[default]
    Delivered,
    /// Delivered late (`Deliver` with a delay, or held and released).
    Delayed,
    /// Dropped by the fault model (cause).
    Dropped(String),
    /// One of several copies the fault model delivered.
    Duplicated,
    /// A bit flipped by the fault model.
    Corrupted,
    /// Cut short by the fault model.
    Truncated,
}

impl Fate {
    /// The CSS class of the arrow.
    pub fn class(&self) -> &'static str {
        match self {
            Fate::Delivered => "ok",
            Fate::Delayed => "delayed",
            Fate::Dropped(_) => "dropped",
            Fate::Duplicated => "dup",
            Fate::Corrupted => "corrupt",
            Fate::Truncated => "truncated",
        }
    }
}

/// One packet: an arrow from its sender's lane to its receiver's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packet {
    /// Sender lane index.
    pub from: usize,
    /// Receiver lane index.
    pub to: usize,
    /// The opcode's name.
    pub opcode: String,
    /// BTH PSN.
    pub psn: u32,
    /// UDP payload length.
    pub len: u64,
    /// BTH AckReq.
    pub ackreq: bool,
    /// AETH syndrome byte, if any.
    pub syndrome: Option<u8>,
    /// The row it was sent in.
    pub tx_row: usize,
    /// The row it was received in, if it was.
    pub rx_row: Option<usize>,
    /// The fault model's decision.
    pub fate: Fate,
    /// Why the receiver dropped it, if it did (`bad_icrc`, `duplicate_request`, …).
    pub rx_drop: Option<String>,
    /// The same opcode and PSN left the same lane before.
    pub retransmit: bool,
    /// It was received after the rows shown (the window cut its arrow short).
    pub rx_cut: bool,
}

impl Packet {
    /// The arrow's label: opcode, PSN, length, AckReq and syndrome.
    pub fn label(&self) -> String {
        let mut s = format!("{} psn={} len={}", self.opcode, self.psn, self.len);
        if self.ackreq {
            s.push_str(" A");
        }
        if let Some(syn) = self.syndrome {
            s.push(' ');
            s.push_str(&syndrome_text(syn));
        }
        s
    }

    /// True for an ACK/NAK-carrying response whose syndrome is RNR NAK or NAK.
    pub fn is_nak(&self) -> bool {
        self.syndrome.is_some_and(|s| matches!(s >> 5, 0b01 | 0b11))
    }
}

/// An AETH syndrome in words (IBTA 9.7.5.1.5; rc-transport.md §1.4).
pub(super) fn syndrome_text(syn: u8) -> String {
    match syn >> 5 {
        0b00 => format!("ACK(credits {})", syn & 0x1f),
        0b01 => format!("RNR-NAK(timer {})", syn & 0x1f),
        0b11 => match syn & 0x1f {
            0 => "NAK(PSN seq)".to_owned(),
            1 => "NAK(inv req)".to_owned(),
            2 => "NAK(rem access)".to_owned(),
            3 => "NAK(rem op)".to_owned(),
            4 => "NAK(inv RD req)".to_owned(),
            c => format!("NAK({c})"),
        },
        _ => format!("syndrome {syn:#04x}"),
    }
}

/// What a note on a lane is about (its CSS class).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum NoteKind {
    /// A verbs call.
    Verbs,
    /// A timer fired.
    Timer,
    /// A retransmission decision.
    Retransmit,
    /// A completion.
    Completion,
    /// A failure: error completion, QP to ERR, async event.
    Error,
    /// A packet the receiver dropped, or other engine decision.
    Drop,
}

impl NoteKind {
    /// The CSS class.
    pub fn class(self) -> &'static str {
        match self {
            NoteKind::Verbs => "verbs",
            NoteKind::Timer => "timer",
            NoteKind::Retransmit => "retx",
            NoteKind::Completion => "wc",
            NoteKind::Error => "err",
            NoteKind::Drop => "rxdrop",
        }
    }
}

/// One text mark on a lane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// Lane index.
    pub lane: usize,
    /// Row.
    pub row: usize,
    /// Text.
    pub text: String,
    /// Kind.
    pub kind: NoteKind,
}

/// Everything to draw: lanes, rows (their times), packets and notes.
#[derive(Clone, Debug, Default)]
pub struct Ladder {
    /// Lanes in order of first appearance.
    pub lanes: Vec<Lane>,
    /// The time of each row, in ns (relative to the input's first event).
    pub rows: Vec<u64>,
    /// Packets.
    pub packets: Vec<Packet>,
    /// Notes.
    pub notes: Vec<Note>,
    /// What the time axis is ("engine time" or "wall-clock time" or "capture time").
    pub clock: &'static str,
    /// Lines printed under the title (cut windows, unmatched records).
    pub remarks: Vec<String>,
    pub(super) lane_index: HashMap<(String, Option<u32>), usize>,
}

impl Ladder {
    /// The lane of `(addr, qp)`, created on first use; `dev` names it when known.
    pub fn lane(&mut self, addr: &str, qp: Option<u32>, dev: Option<&str>) -> usize {
        let key = (addr.to_owned(), qp);
        if let Some(&i) = self.lane_index.get(&key) {
            if self.lanes[i].dev.is_none() {
                self.lanes[i].dev = dev.map(str::to_owned);
            }
            return i;
        }
        self.lanes.push(Lane {
            addr: addr.to_owned(),
            dev: dev.map(str::to_owned),
            qp,
        });
        self.lane_index.insert(key, self.lanes.len() - 1);
        self.lanes.len() - 1
    }

    /// Names every lane of `addr` `dev` (a trace names a device in its own records only).
    pub fn name_device(&mut self, addr: &str, dev: &str) {
        for lane in self.lanes.iter_mut().filter(|l| l.addr == addr) {
            lane.dev.get_or_insert_with(|| dev.to_owned());
        }
    }

    /// A new row at time `t`; its index.
    pub fn row(&mut self, t: u64) -> usize {
        self.rows.push(t);
        self.rows.len() - 1
    }

    /// Adds a note in a new row.
    pub fn note(&mut self, t: u64, lane: usize, text: String, kind: NoteKind) {
        let row = self.row(t);
        self.notes.push(Note {
            lane,
            row,
            text,
            kind,
        });
    }

    /// The ladder restricted to rows `rows` (renumbered from 0) and, with `qp`, to packets and
    /// notes touching a lane of that QP number. Lanes nothing refers to are dropped.
    pub fn select(&self, rows: std::ops::Range<usize>, qp: Option<u32>) -> Ladder {
        let on_qp = |lane: usize| qp.is_none_or(|q| self.lanes[lane].qp == Some(q));
        let in_rows = |r: usize| rows.contains(&r);
        let packets: Vec<&Packet> = self
            .packets
            .iter()
            .filter(|p| in_rows(p.tx_row) && (on_qp(p.from) || on_qp(p.to)))
            .collect();
        let notes: Vec<&Note> = self
            .notes
            .iter()
            .filter(|n| in_rows(n.row) && on_qp(n.lane))
            .collect();
        // Keep the rows still used, in order.
        let mut used: Vec<usize> = packets
            .iter()
            .flat_map(|p| [Some(p.tx_row), p.rx_row.filter(|r| in_rows(*r))])
            .flatten()
            .chain(notes.iter().map(|n| n.row))
            .collect();
        used.sort_unstable();
        used.dedup();
        let row_map: HashMap<usize, usize> =
            used.iter().enumerate().map(|(i, r)| (*r, i)).collect();
        let mut lanes: Vec<usize> = packets
            .iter()
            .flat_map(|p| [p.from, p.to])
            .chain(notes.iter().map(|n| n.lane))
            .collect();
        lanes.sort_unstable();
        lanes.dedup();
        let lane_map: HashMap<usize, usize> =
            lanes.iter().enumerate().map(|(i, l)| (*l, i)).collect();
        let mut out = Ladder {
            lanes: lanes.iter().map(|l| self.lanes[*l].clone()).collect(),
            rows: used.iter().map(|r| self.rows[*r]).collect(),
            clock: self.clock,
            remarks: self.remarks.clone(),
            ..Ladder::default()
        };
        out.packets = packets
            .into_iter()
            .map(|p| Packet {
                from: lane_map[&p.from],
                to: lane_map[&p.to],
                tx_row: row_map[&p.tx_row],
                rx_row: p.rx_row.and_then(|r| row_map.get(&r).copied()),
                rx_cut: p.rx_cut || p.rx_row.is_some_and(|r| !row_map.contains_key(&r)),
                ..p.clone()
            })
            .collect();
        out.notes = notes
            .into_iter()
            .map(|n| Note {
                lane: lane_map[&n.lane],
                row: row_map[&n.row],
                ..n.clone()
            })
            .collect();
        out
    }
}
