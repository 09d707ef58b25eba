//! Reliability (issue #7): a bounded soak. Random datasets, random loader options (workers,
//! prefetch, in_order, persistent, pin, batch size, drop_last, shuffle, error policies,
//! timeout), random faults (failing, panicking, wrong-shaped and sleeping samples), many epochs,
//! all through one shared pool.
//!
//! Checked on every epoch: each batch of the sampler's epoch is delivered at most once, either
//! whole and correct or as an error naming it (and, unless the epoch was ended by a panic or a
//! timeout, every batch is accounted for); no good batch holds a failing sample. Checked between
//! loaders: every lease is back; the pool never holds more than the loaders' bound, and after
//! warm-up (which runs the heaviest options first) its held bytes do not grow past what warm-up
//! reached, except within that bound. Checked at the end: no thread outlives the loaders.
//!
//! Runs ~20 s by default; `LONGSHORE_SOAK_SECS` overrides, `LONGSHORE_SOAK_SEED` replays:
//!
//! ```text
//! LONGSHORE_SOAK_SECS=600 cargo test --release -p longshore-loader --test reliability_soak -- --nocapture
//! ```
//!
//! Alone in its binary so the thread count is not disturbed by other tests.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use common::{Chaos, chaos_ids, eventually, ragged_consistent, thread_count};
use longshore_data::{BatchSampler, BatchSampling, RandomSampler, SequentialSampler};
use longshore_host::{BudgetPolicy, MemoryKind, PinnedPool, PoolConfig};
use longshore_loader::{DataLoader, LoaderError, SampleErrorPolicy, WorkerPanicPolicy};
use rand::{Rng, SeedableRng, rngs::StdRng};

/// Most pool bytes the soak's loaders may ever hold at once: every Chaos batch (at most 32
/// samples) fits one page-sized block, and a loader holds at most `num_workers *
/// prefetch_factor` (4 x 4) batches sent and not yet delivered, plus the one the consumer holds,
/// plus one per worker still finishing a batch of an epoch just cut short.
fn held_bound() -> usize {
    (4 * 4 + 1 + 4) * longshore_host::size_class(1).unwrap()
}

#[derive(Debug, Clone)]
struct Opts {
    len: usize,
    batch_size: usize,
    workers: usize,
    prefetch: usize,
    in_order: bool,
    persistent: bool,
    pin: bool,
    drop_last: bool,
    shuffle: bool,
    skip: bool,
    restart: bool,
    timeout: bool,
    epochs: u64,
    seed: u64,
    /// The consumer pauses after each batch, so everything in flight gets loaded.
    slow_consumer: bool,
}

#[derive(Debug, Default)]
struct Totals {
    loaders: u64,
    tight_loaders: u64,
    reloaded: u64,
    epochs: u64,
    epochs_cut: u64,
    good_batches: u64,
    failed_batches: u64,
    samples: u64,
    faults: u64,
}

fn expected_batches(o: &Opts, epoch: u64) -> Vec<Vec<usize>> {
    let mut s: Box<dyn BatchSampling> = if o.shuffle {
        Box::new(
            BatchSampler::new(
                RandomSampler::new(o.len, o.seed).unwrap(),
                o.batch_size,
                o.drop_last,
            )
            .unwrap(),
        )
    } else {
        Box::new(
            BatchSampler::new(SequentialSampler::new(o.len), o.batch_size, o.drop_last).unwrap(),
        )
    };
    s.set_epoch(epoch);
    s.iter().collect()
}

fn draw(rng: &mut StdRng) -> (Opts, Chaos) {
    let workers = rng.random_range(0..5);
    let len = rng.random_range(0..400);
    let o = Opts {
        len,
        batch_size: rng.random_range(1..33),
        workers,
        prefetch: rng.random_range(1..5),
        in_order: workers == 0 || rng.random_bool(0.6),
        persistent: workers > 0 && rng.random_bool(0.5),
        pin: rng.random_bool(0.5),
        drop_last: rng.random_bool(0.3),
        // An empty dataset cannot be shuffled (PyTorch's RandomSampler refuses it too).
        shuffle: len > 0 && rng.random_bool(0.6),
        skip: rng.random_bool(0.3),
        restart: rng.random_bool(0.5),
        timeout: workers > 0 && rng.random_bool(0.15),
        epochs: rng.random_range(1..5),
        seed: rng.random(),
        slow_consumer: rng.random_bool(0.2),
    };
    let mut ds = Chaos::new(o.len);
    ds.jitter_us = [0, 0, 100, 500][rng.random_range(0..4)];
    ds.jitter_seed = rng.random();
    ds.sleep = Duration::from_millis(if o.timeout { 300 } else { 20 });
    if o.len > 0 {
        for _ in 0..rng.random_range(0..5) {
            let i = rng.random_range(0..o.len);
            match rng.random_range(0..4) {
                0 => ds.fail.insert(i),
                1 => ds.panic_on.insert(i),
                2 => ds.ragged.insert(i),
                _ => ds.sleep_on.insert(i),
            };
        }
    }
    (o, ds)
}

/// Runs one loader for its epochs; returns whether every check held (panics otherwise).
fn soak_one(o: &Opts, ds: Chaos, pool: &PinnedPool, t: &mut Totals) {
    let fail = ds.fail.clone();
    let panics = ds.panic_on.clone();
    let ragged = ds.ragged.clone();
    t.faults += (fail.len() + panics.len() + ragged.len() + ds.sleep_on.len()) as u64;
    let mut b = DataLoader::builder(ds)
        .batch_size(o.batch_size)
        .num_workers(o.workers)
        .in_order(o.in_order)
        .pin_memory(o.pin)
        .drop_last(o.drop_last)
        .shuffle(o.shuffle)
        .seed(o.seed)
        .pool(pool.clone())
        .shutdown_timeout(Duration::from_millis(500));
    if o.workers > 0 {
        b = b
            .prefetch_factor(o.prefetch)
            .persistent_workers(o.persistent);
    }
    if o.skip {
        b = b.on_sample_error(SampleErrorPolicy::Skip);
    }
    if o.restart {
        b = b.on_worker_panic(WorkerPanicPolicy::Restart);
    }
    if o.timeout {
        b = b.timeout(Duration::from_millis(100));
    }
    let loader = b.build().unwrap();
    t.loaders += 1;
    for epoch in 0..o.epochs {
        let want = expected_batches(o, epoch);
        let seq_of: HashMap<usize, usize> = want
            .iter()
            .enumerate()
            .flat_map(|(s, b)| b.iter().map(move |&i| (i, s)))
            .collect();
        let mut answered = BTreeSet::new();
        let mut cut = false;
        let mut delivered = Vec::new();
        for r in &loader {
            match r {
                Ok(batch) => {
                    let (got, width) = chaos_ids(&batch);
                    let seq = seq_of[&got[0]];
                    let mut expect = want[seq].clone();
                    if o.skip {
                        expect.retain(|i| !fail.contains(i));
                    }
                    assert_eq!(got, expect, "{o:?} epoch {epoch}: batch {seq} contents");
                    assert!(got.iter().all(|i| !panics.contains(i)));
                    assert!(ragged_consistent(&got, width, &ragged), "{o:?}: {got:?}");
                    assert!(answered.insert(seq), "{o:?}: batch {seq} twice");
                    if o.in_order {
                        delivered.push(seq);
                    }
                    t.good_batches += 1;
                    t.samples += got.len() as u64;
                    if o.slow_consumer {
                        std::thread::sleep(Duration::from_micros(500));
                    }
                }
                Err(e) => {
                    let seq = match &e {
                        LoaderError::Sample { index, batch, .. } => {
                            assert!(fail.contains(index), "{o:?}: blamed sample {index}");
                            assert_eq!(seq_of[index], *batch as usize);
                            *batch
                        }
                        LoaderError::Collate { batch, .. } => {
                            let w = &want[*batch as usize];
                            assert!(
                                w.iter().any(|i| ragged.contains(i))
                                    && !w.iter().all(|i| ragged.contains(i)),
                                "{o:?}: collate error on a good batch {batch}: {e}"
                            );
                            *batch
                        }
                        LoaderError::WorkerPanicked { batch, .. } => {
                            assert!(want[*batch as usize].iter().any(|i| panics.contains(i)));
                            cut |= !o.restart;
                            *batch
                        }
                        LoaderError::Timeout { batch, .. } => {
                            assert!(o.timeout, "{o:?}: timeout without one set");
                            cut = true;
                            *batch
                        }
                        other => panic!("{o:?}: unexpected error {other}"),
                    };
                    if !matches!(e, LoaderError::Timeout { .. }) {
                        assert!(answered.insert(seq as usize), "{o:?}: batch {seq} twice");
                        if o.in_order {
                            delivered.push(seq as usize);
                        }
                    }
                    t.failed_batches += 1;
                }
            }
        }
        t.epochs += 1;
        if o.in_order {
            assert!(
                delivered.windows(2).all(|w| w[0] < w[1]),
                "{o:?}: out of order"
            );
        }
        if cut {
            t.epochs_cut += 1;
        } else {
            // Every batch answered, except those whose every sample was skipped.
            let missing: Vec<usize> = (0..want.len()).filter(|s| !answered.contains(s)).collect();
            for s in missing {
                assert!(
                    o.skip && want[s].iter().all(|i| fail.contains(i)),
                    "{o:?} epoch {epoch}: batch {s} never answered"
                );
            }
        }
    }
    t.reloaded += loader.stats().reloaded;
    drop(loader);
    assert!(
        eventually(Duration::from_secs(3), || pool.stats().bytes_in_use == 0),
        "{o:?}: leases leaked: {:?}",
        pool.stats()
    );
}

#[test]
fn soak() {
    let secs: u64 = std::env::var("LONGSHORE_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let seed: u64 = std::env::var("LONGSHORE_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    println!("soak: {secs} s, LONGSHORE_SOAK_SEED={seed}");
    // The injected panics are expected: keep them out of the output.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let injected = info
            .payload()
            .downcast_ref::<String>()
            .is_some_and(|m| m.starts_with("chaos panics on sample"));
        if !injected {
            default_hook(info);
        }
    }));
    let before = thread_count();
    let (tx, rx) = std::sync::mpsc::channel();
    // The soak runs on its own thread under a watchdog of twice its duration plus a minute.
    let worker = std::thread::spawn(move || {
        let mut rng = StdRng::seed_from_u64(seed);
        let pool = PinnedPool::new(PoolConfig::for_kind(MemoryKind::Pageable)).unwrap();
        // A quarter of the loaders share a pool of three blocks under `Wait` instead: far less
        // than their batches in flight, so workers block on the budget all the time.
        let block = longshore_host::size_class(1).unwrap();
        let tight = PinnedPool::new(
            PoolConfig::for_kind(MemoryKind::Pageable)
                .budget(3 * block)
                .policy(BudgetPolicy::Wait {
                    timeout: Duration::from_secs(30),
                }),
        )
        .unwrap();
        let mut t = Totals::default();
        let start = Instant::now();
        let total = Duration::from_secs(secs);
        let warm_up = total / 4;
        // Warm-up starts with the heaviest options (both orders, slow and fast workers), so
        // later loaders should need no block the pool has not cached already.
        for (in_order, jitter_us) in [(true, 500), (false, 500), (true, 0), (false, 0)] {
            let (mut o, mut ds) = draw(&mut rng);
            (o.workers, o.prefetch, o.batch_size, o.len) = (4, 4, 32, 399);
            (o.in_order, o.timeout, o.epochs, o.slow_consumer) = (in_order, false, 2, true);
            (ds.len, ds.jitter_us) = (399, jitter_us);
            ds.sleep = Duration::from_millis(20);
            soak_one(&o, ds, &pool, &mut t);
        }
        let mut warm_peak = None;
        let mut held_after = 0usize;
        while start.elapsed() < total {
            let (o, ds) = draw(&mut rng);
            if rng.random_bool(0.25) {
                soak_one(&o, ds, &tight, &mut t);
                t.tight_loaders += 1;
                let s = tight.stats();
                assert!(
                    s.peak_bytes_held <= 3 * block,
                    "tight pool past budget: {s:?}"
                );
                continue;
            }
            soak_one(&o, ds, &pool, &mut t);
            let s = pool.stats();
            match warm_peak {
                None if start.elapsed() >= warm_up => warm_peak = Some(s.peak_bytes_held),
                None => {}
                Some(peak) => {
                    held_after = held_after.max(s.bytes_held);
                    // Growth past what warm-up reached is only allowed up to the bound.
                    assert!(
                        s.bytes_held <= peak.max(held_bound()),
                        "pool held bytes grew after warm-up: {} > {peak} and past the bound \
                         {} ({s:?})",
                        s.bytes_held,
                        held_bound()
                    );
                }
            }
            assert!(
                s.peak_bytes_held <= held_bound(),
                "pool past its bound: {s:?}"
            );
        }
        let s = pool.stats();
        println!(
            "soak: {:.1} s, {} loaders, {} epochs ({} cut short by a panic or timeout), {} good batches, \
             {} failed batches, {} samples, {} faults injected; pool peak held {} B (warm-up peak {:?}), \
             held after warm-up at most {} B, {} allocations, {} hits; {} loaders on a 3-block Wait \
             pool ({} waits, {} batches given back by the reorder buffer)",
            start.elapsed().as_secs_f64(),
            t.loaders,
            t.epochs,
            t.epochs_cut,
            t.good_batches,
            t.failed_batches,
            t.samples,
            t.faults,
            s.peak_bytes_held,
            warm_peak,
            held_after,
            s.allocations,
            s.hits,
            t.tight_loaders,
            tight.stats().waits,
            t.reloaded
        );
        assert!(t.epochs > 0);
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(2 * secs + 60)) {
        Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(p) = worker.join() {
                std::panic::resume_unwind(p);
            }
        }
        Err(_) => panic!("soak hung (seed {seed})"),
    }
    let ok = eventually(Duration::from_secs(3), || thread_count() <= before);
    assert!(
        ok,
        "threads leaked: {before} before, {} after",
        thread_count()
    );
}
