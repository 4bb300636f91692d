"""Type hints of the extension module gpumem._gpumem (crates/gpumem-python)."""

class GpumemError(Exception):
    """An error from gpumem, with the Rust error's message."""

class OutOfMemoryError(GpumemError):
    """An allocation that does not fit, even after freeing the cache; the message explains."""

class PlanError(GpumemError):
    """A plan that cannot be made: an unknown model, GPU or setting, a value out of range."""

class TraceError(GpumemError):
    """A trace or snapshot that cannot be read: the message names the file and what it is not."""

class ReplayError(GpumemError):
    """A replay, tune, report or selftest that failed: a bad setting or an unreplayable trace."""

def plan(request: str) -> str:
    """The plan of request (a JSON object of settings by name) as gpumem plan --json."""

def column_sum_staging(rows: int, cols: int, multiprocessors: int,
                       threads_per_multiprocessor: int, amd: bool) -> list[int]:
    """The buffers CUDA's column sum of a contiguous rows × cols tensor allocates inside the
    kernel (the planner's rule): the fp32 partial sums and their semaphores; empty when one
    block sums the rows."""

def replay(source: str | bytes | None, *, format: str, device: int | None, name: str,
           policies: list[str], capacity: str | None, pytorch_alloc_conf: str | None,
           gpumem_policy_conf: str | None, smallest_capacity: bool) -> str:
    """source (a path, bytes, None: the bundled trace) replayed: gpumem replay --json."""
def tune(source: str | bytes, *, format: str, device: int | None, name: str,
         capacity: str | None, objective: str, top: int, max_replays: int | None) -> str:
    """PyTorch's allocator options searched for source: gpumem tune --json."""
def report(sources: list[str | bytes], *, format: str, device: int | None, policies: list[str],
           capacity: str | None, pytorch_alloc_conf: str | None,
           gpumem_policy_conf: str | None, tune: bool) -> str:
    """The HTML report of sources, as gpumem report writes it."""
def policies() -> str:
    """The built-in policies: gpumem policies --json."""
def devices() -> str:
    """Every device of every backend built in: gpumem devices --json."""
def selftest(*, backend: str, device: int, policies: list[str], trace: str | bytes | None,
             bytes_per_block: int | None) -> str:
    """The policies checked on a device with real bytes: gpumem selftest --json."""

def cli(argv: list[str]) -> int:
    """Runs the gpumem command with argv (program name first); returns its exit status."""
def alloc(size: int, device: int = 0, stream: int = 0) -> int:
    """Allocates size bytes on device for stream (a raw cudaStream_t); returns the address."""
def free(ptr: int, size: int | None = None, device: int = 0) -> None:
    """Frees ptr of device, checking the size when given."""
def memory_stats(device: int = 0) -> dict[str, int]:
    """device's statistics with torch.cuda.memory_stats()'s keys."""
def pool_status(device: int = 0) -> str:
    """device's pool summary (usage, limits, fragmentation)."""
def last_oom(device: int = 0) -> str | None:
    """The explanation of device's last OOM, or None."""
def empty_cache(device: int = 0) -> int:
    """Gives device's cached memory back; returns the bytes released."""
def reset_peak_stats(device: int = 0) -> None:
    """Sets every peak statistic of device to its current value."""
def set_history(capacity: int, device: int = 0) -> None:
    """Starts (capacity > 0 events) or stops (0) recording device's history."""
def policy(device: int = 0) -> str:
    """The policy device's pool runs."""
def snapshot(path: str, device: int = 0) -> None:
    """Writes device's pool as a PyTorch memory snapshot (pickle; JSON for .json)."""
def configure(policy: str | None = None, soft_limit: str | None = None,
              hard_limit: str | None = None, history: int | None = None) -> None:
    """Configures every pool, made and to be made; None leaves a setting as it is."""
def set_limits(device: int = 0, soft_limit: str | None = None,
               hard_limit: str | None = None) -> None:
    """Changes device's limits now; None leaves a limit, "none" removes it."""
def publish(dir: str | None = None) -> str:
    """Publishes this process's pools for gpumem top/diagnose/exporter; returns the socket."""
def pool_sample_json(device: int = 0) -> str:
    """What device's pool publishes about itself, as a JSON object."""
def diagnose_json(samples_json: str, pid: int | None = None) -> str:
    """gpumem diagnose's findings over a JSON list of samples, as a JSON list."""
