//! `budget`: what a pinned budget costs (issue 29). The `images-u8` workload (u8 images
//! [3, 224, 224] from a `.npy` file, batch 256, about 37 MiB a batch in a 40 MiB pool block),
//! 16 workers, delivered to the device (`Device::cuda(0)`, else read on the CPU), under
//! budgets from unconstrained to two batches' worth of blocks, at `prefetch_factor` 2 and 8.
//! Steady state as every loader figure here ([`drive::METHOD`]): a warm-up epoch, then whole
//! epochs. Each row reports images/s, the pool's peak held bytes and waits, the workers' time
//! waiting for pinned memory (and the share of the consumer's wait it explains), and the rate
//! as a fraction of the unconstrained one at the same `prefetch_factor`, in the same run, and
//! the worker-bound rate: `min(in flight, workers) x batch / (one worker's time per batch)`,
//! what the batches the budget lets the loader keep in flight allow when loading is the
//! bottleneck (with a 2-batch budget, one batch: one worker at a time).

use anyhow::Result;
use longshore::data::{DirectCollate, NpyDataset};
use longshore::host::{MemoryKind, PinnedPool, PoolConfig, size_class};
use longshore::loader::DataLoader;
use longshore_benches::measure::{print_table, size_label};
use longshore_benches::workload;
use serde_json::json;

use crate::drive::{self, Window, Workload};
use crate::{Ctx, MIB};

/// A budget of the table.
#[derive(Debug, Clone, Copy)]
enum Budget {
    /// The pool's default (a quarter of RAM).
    Default,
    /// A number of bytes.
    Bytes(usize),
    /// A number of batches' blocks.
    Batches(usize),
}

impl Budget {
    fn bytes(self, block: usize) -> Option<usize> {
        match self {
            Budget::Default => None,
            Budget::Bytes(b) => Some(b),
            Budget::Batches(n) => Some(n * block),
        }
    }

    fn label(self, block: usize) -> String {
        match self {
            Budget::Default => "default".into(),
            Budget::Bytes(b) => size_label(b),
            Budget::Batches(n) => format!("{} ({n} batches)", size_label(n * block)),
        }
    }
}

pub(crate) fn run(ctx: &mut Ctx) -> Result<()> {
    let files = drive::ensure_data(ctx)?;
    let w = Workload::ImagesU8;
    let workers = if ctx.quick { 4 } else { 16 };
    let factors: &[usize] = if ctx.quick { &[2] } else { &[2, 8] };
    let budgets: Vec<Budget> = if ctx.quick {
        vec![Budget::Default, Budget::Batches(6), Budget::Batches(2)]
    } else {
        vec![
            Budget::Default,
            Budget::Bytes(2048 * MIB),
            Budget::Batches(12),
            Budget::Batches(6),
            Budget::Batches(2),
        ]
    };
    let batch_bytes = w.batch_size() * w.sample_bytes();
    let block = size_class(batch_bytes).expect("a batch has a size class");
    let kind = if longshore::host::driver_available() {
        MemoryKind::PageLocked
    } else {
        MemoryKind::Pageable
    };
    let device = ctx.cuda.clone();
    let mut rows = Vec::new();
    for &pf in factors {
        let mut unconstrained = None;
        for &budget in &budgets {
            let ds = NpyDataset::open(&files.images)?;
            let mut b = DataLoader::builder(ds)
                .collate(DirectCollate::new().with_names(["image"]))
                .batch_size(w.batch_size())
                .shuffle(true)
                .drop_last(true)
                .num_workers(workers)
                .prefetch_factor(pf)
                .pin_memory(true)
                .persistent_workers(true)
                .seed(0);
            if let Some(bytes) = budget.bytes(block) {
                b = b.pool(PinnedPool::new(PoolConfig::for_kind(kind).budget(bytes))?);
            }
            let loader = b.build()?;
            let run = drive::drive(
                &loader,
                device.as_ref(),
                Window::steady(ctx.quick),
                None,
                None,
                w,
            )?;
            let s = loader.stats();
            let rate = run.samples_per_s;
            let base = *unconstrained.get_or_insert(rate);
            let ratio = rate / base;
            // What `in_flight` batches loaded side by side allow: each takes a worker for
            // `worker_ms_per_batch`, so at most min(in flight, workers) batches per that time.
            let parallel = s.in_flight_limit.clamp(1, workers) as f64;
            let bound =
                parallel * w.batch_size() as f64 / (run.worker_ms_per_batch / 1e3).max(1e-9);
            let label = budget.label(block);
            let p = json!({
                "budget": label,
                "budget_bytes": budget.bytes(block),
                "block_bytes": block,
                "prefetch_factor": pf,
                "num_workers": workers,
                "device": device.is_some(),
                "pool_kind": kind.as_str(),
            });
            let name = format!("{label} pf{pf}");
            ctx.results.push(
                "budget",
                format!("{name} images/s"),
                rate,
                "samples/s",
                p.clone(),
            );
            ctx.results.push(
                "budget",
                format!("{name} vs unconstrained"),
                ratio,
                "x",
                p.clone(),
            );
            ctx.results.push(
                "budget",
                format!("{name} peak held"),
                s.pool.peak_bytes_held as f64,
                "bytes",
                p.clone(),
            );
            ctx.results.push(
                "budget",
                format!("{name} waits"),
                s.pool.waits as f64,
                "count",
                p.clone(),
            );
            ctx.results.push(
                "budget",
                format!("{name} worker pinned wait"),
                s.pinned_wait.as_secs_f64(),
                "s",
                p.clone(),
            );
            ctx.results.push(
                "budget",
                format!("{name} worker-bound rate"),
                bound,
                "samples/s",
                p.clone(),
            );
            ctx.results.push(
                "budget",
                format!("{name} pinned share of consumer wait"),
                s.pinned_wait_fraction(),
                "fraction",
                p,
            );
            rows.push(vec![
                label,
                pf.to_string(),
                format!("{rate:.0}"),
                format!("{ratio:.2}"),
                size_label(s.pool.peak_bytes_held),
                s.pool.waits.to_string(),
                format!("{:.2}", s.pinned_wait.as_secs_f64()),
                format!("{:.2}", s.pinned_wait_fraction()),
                format!("{:.2}", run.wait_fraction),
                s.in_flight_limit.to_string(),
                format!("{bound:.0}"),
                s.reloaded.to_string(),
            ]);
        }
    }
    ctx.results.note(
        "budget",
        format!(
            "images-u8 ({} images of {:?} u8, batch {}, block {}), {workers} workers, {}; {}",
            ctx.args
                .image_rows
                .unwrap_or(Workload::ImagesU8.rows(ctx.quick)),
            workload::IMAGE_SHAPE,
            w.batch_size(),
            size_label(block),
            if device.is_some() {
                "to cuda:0"
            } else {
                "no device: read on the CPU"
            },
            drive::METHOD
        ),
    );
    print_table(
        &format!(
            "budget: images-u8, {workers} workers, batch {} ({} blocks), {}",
            w.batch_size(),
            size_label(block),
            if device.is_some() {
                "to cuda:0"
            } else {
                "no device"
            }
        ),
        &[
            "budget",
            "pf",
            "images/s",
            "vs unconstrained",
            "peak held",
            "waits",
            "worker pinned wait s",
            "pinned share of wait",
            "wait fraction",
            "in flight",
            "worker bound/s",
            "reloaded",
        ],
        &rows,
    );
    Ok(())
}
