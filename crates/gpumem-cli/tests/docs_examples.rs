//! Every worked `gpumem` example in README.md and docs/*.md prints what the doc says it prints.
//!
//! An example is a ```` ```text ```` block whose first line is `$ gpumem …`. Each `$ ` line is
//! a command (a line ending in ` \` continues on the next), run with the built binary in a
//! scratch directory that sees the repository's `testdata/`; the lines after it, up to the
//! next command, are its standard output. In the expected lines, a line `...` stands for any
//! number of lines, blank lines at the end of the output are left out, and the time in
//! `replayed in 0.19 s` is not compared (it is the machine's).
//! (The README's Rust example is kept true by `crates/gpumem-array/tests/example.rs`: the
//! README holds `examples/batches.rs` verbatim, and that test runs it.)

use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One command of a doc and what the doc says it prints.
#[derive(Debug, PartialEq)]
struct Example {
    /// `path:line` of the command.
    place: String,
    args: Vec<String>,
    expected: Vec<String>,
}

/// Splits a command line into words; single and double quotes group words.
fn words(command: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quote = None;
    let mut in_word = false;
    for c in command.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        out.push(word);
    }
    out
}

/// The examples of one Markdown file (`name` is how failures name it).
fn examples(name: &str, text: &str) -> Vec<Example> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut at = 0;
    while at < lines.len() {
        let starts_example = lines[at] == "```text"
            && lines
                .get(at + 1)
                .is_some_and(|l| l.starts_with("$ gpumem "));
        if !starts_example {
            at += 1;
            continue;
        }
        at += 1;
        while at < lines.len() && lines[at] != "```" {
            let place = format!("{name}:{}", at + 1);
            let mut command = lines[at].trim_start_matches("$ ").to_string();
            while command.ends_with('\\') && at + 1 < lines.len() {
                command.pop();
                at += 1;
                command.push(' ');
                command.push_str(lines[at].trim());
            }
            at += 1;
            let mut expected = Vec::new();
            while at < lines.len() && lines[at] != "```" && !lines[at].starts_with("$ ") {
                expected.push(lines[at].trim_end().to_string());
                at += 1;
            }
            while expected.last().is_some_and(|line| line.is_empty()) {
                expected.pop();
            }
            let mut args = words(&command);
            assert_eq!(args.remove(0), "gpumem", "{place}: not a gpumem command");
            out.push(Example {
                place,
                args,
                expected,
            });
        }
        at += 1;
    }
    out
}

/// A line with what differs between runs masked: the seconds of `replayed in N s`.
fn normalise(line: &str) -> String {
    const BEFORE: &str = " replayed in ";
    match line.find(BEFORE) {
        Some(at) => {
            let rest = &line[at + BEFORE.len()..];
            let number = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .unwrap_or(rest.len());
            format!("{}{BEFORE}…{}", &line[..at], &rest[number..])
        }
        None => line.trim_end().to_string(),
    }
}

/// Whether `actual` matches `expected`, where an expected `...` matches any number of lines.
fn matches(expected: &[String], actual: &[String]) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((first, rest)) if first == "..." => {
            (0..=actual.len()).any(|skip| matches(rest, &actual[skip..]))
        }
        Some((first, rest)) => actual
            .split_first()
            .is_some_and(|(line, more)| normalise(first) == normalise(line) && matches(rest, more)),
    }
}

/// A scratch directory holding a link to the repository's `testdata/`, so that the examples'
/// relative paths resolve and the files they write land in it.
fn scratch_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpumem-docs-examples-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    std::os::unix::fs::symlink(workspace_root().join("testdata"), dir.join("testdata"))
        .expect("link testdata");
    dir
}

fn run(example: &Example, dir: &Path) -> Result<(), String> {
    let binary = std::env::var_os("GPUMEM_BIN").unwrap_or(env!("CARGO_BIN_EXE_gpumem").into());
    let output = Command::new(binary)
        .args(&example.args)
        .current_dir(dir)
        .output()
        .expect("the gpumem binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut actual: Vec<String> = stdout.lines().map(|l| l.trim_end().to_string()).collect();
    while actual.last().is_some_and(|line| line.is_empty()) {
        actual.pop();
    }
    if output.status.success() && matches(&example.expected, &actual) {
        return Ok(());
    }
    Err(format!(
        "{}: `gpumem {}` ({}) prints\n{}\n--- but the doc says\n{}\n--- stderr:\n{}",
        example.place,
        example.args.join(" "),
        output.status,
        actual.join("\n"),
        example.expected.join("\n"),
        String::from_utf8_lossy(&output.stderr)
    ))
}

/// README.md and every Markdown file under docs/, by their repository paths.
fn documents() -> Vec<(String, String)> {
    let root = workspace_root();
    let mut names = vec!["README.md".to_string()];
    let mut docs: Vec<String> = std::fs::read_dir(root.join("docs"))
        .expect("read docs/")
        .map(|entry| {
            entry
                .expect("docs/ entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    docs.sort();
    names.extend(docs);
    names
        .into_iter()
        .map(|name| {
            let text = std::fs::read_to_string(root.join(&name)).expect("read a doc");
            (name, text)
        })
        .collect()
}

#[test]
fn every_worked_example_prints_what_the_doc_shows() {
    let documents = documents();
    let all: Vec<Example> = documents
        .iter()
        .flat_map(|(name, text)| examples(name, text))
        .collect();
    for must in ["README.md", "docs/plan.md"] {
        assert!(
            all.iter().any(|e| e.place.starts_with(&format!("{must}:"))),
            "{must} has no worked `$ gpumem` example any more: this test would check nothing there"
        );
    }
    let dir = scratch_dir();
    let failures: Vec<String> = all.iter().filter_map(|e| run(e, &dir).err()).collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        failures.is_empty(),
        "{} of {} worked examples differ from what the command prints:\n\n{}",
        failures.len(),
        all.len(),
        failures.join("\n\n")
    );
}

#[test]
fn examples_are_read_as_written() {
    let doc = "text\n```text\n$ gpumem plan --model gpt2 \\\n    --batch 8 --name 'a b'\npeak 1\n...\nlast\n$ gpumem replay plan.jsonl\n```\n```text\nnot an example\n```\n";
    assert_eq!(
        examples("x.md", doc),
        [
            Example {
                place: "x.md:3".into(),
                args: ["plan", "--model", "gpt2", "--batch", "8", "--name", "a b"]
                    .map(String::from)
                    .into(),
                expected: ["peak 1", "...", "last"].map(String::from).into(),
            },
            Example {
                place: "x.md:8".into(),
                args: ["replay", "plan.jsonl"].map(String::from).into(),
                expected: vec![],
            },
        ]
    );
}

#[test]
fn a_changed_figure_does_not_match() {
    let lines = |text: &str| -> Vec<String> { text.lines().map(String::from).collect() };
    let actual = lines("model: x\npeak per GPU: 70.89 GiB\nfits\nlast");
    assert!(matches(&lines("model: x\n...\nlast"), &actual));
    assert!(matches(
        &lines("...\npeak per GPU: 70.89 GiB\n..."),
        &actual
    ));
    assert!(!matches(
        &lines("...\npeak per GPU: 70.84 GiB\n..."),
        &actual
    ));
    assert!(!matches(
        &lines("model: x\npeak per GPU: 70.89 GiB"),
        &actual
    ));
    assert!(!matches(&lines("model: x\n...\nfits"), &actual));
    assert!(matches(
        &lines("56 settings replayed in 0.19 s (search complete)."),
        &lines("56 settings replayed in 0.89 s (search complete).")
    ));
    assert!(!matches(
        &lines("56 settings replayed in 0.19 s (search complete)."),
        &lines("57 settings replayed in 0.19 s (search complete).")
    ));
}
