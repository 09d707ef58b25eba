//! `DataLoader(ImageFolder, device="cuda", decode="nvjpeg")`: the workers read each file into
//! the page-locked batch and draw its crop; nvJPEG decodes on the GPU and one kernel crops,
//! resizes and normalises into a `[B, 3, H, W]` device batch (`longshore::nvjpeg`), as the
//! loader's device stage.

use std::sync::Arc;

use longshore::data::Batch;
use longshore::host::PoolBuffer;
use longshore::loader::{DataLoader, DeviceLoader, Fetch, LoaderError, LoaderState, LoaderStats};
use longshore::nvjpeg::{EncodedCollate, EncodedImages, NvjpegDecoder};
use longshore::transfer::Device;

use crate::loader::{AnyLoader, Epoch, Handoff, Options, configure};

/// A loader of encoded images with its decoder as the device stage, made when the loader is
/// built (a missing libnvjpeg is an error then, not at the first batch) and kept, with its
/// nvJPEG states, across epochs.
struct NvjpegSource<F: Fetch> {
    on_gpu: DeviceLoader<F, NvjpegDecoder>,
}

impl<F: Fetch<Output = Batch<PoolBuffer>>> AnyLoader for NvjpegSource<F> {
    fn epoch(
        &self,
        device: Option<&Device>,
        depth: usize,
        _staged: bool,
    ) -> Result<Epoch, LoaderError> {
        if device.is_none() {
            return Err(LoaderError::Config {
                option: "decode",
                reason: "decode=\"nvjpeg\" decodes on a GPU: it needs device=\"cuda\"".into(),
            });
        }
        let _ = depth; // the depth is the device loader's, set when it was built
        Ok(Box::new(
            self.on_gpu.iter()?.map(|r| r.map(Handoff::Device)),
        ))
    }
    fn len(&self) -> Option<usize> {
        self.on_gpu.loader().len()
    }
    fn set_epoch(&self, epoch: u64) {
        self.on_gpu.loader().set_epoch(epoch)
    }
    fn state_dict(&self) -> Result<LoaderState, LoaderError> {
        self.on_gpu.loader().state_dict()
    }
    fn load_state_dict(&self, state: &LoaderState) -> Result<(), LoaderError> {
        self.on_gpu.loader().load_state_dict(state)
    }
    fn stats(&self) -> LoaderStats {
        self.on_gpu.loader().stats()
    }
    fn reset_stats(&self) {
        self.on_gpu.loader().reset_stats()
    }
}

/// The loader of `files` decoding on `device`, `depth` batches in flight.
pub(crate) fn build(
    files: EncodedImages,
    o: Options,
    device: &Device,
    depth: usize,
) -> Result<Arc<dyn AnyLoader>, LoaderError> {
    let decoder = NvjpegDecoder::new(device, &files)?;
    let builder = DataLoader::builder(files).dataset_collate(EncodedCollate);
    let loader = configure(builder, o).build()?;
    Ok(Arc::new(NvjpegSource {
        on_gpu: loader.with_stage(decoder).depth(depth),
    }))
}
