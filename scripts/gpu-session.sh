#!/usr/bin/env bash
# Two device calls that each fit 10 minutes, for the open targets of issues 15, 16 and 14:
#   bash scripts/gpu-session.sh jpeg    issue 15 in one run: nvJPEG with CPU shares
#                                       0/0.1/0.2/0.3 of the JPEGs decoded by the workers beside
#                                       the GPU's engines, longshore CPU decoding, PyTorch +
#                                       torchvision over workers 8/16/32 x pin_memory, and
#                                       torchvision.io.decode_jpeg(device="cuda") + resize
#   bash scripts/gpu-session.sh lanes   nvJPEG on 1, 2 and 4 device-stage threads (lanes now kept
#                                       across epochs), with CPU shares 0 and 0.1; the ceiling on
#                                       1, 2 and 4 threads; CPU decoding and PyTorch (16/32
#                                       workers) in the same run
#   bash scripts/gpu-session.sh scaling the Rust loader's limits, scaling and roofline sections
#                                       (issue 14's curve, repeated)
#   bash scripts/gpu-session.sh hybrid  (run at commit d212009, with the experimental
#                                       NvjpegDecoder::cuda_share, since removed) nvJPEG's
#                                       GPU_HYBRID share beside the engines, PyTorch at 16/32
#                                       workers; the nvJPEG and DLPack CUDA tests; pytest
#   bash scripts/gpu-session.sh python  pytest on the GPU; the pump's timings and the Python bench
#                                       (against the same loader driven in Rust, in the same
#                                       process) with small batches' copies enqueued by __next__
#                                       and by the epoch thread; the bench with PyTorch
#   bash scripts/gpu-session.sh priority  the Python bench with the workers at normal and
#                                       background priority, the Rust side in the same process
#   bash scripts/gpu-session.sh tests   every bundled test with CUDA required, pytest on the
#                                       GPU, the Rust loader's limits/loader/scaling sections,
#                                       the Python bench on the same shapes, the pump's timings
# Needs gpu-pack/gpu.tar.xz (scripts/gpu-pack.sh) and gpu-python/ (python/gpu-artifacts.sh).
# Results are packed into $OUT/<part>.tar.gz.
set -u
part=${1:?jpeg or tests}
out=${OUT:-gpu-out}; mkdir -p "$out"
R=/tmp/session-$part
# The python part writes straight into $OUT, so a call cut off at its limit still returns
# what it measured.
case "$part" in python | priority) R="$(cd "$out" && pwd)/session-$part" ;; esac
rm -rf "$R"; mkdir -p "$R"
[ -x .gpu/bin/longshore-bench ] || python3 -c "import tarfile; tarfile.open('gpu-pack/gpu.tar.xz').extractall()"
{ nvidia-smi -L; nproc; date -u; } | tee "$R/machine.txt"
case "$part" in
jpeg)
  LONGSHORE_REQUIRE_CUDA=1 timeout 520 .gpu/bin/jpeg-bench --decode both --workers 16,32 \
    --cpu-share 0,0.1,0.2,0.3 --torch-workers 8,16,32 --nvjpeg-ceiling --epochs 2 \
    --out "$R/jpeg" --data-dir /tmp/jdata > "$R/jpeg.log" 2>&1
  echo "jpeg exit $?"
  grep "^jpeg: longshore\|^jpeg: nvjpeg ceiling [a-z_]*:\|^jpeg: pytorch\|torchvision" "$R/jpeg.log" \
    | sed 's/, decoded {.*//' | head -60
  tail -30 "$R/jpeg/jpeg.md" 2>/dev/null
  ;;
lanes)
  LONGSHORE_REQUIRE_CUDA=1 timeout 520 .gpu/bin/jpeg-bench --decode both --workers 16,32 \
    --nvjpeg-lanes 1,2,4 --cpu-share 0,0.1 --torch-workers 16,32 --nvjpeg-ceiling --epochs 2 \
    --out "$R/jpeg" --data-dir /tmp/jdata > "$R/jpeg.log" 2>&1
  echo "jpeg exit $?"
  grep "^jpeg: longshore\|^jpeg: nvjpeg ceiling [a-z_0-9]*:\|^jpeg: pytorch\|torchvision" "$R/jpeg.log" \
    | sed 's/, decoded {.*//' | head -60
  tail -24 "$R/jpeg/jpeg.md" 2>/dev/null
  ;;
hybrid)
  for t in .gpu/tests/nvjpeg_decode-* .gpu/tests/nvjpeg_routes-* .gpu/tests/export_cuda-*; do
    LONGSHORE_REQUIRE_CUDA=1 timeout 60 "$t" > "$R/$(basename "$t").log" 2>&1 \
      && echo "ok: $(basename "$t") $(grep -h '^test result' "$R/$(basename "$t").log")" \
      || { echo "FAILED: $(basename "$t")"; grep -h -A8 'panicked\|^failures' "$R/$(basename "$t").log" | head -30; }
  done
  site=/tmp/longshore-gpu-site
  python3 -m pip install --quiet --no-index --no-deps --no-compile --upgrade --target "$site" gpu-python/wheels/*.whl
  export PYTHONPATH="$site"
  OUT="$R" timeout 60 bash gpu-python/run.sh --no-bench > "$R/pytest-run.log" 2>&1; tail -2 "$R/pytest-run.log"
  LONGSHORE_REQUIRE_CUDA=1 timeout 300 .gpu/bin/jpeg-bench --decode nvjpeg --workers 16 \
    --torch-workers 16,32 --nvjpeg-ceiling --epochs 2 \
    --out "$R/jpeg" --data-dir /tmp/jdata > "$R/jpeg.log" 2>&1
  echo "jpeg exit $?"
  grep "^jpeg: longshore\|^jpeg: nvjpeg ceiling [a-z_0-9]*:\|^jpeg: pytorch" "$R/jpeg.log" \
    | sed 's/, device stage.*//' | head -40
  grep "longshore / PyTorch" "$R/jpeg/jpeg.md"
  timeout 150 .gpu/bin/longshore-bench --only loader --out "$R/bench" \
    --data-dir /tmp/bdata > "$R/bench.log" 2>&1; echo "bench exit $?"
  timeout 110 python3 gpu-python/bench/python_bench.py --data-dir /tmp/pdata --images 8192 \
    --tabular 2000000 --workers 4,8,16 --rust-results "$R/bench/results.json" --out "$R/python.json" \
    > "$R/python-bench.log" 2>&1; echo "python bench exit $?"; tail -6 "$R/python-bench.log"
  ;;
scaling)
  timeout 540 .gpu/bin/longshore-bench --only limits,scaling,roofline --out "$R/bench" \
    --data-dir /tmp/bdata > "$R/bench.log" 2>&1; echo "bench exit $?"
  grep -A14 "^== scaling\|^== roofline" "$R/bench.log" | head -60
  ;;
python)
  # Needs only gpu-python/ (python/gpu-artifacts.sh).
  site=/tmp/longshore-gpu-site
  python3 -m pip install --quiet --no-index --no-deps --no-compile --upgrade --target "$site" gpu-python/wheels/*.whl
  export PYTHONPATH="$site"
  OUT="$R" timeout 110 bash gpu-python/run.sh --no-bench > "$R/pytest-run.log" 2>&1; tail -4 "$R/pytest-run.log"
  LONGSHORE_EPOCH_TIMINGS=1 timeout 80 python3 gpu-python/bench/pump_timings.py --device cuda \
    --workers 4,8 --rows 1048576 --epochs 3 --repeats 3 --copies split,pump > "$R/pump.log" 2>&1
  echo "pump exit $?"; tail -10 "$R/pump.log"
  for mode in split pump; do
    LONGSHORE_UPLOAD_IN_PUMP=$([ $mode = pump ] && echo 1 || echo 0) timeout 120 python3 \
      gpu-python/bench/python_bench.py --data-dir /tmp/pdata --images 8192 --tabular 2000000 \
      --workers 4,8,16 --rounds 3 --no-torch --out "$R/python-$mode.json" \
      > "$R/python-$mode.log" 2>&1; echo "python bench ($mode) exit $?"; grep "^|" "$R/python-$mode.log"
  done
  timeout 130 python3 gpu-python/bench/python_bench.py --data-dir /tmp/pdata --images 8192 \
    --tabular 2000000 --workers 8,16 --rounds 1 --out "$R/python-torch.json" \
    > "$R/python-torch.log" 2>&1; echo "python bench (torch) exit $?"; grep "^|" "$R/python-torch.log"
  ;;
priority)
  # Needs only gpu-python/. The Python package with its workers at normal and background
  # priority (DataLoader(worker_priority=...)), the Rust side in the same process.
  site=/tmp/longshore-gpu-site
  python3 -m pip install --quiet --no-index --no-deps --no-compile --upgrade --target "$site" gpu-python/wheels/*.whl
  export PYTHONPATH="$site"
  OUT="$R" timeout 100 bash gpu-python/run.sh --no-bench > "$R/pytest-run.log" 2>&1; tail -3 "$R/pytest-run.log"
  timeout 150 python3 gpu-python/bench/python_bench.py --data-dir /tmp/pdata --images 8192 \
    --tabular 2000000 --workloads tabular --workers 8,12,16 --worker-priority normal,background \
    --rounds 3 --no-torch --out "$R/python-tabular.json" > "$R/python-tabular.log" 2>&1
  echo "python bench (tabular) exit $?"; grep "^|" "$R/python-tabular.log"
  timeout 110 python3 gpu-python/bench/python_bench.py --data-dir /tmp/pdata --images 8192 \
    --tabular 2000000 --workloads images --workers 4,8,16 --worker-priority normal,background \
    --rounds 2 --no-torch --out "$R/python-images.json" > "$R/python-images.log" 2>&1
  echo "python bench (images) exit $?"; grep "^|" "$R/python-images.log"
  timeout 160 python3 gpu-python/bench/python_bench.py --data-dir /tmp/pdata --images 8192 \
    --tabular 2000000 --workers 8,16 --worker-priority normal,background --rounds 1 \
    --out "$R/python-torch.json" > "$R/python-torch.log" 2>&1
  echo "python bench (torch) exit $?"; grep "^|" "$R/python-torch.log"
  ;;
tests)
  site=/tmp/longshore-gpu-site
  python3 -m pip install --quiet --no-index --no-deps --no-compile --upgrade --target "$site" gpu-python/wheels/*.whl
  export PYTHONPATH="$site"
  SANITIZER_SECS=0 OUT="$R" timeout 200 bash scripts/gpu-verify.sh 2>&1 | grep -v 'not run' | tail -8
  OUT="$R" timeout 100 bash gpu-python/run.sh --no-bench > "$R/pytest-run.log" 2>&1; tail -4 "$R/pytest-run.log"
  timeout 150 .gpu/bin/longshore-bench --only limits,loader --out "$R/bench" \
    --data-dir /tmp/bdata > "$R/bench.log" 2>&1; echo "bench exit $?"
  grep -i "tabular\|images" "$R/bench.log" | grep -i "best\|pick" | head -12
  timeout 170 python3 gpu-python/bench/python_bench.py --data-dir /tmp/pdata --images 8192 \
    --tabular 2000000 --workers 4,8 --rust-results "$R/bench/results.json" --out "$R/python.json" \
    > "$R/python-bench.log" 2>&1; echo "python bench exit $?"; tail -8 "$R/python-bench.log"
  LONGSHORE_EPOCH_TIMINGS=1 timeout 60 python3 gpu-python/bench/pump_timings.py --device cuda \
    --workers 4,8 --rows 1048576 --epochs 3 --repeats 3 > "$R/pump.log" 2>&1; echo "pump exit $?"; tail -12 "$R/pump.log"
  ;;
esac
rm -rf "$R"/*/data
case "$part" in python | priority) exit 0 ;; esac
tar -czf "$out/$part.tar.gz" -C "$R" .
