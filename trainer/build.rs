// Embed libtorch's directory as an rpath so `ferrotrain` and the test binaries run without
// LD_LIBRARY_PATH. torch-sys (links = "tch") exports the directory it linked against.
//
// csrc/autograd.cpp is compiled against the same libtorch headers and C++ ABI as
// torch-sys's own shim.
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
    // The libtorch version for the start-up log (setup-libtorch.sh writes build-version).
    let version = lib
        .as_ref()
        .and_then(|l| {
            std::fs::read_to_string(std::path::Path::new(l).join("../build-version")).ok()
        })
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=FERROTRAIN_LIBTORCH_VERSION={version}");
    compile_shims(
        lib.as_deref()
            .expect("torch-sys did not say where libtorch is (DEP_TCH_LIBTORCH_LIB); set LIBTORCH"),
    );
    let mut build = "CPU";
    if let Some(lib) = lib {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
        let cuda = std::path::Path::new(&lib).join("libtorch_cuda.so");
        if std::env::var_os("CARGO_FEATURE_CUDA").is_some() && cuda.exists() {
            println!("cargo:rustc-link-arg=-L{lib}");
            println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
            build = "CUDA";
        }
    }
    // What the start-up line calls the build (libtorch cannot tell without a GPU).
    println!("cargo:rustc-env=FERROTRAIN_LIBTORCH_BUILD={build}");
}

/// Compiles csrc/autograd.cpp, csrc/memory.cpp, csrc/attention.cpp and csrc/optim.cpp (see their
/// headers) against
/// `lib`/../include.
fn compile_shims(lib: &str) {
    println!("cargo:rerun-if-changed=csrc/autograd.cpp");
    println!("cargo:rerun-if-changed=csrc/memory.cpp");
    println!("cargo:rerun-if-changed=csrc/attention.cpp");
    println!("cargo:rerun-if-changed=csrc/optim.cpp");
    println!("cargo:rerun-if-changed=csrc/guarded.h");
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    let include = std::path::Path::new(lib).join("../include");
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".into());
    cc::Build::new()
        .cpp(true)
        .pic(true)
        .warnings(false)
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={abi}"))
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .file("csrc/autograd.cpp")
        .file("csrc/memory.cpp")
        .file("csrc/attention.cpp")
        .file("csrc/optim.cpp")
        .compile("ferrotrain_shims");
}
