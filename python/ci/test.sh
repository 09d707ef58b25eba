#!/usr/bin/env bash
# Installs the wheel that python/ci/wheel.sh built (target/python-ci/wheels) into the CI
# virtual environment with torch and its `test` extra, and runs the pytest suite from the
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
# build: about 2.8 GB of wheels (torch, triton, the nvidia-* libraries) unpacking to 5 GB, and
# it runs on the CPU without a GPU. `import torch` loads libcudnn, libcublas, libnccl... from
# the nvidia-* wheels, so those stay; triton (1 GB) is torch.compile's GPU code generator,
# which nothing here imports, so it is left out. CI's machine may have little free disk (a run
# failed with ENOSPC in this step), so the set pip resolves is installed one distribution at a
# time, without dependencies: at most one wheel is on disk beside what is installed, where one
# `pip install` would download all 2.8 GB before unpacking any. The range: the package's floor
# (2.1) up to the newest release tested (2.15.0, on CPython 3.11), so that a new release does
# not change CI unseen. It stays in the venv under target/, so a rerun in the same checkout
# skips it.
torch_spec="torch>=2.1,<2.16"
# torchvision too (8 MB beside torch): the conformance suite runs a user's torchvision
# ImageFolder with torchvision's transforms through longshore in a fresh interpreter.
if ! "$venv/bin/python" -c 'import torch, torchvision' 2>/dev/null; then
    mapfile -t torch_set < <(
        "$venv/bin/python" -m pip install --quiet --dry-run --ignore-installed --report - \
            "$torch_spec" torchvision | "$venv/bin/python" -c '
import json, sys
for item in json.load(sys.stdin)["install"]:
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    if name.lower() != "triton":
        print(f"{name}=={version}")'
    )
    if [[ ! " ${torch_set[*]} " =~ " torch==" ]]; then
        echo "pip resolved no torch for $torch_spec: ${torch_set[*]}" >&2
        exit 1
    fi
    for dist in "${torch_set[@]}"; do
        "$venv/bin/python" -m pip install --quiet --no-deps --no-warn-conflicts "$dist"
    done
fi
# Uninstall first, so that a rebuilt wheel of the same version is installed again, with its
# dependencies resolved from its own metadata (the old distribution name too, from venvs
# made before the rename). Its `test` extra, not `torch`: pip would resolve torch's own
# requirements again and fetch triton.
"$venv/bin/python" -m pip uninstall --quiet --yes longshore-loader longshore 2>/dev/null || true
"$venv/bin/python" -m pip install --quiet --no-warn-conflicts "${wheels[0]}[test]"
"$venv/bin/python" -c 'import longshore, numpy, torch; print("longshore", longshore.__version__, "numpy", numpy.__version__, "torch", torch.__version__)'
"$venv/bin/pytest" -q -rs -p no:cacheprovider python/tests
