#!/usr/bin/env bash
# Installs the wheel that python/ci/wheel.sh built (target/python-ci/wheels) into the CI
# virtual environment with its `torch` and `test` extras, and runs the pytest suite from the
# repository root (so that `import longshore` finds the installed wheel, not the source folder
# python/longshore). CUDA tests skip, saying why (-rs); LONGSHORE_REQUIRE_CUDA=1 makes
# them fail instead.
#   bash python/ci/test.sh
source "$(dirname "$0")/env.sh"
ensure_venv
shopt -s nullglob
wheels=("$ci"/wheels/longshore_loader-*.whl)
if [ "${#wheels[@]}" -ne 1 ]; then
    echo "expected one wheel in $ci/wheels (bash python/ci/wheel.sh), found ${#wheels[@]}" >&2
    exit 1
fi
# torch, so that the torch tests run (on the CPU). From PyPI: the CPU-only builds live on
# another index, which CI's machine does not reach. PyPI's Linux x86_64 torch is the CUDA
# build, 2.8 GB with the nvidia-* and triton wheels it requires (about 35 s to download and
# 45 s to install here), and it runs on the CPU without a GPU. `--no-deps` saves nothing that
# works: `import torch` loads libcudnn, libcublas, libnccl... from those wheels. It stays in
# the venv under target/, so a rerun in the same checkout skips it; CI's fresh clone installs
# it again. The range: the package's floor (2.1) up to the newest release tested (2.15.0, on
# CPython 3.11), so that a new release does not change CI unseen.
#
# Uninstall first, so that a rebuilt wheel of the same version is installed again, with its
# dependencies resolved from its own metadata (the old distribution name too, from venvs
# made before the rename).
"$venv/bin/python" -m pip uninstall --quiet --yes longshore-loader longshore 2>/dev/null || true
"$venv/bin/python" -m pip install --quiet "${wheels[0]}[torch,test]" "torch>=2.1,<2.16"
"$venv/bin/python" -c 'import longshore, numpy, torch; print("longshore", longshore.__version__, "numpy", numpy.__version__, "torch", torch.__version__)'
"$venv/bin/pytest" -q -rs -p no:cacheprovider python/tests
