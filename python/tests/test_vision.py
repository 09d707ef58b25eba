"""longshore.datasets.ImageFolder and longshore.transforms on the CPU: torchvision's folder
semantics, pixel values against references computed here with NumPy, errors, determinism."""
import gc
import os
import struct
import time
import zlib

import numpy as np
import pytest

import longshore
from conftest import need_cuda
from longshore import transforms as T

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def write_png(path, rgb):
    """An 8-bit RGB PNG of `rgb` (u8 [H, W, 3]), written with the standard library only."""
    h, w, _ = rgb.shape

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(h))
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    with open(path, "wb") as f:
        f.write(png)


def png_folder(root, images):
    """`images`: {class: [u8 [H, W, 3], ...]}; files named 000.png, 001.png, ... per class."""
    for cls, arrays in images.items():
        os.makedirs(os.path.join(root, cls), exist_ok=True)
        for i, a in enumerate(arrays):
            write_png(os.path.join(root, cls, f"{i:03d}.png"), a)
    return str(root)


def center_crop_ref(img, h, w):
    """torchvision's center_crop on an [H, W, 3] image: pads with zeros when the crop is
    larger, offsets int(round((H - h) / 2))."""
    H, W, _ = img.shape
    if h > H or w > W:
        pt, pl = (max(h - H, 0)) // 2, (max(w - W, 0)) // 2
        pb, pr = (max(h - H, 0) + 1) // 2, (max(w - W, 0) + 1) // 2
        img = np.pad(img, ((pt, pb), (pl, pr), (0, 0)))
        H, W, _ = img.shape
    top, left = int(round((H - h) / 2.0)), int(round((W - w) / 2.0))
    return img[top:top + h, left:left + w]


def to_tensor_ref(img, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0)):
    x = img.astype(np.float32).transpose(2, 0, 1) / np.float32(255.0)
    m = np.asarray(mean, np.float32)[:, None, None]
    s = np.asarray(std, np.float32)[:, None, None]
    return (x - m) / s


def batches(ds, **kw):
    kw.setdefault("batch_size", 4)
    return list(longshore.DataLoader(ds, framework="numpy", **kw))


def test_folder_semantics_are_torchvisions(tmp_path):
    rng = np.random.default_rng(0)
    img = lambda: rng.integers(0, 256, (5, 6, 3), dtype=np.uint8)  # noqa: E731
    root = tmp_path / "root"
    for cls, names in {"b": ["z.PNG", "a.png"], "a": ["m.png"], "C": ["x.Png"]}.items():
        os.makedirs(root / cls)
        for n in names:
            write_png(str(root / cls / n), img())
    os.makedirs(root / "a" / "sub")
    write_png(str(root / "a" / "sub" / "0.png"), img())
    (root / "a" / "notes.txt").write_text("not an image")
    (root / "stray.png").write_bytes(b"")  # files in root are not classes
    ds = longshore.datasets.ImageFolder(str(root), T.Compose([T.CenterCrop(4), T.ToTensor()]))
    assert ds.classes == ["C", "a", "b"]  # sorted like Python's sorted(): case-sensitive
    assert ds.class_to_idx == {"C": 0, "a": 1, "b": 2}
    rel = [(os.path.relpath(p, root), t) for p, t in ds.samples]
    assert rel == [("C/x.Png", 0), ("a/m.png", 1), ("a/sub/0.png", 1), ("b/a.png", 2), ("b/z.PNG", 2)]
    assert ds.targets == [0, 1, 1, 2, 2] and len(ds) == 5
    labels = np.concatenate([y for _, y in batches(ds, batch_size=2)])
    assert labels.dtype == np.int64
    np.testing.assert_array_equal(labels, ds.targets)


def test_center_crop_flip_and_normalize_match_a_numpy_reference(tmp_path):
    rng = np.random.default_rng(1)
    # Odd and even margins (rounding of the offsets), and an image smaller than the crop.
    images = [rng.integers(0, 256, shape, dtype=np.uint8) for shape in ((9, 12, 3), (10, 7, 3), (4, 5, 3))]
    root = png_folder(tmp_path / "f", {"only": images})
    pipelines = {
        "normalize": (T.Compose([T.CenterCrop((6, 5)), T.ToTensor(), T.Normalize(MEAN, STD)]),
                      lambda a: to_tensor_ref(center_crop_ref(a, 6, 5), MEAN, STD)),
        "flip": (T.Compose([T.CenterCrop((6, 5)), T.RandomHorizontalFlip(p=1.0), T.ToTensor()]),
                 lambda a: to_tensor_ref(center_crop_ref(a, 6, 5)[:, ::-1])),
    }
    for name, (pipeline, ref) in pipelines.items():
        ds = longshore.datasets.ImageFolder(root, transform=pipeline)
        (x, y), = batches(ds, batch_size=3)
        assert x.shape == (3, 3, 6, 5) and x.dtype == np.float32, name
        want = np.stack([ref(a) for a in images])
        np.testing.assert_allclose(x, want, rtol=0, atol=1e-6, err_msg=name)
        np.testing.assert_array_equal(y, [0, 0, 0])
        image, label = ds[1]
        np.testing.assert_allclose(image, want[1], rtol=0, atol=1e-6)
        assert label == 0
    u8 = longshore.datasets.ImageFolder(root, T.Compose([T.CenterCrop(4), T.PILToTensor()]))
    (x, _), = batches(u8, batch_size=3)
    assert x.dtype == np.uint8
    np.testing.assert_array_equal(x, np.stack([center_crop_ref(a, 4, 4).transpose(2, 0, 1) for a in images]))


@pytest.mark.parametrize("form", ["4:2:0", "4:2:2", "4:4:4", "progressive", "grey"])
def test_jpegs_decode_to_pils_pixels_whole_and_cropped(tmp_path, form):
    """JPEGs decode with PIL's own library (libjpeg-turbo) and its defaults: a crop of the whole
    image (a whole decode) and a smaller centre crop (only the crop's rows and columns are
    decoded) equal PIL's pixels exactly."""
    Image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(7)
    root = tmp_path / "jpegs"
    (root / "c").mkdir(parents=True)
    shapes = [(75, 100), (61, 47), (120, 33)]
    for i, (h, w) in enumerate(shapes):
        yy, xx = np.mgrid[0:h, 0:w]
        smooth = np.stack([(xx * 3 + yy) % 256, (yy * 2 + 40) % 256, (xx + yy * 5) % 256], -1)
        a = np.clip(smooth + rng.integers(0, 40, (h, w, 3)), 0, 255).astype(np.uint8)
        im = Image.fromarray(a).convert("L") if form == "grey" else Image.fromarray(a)
        kw = {"quality": 88}
        if form == "progressive":
            kw.update(progressive=True, subsampling="4:2:0")
        elif form != "grey":
            kw["subsampling"] = form
        im.save(root / "c" / f"{i:03d}.jpg", **kw)
    pil = [np.asarray(Image.open(root / "c" / f"{i:03d}.jpg").convert("RGB")) for i in range(3)]
    for i, (h, w) in enumerate(shapes):
        for crop in [(h, w), (max(h // 3, 1), max(w // 2, 1))]:
            ds = longshore.datasets.ImageFolder(str(root), T.Compose([T.CenterCrop(crop), T.PILToTensor()]))
            image, _ = ds[i]
            want = center_crop_ref(pil[i], *crop).transpose(2, 0, 1)
            np.testing.assert_array_equal(image, want, err_msg=f"{form}, image {i}, crop {crop}")


def test_resize_shapes_and_a_uniform_image_stays_uniform(tmp_path):
    colours = [(10, 200, 30), (255, 0, 128), (77, 77, 77)]
    shapes = [(40, 30), (25, 60), (33, 33)]
    images = [np.full((h, w, 3), c, np.uint8) for c, (h, w) in zip(colours, shapes)]
    root = png_folder(tmp_path / "u", {"k": images})
    val = longshore.datasets.ImageFolder(root, T.Compose([T.Resize(16), T.CenterCrop(12), T.ToTensor(), T.Normalize(MEAN, STD)]))
    (x, _), = batches(val, batch_size=3)
    assert x.shape == (3, 3, 12, 12)
    for i, c in enumerate(colours):
        want = (np.asarray(c, np.float32) / 255 - np.asarray(MEAN, np.float32)) / np.asarray(STD, np.float32)
        np.testing.assert_allclose(x[i], np.broadcast_to(want[:, None, None], (3, 12, 12)), atol=1e-5)
    exact = longshore.datasets.ImageFolder(root, T.Compose([T.Resize((6, 9)), T.ToTensor()]))
    (x, _), = batches(exact, batch_size=3)
    assert x.shape == (3, 3, 6, 9)


def test_train_pipeline_on_jpegs_is_deterministic_with_a_seed(tmp_path):
    n, _, reused = longshore.datasets.write_synthetic_folder(tmp_path / "jpeg", classes=3, per_class=4)
    assert n == 12 and not reused
    train = longshore.datasets.ImageFolder(str(tmp_path / "jpeg"), transform=T.Compose([
        T.RandomResizedCrop(32, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)), T.RandomHorizontalFlip(p=0.5),
        T.ToTensor(), T.Normalize(MEAN, STD)]))
    assert train.classes == ["n0000", "n0001", "n0002"]

    def epoch(seed, workers):
        out = batches(train, batch_size=5, shuffle=True, seed=seed, num_workers=workers)
        return np.concatenate([x for x, _ in out]), np.concatenate([y for _, y in out])

    a, la = epoch(3, 2)
    b, lb = epoch(3, 2)
    c, lc = epoch(4, 2)
    assert a.shape == (12, 3, 32, 32) and a.dtype == np.float32 and la.dtype == np.int64
    assert sorted(la.tolist()) == sorted(train.targets)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(la, lb)
    assert not np.array_equal(a, c)
    # Normalised values of real images: about zero mean, within ToTensor's range mapped.
    lo = (0 - np.max(MEAN)) / np.min(STD)
    hi = (1 - np.min(MEAN)) / np.min(STD)
    assert lo - 1e-5 <= a.min() and a.max() <= hi + 1e-5 and abs(float(a.mean())) < 1.5


@pytest.mark.parametrize("workers_after", [2, 1, 0])
def test_a_resumed_epoch_draws_the_crops_of_the_uninterrupted_one(tmp_path, workers_after):
    """Exact resume includes the augmentations: by default each sample draws its crop and
    flip from a generator of its own (the loader's seed, the epoch, the sample), so the
    batches after load_state_dict equal the uninterrupted epoch's, pixels included, on
    another number of workers too (random="worker" draws from each worker's generator, as
    torch's transforms do, and differs after a resume)."""
    longshore.datasets.write_synthetic_folder(tmp_path / "r", classes=4, per_class=8)
    pipeline = T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.ToTensor(),
                          T.Normalize(MEAN, STD)])

    def run(ds, workers, state=None, take=None):
        dl = longshore.DataLoader(ds, batch_size=2, shuffle=True, seed=3, num_workers=workers,
                                  framework="numpy")
        if state is not None:
            dl.load_state_dict(state)
        out, it = [], iter(dl)
        for x, y in it:
            out.append((x.copy(), y.copy()))
            if take is not None and len(out) == take:
                state = dl.state_dict()
                it.close()
                return out, state
        return out, None

    ds = longshore.datasets.ImageFolder(str(tmp_path / "r"), pipeline)
    whole, _ = run(ds, 2)
    assert len(whole) == 16
    _, state = run(ds, 2, take=7)
    rest, _ = run(ds, workers_after, state)
    assert len(rest) == 9
    for k, ((x, y), (wx, wy)) in enumerate(zip(rest, whole[7:])):
        np.testing.assert_array_equal(y, wy, err_msg=f"labels of batch {7 + k}")
        np.testing.assert_array_equal(x, wx, err_msg=f"pixels of batch {7 + k}")
    # Torch's per-worker streams, explicitly: the same epoch from its start, other crops
    # after a resume.
    per_worker = longshore.datasets.ImageFolder(str(tmp_path / "r"), pipeline, random="worker")
    w_whole, _ = run(per_worker, 2)
    assert [y.tolist() for _, y in w_whole] == [y.tolist() for _, y in whole]
    _, w_state = run(per_worker, 2, take=7)
    w_rest, _ = run(per_worker, 2, w_state)
    assert any(not np.array_equal(a[0], b[0]) for a, b in zip(w_rest, w_whole[7:]))
    with pytest.raises(ValueError, match="random must be"):
        longshore.datasets.ImageFolder(str(tmp_path / "r"), pipeline, random="torch")


def test_a_bad_file_is_an_error_naming_it(tmp_path):
    root = png_folder(tmp_path / "bad", {"x": [np.zeros((6, 6, 3), np.uint8)]})
    with open(os.path.join(root, "x", "broken.jpg"), "wb") as f:
        f.write(b"this is a text file, not a JPEG")
    ds = longshore.datasets.ImageFolder(root, T.Compose([T.CenterCrop(4), T.ToTensor()]))
    with pytest.raises(longshore.SampleError, match="broken.jpg"):
        batches(ds, batch_size=2)
    with pytest.raises(ValueError, match="broken.jpg"):
        ds[1]
    image, _ = ds[0]
    assert image.shape == (3, 4, 4)


def test_folder_errors(tmp_path):
    os.makedirs(tmp_path / "none")
    with pytest.raises(ValueError, match="class folder"):
        longshore.datasets.ImageFolder(str(tmp_path / "none"))
    os.makedirs(tmp_path / "empty" / "a")
    os.makedirs(tmp_path / "empty" / "b")
    write_png(str(tmp_path / "empty" / "b" / "0.png"), np.zeros((2, 2, 3), np.uint8))
    with pytest.raises(ValueError, match="no valid file.*a"):
        longshore.datasets.ImageFolder(str(tmp_path / "empty"))
    ds = longshore.datasets.ImageFolder(str(tmp_path / "empty"), allow_empty=True)
    assert ds.classes == ["a", "b"] and ds.targets == [1]
    with pytest.raises(FileNotFoundError, match="missing"):
        longshore.datasets.ImageFolder(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="transform"):
        longshore.DataLoader(ds, framework="numpy")


@pytest.mark.parametrize(
    "transforms, match",
    [
        ([T.CenterCrop(4)], "ToTensor"),
        ([T.Normalize(MEAN, STD), T.ToTensor()], "before it"),
        ([T.ToTensor(), T.RandomResizedCrop(4)], "before ToTensor"),
        ([lambda img: img, T.ToTensor()], "cannot apply"),
        ([T.Resize(8), T.ToTensor()], "depends on the image"),
        ([T.CenterCrop(4), T.PILToTensor(), T.Normalize(MEAN, STD)], "PILToTensor"),
        ([T.CenterCrop(4), T.ToTensor(), T.Normalize(MEAN, STD), T.Normalize(MEAN, STD)], "two Normalize"),
    ],
)
def test_pipelines_rust_cannot_run_are_refused(tmp_path, transforms, match):
    root = png_folder(tmp_path / "p", {"a": [np.zeros((8, 8, 3), np.uint8)]})
    with pytest.raises(ValueError, match=match):
        longshore.datasets.ImageFolder(root, transform=T.Compose(transforms))


def test_option_checks(tmp_path):
    root = png_folder(tmp_path / "o", {"a": [np.zeros((8, 8, 3), np.uint8)]})
    with pytest.raises(ValueError, match="target_transform"):
        longshore.datasets.ImageFolder(root, T.Compose([T.CenterCrop(4), T.ToTensor()]), target_transform=int)
    with pytest.raises(ValueError, match="interpolation"):
        T.Resize(8, interpolation="lanczos")
    with pytest.raises(ValueError, match="max_size"):
        T.Resize((8, 8), max_size=10)
    with pytest.raises(ValueError, match="std"):
        T.Normalize(MEAN, [0.2, 0.0, 0.2])
    with pytest.raises(ValueError, match="p="):
        T.RandomHorizontalFlip(1.5)
    # Nested Compose are flattened; a bare transform is wrapped in one (and needs a size).
    inner = T.Compose([T.Resize(4), T.CenterCrop(4)])
    ds = longshore.datasets.ImageFolder(root, T.Compose([inner, T.ToTensor()]))
    assert ds[0][0].shape == (3, 4, 4)
    with pytest.raises(ValueError, match="ToTensor"):
        longshore.datasets.ImageFolder(root, T.CenterCrop(4))


def test_image_folder_to_the_gpu_equals_the_cpu_batches(tmp_path):
    """On a GPU: ImageFolder batches with device="cuda" are torch tensors on the device, equal
    to the CPU path's (same seed and workers: same crops), and every lease comes back."""
    torch = need_cuda()
    longshore.datasets.write_synthetic_folder(tmp_path / "g", classes=3, per_class=4)
    pipeline = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    ds = longshore.datasets.ImageFolder(str(tmp_path / "g"), pipeline)
    cpu = batches(ds, batch_size=5, shuffle=True, seed=9, num_workers=2)
    pool = longshore.PinnedPool()
    dl = longshore.DataLoader(ds, batch_size=5, shuffle=True, seed=9, num_workers=2, device="cuda", pool=pool)
    gpu = list(dl)
    assert len(gpu) == len(cpu)
    for (x, y), (cx, cy) in zip(gpu, cpu):
        assert x.is_cuda and x.dtype == torch.float32 and y.dtype == torch.int64
        np.testing.assert_array_equal(x.cpu().numpy(), cx)
        np.testing.assert_array_equal(y.cpu().numpy(), cy)
    del gpu, x, y
    torch.cuda.synchronize()
    gc.collect()
    deadline = time.monotonic() + 5
    while pool.stats()["bytes_in_use"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.stats()["bytes_in_use"] == 0


def test_nvjpeg_option_checks(tmp_path):
    root = png_folder(tmp_path / "n", {"a": [np.zeros((8, 8, 3), np.uint8)]})
    ds = longshore.datasets.ImageFolder(root, T.Compose([T.CenterCrop(4), T.ToTensor()]))
    with pytest.raises(ValueError, match="device"):
        longshore.DataLoader(ds, framework="numpy", decode="nvjpeg")
    with pytest.raises(ValueError, match="'cpu' or 'nvjpeg'"):
        longshore.DataLoader(ds, framework="numpy", decode="gpu")
    with pytest.raises(ValueError, match="ImageFolder"):
        longshore.DataLoader(longshore.NpyDataset(_npy(tmp_path)), framework="numpy", decode="nvjpeg")


def _npy(tmp_path):
    p = tmp_path / "x.npy"
    np.save(p, np.zeros((4, 2), np.float32))
    return str(p)


def test_nvjpeg_batches_match_the_cpu_pipeline(tmp_path):
    """On a GPU: decode="nvjpeg" yields the CPU path's batches (same seed and workers: same
    crops and labels), pixels within nvJPEG's decoding differences."""
    torch = need_cuda()
    longshore.datasets.write_synthetic_folder(tmp_path / "j", classes=3, per_class=6)
    for pipeline in (
        T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]),
        T.Compose([T.Resize(56), T.CenterCrop(48), T.ToTensor(), T.Normalize(MEAN, STD)]),
    ):
        ds = longshore.datasets.ImageFolder(str(tmp_path / "j"), pipeline)
        cpu = batches(ds, batch_size=6, shuffle=True, seed=5, num_workers=2)
        dl = longshore.DataLoader(ds, batch_size=6, shuffle=True, seed=5, num_workers=2,
                                  device="cuda", decode="nvjpeg")
        gpu = list(dl)
        assert len(gpu) == len(cpu) == 3
        for (x, y), (cx, cy) in zip(gpu, cpu):
            assert x.is_cuda and x.dtype == torch.float32 and tuple(x.shape) == cx.shape
            np.testing.assert_array_equal(y.cpu().numpy(), cy)
            diff = np.abs(x.cpu().numpy() - cx) * np.asarray(STD, np.float32)[:, None, None] * 255
            assert diff.mean() < 2.0 and diff.max() < 40, (diff.mean(), diff.max())


def test_nvjpeg_resume_after_k_batches_yields_the_rest(tmp_path):
    """On a GPU: the nvJPEG path's state_dict counts the batches Python received (the device
    stage runs ahead of them), so a resumed loader yields exactly the rest, the same samples in
    the same order, the same pixels (each sample draws its own crop); the decoder is kept
    across epochs."""
    torch = need_cuda()
    longshore.datasets.write_synthetic_folder(tmp_path / "r", classes=3, per_class=10)
    pipeline = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToTensor(),
                          T.Normalize(MEAN, STD)])
    ds = longshore.datasets.ImageFolder(str(tmp_path / "r"), pipeline)

    def loader():
        return longshore.DataLoader(ds, batch_size=4, shuffle=True, seed=3, num_workers=2,
                                    device="cuda", decode="nvjpeg")

    full_x = [(x.cpu().numpy(), y.cpu().numpy()) for x, y in loader()]
    full = [y for _, y in full_x]
    assert len(full) == 8
    first = loader()
    it = iter(first)
    got = []
    for _ in range(3):
        x, y = next(it)
        assert x.is_cuda and tuple(x.shape) == (len(y), 3, 32, 32)
        got.append(y.cpu().numpy())
    state = first.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    rest = [(x.cpu().numpy(), y.cpu().numpy()) for x, y in resumed]
    got += [y for _, y in rest]
    assert len(got) == len(full)
    for y, fy in zip(got, full):
        np.testing.assert_array_equal(y, fy)
    # Each sample's crop is its own (random="sample", the default): the pixels too.
    for (x, _), (fx, _) in zip(rest, full_x[3:]):
        np.testing.assert_array_equal(x, fx)
    # A second epoch of one loader reuses its decoder and yields a whole epoch again.
    again = loader()
    assert sum(len(y) for _, y in again) == 30
    assert sum(len(y) for _, y in again) == 30
