"""Datasets read in Rust by the loader's workers: image datasets decoded and transformed
there (torchvision's ``ImageFolder`` over a local folder, and image shards in object storage:
``WebDataset`` tar shards, MosaicML ``StreamingDataset``'s MDS, read through longshore's shard
cache), and language-model token files cut into fixed-length sequences (``TokenDataset``).

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
import glob as _glob
from operator import attrgetter as _attrgetter
import os as _os
import sys as _sys

import numpy as _np

from . import _logs, _longshore, _workers
from .data import _dist_world
from .transforms import Compose as _Compose

__all__ = ["ImageFolder", "IMG_EXTENSIONS", "WebDataset", "StreamingDataset", "ParquetDataset",
           "TokenDataset", "write_shards", "write_synthetic_folder", "write_token_file"]

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class ImageFolder:
    """``torchvision.datasets.ImageFolder(root, transform)`` with a
    :class:`longshore.transforms.Compose` pipeline (a single transform is wrapped in one).

    ``target_transform``, ``loader`` and ``is_valid_file`` are Python callables, which the Rust
    workers cannot run: anything but ``None`` is refused. ``max_pixels`` is the decompression
    bomb limit (default PIL's ``Image.MAX_IMAGE_PIXELS``; ``max_pixels=0`` disables it).
    ``random``: where random steps draw from: ``"sample"`` (default) gives each sample a
    generator of its own, a pure function of (the loader's seed, epoch, sample), so the crops
    do not depend on the number of workers and a resumed epoch (``load_state_dict``) yields
    the uninterrupted epoch's batches, pixels included, with ``decode="cpu"`` and
    ``"nvjpeg"`` alike; ``"worker"`` draws from each worker's generator, as torch's
    transforms draw from the worker's torch generator.
    JPEG and PNG files are decoded (other extensions are listed, as torchvision lists them,
    but fail to decode).
    """

    def __init__(self, root, transform=None, target_transform=None, loader=None,
                 is_valid_file=None, allow_empty=False, *, max_pixels=None, random="sample"):
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
            max_pixels=max_pixels or None, no_pixel_limit=max_pixels == 0, random=random,
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


def _dist_layout(rank, world_size):
    """``(rank, world_size)``: both as given, or neither (``longshore.data._dist_world``: the
    process group's, else the launcher's variables), else ``(None, None)``: a single process."""
    if (rank is None) != (world_size is None):
        raise ValueError("give both rank and world_size, or neither")
    rank, world_size = _dist_world(rank, world_size)
    if rank is None or world_size is None:
        return None, None
    return int(rank), int(world_size)


def _budget(value, name):
    """Bytes from an int or a string with a unit (``"10gb"``, ``"512MiB"``, as Streaming's
    ``cache_limit`` takes them)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a number of bytes or a string such as '10gb'")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"{name} must be positive, not {value}")
        return value
    text = str(value).strip().lower().replace(" ", "")
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
             "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "k": 10**3, "m": 10**6,
             "g": 10**9, "t": 10**12, "b": 1}
    for unit, scale in units.items():
        if text.endswith(unit):
            number = text[: -len(unit)]
            break
    else:
        number, scale = text, 1
    try:
        n = int(float(number) * scale)
    except ValueError:
        raise ValueError(f"{name}: {value!r} is not a size (bytes, or a number with a unit "
                         "such as '10gb' or '512MiB')") from None
    if n <= 0:
        raise ValueError(f"{name} must be positive, not {value!r}")
    return n


def _storage_options(options):
    """``storage_options`` as the native dataset takes it: a dict of str to str, or None."""
    if options is None:
        return None
    if not isinstance(options, dict):
        raise TypeError(f"storage_options must be a dict, not {type(options).__name__}")
    return {str(k): (str(v).lower() if isinstance(v, bool) else str(v))
            for k, v in options.items()}


FIELD_DECODERS = ("image", "int", "float", "text", "json", "bytes", "array")


def _fields(fields, transform, owner):
    """``fields=`` as the native dataset takes it: ``[(name, decoder)]`` in the dict's order,
    checked (known decoders, at most one image field, an image field only with a transform),
    or None."""
    if fields is None:
        return None
    if not isinstance(fields, dict):
        raise TypeError(f"{owner}(fields=...) takes a dict {{field name: decoder}}, not "
                        f"{type(fields).__name__}")
    if not fields:
        raise ValueError(f"{owner}(fields={{}}): name at least one field")
    out = []
    images = []
    for name, decoder in fields.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"{owner}(fields=...): field names are non-empty strings, not "
                             f"{name!r}")
        if decoder not in FIELD_DECODERS:
            raise ValueError(
                f"{owner}(fields=...): field {name!r} has an unknown decoder {decoder!r} "
                f"(one of {', '.join(repr(d) for d in FIELD_DECODERS)})")
        if decoder == "image":
            images.append(name)
        out.append((name, decoder))
    if len(images) > 1:
        raise ValueError(f"{owner}(fields=...): two image fields, {images[0]!r} and "
                         f"{images[1]!r}: at most one field is decoded as an image")
    if images and transform is None:
        raise ValueError(
            f"{owner}(fields=...): image field {images[0]!r} needs transform=Compose([..., "
            "ToTensor()]): images are decoded and batched in Rust, at a fixed output size")
    return out


class _ImageShards:
    """What WebDataset and StreamingDataset share: an iterable dataset of ``(image, label)``
    from image shards, read by longshore's Rust workers. See :class:`WebDataset`."""

    _format = None

    def _make(self, urls, transform, *, spec, index, image_key, label_key, seed, shuffle,
              shuffle_block, rank, world_size, cache_dir, cache_budget, job, prefetch_shards,
              max_pixels, storage_options=None, fields=None, map=None, range_reads=True):
        if isinstance(urls, (str, bytes)) or hasattr(urls, "__fspath__"):
            urls = [urls]
        urls = [str(u) for u in urls]
        fields = _fields(fields, transform, type(self).__name__)
        if map is not None and (fields is None or not callable(map)):
            raise ValueError(
                f"{type(self).__name__}(map=...) takes a callable run on each sample's fields "
                "(a dict {field: value}) in the loader's worker processes: give fields= too")
        if transform is None and fields is None:
            raise ValueError(
                f"{type(self).__name__} needs transform=Compose([..., ToTensor()]): its "
                "images are decoded and batched in Rust, which needs a fixed output size")
        if transform is not None and not isinstance(transform, _Compose):
            transform = _Compose([transform])
        steps, output = transform._plan() if transform is not None else (None, None)
        self.fields = None if fields is None else dict(fields)
        rank, world_size = _dist_layout(rank, world_size)
        self.transform = transform
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        # What a mixture of this dataset and others reads with (data.Mixture).
        self._options = dict(shuffle_block=shuffle_block,
                             cache_dir=None if cache_dir is None else str(cache_dir),
                             cache_budget=_budget(cache_budget, "cache_budget"), job=job,
                             prefetch_shards=prefetch_shards, range_reads=bool(range_reads))
        _logs.ensure_started()  # what resolving finds (a damaged shard) reaches logging
        # What makes the native dataset again in a worker process (from the resolved spec).
        self._native_args = (steps, output, dict(
            index=index, image_key=image_key, label_key=label_key, seed=self.seed,
            shuffle=self.shuffle, rank=rank, world_size=world_size, **self._options,
            max_pixels=max_pixels or None, no_pixel_limit=max_pixels == 0,
            storage_options=_storage_options(storage_options), fields=fields))
        self._native = _longshore._Shards(self._format, urls, steps, output, spec=spec,
                                          **self._native_args[2])
        self.rank, self.world_size = self._native.rank
        self._epoch = 0
        self.map_fn = map
        self._layout = (1, False)  # the loader's batch size and drop_last (map=)

    urls = property(_attrgetter("_native.urls"),
                    doc="The shards' URLs, in the dataset's canonical order.")
    spec = property(_attrgetter("_native.spec_json"),
                    doc="The resolved shard list and sample counts (JSON text). Pass it as "
                        "``spec=`` to the other ranks' datasets: the job then lists the bucket "
                        "and reads the index once.")

    def __len__(self):
        """Samples in one epoch of the whole dataset, all ranks together (a rank's loader
        yields ``len(loader)`` batches)."""
        return len(self._native)

    def set_epoch(self, epoch):
        """The epoch that iterating this dataset outside a loader reads (a loader has its
        own: ``DataLoader.set_epoch``)."""
        self._epoch = int(epoch)

    def __iter__(self):
        """This rank's samples of the epoch as ``(image, label)`` NumPy arrays and ints,
        outside a loader (one reader thread): for a look at the data. Train through
        ``longshore.DataLoader``, whose workers read and decode in parallel. (A dataset read
        with ``fields=`` is iterated through the loader.)"""
        if self.map_fn is not None:
            yield from self._mapped()
            return
        if self.fields is not None:
            raise TypeError(
                f"{type(self).__name__}(fields=...) is iterated through longshore.DataLoader, "
                "whose batches are dicts of the fields")
        shape = tuple(self._native.output_shape)
        for data, dtype, label in self._native.iter_epoch(self._epoch):
            yield _np.frombuffer(bytearray(data), dtype=dtype).reshape(shape), label

    # --- map=: a Python function over each sample's fields, in worker processes ----------

    def _bind_loader(self, batch_size, drop_last):
        """The loader's batch size and drop_last (``map=``): each worker's stream is planned
        in whole batches of it, so that every rank yields the same number of batches."""
        self._layout = (int(batch_size), bool(drop_last))

    def _mapped(self):
        """This worker's samples of the loader's epoch: each sample's fields decoded (an image
        by the pipeline, text, JSON, numbers, arrays), as a dict with ``"__key__"``, then
        ``map_fn`` of it."""
        import json as _json

        info = _workers.get_worker_info()
        if info is None:
            torch = _sys.modules.get("torch")  # torch's DataLoader runs this dataset
            info = None if torch is None else torch.utils.data.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        epoch = _workers.loader_epoch()
        epoch = self._epoch if epoch is None else epoch
        batch_size, drop_last = self._layout
        kinds = self.fields
        for record in self._native.records(epoch, worker, workers, batch_size, drop_last):
            for name, kind in kinds.items():
                v = record[name]
                if kind in ("image", "array"):
                    data, dtype, shape = v
                    record[name] = _np.frombuffer(data, dtype=dtype).reshape(shape)
                elif kind == "json":
                    record[name] = _json.loads(v)
            yield self.map_fn(record)

    def _shard_stats(self):
        """``map=``: this process's counts of what its worker read (``records_stats``), keyed
        by process and dataset (worker threads share one dataset), or ``None``; a worker sends
        them with each batch, and the loader adds its workers' up in ``stats["shards"]``."""
        if self.map_fn is None or self._native is None:
            return None
        counts = self._native.records_stats()
        if counts is None:
            return None
        return (_os.getpid(), id(self._native)), counts

    def __getstate__(self):
        # A worker process started by spawn or forkserver makes the native dataset again from
        # the resolved spec (no listing).
        state = self.__dict__.copy()
        state["_native"] = None
        state["_spec_json"] = self._native.spec_json
        return state

    def __setstate__(self, state):
        spec = state.pop("_spec_json", None)
        self.__dict__.update(state)
        if self._native is None and spec is not None and self._native_args is not None:
            steps, output, kwargs = self._native_args
            self._native = _longshore._Shards(self._format, [], steps, output, spec=spec,
                                              **kwargs)

    def __repr__(self):
        return (f"{type(self).__name__}(shards={len(self.urls)}, samples={len(self)}, "
                f"rank={self.rank}/{self.world_size}, shuffle={self.shuffle}, "
                f"transform={self.transform!r}"
                + ("" if self.fields is None else f", fields={self.fields!r}") + ")")


class _ShardMixture(_ImageShards):
    """A weighted mixture of sharded datasets (:class:`WebDataset`, :class:`StreamingDataset`
    or :class:`ParquetDataset` members of one format): what ``longshore.data.Mixture`` makes of
    them. The members' samples are drawn by the map-style ``Mixture``'s schedule (the same
    weights, stop rules and proportions), each member read in its own shuffled order; the
    mixture is one sharded dataset for ``longshore.DataLoader``: every rank the same number of
    batches, exact resume on any number of ranks or workers, the node's shard cache. The
    members share one ``transform`` and ``fields`` (member 0's are used), and member 0's
    cache options and store apply."""

    def __init__(self, datasets, weights, *, stop, seed, shuffle):
        self.datasets = list(datasets)
        first = self.datasets[0]
        for i, d in enumerate(self.datasets[1:], 1):
            if type(d) is not type(first):
                raise ValueError(f"Mixture: member {i} is a {type(d).__name__}, member 0 a "
                                 f"{type(first).__name__}: a mixture of sharded datasets is of "
                                 "one format")
            if d.fields != first.fields:
                raise ValueError(f"Mixture: member {i} reads fields={d.fields!r}, member 0 "
                                 f"fields={first.fields!r}: the members' batches are one "
                                 "batch, of one set of fields")
            plan = None if d.transform is None else d.transform._plan()
            if plan != (None if first.transform is None else first.transform._plan()):
                raise ValueError(f"Mixture: member {i}'s transform differs from member 0's: "
                                 "the members' images are decoded by one pipeline")
        self.weights = [float(w) for w in weights]
        self.stop = stop
        self.map_fn = None
        self._native_args = None
        self._layout = (1, False)
        self.fields = first.fields
        self.transform = first.transform
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self._options = dict(first._options)
        self._native = _longshore._Shards.mixture(
            [d._native for d in self.datasets], self.weights, stop, seed=self.seed & (2**64 - 1),
            shuffle=self.shuffle, **self._options)
        self.rank, self.world_size = self._native.rank
        self._epoch = 0

    draws = property(_attrgetter("_native.member_draws"),
                     doc="Each member's draws in an epoch (all ranks together).")

    def __repr__(self):
        return (f"Mixture({len(self.datasets)} {type(self.datasets[0]).__name__} members, "
                f"weights={self.weights}, stop={self.stop!r}, samples={len(self)}, "
                f"rank={self.rank}/{self.world_size})")


class WebDataset(_ImageShards):
    """Image-classification WebDataset shards (``.jpg``/``.png`` + ``.cls`` in tar files) in
    object storage or on disk, as ``longshore.DataLoader`` reads them: shards downloaded
    into a node-wide cache, images decoded and transformed by Rust workers, the global order a
    pure function of ``(seed, epoch)``, every rank the same number of batches, exact resume on
    any number of GPUs or workers.

    >>> from longshore import transforms as T
    >>> train = longshore.datasets.WebDataset(
    ...     "s3://bucket/train/shard-{000000..000146}.tar", shuffle=True, seed=0,
    ...     transform=T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
    ...                          T.ToTensor(), T.Normalize(mean, std)]))   # doctest: +SKIP
    >>> loader = longshore.DataLoader(train, batch_size=256, num_workers=8,
    ...                               device="cuda")                      # doctest: +SKIP
    >>> for epoch in range(90):                                           # doctest: +SKIP
    ...     loader.set_epoch(epoch)
    ...     for images, labels in loader:
    ...         ...

    ``urls``: one pattern or a list (``s3://``, ``gs://``, ``az://``, ``http(s)://``,
    ``file://`` or a path), brace ranges ``{000..099}`` and alternatives ``{a,b}`` expanded as
    the ``webdataset`` package does. Credentials and endpoints come from the environment as
    the cloud SDKs read them (``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL`` for an
    S3-compatible store, ...), or from ``storage_options``, a dict of object_store's
    configuration keys (``{"aws_endpoint": ..., "aws_access_key_id": ...}``,
    ``{"azure_storage_account_name": ..., "azure_storage_endpoint": ...}``,
    ``{"google_service_account_key": ...}``; every key starts with ``aws_``, ``google_`` or
    ``azure_``), over the environment. Sample counts come from a wids index (``index=``, else a
    ``shard-index.json`` or ``index.json`` beside the shards); without one each shard is
    scanned once here.

    ``transform``: a :class:`longshore.transforms.Compose` ending in ``ToTensor()`` (and
    ``Normalize``), run in Rust with per-sample seeds (the same crops on any number of
    workers or ranks). ``image_key``: the image field (default the first of jpg, jpeg, png,
    webp), ``label_key``: the label field (default ``cls``).

    ``shuffle``/``seed``: shards shuffled, then samples shuffled within blocks of about
    ``shuffle_block`` samples (whole shards; default 262,144, Streaming's smallest block;
    ``0``: shard order only; a batch then holds samples of 71% as many shards as a full
    permutation would give on ImageNet-sized data, see the Rust docs of
    ``longshore::shards::order``). The loader's ``shuffle``, ``sampler`` and ``batch_sampler`` must stay unset, as
    for any ``IterableDataset``.

    ``rank``/``world_size``: default torch.distributed's when a process group is up, else the
    launcher's variables (``RANK``, ``WORLD_SIZE``), else a single process. Each rank's loader
    yields the same number of batches: with ``drop_last=False`` the last samples are padded
    by repeating early ones, with ``drop_last=True`` the remainder is dropped.

    ``cache_dir`` (default a per-dataset folder under the system temp dir), ``cache_budget``
    (bytes or ``"20gb"``; a budget below the largest shard is refused here),
    ``prefetch_shards`` (shards each worker downloads ahead of those it reads, default 2),
    ``job`` (the cache's name, shared by a job's ranks on a node). ``range_reads`` (default
    True): with a budget below the shuffle window's working set, reads of shards not on disk
    that the cache could not keep (a wide shuffle's) are range requests of each sample's bytes
    instead of downloads of its whole shard, counted in
    ``loader.stats["shards"]["range_reads"]``; False downloads the shard for every such read
    (see the object-storage guide).

    ``spec``: :attr:`spec` of a dataset made on another rank (then ``urls`` may be empty): no
    listing here.

    ``fields``: other fields than ``(image, label)`` (CLIP-style ``.jpg`` + ``.txt``, labels
    with metadata): a dict ``{field: decoder}`` (a WebDataset extension such as ``"jpg"``,
    ``"txt"``, ``"json"``, ``"cls"``; an MDS or Parquet column name), each decoder one of
    ``"image"`` (decoded and transformed by ``transform``, at most one such field; a float
    tensor ``[B, 3, H, W]`` or what the pipeline outputs), ``"int"`` (int64 ``[B]``),
    ``"float"`` (float64 ``[B]``), ``"text"`` (``list[str]``, UTF-8), ``"json"`` (a list of
    ``json.loads`` of each), ``"bytes"`` (``list[bytes]``) or ``"array"`` (a ``.npy``
    member, an MDS ``ndarray`` column or a Parquet list of numbers: one tensor ``[B, ...]`` of
    the array's own dtype, the samples' arrays stacked as torch's ``default_collate`` stacks
    tensors, so fixed-length token sequences, embeddings and masks; a batch whose arrays differ
    in shape or dtype is an error naming two of its samples). Batches are then dicts
    ``{field: value}`` in the dict's order (``image_key``/``label_key`` are not used); without
    an image field ``transform`` may be None. A sample missing a field, or whose text is not
    UTF-8 or JSON not JSON, is a sample error naming the shard, key and field (the loader's
    ``on_sample_error`` applies). Text, JSON and bytes travel from the Rust workers as one
    byte tensor and its offsets per batch, turned into Python lists as each batch is
    delivered. With ``DataLoader(..., device="cuda", decode="nvjpeg")`` the image field is
    decoded on the GPU by nvJPEG (the same crops, from the same per-sample seeds) and the
    other fields travel beside it into the same dict. Such a dataset is iterated through
    ``longshore.DataLoader`` only.

    ``map``: a Python function run on each sample, for what no decoder does (a tokenizer, an
    audio decoder, your own augmentation): with ``fields``, each sample's fields are decoded
    as above (an image by ``transform`` into a NumPy array, text as ``str``, JSON parsed,
    arrays as NumPy arrays), put in a dict with ``"__key__"`` (``shard-url#key``), and
    ``map(sample)`` is what the loader batches (``default_collate``, or ``collate_fn``). The
    dataset is then read in the loader's worker processes (``num_workers``,
    ``multiprocessing_context`` as for any Python dataset), each worker its planned stream of
    the shards, so ranks stay equal and images are decoded with the same per-sample seeds as
    without ``map``. It must be picklable for ``spawn``/``forkserver`` workers (a module-level
    function).

    Epochs: each iteration of a ``longshore.DataLoader`` reads the next epoch (0, 1, ...)
    unless ``loader.set_epoch(e)`` chose one; ``loader.state_dict()`` after ``k`` batches and
    ``load_state_dict`` in a new job (any number of ranks or workers) resume exactly the rest.
    """

    _format = "webdataset"

    def __init__(self, urls, transform=None, *, shuffle=False, seed=0, shuffle_block=None,
                 image_key=None, label_key="cls", index=None, rank=None, world_size=None,
                 cache_dir=None, cache_budget=None, prefetch_shards=None, job=None, spec=None,
                 max_pixels=None, storage_options=None, fields=None, map=None,
                 range_reads=True):
        self._make(urls, transform, spec=spec, index=index, image_key=image_key,
                   label_key=label_key, seed=seed, shuffle=shuffle,
                   shuffle_block=shuffle_block, rank=rank, world_size=world_size,
                   cache_dir=cache_dir, cache_budget=cache_budget, job=job,
                   prefetch_shards=prefetch_shards, max_pixels=max_pixels,
                   storage_options=storage_options, fields=fields, map=map,
                   range_reads=range_reads)


class StreamingDataset(_ImageShards):
    """An MDS image dataset (MosaicML Streaming's format: ``index.json`` + ``shard.*.mds``)
    with Streaming's argument names, read by longshore's loader as :class:`WebDataset` reads
    tar shards (same order, cache, equal batches per rank and exact resume).

    >>> train = longshore.datasets.StreamingDataset(
    ...     remote="s3://bucket/imagenet-mds", split="train", local="/tmp/cache",
    ...     shuffle=True, transform=T.Compose([...]))                     # doctest: +SKIP

    ``remote``: the dataset's root URL (S3, GCS, Azure, HTTP, a path); ``local``: the cache
    folder (with no ``remote``, the dataset itself, read from disk); ``split``: a sub-folder
    of both. ``cache_limit``: the cache's budget (bytes or ``"10gb"``). ``shuffle_seed``
    (Streaming's default 9176), ``shuffle_block_size``: as :class:`WebDataset`'s ``seed`` and
    ``shuffle_block``. The orders differ from Streaming's own (the algorithm is longshore's:
    see :class:`WebDataset`). ``batch_size`` is taken from the loader; if given it must match
    it. ``image_key`` (default: the first of jpg, jpeg, png, webp) and ``label_key``
    (default ``cls``) name the columns: an image column of encoding ``jpeg`` or ``png``, an
    integer column. Compressed shards are refused (decompress them with Streaming first).
    ``fields``: columns by name, as :class:`WebDataset`'s (``{"jpg": "image", "caption":
    "text", "cls": "int"}``; ``"int"`` and ``"float"`` decode the column with its encoding,
    ``"text"``/``"json"``/``"bytes"`` take its bytes).
    """

    _format = "mds"

    def __init__(self, *, remote=None, local=None, split=None, transform=None, shuffle=False,
                 shuffle_seed=9176, shuffle_block_size=None, cache_limit=None, batch_size=None,
                 image_key=None, label_key="cls", rank=None, world_size=None,
                 prefetch_shards=None, job=None, spec=None, max_pixels=None,
                 storage_options=None, fields=None, map=None, range_reads=True):
        if remote is None and local is None and spec is None:
            raise ValueError("StreamingDataset needs remote= (or local= for a dataset on disk)")
        root = str(remote if remote is not None else local or "")
        if split is not None:
            root = root.rstrip("/") + "/" + str(split)
        cache = None
        if remote is not None and local is not None:
            cache = str(local) if split is None else str(local).rstrip("/") + "/" + str(split)
        self.batch_size = batch_size
        self._make([root] if spec is None else [], transform, spec=spec, index=None,
                   image_key=image_key, label_key=label_key, seed=shuffle_seed,
                   shuffle=shuffle, shuffle_block=shuffle_block_size, rank=rank,
                   world_size=world_size, cache_dir=cache, cache_budget=cache_limit, job=job,
                   prefetch_shards=prefetch_shards, max_pixels=max_pixels,
                   storage_options=storage_options, fields=fields, map=map,
                   range_reads=range_reads)


class ParquetDataset(_ImageShards):
    """Image-classification Parquet files (what Hugging Face datasets store: an ``image``
    column of ``struct<bytes, path>`` and an integer ``label``), read by longshore's loader as
    :class:`WebDataset` reads tar shards: each file a shard, each row a sample, row counts read
    from the files' footers (range requests) when the dataset is made.

    >>> train = longshore.datasets.ParquetDataset(
    ...     "s3://bucket/imagenet/data/train-{00000..00146}-of-00147.parquet",
    ...     shuffle=True, transform=T.Compose([...]))                     # doctest: +SKIP

    ``image_key`` (default ``image``): a binary column or a struct with a ``bytes`` child;
    ``label_key`` (default ``label``): an integer column. The other arguments are
    :class:`WebDataset`'s (``fields`` names columns). Snappy, gzip, LZ4 and zstd files are
    read (brotli is refused).
    """

    _format = "parquet"

    def __init__(self, urls, transform=None, *, shuffle=False, seed=0, shuffle_block=None,
                 image_key="image", label_key="label", rank=None, world_size=None,
                 cache_dir=None, cache_budget=None, prefetch_shards=None, job=None, spec=None,
                 max_pixels=None, storage_options=None, fields=None, map=None):
        self._make(urls, transform, spec=spec, index=None, image_key=image_key,
                   label_key=label_key, seed=seed, shuffle=shuffle,
                   shuffle_block=shuffle_block, rank=rank, world_size=world_size,
                   cache_dir=cache_dir, cache_budget=cache_budget, job=job,
                   prefetch_shards=prefetch_shards, max_pixels=max_pixels,
                   storage_options=storage_options, fields=fields, map=map)


def write_shards(out, samples, format="webdataset", shard_size=64 << 20, image_ext="jpg"):
    """Writes ``samples`` (an iterable of ``(encoded image bytes, label)``) as shards of about
    ``shard_size`` bytes under ``out``: ``"webdataset"`` tar shards (``shard-000000.tar``, ...,
    members ``{key}.{image_ext}`` and ``{key}.cls``) with their wids index
    ``shard-index.json``, or an ``"mds"`` dataset (``index.json`` and ``shard.00000.mds``, ...,
    columns ``jpg`` (jpeg) and ``cls`` (int), byte-identical to Streaming's ``MDSWriter``).
    Returns the shard file names."""
    return _longshore.write_image_shards(
        format, str(out), [(bytes(b), int(label)) for b, label in samples], int(shard_size),
        image_ext)


def _token_paths(paths):
    """The token files of ``paths``: one path, a glob pattern (``"data/train-*.bin"``, sorted;
    none matching is an error) or an iterable of paths, in the order given."""
    if isinstance(paths, (str, bytes)) or hasattr(paths, "__fspath__"):
        path = _os.fsdecode(_os.fspath(paths))
        if _glob.has_magic(path) and not _os.path.exists(path):
            found = sorted(_glob.glob(path))
            if not found:
                raise FileNotFoundError(f"no token files match {path!r}")
            return found
        return [path]
    found = [_os.fsdecode(_os.fspath(p)) for p in paths]
    if not found:
        raise ValueError("TokenDataset needs at least one token file")
    return found


def _token_dtype(dtype):
    """``"uint16"`` or ``"uint32"`` from a NumPy dtype or its name (little-endian, or native
    byte order on a little-endian machine)."""
    dt = _np.dtype(dtype)
    if dt.name not in ("uint16", "uint32") or dt.byteorder == ">" or (
            dt.byteorder == "=" and _np.little_endian is False):
        raise ValueError(
            f"dtype={dtype!r}: token files hold little-endian uint16 (nanoGPT's) or uint32 tokens")
    return dt.name


def write_token_file(dataset, path, field, *, dtype=_np.uint16, separator=None):
    """Writes the token documents of a sharded dataset into one flat token file, the file
    :class:`TokenDataset` reads: field ``field`` of every sample (a 1-D integer array: a
    Parquet list column such as a Hugging Face tokenized dataset's ``input_ids``, an MDS
    ``ndarray`` column, a ``.npy`` member), in the dataset's canonical order (the shards as
    listed, each in file order, every rank's samples), each document followed by
    ``separator`` when given (GPT-2's ``<|endoftext|>``: 50256). ``dataset``: a
    :class:`WebDataset`, :class:`StreamingDataset` or :class:`ParquetDataset` (local or in
    object storage, read through its shard cache). Returns ``(tokens, documents)``.

    A token that ``dtype`` (uint16 or uint32) cannot hold, a negative one, or a field that is
    not a 1-D integer array is an error naming the sample; the file is written beside
    ``path`` and put in place at the end, so an interrupted conversion leaves none.

    >>> tokens, docs = longshore.datasets.write_token_file(
    ...     longshore.datasets.ParquetDataset("s3://bucket/tokenized/*.parquet",
    ...                                       fields={"input_ids": "array"}),
    ...     "train.bin", "input_ids", separator=50256)                       # doctest: +SKIP
    >>> train = longshore.datasets.TokenDataset("train.bin", seq_len=2048,
    ...                                         separator=50256)            # doctest: +SKIP
    """
    native = getattr(dataset, "_native", None)
    if not isinstance(native, _longshore._Shards):
        raise TypeError("write_token_file reads a WebDataset, StreamingDataset or "
                        f"ParquetDataset, not {type(dataset).__name__}")
    return native.write_tokens(str(path), str(field), dtype=_token_dtype(dtype),
                               separator=None if separator is None else int(separator))


def _output_dtype(output_dtype):
    """``"int64"`` or ``"int32"`` from a torch dtype, a NumPy dtype or a name."""
    name = str(output_dtype)
    if name.startswith("torch."):
        name = name[len("torch."):]
    else:
        try:
            name = _np.dtype(output_dtype).name
        except TypeError:
            pass
    if name not in ("int64", "int32"):
        raise ValueError(
            f"output_dtype={output_dtype!r}: sequences are written as torch.int64 or torch.int32")
    return name


class TokenDataset:
    """Flat token files (nanoGPT's ``train.bin``: ``np.uint16`` tokens; ``np.uint32`` for
    vocabularies past 65,535) read as one stream, in the order given, and cut into sequences
    of ``seq_len`` tokens: sample ``k`` is ``{"input_ids": stream[k*L:(k+1)*L],
    "targets": stream[k*L+1:(k+1)*L+1]}`` (nanoGPT's ``x, y``; ``targets=False`` leaves them
    out). Through :class:`longshore.DataLoader` a batch is a dict of ``[batch_size, seq_len]``
    tensors, what torch's ``default_collate`` makes of these samples, written by the Rust
    workers straight into the (pinned) batch:

    >>> ds = longshore.datasets.TokenDataset("data/openwebtext/train.bin", seq_len=1024)  # doctest: +SKIP
    >>> loader = longshore.DataLoader(ds, batch_size=12, shuffle=True, num_workers=4,
    ...                               pin_memory=True)                  # doctest: +SKIP
    >>> for batch in loader:                                            # doctest: +SKIP
    ...     x, y = batch["input_ids"], batch["targets"]                 # int64 [12, 1024]

    ``paths``: a path, a glob pattern (sorted) or a list of paths. ``dtype``: how the files
    store a token (``numpy.uint16`` or ``numpy.uint32``, or their names). ``output_dtype``:
    ``torch.int64`` (the default, what ``nn.Embedding`` and ``cross_entropy`` take) or
    ``torch.int32`` (half the bytes to pin and copy), or their names. With a document
    ``separator`` (GPT-2's ``<|endoftext|>`` is 50256) samples also hold ``position_ids`` (a
    token's position in its document, continued across sequence cuts) and ``document_ids``
    (0 for the sequence's first document, then 1, 2, ...); a document also ends at each
    file's end. The tokens after the last whole sequence are not read (``dropped_tokens``).

    A sequence is a function of its index alone, so the map-style loader shuffles it,
    ``DistributedSampler`` gives each rank an equal share and ``state_dict`` resumes exactly
    on any ``num_workers``. A file whose size is not a whole number of tokens is a
    ``ValueError`` naming it.
    """

    def __init__(self, paths, seq_len=1024, *, dtype=_np.uint16, output_dtype="int64",
                 targets=True, separator=None):
        self.paths = _token_paths(paths)
        self.seq_len = int(seq_len)
        self.dtype = _np.dtype(_token_dtype(dtype))
        self._output = _output_dtype(output_dtype)
        self.targets = bool(targets)
        self.separator = None if separator is None else int(separator)
        _logs.ensure_started()
        self._native = _longshore._TokenSequences(
            self.paths, self.seq_len, dtype=self.dtype.name, output_dtype=self._output,
            targets=self.targets, separator=self.separator)
        _logs.flush()  # the dropped tokens' record, now

    def __len__(self):
        return len(self._native)

    @property
    def fields(self):
        """The names of a sample's fields, in order: ``input_ids``, then ``targets``,
        ``position_ids`` and ``document_ids`` (those that are on)."""
        return list(self._native.field_names)

    total_tokens = property(_attrgetter("_native.total_tokens"), doc="Tokens in all files.")
    dropped_tokens = property(_attrgetter("_native.dropped_tokens"),
                              doc="Tokens after the last whole sequence, never read.")
    documents = property(_attrgetter("_native.documents"),
                         doc="Documents in the stream (with a ``separator``), else ``None``.")

    @property
    def output_dtype(self):
        """The dtype of the sequences' tensors: ``torch.int64`` or ``torch.int32`` (the
        name, without torch)."""
        try:
            import torch
        except ImportError:
            return self._output
        return getattr(torch, self._output)

    def __getitem__(self, index):
        """Sequence ``index`` as a dict of 1-D tensors (field name -> ``[seq_len]``), outside
        the loader; NumPy arrays without torch."""
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"index {index} is out of range for a TokenDataset of {n} sequences")
        parts = self._native.get(index)
        arrays = [_np.frombuffer(bytearray(b), dtype=self._output) for b in parts]
        try:
            import torch
        except ImportError:
            return dict(zip(self.fields, arrays))
        return {k: torch.from_numpy(a) for k, a in zip(self.fields, arrays)}

    def __repr__(self):
        files = self.paths[0] if len(self.paths) == 1 else f"{len(self.paths)} files"
        extra = "" if self.separator is None else f", separator={self.separator}"
        return (f"TokenDataset({files!r}, seq_len={self.seq_len}, dtype={self.dtype.name}, "
                f"output_dtype={self._output}, sequences={len(self)}, fields={self.fields}"
                f"{extra})")
