//! `gpumem top` driven as a person would: in a tmux terminal, with keys, on the bundled
//! recording; what is on screen is read back with capture-pane. Needs tmux: without it the
//! test fails with what to install, or skips when the user opted out of missing test
//! dependencies (`gpumem_testkit::deps`).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use gpumem_testkit::deps;

struct Tmux {
    socket: String,
}

impl Tmux {
    fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .expect("tmux runs")
    }

    fn screen(&self) -> String {
        String::from_utf8(self.run(&["capture-pane", "-p", "-t", "top"]).stdout).unwrap()
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "top"];
        args.extend_from_slice(keys);
        assert!(self.run(&args).status.success());
    }

    /// The screen once `ready` holds for it; fails with the last screen after 20 s.
    fn wait_for(&self, what: &str, ready: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let screen = self.screen();
            if ready(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "waited for {what}; the screen is:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn alive(&self) -> bool {
        self.run(&["has-session", "-t", "top"]).status.success()
    }

    /// Presses q and waits for the session to end; fails with the screen after 10 s.
    fn quit(&self) {
        self.keys(&["q"]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.alive() {
            assert!(
                Instant::now() < deadline,
                "q did not quit:\n{}",
                self.screen()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

/// Whether tmux runs here; when it does not, the rule for a missing test dependency applies
/// (a failure, or `false` after a `SKIPPED:` line when the user opted out).
fn tmux_available() -> bool {
    let works = match Command::new("tmux").arg("-V").output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!("tmux -V: {}", out.status)),
        Err(e) => Err(format!("tmux: {e}")),
    };
    deps::require(deps::TMUX, works).is_some()
}

/// Lines of the process table, in order: (pid, rest).
fn process_order(screen: &str) -> Vec<&str> {
    screen
        .lines()
        .filter_map(|l| l.trim_start_matches(['>', ' ']).split_whitespace().next())
        .filter(|pid| *pid == "4200" || *pid == "4300")
        .collect()
}

fn demo_path() -> String {
    format!(
        "{}/../../testdata/watch/demo.jsonl",
        env!("CARGO_MANIFEST_DIR")
    )
}

#[test]
fn top_shows_gpus_pools_and_processes_and_answers_keys() {
    if !tmux_available() {
        return;
    }
    let tmux = Tmux {
        socket: format!("gpumem-top-test-{}", std::process::id()),
    };
    let demo = format!(
        "{}/../../testdata/watch/demo.jsonl",
        env!("CARGO_MANIFEST_DIR")
    );
    let command = format!(
        "{} top --samples {demo} --interval 100ms",
        env!("CARGO_BIN_EXE_gpumem")
    );
    let started = tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "150",
        "-y",
        "45",
        &command,
    ]);
    assert!(
        started.status.success(),
        "{}",
        String::from_utf8_lossy(&started.stderr)
    );

    let screen = tmux.wait_for("the first frame", |s| s.contains("processes (2)"));
    assert!(
        screen.contains("gpu-node-01 — 2 GPU(s), 2 pool(s) — sorted by memory"),
        "{screen}"
    );
    assert!(screen.contains("GPU 1 NVIDIA H100 80GB HBM3"), "{screen}");
    assert!(screen.contains("mem 70.50 GiB / 80.00 GiB"), "{screen}");
    assert!(
        screen.contains("pools: 38.00 GiB allocated, 69.00 GiB reserved"),
        "{screen}"
    );
    assert!(screen.contains("util GPU 0"), "{screen}");
    let row = screen.lines().find(|l| l.contains("4300")).unwrap();
    for column in [
        "bob",
        "70.00 GiB",
        "torch",
        "38.00 GiB",
        "69.00 GiB",
        "97 %",
        "python finetune.py",
    ] {
        assert!(row.contains(column), "{column} missing in {row}");
    }
    // The bar holds the pool's allocated (█) and cached (▒) parts.
    let bar = screen
        .lines()
        .filter(|l| l.starts_with('['))
        .nth(1)
        .unwrap();
    assert!(bar.contains('█') && bar.contains('▒'), "{bar}");
    assert_eq!(process_order(&screen), ["4200", "4300"]);

    tmux.keys(&["s"]);
    let screen = tmux.wait_for("sorting by fragmentation", |s| {
        s.contains("sorted by fragmentation")
    });
    assert_eq!(process_order(&screen), ["4300", "4200"], "{screen}");

    // The selection stays on 4200 when sorting; go up to 4300 and open its pool, and wait
    // for the recording to reach its OOM.
    tmux.keys(&["Up", "Enter"]);
    let screen = tmux.wait_for("the pool status with the last OOM", |s| {
        s.contains("pid 4300 on GPU 1") && s.contains("Last OOM: out of memory")
    });
    assert!(screen.contains("policy torch"), "{screen}");
    assert!(screen.contains("OOMs: 1"), "{screen}");
    assert!(screen.contains("tried to allocate 2.50 GiB"), "{screen}");

    tmux.keys(&["Escape"]);
    tmux.wait_for("the pool panel to close", |s| {
        !s.contains("pid 4300 on GPU 1")
    });
    tmux.wait_for("the end of the recording", |s| {
        s.contains("end of recording")
    });

    tmux.quit();
}

#[test]
fn a_stuck_pool_endpoint_is_named_on_screen_and_the_view_keeps_refreshing() {
    if !tmux_available() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("gpumem-top-stuck-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    common::stuck_endpoint(&dir, 60);
    let tmux = Tmux {
        socket: format!("gpumem-top-stuck-{}", std::process::id()),
    };
    let command = format!(
        "env GPUMEM_PUBLISH_DIR={} {} top --interval 200ms",
        dir.display(),
        env!("CARGO_BIN_EXE_gpumem")
    );
    let started = tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "200",
        "-y",
        "40",
        &command,
    ]);
    assert!(started.status.success());
    let screen = tmux.wait_for("the skipped endpoint's note", |s| {
        s.contains("skipped a pool endpoint")
    });
    // The note names the endpoint and why (the path may be cut at the screen's edge).
    let line = screen
        .lines()
        .find(|l| l.contains("skipped a pool endpoint"))
        .unwrap()
        .to_string();
    assert!(line.contains(dir.to_str().unwrap()), "{line}");
    // Each refresh waits at most the 500 ms bound for the stuck endpoint, so the view
    // still answers keys: q quits within a few refreshes.
    tmux.quit();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_arguments_are_refused_before_the_screen_is_taken() {
    let out = common::gpumem(&["top", "--interval", "0s"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an interval"));
    for out_of_range in ["99999999999999999999999h", "0.000000001ms"] {
        let out = common::gpumem(&["top", "--interval", out_of_range]);
        assert_eq!(out.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("out of range for an interval: accepted are 10ms to 24h"),
            "{stderr}"
        );
    }
    let out = common::gpumem(&["top", "--samples", &demo_path()]);
    assert_eq!(out.status.code(), Some(2), "stdout is a pipe here");
    assert!(String::from_utf8_lossy(&out.stderr).contains("gpumem top needs a terminal"));
    let out = common::gpumem(&["top", "--samples", "/nonexistent/rec.jsonl"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/rec.jsonl"));
}
