//! The normalise kernel (`longshore_data::normalize`): u8 -> normalised f32 CHW for one
//! 3 x 224 x 224 image, every dispatch path the CPU has, against `memcpy` of the same
//! number of output bytes (the memory-bandwidth ceiling) and the transform's `Normalize`.
//! Throughput counts the f32 bytes written. `LONGSHORE_BENCH_QUICK=1` uses 64 x 64 images.
//!
//! Two output regimes: one reused slot (cache-resident, the kernel's compute speed; streaming
//! stores off), and a batch of 256 slots written in turn (154 MB, as a worker fills a pinned
//! image batch; the default, streaming stores for outputs this large).

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use longshore::data::normalize::{KernelPath, NormalizeKernel};
use longshore::data::{ImageLayout, Normalize};

fn quick() -> bool {
    std::env::var("LONGSHORE_BENCH_QUICK").is_ok_and(|v| v == "1")
}

fn normalize(c: &mut Criterion) {
    let side = if quick() { 64 } else { 224 };
    let n = 3 * side * side;
    let src: Vec<u8> = (0..n).map(|i| (i * 31 % 256) as u8).collect();
    let batch = if quick() { 8 } else { 256 };
    for (regime, slots) in [("slot", 1usize), ("batch", batch)] {
        let mut out = vec![0f32; n * slots];
        let mut g = c.benchmark_group(format!("normalize_{regime}"));
        g.throughput(Throughput::Bytes((n * 4 * slots) as u64));
        for layout in [ImageLayout::Chw, ImageLayout::Hwc] {
            for path in KernelPath::available() {
                // One reused slot stays in cache: streaming stores would only lose there.
                let k = NormalizeKernel::imagenet(layout)
                    .with_path(path)
                    .expect("available")
                    .with_streaming((slots == 1).then_some(false));
                g.bench_function(format!("{layout:?}_{}_{side}px", path.name()), |b| {
                    b.iter(|| {
                        for slot in out.chunks_exact_mut(n) {
                            k.apply(black_box(&src), slot).expect("normalize");
                        }
                    })
                });
            }
            let t = Normalize::imagenet(layout);
            g.bench_function(format!("{layout:?}_transform_{side}px"), |b| {
                b.iter(|| {
                    for slot in out.chunks_exact_mut(n) {
                        t.apply_into(black_box(&src), 3, slot).expect("normalize");
                    }
                })
            });
        }
        let bytes = vec![1u8; n * 4];
        let mut dst = vec![0u8; n * 4 * slots];
        g.bench_function("memcpy", |b| {
            b.iter(|| {
                for slot in dst.chunks_exact_mut(n * 4) {
                    slot.copy_from_slice(black_box(&bytes));
                }
                black_box(&dst);
            })
        });
        g.finish();
    }
}

criterion_group!(benches, normalize);
criterion_main!(benches);
