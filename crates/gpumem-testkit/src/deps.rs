//! The one rule for a test whose system dependency is missing (a C compiler, tmux, curl,
//! Chromium, Python, Mesa's Vulkan driver): the test **fails**, naming the Debian package and
//! `bash scripts/install-test-deps.sh`, which installs them all. Only an explicit opt-out,
//! [`OPT_OUT_VAR`]`=1`, turns that into a skip, and then the test prints a loud `SKIPPED:` line
//! on stderr. Nothing else (in particular not `CI`) changes the outcome, so a machine that
//! lacks a dependency cannot pass the suite by accident.
//!
//! ```no_run
//! use gpumem_testkit::deps::{self, TMUX};
//!
//! let Some(_version) = deps::require(TMUX, std::process::Command::new("tmux").arg("-V").output())
//! else {
//!     return; // skipped, and said so
//! };
//! ```

use std::fmt;
use std::io::Write;

/// The environment variable that opts out: set to `1`, a missing dependency skips the tests
/// that need it (each printing a `SKIPPED:` line) instead of failing them.
pub const OPT_OUT_VAR: &str = "GPUMEM_SKIP_MISSING_TEST_DEPS";

/// The command that installs every test dependency (Debian and Ubuntu, as root or with sudo).
pub const INSTALL_COMMAND: &str = "bash scripts/install-test-deps.sh";

/// A system dependency of some tests: what it is, and the Debian package that provides it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dependency {
    /// What the test needs, as a person would name it ("tmux", "a C compiler").
    pub what: &'static str,
    /// The Debian package(s) that provide it, space-separated, as `apt-get install` takes
    /// them.
    pub package: &'static str,
}

/// A C compiler (`cc`, or `$CC`): the C library's program test and the mock CUDA driver.
/// `build-essential`, not `gcc` alone: without recommended packages `gcc` comes without the C
/// library's headers (`libc6-dev`), and then compiles nothing.
pub const C_COMPILER: Dependency = Dependency {
    what: "a C compiler",
    package: "build-essential",
};

/// A C++ compiler (`c++`, or `$CXX`): the C library's PyTorch entry point test.
pub const CXX_COMPILER: Dependency = Dependency {
    what: "a C++ compiler",
    package: "build-essential",
};

/// tmux, in which `gpumem top` is driven as a terminal.
pub const TMUX: Dependency = Dependency {
    what: "tmux",
    package: "tmux",
};

/// curl, which scrapes the Prometheus exporter.
pub const CURL: Dependency = Dependency {
    what: "curl",
    package: "curl",
};

/// Headless Chromium, in which the HTML report is rendered.
pub const CHROMIUM: Dependency = Dependency {
    what: "Chromium",
    package: "chromium",
};

/// Python 3, whose own pickle module loads the snapshots gpumem writes.
pub const PYTHON3: Dependency = Dependency {
    what: "python3",
    package: "python3",
};

/// A Vulkan adapter for the wgpu backend: without a GPU, Mesa's software driver (lavapipe)
/// and the Vulkan loader.
pub const VULKAN: Dependency = Dependency {
    what: "a wgpu (Vulkan) adapter",
    package: "mesa-vulkan-drivers libvulkan1",
};

/// What happens to a test whose dependency is missing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The user opted out: the test is skipped after printing this line.
    Skip(String),
    /// The test fails with this message.
    Fail(String),
}

/// The outcome for `test` missing `dep` (`detail`: what was tried and how it failed), given
/// the value of [`OPT_OUT_VAR`] (`None` when unset). Only the value `1` opts out; any other
/// value fails too, saying so, so that a typo does not silently change the rule.
pub fn outcome(
    test: &str,
    dep: Dependency,
    detail: &dyn fmt::Display,
    opt_out: Option<&str>,
) -> Outcome {
    let Dependency { what, package } = dep;
    match opt_out {
        Some("1") => Outcome::Skip(format!(
            "SKIPPED: {test}: {what} missing ({detail}); to run it, install the Debian \
             package(s) with `apt-get install {package}`, or run `{INSTALL_COMMAND}`"
        )),
        other => {
            let bad_value = match other {
                Some(value) if !value.is_empty() => {
                    format!(" ({OPT_OUT_VAR}={value:?} is not an opt-out: only 1 is)")
                }
                _ => String::new(),
            };
            Outcome::Fail(format!(
                "{test} needs {what}, which is missing ({detail}): install the Debian \
                 package(s) with `apt-get install {package}`, or every test dependency with \
                 `{INSTALL_COMMAND}`; to skip the tests that need it instead, set \
                 {OPT_OUT_VAR}=1{bad_value}"
            ))
        }
    }
}

/// Applies the rule to a missing `dep`: panics with what to install, or, when the user opted
/// out, prints the `SKIPPED:` line on stderr (uncaptured, so it shows for a passing test) and
/// returns so that the test can end.
pub fn missing(dep: Dependency, detail: impl fmt::Display) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("this test");
    let opt_out = std::env::var(OPT_OUT_VAR).ok();
    match outcome(test, dep, &detail, opt_out.as_deref()) {
        // Straight to stderr, not through `eprintln!`, which the test harness captures and
        // shows only for failing tests: a skip must be seen when the test passes.
        Outcome::Skip(line) => {
            let _ = writeln!(std::io::stderr(), "{line}");
        }
        Outcome::Fail(message) => panic!("{message}"),
    }
}

/// `found`'s value when the dependency is there; otherwise [`missing`] (a failure, or `None`
/// after the `SKIPPED:` line when the user opted out).
pub fn require<T, E: fmt::Display>(dep: Dependency, found: Result<T, E>) -> Option<T> {
    match found {
        Ok(value) => Some(value),
        Err(e) => {
            missing(dep, e);
            None
        }
    }
}

/// The first of `names` found as a file in a directory of `PATH`.
pub fn find_on_path(names: &[&str]) -> Option<std::path::PathBuf> {
    let paths = std::env::var_os("PATH")?;
    names.iter().find_map(|name| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(opt_out: Option<&str>) -> Outcome {
        outcome("t", TMUX, &"No such file or directory", opt_out)
    }

    #[test]
    fn a_missing_dependency_fails_naming_the_package_the_script_and_the_opt_out() {
        let Outcome::Fail(message) = run(None) else {
            panic!("unset must fail");
        };
        assert!(message.contains("`apt-get install tmux`"), "{message}");
        assert!(
            message.contains("bash scripts/install-test-deps.sh"),
            "{message}"
        );
        assert!(
            message.contains("GPUMEM_SKIP_MISSING_TEST_DEPS=1"),
            "{message}"
        );
        assert!(message.contains("No such file or directory"), "{message}");
        assert_eq!(run(Some("")), Outcome::Fail(message));
    }

    #[test]
    fn only_the_value_1_opts_out_and_the_skip_is_loud() {
        let Outcome::Skip(line) = run(Some("1")) else {
            panic!("1 must skip");
        };
        assert!(line.starts_with("SKIPPED: t: tmux missing"), "{line}");
        assert!(line.contains("`apt-get install tmux`"), "{line}");
        for value in ["true", "0", "yes"] {
            let Outcome::Fail(message) = run(Some(value)) else {
                panic!("{value} must not skip");
            };
            assert!(message.contains("is not an opt-out"), "{message}");
        }
    }

    #[test]
    fn require_passes_a_found_dependency_through() {
        assert_eq!(require(CURL, Ok::<_, String>(7)), Some(7));
    }

    #[test]
    fn require_fails_on_a_missing_dependency_unless_opted_out() {
        let result = std::panic::catch_unwind(|| require(CURL, Err::<(), _>("not found")));
        if std::env::var(OPT_OUT_VAR).as_deref() == Ok("1") {
            assert_eq!(result.unwrap(), None);
        } else {
            let payload = result.expect_err("a missing dependency must fail the test");
            let message = payload.downcast_ref::<String>().unwrap();
            assert!(message.contains("`apt-get install curl`"), "{message}");
        }
    }

    #[test]
    fn find_on_path_finds_a_file_in_path_and_not_a_made_up_name() {
        assert!(find_on_path(&["gpumem-no-such-program-3f9a"]).is_none());
        let sh = find_on_path(&["sh"]).expect("sh on PATH");
        assert!(sh.ends_with("sh"));
    }
}
