//! The snapshot writers: serde serialisation in the layout memory_viz reads, and the pickle and
//! JSON files made from it.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::ser::{SerializeMap, SerializeSeq, SerializeStruct};
use serde::{Serialize, Serializer};

use crate::{Action, Frame, Snapshot, SnapshotBlock, SnapshotSegment, StackId, Stacks, TraceEntry};

impl Snapshot {
    /// Writes the snapshot as a protocol-3 pickle that memory_viz opens.
    pub fn write_pickle(&self, writer: impl Write) -> std::io::Result<()> {
        let mut writer = std::io::BufWriter::new(writer);
        serde_pickle::to_writer(&mut writer, self, serde_pickle::SerOptions::new()).map_err(
            |error| match error {
                serde_pickle::Error::Io(error) => error,
                other => std::io::Error::other(other),
            },
        )?;
        writer.flush()
    }

    /// Writes the snapshot as JSON of the same structure (newer memory_viz builds read it).
    pub fn write_json(&self, writer: impl Write) -> std::io::Result<()> {
        let mut writer = std::io::BufWriter::new(writer);
        serde_json::to_writer(&mut writer, self)?;
        writer.flush()
    }

    /// Writes the snapshot to a file: JSON if the name ends in `.json`, else a pickle for
    /// memory_viz (`gpumem replay --snapshot OUT.pickle`); gzip-compressed when it ends in
    /// `.gz` (`OUT.pickle.gz`, `OUT.json.gz`, as the trace readers take them). The file
    /// appears only complete ([`write_file_atomically`]).
    pub fn write_path(&self, path: impl AsRef<std::path::Path>) -> std::io::Result<()> {
        let path = path.as_ref();
        let has_extension = |name: &Path, wanted: &str| {
            name.extension()
                .is_some_and(|extension| extension == wanted)
        };
        let gzipped = has_extension(path, "gz");
        let inner = if gzipped {
            Path::new(path.file_stem().unwrap_or_default())
        } else {
            path
        };
        let json = has_extension(inner, "json");
        write_file_atomically(path, |file| {
            let write = |out: &mut dyn Write| match json {
                true => self.write_json(out),
                false => self.write_pickle(out),
            };
            if gzipped {
                let mut encoder =
                    flate2::write::GzEncoder::new(file, flate2::Compression::default());
                write(&mut encoder)?;
                encoder.finish().map(|_| ())
            } else {
                write(file)
            }
        })
    }
}

/// Writes a file so that it is never seen partly written: `write` fills a temporary file in
/// the same directory (named uniquely per call, so concurrent writers do not collide; the last
/// rename wins), which is then flushed to disk and renamed over `path`; on any failure the
/// temporary file is removed and `path` is left as it was. For outputs (snapshots, reports)
/// that a failed run must not leave behind looking complete.
///
/// A symlink `path` is followed to its final target, which is replaced the same way (the links
/// stay). An existing `path` that is not a regular file (a device such as `/dev/null`, a FIFO)
/// is written to directly, neither replaced nor atomic; its errors (`/dev/full`: no space left
/// on device) are returned.
pub fn write_file_atomically(
    path: &Path,
    write: impl FnOnce(&mut File) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let path = &final_target(path)?;
    if std::fs::metadata(path).is_ok_and(|metadata| !metadata.is_file()) {
        let mut file = OpenOptions::new().write(true).open(path)?;
        return write(&mut file);
    }
    let (temp, mut file) = create_temporary(path)?;
    let written = write(&mut file)
        .and_then(|()| file.sync_all())
        .and_then(|()| std::fs::rename(&temp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written
}

/// `path` with symlinks followed to the last one's target (which may not exist yet).
fn final_target(path: &Path) -> std::io::Result<PathBuf> {
    /// As many links as Linux follows before `ELOOP`.
    const MAX_LINKS: usize = 40;
    let mut path = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match std::fs::symlink_metadata(&path) {
            Ok(metadata) if metadata.is_symlink() => {
                // A relative link is relative to the directory holding it.
                let link = std::fs::read_link(&path)?;
                path = path.parent().unwrap_or(Path::new("")).join(link);
            }
            _ => return Ok(path),
        }
    }
    Err(std::io::Error::other(format!(
        "more than {MAX_LINKS} levels of symbolic links at {}",
        path.display()
    )))
}

/// A new temporary file beside `path`, `.<name>.<pid>.<counter>.partial`: unique among this
/// process's calls and other processes'; a leftover of the same name is skipped, not reused.
fn create_temporary(path: &Path) -> std::io::Result<(PathBuf, File)> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .map_or_else(|| "output".into(), |n| n.to_string_lossy().into_owned());
    let mut attempts = 0;
    loop {
        let count = NEXT.fetch_add(1, Ordering::Relaxed);
        let temp = path.with_file_name(format!(".{name}.{}.{count}.partial", std::process::id()));
        attempts += 1;
        match OpenOptions::new().write(true).create_new(true).open(&temp) {
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists && attempts < 100 => {}
            opened => return opened.map(|file| (temp, file)),
        }
    }
}

/// An integer as Python pickles it: values that fit in an `i64` as such (serde-pickle then
/// writes at most 8 bytes, which memory_viz's unpickler decodes into a JavaScript number; its
/// `u64` encoding always takes 9 bytes, which the viewer turns into a BigInt that breaks its
/// address arithmetic).
struct PyInt(u64);

impl Serialize for PyInt {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match i64::try_from(self.0) {
            Ok(value) => serializer.serialize_i64(value),
            Err(_) => serializer.serialize_u64(self.0),
        }
    }
}

/// The `frames` list memory_viz expects on segments and blocks; gpumem records none there.
struct NoFrames;

impl Serialize for NoFrames {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_seq(Some(0))?.end()
    }
}

impl Serialize for Snapshot {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_struct("Snapshot", 3)?;
        map.serialize_field("segments", &self.segments)?;
        let device_traces: Vec<DeviceTrace<'_>> = self
            .device_traces
            .iter()
            .map(|entries| DeviceTrace {
                entries,
                stacks: &self.stacks,
            })
            .collect();
        map.serialize_field("device_traces", &device_traces)?;
        map.serialize_field("allocator_settings", &self.allocator_settings)?;
        map.end()
    }
}

impl Serialize for SnapshotSegment {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_struct("Segment", 12)?;
        map.serialize_field("device", &PyInt(self.device))?;
        map.serialize_field("address", &PyInt(self.address))?;
        map.serialize_field("total_size", &PyInt(self.total_size))?;
        map.serialize_field("allocated_size", &PyInt(self.allocated_size))?;
        map.serialize_field("active_size", &PyInt(self.active_size))?;
        map.serialize_field("requested_size", &PyInt(self.requested_size))?;
        map.serialize_field("stream", &PyInt(self.stream))?;
        if let Some(segment_type) = self.segment_type {
            map.serialize_field("segment_type", &segment_type)?;
        } else {
            map.skip_field("segment_type")?;
        }
        let (pool_high, pool_low) = self.segment_pool_id;
        map.serialize_field("segment_pool_id", &(PyInt(pool_high), PyInt(pool_low)))?;
        map.serialize_field("is_expandable", &self.is_expandable)?;
        map.serialize_field("frames", &NoFrames)?;
        map.serialize_field("blocks", &self.blocks)?;
        map.end()
    }
}

impl Serialize for SnapshotBlock {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_struct("Block", 5)?;
        map.serialize_field("address", &PyInt(self.address))?;
        map.serialize_field("size", &PyInt(self.size))?;
        map.serialize_field("requested_size", &PyInt(self.requested_size))?;
        map.serialize_field("state", &self.state)?;
        map.serialize_field("frames", &NoFrames)?;
        map.end()
    }
}

/// One device's entries with the table their stacks are in.
struct DeviceTrace<'a> {
    entries: &'a [TraceEntry],
    stacks: &'a Stacks,
}

impl Serialize for DeviceTrace<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.entries.len()))?;
        for entry in self.entries {
            seq.serialize_element(&EntryWithFrames {
                entry,
                stacks: self.stacks,
            })?;
        }
        seq.end()
    }
}

/// A trace entry with its `frames` resolved.
struct EntryWithFrames<'a> {
    entry: &'a TraceEntry,
    stacks: &'a Stacks,
}

impl Serialize for EntryWithFrames<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let entry = self.entry;
        // Like PyTorch: an `oom` entry carries `device_free` in place of `addr`.
        let mut map = serializer.serialize_map(Some(6))?;
        map.serialize_entry("action", &entry.action)?;
        match (entry.action, entry.device_free) {
            (Action::Oom, device_free) => {
                map.serialize_entry("device_free", &PyInt(device_free.unwrap_or(0)))?
            }
            (_, _) => map.serialize_entry("addr", &PyInt(entry.addr))?,
        }
        map.serialize_entry("size", &PyInt(entry.size))?;
        map.serialize_entry("stream", &PyInt(entry.stream))?;
        map.serialize_entry("time_us", &PyInt(entry.time_us))?;
        match entry.stack {
            Some(stack) => map.serialize_entry("frames", &StackFrames(self.stacks, stack))?,
            None => map.serialize_entry("frames", &NoFrames)?,
        }
        map.end()
    }
}

/// A stack as memory_viz's `frames`: a list of `{filename, line, name}`.
struct StackFrames<'a>(&'a Stacks, StackId);

impl Serialize for StackFrames<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let frames = self.0.frames(self.1);
        let mut seq = serializer.serialize_seq(Some(frames.len()))?;
        for frame in frames {
            seq.serialize_element(frame)?;
        }
        seq.end()
    }
}

impl Serialize for Frame {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_struct("Frame", 3)?;
        map.serialize_field("filename", &*self.filename)?;
        map.serialize_field("line", &PyInt(self.line))?;
        map.serialize_field("name", &*self.name)?;
        map.end()
    }
}
