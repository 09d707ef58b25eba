#!/usr/bin/env bash
# One device call for issue 15 (and 14's staged-upload row): the JPEG pipelines with CPU and
# nvJPEG decoding against torchvision (workers 8/16/32 x pin, plus decode_jpeg(device="cuda")
# + resize), PIL's single-core decode rate on the same folder, and the staging sweep.
# Needs gpu-mini/gpu-mini.tar.xz (release longshore-bench, jpeg-bench, staging-sweep).
# Everything it writes is packed into $OUT/out.tar.gz (the device returns few files).
set -u
python3 -c "import tarfile; tarfile.open('gpu-mini/gpu-mini.tar.xz').extractall('gpu-mini')"
B=gpu-mini/bin
R=/tmp/res; mkdir -p $R
nvidia-smi -L
export LONGSHORE_REQUIRE_CUDA=1
timeout 420 $B/jpeg-bench --decode both --workers 16,32 --torch-workers 8,16,32 --epochs 2 \
  --out $R/jpeg --data-dir /tmp/jdata > $R/jpeg.log 2>&1
echo "jpeg-bench exit $?"; grep -v "Traceback\|File \|^ " $R/jpeg.log | tail -45
python3 scripts/pil-decode-rate.py /tmp/jdata 2>&1 | tee $R/pil.txt
timeout 90 $B/staging-sweep --quick > $R/staging.txt 2>&1; tail -14 $R/staging.txt
rm -rf $R/jpeg/data; tar -czf $OUT/out.tar.gz -C $R .
