//! docs/architecture.md's crate graph is the workspace's: its crate list names every member
//! with exactly its normal and optional dependencies on other members, and its diagram shows
//! the `gpumem` command's crates with exactly the dependencies among them — both as
//! `cargo metadata --no-deps` reports them for the working tree. A difference fails the test
//! and is named.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

/// A crate's dependencies on other workspace members.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Deps {
    normal: BTreeSet<String>,
    optional: BTreeSet<String>,
}

type Graph = BTreeMap<String, Deps>;

const PREFIX: &str = "gpumem-";

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The workspace's graph of normal (`kind` null) dependencies between members, from
/// `cargo metadata --format-version 1 --no-deps`.
fn cargo_graph() -> Graph {
    let output = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(workspace_root())
        .output()
        .expect("run cargo metadata");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON");
    graph_from_metadata(&metadata)
}

fn graph_from_metadata(metadata: &serde_json::Value) -> Graph {
    let packages = metadata["packages"].as_array().expect("packages");
    let members: BTreeSet<String> = packages
        .iter()
        .map(|package| package["name"].as_str().expect("name").to_string())
        .collect();
    let mut graph = Graph::new();
    for package in packages {
        let mut deps = Deps::default();
        for dependency in package["dependencies"].as_array().expect("dependencies") {
            let name = dependency["name"].as_str().expect("dependency name");
            if !members.contains(name) || !dependency["kind"].is_null() {
                continue;
            }
            if dependency["optional"].as_bool() == Some(true) {
                deps.optional.insert(name.to_string());
            } else {
                deps.normal.insert(name.to_string());
            }
        }
        graph.insert(package["name"].as_str().unwrap().to_string(), deps);
    }
    graph
}

/// The fenced block of `language` inside the section `## The crate graph`.
fn block(doc: &str, language: &str) -> Result<String, String> {
    let doc = format!("\n{doc}");
    let section = doc
        .split("\n## ")
        .find(|part| part.starts_with("The crate graph"))
        .ok_or("docs/architecture.md has no section \"## The crate graph\"")?;
    let fence = format!("```{language}\n");
    let start = section.find(&fence).ok_or(format!(
        "the crate graph section has no ```{language} block"
    ))? + fence.len();
    let end = section[start..]
        .find("```")
        .ok_or(format!("the ```{language} block is not closed"))?;
    Ok(section[start..start + end].to_string())
}

fn full_name(short: &str) -> String {
    format!("{PREFIX}{short}")
}

/// The crate list: lines `  gpumem-x — what it is (uses a, b; optional: c)` or
/// `(uses no gpumem crate)`; short names drop the `gpumem-` prefix.
fn parse_list(doc: &str) -> Result<Graph, String> {
    let mut graph = Graph::new();
    let list = block(doc, "text")?;
    for line in list.lines() {
        let line = line.trim();
        if !line.starts_with(PREFIX) {
            continue;
        }
        let name = line.split_whitespace().next().unwrap().to_string();
        let uses = line
            .rfind("(uses ")
            .filter(|_| line.ends_with(')'))
            .map(|at| &line[at + "(uses ".len()..line.len() - 1])
            .ok_or(format!(
                "crate list: the line of {name} does not end in \"(uses …)\": {line}"
            ))?;
        let mut deps = Deps::default();
        if uses != "no gpumem crate" {
            let (normal, optional) = match uses.split_once("; optional: ") {
                Some((normal, optional)) => (normal, Some(optional)),
                None => (uses, None),
            };
            let names = |list: &str| -> BTreeSet<String> {
                list.split(", ")
                    .map(|short| full_name(short.trim()))
                    .collect()
            };
            if let Some(stripped) = normal.strip_prefix("optional: ") {
                deps.optional = names(stripped);
            } else {
                deps.normal = names(normal);
                deps.optional = optional.map(names).unwrap_or_default();
            }
        }
        if graph.insert(name.clone(), deps).is_some() {
            return Err(format!("crate list: {name} is listed twice"));
        }
    }
    Ok(graph)
}

/// The diagram: node lines `id[gpumem-x …]` or `id["gpumem-x …"]`, edges `a --> b` (normal)
/// and `a -.-> b` (optional).
fn parse_diagram(doc: &str) -> Result<Graph, String> {
    let mut ids = BTreeMap::new();
    let mut edges = Vec::new();
    let diagram = block(doc, "mermaid")?;
    for line in diagram.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with("flowchart") || line.starts_with("%%") {
            continue;
        }
        let edge =
            [(" --> ", false), (" -.-> ", true)]
                .into_iter()
                .find_map(|(arrow, optional)| {
                    line.split_once(arrow)
                        .map(|(from, to)| (from.trim(), to.trim(), optional))
                });
        if let Some(edge) = edge {
            edges.push(edge);
        } else if let Some((id, label)) = line.split_once('[') {
            let name = label
                .trim_start_matches('"')
                .split(|c: char| c.is_whitespace() || c == ']' || c == '"')
                .next()
                .unwrap_or("");
            if !name.starts_with(PREFIX) {
                return Err(format!("diagram: node {id}'s label names no crate: {line}"));
            }
            ids.insert(id.trim().to_string(), name.to_string());
        } else {
            return Err(format!(
                "diagram: a line that is neither node nor edge: {line}"
            ));
        }
    }
    let mut graph: Graph = ids
        .values()
        .map(|name| (name.clone(), Deps::default()))
        .collect();
    for (from, to, optional) in edges {
        let lookup = |id: &str| {
            ids.get(id).cloned().ok_or(format!(
                "diagram: edge {from} → {to} uses undeclared node {id}"
            ))
        };
        let (from, to) = (lookup(from)?, lookup(to)?);
        let deps = graph.get_mut(&from).unwrap();
        if optional {
            deps.optional.insert(to);
        } else {
            deps.normal.insert(to);
        }
    }
    Ok(graph)
}

/// Every crate `root` reaches through normal and optional dependencies, itself included.
fn closure(graph: &Graph, root: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![root.to_string()];
    while let Some(name) = todo.pop() {
        if seen.insert(name.clone()) {
            if let Some(deps) = graph.get(&name) {
                todo.extend(deps.normal.iter().chain(&deps.optional).cloned());
            }
        }
    }
    seen
}

fn compare_deps(what: &str, name: &str, doc: &Deps, real: &Deps, out: &mut Vec<String>) {
    for (kind, doc, real) in [
        ("normal", &doc.normal, &real.normal),
        ("optional", &doc.optional, &real.optional),
    ] {
        for missing in real.difference(doc) {
            out.push(format!(
                "{what}: {name} uses {missing} ({kind}) but the doc does not say so"
            ));
        }
        for extra in doc.difference(real) {
            out.push(format!(
                "{what}: the doc says {name} uses {extra} ({kind}), cargo metadata does not"
            ));
        }
    }
}

/// Every way the doc's list and diagram differ from the real graph.
fn differences(doc: &str, real: &Graph) -> Vec<String> {
    let mut out = Vec::new();
    match parse_list(doc) {
        Err(error) => out.push(error),
        Ok(list) => {
            for name in real.keys().filter(|name| !list.contains_key(*name)) {
                out.push(format!("crate list: workspace member {name} is not listed"));
            }
            for (name, deps) in &list {
                match real.get(name) {
                    None => out.push(format!("crate list: {name} is not a workspace member")),
                    Some(real) => compare_deps("crate list", name, deps, real, &mut out),
                }
            }
        }
    }
    match parse_diagram(doc) {
        Err(error) => out.push(error),
        Ok(diagram) => {
            let shown: BTreeSet<String> = diagram.keys().cloned().collect();
            let wanted = closure(real, "gpumem-cli");
            for name in wanted.difference(&shown) {
                out.push(format!(
                    "diagram: {name} is a dependency of gpumem-cli but not shown"
                ));
            }
            for name in shown.difference(&wanted) {
                out.push(format!(
                    "diagram: {name} is shown but gpumem-cli does not depend on it"
                ));
            }
            for (name, deps) in &diagram {
                let Some(real) = real.get(name) else { continue };
                let among = |set: &BTreeSet<String>| -> BTreeSet<String> {
                    set.intersection(&shown).cloned().collect()
                };
                let real = Deps {
                    normal: among(&real.normal),
                    optional: among(&real.optional),
                };
                compare_deps("diagram", name, deps, &real, &mut out);
            }
        }
    }
    out
}

fn architecture_doc() -> String {
    std::fs::read_to_string(workspace_root().join("docs/architecture.md"))
        .expect("read docs/architecture.md")
}

#[test]
fn the_crate_list_and_diagram_are_the_workspace_graph() {
    let real = cargo_graph();
    assert!(
        real.contains_key("gpumem-cli") && real.len() > 10,
        "{real:?}"
    );
    let differences = differences(&architecture_doc(), &real);
    assert!(
        differences.is_empty(),
        "docs/architecture.md's crate graph differs from cargo metadata:\n  {}",
        differences.join("\n  ")
    );
}

#[test]
fn a_wrong_doc_is_named() {
    let real = cargo_graph();
    let doc = architecture_doc();

    let without_edge = doc.replace("  replay --> plan\n", "");
    assert_eq!(
        differences(&without_edge, &real),
        ["diagram: gpumem-replay uses gpumem-plan (normal) but the doc does not say so"]
    );

    let optional_as_normal = doc.replace("  cli -.-> watch\n", "  cli --> watch\n");
    assert_eq!(
        differences(&optional_as_normal, &real),
        [
            "diagram: the doc says gpumem-cli uses gpumem-watch (normal), cargo metadata does not",
            "diagram: gpumem-cli uses gpumem-watch (optional) but the doc does not say so",
        ]
    );

    let list_line = doc
        .lines()
        .find(|line| line.trim_start().starts_with("gpumem-trace "))
        .expect("gpumem-trace's line");
    let wrong_list = doc.replace(
        list_line,
        &list_line.replace("(uses snapshot)", "(uses pool, snapshot)"),
    );
    assert_eq!(
        differences(&wrong_list, &real),
        ["crate list: the doc says gpumem-trace uses gpumem-pool (normal), cargo metadata does not"]
    );

    let missing_member = doc.replace(list_line, "");
    assert_eq!(
        differences(&missing_member, &real),
        ["crate list: workspace member gpumem-trace is not listed"]
    );
}

#[test]
fn optional_dependencies_parse_as_optional() {
    let doc = "## The crate graph\n\n```mermaid\nflowchart TD\n  a[gpumem-a]\n  b[\"gpumem-b (x)\"]\n  a -.-> b\n```\n\n```text\n  gpumem-a — x (uses b; optional: c, d)\n  gpumem-b — y (optional: a)\n  gpumem-c — z (uses no gpumem crate)\n```\n";
    assert_eq!(
        parse_list(doc),
        Err("crate list: the line of gpumem-b does not end in \"(uses …)\": gpumem-b — y (optional: a)".to_string())
    );
    let doc = doc.replace("(optional: a)", "(uses optional: a)");
    let list = parse_list(&doc).unwrap();
    assert_eq!(
        list["gpumem-a"],
        Deps {
            normal: ["gpumem-b".to_string()].into(),
            optional: ["gpumem-c".to_string(), "gpumem-d".to_string()].into(),
        }
    );
    assert_eq!(list["gpumem-b"].optional, ["gpumem-a".to_string()].into());
    assert_eq!(list["gpumem-c"], Deps::default());
    let diagram = parse_diagram(&doc).unwrap();
    assert_eq!(
        diagram["gpumem-a"].optional,
        ["gpumem-b".to_string()].into()
    );
    assert!(diagram["gpumem-a"].normal.is_empty());
}
