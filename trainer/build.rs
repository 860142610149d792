// Embed libtorch's directory as an rpath so `ferrotrain` runs without LD_LIBRARY_PATH.
fn main() {
    if let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
}
