"""torchvision's image transforms, with its names, parameters and defaults, run in Rust by the
loader's workers (``longshore-vision``): decoded, cropped, resized, flipped and normalised
straight into the batch.

>>> from longshore import transforms as T
>>> train = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
...                    T.ToTensor(), T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
>>> val = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(),
...                  T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])

A pipeline is geometric steps (``RandomResizedCrop``, ``Resize``, ``CenterCrop``,
``RandomHorizontalFlip``) on the decoded image, then ``ToTensor()`` (f32 ``[3, H, W]`` in
``[0, 1]``), optionally followed by ``Normalize(mean, std)``, or ``PILToTensor()`` (u8
``[3, H, W]``). Its output size must not depend on the image (end the geometry with a crop or
a ``Resize((h, w))``), so that images can be batched. Anything else, such as a Python
callable, a tensor transform, or a step after ``ToTensor()`` other than ``Normalize``, is
refused with a ``ValueError`` saying why: the pipeline runs in Rust, not in Python.

Interpolation follows torchvision on PIL images: bilinear (default) or bicubic, antialiased
when downscaling (``antialias`` is always on for PIL images in torchvision, so it is accepted
and ignored), or nearest.
"""
import enum
import numbers

__all__ = [
    "Compose",
    "RandomResizedCrop",
    "Resize",
    "CenterCrop",
    "RandomHorizontalFlip",
    "ToTensor",
    "PILToTensor",
    "Normalize",
    "InterpolationMode",
]


class InterpolationMode(enum.Enum):
    """torchvision's ``InterpolationMode`` (the modes longshore implements)."""

    NEAREST = "nearest"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"


def _interpolation(value, name):
    if isinstance(value, InterpolationMode):
        return value.value
    # torchvision's own enum (or its string values) without importing torchvision.
    text = getattr(value, "value", value)
    if isinstance(text, str) and text.lower() in ("nearest", "bilinear", "bicubic"):
        return text.lower()
    raise ValueError(
        f"{name}: interpolation {value!r} is not supported by longshore "
        "(use InterpolationMode.BILINEAR, BICUBIC or NEAREST)"
    )


def _size2(size, name):
    """An int or a sequence of 1 or 2 ints as (h, w), as torchvision's `_setup_size`."""
    if isinstance(size, numbers.Integral) and not isinstance(size, bool):
        return (int(size), int(size))
    try:
        seq = [int(s) for s in size]
    except TypeError:
        raise ValueError(f"{name}: size must be an int or a sequence of 1 or 2 ints, not {size!r}") from None
    if len(seq) == 1:
        return (seq[0], seq[0])
    if len(seq) == 2:
        return (seq[0], seq[1])
    raise ValueError(f"{name}: please provide only two dimensions (h, w) for size, not {size!r}")


def _check_positive(hw, name):
    if min(hw) <= 0:
        raise ValueError(f"{name}: size {hw} must be positive")


class _Step:
    """A geometric step of the pipeline."""

    def _desc(self):
        raise NotImplementedError

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"


class RandomResizedCrop(_Step):
    """A random box of random area (``scale``, a fraction of the image) and aspect ratio
    (``ratio``, width / height), resized to ``size``: torchvision's algorithm (10 tries, then
    the central-crop fallback), drawing from the loader worker's seeded generator."""

    def __init__(self, size, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0),
                 interpolation=InterpolationMode.BILINEAR, antialias=True):
        self.size = _size2(size, "RandomResizedCrop")
        _check_positive(self.size, "RandomResizedCrop")
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        if self.scale[0] > self.scale[1] or self.ratio[0] > self.ratio[1]:
            # torchvision warns and goes on; its sampler then draws from an empty range.
            raise ValueError(f"RandomResizedCrop: scale and ratio should be of kind (min, max), got {scale}, {ratio}")
        self.interpolation = _interpolation(interpolation, "RandomResizedCrop")
        self.antialias = antialias

    def _desc(self):
        return ("random_resized_crop", self.size, self.scale, self.ratio, self.interpolation)


class Resize(_Step):
    """``Resize(size)``: the shorter side to ``size`` keeping the aspect ratio (the longer
    side truncated as torchvision does, capped by ``max_size``); ``Resize((h, w))``: exactly
    ``h x w``."""

    def __init__(self, size, interpolation=InterpolationMode.BILINEAR, max_size=None, antialias=True):
        if isinstance(size, numbers.Integral) and not isinstance(size, bool):
            self.size = int(size)
            _check_positive((self.size,), "Resize")
        else:
            seq = [int(s) for s in size]
            if len(seq) == 1:
                self.size = seq[0]
                _check_positive((self.size,), "Resize")
            elif len(seq) == 2:
                self.size = (seq[0], seq[1])
                _check_positive(self.size, "Resize")
            else:
                raise ValueError(f"Resize: size must be an int or a sequence of 1 or 2 ints, not {size!r}")
        if max_size is not None and not isinstance(self.size, int):
            raise ValueError(
                "Resize: max_size should only be passed if size specifies the length of the "
                f"smaller edge, i.e. size should be an int or a sequence of length 1; got {size!r}"
            )
        self.max_size = max_size
        self.interpolation = _interpolation(interpolation, "Resize")
        self.antialias = antialias

    def _desc(self):
        return ("resize", self.size, self.max_size, self.interpolation)


class CenterCrop(_Step):
    """The central ``size`` box (torchvision's rounding; zero padding where the crop is larger
    than the image)."""

    def __init__(self, size):
        self.size = _size2(size, "CenterCrop")
        _check_positive(self.size, "CenterCrop")

    def _desc(self):
        return ("center_crop", self.size)


class RandomHorizontalFlip(_Step):
    """Mirrors the image with probability ``p``."""

    def __init__(self, p=0.5):
        p = float(p)
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"RandomHorizontalFlip: p={p} must be in [0, 1]")
        self.p = p

    def _desc(self):
        return ("hflip", self.p)


class ToTensor:
    """The image as f32 ``[3, H, W]`` in ``[0, 1]``."""

    def __repr__(self):
        return "ToTensor()"


class PILToTensor:
    """The image as u8 ``[3, H, W]`` (to normalise on the device)."""

    def __repr__(self):
        return "PILToTensor()"


class Normalize:
    """``(x - mean[c]) / std[c]`` after ``ToTensor()``, fused with it. ``mean`` and ``std``
    have 3 values, or 1 applied to every channel."""

    def __init__(self, mean, std, inplace=False):
        self.mean = self._three(mean, "mean")
        self.std = self._three(std, "std")
        if any(not s > 0 for s in self.std):
            raise ValueError(f"Normalize: std evaluated to zero or less, leading to division by zero: {std!r}")
        self.inplace = inplace

    @staticmethod
    def _three(values, name):
        if isinstance(values, numbers.Real):
            values = [values]
        values = [float(v) for v in values]
        if len(values) == 1:
            values = values * 3
        if len(values) != 3:
            raise ValueError(f"Normalize: {name} has {len(values)} values; RGB images need 3 (or 1)")
        return tuple(values)

    def __repr__(self):
        return f"Normalize(mean={list(self.mean)}, std={list(self.std)})"


class Compose:
    """A pipeline of the transforms of this module, in torchvision's order (see the module's
    documentation for what it can hold). Nested ``Compose`` are flattened. The pipeline is
    checked when an ``ImageFolder`` takes it."""

    def __init__(self, transforms):
        self.transforms = list(transforms)

    def _plan(self):
        """(step descriptions, output description) for the Rust pipeline; checked when a
        dataset takes the pipeline (a nested Compose may hold a part of one)."""
        return _plan(self.transforms)

    def __repr__(self):
        inner = "".join(f"\n    {t!r}" for t in self.transforms)
        return f"Compose({inner}\n)"


def _flatten(transforms):
    for t in transforms:
        if isinstance(t, Compose):
            yield from _flatten(t.transforms)
        else:
            yield t


def _plan(transforms):
    """(step descriptions, output description) for the Rust pipeline, or a ValueError."""
    steps, output, normalized = [], None, False
    for t in _flatten(transforms):
        name = type(t).__name__
        if isinstance(t, _Step):
            if output is not None:
                raise ValueError(
                    f"{name} after {output[0] == 'u8_chw' and 'PILToTensor' or 'ToTensor'}(): "
                    "longshore runs geometric transforms on the decoded image, before the "
                    "conversion to a tensor; move it before ToTensor()"
                )
            steps.append(t._desc())
        elif isinstance(t, ToTensor):
            if output is not None:
                raise ValueError("ToTensor() appears twice in the pipeline")
            output = ("to_tensor",)
        elif isinstance(t, PILToTensor):
            if output is not None:
                raise ValueError("PILToTensor() after ToTensor() is not a pipeline longshore can run")
            output = ("u8_chw",)
        elif isinstance(t, Normalize):
            if output is None:
                raise ValueError("Normalize() needs a tensor: put ToTensor() before it")
            if output[0] == "u8_chw":
                raise ValueError(
                    "Normalize() after PILToTensor() (uint8) is refused, as torchvision refuses "
                    "it; use ToTensor() before Normalize(), or normalise the u8 batch yourself"
                )
            if normalized:
                raise ValueError(
                    "two Normalize() steps: longshore fuses one Normalize with ToTensor(); "
                    "combine them into one (mean and std of the composition)"
                )
            output = ("normalize", t.mean, t.std)
            normalized = True
        else:
            raise ValueError(
                f"longshore.transforms.Compose runs in Rust and cannot apply {t!r}: it takes "
                "RandomResizedCrop, Resize, CenterCrop, RandomHorizontalFlip, then ToTensor() "
                "[+ Normalize(mean, std)] or PILToTensor(), from longshore.transforms"
            )
    if output is None:
        raise ValueError(
            "the pipeline must end with ToTensor() [+ Normalize(mean, std)] or PILToTensor(): "
            "without it torchvision yields PIL images, which cannot be batched"
        )
    return steps, output
