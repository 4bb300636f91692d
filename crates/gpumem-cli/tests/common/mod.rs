//! What the CLI tests share: running the built `gpumem` binary as a user would, the committed
//! traces, and the JSON a successful run prints.

#![allow(dead_code)] // each test file uses its own part

use std::io::Write;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// Runs the built `gpumem` binary with `args`: `GPUMEM_BIN` when set (a test binary run away
/// from its build tree, as `scripts/gpu-check.sh --from-bundle` does), else cargo's.
pub fn gpumem(args: &[&str]) -> Output {
    let binary = std::env::var_os("GPUMEM_BIN").unwrap_or(env!("CARGO_BIN_EXE_gpumem").into());
    Command::new(binary)
        .args(args)
        .output()
        .expect("the gpumem binary runs")
}

/// The path of a committed trace under `testdata/traces`.
pub fn testdata(name: &str) -> String {
    format!(
        "{}/../../testdata/traces/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// The JSON a run printed, after checking that it succeeded.
pub fn json_of(output: &Output) -> serde_json::Value {
    assert!(
        output.status.success(),
        "gpumem failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("stdout is JSON")
}

/// A pool endpoint of this test's (live) process in `dir` that sends a space every 100 ms for
/// `seconds` and never a whole answer: what a hung or flooding pool looks like to a watcher.
pub fn stuck_endpoint(dir: &Path, seconds: u64) -> PathBuf {
    let socket = dir.join(format!("{}.sock", std::process::id()));
    let listener = UnixListener::bind(&socket).unwrap();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().map_while(Result::ok) {
            std::thread::spawn(move || {
                for _ in 0..seconds * 10 {
                    if stream.write_all(b" ").is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            });
        }
    });
    socket
}
