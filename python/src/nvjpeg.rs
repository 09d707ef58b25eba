//! `DataLoader(ImageFolder, device="cuda", decode="nvjpeg")`: the workers read each file into
//! the page-locked batch and draw its crop; nvJPEG decodes on the GPU and one kernel crops,
//! resizes and normalises into a `[B, 3, H, W]` device batch (`longshore::nvjpeg`), as the
//! loader's device stage.

use longshore::loader::{DataLoader, LoaderError};
use longshore::nvjpeg::{EncodedCollate, EncodedImages, NvjpegDecoder};
use longshore::transfer::Device;

use crate::boxed::{Loader, Options, configure};

/// The loader of `files` decoding on `device`, `depth` batches in flight.
pub(crate) fn build(
    files: EncodedImages,
    o: Options,
    device: &Device,
    depth: usize,
) -> Result<Loader, LoaderError> {
    let decoder = NvjpegDecoder::new(device, &files)?;
    let builder = DataLoader::builder(files).collate(EncodedCollate);
    let loader = configure(builder, o).build_boxed()?;
    Ok(Loader::Nvjpeg(loader.with_stage(decoder).depth(depth)))
}
