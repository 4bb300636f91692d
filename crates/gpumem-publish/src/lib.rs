//! The publishing side of `gpumem watch`: a process using gpumem pools answers "how are your
//! pools?" on a Unix socket, `<dir>/<pid>.sock`, so that `gpumem top`, `diagnose` and
//! `exporter` (crate gpumem-watch) find every such process by listing one directory
//! ([`endpoint_dir`]) and reading one line from each socket ([`ask`]).
//!
//! A crate of its own, with nothing heavier than serde, because the C library PyTorch and CuPy
//! load (gpumem-capi) links it: the watching side's terminal UI, HTTP server and NVML
//! bindings stay out of that library.
//!
//! Off by default: nothing runs and nothing is created until [`publish_from_env`] sees
//! `GPUMEM_PUBLISH=1` or the process calls [`Publisher::start`]. When on, one thread sleeps in
//! `accept`; the pools pay only when someone asks (one [`gpumem_pool::Pool::status`] per pool
//! per question), never on their allocation path. The answer is one line of JSON, a
//! [`PoolReport`], after which the socket is closed.

#![deny(unsafe_code)]
#![warn(missing_docs)]

use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gpumem_pool::{DeviceRegistry, Pool};
use serde::{Deserialize, Serialize};

/// How long one endpoint may take to answer [`ask`] before it is given up on.
/// How long one endpoint may take for its whole answer before it is skipped.
pub const ANSWER_TIMEOUT: Duration = Duration::from_millis(500);
/// The longest answer read from one endpoint, bytes (4 MiB). A report is one line of a few
/// hundred bytes per pool plus its status text and last OOM message, a few KiB per device:
/// this leaves room for hundreds of devices.
pub const MAX_ANSWER_BYTES: usize = 4 << 20;

/// What publishing, or asking a publisher, can fail with.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// A directory or socket could not be used.
    #[error("{}: {source}", path.display())]
    Io {
        /// The directory or socket.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// An environment variable has a value we do not accept.
    #[error("{var}={value:?} is not accepted; use {accepted}")]
    BadEnv {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// The accepted forms.
        accepted: &'static str,
    },
    /// An endpoint answered with something that is not a pool report.
    #[error("{}: not a gpumem pool report ({message})", path.display())]
    BadReport {
        /// The endpoint's socket.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
    /// A pool could not report its status.
    #[error("pool of device {device}: {message}")]
    Pool {
        /// The device ordinal.
        device: usize,
        /// The pool's error.
        message: String,
    },
}

impl PublishError {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> PublishError {
        PublishError::Io {
            path: path.into(),
            source,
        }
    }
}

/// One gpumem pool's statistics, as its process publishes them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolSample {
    /// The process the pool lives in.
    pub pid: u32,
    /// The device ordinal of the pool (the process's numbering, which is NVML's index unless
    /// `CUDA_VISIBLE_DEVICES` renumbers).
    pub device: u32,
    /// The policy in force (`gpumem`, `torch`, `expandable`, `none`).
    #[serde(default)]
    pub policy: String,
    /// Bytes handed out by the pool.
    pub allocated: u64,
    /// Bytes the pool holds from the device.
    pub reserved: u64,
    /// The largest block the pool could hand out without asking the device, bytes.
    #[serde(default)]
    pub largest_free_block: u64,
    /// Out-of-memory failures so far.
    #[serde(default)]
    pub num_ooms: u64,
    /// The soft limit in force, bytes.
    #[serde(default)]
    pub soft_limit: Option<u64>,
    /// The hard limit in force, bytes.
    #[serde(default)]
    pub hard_limit: Option<u64>,
    /// The explanation of the last out-of-memory failure, if there was one.
    #[serde(default)]
    pub last_oom: Option<String>,
    /// The pool's status text (`Pool::status`), as printed by the process.
    #[serde(default)]
    pub status: String,
}

impl PoolSample {
    /// Bytes reserved but not allocated: the cache, free blocks and splinters.
    pub fn cached(&self) -> u64 {
        self.reserved.saturating_sub(self.allocated)
    }

    /// How scattered the cached bytes are: 0 when the largest free block is all of them, near
    /// 1 when they are splinters no large request can use. 0 with nothing cached.
    pub fn fragmentation(&self) -> f64 {
        let cached = self.cached();
        if cached == 0 {
            0.0
        } else {
            1.0 - self.largest_free_block.min(cached) as f64 / cached as f64
        }
    }
}

/// Turns publishing on (`1`, `true`, `on`) or leaves it off (unset, `0`, `false`, `off`).
pub const PUBLISH_VAR: &str = "GPUMEM_PUBLISH";
/// Overrides the directory of the endpoints (see [`endpoint_dir`]).
pub const DIR_VAR: &str = "GPUMEM_PUBLISH_DIR";

/// What one process answers: its pools.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolReport {
    /// The answering process.
    pub pid: u32,
    /// One entry per device that has a pool.
    pub pools: Vec<PoolSample>,
}

/// Where this user's endpoints live: `$GPUMEM_PUBLISH_DIR`, else `$XDG_RUNTIME_DIR/gpumem`,
/// else `<temp>/gpumem-<uid>` — per user, so that one user's processes and tools meet and
/// nobody else's do (the directory is made private, mode 0700).
pub fn endpoint_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(DIR_VAR).filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("gpumem");
    }
    use std::os::unix::fs::MetadataExt;
    let uid =
        std::fs::metadata("/proc/self").map_or("unknown".to_string(), |m| m.uid().to_string());
    std::env::temp_dir().join(format!("gpumem-{uid}"))
}

/// What a pool publishes about itself: its statistics and status, as a [`PoolSample`].
pub fn pool_sample(pid: u32, device: usize, pool: &Pool) -> Result<PoolSample, PublishError> {
    let status = pool.status().map_err(|e| PublishError::Pool {
        device,
        message: e.to_string(),
    })?;
    Ok(PoolSample {
        pid,
        device: device as u32,
        policy: status.policy.to_string(),
        allocated: status.allocated,
        reserved: status.reserved,
        largest_free_block: status.largest_free_block,
        num_ooms: pool.stats().num_ooms,
        soft_limit: status.soft_limit,
        hard_limit: status.hard_limit,
        last_oom: pool.last_oom().map(|oom| oom.to_string()),
        status: status.to_string(),
    })
}

/// The report of every pool in `registry`, for process `pid`.
pub fn report(pid: u32, registry: &DeviceRegistry) -> Result<PoolReport, PublishError> {
    let pools = registry
        .devices()
        .into_iter()
        .filter_map(|device| registry.get(device).map(|pool| (device, pool)))
        .map(|(device, pool)| pool_sample(pid, device, &pool))
        .collect::<Result<_, _>>()?;
    Ok(PoolReport { pid, pools })
}

/// A running endpoint. Dropping it stops the thread and removes the socket.
pub struct Publisher {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Publisher {
    /// Publishes the pools of `registry` (usually [`gpumem_pool::global_registry`]) at
    /// `<dir>/<pid>.sock`, creating `dir` (mode 0700) if needed.
    pub fn start(dir: &Path, registry: &'static DeviceRegistry) -> Result<Publisher, PublishError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| PublishError::io(dir, e))?;
        let pid = std::process::id();
        let path = dir.join(format!("{pid}.sock"));
        // A socket left by an earlier process with our pid (pids are reused) is stale.
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).map_err(|e| PublishError::io(&path, e))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| PublishError::io(&path, e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("gpumem-publish".into())
            .spawn(move || serve(listener, pid, registry, &stopping))
            .map_err(|e| PublishError::io(&path, e))?;
        Ok(Publisher {
            path,
            stop,
            thread: Some(thread),
        })
    }

    /// The socket this process answers on.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept call so the thread sees the flag.
        let _ = UnixStream::connect(&self.path);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Answers each connection with one report line until told to stop.
fn serve(listener: UnixListener, pid: u32, registry: &DeviceRegistry, stop: &AtomicBool) {
    for stream in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut stream) = stream else {
            // Out of file descriptors, say: try again a little later rather than spin.
            std::thread::sleep(std::time::Duration::from_millis(100));
            continue;
        };
        // A client that went away or a pool that cannot report costs this answer only.
        let line = match report(pid, registry) {
            Ok(report) => serde_json::to_string(&report).unwrap_or_default(),
            Err(e) => serde_json::json!({ "pid": pid, "error": e.to_string() }).to_string(),
        };
        let _ = stream.write_all(line.as_bytes());
        let _ = stream.write_all(b"\n");
    }
}

/// Whether `GPUMEM_PUBLISH` asks for publishing; a value we do not know is an error.
pub fn publishing_requested(value: Option<&str>) -> Result<bool, PublishError> {
    match value.map(str::trim) {
        None | Some("") | Some("0") | Some("false") | Some("off") => Ok(false),
        Some("1") | Some("true") | Some("on") => Ok(true),
        Some(other) => Err(PublishError::BadEnv {
            var: PUBLISH_VAR,
            value: other.to_string(),
            accepted: "1, true or on to publish; 0, false, off or unset not to",
        }),
    }
}

/// Starts publishing the process-wide registry's pools when `GPUMEM_PUBLISH` says so, in
/// [`endpoint_dir`]; `Ok(None)` when it does not. Keep the publisher alive as long as the
/// pools should be visible.
pub fn publish_from_env() -> Result<Option<Publisher>, PublishError> {
    let value = std::env::var(PUBLISH_VAR).ok();
    if !publishing_requested(value.as_deref())? {
        return Ok(None);
    }
    Publisher::start(&endpoint_dir(), gpumem_pool::global_registry()).map(Some)
}

/// Asks the endpoint at `path` for its report: one line of JSON, all of it within
/// [`ANSWER_TIMEOUT`] and at most [`MAX_ANSWER_BYTES`] long.
pub fn ask(path: &Path) -> Result<PoolReport, PublishError> {
    let io = |e| PublishError::io(path, e);
    let deadline = Instant::now() + ANSWER_TIMEOUT;
    let mut stream = UnixStream::connect(path).map_err(io)?;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 64 << 10];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let late = || {
            io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "no complete answer within {} ms",
                    ANSWER_TIMEOUT.as_millis()
                ),
            ))
        };
        if left.is_zero() {
            return Err(late());
        }
        stream.set_read_timeout(Some(left)).map_err(io)?;
        let read = match stream.read(&mut chunk) {
            Ok(read) => read,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(late())
            }
            Err(e) => return Err(io(e)),
        };
        let newline = chunk[..read].iter().position(|&b| b == b'\n');
        answer.extend_from_slice(&chunk[..newline.unwrap_or(read)]);
        if answer.len() > MAX_ANSWER_BYTES {
            return Err(PublishError::BadReport {
                path: path.to_path_buf(),
                message: format!("the answer is longer than {} MiB", MAX_ANSWER_BYTES >> 20),
            });
        }
        if read == 0 || newline.is_some() {
            break;
        }
    }
    serde_json::from_slice(&answer).map_err(|e| PublishError::BadReport {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}
