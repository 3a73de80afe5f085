//! Static configuration of one software HCA: identity, port and limits.

use verbs_api::{AtomicCap, DeviceAttr, DeviceCapFlags, Gid, Mtu, ROCE_V2_UDP_PORT};

/// Device limits. The defaults follow rxe's (`rxe_param.h`), so that applications see the same
/// ceilings on the emulator as on Linux SoftRoCE (rc-transport.md §8, "Limits").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Maximum QPs.
    pub max_qp: u32,
    /// Maximum WRs per queue.
    pub max_qp_wr: u32,
    /// Maximum SGEs per WR.
    pub max_sge: u32,
    /// Maximum CQs.
    pub max_cq: u32,
    /// Maximum CQEs per CQ (rxe: 2^15 − 1).
    pub max_cqe: u32,
    /// Maximum MRs.
    pub max_mr: u32,
    /// Largest MR in bytes.
    pub max_mr_size: u64,
    /// Maximum PDs.
    pub max_pd: u32,
    /// Maximum outstanding READ/atomic requests per QP, in either direction (rxe: 128).
    pub max_rd_atomic: u32,
    /// Maximum SRQs.
    pub max_srq: u32,
    /// Maximum WRs per SRQ.
    pub max_srq_wr: u32,
    /// Maximum SGEs per SRQ WR.
    pub max_srq_sge: u32,
    /// Maximum inline bytes per send WR (rxe: 512).
    pub max_inline_data: u32,
    /// Maximum completion channels.
    pub max_comp_channels: u32,
    /// Largest message in bytes (rxe: 2^31).
    pub max_msg_sz: u32,
    /// Maximum memory windows.
    pub max_mw: u32,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_qp: 0x1_0000,
            max_qp_wr: 0x4000,
            max_sge: 32,
            max_cq: 0x4000,
            max_cqe: 0x7FFF,
            max_mr: 0x4_0000,
            max_mr_size: 1 << 40,
            max_pd: 0x7FFC,
            max_rd_atomic: 128,
            max_srq: 0x4000,
            max_srq_wr: 0x4000,
            max_srq_sge: 27,
            max_inline_data: 512,
            max_comp_channels: 0x4000,
            max_msg_sz: 0x8000_0000,
            max_mw: 0x1_0000,
        }
    }
}

/// Everything that identifies and bounds one emulated device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaConfig {
    /// Device name, e.g. `softverbs0`.
    pub name: String,
    /// Node GUID.
    pub node_guid: u64,
    /// The port's only GID: its IP address in IPv4-mapped form for IPv4.
    pub gid: Gid,
    /// UDP port the device receives on (4791 unless bound elsewhere).
    pub udp_port: u16,
    /// Largest MTU of the port.
    pub max_mtu: Mtu,
    /// Active MTU of the port.
    pub active_mtu: Mtu,
    /// Limits.
    pub limits: Limits,
    /// Seed of the key generator (the random low byte of lkeys/rkeys); the engine never uses
    /// an unseeded RNG.
    pub seed: u64,
    /// UDP source port of every packet the device sends. `None` (the default): per QP pair,
    /// as rxe's `rdma_get_udp_sport` does (rc-transport.md §1.9), for drivers that can send
    /// from any port (the in-process fabric). `Some(p)`: a device that sends from one socket
    /// bound to `p`; the ICRC (which covers the UDP source port) is then computed for the
    /// port the packet really leaves from, so the driver never recomputes it.
    pub source_port: Option<u16>,
    /// Peers whose IPv4 identification is unknown. The ICRC covers that field; softverbs
    /// senders set it to 0, but Linux rxe and NICs number their datagrams, and a receiver on a
    /// UDP socket cannot see it (rc-transport.md §1.8 addendum). When true, an IPv4 packet whose
    /// ICRC does not match with identification 0 is accepted if some identification makes it
    /// match ([`crate::wire::solve_ipv4_ident`]; counted in [`crate::Stats::icrc_ident_solved`]);
    /// a corrupted packet is still dropped with probability 1 − 2⁻¹⁶. False (the default): the
    /// identification must be 0, the full 32-bit check.
    pub foreign_ipv4_ident: bool,
}

impl HcaConfig {
    /// A device named `name` with GID `gid`, rxe's limits, MTU 4096 and the given seed.
    pub fn new(name: impl Into<String>, gid: Gid, seed: u64) -> HcaConfig {
        let guid_low = u64::from(u32::from_be_bytes([
            gid.0[12], gid.0[13], gid.0[14], gid.0[15],
        ]));
        HcaConfig {
            name: name.into(),
            node_guid: 0x0253_4f46_0000_0000 | guid_low,
            gid,
            udp_port: ROCE_V2_UDP_PORT,
            max_mtu: Mtu::Mtu4096,
            active_mtu: Mtu::Mtu4096,
            limits: Limits::default(),
            seed,
            source_port: None,
            foreign_ipv4_ident: false,
        }
    }

    /// The `ibv_device_attr` this configuration reports.
    pub fn device_attr(&self) -> DeviceAttr {
        let l = &self.limits;
        DeviceAttr {
            fw_ver: concat!("softverbs ", env!("CARGO_PKG_VERSION")).to_string(),
            node_guid: self.node_guid,
            sys_image_guid: self.node_guid,
            max_mr_size: l.max_mr_size,
            page_size_cap: 0xFFFF_F000,
            vendor_id: 0x00_5346,
            vendor_part_id: 0x5356,
            hw_ver: 1,
            max_qp: l.max_qp,
            max_qp_wr: l.max_qp_wr,
            max_sge: l.max_sge,
            max_cq: l.max_cq,
            max_cqe: l.max_cqe,
            max_mr: l.max_mr,
            max_pd: l.max_pd,
            max_qp_rd_atom: l.max_rd_atomic,
            max_qp_init_rd_atom: l.max_rd_atomic,
            max_srq: l.max_srq,
            max_srq_wr: l.max_srq_wr,
            max_srq_sge: l.max_srq_sge,
            max_inline_data: l.max_inline_data,
            phys_port_cnt: 1,
            atomic_cap: AtomicCap::Hca,
            max_mw: l.max_mw,
            device_cap_flags: DeviceCapFlags::MEM_WINDOW | DeviceCapFlags::MEM_WINDOW_TYPE_2B,
        }
    }
}
