//! Where `write_file_atomically` puts what it writes: special files, symlinks, racing writers.
#![cfg(all(unix, feature = "write"))]

use std::io::{Read, Write};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use gpumem_snapshot::{write_file_atomically, Snapshot};

/// A fresh, empty directory under the system's temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "gpumem-snapshot-write-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn write_bytes(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_file_atomically(path, |file| file.write_all(bytes))
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn writes_through_to_a_fifo() {
    let dir = TempDir::new();
    let fifo = dir.0.join("pipe.json");
    // A FIFO stands for every file that is not a regular one (devices such as /dev/null,
    // which a test must not risk replacing when run as root).
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo (coreutils) runs");
    assert!(made.success(), "mkfifo {}", fifo.display());
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            let mut read = String::new();
            std::fs::File::open(fifo)
                .unwrap()
                .read_to_string(&mut read)
                .unwrap();
            read
        })
    };
    Snapshot::default().write_path(&fifo).unwrap();
    // Checked before joining: a reader of a FIFO that was replaced would wait forever.
    let kind = std::fs::symlink_metadata(&fifo).unwrap().file_type();
    assert!(kind.is_fifo(), "the FIFO is now {kind:?}");
    let read = reader.join().unwrap();
    assert!(read.starts_with("{\"segments\":[]"), "{read}");
    assert_eq!(names(&dir.0), ["pipe.json"], "nothing left beside it");
}

#[test]
fn a_symlink_stays_a_link_and_its_target_gets_the_content() {
    let dir = TempDir::new();
    std::fs::create_dir(dir.0.join("real")).unwrap();
    let target = dir.0.join("real/out.bin");
    std::fs::write(&target, b"old").unwrap();
    // A chain of two links, the first one relative.
    let middle = dir.0.join("middle.bin");
    std::os::unix::fs::symlink(&target, &middle).unwrap();
    let link = dir.0.join("link.bin");
    std::os::unix::fs::symlink("middle.bin", &link).unwrap();

    write_bytes(&link, b"new").unwrap();
    assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
    assert!(std::fs::symlink_metadata(&middle).unwrap().is_symlink());
    assert_eq!(std::fs::read_link(&link).unwrap(), Path::new("middle.bin"));
    assert_eq!(std::fs::read(&target).unwrap(), b"new");
    assert_eq!(names(&dir.0.join("real")), ["out.bin"]);

    // A dangling link: its target is created.
    let dangling = dir.0.join("dangling.bin");
    std::os::unix::fs::symlink("real/new.bin", &dangling).unwrap();
    write_bytes(&dangling, b"made").unwrap();
    assert!(std::fs::symlink_metadata(&dangling).unwrap().is_symlink());
    assert_eq!(std::fs::read(dir.0.join("real/new.bin")).unwrap(), b"made");
}

#[test]
fn a_symlink_loop_is_an_error() {
    let dir = TempDir::new();
    let a = dir.0.join("a");
    std::os::unix::fs::symlink("b", &a).unwrap();
    std::os::unix::fs::symlink("a", dir.0.join("b")).unwrap();
    let error = write_bytes(&a, b"x").unwrap_err();
    assert!(error.to_string().contains("symbolic links"), "{error}");
    assert_eq!(names(&dir.0), ["a", "b"]);
}

#[test]
fn concurrent_writers_to_one_path_all_succeed_with_a_whole_file() {
    const THREADS: u8 = 8;
    const WRITES: usize = 50;
    let dir = TempDir::new();
    let path = dir.0.join("out.bin");
    // Each writer's content: its own byte, in chunks, so that writes interleave.
    let content = |writer: u8| vec![writer; 64 << 10];
    std::thread::scope(|scope| {
        for writer in 0..THREADS {
            let path = &path;
            scope.spawn(move || {
                for _ in 0..WRITES {
                    let bytes = content(writer);
                    write_file_atomically(path, |file| {
                        bytes
                            .chunks(4096)
                            .try_for_each(|chunk| file.write_all(chunk))
                    })
                    .unwrap_or_else(|error| panic!("writer {writer}: {error}"));
                }
            });
        }
    });
    let last = std::fs::read(&path).unwrap();
    assert!(
        (0..THREADS).any(|writer| last == content(writer)),
        "not one writer's whole file ({} bytes)",
        last.len()
    );
    assert_eq!(names(&dir.0), ["out.bin"], "no temporary file left");
}

#[test]
fn concurrent_snapshot_writes_leave_a_readable_snapshot() {
    let dir = TempDir::new();
    let path = dir.0.join("snapshot.json");
    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| {
                for _ in 0..50 {
                    Snapshot::default().write_path(&path).unwrap();
                }
            });
        }
    });
    let mut expected = Vec::new();
    Snapshot::default().write_json(&mut expected).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), expected);
    assert_eq!(names(&dir.0), ["snapshot.json"]);
}
