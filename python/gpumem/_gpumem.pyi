"""Type hints of the extension module gpumem._gpumem (crates/gpumem-python)."""

class GpumemError(Exception):
    """An error from gpumem, with the Rust error's message."""

class OutOfMemoryError(GpumemError):
    """An allocation that does not fit, even after freeing the cache; the message explains."""

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
