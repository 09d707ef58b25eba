//! The loader as the binding holds it: [`Loader`], a boxed Rust loader of any built-in dataset
//! (with nvJPEG as its device stage or not), what its epochs yield ([`Handoff`], [`Epoch`]),
//! and the [`Options`] it is built with. Below the modules that build loaders (`loader`,
//! `nvjpeg`) and the one that runs their epochs (`epoch`).

use longshore::data::Batch;
use longshore::data::dataset::mixture::MemberOf;
use longshore::host::{PinnedPool, PoolBuffer};
use longshore::loader::{
    BoxedFetch, BoxedLoader, DataLoaderBuilder, DeviceBatch, DeviceLoader, LoaderError,
    LoaderOptions,
};
use longshore::nvjpeg::NvjpegDecoder;
use longshore::transfer::Device;

use crate::sampler::EpochOrder;

/// What an epoch yields before export: a host batch or a prefetched device batch.
pub(crate) enum Handoff {
    Host(Batch<PoolBuffer>),
    /// A host batch still to be copied to the epoch's device (by the epoch thread or by
    /// `__next__`: see [`crate::upload`]).
    Staged(Batch<PoolBuffer>),
    /// A batch on the device, whatever stage made it (an upload, nvJPEG).
    Device(DeviceBatch),
}

pub(crate) type Epoch = Box<dyn Iterator<Item = Result<Handoff, LoaderError>> + Send>;

/// The loader behind `longshore.DataLoader`: a [`BoxedLoader`] (the loader's own type
/// erasure) of any built-in dataset, or with nvJPEG as its device stage.
pub(crate) enum Loader {
    /// Host batches, or batches copied to a device by the loader's `Upload` stage.
    Host(BoxedLoader),
    /// Encoded images decoded on the GPU: the decoder is made when the loader is built (a
    /// missing libnvjpeg is an error then, not at the first batch) and kept, with its nvJPEG
    /// states, across epochs.
    Nvjpeg(DeviceLoader<BoxedFetch<Batch<PoolBuffer>>, NvjpegDecoder>),
}

impl Loader {
    /// The host loader (its options, position, stats).
    pub(crate) fn loader(&self) -> &BoxedLoader {
        match self {
            Loader::Host(l) => l,
            Loader::Nvjpeg(d) => d.loader(),
        }
    }

    /// An epoch's batches; with a device, `staged` asks for host batches ([`Handoff::Staged`])
    /// where the loader can leave the copies to its caller, else device batches made by the
    /// loader's device pipeline, `depth` in flight (nvJPEG's depth is set when it is built).
    pub(crate) fn epoch(
        &self,
        device: Option<&Device>,
        depth: usize,
        staged: bool,
    ) -> Result<Epoch, LoaderError> {
        Ok(match (self, device) {
            (Loader::Nvjpeg(d), Some(_)) => Box::new(d.iter()?.map(|r| r.map(Handoff::Device))),
            (Loader::Nvjpeg(_), None) => {
                return Err(LoaderError::Config {
                    option: "decode",
                    reason: "decode=\"nvjpeg\" decodes on a GPU: it needs device=\"cuda\"".into(),
                });
            }
            (Loader::Host(l), None) => Box::new(l.iter().map(|r| r.map(Handoff::Host))),
            (Loader::Host(l), Some(d)) if staged => {
                // What `to_device` does before its first batch: the workers move to the
                // device's CPUs and the pool to its NUMA node.
                l.place_for(d);
                Box::new(l.iter().map(|r| r.map(Handoff::Staged)))
            }
            (Loader::Host(l), Some(d)) => {
                Box::new(l.to_device(d, depth)?.map(|r| r.map(Handoff::Device)))
            }
        })
    }
}

/// The loader's options (PyTorch's, as the loader takes them), the pool to lease from, and
/// the order Python hands over each epoch (a sampler or batch sampler given in Python).
pub(crate) struct Options {
    pub(crate) loader: LoaderOptions,
    pub(crate) pool: Option<PinnedPool>,
    pub(crate) order: Option<EpochOrder>,
    /// A mixture's members, counted in the stats' `sources`.
    pub(crate) sources: Option<MemberOf>,
}

/// `b` with the options `o`.
pub(crate) fn configure<D, C>(b: DataLoaderBuilder<D, C>, o: Options) -> DataLoaderBuilder<D, C> {
    let mut b = b.options(o.loader);
    if let Some(m) = o.sources {
        b = b.count_sources(m.members(), move |p| m.member(p));
    }
    if let Some(order) = o.order {
        // The next epoch's order exists only once Python starts that epoch: nothing of it can
        // be loaded ahead.
        b = b.batch_sampler(order).prefetch_next_epoch(false);
    }
    match o.pool {
        Some(p) => b.pool(p),
        None => b,
    }
}
