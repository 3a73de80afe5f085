//! The CM messages (IBTA vol. 1 §12.6, tables 106–113): each field at its offset within the
//! MAD's attribute data (byte 0 = MAD byte 24), IBTA bit numbering (bit offset 0 = MSB).
//!
//! `parse` takes the 232 data bytes and keeps every field as a number (unknown reasons,
//! transport types and reserved values decode); private data comes back at its full area
//! length (the MAD carries no length). `emit` writes every field, zero-fills private data
//! past the given bytes and clears reserved bits.

use super::{
    MAD_DATA_LEN, MadError, be16, be24, be32, be64, bits, put, put_bits, put_padded, put24, take,
};

/// REQ private data length (table 106).
pub const REQ_PRIVATE_DATA: usize = 92;
/// MRA private data length (table 107).
pub const MRA_PRIVATE_DATA: usize = 222;
/// REJ private data length (table 108).
pub const REJ_PRIVATE_DATA: usize = 148;
/// REJ additional reject information length (table 108).
pub const REJ_ARI_LEN: usize = 72;
/// REP private data length (table 110).
pub const REP_PRIVATE_DATA: usize = 196;
/// RTU private data length (table 111).
pub const RTU_PRIVATE_DATA: usize = 224;
/// DREQ private data length (table 112).
pub const DREQ_PRIVATE_DATA: usize = 220;
/// DREP private data length (table 113).
pub const DREP_PRIVATE_DATA: usize = 224;

fn check(d: &[u8]) -> Result<(), MadError> {
    if d.len() < MAD_DATA_LEN {
        return Err(MadError::Truncated(d.len() + super::MAD_HDR_LEN));
    }
    Ok(())
}

/// REQ's transport service type (2 bits).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum TransportType {
    /// 0: reliable connection.
    Rc,
    /// 1: unreliable connection.
    Uc,
    /// 2: reliable datagram.
    Rd,
    /// 3: reserved.
    Reserved,
}

impl From<u8> for TransportType {
    fn from(v: u8) -> Self {
        match v & 3 {
            0 => TransportType::Rc,
            1 => TransportType::Uc,
            2 => TransportType::Rd,
            _ => TransportType::Reserved,
        }
    }
}

impl From<TransportType> for u8 {
    fn from(t: TransportType) -> u8 {
        match t {
            TransportType::Rc => 0,
            TransportType::Uc => 1,
            TransportType::Rd => 2,
            TransportType::Reserved => 3,
        }
    }
}

/// Which message an MRA or REJ refers to (2 bits: 0 REQ, 1 REP, 2 LAP, 3 reserved).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct MsgTarget(pub u8);

impl MsgTarget {
    /// The REQ.
    pub const REQ: MsgTarget = MsgTarget(0);
    /// The REP.
    pub const REP: MsgTarget = MsgTarget(1);
    /// Other (LAP).
    pub const OTHER: MsgTarget = MsgTarget(2);
}

/// A REQ path (primary or alternate, 44 bytes): on RoCE the GIDs name the ports, LIDs are
/// not routed.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct ReqPath {
    /// Local port LID.
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID (the sender's).
    pub local_gid: [u8; 16],
    /// Remote port GID (the receiver's).
    pub remote_gid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local (1 bit).
    pub subnet_local: bool,
    /// Local ACK timeout exponent (5 bits).
    pub local_ack_timeout: u8,
}

impl ReqPath {
    fn parse(d: &[u8], at: usize) -> Self {
        let mut local_gid = [0u8; 16];
        let mut remote_gid = [0u8; 16];
        local_gid.copy_from_slice(&d[at + 4..at + 20]);
        remote_gid.copy_from_slice(&d[at + 20..at + 36]);
        ReqPath {
            local_lid: be16(d, at),
            remote_lid: be16(d, at + 2),
            local_gid,
            remote_gid,
            flow_label: be32(d, at + 36) >> 12,
            packet_rate: bits(d, at + 39, 2, 6),
            traffic_class: d[at + 40],
            hop_limit: d[at + 41],
            sl: bits(d, at + 42, 0, 4),
            subnet_local: bits(d, at + 42, 4, 1) != 0,
            local_ack_timeout: bits(d, at + 43, 0, 5),
        }
    }

    fn emit(&self, d: &mut [u8], at: usize) {
        put(d, at, &self.local_lid.to_be_bytes());
        put(d, at + 2, &self.remote_lid.to_be_bytes());
        put(d, at + 4, &self.local_gid);
        put(d, at + 20, &self.remote_gid);
        put(
            d,
            at + 36,
            &((self.flow_label & 0xF_FFFF) << 12).to_be_bytes(),
        );
        put_bits(d, at + 39, 2, 6, self.packet_rate);
        d[at + 40] = self.traffic_class;
        d[at + 41] = self.hop_limit;
        d[at + 42] = 0;
        put_bits(d, at + 42, 0, 4, self.sl);
        put_bits(d, at + 42, 4, 1, u8::from(self.subnet_local));
        d[at + 43] = 0;
        put_bits(d, at + 43, 0, 5, self.local_ack_timeout);
    }
}

/// REQ (table 106).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ReqRepr {
    /// Local communication ID (the sender's).
    pub local_comm_id: u32,
    /// Vendor ID (24 bits at bytes 5–7).
    pub vendor_id: u32,
    /// Service ID.
    pub service_id: u64,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Local Q_Key (RD only).
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Local EECN (24 bits).
    pub local_eecn: u32,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Remote EECN (24 bits).
    pub remote_eecn: u32,
    /// Remote CM response timeout (5 bits): how long the receiver may take.
    pub remote_cm_response_timeout: u8,
    /// Transport service type.
    pub transport: TransportType,
    /// End-to-end flow control.
    pub e2e_flow_control: bool,
    /// Starting PSN (24 bits).
    pub starting_psn: u32,
    /// Local CM response timeout (5 bits): how long the sender takes.
    pub local_cm_response_timeout: u8,
    /// Retry count (3 bits).
    pub retry_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// Path packet payload MTU (4 bits).
    pub path_mtu: u8,
    /// RDC exists.
    pub rdc_exists: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Max CM retries (4 bits).
    pub max_cm_retries: u8,
    /// SRQ.
    pub srq: bool,
    /// Extended transport type (3 bits).
    pub ext_transport: u8,
    /// The primary path.
    pub primary: ReqPath,
    /// The alternate path (all zero when absent).
    pub alternate: ReqPath,
    /// SAP supported (byte 139 bit 5).
    pub sap_supported: bool,
    /// Private data ([`REQ_PRIVATE_DATA`] bytes when parsed).
    pub private_data: Vec<u8>,
}

impl ReqRepr {
    /// Parses the 232 data bytes of a REQ.
    pub fn parse(d: &[u8]) -> Result<Self, MadError> {
        check(d)?;
        Ok(ReqRepr {
            local_comm_id: be32(d, 0),
            vendor_id: be32(d, 4) & 0xFF_FFFF,
            service_id: be64(d, 8),
            local_ca_guid: be64(d, 16),
            local_qkey: be32(d, 28),
            local_qpn: be24(d, 32),
            responder_resources: d[35],
            local_eecn: be24(d, 36),
            initiator_depth: d[39],
            remote_eecn: be24(d, 40),
            remote_cm_response_timeout: bits(d, 43, 0, 5),
            transport: TransportType::from(bits(d, 43, 5, 2)),
            e2e_flow_control: bits(d, 43, 7, 1) != 0,
            starting_psn: be24(d, 44),
            local_cm_response_timeout: bits(d, 47, 0, 5),
            retry_count: bits(d, 47, 5, 3),
            pkey: be16(d, 48),
            path_mtu: bits(d, 50, 0, 4),
            rdc_exists: bits(d, 50, 4, 1) != 0,
            rnr_retry_count: bits(d, 50, 5, 3),
            max_cm_retries: bits(d, 51, 0, 4),
            srq: bits(d, 51, 4, 1) != 0,
            ext_transport: bits(d, 51, 5, 3),
            primary: ReqPath::parse(d, 52),
            alternate: ReqPath::parse(d, 96),
            sap_supported: bits(d, 139, 5, 1) != 0,
            private_data: take(d, 140, REQ_PRIVATE_DATA),
        })
    }

    /// Writes all 232 data bytes. Panics if `d` is shorter.
    pub fn emit(&self, d: &mut [u8]) {
        put(d, 0, &self.local_comm_id.to_be_bytes());
        put(d, 4, &(self.vendor_id & 0xFF_FFFF).to_be_bytes());
        put(d, 8, &self.service_id.to_be_bytes());
        put(d, 16, &self.local_ca_guid.to_be_bytes());
        put(d, 24, &[0; 4]);
        put(d, 28, &self.local_qkey.to_be_bytes());
        put24(d, 32, self.local_qpn);
        d[35] = self.responder_resources;
        put24(d, 36, self.local_eecn);
        d[39] = self.initiator_depth;
        put24(d, 40, self.remote_eecn);
        d[43] = 0;
        put_bits(d, 43, 0, 5, self.remote_cm_response_timeout);
        put_bits(d, 43, 5, 2, u8::from(self.transport));
        put_bits(d, 43, 7, 1, u8::from(self.e2e_flow_control));
        put24(d, 44, self.starting_psn);
        d[47] = 0;
        put_bits(d, 47, 0, 5, self.local_cm_response_timeout);
        put_bits(d, 47, 5, 3, self.retry_count);
        put(d, 48, &self.pkey.to_be_bytes());
        d[50] = 0;
        put_bits(d, 50, 0, 4, self.path_mtu);
        put_bits(d, 50, 4, 1, u8::from(self.rdc_exists));
        put_bits(d, 50, 5, 3, self.rnr_retry_count);
        d[51] = 0;
        put_bits(d, 51, 0, 4, self.max_cm_retries);
        put_bits(d, 51, 4, 1, u8::from(self.srq));
        put_bits(d, 51, 5, 3, self.ext_transport);
        self.primary.emit(d, 52);
        self.alternate.emit(d, 96);
        put_bits(d, 139, 5, 1, u8::from(self.sap_supported));
        put_padded(d, 140, REQ_PRIVATE_DATA, &self.private_data);
    }
}

/// MRA (table 107).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MraRepr {
    /// Local communication ID (the sender's).
    pub local_comm_id: u32,
    /// Remote communication ID (the receiver's).
    pub remote_comm_id: u32,
    /// The message acknowledged (2 bits).
    pub message: MsgTarget,
    /// Service timeout exponent (5 bits): how long the sender needs.
    pub service_timeout: u8,
    /// Private data ([`MRA_PRIVATE_DATA`] bytes when parsed).
    pub private_data: Vec<u8>,
}

impl MraRepr {
    /// Parses the 232 data bytes of an MRA.
    pub fn parse(d: &[u8]) -> Result<Self, MadError> {
        check(d)?;
        Ok(MraRepr {
            local_comm_id: be32(d, 0),
            remote_comm_id: be32(d, 4),
            message: MsgTarget(bits(d, 8, 0, 2)),
            service_timeout: bits(d, 9, 0, 5),
            private_data: take(d, 10, MRA_PRIVATE_DATA),
        })
    }

    /// Writes all 232 data bytes. Panics if `d` is shorter.
    pub fn emit(&self, d: &mut [u8]) {
        put(d, 0, &self.local_comm_id.to_be_bytes());
        put(d, 4, &self.remote_comm_id.to_be_bytes());
        d[8] = 0;
        put_bits(d, 8, 0, 2, self.message.0);
        d[9] = 0;
        put_bits(d, 9, 0, 5, self.service_timeout);
        put_padded(d, 10, MRA_PRIVATE_DATA, &self.private_data);
    }
}

/// REJ (table 108).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RejRepr {
    /// Local communication ID (the sender's; 0 when it has none).
    pub local_comm_id: u32,
    /// Remote communication ID (the rejected side's).
    pub remote_comm_id: u32,
    /// The message rejected (2 bits).
    pub message: MsgTarget,
    /// Reject info length (7 bits): the ARI bytes that count.
    pub ari_len: u8,
    /// Reason (table 112; any value decodes).
    pub reason: u16,
    /// Additional reject information ([`REJ_ARI_LEN`] bytes when parsed).
    pub ari: Vec<u8>,
    /// Private data ([`REJ_PRIVATE_DATA`] bytes when parsed).
    pub private_data: Vec<u8>,
}

impl RejRepr {
    /// Parses the 232 data bytes of a REJ.
    pub fn parse(d: &[u8]) -> Result<Self, MadError> {
        check(d)?;
        Ok(RejRepr {
            local_comm_id: be32(d, 0),
            remote_comm_id: be32(d, 4),
            message: MsgTarget(bits(d, 8, 0, 2)),
            ari_len: bits(d, 9, 0, 7),
            reason: be16(d, 10),
            ari: take(d, 12, REJ_ARI_LEN),
            private_data: take(d, 84, REJ_PRIVATE_DATA),
        })
    }

    /// Writes all 232 data bytes. Panics if `d` is shorter.
    pub fn emit(&self, d: &mut [u8]) {
        put(d, 0, &self.local_comm_id.to_be_bytes());
        put(d, 4, &self.remote_comm_id.to_be_bytes());
        d[8] = 0;
        put_bits(d, 8, 0, 2, self.message.0);
        d[9] = 0;
        put_bits(d, 9, 0, 7, self.ari_len);
        put(d, 10, &self.reason.to_be_bytes());
        put_padded(d, 12, REJ_ARI_LEN, &self.ari);
        put_padded(d, 84, REJ_PRIVATE_DATA, &self.private_data);
    }
}

/// REP (table 110).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RepRepr {
    /// Local communication ID (the sender's).
    pub local_comm_id: u32,
    /// Remote communication ID (the REQ's sender's).
    pub remote_comm_id: u32,
    /// Local Q_Key (RD only).
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Vendor ID (24 bits, spread over bytes 15, 19 and 23).
    pub vendor_id: u32,
    /// Local EE context number (24 bits).
    pub local_eecn: u32,
    /// Starting PSN (24 bits).
    pub starting_psn: u32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub e2e_flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// SRQ.
    pub srq: bool,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Private data ([`REP_PRIVATE_DATA`] bytes when parsed).
    pub private_data: Vec<u8>,
}

impl RepRepr {
    /// Parses the 232 data bytes of a REP.
    pub fn parse(d: &[u8]) -> Result<Self, MadError> {
        check(d)?;
        Ok(RepRepr {
            local_comm_id: be32(d, 0),
            remote_comm_id: be32(d, 4),
            local_qkey: be32(d, 8),
            local_qpn: be24(d, 12),
            vendor_id: u32::from(d[15]) << 16 | u32::from(d[19]) << 8 | u32::from(d[23]),
            local_eecn: be24(d, 16),
            starting_psn: be24(d, 20),
            responder_resources: d[24],
            initiator_depth: d[25],
            target_ack_delay: bits(d, 26, 0, 5),
            failover_accepted: bits(d, 26, 5, 2),
            e2e_flow_control: bits(d, 26, 7, 1) != 0,
            rnr_retry_count: bits(d, 27, 0, 3),
            srq: bits(d, 27, 3, 1) != 0,
            local_ca_guid: be64(d, 28),
            private_data: take(d, 36, REP_PRIVATE_DATA),
        })
    }

    /// Writes all 232 data bytes. Panics if `d` is shorter.
    pub fn emit(&self, d: &mut [u8]) {
        put(d, 0, &self.local_comm_id.to_be_bytes());
        put(d, 4, &self.remote_comm_id.to_be_bytes());
        put(d, 8, &self.local_qkey.to_be_bytes());
        put24(d, 12, self.local_qpn);
        d[15] = (self.vendor_id >> 16) as u8;
        put24(d, 16, self.local_eecn);
        d[19] = (self.vendor_id >> 8) as u8;
        put24(d, 20, self.starting_psn);
        d[23] = self.vendor_id as u8;
        d[24] = self.responder_resources;
        d[25] = self.initiator_depth;
        d[26] = 0;
        put_bits(d, 26, 0, 5, self.target_ack_delay);
        put_bits(d, 26, 5, 2, self.failover_accepted);
        put_bits(d, 26, 7, 1, u8::from(self.e2e_flow_control));
        d[27] = 0;
        put_bits(d, 27, 0, 3, self.rnr_retry_count);
        put_bits(d, 27, 3, 1, u8::from(self.srq));
        put(d, 28, &self.local_ca_guid.to_be_bytes());
        put_padded(d, 36, REP_PRIVATE_DATA, &self.private_data);
    }
}

/// Defines a message made of local comm ID, remote comm ID and private data at `$pd`.
macro_rules! ids_and_data {
    ($(#[$doc:meta])* $name:ident, $len:expr, $pd:expr) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        pub struct $name {
            /// Local communication ID (the sender's).
            pub local_comm_id: u32,
            /// Remote communication ID (the receiver's).
            pub remote_comm_id: u32,
            /// Private data (its full area when parsed).
            pub private_data: Vec<u8>,
        }

        impl $name {
            /// Parses the 232 data bytes.
            pub fn parse(d: &[u8]) -> Result<Self, MadError> {
                check(d)?;
                Ok($name {
                    local_comm_id: be32(d, 0),
                    remote_comm_id: be32(d, 4),
                    private_data: take(d, $pd, $len),
                })
            }

            /// Writes all 232 data bytes. Panics if `d` is shorter.
            pub fn emit(&self, d: &mut [u8]) {
                put(d, 0, &self.local_comm_id.to_be_bytes());
                put(d, 4, &self.remote_comm_id.to_be_bytes());
                put_padded(d, $pd, $len, &self.private_data);
            }
        }
    };
}

ids_and_data!(
    /// RTU (table 111).
    RtuRepr,
    RTU_PRIVATE_DATA,
    8
);
ids_and_data!(
    /// DREP (table 113).
    DrepRepr,
    DREP_PRIVATE_DATA,
    8
);

/// DREQ (table 112).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DreqRepr {
    /// Local communication ID (the sender's).
    pub local_comm_id: u32,
    /// Remote communication ID (the receiver's).
    pub remote_comm_id: u32,
    /// The receiver's QPN (24 bits).
    pub remote_qpn: u32,
    /// Private data ([`DREQ_PRIVATE_DATA`] bytes when parsed).
    pub private_data: Vec<u8>,
}

impl DreqRepr {
    /// Parses the 232 data bytes of a DREQ.
    pub fn parse(d: &[u8]) -> Result<Self, MadError> {
        check(d)?;
        Ok(DreqRepr {
            local_comm_id: be32(d, 0),
            remote_comm_id: be32(d, 4),
            remote_qpn: be24(d, 8),
            private_data: take(d, 12, DREQ_PRIVATE_DATA),
        })
    }

    /// Writes all 232 data bytes. Panics if `d` is shorter.
    pub fn emit(&self, d: &mut [u8]) {
        put(d, 0, &self.local_comm_id.to_be_bytes());
        put(d, 4, &self.remote_comm_id.to_be_bytes());
        put(d, 8, &[0; 4]);
        put24(d, 8, self.remote_qpn);
        put_padded(d, 12, DREQ_PRIVATE_DATA, &self.private_data);
    }
}
