#!/usr/bin/env python3
"""Probe: what nvJPEG's hardware backend does per image for planar RGB output (what the
decoder asks for) against YUV output (the engines' own planes), and how each holds up while
a captured ResNet-18 training step keeps the GPU busy.

Issue 38's profiles show the decode thread making ~900 CUDA calls per 256-image batch
(kernel launches, copies, event records and syncs) and, under a captured training step, the
decode slowing from ~12 to ~30 ms a batch. If the per-image work is the colour conversion
nvJPEG launches per image for RGB, YUV output with the conversion done in longshore's one
batched kernel removes it. This measures, for both formats: CUDA runtime calls and kernels
per image (torch.profiler), decode rate alone, and decode rate with the GPU busy; and how
nvJPEG's RGB compares with YUV converted here with nearest or interpolated chroma.

    python3 xtask/probes/nvjpeg-yuv.py [--data target/train-resnet/data] [--batch 256]

Needs torch, torchvision and libnvjpeg (CUDA 12/13); generates the JPEG folder with the
longshore package when it is missing (train_resnet.py's folder).
"""

import argparse
import ctypes
import glob
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "python"))

BACKEND_HARDWARE = 3
OUTPUT_YUV, OUTPUT_RGB = 1, 3
FLAG_INTERPOLATION = 1 << 5


class Image(ctypes.Structure):
    _fields_ = [("channel", ctypes.c_void_p * 4), ("pitch", ctypes.c_size_t * 4)]


def load():
    for name in ("libnvjpeg.so.13", "libnvjpeg.so.12", "libnvjpeg.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    sys.exit("no libnvjpeg")


def check(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what}: nvjpeg status {rc}")


class Decoder:
    def __init__(self, lib, files):
        self.lib = lib
        # nvJPEG's hardware handle and states use the calling thread's current context:
        # torch's primary context, made current first.
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
        self.handle = ctypes.c_void_p()
        rc = lib.nvjpegCreateEx(BACKEND_HARDWARE, None, None, FLAG_INTERPOLATION,
                                ctypes.byref(self.handle))
        if rc != 0:
            check(lib.nvjpegCreateEx(BACKEND_HARDWARE, None, None, 0, ctypes.byref(self.handle)),
                  "nvjpegCreateEx(HARDWARE)")
        self.state = ctypes.c_void_p()
        check(lib.nvjpegJpegStateCreate(self.handle, ctypes.byref(self.state)), "state")
        self.data, self.dims, self.skipped = [], [], {}
        jstream = ctypes.c_void_p()
        check(lib.nvjpegJpegStreamCreate(self.handle, ctypes.byref(jstream)), "jstream")
        for f in files:
            d = open(f, "rb").read()
            nc, css = ctypes.c_int(), ctypes.c_int()
            w, h = (ctypes.c_int * 4)(), (ctypes.c_int * 4)()
            check(lib.nvjpegGetImageInfo(self.handle, d, len(d), ctypes.byref(nc),
                                         ctypes.byref(css), w, h), "info")
            # The hardware batch takes colour JPEGs it says it supports (the decoder routes
            # the rest apart): nvjpegJpegStreamParse + nvjpegDecodeBatchedSupported (0: yes).
            check(lib.nvjpegJpegStreamParse(self.handle, d, ctypes.c_size_t(len(d)), 0, 0,
                                            jstream), "parse")
            unsupported = ctypes.c_int(1)
            check(lib.nvjpegDecodeBatchedSupported(self.handle, jstream,
                                                   ctypes.byref(unsupported)), "supported")
            if nc.value != 3 or unsupported.value != 0:
                key = f"{nc.value}c/css{css.value}/unsupported{unsupported.value}"
                self.skipped[key] = self.skipped.get(key, 0) + 1
                continue
            self.data.append(d)
            self.dims.append((nc.value, css.value, list(w), list(h)))
        n = len(self.data)
        self.ptrs = (ctypes.c_char_p * n)(*self.data)
        self.lens = (ctypes.c_size_t * n)(*[len(d) for d in self.data])
        self.fmt = None
        # Its own stream (torch's pool streams do not synchronise with the legacy stream).
        self.stream = torch.cuda.Stream()

    def outputs(self, fmt):
        """One tensor per image and the nvjpegImage_t array pointing into them."""
        n = len(self.data)
        images = (Image * n)()
        keep = []
        for i, (nc, _, w, h) in enumerate(self.dims):
            if fmt == OUTPUT_RGB:
                t = torch.empty(3, h[0], w[0], dtype=torch.uint8, device="cuda")
                for c in range(3):
                    images[i].channel[c] = t[c].data_ptr()
                    images[i].pitch[c] = w[0]
                keep.append(t)
            else:
                planes = []
                for c in range(3 if nc >= 3 else 1):
                    p = torch.empty(h[c], w[c], dtype=torch.uint8, device="cuda")
                    images[i].channel[c] = p.data_ptr()
                    images[i].pitch[c] = w[c]
                    planes.append(p)
                keep.append(planes)
        return images, keep

    def diagnose(self):
        """Which batched initialisations nvJPEG accepts here, and where it was loaded from."""
        out = {}
        for n in (1, 64, len(self.data)):
            for threads in (1, 0):
                for fmt in (OUTPUT_RGB, OUTPUT_YUV):
                    st = ctypes.c_void_p()
                    self.lib.nvjpegJpegStateCreate(self.handle, ctypes.byref(st))
                    rc = self.lib.nvjpegDecodeBatchedInitialize(
                        self.handle, st, ctypes.c_int(n), ctypes.c_int(threads), ctypes.c_int(fmt))
                    out[f"n{n}/t{threads}/f{fmt}"] = rc
        with open("/proc/self/maps") as f:
            out["libs"] = sorted({ln.split()[-1] for ln in f if "nvjpeg" in ln})
        return out

    def decode(self, fmt, images):
        if self.fmt != fmt:
            check(self.lib.nvjpegDecodeBatchedInitialize(self.handle, self.state,
                                                         len(self.data), 1, fmt), "init")
            self.fmt = fmt
        stream = ctypes.c_void_p(self.stream.cuda_stream)
        check(self.lib.nvjpegDecodeBatched(self.handle, self.state, self.ptrs, self.lens,
                                           images, stream), "nvjpegDecodeBatched")


def yuv_to_rgb(planes, css_interp):
    """JFIF YCbCr -> RGB on the GPU, chroma upsampled by `css_interp` (nearest|bilinear)."""
    y = planes[0].float()
    if len(planes) == 1:
        return y.round().clamp(0, 255).expand(3, -1, -1)
    h, w = y.shape
    uv = torch.stack([planes[1], planes[2]]).float()[None]
    if css_interp == "nearest":
        uv = torch.nn.functional.interpolate(uv, size=(h, w), mode="nearest")[0]
    else:
        uv = torch.nn.functional.interpolate(uv, size=(h, w), mode="bilinear",
                                             align_corners=False)[0]
    cb, cr = uv[0] - 128, uv[1] - 128
    r = y + 1.402 * cr
    g = y - 0.344136 * cb - 0.714136 * cr
    b = y + 1.772 * cb
    return torch.stack([r, g, b]).round().clamp(0, 255)


def calls(dec, fmt, images):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        dec.decode(fmt, images)
        dec.stream.synchronize()
    n = len(dec.data)
    out = {}
    for e in prof.key_averages():
        if e.key.startswith(("cuda", "cu")) or e.device_type == torch.autograd.DeviceType.CUDA \
                or "kernel" in e.key.lower() or "nvjpeg" in e.key.lower():
            out[e.key[:70]] = round(e.count / n, 2)
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:12])


def rate(dec, fmt, images, iters):
    """Images/s of `iters` batches, waiting for the decoder's stream only (a side stream may
    keep the GPU busy meanwhile)."""
    dec.stream.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        dec.decode(fmt, images)
    dec.stream.synchronize()
    return iters * len(dec.data) / (time.perf_counter() - t)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="target/train-resnet/data")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args()
    if not glob.glob(os.path.join(args.data, "*", "*.JPEG")):
        import longshore

        longshore.datasets.write_synthetic_folder(args.data, classes=100, per_class=100,
                                                  mean_area=140_000, quality=90, seed=0x13A6E)
    files = sorted(glob.glob(os.path.join(args.data, "*", "*.JPEG")))[:args.batch]
    dec = Decoder(load(), files)
    css = {}
    for nc, c, _, _ in dec.dims:
        css[f"{nc}c/css{c}"] = css.get(f"{nc}c/css{c}", 0) + 1
    result = {"images": len(dec.data), "subsampling": css, "left_out": dec.skipped,
              "init": dec.diagnose()}
    print(json.dumps(result), flush=True)
    rgb_img, rgb = dec.outputs(OUTPUT_RGB)
    yuv_img, yuv = dec.outputs(OUTPUT_YUV)
    for fmt, img in ((OUTPUT_RGB, rgb_img), (OUTPUT_YUV, yuv_img)):
        dec.decode(fmt, img)  # warm-up
    torch.cuda.synchronize()
    # Pixels: nvJPEG's RGB against YUV converted here.
    for mode in ("nearest", "bilinear"):
        diffs, worst = [], 0.0
        for t, planes in zip(rgb, yuv):
            d = (t.float() - yuv_to_rgb(planes, mode)).abs()
            diffs.append(d.mean().item())
            worst = max(worst, d.max().item())
        result[f"rgb_vs_yuv_{mode}"] = {"mean_abs": sum(diffs) / len(diffs), "max": worst}
    result["calls_per_image_rgb"] = calls(dec, OUTPUT_RGB, rgb_img)
    result["calls_per_image_yuv"] = calls(dec, OUTPUT_YUV, yuv_img)
    result["alone_images_per_s"] = {
        "rgb": rate(dec, OUTPUT_RGB, rgb_img, args.iters),
        "yuv": rate(dec, OUTPUT_YUV, yuv_img, args.iters),
    }
    print(json.dumps(result), flush=True)
    # Busy GPU: ResNet-18's forward (fp16, channels_last, batch 256) captured in a CUDA graph
    # and replayed on a side stream, enqueued ahead of the decodes.
    import torchvision

    torch.backends.cudnn.benchmark = True
    model = torchvision.models.resnet18().cuda().half().eval()
    model = model.to(memory_format=torch.channels_last)
    x = torch.randn(256, 3, 224, 224, device="cuda").half()
    x = x.contiguous(memory_format=torch.channels_last)
    side = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                model(x)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            model(x)
    busy = {}
    for name, fmt, img in (("rgb", OUTPUT_RGB, rgb_img), ("yuv", OUTPUT_YUV, yuv_img)):
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            for _ in range(400):
                graph.replay()
        busy[name] = rate(dec, fmt, img, args.iters)
        busy[name + "_side_still_busy"] = not side.query()
        side.synchronize()
    result["busy_images_per_s"] = busy
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
