//! Every committed trace through every policy under the replay's model of asynchronous
//! execution (each block used by a kernel on its stream at its allocation and right before its
//! free, on a simulated GPU that finishes work only when the host waits, watched by the hazard
//! checker): no policy unmaps, releases or re-lends memory under queued work, with the device
//! as large as the trace needs and with it 10 % smaller than the policy's peak (so that the
//! pool reclaims and, for `gpumem`, moves idle chunks under pressure). Prints each policy's
//! synchronisations and device calls per step in steady state.
//!
//! `cargo test --release -p gpumem-replay --test async_traces -- --nocapture` shows the table.

use std::path::{Path, PathBuf};

use gpumem_pool::PolicyKind;
use gpumem_replay::{replay, ReplayOptions};
use gpumem_trace::{read_path, ReadOptions};

fn traces() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/traces");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    assert!(
        paths.len() >= 10,
        "the committed traces in {}",
        dir.display()
    );
    paths
}

fn per_step(value: Option<u64>) -> String {
    value.map_or("-".into(), |v| v.to_string())
}

#[test]
fn no_policy_reuses_memory_under_queued_work_on_any_committed_trace() {
    let mut hazards = Vec::new();
    eprintln!(
        "| trace | policy | utilisation | syncs (all) | syncs/step | device calls/step | \
         hazards | under pressure: syncs, hazards |"
    );
    for path in traces() {
        let trace = read_path(&path, ReadOptions::default()).unwrap();
        for policy in PolicyKind::ALL {
            let name = format!("{} / {policy}", trace.meta.name);
            let free = replay(&trace, policy, &ReplayOptions::default(), &mut |_| {})
                .unwrap_or_else(|e| panic!("{name}: {e}"))
                .report;
            let tight = ReplayOptions {
                capacity: Some(free.peak_reserved_bytes / 10 * 9),
                ..ReplayOptions::default()
            };
            let pressed = replay(&trace, policy, &tight, &mut |_| {})
                .unwrap_or_else(|e| panic!("{name} under pressure: {e}"))
                .report;
            eprintln!(
                "| {} | {policy} | {:.1} % | {} | {} | {} | {} | {}, {} |",
                trace.meta.name,
                100.0 * free.utilization,
                free.synchronizations,
                per_step(free.steady_state_syncs_per_step),
                per_step(free.steady_state_device_calls_per_step),
                free.hazards,
                pressed.synchronizations,
                pressed.hazards,
            );
            if free.hazards + pressed.hazards > 0 {
                hazards.push(format!(
                    "{name}: {} hazards, {} under pressure",
                    free.hazards, pressed.hazards
                ));
            }
        }
    }
    assert!(hazards.is_empty(), "{hazards:#?}");
}
