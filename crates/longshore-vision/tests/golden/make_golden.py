#!/usr/bin/env python3
"""Generates the golden files of longshore-vision's tests with PIL and torchvision.

    python crates/longshore-vision/tests/golden/make_golden.py

writes, next to this script:

* inputs: small JPEGs (4:2:0 baseline, 4:4:4 progressive, grayscale, CMYK) and PNGs
  (8-bit RGB, RGBA, 16-bit RGB, 16-bit grey, grey+alpha, 4-bit grey, palette, palette with
  transparency) of a synthetic photographic image (gradients, shapes with edges, texture);
* `<input>.rgb.npy`: PIL's `Image.open(f).convert("RGB")`, uint8 HWC;
* `<jpeg>.resize{S}.npy`, `.center{C}.npy`, `.resize{S}_center{C}.npy`, `.pad{P}.npy`:
  torchvision's `Resize(S)`, `CenterCrop(C)` on the PIL image (the ImageFolder path), uint8 HWC;
* `<jpeg>.resized_crop.npy`: `F.resized_crop(img, top, left, h, w, [32, 40])` for the boxes
  in `resized_crop_boxes.npy` (int64 `[n, 4]`), uint8 `[n, 32, 40, 3]`;
* `<jpeg>.val_tensor.npy`: `Compose([Resize(S), CenterCrop(C), ToTensor(), Normalize(IMAGENET)])`,
  float32 CHW;
* `rrc_<W>x<H>.npy`: 4000 draws of `RandomResizedCrop.get_params` (torch.manual_seed(0)),
  int64 `[4000, 4]` as `(i, j, h, w)`, for the statistical test.

Versions used are recorded in `versions.txt`. Needs numpy, Pillow, torch and torchvision.
"""

import os
import sys

import numpy as np
import PIL
import torch
import torchvision
from PIL import Image
from torchvision import transforms as T
from torchvision.transforms import functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
RESIZE, CROP, PAD = 40, 32, 112


def photo(w, h, seed):
    """A small photographic test image: two gradients, shapes with soft edges, 1/f texture."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.zeros((h, w, 3), np.float32)
    c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    t = np.clip((x * 0.8 + y * 0.6) / (0.8 * w + 0.6 * h), 0, 1)[..., None]
    img += c0 * (1 - t) + c1 * t
    for _ in range(5):
        cx, cy = rng.uniform(0, w), rng.uniform(0, h)
        rx, ry = rng.uniform(0.1, 0.4) * w, rng.uniform(0.1, 0.4) * h
        d = np.sqrt(((x - cx) / rx) ** 2 + ((y - cy) / ry) ** 2) - 1.0
        cover = np.clip(0.5 - d * min(rx, ry) / 1.5, 0, 1)[..., None]
        img = img * (1 - cover) + rng.uniform(0, 255, 3) * cover
    noise = np.zeros((h, w), np.float32)
    for k in range(5):
        cells = 3 << k
        lattice = rng.uniform(-1, 1, (cells + 2, cells + 2))
        fx, fy = x * cells / max(w, h), y * cells / max(w, h)
        ix, iy = fx.astype(int), fy.astype(int)
        tx, ty = fx - ix, fy - iy
        top = lattice[iy, ix] * (1 - tx) + lattice[iy, ix + 1] * tx
        bot = lattice[iy + 1, ix] * (1 - tx) + lattice[iy + 1, ix + 1] * tx
        noise += (top * (1 - ty) + bot * ty) / (1 << k)
    img += 30 * noise[..., None] + rng.normal(0, 3, (h, w, 1))
    return np.clip(img, 0, 255).astype(np.uint8)


def save(name, array):
    np.save(os.path.join(HERE, name), np.ascontiguousarray(array))


def path(name):
    return os.path.join(HERE, name)


def inputs():
    rgb = photo(61, 47, 1)
    big = photo(123, 95, 2)
    Image.fromarray(big).save(path("photo_420.jpg"), quality=90)  # PIL's default 4:2:0
    Image.fromarray(rgb).save(path("photo_444_prog.jpg"), quality=92, subsampling=0, progressive=True)
    Image.fromarray(rgb).convert("L").save(path("gray.jpg"), quality=90)
    Image.fromarray(rgb).convert("CMYK").save(path("cmyk.jpg"), quality=95)
    Image.fromarray(rgb).save(path("rgb.png"))
    rgba = np.dstack([rgb, (np.arange(rgb.shape[1]) * 4 % 256).astype(np.uint8)[None, :].repeat(rgb.shape[0], 0)])
    Image.fromarray(rgba, "RGBA").save(path("rgba.png"))
    # 16-bit colour: written by numpy + PIL's PNG encoder from mode "RGB" is 8-bit, so use
    # the raw encoder through a 16-bit grey per channel trick is not possible: write by hand.
    write_png16_rgb(path("rgb16.png"), rgb.astype(np.uint16) * 257 + np.arange(rgb.size, dtype=np.uint16).reshape(rgb.shape) % 200)
    grey16 = (np.arange(rgb.shape[0] * rgb.shape[1], dtype=np.uint32).reshape(rgb.shape[:2]) * 23 % 1200).astype(np.uint16)
    Image.fromarray(grey16).save(path("gray16.png"))
    Image.fromarray(rgb).convert("LA").save(path("gray_alpha.png"))
    Image.fromarray(rgb).convert("L").save(path("gray4.png"), bits=4)
    pal = Image.fromarray(rgb).convert("P", palette=Image.ADAPTIVE, colors=64)
    pal.save(path("palette.png"))
    pal.save(path("palette_trns.png"), transparency=3)


def write_png16_rgb(filename, arr):
    import struct
    import zlib

    h, w, _ = arr.shape
    raw = b"".join(b"\x00" + arr[r].astype(">u2").tobytes() for r in range(h))

    def chunk(kind, data):
        c = struct.pack(">I", len(data)) + kind + data
        return c + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
    with open(filename, "wb") as f:
        f.write(png)


def goldens():
    names = ["photo_420.jpg", "photo_444_prog.jpg", "gray.jpg", "cmyk.jpg", "rgb.png", "rgba.png",
             "rgb16.png", "gray16.png", "gray_alpha.png", "gray4.png", "palette.png", "palette_trns.png"]
    for n in names:
        with Image.open(path(n)) as im:
            save(n + ".rgb.npy", np.asarray(im.convert("RGB")))
    boxes = np.array([[0, 0, 95, 123], [10, 20, 50, 60], [3, 7, 20, 90], [40, 100, 55, 23], [0, 0, 16, 16]], np.int64)
    save("resized_crop_boxes.npy", boxes)
    normalize = T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    for n in ["photo_420.jpg", "photo_444_prog.jpg"]:
        with Image.open(path(n)) as im:
            img = im.convert("RGB")
        save(f"{n}.resize{RESIZE}.npy", np.asarray(T.Resize(RESIZE)(img)))
        save(f"{n}.center{CROP}.npy", np.asarray(T.CenterCrop(CROP)(img)))
        save(f"{n}.resize{RESIZE}_center{CROP}.npy", np.asarray(T.CenterCrop(CROP)(T.Resize(RESIZE)(img))))
        save(f"{n}.pad{PAD}.npy", np.asarray(T.CenterCrop((PAD, PAD + 3))(img)))
        crops = [np.asarray(F.resized_crop(img, int(i), int(j), int(h), int(w), [32, 40]))
                 for i, j, h, w in boxes if i + h <= img.height and j + w <= img.width]
        save(f"{n}.resized_crop.npy", np.stack(crops))
        val = T.Compose([T.Resize(RESIZE), T.CenterCrop(CROP), T.ToTensor(), normalize])
        save(f"{n}.val_tensor.npy", val(img).numpy())


def rrc_draws():
    rrc = T.RandomResizedCrop(224)
    for w, h in [(400, 300), (300, 100), (37, 29)]:
        torch.manual_seed(0)
        img = Image.new("RGB", (w, h))
        draws = [rrc.get_params(img, rrc.scale, rrc.ratio) for _ in range(4000)]
        save(f"rrc_{w}x{h}.npy", np.array(draws, np.int64))


def main():
    inputs()
    goldens()
    rrc_draws()
    with open(path("versions.txt"), "w") as f:
        f.write(f"python {sys.version.split()[0]}\nnumpy {np.__version__}\nPillow {PIL.__version__}\n"
                f"torch {torch.__version__}\ntorchvision {torchvision.__version__}\n")
    total = sum(os.path.getsize(path(n)) for n in os.listdir(HERE))
    print(f"wrote {len(os.listdir(HERE))} files, {total / 1e6:.2f} MB, in {HERE}")


if __name__ == "__main__":
    main()
