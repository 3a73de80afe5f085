//! The conformance suite against the UDP driver: two devices on 127.0.0.1/127.0.0.2 with
//! OS-chosen ports, a fresh provider per case.
use emu_udp::{UdpContext, UdpProvider};
use verbs_conformance::{Env, KnownFailure, conformance_suite};

fn udp_env() -> verbs_api::Result<Env<UdpContext>> {
    let provider = UdpProvider::builder()
        .device_list("127.0.0.1:0,127.0.0.2:0")?
        .build()?;
    Env::from_provider(&provider)
}

/// Cases the UDP backend fails today (none).
const KNOWN: &[KnownFailure] = &[];

conformance_suite!(env = udp_env, known_failures = KNOWN);
