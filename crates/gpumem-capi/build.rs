//! Compiles `src/throw.cpp`, the C++ half of the PyTorch entry point: PyTorch's pluggable
//! allocator has no way to hear of a failed allocation except a C++ exception.

fn main() {
    println!("cargo:rerun-if-changed=src/throw.cpp");
    cc::Build::new()
        .cpp(true)
        .file("src/throw.cpp")
        .flag_if_supported("-std=c++17")
        .compile("gpumem_capi_throw");
    // dlsym, for finding PyTorch's c10::OutOfMemoryError at run time.
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-link-lib=dl");
    }
}
