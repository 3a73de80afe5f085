//! The engine's trace events (issue 22 item 1), captured with `emu_trace::testing::capture`:
//! a dropped ACK shows as its fault verdict, the timer that fires, the retransmission and the
//! completion; verbs calls show with their QP and state change.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use emu_sim::fault::{FaultPlan, drop_nth};
use emu_sim::{Opcode, SimProvider};
use emu_trace::kind;
use verbs_api::{MemoryRegion, QueuePair, SendOp, SendWr, WcStatus};

#[test]
fn a_dropped_ack_is_traced_from_verdict_to_completion() {
    let trace = emu_trace::testing::capture();
    let plan = FaultPlan::new(1).rule(drop_nth(1).opcode(Opcode::Acknowledge));
    let p = SimProvider::builder().faults(plan).pair().unwrap();
    p.mr_a.write(0, b"payload!").unwrap();
    let sge = [p.mr_a.sge(0, 8).unwrap()];
    let op = SendOp::RdmaWrite {
        remote_addr: p.mr_b.addr(),
        rkey: p.mr_b.rkey(),
    };
    p.qp_a.post_send(&[SendWr::new(1, op, &sge)]).unwrap();
    let wc = p.cq_a.next_completion().unwrap();
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));

    let verdicts = trace.of_kind(kind::FAULT);
    let drops: Vec<_> = verdicts
        .iter()
        .filter(|r| r.text("verdict").unwrap().starts_with("Drop"))
        .collect();
    assert_eq!(drops.len(), 1, "{verdicts:?}");
    assert_eq!(drops[0].text("opcode").unwrap(), "ACKNOWLEDGE");
    // The write went out twice (original and retransmission), each with its device and QP.
    let writes: Vec<_> = trace
        .of_kind(kind::PKT_TX)
        .into_iter()
        .filter(|r| r.text("opcode").unwrap() == "RDMA_WRITE_ONLY")
        .collect();
    assert_eq!(writes.len(), 2);
    assert_eq!(writes[0].u64("qp"), Some(u64::from(p.qp_a.qp_num())));
    assert_eq!(writes[0].u64("psn"), writes[1].u64("psn"));
    assert!(writes[0].text("dev").is_some() && writes[0].u64("now").is_some());
    assert_eq!(trace.of_kind(kind::TIMER_FIRED).len(), 1);
    assert_eq!(trace.of_kind(kind::RETRANSMIT).len(), 1);
    // The responder answered the resent write with a second ACK, which got through.
    let acks = trace
        .of_kind(kind::PKT_RX)
        .into_iter()
        .filter(|r| r.text("opcode").unwrap() == "ACKNOWLEDGE")
        .count();
    assert_eq!(acks, 1);
    let wcs = trace.of_kind(kind::WC);
    assert!(
        wcs.iter()
            .any(|r| r.u64("wr_id") == Some(1) && r.text("status").unwrap() == "Success")
    );
    let modifies = trace.of_kind(kind::MODIFY_QP);
    assert!(
        modifies
            .iter()
            .any(|r| r.text("from").unwrap() == "RTR" && r.text("to").unwrap() == "RTS"),
        "{modifies:?}"
    );
}
