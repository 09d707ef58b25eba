//! Image collation with the normalisation fused in: each worker reads the memory-mapped `u8`
//! row and writes normalised `f32` into its slot of the (page-locked) batch buffer, so a batch
//! is produced with one pass over the data and no intermediate tensor. The normalisation is
//! the vectorised [`NormalizeKernel`] (AVX2/AVX-512 where the CPU has them).

use std::sync::Arc;

use longshore::data::normalize::NormalizeKernel;
use longshore::data::{
    Batch, BatchLayout, DType, DataError, Dataset, DatasetCollate, ImageLayout, NpyDataset, Storage,
};

/// Collates rows of a `u8` [`NpyDataset`] of `[N, C, H, W]` images into one `f32` tensor
/// `[batch, C, H, W]`, normalised per channel (`(x / 255 - mean[c]) / std[c]`).
#[derive(Debug, Clone)]
pub struct NormalizeCollate {
    normalize: NormalizeKernel,
    channels: usize,
    name: Arc<str>,
}

impl NormalizeCollate {
    /// ImageNet's mean and std for CHW images with `channels` channels (3), like the PyTorch
    /// baseline script.
    pub fn imagenet(channels: usize) -> NormalizeCollate {
        NormalizeCollate {
            normalize: NormalizeKernel::imagenet(ImageLayout::Chw),
            channels,
            name: Arc::from("image"),
        }
    }
}

/// The indices of a staged image batch and its layout.
#[derive(Debug)]
pub struct StagedImages {
    indices: Vec<usize>,
    layout: BatchLayout,
}

impl DatasetCollate<NpyDataset> for NormalizeCollate {
    type Staged = StagedImages;

    fn stage(&self, dataset: &NpyDataset, indices: &[usize]) -> Result<StagedImages, DataError> {
        if dataset.array().dtype() != DType::U8
            || dataset.row_shape().first() != Some(&self.normalize.channels())
        {
            return Err(DataError::ShapeMismatch(format!(
                "normalising collate needs u8 rows of shape [{}, H, W], got {} rows of shape {:?}",
                self.channels,
                dataset.array().dtype(),
                dataset.row_shape()
            )));
        }
        let len = dataset.len();
        if let Some(&index) = indices.iter().find(|&&i| i >= len) {
            return Err(DataError::IndexOutOfRange {
                index,
                len,
                what: "image dataset",
            });
        }
        let mut shape = vec![indices.len()];
        shape.extend_from_slice(dataset.row_shape());
        let mut layout = BatchLayout::new(indices.len());
        layout.push(Some(self.name.clone()), DType::F32, shape)?;
        Ok(StagedImages {
            indices: indices.to_vec(),
            layout,
        })
    }

    fn staged_layout<'a>(&self, staged: &'a StagedImages) -> &'a BatchLayout {
        &staged.layout
    }

    fn write<S: Storage>(
        &self,
        dataset: &NpyDataset,
        staged: StagedImages,
        storage: S,
    ) -> Result<Batch<S>, DataError> {
        let StagedImages { indices, layout } = staged;
        let per = dataset.row_bytes();
        let mut batch = Batch::from_parts(layout, storage)?;
        let out = batch.tensor_mut::<f32>(0)?;
        for (&i, slot) in indices.iter().zip(out.chunks_exact_mut(per)) {
            self.normalize.apply(dataset.row_raw(i)?, slot)?;
        }
        Ok(batch)
    }
}
