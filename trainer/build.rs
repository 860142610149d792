// Embed libtorch's directory as an rpath so `ferrotrain` and the test binaries run without
// LD_LIBRARY_PATH. torch-sys (links = "tch") exports the directory it linked against.
fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    let lib = std::env::var("DEP_TCH_LIBTORCH_LIB")
        .ok()
        .or_else(|| std::env::var("LIBTORCH").ok().map(|d| format!("{d}/lib")));
    if let Some(lib) = lib {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
}
