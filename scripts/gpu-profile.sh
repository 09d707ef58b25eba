#!/usr/bin/env bash
# One device call for issues 14/15 (2026-11-23): the scaling section with the sampling
# profiler (`longshore-bench --profile`), and the JPEG pipelines with nvJPEG and CPU decoding
# against torchvision at its best worker count (16) including `decode_jpeg(device="cuda")`,
# plus PIL's single-core decode rate on the same folder. Needs gpu-mini/gpu-mini.tar.xz
# (longshore-bench and jpeg-bench, release, symbol tables kept).
set -u
python3 -c "import tarfile; tarfile.open('gpu-mini/gpu-mini.tar.xz').extractall('gpu-mini')"
B=gpu-mini/bin
nvidia-smi -L
export LONGSHORE_REQUIRE_CUDA=1
timeout 200 $B/longshore-bench --only scaling --profile $OUT/prof --out $OUT/scaling 2>&1 | tail -22
timeout 330 $B/jpeg-bench --decode both --workers 8,16 --torch-workers 16 --epochs 2 --out $OUT/jpeg --data-dir /tmp/jdata 2>&1 | tail -40
python3 scripts/pil-decode-rate.py /tmp/jdata
rm -rf $OUT/scaling/data
