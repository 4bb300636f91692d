//! Each diagnosis fires on samples built to show it, and on no other scenario's samples.

use gpumem_watch::diagnose::{diagnose, nothing_to_check, Kind, Thresholds};
use gpumem_watch::{synthetic, Sample};

fn kinds(samples: &[Sample]) -> Vec<Kind> {
    let mut kinds: Vec<Kind> = diagnose(samples, None, &Thresholds::default())
        .into_iter()
        .map(|f| f.kind)
        .collect();
    kinds.dedup();
    kinds
}

#[test]
fn a_healthy_run_has_no_finding() {
    assert_eq!(kinds(&synthetic::healthy(1, 60)), vec![]);
    assert_eq!(
        kinds(
            &(0..60)
                .map(|t| synthetic::healthy_at(4, 2, t))
                .collect::<Vec<_>>()
        ),
        vec![]
    );
}

#[test]
fn each_scenario_shows_its_cause_and_no_other() {
    let cases = [
        (synthetic::small_batch(60), Kind::UnusedMemory),
        (synthetic::data_starved(60), Kind::DataStarvation),
        (synthetic::fragmented(60), Kind::Fragmentation),
        (synthetic::imbalanced(60), Kind::RankImbalance),
        (synthetic::pcie_bound(60), Kind::PcieBound),
    ];
    for (samples, kind) in &cases {
        assert_eq!(kinds(samples), vec![*kind], "{kind:?}");
    }
}

#[test]
fn unused_memory_says_how_much_and_points_to_the_planner() {
    let findings = diagnose(&synthetic::small_batch(30), None, &Thresholds::default());
    let text = findings[0].to_string();
    assert!(
        text.contains("peak memory 24.00 GiB of 80.00 GiB (30 %)"),
        "{text}"
    );
    assert!(text.contains("×3.0"), "{text}");
    assert!(
        text.contains("gpumem plan --model MODEL --mode train --seq SEQ --fit batch --gpu 80GiB"),
        "{text}"
    );
}

#[test]
fn starvation_counts_the_gaps_and_suggests_the_loader() {
    let text = diagnose(&synthetic::data_starved(70), None, &Thresholds::default())[0].to_string();
    assert!(
        text.contains("idle (< 10 %) in 30 of 70 samples, in 10 separate gaps"),
        "{text}"
    );
    assert!(
        text.contains("num_workers") && text.contains("pin_memory"),
        "{text}"
    );
    assert!(
        text.contains("pid 4200 uses 180 % of a CPU core in the gaps and 30 % while the GPU computes: the gaps are the host's work"),
        "{text}"
    );
}

#[test]
fn a_gpu_idle_all_along_is_not_starved_and_one_gap_is_not_a_pattern() {
    let idle = adjust(synthetic::healthy(1, 30), |_, s| s.gpus[0].gpu_util = 0.0);
    assert!(!kinds(&idle).contains(&Kind::DataStarvation));
    let one_gap = adjust(synthetic::healthy(1, 30), |t, s| {
        if (10..20).contains(&t) {
            s.gpus[0].gpu_util = 1.0;
        }
    });
    assert!(!kinds(&one_gap).contains(&Kind::DataStarvation));
}

#[test]
fn fragmentation_names_the_process_and_the_policy_remedy() {
    let text = diagnose(&synthetic::fragmented(20), None, &Thresholds::default())[0].to_string();
    assert!(text.contains("pid 4200 on GPU 0"), "{text}");
    assert!(
        text.contains("66.00 GiB reserved for 30.00 GiB allocated (×2.2)"),
        "{text}"
    );
    assert!(text.contains("GPUMEM_POOL=gpumem or expandable"), "{text}");
    assert!(text.contains("gpumem tune"), "{text}");
}

#[test]
fn a_large_cache_in_one_piece_is_fragmentation_with_the_soft_limit_remedy() {
    let cached = adjust(synthetic::fragmented(20), |_, s| {
        s.pools[0].largest_free_block = s.pools[0].cached();
    });
    let text = diagnose(&cached, None, &Thresholds::default())[0].to_string();
    assert!(text.contains("GPUMEM_SOFT_LIMIT"), "{text}");
}

#[test]
fn imbalance_names_the_lagging_rank() {
    let findings = diagnose(&synthetic::imbalanced(20), None, &Thresholds::default());
    assert_eq!(findings[0].subject, "GPU 3 of 4");
    let text = findings[0].to_string();
    assert!(
        text.contains("GPU 3 78.00 GiB vs GPU 0 50.00 GiB"),
        "{text}"
    );
    assert!(text.contains("GPU 3 99 % vs GPU 0 60 %"), "{text}");
}

#[test]
fn pid_restricts_to_its_gpus_and_pools() {
    let demo = synthetic::demo(20);
    let all = diagnose(&demo, None, &Thresholds::default());
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!(all[0].subject, "pid 4300 on GPU 1");
    assert!(diagnose(&demo, Some(4200), &Thresholds::default()).is_empty());
    // One GPU of a job alone cannot be imbalanced.
    assert!(diagnose(
        &synthetic::imbalanced(20),
        Some(4300),
        &Thresholds::default()
    )
    .is_empty());
}

#[test]
fn too_few_samples_say_nothing() {
    assert!(diagnose(&synthetic::small_batch(4), None, &Thresholds::default()).is_empty());
}

#[test]
fn a_pid_seen_in_fewer_samples_than_the_minimum_has_no_finding() {
    // Pid 7 joins the small-batch GPU in 4 samples of 30: too few for any rule, though
    // the GPU itself shows unused memory over all 30.
    let samples = adjust(synthetic::small_batch(30), |t, s| {
        if t < 4 {
            let mut joined = s.gpus[0].processes[0].clone();
            joined.pid = 7;
            s.gpus[0].processes.push(joined);
        }
    });
    let t = Thresholds::default();
    assert_eq!(kinds(&samples), vec![Kind::UnusedMemory]);
    assert!(diagnose(&samples, Some(7), &t).is_empty());
    assert_eq!(
        nothing_to_check(&samples, Some(7), &t).as_deref(),
        Some("each GPU and pool appears in at most 4 sample(s) of 30; the rules need at least 5")
    );
    let joined_longer = adjust(samples, |t, s| {
        if t == 4 {
            let mut joined = s.gpus[0].processes[0].clone();
            joined.pid = 7;
            s.gpus[0].processes.push(joined);
        }
    });
    assert_eq!(
        diagnose(&joined_longer, Some(7), &t)[0].kind,
        Kind::UnusedMemory
    );
}

#[test]
fn what_could_not_be_checked_says_why() {
    let t = Thresholds::default();
    assert_eq!(
        nothing_to_check(&synthetic::small_batch(4), None, &t).as_deref(),
        Some("each GPU and pool appears in at most 4 sample(s) of 4; the rules need at least 5")
    );
    assert_eq!(
        nothing_to_check(&synthetic::demo(20), Some(99999), &t).as_deref(),
        Some("pid 99999 is on no GPU and has no pool in any sample (20 read)")
    );
    assert_eq!(
        nothing_to_check(&vec![Sample::default(); 10], None, &t).as_deref(),
        Some("no sample shows a GPU or a gpumem pool (10 read)")
    );
    assert_eq!(nothing_to_check(&synthetic::demo(20), None, &t), None);
    assert_eq!(nothing_to_check(&synthetic::demo(20), Some(4200), &t), None);
}

#[test]
fn a_pool_with_nothing_allocated_says_so_rather_than_a_ratio() {
    let empty = adjust(synthetic::fragmented(20), |_, s| s.pools[0].allocated = 0);
    let text = diagnose(&empty, None, &Thresholds::default())[0].to_string();
    assert!(text.contains("reserved with nothing allocated,"), "{text}");
    assert!(!text.contains('×'), "{text}");
}

fn adjust(mut samples: Vec<Sample>, change: impl Fn(u64, &mut Sample)) -> Vec<Sample> {
    for (t, s) in samples.iter_mut().enumerate() {
        change(t as u64, s);
    }
    samples
}
