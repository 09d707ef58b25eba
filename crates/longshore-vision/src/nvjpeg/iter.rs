//! [`NvjpegIter`]: a loader's host batches decoded on the device, `depth` batches in flight,
//! in the loader's order; and [`NvjpegLoader::nvjpeg`], its `to_device`.

use std::collections::VecDeque;
use std::iter::Fuse;

use longshore_data::{Batch, Storage};
use longshore_host::{HostMemory, PoolBuffer};
use longshore_loader::{DataLoader, Fetch, LoaderError, LoaderIter};
use longshore_transfer::Prefetched;

use super::decoder::{NvjpegBatch, NvjpegDecoder};

/// Host batches of [`EncodedCollate`](super::EncodedCollate) decoded on the device: each item
/// is a [`Prefetched`] [`NvjpegBatch`] with the event its work completes at, in the source's
/// order; errors pass through in place. Batches whose every sample was skipped are left out.
pub struct NvjpegIter<I: Iterator> {
    source: Fuse<I>,
    decoder: NvjpegDecoder,
    depth: usize,
    queue: VecDeque<Result<Prefetched<NvjpegBatch>, LoaderError>>,
    seq: u64,
}

impl<I: Iterator> std::fmt::Debug for NvjpegIter<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvjpegIter")
            .field("decoder", &self.decoder)
            .field("depth", &self.depth)
            .field("in_flight", &self.queue.len())
            .finish()
    }
}

impl<I, S> NvjpegIter<I>
where
    I: Iterator<Item = Result<Batch<S>, LoaderError>>,
    S: Storage + HostMemory,
{
    /// Decodes `source`'s batches with `decoder`, keeping `depth` (at least 1) in flight.
    ///
    /// # Errors
    /// [`LoaderError::Transfer`] when the decoder's states cannot be made.
    pub fn new(
        source: impl IntoIterator<IntoIter = I>,
        mut decoder: NvjpegDecoder,
        depth: usize,
    ) -> Result<Self, LoaderError> {
        let depth = depth.max(1);
        decoder.set_depth(depth)?;
        Ok(NvjpegIter {
            source: source.into_iter().fuse(),
            decoder,
            depth,
            queue: VecDeque::with_capacity(depth + 1),
            seq: 0,
        })
    }

    /// The decoder (its stream, its counts).
    pub fn decoder(&self) -> &NvjpegDecoder {
        &self.decoder
    }

    /// The decoder back, to decode the next epoch with the same states.
    pub fn into_decoder(self) -> NvjpegDecoder {
        self.decoder
    }

    fn fill(&mut self) {
        while self.queue.len() < self.depth {
            let Some(item) = self.source.next() else {
                break;
            };
            let seq = self.seq;
            self.seq += 1;
            match item.and_then(|b| self.decoder.decode(seq, b)) {
                Ok(Some(p)) => self.queue.push_back(Ok(p)),
                Ok(None) => {}
                Err(e) => self.queue.push_back(Err(e)),
            }
        }
    }
}

impl<I, S> Iterator for NvjpegIter<I>
where
    I: Iterator<Item = Result<Batch<S>, LoaderError>>,
    S: Storage + HostMemory,
{
    type Item = Result<Prefetched<NvjpegBatch>, LoaderError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.fill();
        let out = self.queue.pop_front();
        self.fill();
        out
    }
}

/// [`DataLoader::to_device`] for device decoding: `loader.nvjpeg(decoder, depth)`.
pub trait NvjpegLoader {
    /// The iterator over one epoch.
    type Iter;

    /// Iterates one epoch with every host batch (of [`EncodedCollate`](super::EncodedCollate))
    /// decoded on the device by `decoder`, `depth` batches in flight. The decoder takes the
    /// loader's `on_sample_error` policy for samples that fail in the device stage.
    ///
    /// # Errors
    /// [`LoaderError::Transfer`] when the decoder's states cannot be made.
    fn nvjpeg(&self, decoder: NvjpegDecoder, depth: usize) -> Result<Self::Iter, LoaderError>;
}

impl<F: Fetch<Output = Batch<PoolBuffer>>> NvjpegLoader for DataLoader<F> {
    type Iter = NvjpegIter<LoaderIter<F>>;

    fn nvjpeg(&self, decoder: NvjpegDecoder, depth: usize) -> Result<Self::Iter, LoaderError> {
        let decoder = decoder.on_sample_error(self.config().on_sample_error);
        NvjpegIter::new(self.iter(), decoder, depth)
    }
}
