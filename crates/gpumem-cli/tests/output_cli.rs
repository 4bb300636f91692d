//! Standard output as pipelines treat it: a reader that goes away early (`gpumem … | head`)
//! ends a command quietly and successfully; any other write error is reported.

use std::process::{Command, Stdio};

/// Commands that print without a GPU, quickly.
const COMMANDS: [&[&str]; 5] = [
    &["replay", "--json"],
    &["replay"],
    &["policies"],
    &["devices", "--json"],
    &["plan", "--list-models"],
];

#[test]
fn a_reader_that_closes_early_ends_every_command_quietly() {
    for args in COMMANDS {
        let mut child = Command::new(env!("CARGO_BIN_EXE_gpumem"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the gpumem binary runs");
        // The reader goes away before anything is written: the first write meets a closed
        // pipe, whatever the size of the output.
        drop(child.stdout.take());
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!stderr.contains("panicked"), "gpumem {args:?}: {stderr}");
        assert!(
            !stderr.contains("standard output"),
            "gpumem {args:?}: {stderr}"
        );
        assert_eq!(output.status.code(), Some(0), "gpumem {args:?}: {stderr}");
    }
}

#[cfg(target_os = "linux")]
#[test]
fn any_other_write_error_is_reported() {
    let full = std::fs::File::create("/dev/full").expect("/dev/full exists on Linux");
    let output = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .arg("policies")
        .stdout(Stdio::from(full))
        .stderr(Stdio::piped())
        .output()
        .expect("the gpumem binary runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.contains("gpumem: cannot write to standard output"),
        "{stderr}"
    );
    assert_eq!(output.status.code(), Some(2), "{stderr}");
}
