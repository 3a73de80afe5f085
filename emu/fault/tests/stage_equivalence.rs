//! The fault-stage equivalence fixture (`support/stage_sequence.rs`) through a bare [`Stage`]:
//! the reference the in-process fabric's and the UDP driver's stages are held to.
#![allow(clippy::unwrap_used)]

#[path = "support/stage_sequence.rs"]
mod stage_sequence;

use core::time::Duration;

use emu_fault::{Buffers, DropCause, Injector, Link, Payload, Stage, Verdict};
use emu_proto::Instant;
use stage_sequence::{Backend, DST, EXPECTED, SRC};

/// A datagram as a plain vector.
struct Bytes(Vec<u8>);

impl Payload for Bytes {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
    fn set_len(&mut self, len: usize) {
        self.0.truncate(len);
    }
}

struct Heap;

impl Buffers<Bytes> for Heap {
    fn copy(&mut self, original: &Bytes) -> Bytes {
        Bytes(original.0.clone())
    }
    fn recycle(&mut self, _: Bytes) {}
}

struct Bare {
    injector: Injector,
    stage: Stage<Bytes>,
}

impl Bare {
    fn pop(&mut self, now: Instant) -> Vec<Vec<u8>> {
        std::iter::from_fn(|| self.stage.pop_due(now))
            .map(|b| b.0)
            .collect()
    }
}

impl Backend for Bare {
    fn send(&mut self, now: Instant, bytes: &[u8]) -> Vec<Vec<u8>> {
        let d = Bytes(bytes.to_vec());
        let link = Link::new(SRC, DST);
        self.stage
            .submit(&mut self.injector, now, link, d, &mut Heap);
        self.pop(now)
    }
    fn due(&mut self, now: Instant) -> Vec<Vec<u8>> {
        self.stage.release_due(now);
        self.pop(now)
    }
    fn release(&mut self, now: Instant) -> Vec<Vec<u8>> {
        self.injector.release();
        self.stage.release_held(now);
        self.pop(now)
    }
    fn next_due(&self) -> Option<Instant> {
        self.stage.next_due()
    }
    fn injector(&self) -> &Injector {
        &self.injector
    }
}

#[test]
fn a_bare_stage_gives_the_expected_outcome() {
    let mut bare = Bare {
        injector: Injector::new(stage_sequence::plan()).unwrap(),
        stage: Stage::new(Duration::ZERO),
    };
    assert_eq!(stage_sequence::run(&mut bare), EXPECTED);
}

#[test]
fn the_short_datagram_counts_toward_nth() {
    let mut injector = Injector::new(stage_sequence::plan()).unwrap();
    let verdicts: Vec<Verdict> = stage_sequence::sequence()
        .iter()
        .map(|(now, bytes)| injector.judge(*now, SRC, DST, bytes))
        .collect();
    assert_eq!(
        verdicts[1],
        Verdict::Hold { until: None },
        "held as Unknown(0xFF)"
    );
    assert_eq!(
        verdicts[2],
        Verdict::Drop(DropCause::Loss),
        "the 3rd datagram"
    );
}
