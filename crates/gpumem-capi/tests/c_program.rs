//! A C program compiled against include/gpumem.h and linked with the shared library runs its
//! checks on the simulated device; with the `fault-injection` feature, C and C++ programs
//! provoke panics in the entry points and check they come back as errors. Without a C
//! or C++ compiler the test fails with what to install, or skips when the user opted out of
//! missing test dependencies (`gpumem_testkit::deps`).

use std::path::{Path, PathBuf};
use std::process::Command;

use gpumem_testkit::deps;

/// Where cargo put the shared library for this build: beside this executable (deps/, where
/// `cargo test` and `cargo bench` build it) or one folder up (where `cargo build` copies it).
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap().to_path_buf();
    let up = deps.parent().unwrap().to_path_buf();
    [deps.clone(), up]
        .into_iter()
        .find(|dir| {
            dir.join("libgpumem_capi.so").exists() || dir.join("libgpumem_capi.dylib").exists()
        })
        .unwrap_or(deps)
}

/// Compiles `source` (tests/c/) with `compiler` (`CC`/`CXX` or `default`) against the header
/// and the shared library, runs it on the simulated device with `arg`, and checks it prints
/// "ok"; `None` when there is no compiler and the user opted out of missing test dependencies.
fn compile_and_run(
    source: &str,
    compiler_var: &str,
    default: &str,
    flags: &[&str],
    arg: &Path,
) -> Option<()> {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = library_dir();
    assert!(
        lib.join("libgpumem_capi.so").exists() || lib.join("libgpumem_capi.dylib").exists(),
        "the shared library is not in {}",
        lib.display()
    );
    let exe = tempdir().join(source.replace('.', "_"));
    let compiler = std::env::var(compiler_var).unwrap_or_else(|_| default.into());
    let compiled = Command::new(&compiler)
        .arg(crate_dir.join("tests/c").join(source))
        .arg("-I")
        .arg(crate_dir.join("include"))
        .args(flags)
        .args(["-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lgpumem_capi")
        .output();
    let dep = if compiler_var == "CXX" {
        deps::CXX_COMPILER
    } else {
        deps::C_COMPILER
    };
    let found =
        compiled.map_err(|e| format!("{compiler}: {e} (set {compiler_var} to use another)"));
    let compiled = deps::require(dep, found)?;
    assert!(
        compiled.status.success(),
        "{}",
        String::from_utf8_lossy(&compiled.stderr)
    );
    // The library just built, not another build's copy that cargo's LD_LIBRARY_PATH (searched
    // before the rpath) may name first, such as target/debug's from a build without a feature.
    let ran = Command::new(&exe)
        .env("LD_LIBRARY_PATH", &lib)
        .arg(arg)
        .env("GPUMEM_DEVICE", "sim")
        .env_remove("GPUMEM_HARD_LIMIT")
        .env_remove("GPUMEM_POOL")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&ran.stderr);
    assert!(ran.status.success(), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&ran.stdout).trim(),
        "ok",
        "{stderr}"
    );
    Some(())
}

#[test]
fn a_c_program_allocates_frees_and_reads_statistics_through_the_header() {
    let snapshot = tempdir().join("snapshot.pickle");
    if compile_and_run("smoke.c", "CC", "cc", &["-std=c99"], &snapshot).is_none() {
        return;
    }
    let pickle = std::fs::read(&snapshot).unwrap();
    assert_eq!(pickle.first(), Some(&0x80), "a pickle starts with PROTO");
}

#[test]
fn racing_calls_and_calls_at_thread_exit_keep_their_promises() {
    compile_and_run(
        "races.c",
        "CC",
        "cc",
        &["-std=c11", "-pthread"],
        Path::new("-"),
    );
}

#[test]
fn pytorchs_entry_point_throws_a_cpp_exception_with_the_explanation_on_oom() {
    let flags = ["-std=c++17"];
    compile_and_run("torch_oom.cpp", "CXX", "c++", &flags, Path::new("-"));
}

#[cfg(feature = "fault-injection")]
#[test]
fn a_panic_in_an_entry_point_is_an_error_code_in_c_and_the_pool_works_or_refuses() {
    let snapshot = tempdir().join("panic-snapshot.pickle");
    compile_and_run("panics.c", "CC", "cc", &["-std=c99"], &snapshot);
    assert!(!snapshot.exists(), "the panicking snapshot wrote nothing");
}

#[cfg(feature = "fault-injection")]
#[test]
fn a_panic_in_pytorchs_entry_point_is_a_cpp_runtime_error_naming_it() {
    compile_and_run(
        "torch_panic.cpp",
        "CXX",
        "c++",
        &["-std=c++17"],
        Path::new("-"),
    );
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpumem-capi-c-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
