#!/usr/bin/env bash
# The closing device calls of a session, in two parts that each fit one 10-minute call:
#   bash scripts/gpu-final.sh a   tests (LONGSHORE_REQUIRE_CUDA=1), pytest on the GPU, and the
#                                 nvJPEG pipelines (lanes 1,2,4) with the device stage's timings
#   bash scripts/gpu-final.sh b   cargo xtask bench's limits/loader/scaling/roofline sections,
#                                 the scaling curve at 4x the image epoch, the Python package's
#                                 bench on the same shapes (8192 images, 2M tabular rows)
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
  OUT="$R" bash gpu-python/run.sh --no-bench > "$R/pytest-run.log" 2>&1; tail -4 "$R/pytest-run.log"
  LONGSHORE_REQUIRE_CUDA=1 timeout 240 .gpu/bin/jpeg-bench --decode nvjpeg --no-pytorch --workers 16 \
    --nvjpeg-lanes 1,2,4 --epochs 2 --out "$R/jpeg" --data-dir /tmp/jdata > "$R/jpeg.log" 2>&1
  grep "^jpeg: longshore" "$R/jpeg.log"
  ;;
b)
  # Test binaries rebuilt after part a (gpu-mini/t.tar.xz, optional): run them first.
  if [ -f gpu-mini/t.tar.xz ]; then
    python3 -c "import tarfile; tarfile.open('gpu-mini/t.tar.xz').extractall('/tmp/rerun')"
    for t in /tmp/rerun/t/*; do
      LONGSHORE_REQUIRE_CUDA=1 "$t" > "$R/rerun-$(basename "$t").log" 2>&1 && echo "rerun ok: $(basename "$t")" || echo "rerun FAILED: $(basename "$t")"
    done
  fi
  timeout 300 .gpu/bin/longshore-bench --only limits,loader,scaling,roofline --out "$R/bench" \
    --data-dir /tmp/bdata > "$R/bench.log" 2>&1; echo "bench exit $?"
  grep -A12 "^== scaling\|^== roofline\|tuner pick" "$R/bench.log" | head -60
  timeout 120 .gpu/bin/longshore-bench --only scaling --image-rows 32768 --out "$R/scaling-long" \
    --data-dir /tmp/bdata-long > "$R/scaling-long.log" 2>&1; echo "scaling-long exit $?"
  grep -A10 "^== scaling" "$R/scaling-long.log" | head -14
  rm -rf /tmp/bdata-long
  timeout 230 python3 gpu-python/bench/python_bench.py --data-dir /tmp/pdata --images 8192 \
    --tabular 2000000 --workers 4,8,16 --rust-results "$R/bench/results.json" --out "$R/python.json" \
    > "$R/python-bench.log" 2>&1; echo "python bench exit $?"; tail -8 "$R/python-bench.log"
  ;;
esac
rm -rf "$R"/*/data
tar -czf "$out/$part.tar.gz" -C "$R" .
