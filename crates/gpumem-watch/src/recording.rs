//! Recorded samples: one [`Sample`] as a JSON object per line, in time order. Readers need
//! only `time_ms`; unknown fields are ignored, missing lists are empty, blank lines skipped.
//! Figures that cannot be (see [`Sample::check`]) are an error naming the line and field;
//! samples are played in file order, whatever their `time_ms`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use crate::{Sample, SampleSource, WatchError};

/// A recording read into memory, played back in order as a [`SampleSource`].
#[derive(Clone, Debug, Default)]
pub struct Recording {
    samples: Vec<Sample>,
    next: usize,
}

impl Recording {
    /// Reads a recording; a bad line, or one whose figures cannot be ([`Sample::check`]), is
    /// an error naming the file and the line.
    pub fn read(path: &Path) -> Result<Recording, WatchError> {
        let file = std::fs::File::open(path).map_err(|e| WatchError::io(path, e))?;
        let mut samples = Vec::new();
        for (i, line) in BufReader::new(file).lines().enumerate() {
            let line = line.map_err(|e| WatchError::io(path, e))?;
            if line.trim().is_empty() {
                continue;
            }
            let sample: Sample =
                serde_json::from_str(&line).map_err(|e| WatchError::BadRecording {
                    path: path.to_path_buf(),
                    line: i + 1,
                    message: e.to_string(),
                })?;
            sample.check().map_err(|message| WatchError::BadSample {
                path: path.to_path_buf(),
                line: i + 1,
                message,
            })?;
            samples.push(sample);
        }
        if samples.is_empty() {
            return Err(WatchError::BadRecording {
                path: path.to_path_buf(),
                line: 0,
                message: "the file holds no sample".into(),
            });
        }
        Ok(Recording::from_samples(samples))
    }

    /// A recording of `samples`.
    pub fn from_samples(samples: Vec<Sample>) -> Recording {
        Recording { samples, next: 0 }
    }

    /// Every sample, in order.
    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }
}

impl SampleSource for Recording {
    fn next_sample(&mut self) -> Result<Option<Sample>, WatchError> {
        let sample = self.samples.get(self.next).cloned();
        self.next += 1;
        Ok(sample)
    }
}

/// Writes samples as a recording, one line each, flushed per sample so that a recording cut
/// short is still readable.
pub struct RecordingWriter {
    path: PathBuf,
    out: std::io::BufWriter<std::fs::File>,
}

impl RecordingWriter {
    /// Creates (or truncates) `path`.
    pub fn create(path: &Path) -> Result<RecordingWriter, WatchError> {
        let file = std::fs::File::create(path).map_err(|e| WatchError::io(path, e))?;
        Ok(RecordingWriter {
            path: path.to_path_buf(),
            out: std::io::BufWriter::new(file),
        })
    }

    /// Appends one sample.
    pub fn write(&mut self, sample: &Sample) -> Result<(), WatchError> {
        let line = serde_json::to_string(sample)
            .map_err(|e| WatchError::io(&self.path, std::io::Error::other(e.to_string())))?;
        writeln!(self.out, "{line}")
            .and_then(|()| self.out.flush())
            .map_err(|e| WatchError::io(&self.path, e))
    }
}
