#!/usr/bin/env bash
# Checks that scripts/install-test-deps.sh fails, naming what is missing, whenever it cannot
# install something, and that GPUMEM_SKIP_MISSING_TEST_DEPS=1 (the one opt-out) lets it go on.
# It runs the script on a fake PATH that has the basic tools but none of the test
# dependencies, with fake apt-get/id/sudo where a case needs them; it installs nothing.
# Linux only (the script it checks is); a second or so.
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(uname -s)" = Linux ] || { echo "test-install-test-deps.sh: Linux only, not run" >&2; exit 0; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0

# A PATH holding only what install-test-deps.sh itself runs.
fake_path() {
  local dir="$work/$1"
  mkdir -p "$dir"
  local tool
  for tool in uname id grep cat mktemp rm env; do
    ln -sf "$(command -v "$tool")" "$dir/$tool"
  done
  echo "$dir"
}

# fake_tool DIR NAME BODY: an executable shell script DIR/NAME running BODY.
fake_tool() {
  printf '#!%s\n%s\n' "$BASH" "$3" >"$1/$2"
  chmod +x "$1/$2"
}

# expect NAME STATUS TEXT DIR [VAR=VALUE...]: runs the script on PATH=DIR and checks its exit
# status and that TEXT is in what it printed.
expect() {
  local name="$1" want="$2" text="$3" dir="$4"
  shift 4
  local status=0
  env -i PATH="$dir" HOME="$work" "$@" "$BASH" scripts/install-test-deps.sh \
    >"$work/out" 2>&1 || status=$?
  if [ "$status" != "$want" ] || ! grep -qF -- "$text" "$work/out"; then
    echo "FAIL: $name: exit $status (want $want), output without \"$text\":" >&2
    cat "$work/out" >&2
    failures=$((failures + 1))
  else
    echo "ok: $name"
  fi
}

# No way to install at all.
bare="$(fake_path bare)"
expect "no apt-get: fails naming the packages" 1 "tmux curl python3 build-essential" "$bare"
expect "no apt-get, opted out: goes on" 0 "will be SKIPPED" "$bare" \
  GPUMEM_SKIP_MISSING_TEST_DEPS=1
expect "an opt-out other than 1 is none" 1 "set GPUMEM_SKIP_MISSING_TEST_DEPS=1" "$bare" \
  GPUMEM_SKIP_MISSING_TEST_DEPS=true

# apt-get there, but not root and no sudo.
user="$(fake_path user)"
fake_tool "$user" apt-get 'exit 0'
fake_tool "$user" id 'echo 1000'
expect "not root, no sudo: fails with the apt-get command" 1 "as root: apt-get install" "$user"

# Root, but apt-get fails.
broken="$(fake_path broken)"
fake_tool "$broken" apt-get 'echo "E: Unable to locate package" >&2; exit 100'
fake_tool "$broken" id 'echo 0'
expect "apt-get fails: fails with its output" 1 "E: Unable to locate package" "$broken"

# Root, apt-get says it worked, yet the tools are still missing.
liar="$(fake_path liar)"
fake_tool "$liar" apt-get 'exit 0'
fake_tool "$liar" id 'echo 0'
expect "still missing after apt-get: fails naming them" 1 "still missing" "$liar"

if [ "$failures" != 0 ]; then
  echo "test-install-test-deps.sh: $failures case(s) failed" >&2
  exit 1
fi
