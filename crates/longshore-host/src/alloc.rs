//! Raw allocators, one per [`MemoryKind`], behind the small [`RawAllocator`] trait.

use std::alloc::Layout;
use std::fmt;
use std::ptr::NonNull;

use crate::buffer::{HostBuffer, Release};
use crate::error::{HostError, Result};
use crate::kind::{MemoryKind, PageLockedFlags};
use crate::sys::{page_size, round_up};

/// Something that hands out [`HostBuffer`]s of one [`MemoryKind`].
///
/// Buffers come back zero-initialised, page-aligned (unless an allocator says otherwise) and
/// with a capacity rounded up to whole pages. Allocation is a slow path: the
/// [`PinnedPool`](crate::PinnedPool) caches what these return.
pub trait RawAllocator: Send + Sync + fmt::Debug {
    /// The kind of memory this allocator returns.
    fn kind(&self) -> MemoryKind;

    /// Allocates at least `len` bytes.
    fn allocate(&self, len: usize) -> Result<HostBuffer>;
}

/// The default allocator of each kind, boxed.
pub(crate) fn allocator_for(kind: MemoryKind) -> Box<dyn RawAllocator> {
    match kind {
        MemoryKind::Pageable => Box::new(PageableAllocator::default()),
        MemoryKind::PageLocked => Box::new(PageLockedAllocator::default()),
        MemoryKind::Registered => Box::new(RegisteredAllocator::default()),
        MemoryKind::Locked => Box::new(LockedAllocator),
    }
}

/// The allocating constructors of [`HostBuffer`], over the allocators of this module.
impl HostBuffer {
    /// Allocates `len` zeroed bytes of ordinary pageable memory, page-aligned.
    pub fn pageable(len: usize) -> Result<Self> {
        PageableAllocator::default().allocate(len)
    }

    /// Allocates `len` zeroed bytes of pageable memory with the given alignment (a power of two).
    pub fn pageable_aligned(len: usize, align: usize) -> Result<Self> {
        PageableAllocator::with_align(align)?.allocate(len)
    }

    /// Allocates `len` bytes of page-locked memory from the CUDA driver (`cuMemHostAlloc`).
    pub fn page_locked(len: usize) -> Result<Self> {
        PageLockedAllocator::default().allocate(len)
    }

    /// Allocates `len` bytes, pre-faults them with several threads, and registers them with
    /// the CUDA driver (`cuMemHostRegister`).
    pub fn registered(len: usize) -> Result<Self> {
        RegisteredAllocator::default().allocate(len)
    }

    /// Allocates `len` bytes locked in RAM by the OS (`mlock`), not registered with any driver.
    pub fn locked(len: usize) -> Result<Self> {
        LockedAllocator.allocate(len)
    }

    /// Allocates `len` bytes of the given kind with each kind's default settings.
    pub fn alloc(kind: MemoryKind, len: usize) -> Result<Self> {
        allocator_for(kind).allocate(len)
    }

    /// Allocates a buffer of `kind` holding a copy of `data`.
    pub fn from_slice<T: bytemuck::NoUninit>(kind: MemoryKind, data: &[T]) -> Result<Self> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let mut buf = Self::alloc(kind, bytes.len())?;
        buf.as_bytes_mut().copy_from_slice(bytes);
        Ok(buf)
    }
}

/// The largest single allocation we attempt; anything larger is rejected up front.
const MAX_ALLOC: usize = isize::MAX as usize / 2;

fn layout_for(kind: MemoryKind, len: usize, align: usize) -> Result<Layout> {
    if len == 0 {
        return Err(HostError::ZeroSize { kind });
    }
    if len > MAX_ALLOC {
        return Err(HostError::InvalidLayout {
            bytes: len,
            align,
            reason: "larger than the address space allows",
        });
    }
    let cap = round_up(len, page_size().max(align)).ok_or(HostError::InvalidLayout {
        bytes: len,
        align,
        reason: "size overflows when rounded to pages",
    })?;
    Layout::from_size_align(cap, align.max(1)).map_err(|_| HostError::InvalidLayout {
        bytes: len,
        align,
        reason: "alignment must be a power of two",
    })
}

/// Allocates zeroed memory for `layout`.
fn alloc_zeroed(layout: Layout, kind: MemoryKind, len: usize) -> Result<NonNull<u8>> {
    // SAFETY: `layout` has a non-zero size (checked by `layout_for`).
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    NonNull::new(p).ok_or(HostError::OutOfMemory { bytes: len, kind })
}

#[cfg(feature = "cuda")]
/// Writes zeros over `len` bytes at `ptr` with up to `threads` threads, touching every page.
///
/// # Safety
/// `ptr..ptr+len` is writable memory owned by the caller and not accessed by anyone else
/// during the call.
unsafe fn prefault(ptr: *mut u8, len: usize, threads: usize) {
    const PER_THREAD_MIN: usize = 8 << 20;
    let threads = threads.clamp(1, len.div_ceil(PER_THREAD_MIN).max(1));
    if threads == 1 {
        // SAFETY: guaranteed by the caller.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        return;
    }
    let chunk = round_up(len.div_ceil(threads), page_size()).unwrap_or(len);
    let base = ptr as usize;
    std::thread::scope(|s| {
        let mut off = 0;
        while off < len {
            let n = chunk.min(len - off);
            let start = base + off;
            s.spawn(move || {
                // SAFETY: the chunks are disjoint sub-ranges of the caller's range, and the
                // scope ends before the caller regains access.
                unsafe { std::ptr::write_bytes(start as *mut u8, 0, n) };
            });
            off += n;
        }
    });
}

#[cfg(feature = "cuda")]
fn default_threads() -> usize {
    RegisteredAllocator::default().prefault_threads
}

/// Ordinary pageable memory from the global allocator.
#[derive(Debug, Clone, Copy)]
pub struct PageableAllocator {
    align: usize,
}

impl Default for PageableAllocator {
    fn default() -> Self {
        Self { align: page_size() }
    }
}

impl PageableAllocator {
    /// Pageable memory aligned to `align` bytes (a power of two).
    pub fn with_align(align: usize) -> Result<Self> {
        if !align.is_power_of_two() {
            return Err(HostError::InvalidLayout {
                bytes: 0,
                align,
                reason: "alignment must be a power of two",
            });
        }
        Ok(Self { align })
    }
}

impl RawAllocator for PageableAllocator {
    fn kind(&self) -> MemoryKind {
        MemoryKind::Pageable
    }

    fn allocate(&self, len: usize) -> Result<HostBuffer> {
        let layout = layout_for(MemoryKind::Pageable, len, self.align)?;
        let ptr = alloc_zeroed(layout, MemoryKind::Pageable, len)?;
        // SAFETY: `ptr` owns `layout.size()` zeroed bytes, freed by `Release::Std`.
        Ok(unsafe {
            HostBuffer::from_raw(
                ptr,
                len,
                layout.size(),
                MemoryKind::Pageable,
                Release::Std { layout },
            )
        })
    }
}

/// Memory locked in RAM by the OS with `mlock`: never swapped, but unknown to any driver.
///
/// Limited by `RLIMIT_MEMLOCK` unless the process has `CAP_IPC_LOCK`; when refused the error
/// names the limit.
#[derive(Debug, Clone, Copy, Default)]
pub struct LockedAllocator;

impl RawAllocator for LockedAllocator {
    fn kind(&self) -> MemoryKind {
        MemoryKind::Locked
    }

    fn allocate(&self, len: usize) -> Result<HostBuffer> {
        let layout = layout_for(MemoryKind::Locked, len, page_size())?;
        let ptr = alloc_zeroed(layout, MemoryKind::Locked, len)?;
        // SAFETY: `ptr..ptr+size` is a live allocation we own.
        let rc = unsafe { libc::mlock(ptr.as_ptr().cast(), layout.size()) };
        if rc != 0 {
            let errno = std::io::Error::last_os_error();
            // SAFETY: allocated above with `layout`, not used after.
            unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
            return Err(HostError::MlockRefused {
                bytes: layout.size(),
                errno,
                limit: crate::sys::memlock_limit_text(),
            });
        }
        // SAFETY: `ptr` owns `layout.size()` zeroed, locked bytes, released by `Release::Locked`.
        Ok(unsafe {
            HostBuffer::from_raw(
                ptr,
                len,
                layout.size(),
                MemoryKind::Locked,
                Release::Locked { layout },
            )
        })
    }
}

/// Page-locked memory from the CUDA driver (`cuMemHostAlloc`).
#[derive(Debug, Clone, Copy, Default)]
pub struct PageLockedAllocator {
    /// Allocation flags (portable by default, never write-combined unless asked).
    pub flags: PageLockedFlags,
    /// The device whose primary context performs the allocation.
    pub device: usize,
}

impl RawAllocator for PageLockedAllocator {
    fn kind(&self) -> MemoryKind {
        MemoryKind::PageLocked
    }

    #[cfg(feature = "cuda")]
    fn allocate(&self, len: usize) -> Result<HostBuffer> {
        let layout = layout_for(MemoryKind::PageLocked, len, page_size())?;
        let ctx = crate::cuda::context(self.device)?;
        // SAFETY: `context` bound a context to this thread.
        let ptr = unsafe { crate::cuda::mem_host_alloc(layout.size(), self.flags.alloc_bits()) }
            .map_err(|e| {
                crate::cuda::driver_err(
                    "cuMemHostAlloc",
                    e,
                    format!("allocating {} bytes of page-locked memory", layout.size()),
                )
            })?;
        let ptr = NonNull::new(ptr).ok_or(HostError::OutOfMemory {
            bytes: len,
            kind: MemoryKind::PageLocked,
        })?;
        // SAFETY: the driver returned `layout.size()` writable bytes that nobody else uses yet.
        unsafe { prefault(ptr.as_ptr(), layout.size(), default_threads()) };
        // SAFETY: `ptr` owns `layout.size()` zeroed bytes from cuMemHostAlloc in `ctx`.
        Ok(unsafe {
            HostBuffer::from_raw(
                ptr,
                len,
                layout.size(),
                MemoryKind::PageLocked,
                Release::CudaHost { ctx },
            )
        })
    }

    #[cfg(not(feature = "cuda"))]
    fn allocate(&self, _len: usize) -> Result<HostBuffer> {
        Err(no_cuda_feature())
    }
}

/// Memory we allocate, pre-fault with several threads, then register with the CUDA driver
/// (`cuMemHostRegister`). For large blocks this is much faster than `cuMemHostAlloc`
/// (256 MiB on an H200 host: 15 ms to register vs 108 ms to allocate).
#[derive(Debug, Clone, Copy)]
pub struct RegisteredAllocator {
    /// Registration flags.
    pub flags: PageLockedFlags,
    /// Threads used to pre-fault pages before registering.
    pub prefault_threads: usize,
    /// The device whose primary context performs the registration.
    pub device: usize,
}

impl Default for RegisteredAllocator {
    fn default() -> Self {
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(8);
        Self {
            flags: PageLockedFlags::default(),
            prefault_threads: threads,
            device: 0,
        }
    }
}

impl RawAllocator for RegisteredAllocator {
    fn kind(&self) -> MemoryKind {
        MemoryKind::Registered
    }

    #[cfg(feature = "cuda")]
    fn allocate(&self, len: usize) -> Result<HostBuffer> {
        let layout = layout_for(MemoryKind::Registered, len, page_size())?;
        let ctx = crate::cuda::context(self.device)?;
        // SAFETY: `layout` has a non-zero size.
        let raw = unsafe { std::alloc::alloc(layout) };
        let ptr = NonNull::new(raw).ok_or(HostError::OutOfMemory {
            bytes: len,
            kind: MemoryKind::Registered,
        })?;
        // SAFETY: we own the fresh allocation; nobody else sees it yet.
        unsafe { prefault(ptr.as_ptr(), layout.size(), self.prefault_threads) };
        let bits = self.flags.register_bits();
        // SAFETY: the range is our allocation and stays allocated until `Release::Registered`
        // unregisters it; `context` bound a context to this thread.
        let registered =
            unsafe { crate::cuda::mem_host_register(ptr.as_ptr(), layout.size(), bits) };
        if let Err(e) = registered {
            // SAFETY: allocated above with `layout`, registration failed, not used after.
            unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
            return Err(crate::cuda::driver_err(
                "cuMemHostRegister",
                e,
                format!("registering {} bytes", layout.size()),
            ));
        }
        // SAFETY: `ptr` owns `layout.size()` zeroed, registered bytes, released by `Release::Registered`.
        Ok(unsafe {
            HostBuffer::from_raw(
                ptr,
                len,
                layout.size(),
                MemoryKind::Registered,
                Release::Registered { ctx, layout },
            )
        })
    }

    #[cfg(not(feature = "cuda"))]
    fn allocate(&self, _len: usize) -> Result<HostBuffer> {
        Err(no_cuda_feature())
    }
}

#[cfg(not(feature = "cuda"))]
fn no_cuda_feature() -> HostError {
    HostError::CudaUnavailable {
        reason: "longshore-host was built without the `cuda` feature".to_owned(),
    }
}

/// Memory another process can map: each buffer is its own anonymous memory file
/// (`memfd_create`), mapped shared, and with `pinned` page-locked and registered with the CUDA
/// driver (`cuMemHostRegister`). A process given the file descriptor
/// ([`HostBuffer::shared_fd`], e.g. as `/proc/<pid>/fd/<fd>`) maps the same pages, so a worker
/// process writes a batch straight into page-locked memory the copy to the GPU reads: what a
/// loader of Python datasets, whose code runs in worker processes, collates into.
///
/// ```
/// use longshore_host::{RawAllocator, SharedAllocator};
///
/// let buf = SharedAllocator::new(false).allocate(10_000)?;
/// assert!(buf.shared_fd().is_some());
/// assert_eq!(buf.as_bytes().len(), 10_000);
/// # Ok::<(), longshore_host::HostError>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct SharedAllocator {
    pinned: bool,
    /// The device whose primary context registers the memory (with `pinned`).
    pub device: usize,
}

impl SharedAllocator {
    /// Shared memory, page-locked and registered with the CUDA driver when `pinned` (an error
    /// at allocation where no driver is present), else pageable.
    pub fn new(pinned: bool) -> Self {
        Self { pinned, device: 0 }
    }
}

/// Identifies each shared buffer for the life of the process (a worker process caches its
/// mapping of a buffer by this id: file descriptor numbers are reused).
static SHARED_IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl RawAllocator for SharedAllocator {
    fn kind(&self) -> MemoryKind {
        if self.pinned {
            MemoryKind::Registered
        } else {
            MemoryKind::Pageable
        }
    }

    fn allocate(&self, len: usize) -> Result<HostBuffer> {
        use std::os::fd::{FromRawFd, OwnedFd};
        let kind = self.kind();
        let layout = layout_for(kind, len, page_size())?;
        let io = |call: &'static str| HostError::SharedMemory {
            call,
            source: std::io::Error::last_os_error(),
        };
        // SAFETY: the name is a NUL-terminated string; the flags are valid.
        let raw = unsafe { libc::memfd_create(c"longshore-block".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(io("memfd_create"));
        }
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let size = libc::off_t::try_from(layout.size()).map_err(|_| HostError::InvalidLayout {
            bytes: len,
            align: page_size(),
            reason: "larger than a file may be",
        })?;
        // SAFETY: `fd` is a valid memory file.
        if unsafe { libc::ftruncate(raw, size) } != 0 {
            return Err(io("ftruncate"));
        }
        // SAFETY: a fresh shared mapping of the whole file; nothing else maps it yet.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                layout.size(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                raw,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(HostError::OutOfMemory { bytes: len, kind });
        }
        let ptr =
            NonNull::new(p.cast::<u8>()).ok_or(HostError::OutOfMemory { bytes: len, kind })?;
        let unmap = |ptr: NonNull<u8>| {
            // SAFETY: `ptr` is the mapping made above, of `layout.size()` bytes, unused after.
            unsafe { libc::munmap(ptr.as_ptr().cast(), layout.size()) };
        };
        #[cfg(feature = "cuda")]
        let ctx = if self.pinned {
            let ctx = match crate::cuda::context(self.device) {
                Ok(c) => c,
                Err(e) => {
                    unmap(ptr);
                    return Err(e);
                }
            };
            // SAFETY: nobody else uses the fresh mapping yet.
            unsafe { prefault(ptr.as_ptr(), layout.size(), default_threads()) };
            let bits = PageLockedFlags::default().register_bits();
            // SAFETY: the range is our mapping and stays mapped until `Release::Shared`
            // unregisters it; `context` bound a context to this thread.
            let registered =
                unsafe { crate::cuda::mem_host_register(ptr.as_ptr(), layout.size(), bits) };
            if let Err(e) = registered {
                unmap(ptr);
                return Err(crate::cuda::driver_err(
                    "cuMemHostRegister",
                    e,
                    format!("registering {} bytes of shared memory", layout.size()),
                ));
            }
            Some(ctx)
        } else {
            None
        };
        #[cfg(not(feature = "cuda"))]
        if self.pinned {
            unmap(ptr);
            return Err(no_cuda_feature());
        }
        let id = SHARED_IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: `ptr` maps `layout.size()` zero-filled bytes of `fd` (a new memory file reads
        // as zeros), released by `Release::Shared`.
        Ok(unsafe {
            HostBuffer::from_raw(
                ptr,
                len,
                layout.size(),
                kind,
                Release::Shared {
                    fd,
                    id,
                    #[cfg(feature = "cuda")]
                    ctx,
                },
            )
        })
    }
}
