//! Writing a report so that a file at the output path is always a complete one: the page goes
//! to a temporary file in the same directory, renamed over the path only once fully written
//! (`gpumem_snapshot::write_file_atomically`, which snapshots are written with too).

use std::io::Write;
use std::path::Path;

use gpumem_snapshot::write_file_atomically;

use crate::model::ReportError;

/// Writes `contents` to `path` atomically: readers see the old file or the whole new one,
/// never a part, and a failure leaves no partial file behind.
pub fn write_atomically(path: &Path, contents: &[u8]) -> Result<(), ReportError> {
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
    use std::path::PathBuf;

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
        // A directory in the way: the rename fails, and no partial file stays.
        let blocked = dir.join("taken");
        fs::create_dir(&blocked).unwrap();
        fs::write(blocked.join("inside"), b"x").unwrap();
        let err = write_atomically(&blocked, b"page").unwrap_err();
        assert!(err.to_string().contains("taken"), "{err}");
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
}
