//! Property tests: every reader, given random bytes or a mutated valid file, returns `Ok` or
//! `Err` and never panics, and what it returns is a valid trace; every writer round-trips
//! random valid traces.

use gpumem_trace::formats::{native, pytorch, rmm};
use gpumem_trace::{read, Event, Format, ReadOptions, Trace, TraceMeta};
use proptest::prelude::*;

/// The fixtures plus a gzip-compressed native trace and a snapshot written by us.
fn seed_files() -> Vec<Vec<u8>> {
    let data = |name: &str| {
        std::fs::read(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/data")
                .join(name),
        )
        .unwrap()
    };
    let native_text = data("small.jsonl");
    let trace = native::read_native(native_text.as_slice()).unwrap();
    let mut gzip = Vec::new();
    {
        let mut encoder = flate2::write::GzEncoder::new(&mut gzip, flate2::Compression::fast());
        native::write_native(&trace, &mut encoder).unwrap();
        encoder.finish().unwrap();
    }
    let mut ours = Vec::new();
    gpumem_trace::snapshot::from_trace(&trace, 0)
        .write_pickle(&mut ours)
        .unwrap();
    let mut ours_json = Vec::new();
    gpumem_trace::snapshot::from_trace(&trace, 0)
        .write_json(&mut ours_json)
        .unwrap();
    vec![
        native_text,
        data("small_rmm.csv"),
        data("snapshot_p0.pickle"),
        data("snapshot_p2.pickle"),
        data("snapshot_p4.pickle"),
        gzip,
        ours,
        ours_json,
    ]
}

/// Feeds `bytes` to every reader; a trace that comes back must be valid.
fn read_everything(bytes: &[u8]) {
    let results = [
        native::read_native(bytes),
        rmm::read_rmm(bytes),
        pytorch::read_pytorch(bytes, None),
        read(bytes, ReadOptions::default()),
        read(
            bytes,
            ReadOptions {
                format: Format::Pytorch,
                device: Some(1),
            },
        ),
    ];
    for trace in results.into_iter().flatten() {
        assert_eq!(trace.validate(), Ok(()));
    }
    let _ = gpumem_trace::snapshot::read(bytes);
}

/// One edit of a file: where (as a fraction of its length), what, and a byte.
#[derive(Clone, Debug)]
enum Mutation {
    Flip { at: f64, byte: u8 },
    Insert { at: f64, byte: u8 },
    Delete { at: f64, len: usize },
    Truncate { at: f64 },
    Duplicate { at: f64, len: usize },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let at = 0.0..1.0f64;
    prop_oneof![
        (at.clone(), any::<u8>()).prop_map(|(at, byte)| Mutation::Flip { at, byte }),
        (at.clone(), any::<u8>()).prop_map(|(at, byte)| Mutation::Insert { at, byte }),
        (at.clone(), 1..16usize).prop_map(|(at, len)| Mutation::Delete { at, len }),
        at.clone().prop_map(|at| Mutation::Truncate { at }),
        (at, 1..64usize).prop_map(|(at, len)| Mutation::Duplicate { at, len }),
    ]
}

fn apply(bytes: &mut Vec<u8>, mutation: &Mutation) {
    let position = |at: f64, len: usize| ((at * len as f64) as usize).min(len);
    match *mutation {
        Mutation::Flip { at, byte } => {
            if !bytes.is_empty() {
                let index = position(at, bytes.len() - 1);
                bytes[index] ^= byte;
            }
        }
        Mutation::Insert { at, byte } => {
            let index = position(at, bytes.len());
            bytes.insert(index, byte);
        }
        Mutation::Delete { at, len } => {
            let start = position(at, bytes.len());
            let end = (start + len).min(bytes.len());
            bytes.drain(start..end);
        }
        Mutation::Truncate { at } => {
            let len = position(at, bytes.len());
            bytes.truncate(len);
        }
        Mutation::Duplicate { at, len } => {
            let start = position(at, bytes.len());
            let end = (start + len).min(bytes.len());
            let chunk = bytes[start..end].to_vec();
            bytes.splice(end..end, chunk);
        }
    }
}

/// A valid trace: allocs at distinct non-zero addresses, frees of live blocks, steps.
fn valid_trace() -> impl Strategy<Value = Trace> {
    proptest::collection::vec((0u8..4, any::<u64>(), 0u64..3), 0..200).prop_map(|operations| {
        let mut live: Vec<u64> = Vec::new();
        let mut next_address = 0x7f00_0000_0000u64;
        let mut steps = 0;
        let events = operations
            .into_iter()
            .map(|(kind, number, stream)| match kind {
                0 | 1 => {
                    let addr = next_address;
                    next_address += 1 << 20;
                    live.push(addr);
                    Event::Alloc {
                        addr,
                        size: (number >> 20) >> (number % 44),
                        stream,
                    }
                }
                2 if !live.is_empty() => {
                    let addr = live.swap_remove((number % live.len() as u64) as usize);
                    Event::Free { addr, stream }
                }
                _ => {
                    steps += 1;
                    Event::Step { index: steps }
                }
            })
            .collect();
        Trace::new(
            TraceMeta {
                name: "generated".to_owned(),
                source: "proptest".to_owned(),
                device_total: Some(80 << 30),
                extra: [("seed".to_owned(), "\"quoted\"\n".to_owned())].into(),
            },
            events,
        )
    })
}

fn without_steps(events: &[Event]) -> Vec<Event> {
    events
        .iter()
        .copied()
        .filter(|event| !matches!(event, Event::Step { .. }))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1024)) {
        read_everything(&bytes);
    }

    #[test]
    fn random_bytes_after_a_valid_prefix_never_panic(
        seed in 0..8usize,
        keep in 0.0..1.0f64,
        tail in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        let mut bytes = seed_files().swap_remove(seed);
        bytes.truncate((keep * bytes.len() as f64) as usize);
        bytes.extend(tail);
        read_everything(&bytes);
    }

    #[test]
    fn mutated_files_never_panic(
        seed in 0..8usize,
        mutations in proptest::collection::vec(mutation(), 1..6),
    ) {
        let mut bytes = seed_files().swap_remove(seed);
        for mutation in &mutations {
            apply(&mut bytes, mutation);
        }
        read_everything(&bytes);
    }

    #[test]
    fn native_round_trips(trace in valid_trace()) {
        let mut bytes = Vec::new();
        native::write_native(&trace, &mut bytes).unwrap();
        prop_assert_eq!(native::read_native(bytes.as_slice()).unwrap(), trace);
    }

    #[test]
    fn rmm_round_trips_blocks(trace in valid_trace()) {
        let mut bytes = Vec::new();
        rmm::write_rmm(&trace, &mut bytes).unwrap();
        let back = rmm::read_rmm(bytes.as_slice()).unwrap();
        prop_assert_eq!(back.events, without_steps(&trace.events));
    }

    #[test]
    fn snapshot_round_trips_blocks(trace in valid_trace()) {
        let snapshot = gpumem_trace::snapshot::from_trace(&trace, 0);
        let mut pickle = Vec::new();
        snapshot.write_pickle(&mut pickle).unwrap();
        let mut json = Vec::new();
        snapshot.write_json(&mut json).unwrap();
        for bytes in [pickle, json] {
            let back = pytorch::read_pytorch(bytes.as_slice(), None).unwrap();
            prop_assert_eq!(&back.events, &without_steps(&trace.events));
        }
    }

    #[test]
    fn summary_agrees_with_a_direct_count(trace in valid_trace()) {
        let summary = trace.summary();
        let mut live = std::collections::HashMap::new();
        let mut peak = 0u64;
        for event in &trace.events {
            match *event {
                Event::Alloc { addr, size, .. } => { live.insert(addr, size); }
                Event::Free { addr, .. } => { live.remove(&addr); }
                Event::Step { .. } => {}
            }
            peak = peak.max(live.values().sum());
        }
        prop_assert_eq!(summary.peak_live_bytes, peak);
        prop_assert_eq!(summary.live_bytes_at_end, live.values().sum::<u64>());
        prop_assert_eq!(summary.live_blocks_at_end, live.len() as u64);
    }
}
