#!/usr/bin/env bash
# The system packages the test suite needs: a Vulkan loader and Mesa's software Vulkan driver
# (lavapipe), so that the wgpu backend's tests (crates/gpumem-wgpu) find an adapter on a
# machine without a GPU; a headless Chromium, in which the HTML report's test
# (crates/gpumem-cli/tests/report_cli.rs) renders the page; tmux and curl, with which the
# gpumem-watch tests drive `gpumem top` and scrape `gpumem exporter`; C and C++ compilers
# (build-essential) for the C library's programs and the mock CUDA driver; python3, whose
# pickle module reads the snapshots gpumem writes. Linux only; quiet and idempotent when they
# are already there. Installs with apt-get (Debian/Ubuntu: mesa-vulkan-drivers, libvulkan1,
# chromium, tmux, curl, build-essential, python3) as root, or with sudo when it is available
# without a password.
#
# Exits non-zero, naming what is missing and the apt-get command, when it cannot install
# something (no apt-get, not root and no password-less sudo, apt-get failed, or still missing
# after it), because the tests that need it then fail too (gpumem_testkit::deps). With
# GPUMEM_SKIP_MISSING_TEST_DEPS=1, the one opt-out those tests honour, it says the same and
# exits 0: those tests then skip, each with a SKIPPED: line.
set -euo pipefail
say() { echo "install-test-deps.sh: $*" >&2; }

# Cannot install what is missing: an error, unless the user opted out of missing test
# dependencies.
cannot_install() {
  say "$@"
  if [ "${GPUMEM_SKIP_MISSING_TEST_DEPS:-}" = 1 ]; then
    say "GPUMEM_SKIP_MISSING_TEST_DEPS=1: going on; the tests that need them will be SKIPPED"
    exit 0
  fi
  say "the tests that need them fail without them; set GPUMEM_SKIP_MISSING_TEST_DEPS=1 to" \
    "skip those tests instead"
  exit 1
}

[ "$(uname -s)" = Linux ] || exit 0

have_loader() {
  ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1' && return 0
  local d
  for d in /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib /usr/local/lib; do
    [ -e "$d/libvulkan.so.1" ] && return 0
  done
  return 1
}

have_driver() {
  local d
  for d in /usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/local/share/vulkan/icd.d; do
    compgen -G "$d/*.json" >/dev/null && return 0
  done
  return 1
}

have_chromium() {
  command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1
}

packages=()
if ! have_loader || ! have_driver; then
  packages+=(mesa-vulkan-drivers libvulkan1)
fi
if ! have_chromium; then
  packages+=(chromium)
fi
for tool in tmux curl python3; do
  command -v "$tool" >/dev/null 2>&1 || packages+=("$tool")
done
have_compilers() {
  command -v "${CC:-cc}" >/dev/null 2>&1 && command -v "${CXX:-c++}" >/dev/null 2>&1
}
if ! have_compilers; then
  packages+=(build-essential)
fi
if [ ${#packages[@]} = 0 ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  cannot_install "missing ${packages[*]} and apt-get is not available; install a Vulkan" \
    "driver (e.g. Mesa's lavapipe) and the Vulkan loader for the wgpu tests, Chromium for the" \
    "report test, tmux and curl for the watch tests, C and C++ compilers for the C library" \
    "and mock-driver tests, python3 for the snapshot tests"
fi
sudo=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo="sudo -n"
  else
    cannot_install "missing test packages, and not root (nor sudo without a password);" \
      "as root: apt-get install ${packages[*]}"
  fi
fi
say "installing ${packages[*]} (Vulkan loader and Mesa's software driver for the wgpu tests," \
  "Chromium for the report test, tmux and curl for the watch tests, compilers for the C" \
  "library and mock-driver tests, python3 for the snapshot tests)"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! { $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
  && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${packages[@]}"; } >"$log" 2>&1; then
  cat "$log" >&2
  cannot_install "apt-get could not install ${packages[*]}"
fi
missing=()
{ have_loader && have_driver; } || missing+=("a Vulkan loader or driver")
have_chromium || missing+=(chromium)
for tool in tmux curl python3; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
have_compilers || missing+=("a C or C++ compiler")
if [ ${#missing[@]} != 0 ]; then
  cannot_install "installed ${packages[*]}, but still missing: ${missing[*]}"
fi
