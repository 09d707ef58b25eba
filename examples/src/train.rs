//! The `train` example: an MLP classifier trained with softmax cross-entropy and SGD with
//! momentum on a generated, learnable dataset memory-mapped from `.npy` files, fed by a
//! `DataLoader` (workers, pinned memory, shuffling) through `to_device`, with all the math in
//! `longshore_ops` on the chosen device: the same code on the Cpu device and a GPU.
//!
//! Data-parallel training ([`train_distributed`]): each rank loads its share through a
//! `DistributedSampler` (rank `r` of `W` gets positions `r, r + W, ...` of the epoch's
//! permutation) with a per-rank batch of `batch_size / W`, so the k-th batches of all ranks
//! together are exactly the k-th batch of a single process with the same (global) batch size;
//! gradients are summed across ranks and scaled by `1 / W` ([`DataParallel`]), so every rank
//! applies the single process's update, up to float summation order.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use longshore::data::{DType, DirectCollate, DistributedSampler, NpyDataset, Zip, write_npy};
use longshore::loader::DataLoader;
use longshore::transfer::{Device, DeviceBuffer, Event, Stream};
use longshore_collective::Communicator;
use longshore_ops::{
    self as ops, Activation, CrossEntropyArgs, CrossEntropyStats, GemmArgs, Sgd, View, ViewMut,
};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::{expect_tensor, gaussian, npy_has_shape, write_atomically};

/// Features per sample.
pub const FEATURES: usize = 64;
/// Classes.
pub const CLASSES: usize = 10;

/// What to train, and how.
#[derive(Debug, Clone)]
pub struct TrainConfig {
    /// Passes over the data.
    pub epochs: usize,
    /// Samples in the generated dataset.
    pub samples: usize,
    /// Samples per batch, over all ranks: each rank loads `batch_size / world_size`.
    pub batch_size: usize,
    /// This process's (or thread's) rank, `0..world_size`.
    pub rank: usize,
    /// Ranks training together (1: single-process training).
    pub world_size: usize,
    /// Print one JSON line per epoch (rank 0 only) instead of the human-readable line.
    pub json_epochs: bool,
    /// Loader worker threads.
    pub workers: usize,
    /// Hidden layer width.
    pub hidden: usize,
    /// Learning rate.
    pub lr: f32,
    /// SGD momentum.
    pub momentum: f32,
    /// Weight decay.
    pub weight_decay: f32,
    /// Seed of the data, the initial weights and the shuffling.
    pub seed: u64,
    /// Where the generated dataset lives (reused when present).
    pub data_dir: PathBuf,
    /// Batches in flight to the device.
    pub prefetch_depth: usize,
    /// Show a progress bar.
    pub progress: bool,
}

impl TrainConfig {
    /// The defaults of `cargo run --release --example train`, with data under `data_dir`.
    pub fn new(data_dir: PathBuf) -> Self {
        Self {
            epochs: 5,
            samples: 65_536,
            batch_size: 256,
            rank: 0,
            world_size: 1,
            json_epochs: false,
            workers: 2,
            hidden: 256,
            lr: 0.05,
            momentum: 0.9,
            weight_decay: 1e-4,
            seed: 0,
            data_dir,
            prefetch_depth: 2,
            progress: true,
        }
    }
}

/// What a training run did.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The device, e.g. `cpu` or `cuda:0 (NVIDIA H100)`.
    pub device: String,
    /// Epochs run.
    pub epochs: usize,
    /// Samples per epoch.
    pub samples: usize,
    /// Batch size (global: over all ranks).
    pub batch_size: usize,
    /// This rank.
    pub rank: usize,
    /// Ranks that trained together.
    pub world_size: usize,
    /// Loader workers (per rank).
    pub workers: usize,
    /// Mean training loss of each epoch (over all ranks).
    pub epoch_loss: Vec<f64>,
    /// Training accuracy of each epoch (over all ranks).
    pub epoch_accuracy: Vec<f64>,
    /// Samples trained in each epoch, over all ranks (`drop_last` leaves out the tail that does
    /// not split evenly across ranks).
    pub epoch_samples: Vec<usize>,
    /// Wall time of each epoch on this rank.
    pub epoch_seconds: Vec<f64>,
    /// Samples trained per second by all ranks together (all epochs, excluding data
    /// generation).
    pub samples_per_sec: f64,
    /// Samples trained per second by this rank.
    pub rank_samples_per_sec: f64,
    /// Share of the training loop's time spent waiting for data (`LoaderStats::wait_fraction`).
    pub wait_fraction: f64,
    /// Wall time of the training loop.
    pub seconds: f64,
    /// Where the data came from.
    pub data_dir: PathBuf,
    /// Bytes of the loader's pinned pool still leased out (`bytes_in_use`) or waiting on copy
    /// fences (`bytes_pending`) once training ended and the loader was dropped: 0 when every
    /// batch went back to the pool.
    pub pool_bytes_outstanding: usize,
    /// The pool's highest `bytes_held` over the run.
    pub pool_peak_bytes_held: usize,
}

impl Summary {
    /// Mean loss of the first epoch.
    pub fn first_loss(&self) -> f64 {
        self.epoch_loss.first().copied().unwrap_or(f64::NAN)
    }

    /// Mean loss of the last epoch.
    pub fn final_loss(&self) -> f64 {
        self.epoch_loss.last().copied().unwrap_or(f64::NAN)
    }

    /// Accuracy of the last epoch.
    pub fn final_accuracy(&self) -> f64 {
        self.epoch_accuracy.last().copied().unwrap_or(f64::NAN)
    }
}

/// Generates (or reuses) the dataset: `features.npy` `[N, 64]` f32 from a standard Gaussian,
/// `labels.npy` `[N]` i64 = arg-max of a fixed random linear "teacher" plus a little noise.
/// Returns the two paths.
pub fn make_dataset(root: &Path, samples: usize, seed: u64) -> Result<(PathBuf, PathBuf)> {
    let dir = root.join(format!("train-n{samples}-seed{seed}"));
    let (fp, lp) = (dir.join("features.npy"), dir.join("labels.npy"));
    if npy_has_shape(&fp, &[samples, FEATURES]) && npy_has_shape(&lp, &[samples]) {
        return Ok((fp, lp));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7ea_c4e5);
    let teacher: Vec<f32> = (0..FEATURES * CLASSES)
        .map(|_| gaussian(&mut rng))
        .collect();
    let mut x = vec![0f32; samples * FEATURES];
    let mut y = vec![0i64; samples];
    for (row, label) in x.chunks_exact_mut(FEATURES).zip(y.iter_mut()) {
        row.iter_mut().for_each(|v| *v = gaussian(&mut rng));
        let mut best = (f32::MIN, 0);
        for c in 0..CLASSES {
            let logit: f32 = row
                .iter()
                .enumerate()
                .map(|(i, v)| v * teacher[i * CLASSES + c])
                .sum::<f32>()
                + 0.5 * gaussian(&mut rng);
            if logit > best.0 {
                best = (logit, c);
            }
        }
        *label = best.1 as i64;
    }
    write_atomically(&fp, |p| Ok(write_npy(p, &[samples, FEATURES], &x)?))?;
    write_atomically(&lp, |p| Ok(write_npy(p, &[samples], &y)?))?;
    Ok((fp, lp))
}

/// Called between the backward pass and the update with the step's gradients: the place for a
/// gradient all-reduce in data-parallel training (each gradient is a dense f32 buffer on the
/// training device; every op on it must be enqueued on `stream`).
pub trait GradientHook {
    /// Transforms the gradients in place (e.g. all-reduce and divide by the world size).
    fn after_backward(&mut self, stream: &Stream, grads: &mut Gradients) -> Result<()>;

    /// Called at the end of each epoch with this rank's totals, 4 f32 on the training device:
    /// loss sum, correct count, invalid labels, samples. A data-parallel hook sums them across
    /// ranks in place so every rank reports the global figures. The default leaves them.
    fn reduce_epoch_totals(&mut self, _stream: &Stream, _totals: &mut DeviceBuffer) -> Result<()> {
        Ok(())
    }
}

/// The hook of data-parallel training: sums every gradient across the ranks of `comm` and
/// scales it by `1 / world_size` (the mean over the global batch, as one process would
/// compute it), and sums the epoch totals.
#[derive(Debug)]
pub struct DataParallel<'a> {
    comm: &'a Communicator,
}

impl<'a> DataParallel<'a> {
    /// The hook over `comm`.
    pub fn new(comm: &'a Communicator) -> Self {
        Self { comm }
    }
}

impl GradientHook for DataParallel<'_> {
    fn after_backward(&mut self, stream: &Stream, grads: &mut Gradients) -> Result<()> {
        let world = self.comm.world_size();
        for (buf, len) in grads.buffers_mut() {
            self.comm
                .all_reduce_sum(stream, ViewMut::from(&mut *buf), len)?;
            if world > 1 {
                ops::scale(stream, ViewMut::from(buf), len, 1.0 / world as f32)?;
            }
        }
        Ok(())
    }

    fn reduce_epoch_totals(&mut self, stream: &Stream, totals: &mut DeviceBuffer) -> Result<()> {
        self.comm
            .all_reduce_sum(stream, ViewMut::from(totals), EPOCH_TOTALS)?;
        Ok(())
    }
}

/// f32 values handed to [`GradientHook::reduce_epoch_totals`].
pub const EPOCH_TOTALS: usize = 4;

/// The hook of single-device training: leaves the gradients as they are.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoHook;

impl GradientHook for NoHook {
    fn after_backward(&mut self, _: &Stream, _: &mut Gradients) -> Result<()> {
        Ok(())
    }
}

/// One dense layer's parameters (or gradients, or momenta): `w` is `inputs x outputs`
/// row-major, `b` has `outputs` values.
#[derive(Debug)]
pub struct Dense {
    /// Weights.
    pub w: DeviceBuffer,
    /// Bias.
    pub b: DeviceBuffer,
    inputs: usize,
    outputs: usize,
}

impl Dense {
    fn zeros(s: &Stream, inputs: usize, outputs: usize) -> Result<Self> {
        Ok(Self {
            w: s.alloc_zeroed(inputs * outputs * 4)?,
            b: s.alloc_zeroed(outputs * 4)?,
            inputs,
            outputs,
        })
    }

    fn init(s: &Stream, inputs: usize, outputs: usize, rng: &mut ChaCha8Rng) -> Result<Self> {
        // He initialisation for the ReLU layer, the same scale for the output layer.
        let scale = (2.0 / inputs as f32).sqrt();
        let w: Vec<f32> = (0..inputs * outputs)
            .map(|_| gaussian(rng) * scale)
            .collect();
        Ok(Self {
            w: s.to_device(&w)?,
            b: s.alloc_zeroed(outputs * 4)?,
            inputs,
            outputs,
        })
    }

    fn step(&mut self, s: &Stream, velocity: &mut Dense, grad: &Dense, sgd: Sgd) -> Result<()> {
        let n = self.inputs * self.outputs;
        ops::sgd_momentum(
            s,
            ViewMut::from(&mut self.w),
            ViewMut::from(&mut velocity.w),
            View::from(&grad.w),
            n,
            sgd,
        )?;
        ops::sgd_momentum(
            s,
            ViewMut::from(&mut self.b),
            ViewMut::from(&mut velocity.b),
            View::from(&grad.b),
            self.outputs,
            sgd,
        )?;
        Ok(())
    }
}

/// The gradients of one step, handed to a [`GradientHook`].
#[derive(Debug)]
pub struct Gradients {
    /// Of the hidden layer.
    pub hidden: Dense,
    /// Of the output layer.
    pub output: Dense,
}

impl Gradients {
    /// Every gradient buffer with its number of f32 values, in a fixed order.
    pub fn buffers_mut(&mut self) -> [(&mut DeviceBuffer, usize); 4] {
        let (h, o) = (&mut self.hidden, &mut self.output);
        [
            (&mut h.w, h.inputs * h.outputs),
            (&mut h.b, h.outputs),
            (&mut o.w, o.inputs * o.outputs),
            (&mut o.b, o.outputs),
        ]
    }
}

/// A two-layer perceptron `FEATURES -> hidden (ReLU) -> CLASSES` with its optimizer state and
/// the activations of one batch.
#[derive(Debug)]
pub struct Mlp {
    l1: Dense,
    l2: Dense,
    v1: Dense,
    v2: Dense,
    grads: Gradients,
    h: DeviceBuffer,
    logits: DeviceBuffer,
    dlogits: DeviceBuffer,
    dh: DeviceBuffer,
    max_batch: usize,
    sgd: Sgd,
}

impl Mlp {
    /// A freshly initialised model on `s`'s device for batches of up to `max_batch` samples.
    pub fn new(s: &Stream, hidden: usize, max_batch: usize, sgd: Sgd, seed: u64) -> Result<Self> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x1ee7);
        Ok(Self {
            l1: Dense::init(s, FEATURES, hidden, &mut rng)?,
            l2: Dense::init(s, hidden, CLASSES, &mut rng)?,
            v1: Dense::zeros(s, FEATURES, hidden)?,
            v2: Dense::zeros(s, hidden, CLASSES)?,
            grads: Gradients {
                hidden: Dense::zeros(s, FEATURES, hidden)?,
                output: Dense::zeros(s, hidden, CLASSES)?,
            },
            h: s.alloc(max_batch * hidden * 4)?,
            logits: s.alloc(max_batch * CLASSES * 4)?,
            dlogits: s.alloc(max_batch * CLASSES * 4)?,
            dh: s.alloc(max_batch * hidden * 4)?,
            max_batch,
            sgd,
        })
    }

    /// Enqueues one training step on `s`: forward, loss (added to `stats`), backward, `hook`,
    /// update. `x` is `[b, FEATURES]` f32 and `labels` `[b]` i64, e.g. inside a batch.
    pub fn train_step(
        &mut self,
        s: &Stream,
        x: View<'_>,
        labels: View<'_>,
        b: usize,
        stats: &mut DeviceBuffer,
        hook: &mut dyn GradientHook,
    ) -> Result<()> {
        ensure!(
            b <= self.max_batch,
            "batch of {b} exceeds the model's {}",
            self.max_batch
        );
        let hidden = self.l1.outputs;
        // Forward: h = relu(x W1 + b1); logits = h W2 + b2.
        ops::gemm(
            s,
            GemmArgs::new(
                b,
                hidden,
                FEATURES,
                x,
                View::from(&self.l1.w),
                ViewMut::from(&mut self.h),
            ),
        )?;
        ops::bias_act(
            s,
            ViewMut::from(&mut self.h),
            View::from(&self.l1.b),
            b,
            hidden,
            Activation::Relu,
        )?;
        ops::gemm(
            s,
            GemmArgs::new(
                b,
                CLASSES,
                hidden,
                View::from(&self.h),
                View::from(&self.l2.w),
                ViewMut::from(&mut self.logits),
            ),
        )?;
        ops::bias_act(
            s,
            ViewMut::from(&mut self.logits),
            View::from(&self.l2.b),
            b,
            CLASSES,
            Activation::Identity,
        )?;
        // Loss and its gradient (mean over the batch).
        ops::softmax_cross_entropy(
            s,
            CrossEntropyArgs {
                logits: View::from(&self.logits),
                labels,
                rows: b,
                classes: CLASSES,
                grad: ViewMut::from(&mut self.dlogits),
                grad_scale: 1.0 / b as f32,
                stats: ViewMut::from(stats),
            },
        )?;
        // Backward: dW2 = h^T dlogits, db2 = colsum, dh = dlogits W2^T masked by ReLU,
        // dW1 = x^T dh, db1 = colsum.
        let g = &mut self.grads;
        ops::gemm(
            s,
            GemmArgs::new(
                hidden,
                CLASSES,
                b,
                View::from(&self.h),
                View::from(&self.dlogits),
                ViewMut::from(&mut g.output.w),
            )
            .trans_a(true),
        )?;
        ops::bias_grad(
            s,
            View::from(&self.dlogits),
            b,
            CLASSES,
            ViewMut::from(&mut g.output.b),
        )?;
        ops::gemm(
            s,
            GemmArgs::new(
                b,
                hidden,
                CLASSES,
                View::from(&self.dlogits),
                View::from(&self.l2.w),
                ViewMut::from(&mut self.dh),
            )
            .trans_b(true),
        )?;
        ops::relu_backward(
            s,
            ViewMut::from(&mut self.dh),
            View::from(&self.h),
            b * hidden,
        )?;
        ops::gemm(
            s,
            GemmArgs::new(
                FEATURES,
                hidden,
                b,
                x,
                View::from(&self.dh),
                ViewMut::from(&mut g.hidden.w),
            )
            .trans_a(true),
        )?;
        ops::bias_grad(
            s,
            View::from(&self.dh),
            b,
            hidden,
            ViewMut::from(&mut g.hidden.b),
        )?;
        hook.after_backward(s, &mut self.grads)?;
        self.l1
            .step(s, &mut self.v1, &self.grads.hidden, self.sgd)?;
        self.l2
            .step(s, &mut self.v2, &self.grads.output, self.sgd)?;
        Ok(())
    }
}

/// Steps the host may run ahead of the device: it enqueues step `i` only once step `i - LAG`
/// has finished, so the loader's wait figure reflects the device's pace.
const LAG: usize = 2;

/// The sampler of `cfg.rank`: PyTorch's `DistributedSampler(shuffle=True, seed, drop_last=True)`
/// over the generated dataset, also for a single process (one rank of one).
pub fn rank_sampler(cfg: &TrainConfig) -> Result<DistributedSampler> {
    Ok(
        DistributedSampler::builder(cfg.samples, cfg.world_size, cfg.rank)
            .shuffle(true)
            .seed(cfg.seed)
            .drop_last(true)
            .build()?,
    )
}

/// Trains on `device` as configured; see [`train_with_hook`].
pub fn train(cfg: &TrainConfig, device: &Device) -> Result<Summary> {
    train_with_hook(cfg, device, &mut NoHook)
}

/// Data-parallel training: this rank's share of the data on `device`, gradients and epoch
/// totals summed across `comm`'s ranks (see [`DataParallel`]). `cfg.rank` and
/// `cfg.world_size` are taken from `comm`; `cfg.batch_size` is the global batch.
pub fn train_distributed(
    cfg: &TrainConfig,
    device: &Device,
    comm: &Communicator,
) -> Result<Summary> {
    let mut cfg = cfg.clone();
    cfg.rank = comm.rank();
    cfg.world_size = comm.world_size();
    let summary = train_with_hook(&cfg, device, &mut DataParallel::new(comm))?;
    comm.check()?;
    Ok(summary)
}

/// Trains on `device`, calling `hook` between each step's backward pass and its update.
pub fn train_with_hook(
    cfg: &TrainConfig,
    device: &Device,
    hook: &mut dyn GradientHook,
) -> Result<Summary> {
    ensure!(
        cfg.epochs > 0 && cfg.samples > 0 && cfg.batch_size > 0,
        "epochs, samples and batch size must be positive"
    );
    ensure!(
        cfg.world_size > 0 && cfg.rank < cfg.world_size,
        "rank {} is not in 0..{}",
        cfg.rank,
        cfg.world_size
    );
    ensure!(
        (cfg.batch_size / cfg.world_size) * cfg.world_size == cfg.batch_size,
        "the global batch size {} does not split evenly over {} ranks",
        cfg.batch_size,
        cfg.world_size
    );
    ensure!(
        cfg.samples >= cfg.world_size,
        "{} samples cannot be shared by {} ranks",
        cfg.samples,
        cfg.world_size
    );
    let rank_batch = cfg.batch_size / cfg.world_size;
    let leader = cfg.rank == 0;
    let (features, labels) =
        make_dataset(&cfg.data_dir, cfg.samples, cfg.seed).context("generating the dataset")?;
    let ds = Zip::direct(NpyDataset::open(&features)?, NpyDataset::open(&labels)?)?;
    // The same sampler with one rank or many (PyTorch's DistributedSampler: one permutation per
    // epoch from the seed, rank r takes positions r, r + W, ...; drop_last leaves out the tail
    // that does not split evenly), so a single process and W ranks see the same global batches.
    let sampler = rank_sampler(cfg)?;
    let mut builder = DataLoader::builder(ds)
        .collate(DirectCollate::new())
        .batch_size(rank_batch)
        .sampler(sampler)
        .seed(cfg.seed)
        .num_workers(cfg.workers)
        .pin_memory(true);
    if cfg.workers > 0 {
        builder = builder.persistent_workers(true);
    }
    let loader = builder.build()?;

    let compute = device.new_stream()?;
    let sgd = Sgd {
        lr: cfg.lr,
        momentum: cfg.momentum,
        weight_decay: cfg.weight_decay,
    };
    // Every rank draws the same initial weights from the same seed.
    let mut model = Mlp::new(&compute, cfg.hidden, rank_batch, sgd, cfg.seed)?;
    let mut stats = compute.alloc_zeroed(CrossEntropyStats::LEN * 4)?;

    let rank_samples = cfg.samples / cfg.world_size;
    let pb = crate::progress(
        (cfg.epochs * rank_samples) as u64,
        "samples",
        cfg.progress && leader && !cfg.json_epochs,
    );
    let (mut epoch_loss, mut epoch_accuracy) = (Vec::new(), Vec::new());
    let (mut epoch_samples, mut epoch_seconds) = (Vec::new(), Vec::new());
    let mut rank_seen = 0usize;
    let mut in_flight: VecDeque<Event> = VecDeque::new();
    loader.reset_stats();
    let start = Instant::now();
    for epoch in 0..cfg.epochs {
        let epoch_start = Instant::now();
        loader.set_epoch(epoch as u64);
        compute.memset(&mut stats, 0)?;
        let mut seen = 0usize;
        for item in loader.to_device(device, cfg.prefetch_depth)? {
            let batch = item?.wait_on(&compute)?;
            if seen == 0 && epoch == 0 {
                expect_tensor(
                    "features",
                    batch.dtype(0)?,
                    DType::F32,
                    batch.shape(0)?,
                    &[FEATURES],
                )?;
                expect_tensor("labels", batch.dtype(1)?, DType::I64, batch.shape(1)?, &[])?;
            }
            let b = batch.batch_size();
            let (xo, yo) = (batch.spec(0)?.offset, batch.spec(1)?.offset);
            model.train_step(
                &compute,
                View::new(batch.buffer(0)?, xo),
                View::new(batch.buffer(1)?, yo),
                b,
                &mut stats,
                hook,
            )?;
            in_flight.push_back(compute.record()?);
            if in_flight.len() > LAG {
                in_flight
                    .pop_front()
                    .map(|ev| ev.synchronize())
                    .transpose()?;
            }
            seen += b;
            pb.inc(b as u64);
        }
        if seen == 0 {
            bail!("epoch {epoch} delivered no samples to rank {}", cfg.rank);
        }
        rank_seen += seen;
        // This rank's totals, summed over the ranks by the hook.
        let mut local = compute.read_to_vec::<f32>(&stats)?;
        local.truncate(CrossEntropyStats::LEN);
        local.push(seen as f32);
        let mut totals = compute.to_device(&local)?;
        hook.reduce_epoch_totals(&compute, &mut totals)?;
        let all = compute.read_to_vec::<f32>(&totals)?;
        let st = CrossEntropyStats::from_slice(&all)?;
        let samples = all[CrossEntropyStats::LEN] as usize;
        in_flight.clear();
        ensure!(
            st.invalid_labels == 0,
            "{} labels were outside 0..{CLASSES}",
            st.invalid_labels
        );
        let (loss, acc) = (
            st.loss_sum / samples as f64,
            st.correct as f64 / samples as f64,
        );
        let secs = epoch_start.elapsed().as_secs_f64();
        epoch_loss.push(loss);
        epoch_accuracy.push(acc);
        epoch_samples.push(samples);
        epoch_seconds.push(secs);
        if !leader {
            continue;
        }
        if cfg.json_epochs {
            let line = serde_json::json!({
                "epoch": epoch + 1,
                "loss": loss,
                "accuracy": acc,
                "samples": samples,
                "seconds": secs,
                "world_size": cfg.world_size,
            });
            println!("{line}");
            continue;
        }
        let line = format!(
            "epoch {:>2}: loss {loss:.4}  accuracy {:.1}%",
            epoch + 1,
            100.0 * acc
        );
        if cfg.progress && pb.is_hidden() {
            println!("{line}"); // not a terminal: no bar to print above
        } else {
            pb.println(line);
        }
        pb.set_message(format!("loss {loss:.4}"));
    }
    compute.synchronize()?;
    let seconds = start.elapsed().as_secs_f64();
    pb.finish_and_clear();
    let trained: usize = epoch_samples.iter().sum();
    let wait_fraction = loader.stats().wait_fraction();
    // Every batch back to the pool: drop the loader (its workers and any batch it prefetched
    // for a next epoch), let finished copies release their blocks, then read the counters.
    let pool = loader.pool().clone();
    drop(loader);
    pool.collect();
    let ps = pool.stats();
    Ok(Summary {
        device: device.name(),
        epochs: cfg.epochs,
        samples: cfg.samples,
        batch_size: cfg.batch_size,
        rank: cfg.rank,
        world_size: cfg.world_size,
        workers: cfg.workers,
        epoch_loss,
        epoch_accuracy,
        epoch_samples,
        epoch_seconds,
        samples_per_sec: trained as f64 / seconds,
        rank_samples_per_sec: rank_seen as f64 / seconds,
        wait_fraction,
        seconds,
        data_dir: cfg.data_dir.clone(),
        pool_bytes_outstanding: ps.bytes_in_use + ps.bytes_pending,
        pool_peak_bytes_held: ps.peak_bytes_held,
    })
}
