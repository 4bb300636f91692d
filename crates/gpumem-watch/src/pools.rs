//! The reading side of [`crate::publish`]: ask every endpoint in a directory for its pools,
//! and the live source that joins them with NVML's figures.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::publish::{ask, endpoint_dir, PublishError};
#[cfg(feature = "nvml")]
use crate::NvmlSource;
use crate::{PoolSample, Sample, SampleSource, WatchError};

/// The pools of every process publishing in one directory.
pub struct PoolEndpoints {
    dir: PathBuf,
    /// The endpoints skipped at the last look, so that each is warned about once.
    skipped: BTreeSet<PathBuf>,
    /// Warnings not yet taken ([`SampleSource::take_warnings`]).
    warnings: Vec<WatchError>,
}

impl PoolEndpoints {
    /// The endpoints in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> PoolEndpoints {
        PoolEndpoints {
            dir: dir.into(),
            skipped: BTreeSet::new(),
            warnings: Vec::new(),
        }
    }

    /// The endpoints in this user's directory ([`endpoint_dir`]).
    pub fn from_env() -> PoolEndpoints {
        PoolEndpoints::new(endpoint_dir())
    }

    /// The directory read.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Asks every endpoint for its pools. A missing directory means no publisher; a socket
    /// nobody answers on whose process is gone is removed; one that answers badly, too much
    /// (over [`MAX_ANSWER_BYTES`](crate::publish::MAX_ANSWER_BYTES)) or late (after [`ANSWER_TIMEOUT`](crate::publish::ANSWER_TIMEOUT)) is skipped, so that one
    /// stuck process does not hide the others.
    pub fn pools(&self) -> Result<Vec<PoolSample>, WatchError> {
        self.ask_all().map(|(pools, _)| pools)
    }

    /// [`PoolEndpoints::pools`], keeping a warning for each endpoint newly skipped.
    fn pools_noting_skips(&mut self) -> Result<Vec<PoolSample>, WatchError> {
        let (pools, skipped) = self.ask_all()?;
        let paths: BTreeSet<PathBuf> = skipped.iter().map(|(path, _)| path.clone()).collect();
        self.warnings.extend(
            skipped
                .into_iter()
                .filter(|(path, _)| !self.skipped.contains(path))
                .map(|(_, error)| error),
        );
        self.skipped = paths;
        Ok(pools)
    }

    /// The pools of the endpoints that answered, and each skipped endpoint with why.
    #[allow(clippy::type_complexity)]
    fn ask_all(&self) -> Result<(Vec<PoolSample>, Vec<(PathBuf, WatchError)>), WatchError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok((Vec::new(), Vec::new()))
            }
            Err(e) => return Err(WatchError::io(&self.dir, e)),
        };
        let mut sockets: Vec<(u32, PathBuf)> = entries
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .filter_map(|path| {
                let pid = path
                    .file_name()?
                    .to_str()?
                    .strip_suffix(".sock")?
                    .parse()
                    .ok()?;
                Some((pid, path))
            })
            .collect();
        sockets.sort();
        let mut pools = Vec::new();
        let mut skipped = Vec::new();
        for (pid, path) in sockets {
            match ask(&path) {
                Ok(report) => pools.extend(report.pools),
                Err(PublishError::Io { .. }) if !crate::procinfo::is_alive(pid) => {
                    let _ = std::fs::remove_file(&path);
                }
                Err(e) => skipped.push((path, WatchError::SkippedEndpoint(e))),
            }
        }
        Ok((pools, skipped))
    }
}

impl SampleSource for PoolEndpoints {
    fn next_sample(&mut self) -> Result<Option<Sample>, WatchError> {
        Ok(Some(Sample {
            time_ms: crate::now_ms(),
            host: crate::host_name(),
            gpus: Vec::new(),
            pools: self.pools_noting_skips()?,
        }))
    }

    fn take_warnings(&mut self) -> Vec<WatchError> {
        std::mem::take(&mut self.warnings)
    }
}

/// What is happening now: NVML's GPUs (when a driver is there) and the published pools.
#[cfg(feature = "nvml")]
pub struct LiveSource {
    nvml: Option<NvmlSource>,
    pools: PoolEndpoints,
    /// Why there are no GPU figures, when NVML could not be used.
    no_gpu: Option<String>,
}

#[cfg(feature = "nvml")]
impl LiveSource {
    /// NVML if it loads, and the pools of this user's endpoint directory. Without a driver the
    /// source still reports pools; [`LiveSource::no_gpu`] says why GPUs are missing.
    pub fn open() -> LiveSource {
        let (nvml, no_gpu) = match NvmlSource::open() {
            Ok(nvml) => (Some(nvml), None),
            Err(e) => (None, Some(e.to_string())),
        };
        LiveSource {
            nvml,
            pools: PoolEndpoints::from_env(),
            no_gpu,
        }
    }

    /// The plain sentence saying why no GPU is watched, if none is.
    pub fn no_gpu(&self) -> Option<&str> {
        self.no_gpu.as_deref()
    }
}

#[cfg(feature = "nvml")]
impl SampleSource for LiveSource {
    fn next_sample(&mut self) -> Result<Option<Sample>, WatchError> {
        let mut sample = match &mut self.nvml {
            Some(nvml) => nvml.sample()?,
            None => Sample {
                time_ms: crate::now_ms(),
                host: crate::host_name(),
                ..Sample::default()
            },
        };
        sample.pools = self.pools.pools_noting_skips()?;
        Ok(Some(sample))
    }

    fn take_warnings(&mut self) -> Vec<WatchError> {
        self.pools.take_warnings()
    }
}
