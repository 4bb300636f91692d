#!/usr/bin/env bash
# The Python tests of tools/ (the gpumem-devtools package), without PyTorch: makes a virtual
# environment (target/tools-venv), installs the package with its [test] extra (pytest) and runs
# pytest there. Works from any directory; exits non-zero when a test fails or none ran.
# Arguments go to pytest (e.g. -k convert). Environment: PYTHON (default python3, >= 3.10),
# GPUMEM_TOOLS_VENV (default <repo>/target/tools-venv). Tests that need PyTorch are skipped;
# tools/README.md says how to run them.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${GPUMEM_TOOLS_VENV:-$repo/target/tools-venv}"
python="${PYTHON:-python3}"
say() { echo "test-tools.sh: $*" >&2; }

if ! command -v "$python" >/dev/null 2>&1; then
  say "$python not found (Python >= 3.10 is needed)"
  exit 1
fi
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  say "$("$python" --version 2>&1) is too old: Python >= 3.10 is needed"
  exit 1
fi

venv_ready() { [ -x "$venv/bin/python" ] && "$venv/bin/python" -m pip --version >/dev/null 2>&1; }

if ! venv_ready; then
  # Debian and Ubuntu ship venv's ensurepip separately, in python3-venv / python3.X-venv.
  if ! "$python" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    ver="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    sudo=""
    if [ "$(id -u)" != 0 ]; then
      if ! command -v sudo >/dev/null 2>&1; then
        say "$python -m venv needs python$ver-venv; install it (as root: apt-get install python$ver-venv)"
        exit 1
      fi
      sudo="sudo -n"
    fi
    if command -v apt-get >/dev/null 2>&1; then
      say "installing python$ver-venv (needed by $python -m venv)"
      $sudo apt-get update -qq
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "python$ver-venv" \
        || DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-venv
    else
      say "$python -m venv is not usable (no ensurepip) and apt-get is not available"
      exit 1
    fi
  fi
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv"
fi

pip=("$venv/bin/python" -m pip --disable-pip-version-check --quiet)
# The build backend goes into the venv once, so later runs install without the network.
"$venv/bin/python" -c 'import hatchling' >/dev/null 2>&1 || "${pip[@]}" install 'hatchling>=1.18'
"${pip[@]}" install --no-build-isolation --force-reinstall --no-deps "$repo/tools"
"${pip[@]}" install --no-build-isolation "$repo/tools[test]"

cd "$repo/tools"
status=0
"$venv/bin/python" -m pytest -p no:cacheprovider "$@" || status=$?
if [ "$status" -eq 5 ]; then
  say "pytest collected no tests"
  exit 1
fi
exit "$status"
