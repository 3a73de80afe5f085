//! softverbs binary
fn main() {}
