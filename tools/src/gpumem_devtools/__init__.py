"""gpumem-devtools: the gpumem repository's tooling around real PyTorch runs.

Produces gpumem's committed test data: `capture_trace` (allocation traces, gpumem-trace
v1), `convert_trace` (PyTorch snapshot pickle / RMM CSV fixtures from a trace) and
`measure_peak` (byte-exact peak allocated bytes of training / inference steps).

Not the user-facing `gpumem` Python package. Only `tracefile`, `configs`, `settings`,
`convert_trace` and the command-line parsing work without PyTorch; `models`, `recorder`
and `workloads` need the `[torch]` extra (torch, transformers, torchvision).
"""

__version__ = "0.1.0"
