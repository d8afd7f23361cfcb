//! Links the cdylib with `-Bsymbolic`, so calls from inside the simulated driver to its
//! own exported functions bind to themselves and never to a shim's same-named exports,
//! and with `-z nodelete`, so `dlclose` never unmaps the fork handlers it registers.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
    // pthread_atfork handlers live in the library: never let dlclose unmap them.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rerun-if-changed=build.rs");
}
