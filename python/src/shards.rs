//! `longshore._Shards`: image shards in object storage (WebDataset tar shards, an MDS
//! dataset or Parquet files, read by `longshore::shards`), for `longshore.datasets.WebDataset`,
//! `StreamingDataset` and `ParquetDataset`. The shards are resolved once, when the dataset is made (one listing,
//! one index read): a loader builds its own [`ShardedDataset`] from that spec, lays out each
//! epoch for its batch size, `drop_last` and number of workers, and owns the epochs and resume
//! state (the Rust loader's `set_epoch`, `state_dict`); its Rust workers read, decode and
//! transform the images ([`ImageShards`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use longshore::data::{DType, IterableDataset, Tensor, WorkerInfo};
use longshore::shards::ShardError;
use longshore::shards::dataset::{
    DatasetSpec, OnSampleError, ShardStats, ShardedDataset, ShardedDatasetBuilder,
};
use longshore::shards::store::ShardStore;
use longshore::vision::shards::ImageShards;
use longshore::vision::{Compose, DecodeOptions};
use pyo3::exceptions::{PyStopIteration, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::errors::{data_err, shard_err};
use crate::fields::{Field, FieldShards, parse_fields};
use crate::vision::{compose_of, decode_options};

/// The order and cache options a loader's dataset is built with (the dataset's own, as given
/// in Python).
#[derive(Debug, Clone)]
struct Options {
    seed: u64,
    shuffle: bool,
    shuffle_block: Option<u64>,
    rank: Option<usize>,
    world_size: Option<usize>,
    cache_dir: Option<PathBuf>,
    cache_budget: Option<u64>,
    job: Option<String>,
    prefetch_shards: Option<usize>,
    range_reads: bool,
}

impl Options {
    fn apply(&self, mut b: ShardedDatasetBuilder) -> ShardedDatasetBuilder {
        b = b.seed(self.seed).shuffle(self.shuffle);
        if let Some(n) = self.shuffle_block {
            b = b.shuffle_block(n);
        }
        if let Some(r) = self.rank {
            b = b.rank(r);
        }
        if let Some(w) = self.world_size {
            b = b.world_size(w);
        }
        if let Some(d) = &self.cache_dir {
            b = b.cache_dir(d);
        }
        if let Some(n) = self.cache_budget {
            b = b.cache_budget(n);
        }
        if let Some(j) = &self.job {
            b = b.job(j);
        }
        if let Some(n) = self.prefetch_shards {
            b = b.prefetch_shards(n);
        }
        b.range_reads(self.range_reads)
    }
}

/// Image shards with a transform pipeline; see the module docs.
#[pyclass(name = "_Shards", module = "longshore", frozen)]
pub(crate) struct PyShards {
    /// Resolved when made: its spec, store, rank and world size are what the
    /// loaders' datasets are built from.
    resolved: ShardedDataset,
    options: Options,
    /// The image pipeline (required without `fields`).
    compose: Option<Compose>,
    decode: DecodeOptions,
    image: Option<String>,
    label: String,
    /// The fields a batch holds (`fields=`), or `None`: `(image, label)`.
    fields: Option<Arc<[Field]>>,
    /// What `records()` reads (`map=`: a loader's worker process), made at its first call
    /// and kept, with the id of the process that made it: every epoch of a process reads
    /// through one cache handle and one set of shard layouts, whose counts `records_stats()`
    /// reports (a process forked after the first call makes its own).
    records: std::sync::Mutex<Option<(u32, ShardedDataset, FieldShards)>>,
}

/// What a loader's workers read of the shards: images and labels, or the named fields.
pub(crate) enum Reader {
    Images(ImageShards),
    Fields(FieldShards),
}

impl PyShards {
    /// `builder` with `options`, resolved without a loader's policy: damage found here is
    /// recorded in the spec and judged by each loader's `on_sample_error` (an error under
    /// "raise").
    fn resolve(
        py: Python<'_>,
        builder: ShardedDatasetBuilder,
        options: &Options,
    ) -> PyResult<ShardedDataset> {
        let builder = options.apply(builder);
        py.detach(|| builder.on_sample_error(OnSampleError::Skip).build())
            .map_err(shard_err)
    }

    /// This dataset for a loader: the shards (for their stats) and the decoded images.
    /// `on_sample_error`: the loader's policy (a damaged shard refuses the loader under
    /// `Raise`; under `Skip`, failed samples are counted and made up for, so ranks stay equal).
    pub(crate) fn for_loader(
        &self,
        on_sample_error: OnSampleError,
    ) -> Result<(ShardedDataset, Reader), ShardError> {
        let b = ShardedDataset::from_spec(self.resolved.spec().clone())
            .store(self.resolved.store().clone())
            .rank(self.resolved.rank())
            .world_size(self.resolved.world_size())
            .on_sample_error(on_sample_error);
        let shards = self.options.apply(b).build()?;
        let reader = match (&self.fields, &self.compose) {
            (Some(fields), compose) => Reader::Fields(FieldShards::new(
                shards.clone(),
                fields.clone(),
                compose.clone(),
                self.decode,
            )),
            (None, Some(compose)) => Reader::Images(self.images(shards.clone(), compose)),
            (None, None) => {
                return Err(ShardError::Order {
                    option: "transform",
                    reason: "an image pipeline is required".into(),
                });
            }
        };
        Ok((shards, reader))
    }

    /// The fields a batch holds, when `fields=` was given.
    pub(crate) fn fields(&self) -> Option<&Arc<[Field]>> {
        self.fields.as_ref()
    }

    fn images(&self, shards: ShardedDataset, compose: &Compose) -> ImageShards {
        let mut images = ImageShards::new(shards, compose.clone())
            .decode_options(self.decode)
            .label_field(self.label.clone());
        if let Some(name) = &self.image {
            images = images.image_field(name.clone());
        }
        images
    }
}

#[pymethods]
impl PyShards {
    /// `format`: `"webdataset"` (`urls`: shard URL patterns, brace ranges expanded; `index`:
    /// a wids shard index), `"mds"` (`urls`: the roots of MDS datasets) or `"parquet"`
    /// (`urls`: Parquet file patterns); or `spec`, the JSON
    /// of another `_Shards`' `spec_json` (resolved elsewhere: no listing here). `steps` and
    /// `output` describe the image pipeline (`Compose._plan()`).
    #[new]
    #[pyo3(signature = (format, urls, steps, output, *, spec = None, index = None,
        image_key = None, label_key = "cls", seed = 0, shuffle = false, shuffle_block = None,
        rank = None, world_size = None, cache_dir = None, cache_budget = None, job = None,
        prefetch_shards = None, range_reads = true, max_pixels = None, no_pixel_limit = false,
        storage_options = None, fields = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        format: &str,
        urls: Vec<String>,
        steps: Option<Vec<Bound<'_, PyTuple>>>,
        output: Option<Bound<'_, PyTuple>>,
        spec: Option<String>,
        index: Option<String>,
        image_key: Option<String>,
        label_key: &str,
        seed: u64,
        shuffle: bool,
        shuffle_block: Option<u64>,
        rank: Option<usize>,
        world_size: Option<usize>,
        cache_dir: Option<PathBuf>,
        cache_budget: Option<u64>,
        job: Option<String>,
        prefetch_shards: Option<usize>,
        range_reads: bool,
        max_pixels: Option<u64>,
        no_pixel_limit: bool,
        storage_options: Option<BTreeMap<String, String>>,
        fields: Option<Vec<(String, String)>>,
    ) -> PyResult<Self> {
        let compose = compose_of(steps, output)?;
        let fields = fields
            .map(|f| parse_fields(f, compose.is_some()))
            .transpose()?;
        if fields.is_none() && compose.is_none() {
            return Err(PyValueError::new_err("an image pipeline is required"));
        }
        let options = Options {
            seed,
            shuffle,
            shuffle_block,
            rank,
            world_size,
            cache_dir,
            cache_budget,
            job,
            prefetch_shards,
            range_reads,
        };
        let builder = match (spec, format) {
            (Some(json), _) => {
                ShardedDataset::from_spec(DatasetSpec::from_json(&json).map_err(shard_err)?)
            }
            (None, "webdataset") => {
                let mut b = ShardedDataset::webdataset(urls);
                if let Some(i) = index {
                    b = b.index(i);
                }
                b
            }
            (None, "mds") => ShardedDataset::mds(urls),
            (None, "parquet") => ShardedDataset::parquet(urls),
            (None, other) => {
                return Err(PyValueError::new_err(format!(
                    "format must be 'webdataset', 'mds' or 'parquet', not {other:?}"
                )));
            }
        };
        let mut builder = builder;
        if let Some(storage) = storage_options {
            // object_store's keys, over the environment (the loaders' datasets reuse this store).
            let store = storage
                .into_iter()
                .fold(ShardStore::builder(), |b, (k, v)| b.option(k, v));
            builder = builder.store(store.build());
        }
        let resolved = PyShards::resolve(py, builder, &options)?;
        Ok(PyShards {
            resolved,
            options,
            compose,
            decode: decode_options(max_pixels, no_pixel_limit),
            image: image_key,
            label: label_key.to_owned(),
            fields,
            records: std::sync::Mutex::new(None),
        })
    }

    /// A mixture of `members` (other `_Shards` of one format, with the same fields and image
    /// pipeline: member 0's are used) drawn in proportion to `weights` until `stop`
    /// (`"first_exhausted"`, `"all_exhausted"` or a number of positions); the order and cache
    /// options are the mixture's own, the store and rank member 0's.
    #[staticmethod]
    #[pyo3(signature = (members, weights, stop, *, seed = 0, shuffle = true,
        shuffle_block = None, cache_dir = None, cache_budget = None, job = None,
        prefetch_shards = None, range_reads = true))]
    #[allow(clippy::too_many_arguments)]
    fn mixture(
        py: Python<'_>,
        members: Vec<PyRef<'_, PyShards>>,
        weights: Vec<f64>,
        stop: &Bound<'_, PyAny>,
        seed: u64,
        shuffle: bool,
        shuffle_block: Option<u64>,
        cache_dir: Option<PathBuf>,
        cache_budget: Option<u64>,
        job: Option<String>,
        prefetch_shards: Option<usize>,
        range_reads: bool,
    ) -> PyResult<Self> {
        let stop = crate::mixture::stop_of(stop)?;
        let first = members
            .first()
            .ok_or_else(|| PyValueError::new_err("a mixture needs a member"))?;
        let (rank, world_size) = (first.resolved.rank(), first.resolved.world_size());
        if let Some((i, m)) = members
            .iter()
            .enumerate()
            .find(|(_, m)| (m.resolved.rank(), m.resolved.world_size()) != (rank, world_size))
        {
            return Err(PyValueError::new_err(format!(
                "member {i} is rank {} of {}, member 0 rank {rank} of {world_size}: the \
                 members of a mixture are one rank's",
                m.resolved.rank(),
                m.resolved.world_size()
            )));
        }
        let options = Options {
            seed,
            shuffle,
            shuffle_block,
            rank: Some(rank),
            world_size: Some(world_size),
            cache_dir,
            cache_budget,
            job,
            prefetch_shards,
            range_reads,
        };
        let resolved: Vec<&ShardedDataset> = members.iter().map(|m| &m.resolved).collect();
        let builder = ShardedDataset::mixture(&resolved, &weights, stop).map_err(shard_err)?;
        let resolved = PyShards::resolve(py, builder, &options)?;
        Ok(PyShards {
            resolved,
            options,
            compose: first.compose.clone(),
            decode: first.decode,
            image: first.image.clone(),
            label: first.label.clone(),
            fields: first.fields.clone(),
            records: std::sync::Mutex::new(None),
        })
    }

    /// Worker `worker` of `num_workers`'s records of this rank's epoch `epoch` (laid out in
    /// batches of `batch_size`, `drop_last`), for a dataset read with `fields=` whose samples a
    /// Python function maps in worker processes (`map=`): see
    /// [`PyRecordIter`](crate::fields::PyRecordIter).
    #[pyo3(signature = (epoch, worker = 0, num_workers = 1, batch_size = 1, drop_last = false))]
    fn records(
        &self,
        py: Python<'_>,
        epoch: u64,
        worker: usize,
        num_workers: usize,
        batch_size: usize,
        drop_last: bool,
    ) -> PyResult<crate::fields::PyRecordIter> {
        if self.fields.is_none() {
            return Err(PyValueError::new_err(
                "records() reads a dataset made with fields=",
            ));
        }
        let records = py.detach(|| -> Result<FieldShards, ShardError> {
            let mut kept = self.records.lock().unwrap_or_else(|p| p.into_inner());
            let pid = std::process::id();
            if let Some((_, _, r)) = kept.as_ref().filter(|k| k.0 == pid) {
                return Ok(r.clone());
            }
            let (shards, reader) = self.for_loader(OnSampleError::Raise)?;
            let Reader::Fields(records) = reader else {
                return Err(ShardError::Order {
                    option: "fields",
                    reason: "not a dataset of fields".into(),
                });
            };
            *kept = Some((pid, shards, records.clone()));
            Ok(records)
        });
        let records = records.map_err(shard_err)?;
        py.detach(|| {
            crate::fields::PyRecordIter::start(
                records,
                epoch,
                worker,
                num_workers,
                batch_size,
                drop_last,
            )
        })
    }

    /// The counts of what `records()` read in this process (its samples failed and made up
    /// for, its cache's downloads and range reads per epoch: `stats_dict`'s keys, with
    /// `"damaged"`, the damaged shards' indices, so that a loader can merge the counts of its
    /// worker processes without counting a shard twice); `None` before the first `records()`.
    fn records_stats<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Option<Bound<'py, pyo3::types::PyDict>>> {
        let stats = match &*self.records.lock().unwrap_or_else(|p| p.into_inner()) {
            Some((pid, shards, _)) if *pid == std::process::id() => shards.stats(),
            _ => return Ok(None),
        };
        let d = stats_dict(py, &stats)?;
        d.set_item("damaged", stats.damaged.clone())?;
        Ok(Some(d))
    }

    /// Writes field `field` of every sample (a 1-D integer array: a Parquet list, an MDS
    /// `ndarray` column, a `.npy`), in the dataset's canonical order (shard list order, each
    /// shard in file order, all ranks), as the documents of a flat token file (`dtype`
    /// `"uint16"` or `"uint32"`, little-endian, `separator` after each document): what
    /// `datasets.TokenDataset` reads. Returns `(tokens, documents)`.
    #[pyo3(signature = (path, field, *, dtype = "uint16", separator = None))]
    fn write_tokens(
        &self,
        py: Python<'_>,
        path: PathBuf,
        field: String,
        dtype: &str,
        separator: Option<u32>,
    ) -> PyResult<(u64, u64)> {
        use longshore::data::formats::tokens::TokenWriter;
        let dtype = match dtype {
            "uint16" => DType::U16,
            "uint32" => DType::U32,
            other => {
                return Err(PyValueError::new_err(format!(
                    "dtype must be 'uint16' or 'uint32', not {other:?}"
                )));
            }
        };
        if self.resolved.spec().mixture.is_some() {
            return Err(PyValueError::new_err(
                "write_token_file reads one dataset in its canonical order: write each member \
                 of the mixture",
            ));
        }
        let b = ShardedDataset::from_spec(self.resolved.spec().clone())
            .store(self.resolved.store().clone());
        // The whole dataset, every rank's samples, in list and file order.
        let b = self.options.apply(b).rank(0).world_size(1).shuffle(false);
        let written = py.detach(|| -> Result<(u64, u64), longshore::data::DataError> {
            let shards = b
                .on_sample_error(OnSampleError::Raise)
                .build()
                .map_err(longshore::data::DataError::from)?;
            let records = FieldShards::new(
                shards,
                vec![Field::new(field.clone(), crate::fields::Kind::Array)],
                None,
                DecodeOptions::default(),
            );
            let mut w = TokenWriter::create(&path, dtype)?;
            if let Some(s) = separator {
                w = w.separator(s);
            }
            for item in records.iter(WorkerInfo::single(0)) {
                let r = item?;
                let Some((dt, shape, data)) = r.array(0) else {
                    continue;
                };
                let doing = || format!("writing field {field:?} of {} as tokens", r.origin());
                if shape.len() != 1 {
                    return Err(longshore::data::DataError::custom(
                        doing(),
                        longshore::data::DataError::ShapeMismatch(format!(
                            "a document is a 1-D array of tokens, not of shape {shape:?}"
                        )),
                    ));
                }
                w.write_array(dt, data)
                    .map_err(|e| longshore::data::DataError::custom(doing(), e))?;
            }
            w.finish()
        });
        written.map_err(data_err)
    }

    /// Each member's draws in an epoch, for a mixture (`None` otherwise).
    #[getter]
    fn member_draws(&self) -> Option<Vec<u64>> {
        self.resolved.member_draws()
    }

    /// Samples in one epoch of the whole dataset (all ranks).
    fn __len__(&self) -> usize {
        usize::try_from(self.resolved.len()).unwrap_or(usize::MAX)
    }

    /// The shards' URLs, in the dataset's canonical order.
    #[getter]
    fn urls(&self) -> Vec<String> {
        let spec = self.resolved.spec();
        spec.shards.shards.iter().map(|s| s.url.clone()).collect()
    }

    /// This process's rank and the number of ranks (given, or from the launcher's variables).
    #[getter]
    fn rank(&self) -> (usize, usize) {
        (self.resolved.rank(), self.resolved.world_size())
    }

    /// The resolved shard list and counts as JSON: give it to the other ranks' datasets
    /// (`spec=`) so that the job lists the bucket once.
    #[getter]
    fn spec_json(&self) -> String {
        self.resolved.spec().to_json()
    }

    /// The per-image output shape of the pipeline.
    #[getter]
    fn output_shape(&self) -> Vec<usize> {
        self.compose
            .as_ref()
            .map(|c| c.field().shape.dims().to_vec())
            .unwrap_or_default()
    }

    /// This rank's samples of `epoch` as one worker reads them, outside a loader: an iterator
    /// of `(bytes, dtype, label)` (native byte order), read and decoded by a Rust thread a few
    /// samples ahead.
    fn iter_epoch(&self, py: Python<'_>, epoch: u64) -> PyResult<PyShardIter> {
        if self.fields.is_some() {
            return Err(PyValueError::new_err(
                "a dataset read with fields= is iterated through longshore.DataLoader",
            ));
        }
        let (shards, reader) = py
            .detach(|| self.for_loader(OnSampleError::Raise))
            .map_err(shard_err)?;
        drop(shards);
        let Reader::Images(images) = reader else {
            return Err(PyValueError::new_err("not an image dataset"));
        };
        let (tx, rx) = crossbeam_channel::bounded(4);
        std::thread::Builder::new()
            .name("longshore-shards-iter".into())
            .spawn(move || {
                for item in images.iter(WorkerInfo::single(0).with_epoch(epoch)) {
                    if tx.send(item).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| PyValueError::new_err(format!("cannot start a reader thread: {e}")))?;
        Ok(PyShardIter { rx })
    }
}

/// A sharded dataset's [`ShardStats`] as a dict: `failed` (samples whose read failed),
/// `failed_by_reason`, `padded` (repeats that made up for them), `unpadded`, `damaged_shards`,
/// the cache's `downloads`, `redownloads`, `forced_evictions` and `range_reads` (samples read
/// by range below the working set) since the loader was built and `cache_epochs` (a dict of
/// those and `downloaded_bytes`, `evictions`, `range_bytes`, `misses` and `miss_wait_s`, the
/// reads that waited for their shard and the seconds they waited, per epoch).
pub(crate) fn stats_dict<'py>(
    py: Python<'py>,
    s: &ShardStats,
) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
    let d = pyo3::types::PyDict::new(py);
    d.set_item("failed", s.failed())?;
    d.set_item("failed_by_reason", s.failed_by_reason.clone())?;
    set_fields! { d, s, padded, unpadded, damaged_shards }
    if !s.members.is_empty() {
        d.set_item("members", s.members.clone())?;
    }
    // The cache's counts per epoch, and their sums: re-downloads are what a budget below the
    // shuffle window's working set costs (warned once through logging).
    let epochs = pyo3::types::PyList::empty(py);
    let (mut downloads, mut redownloads, mut forced, mut ranges) = (0u64, 0u64, 0u64, 0u64);
    for e in &s.cache {
        let x = pyo3::types::PyDict::new(py);
        set_fields! { x, e, epoch, downloads, redownloads, downloaded_bytes, evictions,
        forced_evictions, range_reads, range_bytes, misses }
        x.set_item("miss_wait_s", e.miss_wait.as_secs_f64())?;
        epochs.append(x)?;
        downloads += e.downloads;
        redownloads += e.redownloads;
        forced += e.forced_evictions;
        ranges += e.range_reads;
    }
    d.set_item("downloads", downloads)?;
    d.set_item("redownloads", redownloads)?;
    d.set_item("forced_evictions", forced)?;
    d.set_item("range_reads", ranges)?;
    d.set_item("cache_epochs", epochs)?;
    Ok(d)
}

/// What `_Shards.iter_epoch` returns.
#[pyclass(name = "_ShardIter", module = "longshore")]
pub(crate) struct PyShardIter {
    rx: crossbeam_channel::Receiver<Result<(Tensor, i64), longshore::data::DataError>>,
}

#[pymethods]
impl PyShardIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<(Vec<u8>, String, i64)> {
        let rx = self.rx.clone();
        match py.detach(move || rx.recv()) {
            Ok(Ok((image, label))) => {
                let dtype = match image.dtype() {
                    DType::U8 => "uint8",
                    _ => "float32",
                };
                Ok((image.bytes().to_vec(), dtype.to_owned(), label))
            }
            Ok(Err(e)) => Err(data_err(e)),
            Err(_) => Err(PyStopIteration::new_err(())),
        }
    }
}

/// Writes `samples` (encoded image, label) as shards of at most about `shard_bytes` under
/// `out`: `"webdataset"` tar shards `shard-000000.tar`, ... (`{key}.{image_ext}` and
/// `{key}.cls`, keys `000000000`, ...) with their wids index `shard-index.json`, or an
/// `"mds"` dataset (`index.json`, `shard.00000.mds`, ...; columns `jpg`: jpeg, `cls`: int, as
/// Streaming's `MDSWriter` writes them). Returns the shard file names.
#[pyfunction]
#[pyo3(signature = (format, out, samples, shard_bytes = 64 << 20, image_ext = "jpg"))]
pub(crate) fn write_image_shards(
    py: Python<'_>,
    format: &str,
    out: PathBuf,
    samples: Vec<(Vec<u8>, i64)>,
    shard_bytes: u64,
    image_ext: &str,
) -> PyResult<Vec<String>> {
    use longshore::shards::mds::{MdsWriter, Value};
    use longshore::shards::webdataset::ShardWriter;
    let written = py.detach(|| -> Result<Vec<String>, ShardError> {
        match format {
            "webdataset" => {
                let mut w = ShardWriter::new(&out, shard_bytes)?;
                for (i, (image, label)) in samples.iter().enumerate() {
                    let cls = label.to_string();
                    w.write(
                        &format!("{i:09}"),
                        &[(image_ext, image.as_slice()), ("cls", cls.as_bytes())],
                    )?;
                }
                Ok(w.finish()?.shardlist.into_iter().map(|s| s.url).collect())
            }
            "mds" => {
                let mut w =
                    MdsWriter::new(&out, &[("jpg", "jpeg"), ("cls", "int")], Some(shard_bytes))?;
                for (image, label) in samples {
                    w.write(&[("jpg", Value::Image(image)), ("cls", Value::Int(label))])?;
                }
                Ok(w.finish()?
                    .shards
                    .into_iter()
                    .map(|s| s.raw_data.basename)
                    .collect())
            }
            other => Err(ShardError::Order {
                option: "format",
                reason: format!("must be 'webdataset' or 'mds', not {other:?}"),
            }),
        }
    });
    written.map_err(shard_err)
}
