//! Dealing to the pinned budget (issue 29): over budgets of 1 to 16 blocks, worker counts,
//! prefetch factors and both orders, with the consumer's "copies" completing late (each
//! delivered batch's block is released under a `CpuFence` that a device thread signals after
//! a random delay, as the `Cpu` backend's and CUDA's events complete after the copy): no
//! deadlock, every sample exactly once per epoch, the pool never above its budget, and blocks
//! granted in delivery order (a request is never served while a request of a batch delivered
//! before it waits: the pool's grant record says so, not a timing).

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use std::sync::Mutex;

use common::{watchdog, watchdog_with};
use longshore_data::{DataError, Dataset};
use longshore_host::{BudgetPolicy, CpuFence, MemoryKind, PinnedPool, PoolConfig};
use longshore_loader::{DataLoader, LoaderWarning};
use proptest::prelude::*;

const SAMPLE: usize = 3000;
const BATCH: usize = 4;
const BATCHES: usize = 24;

/// Sample `i`: its index and `SAMPLE` bytes of `i % 251`, after a short, index-dependent pause
/// (workers finish out of order).
struct Samples;

impl Dataset for Samples {
    type Item = ([u32; 1], Vec<u8>);
    fn len(&self) -> usize {
        BATCH * BATCHES
    }
    fn get(&self, i: usize) -> Result<Self::Item, DataError> {
        let h = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 52;
        std::thread::sleep(Duration::from_micros(h % 400));
        Ok(([i as u32], vec![(i % 251) as u8; SAMPLE]))
    }
}

/// The pool block one batch takes.
fn block_bytes() -> usize {
    let l = DataLoader::builder(Samples)
        .batch_size(BATCH)
        .pin_memory(false)
        .build()
        .unwrap();
    let b = l.iter().next().unwrap().unwrap();
    b.storage().capacity()
}

/// Signals fences after a random delay of up to 2 ms, out of order.
fn device() -> (mpsc::Sender<Arc<CpuFence>>, std::thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel::<Arc<CpuFence>>();
    let handle = std::thread::spawn(move || {
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut queue: Vec<Arc<CpuFence>> = Vec::new();
        loop {
            match rx.recv_timeout(Duration::from_micros(300)) {
                Ok(f) => queue.push(f),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) if queue.is_empty() => return,
                Err(mpsc::RecvTimeoutError::Disconnected) => {}
            }
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            if !queue.is_empty() && state.is_multiple_of(3) {
                let i = (state >> 8) as usize % queue.len();
                queue.swap_remove(i).signal();
            }
        }
    });
    (tx, handle)
}

/// What the running case is doing, for the failure message of a hang: its pool, its loader's
/// stats and where the consumer is.
struct Watched {
    pool: PinnedPool,
    loader: Box<dyn Fn() -> longshore_loader::LoaderStats + Send>,
    at: String,
}

static WATCHED: Mutex<Option<Watched>> = Mutex::new(None);

fn at(place: String) {
    if let Some(w) = WATCHED.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
        w.at = place;
    }
}

/// The loader's debug log of the running case (the consumer's thread): what a wait for a
/// batch reports every few seconds (the batches in flight, the workers' queues, the next
/// epoch's batches, the pool).
static LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());

#[derive(Clone, Copy)]
struct LogWriter;

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOG.lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs `f` with the loader's debug events written to `LOG` (emptied first).
fn logged<R>(f: impl FnOnce() -> R) -> R {
    LOG.lock().unwrap_or_else(|p| p.into_inner()).clear();
    let sub = tracing_subscriber::fmt()
        .with_writer(|| LogWriter)
        .with_ansi(false)
        .with_env_filter("longshore::loader=debug")
        .finish();
    tracing::subscriber::with_default(sub, f)
}

/// The state of the case that hung.
fn diagnose() -> String {
    let log = String::from_utf8_lossy(&LOG.lock().unwrap_or_else(|p| p.into_inner())).into_owned();
    let tail: Vec<&str> = log.lines().rev().take(30).collect();
    let log: Vec<&str> = tail.into_iter().rev().collect();
    match WATCHED.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
        Some(w) => format!(
            "\nconsumer: {}\npool: {:?}\nloader: {:?}\nlog:\n{}",
            w.at,
            w.pool.stats(),
            (w.loader)(),
            log.join("\n")
        ),
        None => String::new(),
    }
}

fn run(blocks: usize, workers: usize, prefetch: usize, in_order: bool) {
    let block = block_bytes();
    let budget = blocks * block;
    let pool = PinnedPool::new(
        PoolConfig::for_kind(MemoryKind::Pageable)
            .budget(budget)
            .policy(BudgetPolicy::Wait {
                timeout: Duration::from_secs(30),
            }),
    )
    .unwrap();
    pool.record_grants(true);
    let l = DataLoader::builder(Samples)
        .batch_size(BATCH)
        .num_workers(workers)
        .prefetch_factor(prefetch)
        .in_order(in_order)
        .persistent_workers(true)
        .prefetch_next_epoch(true)
        .pool(pool.clone())
        .build()
        .unwrap();
    let stats = l.clone();
    *WATCHED.lock().unwrap_or_else(|p| p.into_inner()) = Some(Watched {
        pool: pool.clone(),
        loader: Box::new(move || stats.stats()),
        at: "started".into(),
    });
    let (fences, dev) = device();
    // The consumer keeps the batch it has while it asks for the next one (as a training loop
    // does), except with a single block, where that would hoard the whole budget.
    let hold = blocks >= 2;
    for epoch in 0..2 {
        let mut seen = BTreeSet::new();
        let mut held = None;
        let mut it = l.iter();
        loop {
            at(format!(
                "epoch {epoch}: waiting for batch {} ({blocks} blocks, {workers} workers, prefetch {prefetch}, in order {in_order})",
                seen.len() / BATCH
            ));
            let next = it.next();
            drop(held.take());
            let Some(r) = next else { break };
            let b = r.unwrap_or_else(|e| panic!("epoch {epoch}: {e}"));
            let ids = b.tensor::<u32>(0).unwrap().to_vec();
            let data = b.tensor::<u8>(1).unwrap();
            for (k, &i) in ids.iter().enumerate() {
                assert!(
                    seen.insert(i),
                    "sample {i} delivered twice in epoch {epoch}"
                );
                assert!(
                    data[k * SAMPLE..(k + 1) * SAMPLE]
                        .iter()
                        .all(|&v| v == (i % 251) as u8),
                    "sample {i} corrupted"
                );
            }
            // The "copy" from the batch completes late.
            let (layout, mut storage) = b.into_parts();
            drop(layout);
            let f = CpuFence::new();
            storage.record_fence(f.clone());
            fences.send(f).unwrap();
            if hold {
                held = Some(storage);
            }
        }
        assert_eq!(
            seen.len(),
            BATCH * BATCHES,
            "epoch {epoch}: every sample once"
        );
    }
    at("dropping the loader".into());
    drop(l);
    drop(fences);
    at("joining the device thread".into());
    dev.join().unwrap();
    at("checking".into());
    let s = pool.stats();
    assert!(
        s.peak_bytes_held <= budget,
        "peak held {} over the budget {budget}",
        s.peak_bytes_held
    );
    let grants = pool.grants();
    assert!(grants.len() >= 2 * BATCHES, "{} grants", grants.len());
    for g in &grants {
        if let Some(best) = g.best_waiting {
            assert!(
                g.rank <= best,
                "rank {:#x} was served while rank {best:#x} (delivered before it) waited",
                g.rank
            );
        }
    }
    // Each batch of each epoch was granted a block (reloads may add more).
    let ranked: BTreeSet<u64> = grants.iter().map(|g| g.rank).collect();
    assert!(ranked.len() >= 2 * BATCHES, "{ranked:?}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn dealing_to_the_budget(
        blocks in 1usize..=16,
        workers in 1usize..=6,
        prefetch in 1usize..=4,
        in_order in any::<bool>(),
    ) {
        watchdog_with(60, "budget dealing", move || logged(|| run(blocks, workers, prefetch, in_order)), diagnose);
    }
}

#[test]
fn a_budget_below_the_prefetch_warns_once_naming_the_numbers() {
    watchdog(60, "budget warning", || {
        let block = block_bytes();
        let pool = PinnedPool::new(
            PoolConfig::for_kind(MemoryKind::Pageable)
                .budget(6 * block)
                .policy(BudgetPolicy::Wait {
                    timeout: Duration::from_secs(30),
                }),
        )
        .unwrap();
        let l = DataLoader::builder(Samples)
            .batch_size(BATCH)
            .num_workers(4)
            .prefetch_factor(4)
            .pool(pool)
            .build()
            .unwrap();
        for _ in 0..2 {
            assert_eq!(l.iter().count(), BATCHES);
        }
        let budget_warnings: Vec<_> = l
            .warnings()
            .into_iter()
            .filter(|w| matches!(w, LoaderWarning::PrefetchExceedsBudget { .. }))
            .collect();
        assert_eq!(
            budget_warnings,
            vec![LoaderWarning::PrefetchExceedsBudget {
                num_workers: 4,
                prefetch_factor: 4,
                batch_bytes: block,
                budget: 6 * block,
                in_flight: 5,
            }]
        );
        let s = l.stats();
        assert_eq!(s.in_flight_limit, 5);
        let text = budget_warnings[0].to_string();
        assert!(
            text.contains("prefetch_factor 4") && text.contains("5 batches"),
            "{text}"
        );
    });
}

#[test]
fn an_ample_budget_neither_warns_nor_limits() {
    let l = DataLoader::builder(Samples)
        .batch_size(BATCH)
        .num_workers(2)
        .prefetch_factor(2)
        .pin_memory(false)
        .build()
        .unwrap();
    assert_eq!(l.iter().count(), BATCHES);
    assert!(
        !l.warnings()
            .iter()
            .any(|w| matches!(w, LoaderWarning::PrefetchExceedsBudget { .. }))
    );
    assert_eq!(l.stats().in_flight_limit, 4);
}

#[test]
fn the_tuner_reports_the_in_flight_bound_of_the_budget() {
    watchdog(120, "tuner under a budget", || {
        let block = block_bytes();
        let report = longshore_loader::Tuner::new()
            .workers([4])
            .pin_memory([false])
            .batches(8)
            .run(|w, _pin| {
                let pool = PinnedPool::new(
                    PoolConfig::for_kind(MemoryKind::Pageable)
                        .budget(3 * block)
                        .policy(BudgetPolicy::Wait {
                            timeout: Duration::from_secs(30),
                        }),
                )
                .unwrap();
                DataLoader::builder(Samples)
                    .batch_size(BATCH)
                    .num_workers(w)
                    .prefetch_factor(2)
                    .persistent_workers(true)
                    .pool(pool)
                    .build()
            })
            .unwrap();
        let t = &report.trials[0];
        assert_eq!(
            t.in_flight, 2,
            "3 blocks: 2 in flight, one for the consumer"
        );
        assert!((0.0..=1.0).contains(&t.pinned_wait_fraction));
        assert!(t.samples_per_second > 0.0);
    });
}
