//! longshore-data throughput: collation into a preallocated buffer and u8 -> f32
//! normalisation, each beside a plain memcpy of the same bytes (the memory-bandwidth
//! ceiling). `LONGSHORE_BENCH_QUICK=1` uses small sizes.
#![forbid(unsafe_code)]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use longshore::data::{
    AlignedBuf, Collate, DatasetCollate, DatasetExt, DirectCollate, FetchCollate, ImageLayout,
    Normalize, NpyDataset, StackCollate, Tensor, Zip, write_npy,
};

fn quick() -> bool {
    std::env::var("LONGSHORE_BENCH_QUICK").is_ok_and(|v| v == "1")
}

fn memcpy_bench(c: &mut Criterion, group: &str, bytes: usize) {
    let src = vec![1u8; bytes];
    let mut dst = AlignedBuf::zeroed(bytes);
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Bytes(bytes as u64));
    g.bench_function("memcpy", |b| {
        b.iter(|| {
            dst.copy_from_slice(black_box(&src));
            black_box(&dst);
        })
    });
    g.finish();
}

/// Tabular workload of the design doc: 64 x f32 features + i64 label per sample.
fn collate_tabular(c: &mut Criterion) {
    let batch = if quick() { 128 } else { 1024 };
    let rows = batch * 8;
    let samples: Vec<([f32; 64], i64)> = (0..batch).map(|i| ([i as f32; 64], i as i64)).collect();
    let collate = StackCollate::new();
    let layout = collate.layout(&samples).expect("layout");
    let payload = batch * (64 * 4 + 8);
    let mut storage = Some(AlignedBuf::zeroed(layout.total_bytes()));

    // The direct path: memory-mapped .npy rows written straight into the batch.
    let dir = tempfile::tempdir().expect("tempdir");
    let x: Vec<f32> = (0..rows * 64).map(|i| i as f32).collect();
    let y: Vec<i64> = (0..rows as i64).collect();
    write_npy(dir.path().join("x.npy"), &[rows, 64], &x).expect("write x");
    write_npy(dir.path().join("y.npy"), &[rows], &y).expect("write y");
    let ds = Zip::direct(
        NpyDataset::open(dir.path().join("x.npy")).expect("open x"),
        NpyDataset::open(dir.path().join("y.npy")).expect("open y"),
    )
    .expect("zip");
    let indices: Vec<usize> = (0..batch).map(|i| (i * 7919) % rows).collect();
    let direct = DirectCollate::new();

    let mut g = c.benchmark_group("collate_tabular");
    g.throughput(Throughput::Bytes(payload as u64));
    g.bench_function(format!("stack_items_b{batch}"), |b| {
        b.iter(|| {
            let buf = storage.take().expect("storage");
            let batch = collate
                .collate_into(black_box(&samples), layout.clone(), buf)
                .expect("collate");
            storage = Some(batch.into_parts().1);
        })
    });
    g.bench_function(format!("direct_npy_b{batch}"), |b| {
        b.iter(|| {
            let staged = direct.stage(&ds, black_box(&indices)).expect("stage");
            let buf = storage.take().expect("storage");
            let batch = direct.write(&ds, staged, buf).expect("write");
            storage = Some(batch.into_parts().1);
        })
    });
    // The same rows through Dataset::get (one Tensor per field per sample) + StackCollate.
    let fetch = FetchCollate(StackCollate::new());
    g.bench_function(format!("fetch_npy_b{batch}"), |b| {
        b.iter(|| {
            let staged = fetch.stage(&ds, black_box(&indices)).expect("stage");
            let buf = storage.take().expect("storage");
            let batch = fetch.write(&ds, staged, buf).expect("write");
            storage = Some(batch.into_parts().1);
        })
    });
    g.finish();
    memcpy_bench(c, "collate_tabular", payload);
}

/// Image workload: 3 x 224 x 224 u8 samples stacked.
fn collate_image(c: &mut Criterion) {
    let (batch, side) = if quick() { (8, 64) } else { (64, 224) };
    let samples: Vec<(Tensor, i64)> = (0..batch)
        .map(|i| {
            (
                Tensor::from_slice::<u8>(&[3, side, side], &vec![i as u8; 3 * side * side])
                    .expect("t"),
                i as i64,
            )
        })
        .collect();
    let collate = StackCollate::new();
    let layout = collate.layout(&samples).expect("layout");
    let payload = batch * (3 * side * side + 8);
    let mut storage = Some(AlignedBuf::zeroed(layout.total_bytes()));
    let mut g = c.benchmark_group("collate_image");
    g.throughput(Throughput::Bytes(payload as u64));
    g.bench_function(format!("stack_b{batch}_{side}px"), |b| {
        b.iter(|| {
            let buf = storage.take().expect("storage");
            let batch = collate
                .collate_into(black_box(&samples), layout.clone(), buf)
                .expect("collate");
            storage = Some(batch.into_parts().1);
        })
    });
    g.finish();
    memcpy_bench(c, "collate_image", payload);
}

/// u8 image -> normalised f32 CHW. Throughput counts the f32 bytes written; the
/// memcpy baseline copies the same number of bytes.
fn normalize(c: &mut Criterion) {
    let side = if quick() { 64 } else { 224 };
    let n = 3 * side * side;
    let src: Vec<u8> = (0..n).map(|i| (i * 31 % 256) as u8).collect();
    let mut out = vec![0f32; n];
    let mut g = c.benchmark_group("normalize");
    g.throughput(Throughput::Bytes((n * 4) as u64));
    for layout in [ImageLayout::Chw, ImageLayout::Hwc] {
        let norm = Normalize::imagenet(layout);
        g.bench_function(format!("{layout:?}_to_chw_{side}px"), |b| {
            b.iter(|| {
                norm.apply_into(black_box(&src), 3, &mut out)
                    .expect("normalize")
            })
        });
    }
    g.finish();
    memcpy_bench(c, "normalize", n * 4);
}

/// Issue 26 item 7, on the CPU: a batch of `u8` CHW images normalised to `f32`, written
/// (1) the natural way, `NpyDataset::open(..).transform(Normalize::imagenet(..))` with the
/// loader's default collate (`FetchCollate(StackCollate)`), which takes the dataset's direct
/// plan; (2) the fused way a user had to know, `DirectCollate::new().with_transform(0,
/// Normalize)`; (3) the items route the natural way took before (the same dataset behind a
/// `map`, which keeps no plan: a tensor per sample, then a stacking copy). (1) should equal
/// (2) within noise; (3) is what (1) cost before. Throughput counts the f32 bytes written.
fn images_normalize(c: &mut Criterion) {
    let (batch, side) = if quick() { (16, 64) } else { (128, 224) };
    let rows = batch * 4;
    let per = 3 * side * side;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("images.npy");
    let pixels: Vec<u8> = (0..rows * per).map(|i| (i * 31 % 251) as u8).collect();
    write_npy(&path, &[rows, 3, side, side], &pixels).expect("write images");
    let norm = Normalize::imagenet(ImageLayout::Chw);
    let natural = NpyDataset::open(&path)
        .expect("open")
        .transform(norm.clone());
    let items = NpyDataset::open(&path)
        .expect("open")
        .transform(norm.clone())
        .map(|t| t);
    let raw = NpyDataset::open(&path).expect("open");
    let default = FetchCollate(StackCollate::new().with_names(["image"]));
    let fused = DirectCollate::new()
        .with_names(["image"])
        .with_transform(0, norm);
    let indices: Vec<usize> = (0..batch).map(|i| (i * 7919) % rows).collect();
    assert!(
        default
            .stage(&natural, &indices)
            .expect("stage")
            .is_direct(),
        "the natural path must take the dataset's direct plan"
    );
    let bytes = batch * per * 4;
    let mut storage = Some(AlignedBuf::zeroed(bytes));
    let mut g = c.benchmark_group("images_normalize");
    g.throughput(Throughput::Bytes(bytes as u64));
    g.bench_function(format!("natural_transform_b{batch}_{side}px"), |b| {
        b.iter(|| {
            let staged = default.stage(&natural, black_box(&indices)).expect("stage");
            let buf = storage.take().expect("storage");
            let batch = default.write(&natural, staged, buf).expect("write");
            storage = Some(batch.into_parts().1);
        })
    });
    g.bench_function(format!("fused_direct_collate_b{batch}_{side}px"), |b| {
        b.iter(|| {
            let staged = fused.stage(&raw, black_box(&indices)).expect("stage");
            let buf = storage.take().expect("storage");
            let batch = fused.write(&raw, staged, buf).expect("write");
            storage = Some(batch.into_parts().1);
        })
    });
    g.bench_function(format!("items_then_stack_b{batch}_{side}px"), |b| {
        b.iter(|| {
            let staged = default.stage(&items, black_box(&indices)).expect("stage");
            let buf = storage.take().expect("storage");
            let batch = default.write(&items, staged, buf).expect("write");
            storage = Some(batch.into_parts().1);
        })
    });
    g.finish();
}

criterion_group!(
    benches,
    collate_tabular,
    collate_image,
    normalize,
    images_normalize
);
criterion_main!(benches);
