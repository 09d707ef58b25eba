#!/usr/bin/env bash
# Issue 18 on a machine with 2 GPUs (no cargo): the data-parallel example against one
# process, every rank's pinned pool back to zero, and what happens when a rank is killed.
#   bash examples/scripts/gpu-dist.sh [BIN_DIR]   (BIN_DIR holds `train`, default .gpu/bin;
#                                                  results under $OUT or gpu-out/)
# Build the binaries first, on a machine with cargo: `cargo xtask gpu-pack` (.gpu/bin/train,
# and the test binary .gpu/tests/collective_cuda-<hash>; a BIN_DIR/collective_cuda wins).
set -u
B=${1:-.gpu/bin}; R=${OUT:-gpu-out}/dist; mkdir -p "$R"
pass=0; fail=0
ok() { echo "PASS: $*"; pass=$((pass + 1)); }
ko() { echo "FAIL: $*"; fail=$((fail + 1)); }

C="$B/collective_cuda"; [ -x "$C" ] || C=$(ls .gpu/tests/collective_cuda-* 2>/dev/null | head -1)
LONGSHORE_REQUIRE_CUDA=1 timeout 120 "$C" > "$R/collective_cuda.log" 2>&1 \
  && ok "collective_cuda ($(grep -o '[0-9]* passed' "$R/collective_cuda.log"))" \
  || { ko "collective_cuda"; tail -30 "$R/collective_cuda.log"; }

ARGS="--epochs 5 --samples 524288 --batch-size 2048 --hidden 2048 --workers 4 --seed 0 --data-dir /tmp/longshore-data --json"
timeout 200 "$B/train" --device cuda $ARGS > "$R/single.jsonl" 2> "$R/single.err" || ko "single-process train"
timeout 200 torchrun --nnodes 1 --nproc-per-node 2 --master-addr 127.0.0.1 --master-port 29500 \
  --no-python "$B/train" --distributed $ARGS > "$R/dist.jsonl" 2> "$R/dist.err" || ko "torchrun train"
python3 examples/scripts/compare_curves.py "$R/single.jsonl" "$R/dist.jsonl" --tol 1e-3 \
  && ok "2-rank loss curve matches one process" || ko "loss curves differ"
# Every rank's summary: rank 0's is the last line of stdout, the others' are on stderr.
for f in "$R/single.jsonl" "$R/dist.jsonl" "$R/dist.err"; do
  python3 - "$f" <<'PY' && ok "pools back to zero ($(basename "$f"))" || ko "pool outstanding in $(basename "$f")"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{") and "pool_bytes_outstanding" in l]
for r in rows:
    print(f"  rank {r['rank']} of {r['world_size']}: pool_bytes_outstanding {r['pool_bytes_outstanding']}, peak held {r['pool_peak_bytes_held']}")
sys.exit(0 if rows and all(r["pool_bytes_outstanding"] == 0 for r in rows) else 1)
PY
done

# Two ranks started by hand (torchrun would SIGTERM the survivor itself), one killed with
# SIGKILL a few seconds in: the survivor must exit non-zero, naming the dead rank, quickly.
kill_test() {
  local victim=$1 survivor=$2 port=$3
  local LONG="--epochs 200 --samples 524288 --batch-size 2048 --hidden 2048 --workers 4 --seed 0 --data-dir /tmp/longshore-data --json"
  local pids=()
  for r in 0 1; do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "$B/train" --distributed $LONG > "$R/kill$victim-rank$r.out" 2> "$R/kill$victim-rank$r.err" &
    pids[$r]=$!
  done
  sleep 8
  if ! kill -0 "${pids[$victim]}" 2>/dev/null; then
    ko "kill rank $victim: rank $victim was not running 8 s in"; tail -5 "$R/kill$victim-rank$victim.err"
    kill -9 "${pids[@]}" 2>/dev/null; return
  fi
  kill -9 "${pids[$victim]}"
  local t0=$(date +%s.%N)
  local waited=0
  while kill -0 "${pids[$survivor]}" 2>/dev/null && [ $waited -lt 60 ]; do sleep 0.1; waited=$((waited + 1)); done
  if kill -0 "${pids[$survivor]}" 2>/dev/null; then
    ko "kill rank $victim: rank $survivor still running 6 s later (hang)"; kill -9 "${pids[$survivor]}"; return
  fi
  wait "${pids[$survivor]}"; local rc=$?
  local secs=$(python3 -c "import time; print(f'{time.time() - $t0:.2f}')")
  echo "rank $survivor exited rc=$rc ${secs}s after rank $victim was killed; its last lines:"
  tail -4 "$R/kill$victim-rank$survivor.err"
  if [ $rc -ne 0 ] && grep -q "rank $victim of 2 died" "$R/kill$victim-rank$survivor.err"; then
    ok "kill rank $victim: rank $survivor failed naming it in ${secs}s"
  else
    ko "kill rank $victim: rank $survivor rc=$rc without naming rank $victim"
  fi
}
kill_test 1 0 29600
kill_test 0 1 29700
echo "gpu-dist: $pass passed, $fail failed"
