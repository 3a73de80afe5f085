//! `softverbs`: the facade crate and command-line tool of the softverbs RDMA verbs emulator.
//!
//! Applications that want their backend chosen by configuration call [`open_from_env`] (or
//! [`registry`] for more control): `SOFTVERBS_PROVIDER=emu` (the default) selects the
//! in-process emulator, and later providers (`udp`, `hw`) plug into the same registry. The
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
//! The binary (`softverbs`) is documented in the README: `demo`, `capture`.
#![forbid(unsafe_code)]

use std::sync::OnceLock;

use emu_sim::SimProvider;
use verbs_api::dynamic::{AnyContext, Registry};
use verbs_api::{Error, Result};

pub mod capture;
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

pub mod demo;

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

/// A registry with every built-in provider: `emu` (the in-process emulator).
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
    registry
}

/// Opens the device named by `SOFTVERBS_DEVICE` (default: the first) of the provider named by
/// `SOFTVERBS_PROVIDER` (default: `emu`). Errors name the valid providers and devices.
pub fn open_from_env() -> Result<AnyContext> {
    registry().open_from_env("emu")
}
