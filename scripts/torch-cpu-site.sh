# Sourced by scripts/test-torch-cpu.sh and scripts/bench-torch-trace.sh once they have checked
# $torch_python: builds gpumem's wheel as scripts/test-python.sh does and installs it into
# $site (target/torch-cpu-site) beside that PyTorch, a target folder that leaves the PyTorch
# environment untouched. Expects $repo (the repository root) and $torch_python.
build_venv="$repo/target/python-build-venv"
site="$repo/target/torch-cpu-site"
if ! "$build_venv/bin/python" -m maturin --version >/dev/null 2>&1; then
  python3 -m venv "$build_venv"
  "$build_venv/bin/python" -m pip install -q 'maturin>=1.7,<2'
fi
rm -rf "$repo/target/torch-cpu-wheel" "$site"
(cd "$repo/python" && "$build_venv/bin/python" -m maturin build --profile dev --strip \
  --out "$repo/target/torch-cpu-wheel" --quiet)
"$torch_python" -m pip install -q --no-deps --target "$site" "$repo"/target/torch-cpu-wheel/gpumem-*.whl
