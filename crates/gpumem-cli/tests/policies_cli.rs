//! `gpumem policies`, run as a user runs it: every built-in policy listed once, in text and
//! JSON, with the default marked — the recipe "add a CLI command" of docs/architecture.md.

mod common;

use common::gpumem;

use gpumem_pool::PolicyKind;

#[test]
fn lists_every_policy_with_the_default() {
    let out = gpumem(&["policies"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for kind in PolicyKind::ALL {
        let line = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(kind.as_str()))
            .unwrap_or_else(|| panic!("{kind} missing:\n{text}"));
        assert!(line.contains(kind.description()), "{line}");
    }
    assert!(text.contains("default for pools: expandable"), "{text}");

    let out = gpumem(&["policies", "--json"]);
    assert!(out.status.success());
    let list: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = list.iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, PolicyKind::ALL.map(|k| k.as_str()));
    let defaults: Vec<&str> = list
        .iter()
        .filter(|p| p["default"] == true)
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(defaults, ["expandable"]);

    let out = gpumem(&["policies", "--bogus"]);
    assert_eq!(out.status.code(), Some(2));
}
