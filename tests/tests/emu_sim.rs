//! The conformance suite against the in-process emulator (`emu-sim`), two devices, a fresh
//! provider per case.

use emu_sim::{SimContext, SimProvider};
use verbs_conformance::{Env, KnownFailure, conformance_suite};

fn sim_env() -> verbs_api::Result<Env<SimContext>> {
    Env::from_provider(&SimProvider::builder().devices(2).build()?)
}

/// Cases the emulator fails today; each is a bug in the emulator (see the report), not in the
/// case. A listed case that starts passing fails the run (XPASS): remove it from here.
const KNOWN: &[KnownFailure] = &[];

conformance_suite!(env = sim_env, known_failures = KNOWN);
