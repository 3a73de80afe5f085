//! Rough size of one state.
fn main() {
    let cfg = emu_model::Config::named("mix4").unwrap();
    let sys = emu_model::system::System::new(&cfg).unwrap();
    println!("debug {} canon {} {}", format!("{sys:?}").len(), sys.nodes[0].hca.canonical_state(sys.now).len(), sys.nodes[1].hca.canonical_state(sys.now).len());
}
