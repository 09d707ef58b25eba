//! `pin_memory` without page-locked memory and more workers than cores are visible where a
//! user looks: `LoaderConfig`, `DataLoader::warnings()`, and one `tracing::warn!` each
//! (target `longshore::loader`); a long wait for a batch logs what it waits for.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use common::Probe;
use longshore_host::{MemoryKind, PinnedPool, PoolConfig};
use longshore_loader::{DataLoader, LoaderWarning};

/// Captures what a `tracing` subscriber prints.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn logged<R>(f: impl FnOnce() -> R) -> (R, String) {
    logged_at(tracing::Level::WARN, f)
}

fn logged_at<R>(level: tracing::Level, f: impl FnOnce() -> R) -> (R, String) {
    let out = Captured::default();
    let w = out.clone();
    let sub = tracing_subscriber::fmt()
        .with_writer(move || w.clone())
        .with_ansi(false)
        .with_target(true)
        .with_max_level(level)
        .finish();
    let r = tracing::subscriber::with_default(sub, f);
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    (r, text)
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[test]
fn more_workers_than_cores_is_reported_and_logged() {
    let n = cores() + 1;
    let (loader, log) = logged(|| {
        DataLoader::builder(Probe::new(8))
            .num_workers(n)
            .build()
            .unwrap()
    });
    let cfg = loader.config();
    assert_eq!(cfg.available_parallelism, cores());
    let want = LoaderWarning::WorkersExceedCores {
        num_workers: n,
        available_parallelism: cores(),
    };
    assert!(cfg.warnings.contains(&want), "{:?}", cfg.warnings);
    assert_eq!(loader.warnings(), cfg.warnings);
    assert!(
        log.contains("WARN")
            && log.contains("longshore::loader")
            && log.contains(&format!("num_workers is {n}")),
        "{log}"
    );
    // It still runs: a warning, not an error.
    assert_eq!(loader.iter().count(), 8);

    let (loader, log) = logged(|| {
        DataLoader::builder(Probe::new(8))
            .num_workers(cores())
            .build()
            .unwrap()
    });
    assert!(loader.warnings().is_empty(), "{:?}", loader.warnings());
    assert!(log.is_empty(), "{log}");
}

#[test]
fn pin_memory_into_a_pageable_pool_is_reported_and_logged() {
    let pool = PinnedPool::new(PoolConfig::for_kind(MemoryKind::Pageable)).unwrap();
    let (loader, log) = logged(|| {
        DataLoader::builder(Probe::new(8))
            .pin_memory(true)
            .pool(pool)
            .build()
            .unwrap()
    });
    let cfg = loader.config();
    assert!(cfg.options.pin_memory);
    assert!(!cfg.pin_memory_effective);
    assert!(
        matches!(&cfg.warnings[..], [LoaderWarning::PinMemoryUnavailable { reason }] if reason.contains("Pageable")),
        "{:?}",
        cfg.warnings
    );
    assert!(
        log.contains("pin_memory is set but batches use pageable memory"),
        "{log}"
    );
}

#[test]
fn pin_memory_effective_follows_the_driver() {
    let (loader, log) = logged(|| {
        DataLoader::builder(Probe::new(8))
            .pin_memory(true)
            .build()
            .unwrap()
    });
    let cfg = loader.config();
    if longshore_host::driver_available() {
        assert!(cfg.pin_memory_effective);
        assert!(cfg.warnings.is_empty(), "{:?}", cfg.warnings);
        assert!(loader.pool().kind().is_dma_capable());
    } else {
        println!("no CUDA driver: checking the pageable fallback is reported");
        assert!(!cfg.pin_memory_effective);
        assert!(
            matches!(
                &cfg.warnings[..],
                [LoaderWarning::PinMemoryUnavailable { .. }]
            ),
            "{:?}",
            cfg.warnings
        );
        assert!(log.contains("pin_memory is set"), "{log}");
    }
    // Without pin_memory nothing is pinned and nothing is said.
    let (loader, log) = logged(|| DataLoader::builder(Probe::new(8)).build().unwrap());
    assert!(!loader.config().pin_memory_effective);
    assert!(loader.warnings().is_empty() && log.is_empty(), "{log}");
}

#[test]
fn a_long_wait_logs_the_batch_and_worker_it_waits_for() {
    // Sample 5 takes 5.5 s: the wait for batch 2 (samples 4 and 5) reports, at debug level,
    // the batch, its worker's queue and the pool, without changing what is delivered.
    let mut probe = Probe::new(8);
    probe.sleep_on = [5].into();
    probe.sleep = std::time::Duration::from_millis(5_500);
    let (ids, log) = logged_at(tracing::Level::DEBUG, || {
        let l = DataLoader::builder(probe)
            .batch_size(2)
            .num_workers(2)
            .pin_memory(false)
            .build()
            .unwrap();
        let ids: Vec<u32> = l
            .iter()
            .flat_map(|b| b.unwrap().tensor::<u32>(0).unwrap().to_vec())
            .collect();
        ids
    });
    assert_eq!(ids, (0..8).collect::<Vec<u32>>());
    let line = log
        .lines()
        .find(|l| l.contains("still waiting for batch 2"))
        .unwrap_or_else(|| panic!("no report of the wait in:\n{log}"));
    assert!(
        line.contains("2@0:sent") && line.contains("queued per worker") && line.contains("pool:"),
        "{line}"
    );
}
