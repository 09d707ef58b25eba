//! `DataLoader(ImageFolder, device="cuda", decode="nvjpeg")`: the workers read each file into
//! the page-locked batch and draw its crop; nvJPEG decodes on the GPU and one kernel crops,
//! resizes and normalises into a `[B, 3, H, W]` device batch (`longshore_vision::nvjpeg`).

use std::sync::{Arc, Mutex};

use longshore_data::{Batch, BatchLayout, DataError};
use longshore_dlpack::{DlpackError, DlpackTensor, ExportOptions, export_device};
use longshore_host::PoolBuffer;
use longshore_loader::{DataLoader, Fetch, LoaderError, LoaderState, LoaderStats};
use longshore_transfer::{Device, Prefetched};
use longshore_vision::nvjpeg::{
    EncodedCollate, EncodedImages, NvjpegBatch, NvjpegDecoder, NvjpegLoader,
};

use crate::loader::{AnyLoader, Epoch, Handoff, Options, configure};

/// A loader of encoded images with the decoder of its first epoch (made when the loader is
/// built, so that a missing libnvjpeg is an error then, not at the first batch).
struct NvjpegSource<F: Fetch> {
    loader: DataLoader<F>,
    files: EncodedImages,
    first: Mutex<Option<NvjpegDecoder>>,
}

impl<F: Fetch<Output = Batch<PoolBuffer>>> AnyLoader for NvjpegSource<F> {
    fn epoch(
        &self,
        device: Option<&Device>,
        depth: usize,
        _staged: bool,
    ) -> Result<Epoch, LoaderError> {
        let device = device.ok_or_else(|| LoaderError::Config {
            option: "decode",
            reason: "decode=\"nvjpeg\" decodes on a GPU: it needs device=\"cuda\"".into(),
        })?;
        let first = self.first.lock().unwrap_or_else(|p| p.into_inner()).take();
        let decoder = match first {
            Some(d) => d,
            None => NvjpegDecoder::new(device, &self.files)?,
        };
        Ok(Box::new(
            self.loader
                .nvjpeg(decoder, depth)?
                .map(|r| r.map(Handoff::Nvjpeg)),
        ))
    }
    fn len(&self) -> Option<usize> {
        self.loader.len()
    }
    fn set_epoch(&self, epoch: u64) {
        self.loader.set_epoch(epoch)
    }
    fn state_dict(&self) -> Result<LoaderState, LoaderError> {
        self.loader.state_dict()
    }
    fn load_state_dict(&self, state: &LoaderState) -> Result<(), LoaderError> {
        self.loader.load_state_dict(state)
    }
    fn stats(&self) -> LoaderStats {
        self.loader.stats()
    }
    fn reset_stats(&self) {
        self.loader.reset_stats()
    }
}

/// The loader of `files` decoding on `device`.
pub(crate) fn build(
    files: EncodedImages,
    o: Options,
    device: &Device,
) -> Result<Arc<dyn AnyLoader>, LoaderError> {
    let decoder = NvjpegDecoder::new(device, &files)?;
    let builder = DataLoader::builder(files.clone()).dataset_collate(EncodedCollate);
    let loader = configure(builder, o).build()?;
    Ok(Arc::new(NvjpegSource {
        loader,
        files,
        first: Mutex::new(Some(decoder)),
    }))
}

fn layout_err(e: DataError) -> DlpackError {
    DlpackError::Unsupported {
        what: "an nvJPEG batch",
        reason: e.to_string(),
    }
}

/// The batch's `[image, label]` device tensors, ready after the decoder's event.
pub(crate) fn export(
    p: Prefetched<NvjpegBatch>,
    opts: &ExportOptions,
) -> Result<Vec<DlpackTensor>, DlpackError> {
    let Prefetched { batch, ready } = p;
    let (shape, dtype, n) = (batch.shape(), batch.dtype(), batch.batch_size());
    let (images, labels) = batch.into_buffers();
    let mut image = BatchLayout::new(n);
    image
        .push(Some("image".into()), dtype, shape.to_vec())
        .map_err(layout_err)?;
    let mut label = BatchLayout::new(n);
    label
        .push(Some("label".into()), longshore_data::DType::I64, vec![n])
        .map_err(layout_err)?;
    let mut out = export_device(&image, images, Some(ready.clone()), opts)?;
    out.extend(export_device(&label, labels, Some(ready), opts)?);
    Ok(out)
}
