//! The exporter, scraped on 127.0.0.1 by curl and read by a Prometheus text-format parser,
//! shows each recorded sample's figures under dcgm-exporter's names, units and labels.
//! Without curl the tests fail with what to install, or skip when the user opted out of
//! missing test dependencies (`gpumem_testkit::deps`).

use std::process::{Command, Output};

use gpumem_testkit::deps;
use gpumem_watch::exporter::{render, Exporter};
use gpumem_watch::{synthetic, Recording, Sample};
use prometheus_parse::{Scrape, Value};

/// curl run with `args`; `None` after a `SKIPPED:` line when curl is missing and the user
/// opted out (without the opt-out a missing curl fails the test).
fn curl(args: &[&str]) -> Option<Output> {
    deps::require(deps::CURL, Command::new("curl").args(args).output())
}

/// The response's head and body; `None` as for [`curl`].
fn scrape(url: &str) -> Option<(String, String)> {
    let out = curl(&["-sS", "--fail", "-D", "-", url])?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    Some((head.to_string(), body.to_string()))
}

fn parse(body: &str) -> Scrape {
    Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).unwrap()
}

fn value(scrape: &Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<_> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .collect();
    assert_eq!(found.len(), 1, "{metric} {labels:?}");
    match found[0].value {
        Value::Gauge(v) | Value::Counter(v) | Value::Untyped(v) => v,
        ref other => panic!("{metric}: {other:?}"),
    }
}

fn check(scrape: &Scrape, sample: &Sample) {
    for gpu in &sample.gpus {
        let index = gpu.index.to_string();
        let labels = [("gpu", index.as_str()), ("UUID", gpu.uuid.as_str())];
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        assert_eq!(
            value(scrape, "DCGM_FI_DEV_FB_USED", &labels),
            mib(gpu.memory_used)
        );
        assert_eq!(
            value(scrape, "DCGM_FI_DEV_FB_FREE", &labels),
            mib(gpu.memory_free())
        );
        assert_eq!(value(scrape, "DCGM_FI_DEV_GPU_UTIL", &labels), gpu.gpu_util);
        assert_eq!(
            value(scrape, "DCGM_FI_DEV_MEM_COPY_UTIL", &labels),
            gpu.memory_util
        );
        assert_eq!(
            value(scrape, "DCGM_FI_DEV_POWER_USAGE", &labels),
            gpu.power_watts
        );
        assert_eq!(
            value(scrape, "DCGM_FI_PROF_PCIE_RX_BYTES", &labels),
            gpu.pcie_rx_bytes_per_s as f64
        );
        let all = scrape
            .samples
            .iter()
            .find(|s| s.metric == "DCGM_FI_DEV_GPU_UTIL" && s.labels.get("gpu") == Some(&index))
            .unwrap();
        assert_eq!(
            all.labels.get("device"),
            Some(format!("nvidia{index}").as_str())
        );
        assert_eq!(all.labels.get("modelName"), Some(gpu.name.as_str()));
        assert_eq!(all.labels.get("Hostname"), Some(sample.host.as_str()));
    }
    for pool in &sample.pools {
        let (pid, gpu) = (pool.pid.to_string(), pool.device.to_string());
        let labels = [
            ("pid", pid.as_str()),
            ("gpu", gpu.as_str()),
            ("policy", pool.policy.as_str()),
        ];
        assert_eq!(
            value(scrape, "gpumem_pool_allocated_bytes", &labels),
            pool.allocated as f64
        );
        assert_eq!(
            value(scrape, "gpumem_pool_reserved_bytes", &labels),
            pool.reserved as f64
        );
        assert_eq!(
            value(scrape, "gpumem_pool_cached_bytes", &labels),
            pool.cached() as f64
        );
        assert_eq!(
            value(scrape, "gpumem_pool_ooms_total", &labels),
            pool.num_ooms as f64
        );
        assert_eq!(
            value(scrape, "gpumem_pool_fragmentation_ratio", &labels),
            pool.fragmentation()
        );
    }
}

#[test]
fn scraped_metrics_are_the_recorded_samples_one_per_scrape() {
    let samples = synthetic::demo(12);
    let exporter = Exporter::bind(
        "127.0.0.1:0",
        Box::new(Recording::from_samples(vec![
            samples[0].clone(),
            samples[11].clone(),
        ])),
    )
    .unwrap();
    let url = format!("http://{}/metrics", exporter.local_addr().unwrap());
    std::thread::spawn(move || exporter.serve(|w| panic!("{w}")));

    let Some((head, body)) = scrape(&url) else {
        return;
    };
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    let first = parse(&body);
    check(&first, &samples[0]);
    assert_eq!(
        first.docs.get("DCGM_FI_DEV_FB_USED").map(String::as_str),
        Some("Framebuffer memory used (in MiB).")
    );
    // The second scrape shows the second sample (an OOM happened), and the last stays.
    for _ in 0..2 {
        let later = parse(&scrape(&url).expect("curl ran a moment ago").1);
        check(&later, &samples[11]);
        assert_eq!(
            value(&later, "gpumem_pool_ooms_total", &[("pid", "4300")]),
            1.0
        );
    }
}

#[test]
fn label_values_are_escaped() {
    let mut sample = synthetic::healthy_at(1, 1, 0);
    sample.gpus[0].name = "a \"quoted\\name\"\nwith newline".into();
    let text = render(&sample);
    assert!(
        text.contains(r#"modelName="a \"quoted\\name\"\nwith newline""#),
        "{text}"
    );
    let parsed = parse(&text);
    assert!(parsed
        .samples
        .iter()
        .any(|s| s.metric == "DCGM_FI_DEV_GPU_UTIL"));
}

#[test]
fn other_paths_are_not_found_and_other_methods_not_allowed() {
    let exporter =
        Exporter::bind("127.0.0.1:0", Box::new(Recording::from_samples(vec![]))).unwrap();
    let base = format!("http://{}", exporter.local_addr().unwrap());
    std::thread::spawn(move || exporter.serve(|w| panic!("{w}")));
    let nope = format!("{base}/nope");
    let Some(out) = curl(&["-s", "-o", "/dev/null", "-w", "%{http_code}", &nope]) else {
        return;
    };
    assert_eq!(String::from_utf8_lossy(&out.stdout), "404");
    // A query string (Prometheus' `params`) still scrapes; only GET and HEAD are served.
    let code = |args: &[&str]| {
        let out = curl(&[&["-s", "-o", "/dev/null", "-w", "%{http_code}"], args].concat())
            .expect("curl ran a moment ago");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(code(&[&format!("{base}/metrics?x=1")]), "200");
    assert_eq!(code(&["-X", "POST", &format!("{base}/metrics")]), "405");
    assert_eq!(code(&["-I", &format!("{base}/metrics")]), "200");
}

#[test]
fn every_metric_of_the_grafana_dashboard_is_exported() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/grafana-dashboard.json"
    );
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let exposition = render(&synthetic::demo(60)[59]);
    let mut checked = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if word.starts_with("DCGM_FI_") || word.starts_with("gpumem_") {
                    assert!(
                        exposition.contains(&format!("# TYPE {word} ")),
                        "{word} in {expr}"
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 10, "{checked}");
}
