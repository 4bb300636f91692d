//! `PYTORCH_ALLOC_CONF` strings are accepted or refused as PyTorch's own parser does: the
//! verdicts of PyTorch 2.15's parser (`tests/data/make_torch_conf_verdicts.py`, each string in
//! a fresh process) against `TorchSettings::parse`.

use gpumem_pool::policies::torch_settings::TorchSettings;

#[test]
fn accepts_and_refuses_what_pytorch_does() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/torch_conf_verdicts.json"
    );
    let data: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut disagreements = Vec::new();
    let verdicts = data["verdicts"].as_array().unwrap();
    for verdict in verdicts {
        let conf = verdict["conf"].as_str().unwrap();
        let pytorch = verdict["accepted"].as_bool().unwrap();
        let ours = TorchSettings::parse(conf);
        if ours.is_ok() != pytorch {
            disagreements.push(format!(
                "{conf:?}: PyTorch {} ({}), gpumem {:?}",
                if pytorch { "accepts" } else { "refuses" },
                verdict["message"].as_str().unwrap(),
                ours.map(|_| ()).map_err(|e| e.to_string())
            ));
        }
    }
    assert!(verdicts.len() >= 35);
    assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));
}
