//! Writing a report so that a file at the output path is always a complete one: the page goes
//! to a temporary file in the same directory, renamed over the path only once fully written
//! (`gpumem_snapshot::write_file_atomically`, which snapshots are written with too).

use std::io::Write;
use std::path::{Path, PathBuf};

use gpumem_snapshot::write_file_atomically;

use crate::model::ReportError;

/// Refuses an output path no page can go to: a directory (or a path ending with a
/// separator), or one of `inputs`, the files the page is made from (through links too).
pub fn check_output(path: &Path, inputs: &[PathBuf]) -> Result<(), ReportError> {
    let ends_with_separator =
        (path.as_os_str().to_string_lossy().chars().last()).is_some_and(std::path::is_separator);
    if path.is_dir() || ends_with_separator {
        return Err(ReportError::OutputIsDirectory {
            path: path.to_path_buf(),
        });
    }
    let Ok(output) = path.canonicalize() else {
        return Ok(()); // No file there yet: it is none of the inputs.
    };
    match inputs
        .iter()
        .find(|input| input.canonicalize().is_ok_and(|i| i == output))
    {
        Some(input) => Err(ReportError::OutputIsInput {
            path: path.to_path_buf(),
            input: input.clone(),
        }),
        None => Ok(()),
    }
}

/// Writes `contents` to `path` atomically: readers see the old file or the whole new one,
/// never a part, and a failure leaves no partial file behind. A directory is refused before
/// anything is written ([`check_output`]).
pub fn write_atomically(path: &Path, contents: &[u8]) -> Result<(), ReportError> {
    check_output(path, &[])?;
    write_file_atomically(path, |file| file.write_all(contents)).map_err(|source| {
        ReportError::Write {
            path: path.to_path_buf(),
            source,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("gpumem-report-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn writes_whole_files_and_leaves_nothing_on_failure() {
        let dir = scratch("atomic");
        let out = dir.join("r.html");
        write_atomically(&out, b"first").unwrap();
        write_atomically(&out, b"second").unwrap();
        assert_eq!(fs::read(&out).unwrap(), b"second");
        // A directory in the way: refused before writing, and no partial file stays.
        let blocked = dir.join("taken");
        fs::create_dir(&blocked).unwrap();
        fs::write(blocked.join("inside"), b"x").unwrap();
        let err = write_atomically(&blocked, b"page").unwrap_err();
        assert!(
            err.to_string().contains("taken: it is a directory"),
            "{err}"
        );
        for named_as_directory in [dir.join("new-dir/"), PathBuf::from("./")] {
            let err = write_atomically(&named_as_directory, b"page").unwrap_err();
            assert!(err.to_string().contains("it is a directory"), "{err}");
        }
        // A directory that does not exist.
        let missing = dir.join("no-such-dir").join("r.html");
        let err = write_atomically(&missing, b"page").unwrap_err();
        assert!(err.to_string().starts_with("cannot write "), "{err}");
        let mut left: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, vec!["r.html", "taken"]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_input_is_refused_as_the_output_even_through_a_link() {
        let dir = scratch("input");
        let trace = dir.join("t.jsonl");
        fs::write(&trace, b"trace").unwrap();
        let link = dir.join("link.html");
        std::os::unix::fs::symlink(&trace, &link).unwrap();
        let inputs = [dir.join("other.jsonl"), dir.join(".").join("t.jsonl")];
        for out in [&trace, &link] {
            let err = check_output(out, &inputs).unwrap_err().to_string();
            assert!(
                err.contains("it is the trace") && err.contains("t.jsonl"),
                "{err}"
            );
        }
        check_output(&dir.join("new.html"), &inputs).unwrap();
        assert_eq!(fs::read(&trace).unwrap(), b"trace");
        fs::remove_dir_all(&dir).unwrap();
    }
}
