#!/usr/bin/env bash
# GPU machine, part 2: the full `cargo xtask bench` (bandwidth, pool, limits, the steady-state
# loader sweep, the scaling curve, overlap, PyTorch's DataLoader grid on the same files, the
# roofline; about 8 minutes on a 16-core H200 host, PyTorch's grid about 4 of them), then the
# criterion benches in what is left of BENCH_SECS (default 540 s).
# Shorter: ONLY=bandwidth,pool,limits,loader,scaling,overlap,roofline bash scripts/gpu-bench.sh
# (no PyTorch), then ONLY=loader,pytorch for the ratios.
#
# Build here first:  scripts/gpu-pack.sh
# Then, on the GPU machine, from the project root:  bash scripts/gpu-bench.sh
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
cd "$(dirname "$0")/.."
budget=${BENCH_SECS:-540}
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } \
  | tee "$out/bench-machine.txt"
echo "== xtask bench"
.gpu/bin/xtask bench --bench-bin .gpu/bin/longshore-bench --out "$out/bench" ${ONLY:+--only "$ONLY"} > "$out/xtask.log" 2>&1
rc=$?
echo "xtask bench: exit $rc after ${SECONDS}s"
# The terminal tables, without progress bars.
grep -v "^\s*$" "$out/xtask.log" | grep -v "█\|░\|eta\|ETA" | grep -v "^pytorch .* screen" | tail -220
if [ -x .gpu/bin/staging-sweep ]; then
  echo "== staging sweep"
  .gpu/bin/staging-sweep 2>&1 | tee "$out/staging-sweep.txt"
fi
run_bench() { # name, seconds needed at least, criterion args...
  local name=$1 need=$2; shift 2
  local left=$((budget - SECONDS))
  if [ ! -x ".gpu/bin/$name-bench" ] || [ "$left" -lt "$need" ]; then
    echo "criterion $name: not run (${left}s left)"; return
  fi
  echo "== criterion: $name (${left}s left)"
  timeout "$left" ".gpu/bin/$name-bench" --bench "$@" > "$out/criterion-$name.txt" 2>&1
}
run_bench normalize 40 --warm-up-time 0.3 --measurement-time 1
grep -E "^normalize_|thrpt:" "$out/criterion-normalize.txt" 2>/dev/null | paste - - | awk '{print $1, $(NF-3), $(NF-2)}'
run_bench transfer 150 --warm-up-time 0.5 --measurement-time 1.5
grep -E "^transfer " "$out/criterion-transfer.txt" 2>/dev/null
run_bench pool 60 --warm-up-time 0.3 --measurement-time 1
grep -E "^(pool_hit|raw_alloc)|time:" "$out/criterion-pool.txt" 2>/dev/null | tr -s " " | head -60
exit $rc
