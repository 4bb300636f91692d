//! `gpumem_replay::tune` on every committed trace: each tuned setting's figures are those of a
//! plain replay with its `PYTORCH_CUDA_ALLOC_CONF` (read back by `TorchSettings::parse`, and
//! through a shell for the export line), the ranking honours the objective, the tuned setting
//! is never worse than PyTorch's defaults, and bad input is a clear error.
//!
//! The committed traces are short enough for the default budget to search them fully (a few
//! seconds in all); `cargo test --release -p gpumem-replay --test tune -- --nocapture` prints
//! what each trace gets.

use std::path::{Path, PathBuf};
use std::process::Command;

use gpumem_pool::policies::torch_settings::TorchSettings;
use gpumem_replay::tune::{tune, Objective, TuneError, TuneOptions, TuneReport, Tuned};
use gpumem_replay::{replay, PolicyReport, ReplayOptions};
use gpumem_trace::{read_path, Event, ReadOptions, Trace, TraceMeta};

/// Every trace file committed under `testdata/traces`, in every format.
fn committed_traces() -> Vec<(PathBuf, Trace)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/traces");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("testdata/traces exists")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    assert!(paths.len() >= 9, "committed traces in {}", dir.display());
    paths
        .into_iter()
        .map(|p| {
            let trace = read_path(&p, ReadOptions::default())
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, trace)
        })
        .collect()
}

/// The figures of a report that do not depend on timing.
fn figures(report: &PolicyReport) -> PolicyReport {
    PolicyReport {
        events_per_second: 0.0,
        ..report.clone()
    }
}

/// Replays `trace` as `gpumem replay --policy P --pytorch-alloc-conf CONF` does with the
/// tuned setting's conf string, and checks that every figure is the one the tuner reported.
fn check_against_plain_replay(name: &str, trace: &Trace, report: &TuneReport, tuned: &Tuned) {
    let settings = TorchSettings::parse(&tuned.conf).expect("the conf string parses");
    assert_eq!(settings, tuned.settings, "{name}: {}", tuned.conf);
    let options = ReplayOptions {
        capacity: report.capacity_bytes,
        torch: settings,
        history_capacity: 0,
        smallest_capacity: report.objective == Objective::Fit,
        ..ReplayOptions::default()
    };
    let plain = replay(trace, tuned.policy(), &options, &mut |_| {})
        .unwrap()
        .report;
    assert_eq!(
        figures(&plain),
        figures(&tuned.report),
        "{name}: {}",
        tuned.conf
    );
}

#[test]
fn tuned_settings_replay_to_the_same_figures_on_every_committed_trace() {
    for (path, trace) in committed_traces() {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let report = tune(&trace, &TuneOptions::default(), &|_| {}).unwrap();
        assert!(!report.ranked.is_empty(), "{name}");
        assert!(
            report.replays <= report.budget,
            "{name}: {}",
            report.replays
        );
        let compared = report.best_without_expandable.iter();
        for tuned in report
            .ranked
            .iter()
            .chain(compared)
            .chain([&report.pytorch_default])
        {
            check_against_plain_replay(&name, &trace, &report, tuned);
        }
        let best = &report.ranked[0].report;
        let default = &report.pytorch_default.report;
        assert!(
            best.peak_reserved_bytes <= default.peak_reserved_bytes,
            "{name}: tuned {} > default {}",
            best.peak_reserved_bytes,
            default.peak_reserved_bytes
        );
        eprintln!(
            "{name}: {} replays in {:.2} s; best {} ({} MiB reserved, default {} MiB, gpumem {} MiB)",
            report.replays,
            report.seconds,
            report.ranked[0].conf,
            best.peak_reserved_bytes >> 20,
            default.peak_reserved_bytes >> 20,
            report.gpumem.peak_reserved_bytes >> 20,
        );
    }
}

/// The small committed trace (366 events): quick enough for full searches.
fn small_trace() -> Trace {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/traces/small-gpt2-2l-infer-b1-s32.jsonl.gz");
    read_path(&path, ReadOptions::default()).unwrap()
}

#[test]
fn each_objective_ranks_by_its_own_figures() {
    let trace = small_trace();
    let peak_live = trace.summary().peak_live_bytes;
    let capacity = peak_live + (6 << 20);
    for objective in [Objective::Reserved, Objective::Fit, Objective::Calls] {
        let options = TuneOptions {
            objective,
            capacity: Some(capacity),
            top: 4,
            max_replays: None,
        };
        let report = tune(&trace, &options, &|_| {}).unwrap();
        assert!(
            report.complete,
            "{objective}: the small trace is searched fully"
        );
        let ranked = &report.ranked;
        assert!(ranked.len() >= 2, "{objective}: {} results", ranked.len());
        for pair in ranked.windows(2) {
            let (a, b) = (&pair[0].report, &pair[1].report);
            // Settings that fit come first under every objective.
            assert!(a.oom.is_none() || b.oom.is_some(), "{objective}");
            if a.oom.is_some() != b.oom.is_some() {
                continue;
            }
            match objective {
                Objective::Reserved => assert!(
                    (a.peak_reserved_bytes, a.device_calls)
                        <= (b.peak_reserved_bytes, b.device_calls)
                ),
                Objective::Fit => {
                    assert!(a.smallest_capacity_bytes <= b.smallest_capacity_bytes);
                    assert!(pair[0].margin_bytes >= pair[1].margin_bytes);
                }
                Objective::Calls => assert!(
                    (a.steady_state_alloc_calls_per_step, a.peak_reserved_bytes)
                        <= (b.steady_state_alloc_calls_per_step, b.peak_reserved_bytes)
                ),
            }
        }
        if objective == Objective::Fit {
            let best = &ranked[0];
            let smallest = best.report.smallest_capacity_bytes.unwrap();
            assert_eq!(best.margin_bytes, Some(capacity as i64 - smallest as i64));
            assert!(
                smallest
                    <= report
                        .pytorch_default
                        .report
                        .smallest_capacity_bytes
                        .unwrap()
            );
        }
        for tuned in ranked {
            check_against_plain_replay(objective.as_str(), &trace, &report, tuned);
        }
    }
}

#[test]
fn export_lines_set_the_conf_string_in_a_shell() {
    let trace = small_trace();
    let report = tune(&trace, &TuneOptions::default(), &|_| {}).unwrap();
    for tuned in report.ranked.iter().chain([&report.pytorch_default]) {
        let script = format!("{}; printf %s \"$PYTORCH_CUDA_ALLOC_CONF\"", tuned.export);
        let out = Command::new("sh").arg("-c").arg(&script).output().unwrap();
        assert!(out.status.success(), "{script}");
        let conf = String::from_utf8(out.stdout).unwrap();
        assert_eq!(conf, tuned.conf);
        assert_eq!(TorchSettings::parse(&conf).unwrap(), tuned.settings);
    }
}

#[test]
fn bad_input_is_a_clear_error() {
    let empty = Trace::new(TraceMeta::default(), vec![Event::Step { index: 0 }]);
    let e = tune(&empty, &TuneOptions::default(), &|_| {}).unwrap_err();
    assert!(matches!(e, TuneError::NothingToTune), "{e}");
    assert!(e.to_string().contains("allocates nothing"), "{e}");

    let trace = small_trace();
    let peak_live = trace.summary().peak_live_bytes;
    let options = TuneOptions {
        capacity: Some(peak_live - 1),
        ..TuneOptions::default()
    };
    let e = tune(&trace, &options, &|_| {}).unwrap_err().to_string();
    assert!(e.contains(&(peak_live - 1).to_string()), "{e}");
    assert!(e.contains(&peak_live.to_string()), "{e}");
    assert!(e.contains("peak live"), "{e}");

    // Out of range: an error naming the option and what it accepts, never clamped in silence.
    for (top, max_replays, named) in [
        (0, None, "top 0: accepted: 1 to 100"),
        (101, None, "top 101: accepted: 1 to 100"),
        (3, Some(0), "max_replays 0: accepted: 2 to 100000"),
        (3, Some(1), "max_replays 1: accepted: 2 to 100000"),
    ] {
        let options = TuneOptions {
            top,
            max_replays,
            ..TuneOptions::default()
        };
        let e = tune(&trace, &options, &|_| {}).unwrap_err();
        assert!(matches!(e, TuneError::OutOfRange { .. }), "{e}");
        assert_eq!(e.to_string(), named);
    }
}
