// TEMPORARY debugging aid (not committed).
#[test]
fn vis_dbg_units() {
    let Ok(id) = std::env::var("VIS_CASE") else {
        return;
    };
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let text = std::fs::read_to_string(root.join("testdata/plan/measured_multimodal.jsonl"))
        .unwrap()
        + &std::fs::read_to_string(root.join("testdata/plan/measured_architectures.jsonl"))
            .unwrap();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        if v["id"] != id.as_str() {
            continue;
        }
        let model = crate::load_config(&root.join(v["config"].as_str().unwrap())).unwrap();
        let mut s: crate::Settings = serde_json::from_value(v["settings"].clone()).unwrap();
        s.target = Some("cpu".into());
        let w = s.to_workload().unwrap();
        for u in crate::graph::build_units(&model, &w, w.batch) {
            println!("{:<12} saved {:>11.0} fwdT {:>11.0} bwdT {:>11.0} gradT {:>11.0} inf {:>11.0} held {:>10.0} bheld {:>9.0} kv {:>10.0} params {}",
              u.name, u.saved, u.forward_transient, u.backward_transient, u.gradient_transient, u.inference_live, u.held, u.body_held, u.kv_cache, u.params);
        }
        let e = crate::estimate(
            &model,
            &w,
            &crate::Overheads {
                context_bytes: 0,
                allocator_fraction: 0.0,
            },
        )
        .unwrap();
        println!("{:?}", e.breakdown);
        for p in &e.phases {
            println!("{:?}", p);
        }
    }
}
