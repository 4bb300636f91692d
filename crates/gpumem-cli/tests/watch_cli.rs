//! `gpumem diagnose`, `gpumem exporter` and `gpumem watch record` as a user runs them on the
//! bundled recording.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::gpumem;
use gpumem_testkit::deps;

fn demo() -> String {
    format!(
        "{}/../../testdata/watch/demo.jsonl",
        env!("CARGO_MANIFEST_DIR")
    )
}

#[test]
fn diagnose_names_the_fragmented_pool_of_the_demo() {
    let out = gpumem(&["diagnose", "--samples", &demo()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("1 finding(s) over 60 samples"), "{text}");
    assert!(text.contains("fragmentation — pid 4300 on GPU 1"), "{text}");

    let out = gpumem(&["diagnose", "--samples", &demo(), "--pid", "4200"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with("No known cause of an underused GPU holds for pid 4200"),
        "{text}"
    );

    let out = gpumem(&["diagnose", "--duration", "forever"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn the_exporter_prints_its_address_and_serves_the_recording() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args(["exporter", "--listen", "127.0.0.1:0", "--samples", &demo()])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("gpumem: serving metrics on ")
        .unwrap_or_else(|| panic!("{line}"))
        .to_string();
    let scraped = Command::new("curl").args(["-sS", "--fail", &url]).output();
    child.kill().unwrap();
    child.wait().unwrap();
    let Some(out) = deps::require(deps::CURL, scraped) else {
        return;
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let body = String::from_utf8(out.stdout).unwrap();
    assert!(body.contains("# TYPE DCGM_FI_DEV_FB_USED gauge"), "{body}");
    assert!(body.contains(r#"gpumem_pool_reserved_bytes{gpu="1",pid="4300",policy="torch",Hostname="gpu-node-01"} 74088185856"#), "{body}");

    let out = gpumem(&["exporter", "--listen", "not an address"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot listen"));
}

#[test]
fn record_without_a_gpu_says_so_and_writes_a_readable_recording() {
    let dir = std::env::temp_dir().join(format!("gpumem-record-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let output = dir.join("rec.jsonl");
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args([
            "watch",
            "record",
            "--output",
            output.to_str().unwrap(),
            "--interval",
            "100ms",
            "--duration",
            "300ms",
        ])
        .env("GPUMEM_PUBLISH_DIR", dir.join("endpoints"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !std::path::Path::new("/dev/nvidiactl").exists() {
        assert!(
            stderr.contains("no NVIDIA GPU can be watched here"),
            "{stderr}"
        );
    }
    let out = gpumem(&["diagnose", "--samples", output.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
