//! [`HostBuffer`]: owned, aligned host memory that knows its [`MemoryKind`].

use std::alloc::Layout;
use std::fmt;
use std::ptr::NonNull;

use crate::error::{HostError, Result};
use crate::fence::SharedFence;
use crate::kind::MemoryKind;

/// How a buffer's memory goes back to where it came from.
pub(crate) enum Release {
    /// `std::alloc::dealloc` with this layout.
    Std { layout: Layout },
    /// `munlock`, then `dealloc`.
    Locked { layout: Layout },
    /// `cuMemFreeHost`, with the context that allocated it kept alive.
    #[cfg(feature = "cuda")]
    CudaHost {
        ctx: std::sync::Arc<cudarc::driver::CudaContext>,
    },
    /// A shared mapping of a memory file (`SharedAllocator`): `cuMemHostUnregister` when it
    /// was registered, `munmap`, then the file is closed.
    Shared {
        fd: std::os::fd::OwnedFd,
        id: u64,
        #[cfg(feature = "cuda")]
        ctx: Option<std::sync::Arc<cudarc::driver::CudaContext>>,
    },
    /// `cuMemHostUnregister`, then `dealloc`.
    #[cfg(feature = "cuda")]
    Registered {
        ctx: std::sync::Arc<cudarc::driver::CudaContext>,
        layout: Layout,
    },
}

/// An owned, aligned, zero-initialised host byte buffer that records what kind of memory it is.
///
/// Buffers are page-aligned by default. Typed views go through [`bytemuck`] and are checked
/// for size and alignment. A buffer can [`record a fence`](HostBuffer::record_fence): dropping
/// it then waits for the fence before the memory is freed, so memory whose last use is an
/// in-flight copy is never returned to the OS under the copy.
///
/// ```
/// use longshore_host::{HostBuffer, MemoryKind};
///
/// let mut buf = HostBuffer::pageable(4096)?;
/// assert_eq!(buf.kind(), MemoryKind::Pageable);
/// buf.as_mut_slice::<f32>()?[0] = 1.5;
/// assert_eq!(buf.as_slice::<f32>()?[0], 1.5);
/// assert_eq!(buf.as_slice::<f32>()?.len(), 1024);
/// # Ok::<(), longshore_host::HostError>(())
/// ```
pub struct HostBuffer {
    ptr: NonNull<u8>,
    len: usize,
    capacity: usize,
    kind: MemoryKind,
    release: Release,
    fences: Vec<SharedFence>,
}

// SAFETY: a HostBuffer uniquely owns its allocation (like a Box<[u8]>); the raw pointer is
// never shared outside borrows tied to `&self`/`&mut self`. The release data (layouts, Arc'd
// CUDA contexts, which are Send + Sync) is safe to move and share between threads.
unsafe impl Send for HostBuffer {}
// SAFETY: `&HostBuffer` only gives out `&[u8]`, which is Sync.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// Wraps memory produced by one of the allocators of this crate.
    ///
    /// # Safety
    /// `ptr` points to `capacity` initialised, writable bytes owned by nobody else, which
    /// `release` frees correctly; `len <= capacity`.
    pub(crate) unsafe fn from_raw(
        ptr: NonNull<u8>,
        len: usize,
        capacity: usize,
        kind: MemoryKind,
        release: Release,
    ) -> Self {
        debug_assert!(len <= capacity);
        Self {
            ptr,
            len,
            capacity,
            kind,
            release,
            fences: Vec::new(),
        }
    }

    /// The memory file of a buffer from a [`SharedAllocator`](crate::SharedAllocator), with an
    /// id unique in this process (file descriptor numbers are reused after a buffer is
    /// freed; the id is not): another process maps the same pages from the file
    /// (`/proc/<pid>/fd/<fd>`, or the descriptor passed over a Unix socket). `None` for other
    /// memory.
    pub fn shared_fd(&self) -> Option<(std::os::fd::BorrowedFd<'_>, u64)> {
        use std::os::fd::AsFd;
        match &self.release {
            Release::Shared { fd, id, .. } => Some((fd.as_fd(), *id)),
            _ => None,
        }
    }

    /// The kind of memory.
    pub fn kind(&self) -> MemoryKind {
        self.kind
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes (never true for an allocated buffer).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes actually allocated (the length rounded up to the allocator's granularity).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Sets the visible length, up to [`capacity`](HostBuffer::capacity).
    ///
    /// Bytes between the old and new length keep whatever was last written there (zero at
    /// first): the whole capacity is always initialised.
    pub fn set_len(&mut self, len: usize) -> Result<()> {
        if len > self.capacity {
            return Err(HostError::InvalidLayout {
                bytes: len,
                align: 1,
                reason: "length exceeds the buffer's capacity",
            });
        }
        self.len = len;
        Ok(())
    }

    /// Start of the buffer.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Start of the buffer, writable.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: `ptr` points to `capacity >= len` initialised bytes owned by self; the
        // borrow of self keeps them alive and unaliased by writers.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, writable.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_bytes`, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// A typed view of the whole buffer; fails if the length is not a multiple of
    /// `size_of::<T>()` or the start is not aligned for `T`.
    pub fn as_slice<T: bytemuck::Pod>(&self) -> Result<&[T]> {
        view_err::<T>(self.as_bytes(), bytemuck::try_cast_slice(self.as_bytes()))
    }

    /// A typed, writable view of the whole buffer (checked like [`as_slice`](HostBuffer::as_slice)).
    pub fn as_mut_slice<T: bytemuck::Pod>(&mut self) -> Result<&mut [T]> {
        let (addr, len) = (self.ptr.as_ptr() as usize, self.len);
        bytemuck::try_cast_slice_mut(self.as_bytes_mut()).map_err(|e| view_error::<T>(addr, len, e))
    }

    /// Records that a device operation may still read or write this buffer until `fence`
    /// completes. Dropping the buffer waits for every recorded fence before freeing it.
    pub fn record_fence(&mut self, fence: SharedFence) {
        self.fences.retain(|f| !f.is_complete());
        self.fences.push(fence);
    }

    /// Whether every recorded fence has completed.
    pub fn is_idle(&self) -> bool {
        self.fences.iter().all(|f| f.is_complete())
    }

    /// Blocks until every recorded fence has completed, then forgets them.
    pub fn wait_idle(&mut self) {
        for f in self.fences.drain(..) {
            f.wait();
        }
    }
}

pub(crate) fn view_err<'a, T>(
    bytes: &'a [u8],
    r: std::result::Result<&'a [T], bytemuck::PodCastError>,
) -> Result<&'a [T]> {
    r.map_err(|e| view_error::<T>(bytes.as_ptr() as usize, bytes.len(), e))
}

pub(crate) fn view_error<T>(addr: usize, len: usize, e: bytemuck::PodCastError) -> HostError {
    let reason = match e {
        bytemuck::PodCastError::TargetAlignmentGreaterAndInputNotAligned => {
            "start is not aligned for the element type"
        }
        bytemuck::PodCastError::OutputSliceWouldHaveSlop => {
            "length is not a multiple of the element size"
        }
        bytemuck::PodCastError::SizeMismatch => "size mismatch",
        bytemuck::PodCastError::AlignmentMismatch => "alignment mismatch",
    };
    HostError::View {
        ty: std::any::type_name::<T>(),
        len,
        addr,
        reason,
    }
}

impl std::ops::Deref for HostBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl std::ops::DerefMut for HostBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_bytes_mut()
    }
}

impl AsRef<[u8]> for HostBuffer {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl AsMut<[u8]> for HostBuffer {
    fn as_mut(&mut self) -> &mut [u8] {
        self.as_bytes_mut()
    }
}

impl fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBuffer")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("capacity", &self.capacity)
            .field("kind", &self.kind)
            .field(
                "pending_fences",
                &self.fences.iter().filter(|f| !f.is_complete()).count(),
            )
            .finish()
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // Memory whose last use is an in-flight copy is not freed until the copy is done.
        for f in self.fences.drain(..) {
            f.wait();
        }
        let ptr = self.ptr.as_ptr();
        match &self.release {
            Release::Std { layout } => {
                // SAFETY: `ptr` was returned by `alloc_zeroed(layout)` and is freed once, here.
                unsafe { std::alloc::dealloc(ptr, *layout) }
            }
            Release::Locked { layout } => {
                // SAFETY: the range was locked by `mlock` at allocation and is still mapped.
                if unsafe { libc::munlock(ptr.cast(), layout.size()) } != 0 {
                    tracing::error!(target: "longshore::host", bytes = layout.size(), error = %std::io::Error::last_os_error(), "munlock failed");
                }
                // SAFETY: `ptr` was returned by `alloc_zeroed(layout)` and is freed once, here.
                unsafe { std::alloc::dealloc(ptr, *layout) }
            }
            Release::Shared {
                #[cfg(feature = "cuda")]
                ctx,
                ..
            } => {
                #[cfg(feature = "cuda")]
                if let Some(ctx) = ctx {
                    if let Err(e) = ctx.bind_to_thread() {
                        tracing::error!(target: "longshore::host", error = %crate::cuda::error_name(&e), "cannot bind CUDA context to unregister shared memory; leaking it");
                        return;
                    }
                    // SAFETY: `ptr` was registered at allocation and no copy uses it any more.
                    if let Err(e) = unsafe { crate::cuda::mem_host_unregister(ptr) } {
                        tracing::error!(target: "longshore::host", bytes = self.capacity, error = %crate::cuda::error_name(&e), "cuMemHostUnregister failed; leaking the buffer");
                        return;
                    }
                }
                // SAFETY: `ptr` is the shared mapping of `capacity` bytes made at allocation,
                // unmapped once, here; the memory file closes when `fd` drops.
                if unsafe { libc::munmap(ptr.cast(), self.capacity) } != 0 {
                    tracing::error!(target: "longshore::host", bytes = self.capacity, error = %std::io::Error::last_os_error(), "munmap failed");
                }
            }
            #[cfg(feature = "cuda")]
            Release::CudaHost { ctx } => {
                if let Err(e) = ctx.bind_to_thread() {
                    tracing::error!(target: "longshore::host", error = %crate::cuda::error_name(&e), "cannot bind CUDA context to free page-locked memory; leaking it");
                    return;
                }
                // SAFETY: `ptr` came from cuMemHostAlloc in `ctx`, all fences are complete so
                // no copy uses it, and it is freed once, here.
                if let Err(e) = unsafe { crate::cuda::mem_free_host(ptr) } {
                    tracing::error!(target: "longshore::host", bytes = self.capacity, error = %crate::cuda::error_name(&e), "cuMemFreeHost failed");
                }
            }
            #[cfg(feature = "cuda")]
            Release::Registered { ctx, layout } => {
                if let Err(e) = ctx.bind_to_thread() {
                    tracing::error!(target: "longshore::host", error = %crate::cuda::error_name(&e), "cannot bind CUDA context to unregister memory; leaking it");
                    return;
                }
                // SAFETY: `ptr` was registered at allocation and no copy uses it any more.
                if let Err(e) = unsafe { crate::cuda::mem_host_unregister(ptr) } {
                    tracing::error!(target: "longshore::host", bytes = layout.size(), error = %crate::cuda::error_name(&e), "cuMemHostUnregister failed; leaking the buffer");
                    return;
                }
                // SAFETY: `ptr` was returned by `alloc_zeroed(layout)` and is freed once, here.
                unsafe { std::alloc::dealloc(ptr, *layout) }
            }
        }
    }
}
