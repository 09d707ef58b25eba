//! `longshore._Loader`: the Rust [`DataLoader`] of any built-in dataset, behind one Python
//! class; its epochs are [`PyEpoch`](crate::epoch::PyEpoch) iterators.

use std::sync::Arc;
use std::time::Duration;

use longshore::dlpack::{ExportOptions, PinnedLabel};
use longshore::host::{
    BudgetPolicy, MemoryKind, PinnedPool, PoolConfig, PoolStats, SharedAllocator,
};
use longshore::loader::{
    DataLoader, LoaderError, LoaderOptions, LoaderState, SampleErrorPolicy, WorkerPriority,
};
use longshore::nvjpeg::{EncodedCollate, EncodedFields, EncodedShards};
use longshore::shards::dataset::{OnSampleError, ShardedDataset};
use longshore::transfer::Device;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::boxed::{Handoff, Loader, Options, configure};
use crate::dataset::native_of;
use crate::epoch::{Convert, Feeding, Position, PyEpoch};
use crate::errors::{LoaderFailure, loader_err, transfer_err};
use crate::pydata::{Parts, PyProcessSource};
use crate::sampler::PyEpochOrder;
use crate::shards::{PyShards, Reader};
use crate::source::{BatchForm, Native, Source};
use crate::torch::PyTorchConverter;
use crate::vision::PyImageFolder;

/// Whether `LONGSHORE_UPLOAD_IN_PUMP` (a benchmark switch, read when an epoch starts) asks for
/// every device copy to be enqueued by the epoch thread, as before `crate::upload`: set to a
/// non-empty value other than `0`.
fn upload_in_pump() -> bool {
    matches!(std::env::var_os("LONGSHORE_UPLOAD_IN_PUMP"), Some(v) if !v.is_empty() && v != "0")
}

/// The value of a string option among two `options`, or a `ValueError` naming the option and
/// its accepted values.
fn choice<T>(name: &str, value: &str, options: [(&str, T); 2]) -> PyResult<T> {
    let [(a, _), (b, _)] = &options;
    let message = format!("{name} must be '{a}' or '{b}', not {value:?}");
    options
        .into_iter()
        .find_map(|(k, v)| (k == value).then_some(v))
        .ok_or_else(|| PyValueError::new_err(message))
}

fn build(source: Source, o: Options) -> Result<Loader, LoaderError> {
    let Source { dataset, collate } = source;
    Ok(Loader::Host(
        configure(DataLoader::builder(dataset).collate(collate), o).build_boxed()?,
    ))
}

/// A pool of (page-locked) host memory with a budget, for `DataLoader(pool=...)`.
#[pyclass(name = "PinnedPool", module = "longshore", frozen)]
pub(crate) struct PyPinnedPool {
    pool: PinnedPool,
}

#[pymethods]
impl PyPinnedPool {
    /// `budget`: most bytes held (default: a quarter of RAM); `policy`: what a request over
    /// budget does: `"wait"` (up to `wait_timeout` seconds), `"fallback"` (pageable memory) or
    /// `"error"`; `pinned`: page-locked memory (default: when a CUDA driver is present);
    /// `shared`: each block a memory file that worker processes map, so that a Python
    /// dataset's workers write batches straight into it (a loader of a Python dataset makes
    /// such a pool itself when given none; with an unshared pool its batches travel through
    /// the workers' pipes: one copy more).
    #[new]
    #[pyo3(signature = (*, budget = None, policy = "wait", wait_timeout = 60.0, pinned = None,
        shared = false))]
    fn new(
        budget: Option<usize>,
        policy: &str,
        wait_timeout: f64,
        pinned: Option<bool>,
        shared: bool,
    ) -> PyResult<Self> {
        let pinned = pinned.unwrap_or_else(longshore::host::driver_available);
        let kind = if pinned {
            MemoryKind::PageLocked
        } else {
            MemoryKind::Pageable
        };
        let policy = match policy {
            "wait" => BudgetPolicy::Wait {
                timeout: Duration::try_from_secs_f64(wait_timeout).map_err(|_| {
                    PyValueError::new_err("wait_timeout must be a non-negative number of seconds")
                })?,
            },
            "fallback" => BudgetPolicy::FallbackPageable,
            "error" => BudgetPolicy::Error,
            other => {
                return Err(PyValueError::new_err(format!(
                    "policy must be 'wait', 'fallback' or 'error', not {other:?}"
                )));
            }
        };
        let mut config = PoolConfig::for_kind(kind).policy(policy);
        if let Some(b) = budget {
            config = config.budget(b);
        }
        let pool = if shared {
            shared_pool(pinned, config)
        } else {
            PinnedPool::new(config)
        };
        let pool = pool.map_err(|e| LoaderFailure::new_err(e.to_string()))?;
        Ok(Self { pool })
    }

    /// The pool's counters (`bytes_in_use`, `bytes_cached`, `bytes_pending`, ...).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        pool_dict(py, &self.pool.stats())
    }
}

/// A pool of shared memory ([`SharedAllocator`]), page-locked (registered) when `pinned`;
/// `config`'s kind is set to match.
fn shared_pool(pinned: bool, config: PoolConfig) -> Result<PinnedPool, longshore::host::HostError> {
    let mut config = config;
    config.kind = if pinned {
        MemoryKind::Registered
    } else {
        MemoryKind::Pageable
    };
    config.register_above = None;
    PinnedPool::with_allocator(Arc::new(SharedAllocator::new(pinned)), config)
}

fn pool_dict<'py>(py: Python<'py>, s: &PoolStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    set_fields! { d, s, bytes_in_use, bytes_cached, bytes_pending, bytes_held, peak_bytes_held,
    budget, blocks_in_use, blocks_cached, blocks_pending, hits, misses, allocations, fallbacks,
    waits }
    Ok(d)
}

/// The loader's options as `longshore.DataLoader` passes them: a dict keyed by torch's
/// argument names, with Python's values. [`TorchOptions::loader_options`] converts them,
/// naming torch's arguments; the rules between them are the builder's, checked when the
/// loader is built.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub(crate) struct TorchOptions {
    batch_size: usize,
    shuffle: bool,
    num_workers: i64,
    pin_memory: bool,
    drop_last: bool,
    prefetch_factor: Option<i64>,
    persistent_workers: bool,
    /// Seconds; 0 waits forever.
    timeout: f64,
    seed: Option<u64>,
    in_order: bool,
    on_sample_error: String,
    worker_priority: String,
}

impl TorchOptions {
    /// The loader's options; `cuda` (batches go to a GPU) pins memory.
    fn loader_options(self, cuda: bool) -> PyResult<LoaderOptions> {
        let num_workers = usize::try_from(self.num_workers).map_err(|_| {
            PyValueError::new_err(
                "num_workers option should be non-negative; use num_workers=0 to disable multiprocessing.",
            )
        })?;
        let timeout = match Duration::try_from_secs_f64(self.timeout) {
            Ok(d) => (!d.is_zero()).then_some(d),
            Err(_) => {
                return Err(PyValueError::new_err(
                    "timeout option should be non-negative",
                ));
            }
        };
        let prefetch_factor = self
            .prefetch_factor
            .map(usize::try_from)
            .transpose()
            .map_err(|_| PyValueError::new_err("prefetch_factor option should be non-negative"))?;
        let on_sample_error = choice(
            "on_sample_error",
            &self.on_sample_error,
            [
                ("raise", SampleErrorPolicy::FailBatch),
                ("skip", SampleErrorPolicy::Skip),
            ],
        )?;
        let worker_priority = choice(
            "worker_priority",
            &self.worker_priority,
            [
                ("normal", WorkerPriority::Normal),
                ("background", WorkerPriority::Background),
            ],
        )?;
        Ok(LoaderOptions {
            batch_size: self.batch_size,
            shuffle: self.shuffle,
            num_workers,
            prefetch_factor,
            pin_memory: self.pin_memory || cuda,
            drop_last: self.drop_last,
            timeout,
            persistent_workers: self.persistent_workers,
            in_order: self.in_order,
            seed: self.seed,
            on_sample_error,
            worker_priority,
            ..LoaderOptions::default()
        })
    }
}

/// The Rust side of `longshore.DataLoader` (the Python class converts tensors).
#[pyclass(name = "_Loader", module = "longshore", frozen)]
pub(crate) struct PyLoader {
    inner: Arc<Loader>,
    device: Option<Device>,
    depth: usize,
    form: BatchForm,
    /// A Python dataset's loader: batches end with their meta (see `crate::pydata`).
    meta: bool,
    export: ExportOptions,
    position: Arc<Position>,
    num_workers: usize,
    /// How an epoch's batches are made for Python (a Python dataset loaded in this process is
    /// loaded when asked for, as PyTorch loads it).
    feeding: Feeding,
    /// A sharded dataset's loader: its shards (for their stats; the loader drives their epochs
    /// and resume state).
    shards: Option<ShardedDataset>,
}

#[pymethods]
impl PyLoader {
    /// `options`: the loader's options as `longshore.DataLoader` passes them (a dict of
    /// [`TorchOptions`]); the rest is how batches leave the loader.
    #[new]
    #[pyo3(signature = (dataset, options, *, device = None, pool = None, order = None,
        pinned_label = "cuda_host", decode = "cpu", cpu_backend = false, sources = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        dataset: &Bound<'_, PyAny>,
        options: TorchOptions,
        device: Option<usize>,
        pool: Option<PyRef<'_, PyPinnedPool>>,
        order: Option<PyRef<'_, PyEpochOrder>>,
        pinned_label: &str,
        decode: &str,
        cpu_backend: bool,
        sources: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        // A mixture's schedule: the delivered samples are counted by member.
        let sources = sources.map(crate::mixture::member_of).transpose()?;
        let loader = options.loader_options(device.is_some())?;
        let pinned = choice(
            "pinned_label",
            pinned_label,
            [
                ("cuda_host", PinnedLabel::CudaHost),
                ("cpu", PinnedLabel::Cpu),
            ],
        )?;
        // Device decoding reads the files in the workers and decodes them on the GPU.
        let mut nvjpeg_shards = false;
        let nvjpeg_files = match decode {
            "cpu" => None,
            "nvjpeg" => {
                let folder = dataset.cast::<PyImageFolder>().ok();
                nvjpeg_shards = dataset.cast::<PyShards>().is_ok();
                if folder.is_none() && !nvjpeg_shards {
                    return Err(PyValueError::new_err(
                        "decode=\"nvjpeg\" decodes images: the dataset must be a \
                         longshore.datasets.ImageFolder, WebDataset or StreamingDataset",
                    ));
                }
                if device.is_none() {
                    return Err(PyValueError::new_err(
                        "decode=\"nvjpeg\" decodes on a GPU: it needs device=\"cuda\"",
                    ));
                }
                if let Ok(s) = dataset.cast::<PyShards>()
                    && let Some(fields) = s.get().fields()
                    && !fields.iter().any(|f| f.kind == crate::fields::Kind::Image)
                {
                    return Err(PyValueError::new_err(
                        "decode=\"nvjpeg\" decodes an image field: these fields have none \
                         (name one {field: \"image\"}, or leave decode=\"cpu\")",
                    ));
                }
                folder.map(|d| d.get().encoded()).transpose()?
            }
            other => {
                return Err(PyValueError::new_err(format!(
                    "decode must be 'cpu' or 'nvjpeg', not {other:?}"
                )));
            }
        };
        // A Python dataset, run in worker processes (see `crate::pydata`).
        let process = dataset
            .cast::<PyProcessSource>()
            .ok()
            .map(|d| d.get().parts());
        // Image shards (see `crate::shards`), an iterable dataset read by the Rust workers.
        let sharded = dataset.cast::<PyShards>().ok();
        let native = if process.is_some() || sharded.is_some() {
            None
        } else {
            native_of(dataset)?
        };
        let (source, form) = match native {
            Some(Native { source, form, .. }) => (Some(source), form),
            None if process.is_some() => (None, BatchForm::List),
            None if sharded.is_some() => {
                let fields = sharded.as_ref().and_then(|s| s.get().fields().cloned());
                (None, fields.map_or(BatchForm::List, BatchForm::Fields))
            }
            None => {
                return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                    "longshore.DataLoader takes a longshore.NpyDataset, RecordDataset, \
                 datasets.ImageFolder, datasets.TokenDataset, ArrayDataset or TensorDataset \
                 (or a Subset or ConcatDataset of them), not {}",
                    dataset.get_type().name()?
                )));
            }
        };
        let device = match (device, cpu_backend) {
            (Some(_), true) => {
                return Err(PyValueError::new_err(
                    "cpu_backend (a test hook) takes the place of a CUDA device: give one or the other",
                ));
            }
            // Test hook: "device" batches on longshore-transfer's Cpu backend (host memory with
            // asynchronous copies and events), so the device path runs without a GPU.
            (None, true) => Some(Device::cpu()),
            (i, false) => i
                .map(|i| py.detach(|| Device::cuda(i)))
                .transpose()
                .map_err(transfer_err)?,
        };
        let (num_workers, in_order) = (loader.num_workers, loader.in_order);
        let on_sample_error = loader.on_sample_error;
        let options = Options {
            pool: match (pool, process.is_some()) {
                (Some(p), _) => Some(p.pool.clone()),
                // A Python dataset's workers write into the blocks: shared memory.
                (None, true) => {
                    let pinned = loader.pin_memory && longshore::host::driver_available();
                    Some(
                        shared_pool(pinned, PoolConfig::default())
                            .map_err(|e| LoaderFailure::new_err(e.to_string()))?,
                    )
                }
                (None, false) => None,
            },
            order: order.map(|o| o.sampler()),
            loader,
            sources,
        };
        let meta = process.is_some();
        if sharded.is_some() && !in_order {
            return Err(PyValueError::new_err(
                "in_order=False: a sharded dataset's batches are its planned order, which its \
                 resume state counts; leave in_order=True",
            ));
        }
        // The loader's own dataset of the shards (the loader lays out each epoch for its batch
        // size, drop_last and workers).
        let sharded = sharded
            .map(|s| {
                let s = s.get();
                let policy = match on_sample_error {
                    SampleErrorPolicy::Skip => OnSampleError::Skip,
                    _ => OnSampleError::Raise,
                };
                py.detach(|| s.for_loader(policy))
            })
            .transpose()
            .map_err(crate::errors::shard_err)?;
        let shards = sharded.as_ref().map(|(s, _)| s.clone());
        let feeding = match &process {
            Some(Parts::Map(..)) if num_workers == 0 => Feeding::OnCallingThread,
            Some(Parts::Iterable(..)) if num_workers == 0 => Feeding::WhenAsked,
            _ => Feeding::Ahead,
        };
        let inner = py
            .detach(|| match (nvjpeg_files, device.as_ref(), process, source) {
                // Each worker reads its planned stream; no batch of an epoch is made before
                // Python selects that epoch.
                (_, Some(d), _, _) if nvjpeg_shards => {
                    let images = match sharded {
                        Some((_, Reader::Images(images))) => images,
                        // Fields: the image decoded on the device, the others carried beside it.
                        Some((_, Reader::Fields(fields))) => {
                            let encoded = EncodedFields::new(fields).map_err(LoaderError::from)?;
                            let decoder = encoded.decoder(d)?;
                            let collate = encoded.collate();
                            let loader =
                                configure(DataLoader::iterable(encoded).collate(collate), options)
                                    .prefetch_next_epoch(false)
                                    .build_boxed()?;
                            return Ok(Loader::Nvjpeg(loader.with_stage(decoder).depth(2)));
                        }
                        None => return Err(LoaderError::State("no dataset".into())),
                    };
                    let encoded = EncodedShards::new(images).map_err(LoaderError::from)?;
                    let decoder = encoded.decoder(d)?;
                    let loader = configure(
                        DataLoader::iterable(encoded).collate(EncodedCollate),
                        options,
                    )
                    .prefetch_next_epoch(false)
                    .build_boxed()?;
                    Ok(Loader::Nvjpeg(loader.with_stage(decoder).depth(2)))
                }
                _ if sharded.is_some() => {
                    // The workers read and check each image; the collation decodes it
                    // straight into its slot of the pinned batch.
                    let images = match sharded {
                        Some((_, Reader::Images(images))) => images.deferred(),
                        Some((_, Reader::Fields(fields))) => {
                            // Each field into the batch: an image decoded into its slot,
                            // variable-length fields as bytes and offsets.
                            let collate = fields.collate();
                            return Ok(Loader::Host(
                                configure(DataLoader::iterable(fields).collate(collate), options)
                                    .prefetch_next_epoch(false)
                                    .build_boxed()?,
                            ));
                        }
                        None => return Err(LoaderError::State("no dataset".into())),
                    };
                    let collate = images.collate().with_names("image", "label");
                    Ok(Loader::Host(
                        configure(DataLoader::iterable(images).collate(collate), options)
                            .prefetch_next_epoch(false)
                            .build_boxed()?,
                    ))
                }
                (Some(files), Some(d), _, _) => crate::nvjpeg::build(files, options, d, 2),
                (_, _, Some(Parts::Map(dataset, collate)), _) => Ok(Loader::Host(
                    configure(
                        DataLoader::builder(dataset).dataset_collate(collate),
                        options,
                    )
                    // A Python dataset may change between epochs (`set_epoch` on it, a
                    // curriculum): no batch of the next epoch is made before it starts.
                    .prefetch_next_epoch(false)
                    .build_boxed()?,
                )),
                // The workers make whole batches: one per loader batch.
                (_, _, Some(Parts::Iterable(stream, collate)), _) => Ok(Loader::Host(
                    configure(DataLoader::iterable(stream).collate(collate), options)
                        .batch_size(1)
                        .drop_last(false)
                        .prefetch_next_epoch(false)
                        .build_boxed()?,
                )),
                (_, _, None, Some(source)) => build(source, options),
                (_, _, None, None) => Err(LoaderError::State("no dataset".into())),
            })
            .map_err(loader_err)?;
        Ok(Self {
            inner: Arc::new(inner),
            device,
            // Batches in flight to the device: enough to overlap one copy with one step.
            depth: 2,
            form,
            meta,
            export: ExportOptions::default().pinned(pinned),
            position: Arc::new(Position::default()),
            num_workers,
            feeding,
            shards,
        })
    }

    /// Starts an epoch whose batches are `convert(tensor)` (or lists of them), or lists of
    /// `longshore.Tensor` without `convert`. A `_TorchConverter` converts each batch in one
    /// call.
    #[pyo3(signature = (convert = None))]
    fn epoch(&self, py: Python<'_>, convert: Option<Bound<'_, PyAny>>) -> PyResult<PyEpoch> {
        let convert = match convert {
            None => Convert::Raw,
            Some(c) => match c.cast::<PyTorchConverter>() {
                Ok(t) => Convert::Torch(t.clone().unbind(), self.device.clone()),
                Err(_) => Convert::Each(c.unbind()),
            },
        };
        let epoch = py
            .detach(|| {
                // The epoch's iterator first (it sets the loader's progress for this epoch and
                // pulls no batch yet), then where Python stands until it receives this
                // epoch's first batch: the new epoch's start, not the abandoned one's.
                // A Python dataset's meta is read from host memory: its batches are staged.
                // So are a fields batch's variable-length fields.
                let host_parts = self.meta || matches!(self.form, BatchForm::Fields(_));
                let staged = self.device.is_some() && (!upload_in_pump() || host_parts);
                let epoch = self.inner.epoch(self.device.as_ref(), self.depth, staged)?;
                // The copy stream both sides enqueue staged batches' copies on.
                let copies = match (&self.device, staged) {
                    (Some(d), true) => Some(d.new_stream()?),
                    _ => None,
                };
                let id = self.position.begin(self.inner.loader().state_dict().ok());
                Ok::<_, LoaderError>((epoch, copies, id))
            })
            .map_err(loader_err)?;
        let (epoch, copies, id) = epoch;
        PyEpoch::start(
            epoch,
            self.inner.clone(),
            self.export.clone(),
            self.position.clone(),
            id,
            convert,
            self.form.clone(),
            self.meta,
            copies,
            self.feeding,
            crate::pump::poll_for(self.num_workers),
        )
    }

    /// Whether a batch is one tensor (one-file datasets) rather than a list of fields.
    #[getter]
    fn single(&self) -> bool {
        self.form == BatchForm::Single
    }

    /// The field names a batch is a dict of (token sequences, `fields=`), or `None` (a list
    /// or a tensor).
    #[getter]
    fn names(&self) -> Option<Vec<String>> {
        match &self.form {
            BatchForm::Named(names) => Some(names.to_vec()),
            BatchForm::Fields(fields) => Some(fields.iter().map(|f| f.name.clone()).collect()),
            _ => None,
        }
    }

    fn __len__(&self) -> PyResult<usize> {
        self.inner
            .loader()
            .len()
            .ok_or_else(|| PyRuntimeError::new_err("this loader has no length"))
    }

    fn set_epoch(&self, epoch: u64) {
        // As the loader's own state_dict: an unfinished epoch E stays the position when the
        // next epoch is E + 1 (then what Python received of it, not the loader's count, which
        // includes the batches the epoch thread ran ahead); any other epoch takes over.
        if self.position.get().is_some_and(|s| s.epoch + 1 != epoch) {
            self.position.clear();
        }
        self.inner.loader().set_epoch(epoch)
    }

    /// The resumable position, as JSON: while an epoch is under way, the batches Python has
    /// received (not those the epoch thread holds ready).
    fn state_dict_json(&self) -> PyResult<String> {
        let s = match self.position.get() {
            Some(s) => s,
            None => self.inner.loader().state_dict().map_err(loader_err)?,
        };
        serde_json::to_string(&s).map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// Restores a position saved by `state_dict_json`.
    fn load_state_dict_json(&self, json: &str) -> PyResult<()> {
        let s: LoaderState = serde_json::from_str(json)
            .map_err(|e| PyValueError::new_err(format!("not a longshore loader state: {e}")))?;
        // A refused state changes nothing, Python's position included.
        self.inner
            .loader()
            .load_state_dict(&s)
            .map_err(loader_err)?;
        self.position.clear();
        Ok(())
    }

    /// The loader's counters, with the pool's under `"pool"`.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.loader().stats();
        let d = PyDict::new(py);
        set_fields! { d, s, batches, samples, errors, epochs }
        d.set_item("wait_fraction", s.wait_fraction())?;
        d.set_item("samples_per_second", s.samples_per_second())?;
        d.set_item("consumer_wait_s", s.consumer_wait.as_secs_f64())?;
        d.set_item("consumer_time_s", s.consumer_time.as_secs_f64())?;
        d.set_item("worker_busy_s", s.worker_busy.as_secs_f64())?;
        set_fields! { d, s, peak_in_flight, in_flight_limit }
        d.set_item("pinned_wait_s", s.pinned_wait.as_secs_f64())?;
        d.set_item(
            "consumer_pinned_wait_s",
            s.consumer_pinned_wait.as_secs_f64(),
        )?;
        d.set_item("pinned_wait_fraction", s.pinned_wait_fraction())?;
        set_fields! { d, s, reloaded, worker_restarts }
        // With nvJPEG, the samples its device stage could not decode and dropped (skip) too,
        // counted as each epoch ends.
        let dropped = match &*self.inner {
            Loader::Nvjpeg(d) => d.stats().dropped,
            Loader::Host(_) => 0,
        };
        d.set_item("skipped_samples", s.skipped_samples + dropped)?;
        if !s.sources.is_empty() {
            d.set_item("sources", s.sources.clone())?;
        }
        if let Some(shards) = &self.shards {
            let stats = shards.stats();
            if !stats.members.is_empty() {
                // A mixture of sharded datasets: the samples its workers read, by member.
                d.set_item("sources", stats.members.clone())?;
            }
            d.set_item("shards", crate::shards::stats_dict(py, &stats)?)?;
        }
        d.set_item("pool", pool_dict(py, &s.pool)?)?;
        Ok(d)
    }

    fn reset_stats(&self) {
        self.inner.loader().reset_stats()
    }

    /// For benchmarks: runs `epochs` whole epochs of this loader in Rust on the calling
    /// thread, the GIL released, consuming each batch as the Rust bench's consumer does
    /// (`wait_on` a compute stream of the loader's device, then dropped; without a device, its
    /// first and last bytes read), with no epoch thread, export or conversion; returns
    /// `(samples, seconds)`. The same loader (and its persistent workers) then measures what
    /// the binding costs against the Rust side in one process.
    fn _drain_in_rust(&self, py: Python<'_>, epochs: usize) -> PyResult<(usize, f64)> {
        let drained = py.detach(|| -> Result<(usize, f64), String> {
            let cs = self
                .device
                .as_ref()
                .map(Device::new_stream)
                .transpose()
                .map_err(|e| e.to_string())?;
            let start = std::time::Instant::now();
            let mut samples = 0usize;
            for _ in 0..epochs {
                let epoch = self
                    .inner
                    .epoch(self.device.as_ref(), self.depth, false)
                    .map_err(|e| e.to_string())?;
                for h in epoch {
                    samples += match (h.map_err(|e| e.to_string())?, &cs) {
                        (Handoff::Host(b), _) => {
                            let bytes = b.bytes();
                            std::hint::black_box(
                                bytes.first().copied().unwrap_or(0)
                                    ^ bytes.last().copied().unwrap_or(0),
                            );
                            b.batch_size()
                        }
                        (Handoff::Device(p), Some(cs)) => {
                            p.wait_on(cs).map_err(|e| e.to_string())?.batch_size()
                        }
                        (Handoff::Staged(_), _) | (_, None) => {
                            return Err("a device batch without a device".into());
                        }
                    };
                }
            }
            if let Some(cs) = &cs {
                cs.synchronize().map_err(|e| e.to_string())?;
            }
            Ok((samples, start.elapsed().as_secs_f64()))
        });
        // The loader's own position applies again.
        self.position.clear();
        drained.map_err(LoaderFailure::new_err)
    }
}
