#!/usr/bin/env bash
# GPU machine, part 1: every bundled test with CUDA required, then compute-sanitizer
# (memcheck, racecheck, synccheck) over the tests that reach the driver.
#
# Build here first:  ../shared/tools/gpu-bundle
# Then, on the GPU machine, from the project root:  bash scripts/gpu-verify.sh
# Logs go to $OUT (the device tool's folder) or ./gpu-out.
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
cd "$(dirname "$0")/.."
{
  date -u; uname -r
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nproc; command -v compute-sanitizer && compute-sanitizer --version | tail -1
} 2>&1 | tee "$out/machine.txt"

echo "== tests (LONGSHORE_REQUIRE_CUDA=1)"
set -o pipefail
bash .gpu/run.sh > "$out/tests.log" 2>&1; rc=$?
grep -E "^(FAILED|gpu-bundle:)|panicked|SKIP" "$out/tests.log" | tail -20

echo "== compute-sanitizer"
CS="compute-sanitizer --error-exitcode 99 --target-processes all --print-limit 50"
export LONGSHORE_REQUIRE_CUDA=1
budget=${SANITIZER_SECS:-300}; start=$SECONDS
: > "$out/sanitizer.log"
logs=$(mktemp -d)
# The test binaries that reach the driver (the others run on the Cpu device only, and
# compute-sanitizer refuses a program that makes no CUDA call).
for t in .gpu/tests/cuda_roundtrip-* .gpu/tests/cuda_device_lifetime-* \
         .gpu/tests/cuda_host-* .gpu/tests/buffer_kinds-* .gpu/tests/cuda_prefetch_async-* \
         .gpu/tests/device_errors-* .gpu/tests/ops_cuda_vs_cpu-* \
         .gpu/tests/device_delivery-* .gpu/tests/reliability_budget-* \
         .gpu/tests/cuda_stream_seams-* .gpu/tests/export_cuda-* .gpu/tests/collective_cuda-* \
         ${SANITIZE_EXTRA:-}; do
  [ -e "$t" ] || continue
  n=$(basename "$t" | sed 's/-[0-9a-f]*$//')
  for tool in memcheck racecheck synccheck; do
    left=$((budget - (SECONDS - start)))
    if [ "$left" -le 5 ]; then echo "$n $tool: not run (sanitizer time budget spent)" | tee -a "$out/sanitizer.log"; continue; fi
    extra=""
    [ "$tool" = memcheck ] && extra="--leak-check full"
    # device_errors provokes driver errors on purpose: don't count those API errors.
    # collective_cuda: libnccl probes kernels built for other GPUs (cudaFuncGetAttributes
    # -> cudaErrorNoKernelImageForDevice inside ncclCommInitRank), which is NCCL's own business.
    api="--report-api-errors explicit"
    case "$n" in device_errors|collective_cuda) api="--report-api-errors no";; esac
    log=$(timeout "$left" $CS --tool $tool $extra $api "$t" --test-threads=1 2>&1); code=$?
    printf '%s\n' "$log" > "$logs/$n-$tool.log"
    summary=$(printf '%s\n' "$log" | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY" | tr '\n' ' ')
    tests=$(printf '%s\n' "$log" | grep -E "^test result" | tail -1)
    echo "$n $tool: exit $code; $summary; $tests" | tee -a "$out/sanitizer.log"
  done
done
tar -czf "$out/sanitizer-logs.tgz" -C "$logs" .
exit $rc
