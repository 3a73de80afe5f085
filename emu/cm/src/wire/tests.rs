#![allow(clippy::unwrap_used)]

use proptest::prelude::*;

use super::*;

fn sample_req() -> ReqRepr {
    ReqRepr {
        local_comm_id: 0x1122_3344,
        vendor_id: 0x00AB_CDEF,
        service_id: 0x0000_0000_0106_4E20,
        local_ca_guid: 0x0102_0304_0506_0708,
        local_qkey: 0,
        local_qpn: 0x00_0011,
        responder_resources: 4,
        local_eecn: 0,
        initiator_depth: 3,
        remote_eecn: 0,
        remote_cm_response_timeout: 20,
        transport: TransportType::Uc,
        e2e_flow_control: true,
        starting_psn: 0x00AB_CDEF,
        local_cm_response_timeout: 18,
        retry_count: 7,
        pkey: 0xFFFF,
        path_mtu: 3,
        rdc_exists: false,
        rnr_retry_count: 6,
        max_cm_retries: 15,
        srq: true,
        ext_transport: 0,
        primary: ReqPath {
            local_lid: 0xFFFF,
            remote_lid: 0xFFFF,
            local_gid: [0xA; 16],
            remote_gid: [0xB; 16],
            flow_label: 0xF_1234,
            packet_rate: 3,
            traffic_class: 0x20,
            hop_limit: 64,
            sl: 5,
            subnet_local: true,
            local_ack_timeout: 14,
        },
        alternate: ReqPath::default(),
        sap_supported: false,
        private_data: vec![0x5A; REQ_PRIVATE_DATA],
    }
}

/// Fields land at their IBTA table 106 offsets (MAD byte = data offset + 24).
#[test]
fn req_layout_at_ibta_offsets() {
    let bytes = CmMad::send(0xDEAD_BEEF_0000_0001, CmMessage::Req(sample_req())).emit();
    assert_eq!(bytes.len(), MAD_LEN);
    assert_eq!(&bytes[..4], &[1, 0x07, 2, 0x03]);
    assert_eq!(&bytes[8..16], &0xDEAD_BEEF_0000_0001u64.to_be_bytes());
    assert_eq!(&bytes[16..18], &[0x00, 0x10]);
    assert_eq!(&bytes[24..28], &[0x11, 0x22, 0x33, 0x44]);
    assert_eq!(&bytes[29..32], &[0xAB, 0xCD, 0xEF]);
    assert_eq!(&bytes[32..40], &0x0106_4E20u64.to_be_bytes());
    assert_eq!(&bytes[56..60], &[0x00, 0x00, 0x11, 4]);
    assert_eq!(bytes[63], 3);
    // byte 43: remote CM response timeout (5) | transport UC (01) | E2E (1)
    assert_eq!(bytes[24 + 43], (20 << 3) | (1 << 1) | 1);
    assert_eq!(&bytes[24 + 44..24 + 48], &[0xAB, 0xCD, 0xEF, (18 << 3) | 7]);
    assert_eq!(bytes[24 + 50], (3 << 4) | 6);
    assert_eq!(bytes[24 + 51], (15 << 4) | (1 << 3));
    assert_eq!(&bytes[24 + 56..24 + 72], &[0xA; 16]);
    assert_eq!(&bytes[24 + 72..24 + 88], &[0xB; 16]);
    assert_eq!(&bytes[24 + 88..24 + 92], &[0xF1, 0x23, 0x40, 3]);
    assert_eq!(
        &bytes[24 + 92..24 + 96],
        &[0x20, 64, (5 << 4) | (1 << 3), 14 << 3]
    );
    assert_eq!(&bytes[164..256], &[0x5A; REQ_PRIVATE_DATA][..]);
    assert_eq!(
        CmMad::parse(&bytes).unwrap().msg,
        CmMessage::Req(sample_req())
    );
}

#[test]
fn rej_rep_layouts() {
    let rej = RejRepr {
        local_comm_id: 1,
        remote_comm_id: 2,
        message: MsgTarget::REP,
        ari_len: 8,
        reason: 8,
        ari: vec![9; 8],
        private_data: vec![7; 3],
    };
    let b = CmMad::send(5, CmMessage::Rej(rej)).emit();
    assert_eq!(&b[16..18], &[0x00, 0x12]);
    assert_eq!(&b[32..36], &[1 << 6, 8 << 1, 0, 8]);
    assert_eq!(&b[36..44], &[9; 8]);
    assert_eq!(&b[108..112], &[7, 7, 7, 0]);
    let rep = RepRepr {
        local_comm_id: 3,
        remote_comm_id: 4,
        local_qkey: 0,
        local_qpn: 0x12_3456,
        vendor_id: 0x01_0203,
        local_eecn: 0,
        starting_psn: 0x65_4321,
        responder_resources: 16,
        initiator_depth: 8,
        target_ack_delay: 15,
        failover_accepted: 2,
        e2e_flow_control: true,
        rnr_retry_count: 7,
        srq: false,
        local_ca_guid: 0xAA,
        private_data: vec![1; REP_PRIVATE_DATA],
    };
    let b = CmMad::send(5, CmMessage::Rep(rep.clone())).emit();
    assert_eq!(&b[36..40], &[0x12, 0x34, 0x56, 0x01]);
    assert_eq!(
        &b[44..52],
        &[
            0x65,
            0x43,
            0x21,
            0x03,
            16,
            8,
            (15 << 3) | (2 << 1) | 1,
            7 << 5
        ]
    );
    assert_eq!(CmMad::parse(&b).unwrap().msg, CmMessage::Rep(rep));
}

#[test]
fn cma_header_ipv4() {
    use std::net::{IpAddr, Ipv4Addr};
    let src = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
    let dst = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
    let h = CmaHdrRepr::new(src, 0x1234, dst);
    let mut pd = [0u8; REQ_PRIVATE_DATA];
    h.emit(&mut pd).unwrap();
    assert_eq!(&pd[..4], &[0, 0x40, 0x12, 0x34]);
    assert_eq!(&pd[16..20], &[10, 0, 0, 1]);
    assert_eq!(&pd[32..36], &[10, 0, 0, 2]);
    let back = CmaHdrRepr::parse(&pd).unwrap();
    assert_eq!((back.src_ip(), back.dst_ip()), (Some(src), Some(dst)));
    assert!(CmaHdrRepr::parse(&pd[..35]).is_none());
}

fn cm_header(attr: u16) -> Vec<u8> {
    let mut b = vec![0u8; MAD_LEN];
    MadHeaderRepr::cm_send(attr, 7).emit(&mut Mad::new_unchecked(&mut b[..]));
    b
}

proptest! {
    /// parse ∘ emit ∘ parse = parse for every attribute and any data bytes: every field is
    /// kept and written back where it was read.
    #[test]
    fn roundtrip_any_data(attr in 0x10u16..=0x16, data in proptest::collection::vec(any::<u8>(), MAD_DATA_LEN)) {
        let mut b = cm_header(attr);
        b[MAD_HDR_LEN..].copy_from_slice(&data);
        let first = CmMad::parse(&b).unwrap();
        let again = CmMad::parse(&first.emit()).unwrap();
        prop_assert_eq!(first, again);
    }

    /// Any bytes: a result, never a panic.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = CmMad::parse(&bytes);
        let _ = CmaHdrRepr::parse(&bytes);
        if let Ok(m) = Mad::new_checked(&bytes[..]) {
            let _ = MadHeaderRepr::parse(&m);
        }
    }

    /// A header whose first bytes say CM: every attribute decodes or is `UnknownAttribute`.
    #[test]
    fn cm_header_any_attr(attr in any::<u16>(), data in proptest::collection::vec(any::<u8>(), MAD_DATA_LEN)) {
        let mut b = cm_header(attr);
        b[MAD_HDR_LEN..].copy_from_slice(&data);
        match CmMad::parse(&b) {
            Ok(m) => prop_assert_eq!(m.msg.attr_id(), attr),
            Err(e) => prop_assert_eq!(e, MadError::UnknownAttribute(attr)),
        }
    }
}
