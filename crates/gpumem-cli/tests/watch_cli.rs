//! `gpumem diagnose`, `gpumem exporter` and `gpumem watch record` as a user runs them on the
//! bundled recording.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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

    let out = gpumem(&["diagnose", "--samples", &demo(), "--pid", "99999"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        text.trim(),
        "Nothing could be checked for pid 99999: pid 99999 is on no GPU and has no pool in any sample (60 read)."
    );
}

#[test]
fn durations_and_intervals_out_of_range_are_refused_naming_the_range() {
    let cases: [(&[&str], &str); 4] = [
        (
            &["diagnose", "--duration", "99999999999999999999999h"],
            "1ms to 8760h (a year)",
        ),
        (
            &["diagnose", "--duration", "0.0000001ms"],
            "1ms to 8760h (a year)",
        ),
        (
            &[
                "watch",
                "record",
                "-o",
                "unused.jsonl",
                "--interval",
                "0.000000001ms",
            ],
            "10ms to 24h",
        ),
        (&["diagnose", "--interval", "25h"], "10ms to 24h"),
    ];
    for (args, range) in cases {
        let out = gpumem(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("out of range"), "{args:?}: {stderr}");
        assert!(stderr.contains(range), "{args:?}: {stderr}");
    }
}

/// A new empty directory for one test (removed by the test when it passes).
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("gpumem-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `gpumem ARGS` with the pool endpoints in `endpoints`; its output and how long it took.
fn run_live(args: &[&str], endpoints: &std::path::Path) -> (std::process::Output, Duration) {
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args(args)
        .env("GPUMEM_PUBLISH_DIR", endpoints)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (out, start.elapsed())
}

#[test]
fn live_sampling_ends_on_time_when_the_interval_is_longer() {
    let dir = scratch("on-time");
    let output = dir.join("r.jsonl");
    let output = output.to_str().unwrap();
    for args in [
        &[
            "watch",
            "record",
            "-o",
            output,
            "--duration",
            "300ms",
            "--interval",
            "20s",
        ][..],
        &["diagnose", "--duration", "300ms", "--interval", "1h"],
    ] {
        let (_, took) = run_live(args, &dir.join("endpoints"));
        assert!(took < Duration::from_secs(5), "{args:?} took {took:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_stuck_pool_endpoint_is_skipped_with_a_warning_and_the_recording_ends_on_time() {
    let dir = scratch("stuck-endpoint");
    let socket = common::stuck_endpoint(&dir, 20);
    let output = dir.join("r.jsonl");
    let args = [
        "watch",
        "record",
        "-o",
        output.to_str().unwrap(),
        "--duration",
        "1s",
        "--interval",
        "200ms",
    ];
    let (out, took) = run_live(&args, &dir);
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let warning = format!(
        "gpumem: skipped a pool endpoint: {}: no complete answer within 500 ms",
        socket.display()
    );
    assert_eq!(stderr.matches(&warning).count(), 1, "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
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

    for bad in ["not an address", "", "abc"] {
        let out = gpumem(&["exporter", "--listen", bad]);
        assert_eq!(out.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!(
                "{bad:?} is not an address to listen on (invalid socket address); use HOST:PORT, e.g. 127.0.0.1:9400"
            )),
            "{stderr}"
        );
    }
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
