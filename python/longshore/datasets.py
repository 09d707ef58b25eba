"""torchvision's ``ImageFolder``, decoded and transformed in Rust by the loader's workers.

>>> import longshore
>>> from longshore import transforms as T
>>> train = longshore.datasets.ImageFolder("/data/imagenet/train", transform=T.Compose([
...     T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
...     T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])]))   # doctest: +SKIP
>>> loader = longshore.DataLoader(train, batch_size=256, shuffle=True, num_workers=8,
...                               device="cuda")                     # doctest: +SKIP
>>> for images, labels in loader:  # f32 [256, 3, 224, 224], int64 [256]   # doctest: +SKIP
...     ...

The folder semantics are torchvision's: ``classes`` are the sorted sub-folder names,
``class_to_idx`` maps them to labels, ``samples`` lists ``(path, label)`` sorted by class then
path, files are filtered by torchvision's ``IMG_EXTENSIONS`` (case-insensitive), and a root
without class folders or a class folder without images is an error unless
``allow_empty=True``. A file that does not decode raises ``longshore.SampleError`` naming it
(``ValueError`` from ``dataset[i]``).
"""
import numpy as _np

from . import _longshore
from .transforms import Compose as _Compose

__all__ = ["ImageFolder", "IMG_EXTENSIONS", "write_synthetic_folder"]

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class ImageFolder:
    """``torchvision.datasets.ImageFolder(root, transform)`` with a
    :class:`longshore.transforms.Compose` pipeline (a single transform is wrapped in one).

    ``target_transform``, ``loader`` and ``is_valid_file`` are Python callables, which the Rust
    workers cannot run: anything but ``None`` is refused. ``max_pixels`` is the decompression
    bomb limit (default PIL's ``Image.MAX_IMAGE_PIXELS``; ``max_pixels=0`` disables it).
    JPEG and PNG files are decoded (other extensions are listed, as torchvision lists them,
    but fail to decode).
    """

    def __init__(self, root, transform=None, target_transform=None, loader=None,
                 is_valid_file=None, allow_empty=False, *, max_pixels=None):
        for name, value in (("target_transform", target_transform), ("loader", loader),
                            ("is_valid_file", is_valid_file)):
            if value is not None:
                raise ValueError(
                    f"ImageFolder({name}=...) takes a Python callable, which longshore's Rust "
                    "workers cannot run; leave it None"
                )
        if transform is not None and not isinstance(transform, _Compose):
            transform = _Compose([transform])
        self.root = str(root)
        self.transform = transform
        steps, output = transform._plan() if transform is not None else (None, None)
        self._native = _longshore._ImageFolder(
            self.root, steps, output, allow_empty=bool(allow_empty),
            max_pixels=max_pixels or None, no_pixel_limit=max_pixels == 0,
        )
        self.classes = self._native.classes
        self.class_to_idx = dict(self._native.class_to_idx)
        self.samples = self._native.samples
        self.imgs = self.samples
        self.targets = self._native.targets

    def __len__(self):
        return len(self._native)

    def __getitem__(self, index):
        """``(image, label)`` of sample ``index`` as a NumPy array and an int, outside the
        loader (random steps draw from a per-thread generator)."""
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"index {index} is out of range for an ImageFolder of {n} images")
        data, dtype, label = self._native.get(index)
        image = _np.frombuffer(bytearray(data), dtype=dtype).reshape(self._native.output_shape)
        return image, label

    def __repr__(self):
        return (f"ImageFolder(root={self.root!r}, classes={len(self.classes)}, "
                f"samples={len(self)}, transform={self.transform!r})")


def write_synthetic_folder(root, classes=4, per_class=3, mean_area=96 * 80, quality=90, seed=7):
    """Writes ``classes`` folders (``n0000``, ...) of ``per_class`` synthetic ImageNet-like
    JPEGs under ``root`` (longshore-vision's generator; reused when the same spec is there).
    Returns ``(images, bytes, reused)``."""
    return _longshore.write_synthetic_folder(
        str(root), classes, per_class, float(mean_area), int(quality), int(seed))
