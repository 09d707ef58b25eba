//! What kind of host memory a buffer is.

use std::fmt;

/// The kind of host memory behind a buffer, which decides how fast a device can copy it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MemoryKind {
    /// Ordinary allocation. The OS may swap or move its pages, so the CUDA driver copies it
    /// through a hidden page-locked bounce buffer: two copies, several times slower.
    Pageable,
    /// Allocated page-locked by the CUDA driver (`cuMemHostAlloc`); copies go straight to DMA.
    PageLocked,
    /// Memory we allocated, then page-locked and registered with the driver (`cuMemHostRegister`).
    Registered,
    /// Page-locked by the OS (`mlock`) but not registered with any driver: it is never swapped,
    /// but a CUDA copy from it still goes through the driver's staging path.
    Locked,
}

impl MemoryKind {
    /// Whether the CUDA driver can DMA this memory directly (page-locked and known to the driver).
    pub const fn is_dma_capable(self) -> bool {
        matches!(self, MemoryKind::PageLocked | MemoryKind::Registered)
    }

    /// Whether the pages are locked in RAM (never swapped).
    pub const fn is_page_locked(self) -> bool {
        !matches!(self, MemoryKind::Pageable)
    }

    /// A short lowercase name.
    pub const fn as_str(self) -> &'static str {
        match self {
            MemoryKind::Pageable => "pageable",
            MemoryKind::PageLocked => "page-locked",
            MemoryKind::Registered => "registered",
            MemoryKind::Locked => "mlocked",
        }
    }
}

impl fmt::Display for MemoryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Flags for page-locked allocations and registrations (`CU_MEMHOSTALLOC_*`).
///
/// The default is portable (usable from every CUDA context, so one pool serves every GPU),
/// not mapped and not write-combined: write-combined memory is very slow for the CPU to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PageLockedFlags {
    /// Usable by all CUDA contexts, not only the one current at allocation.
    pub portable: bool,
    /// Map the allocation into the device address space.
    pub device_map: bool,
    /// Write-combined: faster for the device to read over PCIe, very slow for the CPU to read.
    /// Only valid for `cuMemHostAlloc`, ignored for registration.
    pub write_combined: bool,
}

impl Default for PageLockedFlags {
    fn default() -> Self {
        Self {
            portable: true,
            device_map: false,
            write_combined: false,
        }
    }
}

impl PageLockedFlags {
    /// Flags for `cuMemHostAlloc`.
    #[cfg(feature = "cuda")]
    pub(crate) const fn alloc_bits(self) -> u32 {
        (self.portable as u32)
            | ((self.device_map as u32) << 1)
            | ((self.write_combined as u32) << 2)
    }

    /// Flags for `cuMemHostRegister` (write-combining does not apply).
    #[cfg(feature = "cuda")]
    pub(crate) const fn register_bits(self) -> u32 {
        (self.portable as u32) | ((self.device_map as u32) << 1)
    }
}
