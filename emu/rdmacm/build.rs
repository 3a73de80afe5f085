//! Test binaries export their symbols (`-rdynamic`), so that the library's
//! `dlsym(RTLD_DEFAULT, "softverbs_open_gsi")` finds the export of the linked
//! softverbs-ibverbs rlib, as it finds it in `libibverbs.so.1` in a program.
fn main() {
    println!("cargo:rustc-link-arg-tests=-rdynamic");
}
