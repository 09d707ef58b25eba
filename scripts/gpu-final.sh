#!/usr/bin/env bash
# The closing device calls of a session, in two parts that each fit one 10-minute call:
#   bash scripts/gpu-final.sh a   tests (LONGSHORE_REQUIRE_CUDA=1), the nvJPEG ceiling and
#                                 pipelines with the device stage's phases, CPU decoding at
#                                 16/32 workers, torchvision at 16 workers
#   bash scripts/gpu-final.sh b   pytest on the GPU, cargo xtask bench's limits/loader/scaling/roofline sections,
#                                 the scaling curve with the next-epoch prefetch off, the
#                                 Python package's bench on the same shapes
#                                 (8192 images, 2M tabular rows) and the epoch pump's timings
# Needs gpu-pack/gpu.tar.xz (scripts/gpu-pack.sh) and gpu-python/ (python/gpu-artifacts.sh).
# Results are packed into $OUT/<part>.tar.gz (the device returns few files).
set -u
part=${1:?a or b}
out=${OUT:-gpu-out}; mkdir -p "$out"
R=/tmp/final-$part; rm -rf "$R"; mkdir -p "$R"
[ -x .gpu/bin/longshore-bench ] || python3 -c "import tarfile; tarfile.open('gpu-pack/gpu.tar.xz').extractall()"
site=/tmp/longshore-gpu-site
python3 -m pip install --quiet --no-index --no-deps --no-compile --upgrade --target "$site" gpu-python/wheels/*.whl
export PYTHONPATH="$site"
nvidia-smi -L | tee "$R/gpu.txt"
case "$part" in
a)
  SANITIZER_SECS=${SANITIZER_SECS:-0} OUT="$R" bash scripts/gpu-verify.sh 2>&1 | tail -8
  # nvJPEG: the hardware decoder's ceiling and the pipeline with its stage and epoch phases;
  # CPU decoding at 16/32 workers (the next-epoch prefetch covers each epoch's tail); PyTorch
  # + torchvision at its best worker count of earlier runs (16), in the same call.
  LONGSHORE_REQUIRE_CUDA=1 timeout 300 .gpu/bin/jpeg-bench --decode both --torch-workers 16 --workers 16,32 \
    --nvjpeg-lanes 1 --nvjpeg-ceiling --epochs 2 --out "$R/jpeg" --data-dir /tmp/jdata > "$R/jpeg.log" 2>&1
  echo "jpeg exit $?"; grep "^jpeg: longshore\|^jpeg: nvjpeg ceiling [a-z]*:" "$R/jpeg.log"
  ;;
b)
  # Test binaries rebuilt after part a (gpu-mini/t.tar.xz, optional): run them first.
  if [ -f gpu-mini/t.tar.xz ]; then
    python3 -c "import tarfile; tarfile.open('gpu-mini/t.tar.xz').extractall('/tmp/rerun')"
    for t in /tmp/rerun/t/*; do
      LONGSHORE_REQUIRE_CUDA=1 "$t" > "$R/rerun-$(basename "$t").log" 2>&1 && echo "rerun ok: $(basename "$t")" || echo "rerun FAILED: $(basename "$t")"
    done
  fi
  OUT="$R" timeout 120 bash gpu-python/run.sh --no-bench > "$R/pytest-run.log" 2>&1; tail -4 "$R/pytest-run.log"
  timeout 280 .gpu/bin/longshore-bench --only limits,loader,scaling,roofline --out "$R/bench" \
    --data-dir /tmp/bdata > "$R/bench.log" 2>&1; echo "bench exit $?"
  grep -A12 "^== scaling\|^== roofline\|tuner pick" "$R/bench.log" | head -60
  # The same scaling curve with the next-epoch prefetch off, in the same call.
  LONGSHORE_BENCH_NEXT_EPOCH=off timeout 90 .gpu/bin/longshore-bench --only scaling --out "$R/scaling-off" \
    --data-dir /tmp/bdata > "$R/scaling-off.log" 2>&1; echo "scaling (next-epoch off) exit $?"
  grep -A12 "^== scaling" "$R/scaling-off.log" | grep -v "^tabular  " | head -14
  timeout 150 python3 gpu-python/bench/python_bench.py --data-dir /tmp/pdata --images 8192 \
    --tabular 2000000 --workers 4,8 --rust-results "$R/bench/results.json" --out "$R/python.json" \
    > "$R/python-bench.log" 2>&1; echo "python bench exit $?"; tail -8 "$R/python-bench.log"
  LONGSHORE_EPOCH_TIMINGS=1 timeout 90 python3 gpu-python/bench/pump_timings.py --device cuda \
    --workers 4,8 --rows 1048576 --epochs 3 --repeats 3 > "$R/pump.log" 2>&1; echo "pump exit $?"; tail -24 "$R/pump.log"
  ;;
esac
rm -rf "$R"/*/data
tar -czf "$out/$part.tar.gz" -C "$R" .
