#!/usr/bin/env bash
# The system packages the test suite needs: a Vulkan loader and Mesa's software Vulkan driver
# (lavapipe), so that the wgpu backend's tests (crates/gpumem-wgpu) find an adapter on a
# machine without a GPU; a headless Chromium, in which the HTML report's test
# (crates/gpumem-cli/tests/report_cli.rs) renders the page; tmux and curl, with which the
# gpumem-watch tests drive `gpumem top` and scrape `gpumem exporter`. Linux only; quiet and
# idempotent when they are already there. Installs with apt-get (Debian/Ubuntu:
# mesa-vulkan-drivers, libvulkan1, chromium, tmux, curl) as root, or with sudo when it is
# available without a password. Elsewhere it only says what is missing: the tests
# then skip, or fail under CI=true, with a message naming what to install.
set -euo pipefail
say() { echo "install-test-deps.sh: $*" >&2; }

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
for tool in tmux curl; do
  command -v "$tool" >/dev/null 2>&1 || packages+=("$tool")
done
if [ ${#packages[@]} = 0 ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  say "missing ${packages[*]} and apt-get is not available; install a Vulkan driver" \
    "(e.g. Mesa's lavapipe) and the Vulkan loader for the wgpu tests, Chromium for the report" \
    "test, tmux and curl for the watch tests"
  exit 0
fi
sudo=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo="sudo -n"
  else
    say "missing test packages; as root: apt-get install ${packages[*]}"
    exit 0
  fi
fi
say "installing ${packages[*]} (Vulkan loader and Mesa's software driver for the wgpu tests," \
  "Chromium for the report test, tmux and curl for the watch tests)"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! { $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
  && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${packages[@]}"; } >"$log" 2>&1; then
  cat "$log" >&2
  say "apt-get could not install ${packages[*]}"
  exit 1
fi
missing=()
{ have_loader && have_driver; } || missing+=("a Vulkan loader or driver")
have_chromium || missing+=(chromium)
for tool in tmux curl; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ ${#missing[@]} != 0 ]; then
  say "installed ${packages[*]}, but still missing: ${missing[*]}"
  exit 1
fi
