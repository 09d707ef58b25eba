//! longshore batches as candle CPU tensors, without copying.
//!
//! candle's CPU tensors own their memory: `CpuStorage::F32` is a `Vec<f32>`, and every
//! constructor from foreign memory (`from_slice`, `from_raw_buffer`, a DLPack import) copies.
//! So a batch becomes a candle tensor without a copy only if it is written straight into the
//! `Vec` that candle then takes by value. That is what this example does: longshore's
//! `DirectCollate` writes each batch of memory-mapped `.npy` rows into a `Vec<f32>` (features)
//! and a `Vec<i64>` (labels), and `Tensor::from_vec` moves them into candle: the only copy is
//! the one from the mapped file into the batch, as in the loader's own pinned path. The example
//! checks that candle's storage is the very allocation the batch was written into, then trains
//! a linear softmax classifier with candle's autograd on those batches.
//!
//! The second part shows the other road: the multi-worker loader's batches (pooled, page-locked
//! with a GPU) exported through `longshore::dlpack` as zero-copy views, then copied once into
//! candle (`Tensor::from_slice`), which is what any candle import of foreign memory costs.
//!
//! candle's CUDA backend needs `nvcc` at build time (its `cuda` feature compiles kernels), so
//! on machines without the CUDA toolkit only the CPU backend builds; burn's CUDA backends
//! (cubecl) compile kernels at run time through NVRTC instead.
//!
//! `cargo run --release --manifest-path examples/candle/Cargo.toml`

use std::ops::{Deref, DerefMut};

use anyhow::{Context, Result};
use candle_core::{D, DType, Device, Storage, Tensor, Var};
use longshore_data::{
    BatchSampler, BatchSampling, DatasetCollate, DirectCollate, Element, NpyDataset, RandomSampler,
    write_npy,
};
use longshore_dlpack::{ExportOptions, export_host};
use longshore_loader::DataLoader;

/// A batch storage that candle can take over: a `Vec<T>` seen as bytes while longshore writes
/// the batch into it.
struct VecStorage<T>(Vec<T>);

impl<T: Element> Deref for VecStorage<T> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

impl<T: Element> DerefMut for VecStorage<T> {
    fn deref_mut(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(&mut self.0)
    }
}

/// Collates rows `indices` of a one-field dataset straight into a `Vec<T>` and moves it into a
/// candle tensor of shape `[indices.len(), row...]`.
fn batch_tensor<T: Element + candle_core::WithDType>(
    dataset: &NpyDataset,
    indices: &[usize],
) -> Result<(Tensor, *const T)> {
    let collate = DirectCollate::new();
    let staged = collate.stage(dataset, indices)?;
    let layout = DatasetCollate::<NpyDataset>::staged_layout(&collate, &staged).clone();
    let spec = &layout.tensors()[0];
    let storage = VecStorage(vec![T::zeroed(); spec.len / std::mem::size_of::<T>()]);
    let batch = collate.write(dataset, staged, storage)?;
    let shape = batch.shape(0)?.to_vec();
    let (_, VecStorage(vec)) = batch.into_parts();
    let written_at = vec.as_ptr();
    // `from_vec` moves the vector into candle's CpuStorage: no copy.
    Ok((Tensor::from_vec(vec, shape, &Device::Cpu)?, written_at))
}

/// The address of a CPU tensor's f32/i64 storage.
fn storage_ptr(t: &Tensor) -> Option<usize> {
    let (storage, _) = t.storage_and_layout();
    match &*storage {
        Storage::Cpu(c) => match c {
            candle_core::CpuStorage::F32(v) => Some(v.as_ptr() as usize),
            candle_core::CpuStorage::I64(v) => Some(v.as_ptr() as usize),
            _ => None,
        },
        _ => None,
    }
}

fn main() -> Result<()> {
    // A generated dataset: 4096 samples of 16 features, labels from a fixed linear rule.
    let (n, f, classes) = (4096usize, 16usize, 4usize);
    let dir = std::env::temp_dir().join(format!("longshore-candle-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    let x: Vec<f32> = (0..n * f).map(|_| next()).collect();
    let w_true: Vec<f32> = (0..f * classes).map(|_| next()).collect();
    let y: Vec<i64> = x
        .chunks(f)
        .map(|row| {
            (0..classes)
                .map(|c| {
                    (0..f)
                        .map(|j| row[j] * w_true[j * classes + c])
                        .sum::<f32>()
                })
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(&b.1))
                .map_or(0, |(c, _)| c as i64)
        })
        .collect();
    write_npy(dir.join("x.npy"), &[n, f], &x)?;
    write_npy(dir.join("y.npy"), &[n], &y)?;
    let xs = NpyDataset::open(dir.join("x.npy"))?;
    let ys = NpyDataset::open(dir.join("y.npy"))?;

    // Part 1: batches written straight into candle-owned memory, and a training loop.
    let mut sampler = BatchSampler::new(RandomSampler::new(n, 7)?, 256, true)?;
    let w = Var::zeros((f, classes), DType::F32, &Device::Cpu)?;
    let b = Var::zeros(classes, DType::F32, &Device::Cpu)?;
    let lr = 0.5;
    for epoch in 0..8 {
        sampler.set_epoch(epoch);
        let (mut total, mut batches) = (0f32, 0);
        for indices in sampler.iter() {
            let (xb, x_at) = batch_tensor::<f32>(&xs, &indices)?;
            let (yb, y_at) = batch_tensor::<i64>(&ys, &indices)?;
            anyhow::ensure!(
                storage_ptr(&xb) == Some(x_at as usize) && storage_ptr(&yb) == Some(y_at as usize),
                "candle copied the batch"
            );
            let logits = xb.matmul(w.as_tensor())?.broadcast_add(b.as_tensor())?;
            let logp = candle_core::Tensor::log_sum_exp(&logits, D::Minus1)?;
            let picked = logits.gather(&yb.unsqueeze(1)?, 1)?.squeeze(1)?;
            let loss = (logp - picked)?.mean_all()?;
            let grads = loss.backward()?;
            for v in [&w, &b] {
                let g = grads.get(v).context("no gradient")?;
                v.set(&(v.as_tensor() - (g * lr)?)?)?;
            }
            total += loss.to_scalar::<f32>()?;
            batches += 1;
        }
        println!("epoch {epoch}: mean loss {:.4}", total / batches as f32);
    }

    // Part 2: the multi-worker loader (pooled memory), exported through DLPack, one copy into
    // candle.
    let ds = longshore_data::Zip::direct(xs, ys)?;
    let loader = DataLoader::builder(ds)
        .collate(DirectCollate::new())
        .batch_size(512)
        .num_workers(2)
        .pin_memory(true)
        .build()?;
    let mut rows = 0;
    for batch in &loader {
        let tensors = export_host(batch?, &ExportOptions::default())?;
        let bytes = tensors[0].host_bytes()?.context("host memory")?;
        let shape: Vec<usize> = tensors[0].shape().iter().map(|&d| d as usize).collect();
        let xb = Tensor::from_slice(bytemuck::cast_slice::<u8, f32>(bytes), shape, &Device::Cpu)?;
        rows += xb.dim(0)?;
    }
    println!(
        "loader + DLPack: {rows} rows copied once into candle; pool: {:?}",
        loader.pool().stats().bytes_in_use
    );
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}
