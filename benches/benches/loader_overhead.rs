//! The loader's own serial cost, with datasets so cheap that the consumer thread's
//! bookkeeping is what is timed (docs/benchmarks.md, "Known limits", tabular):
//!
//! * `loader_epoch_start`: time from `loader.iter()` to the first batch of an epoch of the
//!   tabular shape (2,000,000 rows shuffled, batch 1024, persistent workers, after a warm-up
//!   epoch), each epoch then consumed whole, untimed. Before lazy dealing the consumer
//!   materialised the whole epoch's batches here; now the order is drawn during the
//!   previous epoch.
//! * `loader_per_batch`: whole epochs of a trivial dataset (an `i64` per sample) at batch 1
//!   and batch 1024 with 1 and 2 workers, consumed on the CPU; the figure per element is the
//!   time per delivered batch, i.e. the loader's per-batch overhead on this machine.
//! * `sampler_epoch_order`: a shuffled epoch's batches of 2,000,000 indices, materialised (what
//!   every epoch start used to pay on the consumer thread).
//!
//! `LONGSHORE_BENCH_QUICK=1` uses smaller epochs.
#![forbid(unsafe_code)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use longshore::data::{BatchSampler, BatchSampling, DataError, Dataset, RandomSampler};
use longshore::loader::DataLoader;

fn quick() -> bool {
    std::env::var("LONGSHORE_BENCH_QUICK").is_ok_and(|v| v == "1")
}

/// `len` samples of one `i64`: loading costs next to nothing.
struct Tiny {
    len: usize,
}

impl Dataset for Tiny {
    type Item = (i64,);
    fn len(&self) -> usize {
        self.len
    }
    fn get(&self, index: usize) -> Result<(i64,), DataError> {
        Ok((index as i64,))
    }
}

fn epoch_start(c: &mut Criterion) {
    let rows = if quick() { 65_536 } else { 2_000_000 };
    let mut g = c.benchmark_group("loader_epoch_start");
    g.sample_size(10);
    for workers in [1usize, 2] {
        let loader = DataLoader::builder(Tiny { len: rows })
            .batch_size(1024)
            .shuffle(true)
            .num_workers(workers)
            .persistent_workers(true)
            .seed(7)
            .build()
            .expect("loader");
        // Warm-up epoch: workers started, pool filled.
        for b in &loader {
            black_box(b.expect("batch"));
        }
        g.bench_function(format!("tabular_rows{rows}_b1024_w{workers}"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let t0 = Instant::now();
                    let mut it = loader.iter();
                    let first = it.next();
                    total += t0.elapsed();
                    black_box(first.expect("a batch").expect("batch"));
                    // The rest of the epoch is consumed, untimed, as a training run would
                    // (the next epoch's order is drawn meanwhile).
                    for b in it {
                        black_box(b.expect("batch"));
                    }
                }
                total
            })
        });
    }
    g.finish();
}

fn per_batch(c: &mut Criterion) {
    let mut g = c.benchmark_group("loader_per_batch");
    g.sample_size(10);
    for (batch, batches) in [(1usize, 20_000usize), (1024, 2_000)] {
        let batches = if quick() { batches / 10 } else { batches };
        for workers in [1usize, 2] {
            let loader = DataLoader::builder(Tiny {
                len: batch * batches,
            })
            .batch_size(batch)
            .shuffle(true)
            .num_workers(workers)
            .persistent_workers(true)
            .seed(7)
            .build()
            .expect("loader");
            for b in &loader {
                black_box(b.expect("batch"));
            }
            g.throughput(Throughput::Elements(batches as u64));
            g.bench_function(format!("b{batch}_w{workers}"), |b| {
                b.iter(|| {
                    let mut n = 0usize;
                    for item in &loader {
                        let item = item.expect("batch");
                        n += item.batch_size();
                        drop(item);
                    }
                    black_box(n)
                })
            });
        }
    }
    g.finish();
}

fn sampler_order(c: &mut Criterion) {
    let rows = if quick() { 65_536 } else { 2_000_000 };
    let mut sampler = BatchSampler::new(RandomSampler::new(rows, 7).expect("sampler"), 1024, false)
        .expect("batch sampler");
    let mut g = c.benchmark_group("sampler_epoch_order");
    g.sample_size(20);
    let mut epoch = 0;
    g.bench_function(format!("shuffled_rows{rows}_b1024_collect"), |b| {
        b.iter(|| {
            epoch += 1;
            sampler.set_epoch(epoch);
            let all: Vec<Vec<usize>> = sampler.iter().collect();
            black_box(all.len())
        })
    });
    g.bench_function(format!("shuffled_rows{rows}_b1024_first"), |b| {
        b.iter(|| {
            epoch += 1;
            sampler.set_epoch(epoch);
            black_box(sampler.iter().next())
        })
    });
    g.finish();
}

criterion_group!(benches, epoch_start, per_batch, sampler_order);
criterion_main!(benches);
