#!/usr/bin/env bash
# CI for the `longshore-loader` Python package (import name `longshore`), on a machine without
# a GPU: the three steps in python/ci/, in order.
#   bash python/ci.sh
# * lint.sh: rustfmt and clippy of the extension crate (its own Cargo workspace);
# * wheel.sh: the abi3 manylinux2014 wheel (maturin + zig from PyPI, in the virtual environment
#   target/python-ci/venv), into target/python-ci/wheels;
# * test.sh: installs that wheel with numpy, pytest and torch (PyPI's build, used on the CPU)
#   into the same venv and runs the pytest suite (CUDA tests skip, saying why).
# Installing needs only wheel.sh: no rustfmt or clippy.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bash "$here/ci/lint.sh"
bash "$here/ci/wheel.sh"
bash "$here/ci/test.sh"
