//! Pool hit (alloc + free of a cached block) vs raw allocation, per memory kind and size.
//!
//! `LONGSHORE_BENCH_QUICK=1` limits the sizes to 1 KiB .. 16 MiB.
#![forbid(unsafe_code)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use longshore::host::{HostBuffer, MemoryKind, PinnedPool, PoolConfig};

fn sizes() -> Vec<usize> {
    if std::env::var("LONGSHORE_BENCH_QUICK").is_ok() {
        vec![1 << 10, 1 << 20, 16 << 20]
    } else {
        vec![1 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20]
    }
}

fn label(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{}MiB", bytes >> 20)
    } else {
        format!("{}KiB", bytes >> 10)
    }
}

fn kinds() -> Vec<MemoryKind> {
    let mut k = vec![MemoryKind::Pageable];
    if longshore::host::driver_available() {
        k.push(MemoryKind::PageLocked);
        k.push(MemoryKind::Registered);
    } else {
        eprintln!(
            "pool bench: no CUDA driver ({:?}); page-locked and registered kinds skipped",
            longshore::host::driver_unavailable_reason()
        );
    }
    k
}

fn pool_hit(c: &mut Criterion) {
    let mut g = c.benchmark_group("pool_hit");
    g.warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    for kind in kinds() {
        if kind == MemoryKind::Registered {
            continue; // a pool of PageLocked already covers the hit path
        }
        let pool = PinnedPool::new(
            PoolConfig::for_kind(kind)
                .budget(1 << 30)
                .register_above(None),
        )
        .unwrap();
        for &size in &sizes() {
            drop(pool.alloc(size).unwrap()); // warm the cache
            g.throughput(Throughput::Elements(1));
            g.bench_with_input(
                BenchmarkId::new(kind.as_str(), label(size)),
                &size,
                |b, &size| b.iter(|| black_box(pool.alloc(black_box(size)).unwrap())),
            );
        }
    }
    g.finish();
}

fn raw_alloc(c: &mut Criterion) {
    let mut g = c.benchmark_group("raw_alloc");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_secs(2));
    for kind in kinds() {
        for &size in &sizes() {
            g.bench_with_input(
                BenchmarkId::new(kind.as_str(), label(size)),
                &size,
                |b, &size| b.iter(|| black_box(HostBuffer::alloc(kind, size).unwrap())),
            );
        }
    }
    g.finish();
}

criterion_group!(benches, pool_hit, raw_alloc);
criterion_main!(benches);
