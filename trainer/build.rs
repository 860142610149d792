// Embed libtorch's directory as an rpath so `ferrotrain` and the test binaries run without
// LD_LIBRARY_PATH. torch-sys (links = "tch") exports the directory it linked against.
//
// With the `cuda` feature and a CUDA libtorch (scripts/setup-libtorch.sh --cuda), link
// libtorch_cuda.so with --no-as-needed: nothing in the binary calls it directly, so the
// linker's default --as-needed would drop it, and without it loaded libtorch has no CUDA
// kernels (tch reports no CUDA device). `readelf -d target/.../ferrotrain` must list it.
fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    let lib = std::env::var("DEP_TCH_LIBTORCH_LIB")
        .ok()
        .or_else(|| std::env::var("LIBTORCH").ok().map(|d| format!("{d}/lib")));
    if let Some(lib) = lib {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
        let cuda = std::path::Path::new(&lib).join("libtorch_cuda.so");
        if std::env::var_os("CARGO_FEATURE_CUDA").is_some() && cuda.exists() {
            println!("cargo:rustc-link-arg=-L{lib}");
            println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
        }
    }
}
