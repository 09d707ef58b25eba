//! The DLPack ABI: the few `repr(C)` types of `dlpack.h` (v1.x) that an exporter needs.
//!
//! Written against the header rather than taken from a crate: the ABI is six small structs
//! that have been stable since v1.0 (later minor versions only add enum values), and the one
//! maintained crate that carries them (`dlpark`) needs Rust 1.88 (this workspace: 1.85),
//! brings its own ownership layers and error crate, and pins a pyo3 version for its Python
//! side. Sizes and field offsets are checked at compile time below against the header's.

use std::ffi::c_void;

/// The DLPack major version this crate produces (`DLPACK_MAJOR_VERSION`).
pub const DLPACK_MAJOR_VERSION: u32 = 1;
/// The DLPack minor version this crate produces: it uses nothing added after 1.0.
pub const DLPACK_MINOR_VERSION: u32 = 0;
/// `DLPACK_FLAG_BITMASK_READ_ONLY`: the consumer must not write the data.
pub const DLPACK_FLAG_BITMASK_READ_ONLY: u64 = 1 << 0;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`: the data was copied for this export (never set here).
pub const DLPACK_FLAG_BITMASK_IS_COPIED: u64 = 1 << 1;

/// `DLPackVersion`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DLPackVersion {
    /// Major version: a change means a new ABI.
    pub major: u32,
    /// Minor version: additions only.
    pub minor: u32,
}

/// `DLDeviceType`, a C enum (an `int`).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DLDeviceType(pub i32);

impl DLDeviceType {
    /// `kDLCPU`: memory the CPU reads and writes.
    pub const CPU: DLDeviceType = DLDeviceType(1);
    /// `kDLCUDA`: CUDA device memory.
    pub const CUDA: DLDeviceType = DLDeviceType(2);
    /// `kDLCUDAHost`: page-locked host memory known to the CUDA driver (`cudaMallocHost`).
    pub const CUDA_HOST: DLDeviceType = DLDeviceType(3);
    /// `kDLCUDAManaged`: CUDA managed (unified) memory.
    pub const CUDA_MANAGED: DLDeviceType = DLDeviceType(13);
}

/// `DLDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DLDevice {
    /// The kind of memory.
    pub device_type: DLDeviceType,
    /// The device ordinal (0 for host memory).
    pub device_id: i32,
}

/// `DLDataTypeCode` values (`DLDataType::code`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DLDataTypeCode;

impl DLDataTypeCode {
    /// `kDLInt`.
    pub const INT: u8 = 0;
    /// `kDLUInt`.
    pub const UINT: u8 = 1;
    /// `kDLFloat`.
    pub const FLOAT: u8 = 2;
    /// `kDLBfloat`.
    pub const BFLOAT: u8 = 4;
    /// `kDLBool`.
    pub const BOOL: u8 = 6;
}

/// `DLDataType`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DLDataType {
    /// One of [`DLDataTypeCode`]'s values.
    pub code: u8,
    /// Bits per element.
    pub bits: u8,
    /// Vector lanes (1 here).
    pub lanes: u16,
}

/// `DLTensor`: a plain view, owning nothing.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DLTensor {
    /// Start of the data (a device pointer for `kDLCUDA`).
    pub data: *mut c_void,
    /// Where the data lives.
    pub device: DLDevice,
    /// Number of dimensions.
    pub ndim: i32,
    /// The element type.
    pub dtype: DLDataType,
    /// `ndim` extents.
    pub shape: *mut i64,
    /// `ndim` strides in elements (never null here when `ndim > 0`).
    pub strides: *mut i64,
    /// Bytes from `data` to the first element.
    pub byte_offset: u64,
}

/// `DLManagedTensor`: the legacy (pre-1.0, unversioned) managed tensor, still asked for by
/// consumers that do not pass `max_version` to `__dlpack__`.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    /// The view.
    pub dl_tensor: DLTensor,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Called once by the consumer when it no longer needs the tensor.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// `DLManagedTensorVersioned`: the DLPack 1.x managed tensor.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    /// The ABI version.
    pub version: DLPackVersion,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Called once by the consumer when it no longer needs the tensor.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    /// `DLPACK_FLAG_BITMASK_*` bits.
    pub flags: u64,
    /// The view.
    pub dl_tensor: DLTensor,
}

// The header's layout on 64-bit targets (dlpack.h v1.x): sizes and offsets.
#[cfg(target_pointer_width = "64")]
const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<DLPackVersion>() == 8);
    assert!(size_of::<DLDevice>() == 8 && align_of::<DLDevice>() == 4);
    assert!(size_of::<DLDataType>() == 4 && align_of::<DLDataType>() == 2);
    assert!(size_of::<DLTensor>() == 48 && align_of::<DLTensor>() == 8);
    assert!(offset_of!(DLTensor, device) == 8);
    assert!(offset_of!(DLTensor, ndim) == 16);
    assert!(offset_of!(DLTensor, dtype) == 20);
    assert!(offset_of!(DLTensor, shape) == 24);
    assert!(offset_of!(DLTensor, strides) == 32);
    assert!(offset_of!(DLTensor, byte_offset) == 40);
    assert!(size_of::<DLManagedTensor>() == 64);
    assert!(offset_of!(DLManagedTensor, manager_ctx) == 48);
    assert!(offset_of!(DLManagedTensor, deleter) == 56);
    assert!(size_of::<DLManagedTensorVersioned>() == 80);
    assert!(offset_of!(DLManagedTensorVersioned, manager_ctx) == 8);
    assert!(offset_of!(DLManagedTensorVersioned, deleter) == 16);
    assert!(offset_of!(DLManagedTensorVersioned, flags) == 24);
    assert!(offset_of!(DLManagedTensorVersioned, dl_tensor) == 32);
};
