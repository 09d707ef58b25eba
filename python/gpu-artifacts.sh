#!/usr/bin/env bash
# Builds what the GPU machine needs to test and benchmark the Python package, into
# gpu-python/ (git-ignored; about 3 MiB, carried with the working tree):
#   gpu-python/wheels/   the longshore wheel (abi3, manylinux2014: glibc >= 2.17, so it installs
#                        whatever glibc the GPU machine has) + pytest and its pure-Python deps
#   gpu-python/tests/    the pytest suite
#   gpu-python/bench/    xtask/python/: python_bench.py, torch_per_batch.py (per-batch cost of
#                        the torch handoff), pump_timings.py, per_batch.py
#   gpu-python/run.sh    what to run there
# The GPU machine has Python 3.12, torch and numpy but no registry: everything else travels.
# Needs PyPI here (maturin, ziglang for the manylinux2014 link, pytest to download).
#
#   bash python/gpu-artifacts.sh
# On the GPU machine, from the project root:
#   bash gpu-python/run.sh            # pytest with LONGSHORE_REQUIRE_CUDA=1, then the benchmarks
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
out="$root/gpu-python"
venv="$root/target/python-ci/venv"
if [ ! -x "$venv/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet "maturin>=1.5,<2" ziglang
rm -rf "$out"
mkdir -p "$out/wheels"
# Zig links against glibc 2.17 symbols: a manylinux2014 wheel, checked by maturin.
(cd python && PATH="$venv/bin:$PATH" CARGO_TARGET_DIR="$root/target/zig" \
    maturin build --release --zig --compatibility manylinux2014 \
    --interpreter "$venv/bin/python" --out "$out/wheels")
# pytest for CPython 3.12 on any platform (pure Python wheels only).
"$venv/bin/python" -m pip download --quiet --dest "$out/wheels" --only-binary=:all: \
    --python-version 3.12 --implementation cp --platform any pytest
cp -r python/tests "$out/tests"
rm -rf "$out/tests/__pycache__"
mkdir -p "$out/bench" && cp xtask/python/python_bench.py xtask/python/torch_per_batch.py xtask/python/pump_timings.py \
    xtask/python/per_batch.py "$out/bench/"
cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# On the GPU machine (Python 3.12 + torch + numpy, no registry), from the project root:
#   bash gpu-python/run.sh [--no-bench]
# Installs the wheel and pytest from gpu-python/wheels into a private folder on PYTHONPATH, beside the system's
# torch and numpy, runs the pytest suite with CUDA required, then the python benchmark and the
# per-batch cost of the torch handoff (RUST_TABULAR_SPS=<the Rust loader's tabular samples/s>
# adds the ratio to it).
# Logs and results go to $OUT (the device tool's folder) or ./gpu-out.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out=${OUT:-gpu-out}; mkdir -p "$out"; out="$(cd "$out" && pwd)"
# Not a venv: torch may live in the user site-packages, which a venv hides even with
# --system-site-packages. The wheels go to a private folder on PYTHONPATH instead.
site="${TMPDIR:-/tmp}/longshore-gpu-site"
python3 -m pip install --quiet --no-index --no-deps --no-compile --upgrade --target "$site" "$here"/wheels/*.whl
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
py=python3
"$py" -c "import longshore, torch; print('longshore', longshore.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available(), longshore.cuda_status())" | tee "$out/python-versions.txt"
cd "$out"
LONGSHORE_REQUIRE_CUDA=1 "$py" -m pytest -q -p no:cacheprovider -rxs "$here/tests" 2>&1 | tee "$out/pytest.log"
rc=${PIPESTATUS[0]}
if [ "${1:-}" != "--no-bench" ]; then
    # The Rust sections' results.json, if xtask bench ran first, for the Python/Rust ratio.
    rust=""
    for r in "$here/../gpu-out/results.json" "$out/results.json" "$here/../target/longshore-bench/results.json"; do
        [ -f "$r" ] && rust="--rust-results $r" && break
    done
    "$py" "$here/bench/python_bench.py" --data-dir "${DATA_DIR:-/tmp/longshore-bench-data}" \
        --out "$out/python.json" $rust 2>&1 | tee "$out/python-bench.log"
    "$py" "$here/bench/torch_per_batch.py" --out "$out/torch-per-batch.json" \
        ${RUST_TABULAR_SPS:+--rust-sps "$RUST_TABULAR_SPS"} 2>&1 | tee "$out/torch-per-batch.log"
    "$py" "$here/bench/torch_per_batch.py" --pinned --workers 4 --out "$out/torch-per-batch-pinned.json" \
        2>&1 | tee "$out/torch-per-batch-pinned.log"
fi
exit $rc
RUN
chmod +x "$out/run.sh"
du -sh "$out"; ls "$out/wheels"
