#!/usr/bin/env bash
# GPU machine, part 2: the criterion bandwidth matrix, then the full `cargo xtask bench`
# (bandwidth, pool, loader sweep, overlap, and PyTorch's DataLoader on the same files).
#
# Build here first:  ../shared/tools/gpu-bundle, and copy the criterion bench binaries
# (`cargo bench -p longshore-benches --no-run`) to .gpu/bin/<name>-bench.
# Then, on the GPU machine, from the project root:  bash scripts/gpu-bench.sh
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
cd "$(dirname "$0")/.."
date -u | tee "$out/bench-machine.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$out/bench-machine.txt"
if [ -x .gpu/bin/transfer-bench ]; then
  echo "== criterion: transfer"
  .gpu/bin/transfer-bench --bench --warm-up-time 0.5 --measurement-time 2 2>&1 \
    | grep -E "^transfer " | tee "$out/criterion-transfer.txt"
fi
if [ -x .gpu/bin/pool-bench ]; then
  echo "== criterion: pool"
  .gpu/bin/pool-bench --bench --warm-up-time 0.3 --measurement-time 1 2>&1 \
    | grep -E "^(pool_hit|raw_alloc)|time:" | tee "$out/criterion-pool.txt" | tail -40
fi
echo "== xtask bench"
.gpu/bin/xtask bench --bench-bin .gpu/bin/longshore-bench --out "$out/bench" > "$out/xtask.log" 2>&1
rc=$?
grep -v "^\s*$" "$out/xtask.log" | grep -v "█\|░\|⠁\|eta" | tail -120
exit $rc
