#!/usr/bin/env bash
# Installs the wheel that python/ci/wheel.sh built (target/python-ci/wheels) into the CI
# virtual environment with its `test` extra, and runs the pytest suite from the repository
# root (so that `import longshore` finds the installed wheel, not the source folder
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
# Uninstall first, so that a rebuilt wheel of the same version is installed again, with its
# dependencies resolved from its own metadata (the old distribution name too, from venvs
# made before the rename).
"$venv/bin/python" -m pip uninstall --quiet --yes longshore-loader longshore 2>/dev/null || true
"$venv/bin/python" -m pip install --quiet "${wheels[0]}[test]"
"$venv/bin/pytest" -q -rs -p no:cacheprovider python/tests
