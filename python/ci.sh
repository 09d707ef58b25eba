#!/usr/bin/env bash
# CI for the `longshore-loader` Python package (import name `longshore`), on a machine without a GPU:
#   bash python/ci.sh
# makes a virtual environment under target/python-ci, installs maturin, pytest and numpy from
# PyPI, checks formatting and lints of the extension crate (its own Cargo workspace), builds the
# abi3 wheel with maturin, installs it and runs the pytest suite (CUDA tests skip, saying why;
# LONGSHORE_REQUIRE_CUDA=1 makes them fail instead).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
export CARGO_TERM_COLOR=never
# Share the workspace's target folder: the longshore crates are built once.
export CARGO_TARGET_DIR="$root/target"
ci="$root/target/python-ci"
venv="$ci/venv"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet "maturin>=1.5,<2" "pytest>=7" "numpy>=1.22"

cargo fmt --manifest-path python/Cargo.toml -- --check
cargo clippy --manifest-path python/Cargo.toml --all-targets -- -D warnings

rm -rf "$ci/wheels"
(cd python && "$venv/bin/maturin" build --release --interpreter "$venv/bin/python" --out "$ci/wheels")
"$venv/bin/python" -m pip install --quiet --force-reinstall --no-deps "$ci"/wheels/longshore_loader-*.whl
# From the repository root, so that `import longshore` finds the installed wheel, not the
# source folder python/longshore.
"$venv/bin/pytest" -q -p no:cacheprovider python/tests
