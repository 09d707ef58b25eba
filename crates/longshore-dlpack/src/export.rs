//! Exporting whole batches: [`export_host`] for host batches, [`export_device`] for device ones.

use std::sync::{Arc, Mutex};

use longshore_data::{Batch, BatchLayout, Storage};
use longshore_host::HostMemory;
use longshore_transfer::{DeviceBuffer, DeviceId, Event};

use crate::error::DlpackError;
use crate::ffi::{DLDevice, DLDeviceType};
use crate::tensor::{DlpackTensor, Owner, Shared, Source};

/// How page-locked host memory is labelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PinnedLabel {
    /// `kDLCUDAHost`, as DLPack defines page-locked memory (what PyTorch itself exports for a
    /// pinned tensor).
    #[default]
    CudaHost,
    /// `kDLCPU`, for consumers that only import `kDLCPU` (the memory is still page-locked:
    /// a framework that checks the pointer still sees it pinned).
    Cpu,
}

/// Options of an export.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ExportOptions {
    /// Tell the consumer not to write the data (`DLPACK_FLAG_BITMASK_READ_ONLY`). Off by
    /// default: a loader's batch belongs to its consumer alone, and writing it in place
    /// (normalising, augmenting) is safe.
    pub read_only: bool,
    /// How page-locked memory is labelled.
    pub pinned: PinnedLabel,
}

impl ExportOptions {
    /// Sets [`read_only`](ExportOptions::read_only).
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// Sets [`pinned`](ExportOptions::pinned).
    pub fn pinned(mut self, pinned: PinnedLabel) -> Self {
        self.pinned = pinned;
        self
    }
}

/// Exports every tensor of a host batch, zero-copy, in batch order.
///
/// The storage is any [`HostMemory`] (the host-bytes trait copies read: a pool lease, a
/// [`HostBuffer`](longshore_host::HostBuffer)), whose [`kind`](HostMemory::kind) gives the label:
/// page-locked memory is labelled `kDLCUDAHost` (or `kDLCPU`, see [`PinnedLabel`]), pageable
/// memory `kDLCPU`. The batch's storage (a pool lease, for a loader's batch) is kept until the
/// last tensor's deleter has run; a lease then goes back to its pool, which still waits for the
/// lease's copy fences before reusing the block, and the pool's budget counts it until then.
pub fn export_host<S: HostMemory + Storage>(
    batch: Batch<S>,
    options: &ExportOptions,
) -> Result<Vec<DlpackTensor>, DlpackError> {
    let (layout, storage) = batch.into_parts();
    let pinned = storage.kind().is_dma_capable();
    let dl_device = DLDevice {
        device_type: if pinned && options.pinned == PinnedLabel::CudaHost {
            DLDeviceType::CUDA_HOST
        } else {
            DLDeviceType::CPU
        },
        device_id: 0,
    };
    let mut shared = Arc::new(Mutex::new(storage));
    // The storage is placed in its shared home first and the address taken there, with write
    // permission, once: the owner is never touched again until it is dropped.
    let (base, len) = {
        let s = Arc::get_mut(&mut shared)
            .expect("a fresh Arc is unique")
            .get_mut()
            .unwrap_or_else(|p| p.into_inner());
        let bytes = s.as_bytes_mut();
        (bytes.as_mut_ptr(), bytes.len())
    };
    let owner: Owner = Shared::owner(shared);
    let src = Source {
        base,
        len,
        dl_device,
        device: None,
        owner: &owner,
        ready: None,
        read_only: options.read_only,
    };
    export_layout(&layout, &src)
}

/// Exports every tensor of a device batch (one [`DeviceBuffer`] holding the tensors at the
/// offsets of `layout`), zero-copy, in batch order: `kDLCUDA` with the GPU ordinal, or `kDLCPU`
/// for the Cpu backend's memory.
///
/// `ready` is the event the batch's copy completes at (a prefetched batch's `ready`; the
/// buffer's own last write when `None`). A consumer must be ordered after it before it reads:
/// [`DlpackTensor::hand_to`] (a stream), [`DlpackTensor::prepare_for_stream`] (the Python
/// protocol) or [`DlpackTensor::synchronize`] (the host). The buffer is freed when the last
/// tensor is released, after the work the consumer enqueued on the stream it was handed to.
pub fn export_device(
    layout: &BatchLayout,
    storage: DeviceBuffer,
    ready: Option<Event>,
    options: &ExportOptions,
) -> Result<Vec<DlpackTensor>, DlpackError> {
    let device = storage.device().clone();
    let dl_device = match device.id() {
        DeviceId::Cpu => DLDevice {
            device_type: DLDeviceType::CPU,
            device_id: 0,
        },
        DeviceId::Cuda(ordinal) => DLDevice {
            device_type: DLDeviceType::CUDA,
            device_id: i32::try_from(ordinal).map_err(|_| DlpackError::Unsupported {
                what: "a device tensor",
                reason: format!("GPU ordinal {ordinal} does not fit DLPack's device id"),
            })?,
        },
    };
    let ready = ready.or_else(|| storage.ready_event());
    let (base, len) = (storage.device_ptr() as usize as *mut u8, storage.len());
    let owner: Owner = Shared::owner(storage);
    let src = Source {
        base,
        len,
        dl_device,
        device: Some(&device),
        owner: &owner,
        ready: ready.as_ref(),
        read_only: options.read_only,
    };
    export_layout(layout, &src)
}

/// Exports every tensor of a loader's [`DeviceBatch`](longshore_loader::DeviceBatch) (whatever stage made it: an upload,
/// nvJPEG, your own), in the batch's tensor order, each ready after the batch's event; each
/// device buffer is freed when the last tensor in it is released.
///
/// # Errors
/// As [`export_device`], for any of the batch's buffers.
pub fn export_batch(
    batch: longshore_loader::DeviceBatch,
    options: &ExportOptions,
) -> Result<Vec<DlpackTensor>, DlpackError> {
    let (parts, ready) = batch.into_parts();
    let mut out = Vec::new();
    for part in parts {
        out.extend(export_device(
            &part.layout,
            part.storage,
            Some(ready.clone()),
            options,
        )?);
    }
    Ok(out)
}

fn export_layout(layout: &BatchLayout, src: &Source<'_>) -> Result<Vec<DlpackTensor>, DlpackError> {
    // One event for the whole export, shared: a consumer waits for it once per batch
    // (`hand_all_to`). Not queried here: a query is a driver call, as much as the consumer's
    // wait on an event that has completed, and the export runs once per batch on the thread
    // that hands batches to the framework.
    let ready = src.ready.map(|e| Arc::new(e.clone()));
    layout
        .tensors()
        .iter()
        .enumerate()
        .map(|(i, spec)| DlpackTensor::new(i, spec, src, ready.clone()))
        .collect()
}
