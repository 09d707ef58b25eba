#!/usr/bin/env python3
"""PIL's single-core JPEG decode rate over the first 400 JPEGs under a folder (the baseline for
longshore's per-core decode rate; PIL decodes with libjpeg-turbo).

usage: python3 xtask/probes/pil-decode-rate.py FOLDER
"""
import glob
import io
import sys
import time

from PIL import Image

fs = sorted(glob.glob(sys.argv[1] + "/**/*.JPEG", recursive=True))[:400]
data = [open(f, "rb").read() for f in fs]
t = time.perf_counter()
for d in data:
    im = Image.open(io.BytesIO(d))
    im = im.convert("RGB")
    im.load()
print(f"PIL decode, one core, {len(data)} files: {len(data) / (time.perf_counter() - t):.0f} images/s")
