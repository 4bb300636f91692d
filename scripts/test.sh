#!/usr/bin/env bash
# The whole gpumem test suite, as CI runs it: formatting, lints, then every test of every crate.
# Needs only a Rust toolchain (rustup); no GPU, no PyTorch.
set -euo pipefail
cd "$(dirname "$0")/.."
# A cold build on CI gains nothing from incremental compilation's bookkeeping.
if [ -n "${CI:-}" ]; then
  export CARGO_INCREMENTAL=0
fi
if command -v rustup >/dev/null 2>&1; then
  rustup component add rustfmt clippy >/dev/null 2>&1 || true
fi
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# Doc comments: every intra-doc link resolves (about 40 s on 2 cores after clippy).
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
# The Debian packages some tests need (Mesa's software Vulkan driver for the wgpu backend,
# Chromium for the HTML report's browser test, tmux, curl, compilers, python3). A test whose
# dependency is missing fails, naming the package, unless GPUMEM_SKIP_MISSING_TEST_DEPS=1
# (crates/gpumem-testkit/src/deps.rs); the installer fails when it cannot install one, and
# its own failure cases are checked first.
bash scripts/test-install-test-deps.sh
bash scripts/install-test-deps.sh
cargo test --workspace --locked
# The C library's panic tests need its test-only fault hook.
cargo test -p gpumem-capi --features fault-injection --locked
# The Python tools (gpumem-devtools) in a virtual environment, without PyTorch.
bash scripts/test-tools.sh -q
# The Python package (python/): the wheel built with maturin, installed in a fresh venv, pytest.
bash scripts/test-python.sh -q
