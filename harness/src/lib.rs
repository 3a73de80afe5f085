//! `softverbs`: the facade crate and command-line tool of the softverbs RDMA verbs emulator.
//!
//! Applications that want their backend chosen by configuration call [`open_from_env`] (or
//! [`registry`] for more control): `SOFTVERBS_PROVIDER=emu` (the default) selects the
//! in-process emulator, `SOFTVERBS_PROVIDER=udp` the UDP driver (devices on real sockets, see
//! [`UDP_ADDRS_ENV`]), and `SOFTVERBS_PROVIDER=hw` the RDMA devices of rdma-core's libibverbs
//! (a NIC, or Linux SoftRoCE's `rxe0`; [`verbs_hw`], library loaded at run time). The
//! returned [`verbs_api::dynamic::AnyContext`] implements [`verbs_api::Context`], so generic code
//! runs on it unchanged.
//!
//! ```
//! use verbs_api::{Context, ProtectionDomain};
//!
//! let ctx = softverbs::open_from_env()?;
//! let pd = ctx.alloc_pd()?;
//! pd.destroy()?;
//! # Ok::<(), verbs_api::Error>(())
//! ```
//!
//! The binary (`softverbs`) is documented in the README: `demo`, `capture`, `run` (the
//! multi-process fault-injection harness, [`run`]), `exec` and `env` (unmodified libibverbs
//! programs on the drop-in library, [`exec`]).
// `deny`, not `forbid`: the harness's one `kill(2)` call (SIGSTOP/SIGCONT, `run::signal`)
// is allowed locally; everything else stays safe code.
#![deny(unsafe_code)]

use std::sync::OnceLock;

use emu_sim::SimProvider;
use verbs_api::dynamic::{AnyContext, Registry};
use verbs_api::{Error, Result};

pub mod capture;
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

pub mod demo;
pub mod exec;
pub mod interop;
pub mod perf;
pub mod run;

/// Environment variable: number of devices of the process-wide in-process emulator (default 2).
pub const SIM_DEVICES_ENV: &str = "SOFTVERBS_SIM_DEVICES";

/// The process-wide in-process emulator, created on first use with
/// [`SIM_DEVICES_ENV`] devices (default 2) and seed 0, so that every context opened through
/// the registry shares one fabric.
pub fn sim_provider() -> Result<SimProvider> {
    static SIM: OnceLock<std::result::Result<SimProvider, Error>> = OnceLock::new();
    SIM.get_or_init(|| {
        let devices = match std::env::var(SIM_DEVICES_ENV) {
            Ok(v) => v.trim().parse::<usize>().map_err(|_| {
                Error::invalid(format!("{SIM_DEVICES_ENV}={v:?} is not a device count"))
            })?,
            Err(_) => 2,
        };
        SimProvider::builder().devices(devices).build()
    })
    .clone()
}

/// Environment variable: the addresses of the process-wide UDP provider's devices, one device
/// per comma-separated `ip[:port]` (port 4791 when left out, 0 for an OS-chosen port), e.g.
/// `127.0.0.1:4791` or `127.0.0.1:0,127.0.0.2:0`. Unset: one device on `127.0.0.1` with an
/// OS-chosen port, so that several processes never collide (their endpoints carry the port).
pub const UDP_ADDRS_ENV: &str = "SOFTVERBS_UDP_ADDRS";

/// The process-wide UDP provider, created on first use from [`UDP_ADDRS_ENV`]. Its devices
/// (and progress threads) live until the process exits. Errors: an unparsable address list or
/// an address that cannot be bound, as [`emu_driver::UdpBuilder::build`] reports them.
pub fn udp_provider() -> Result<emu_driver::UdpProvider> {
    static UDP: OnceLock<std::result::Result<emu_driver::UdpProvider, Error>> = OnceLock::new();
    UDP.get_or_init(|| {
        let list = std::env::var(UDP_ADDRS_ENV).unwrap_or_else(|_| "127.0.0.1:0".to_string());
        emu_driver::UdpProvider::builder()
            .device_list(&list)?
            .build()
    })
    .clone()
}

/// A registry with every built-in provider: `emu` (the in-process emulator), `udp` (the UDP
/// driver, [`udp_provider`]; its sockets are bound only when `udp` devices are first listed)
/// and `hw` (libibverbs' devices through [`verbs_hw::HwProvider`]; libibverbs is loaded only
/// when `hw` devices are first listed, and its absence is a `NotFound` error naming the
/// library, never a failed start).
///
/// ```
/// use verbs_api::{Context, ProtectionDomain};
///
/// // A UDP device on 127.0.0.1 with an OS-chosen port (unless SOFTVERBS_UDP_ADDRS says else).
/// let ctx = softverbs::registry().open("udp", None)?;
/// assert_eq!(ctx.device_name(), "udp0");
/// let pd = ctx.alloc_pd()?;
/// pd.destroy()?;
/// # Ok::<(), verbs_api::Error>(())
/// ```
pub fn registry() -> Registry {
    let mut registry = Registry::new();
    registry.register("emu", || {
        use verbs_api::Provider;
        let sim = sim_provider()?;
        Ok(sim
            .devices()?
            .into_iter()
            .map(verbs_api::dynamic::AnyDevice::new)
            .collect())
    });
    registry.register("udp", || {
        use verbs_api::Provider;
        let udp = udp_provider()?;
        Ok(udp
            .devices()?
            .into_iter()
            .map(verbs_api::dynamic::AnyDevice::new)
            .collect())
    });
    registry.register("hw", || {
        use verbs_api::Provider;
        Ok(verbs_hw::HwProvider::new()?
            .devices()?
            .into_iter()
            .map(verbs_api::dynamic::AnyDevice::new)
            .collect())
    });
    registry
}

/// Opens the device named by `SOFTVERBS_DEVICE` (default: the first) of the provider named by
/// `SOFTVERBS_PROVIDER` (default: `emu`). Errors name the valid providers and devices.
pub fn open_from_env() -> Result<AnyContext> {
    registry().open_from_env("emu")
}
