//! A process publishing its pools is found by listing the endpoint directory, and its report
//! carries the pool's real statistics, status and last OOM.

use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_device::StreamId;
use gpumem_pool::{DeviceRegistry, Limit, Pool, PoolConfig};
use gpumem_watch::publish::{publishing_requested, PublishError, Publisher};
use gpumem_watch::{PoolEndpoints, SampleSource};

const MIB: u64 = 1 << 20;

#[test]
fn published_pools_are_found_and_report_real_figures() {
    let dir = tempfile::tempdir().unwrap();
    let registry: &'static DeviceRegistry = Box::leak(Box::new(DeviceRegistry::new()));
    let device = Arc::new(SimDevice::new(SimConfig::address_only(1 << 30)).unwrap());
    let mut config = PoolConfig::default();
    config.options.hard_limit = Some(Limit::Bytes(64 * MIB));
    let pool = Arc::new(Pool::new(device, config).unwrap());
    registry.set(3, pool.clone());
    let kept = pool.allocate(40 * MIB, StreamId::DEFAULT).unwrap();
    let oom = pool.allocate(40 * MIB, StreamId::DEFAULT).unwrap_err();

    let endpoints = PoolEndpoints::new(dir.path());
    assert!(
        endpoints.pools().unwrap().is_empty(),
        "nothing before publishing"
    );
    let publisher = Publisher::start(dir.path(), registry).unwrap();
    assert!(publisher
        .path()
        .ends_with(format!("{}.sock", std::process::id())));

    let pools = PoolEndpoints::new(dir.path())
        .next_sample()
        .unwrap()
        .unwrap()
        .pools;
    assert_eq!(pools.len(), 1);
    let published = &pools[0];
    let stats = pool.stats();
    assert_eq!(published.pid, std::process::id());
    assert_eq!(published.device, 3);
    assert_eq!(published.policy, "expandable");
    assert_eq!(published.allocated, stats.allocated_bytes.all.current);
    assert_eq!(published.reserved, stats.reserved_bytes.all.current);
    assert_eq!(published.num_ooms, 1);
    assert_eq!(published.hard_limit, Some(64 * MIB));
    assert_eq!(
        published.last_oom.as_deref(),
        Some(oom.to_string().as_str())
    );
    assert_eq!(published.status, pool.status().unwrap().to_string());

    pool.free(kept.ptr).unwrap();
    drop(publisher);
    assert!(
        endpoints.pools().unwrap().is_empty(),
        "the socket goes with the publisher"
    );
}

#[test]
fn a_socket_left_by_a_dead_process_is_skipped_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    // A pid that cannot exist (above the kernel's pid_max limit of 2^22).
    let stale = dir.path().join("99999999.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(PoolEndpoints::new(dir.path()).pools().unwrap().is_empty());
    assert!(!stale.exists());
}

#[test]
fn the_switch_accepts_plain_on_and_off_and_refuses_the_rest() {
    for on in ["1", "true", "on"] {
        assert!(publishing_requested(Some(on)).unwrap());
    }
    for off in [None, Some(""), Some("0"), Some("false"), Some("off")] {
        assert!(!publishing_requested(off).unwrap());
    }
    let error = publishing_requested(Some("yes please")).unwrap_err();
    assert!(matches!(error, PublishError::BadEnv { .. }));
    assert!(
        error.to_string().contains("GPUMEM_PUBLISH=\"yes please\""),
        "{error}"
    );
}

/// An endpoint of this (live) process in `dir` that answers every question with `answer`, on a
/// thread that stops after `for_how_long`.
fn misbehaving_endpoint(
    dir: &std::path::Path,
    for_how_long: Duration,
    answer: fn(&mut UnixStream, Instant),
) -> std::path::PathBuf {
    let path = dir.join(format!("{}.sock", std::process::id()));
    let listener = UnixListener::bind(&path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let until = Instant::now() + for_how_long;
    std::thread::spawn(move || {
        while Instant::now() < until {
            match listener.accept() {
                Ok((mut stream, _)) => {
                    stream.set_nonblocking(false).unwrap();
                    std::thread::spawn(move || answer(&mut stream, until));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    });
    path
}

/// Asks the endpoints in `dir` twice and returns how long the first look took and the
/// warnings of both.
fn look_twice(dir: &std::path::Path) -> (Duration, Vec<String>) {
    let mut endpoints = PoolEndpoints::new(dir);
    let start = Instant::now();
    assert!(endpoints.next_sample().unwrap().unwrap().pools.is_empty());
    let took = start.elapsed();
    let mut warnings = endpoints.take_warnings();
    assert!(endpoints.next_sample().unwrap().unwrap().pools.is_empty());
    warnings.extend(endpoints.take_warnings());
    (took, warnings.iter().map(ToString::to_string).collect())
}

#[test]
fn an_endpoint_that_trickles_is_given_half_a_second_for_its_whole_answer() {
    let dir = tempfile::tempdir().unwrap();
    let path = misbehaving_endpoint(dir.path(), Duration::from_secs(10), |stream, until| {
        while Instant::now() < until && stream.write_all(b" ").is_ok() {
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let (took, warnings) = look_twice(dir.path());
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert_eq!(warnings.len(), 1, "once while it stays stuck: {warnings:?}");
    assert!(
        warnings[0].contains(&format!(
            "{}: no complete answer within 500 ms",
            path.display()
        )),
        "{warnings:?}"
    );
}

#[test]
fn an_endpoint_that_floods_is_cut_off_at_the_answer_limit() {
    let dir = tempfile::tempdir().unwrap();
    // 64 MiB without a newline, then the end: a reader without a limit takes it all.
    let path = misbehaving_endpoint(dir.path(), Duration::from_secs(10), |stream, _| {
        let chunk = vec![b' '; 1 << 20];
        for _ in 0..64 {
            if stream.write_all(&chunk).is_err() {
                return;
            }
        }
    });
    let (_, warnings) = look_twice(dir.path());
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains(&format!(
            "{}: not a gpumem pool report (the answer is longer than 4 MiB)",
            path.display()
        )),
        "{warnings:?}"
    );
}

#[test]
fn an_endpoint_that_answers_what_is_not_a_report_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = misbehaving_endpoint(dir.path(), Duration::from_secs(10), |stream, _| {
        let _ = stream.write_all(b"{\"not\": \"a report\"}\n");
    });
    let (_, warnings) = look_twice(dir.path());
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains(&format!(
            "skipped a pool endpoint: {}: not a gpumem pool report",
            path.display()
        )),
        "{warnings:?}"
    );
}
