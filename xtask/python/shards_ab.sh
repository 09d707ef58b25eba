#!/bin/bash
# A/B of longshore's sharded-dataset rates between two wheels, alternating runs in one call
# (docs/benchmarks.md, "Shard cache under a budget"). On the GPU machine, with a folder DIR
# that holds base/*.whl, new/*.whl, bin/xtask (stripped) and shards_bench.py:
#   ORDER="base new base new" DECODE=cpu EPOCHS=4 bash DIR/shards_ab.sh DIR
# Each wheel is installed into its own --target folder (/tmp/site-base, /tmp/site-new) and
# `shards_bench.py --only longshore --workers 16` runs with it on PYTHONPATH; JSON under $OUT.
set -u
dir="${1:?usage: shards_ab.sh DIR}"
for v in base new; do
  python3 -m pip install -q --no-index --no-deps --target "/tmp/site-$v" "$dir/$v"/*.whl >/dev/null 2>&1
done
nproc; nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || true
n=0
for v in ${ORDER:-new base}; do
  n=$((n + 1))
  echo "=== $v $(date +%T)"
  PYTHONPATH="/tmp/site-$v" timeout "${PER:-280}" python3 "$dir/shards_bench.py" \
    --xtask "$dir/bin/xtask" --data-dir /tmp/shards-bench --only longshore --workers 16 \
    --epochs "${EPOCHS:-2}" --decode "${DECODE:-cpu,nvjpeg}" --out "${OUT:-/tmp}/$v-$n.json" 2>&1 |
    grep -v "^  *epoch" | tail -30
done
