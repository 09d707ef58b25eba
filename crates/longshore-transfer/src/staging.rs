//! Pageable uploads staged through pooled page-locked chunks by several threads.
//!
//! From pageable memory the CUDA driver copies through one small hidden bounce buffer with one
//! thread: two copies in series, 8.5 GB/s at 256 MiB on the reference host against 55 GB/s from
//! page-locked memory. A [`Stager`] splits the source into chunks (4 MiB by default), and
//! `threads` threads each `memcpy` a chunk into a page-locked block leased from its
//! [`PinnedPool`], enqueue the DMA of that chunk, and go on with the next chunk while earlier ones
//! are in flight (each thread keeps at most `in_flight_per_thread` of its chunks in flight,
//! double buffering by default). A block goes back to the pool with the chunk's event recorded on
//! it, so it is reused only after its DMA has completed.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use longshore_host::{BudgetPolicy, MemoryKind, PinnedPool, PoolConfig};

use crate::backend::cpu::HostPtr;
use crate::buffer::DeviceBuffer;
use crate::device::{Device, DeviceId};
use crate::error::{Result, TransferError};
use crate::event::Event;
use crate::stream::Stream;

/// How a copy from pageable memory to a device is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum UploadMode {
    /// Staged from the stager's [`auto_min_bytes`](StagingConfig::auto_min_bytes) up, direct below.
    #[default]
    Auto,
    /// Hand the pageable pointer to the driver (`cuMemcpyHtoDAsync`), which stages it itself,
    /// synchronously and with one thread.
    Direct,
    /// Stage through the device's [`Stager`] with several threads.
    Staged,
}

/// Settings of a [`Stager`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagingConfig {
    /// Bytes per chunk (default 4 MiB).
    pub chunk_bytes: usize,
    /// Threads copying chunks, the caller's included (default: half the cores, 1 to 8).
    pub threads: usize,
    /// Chunks each thread may have in flight before it waits for its oldest (default 2).
    pub in_flight_per_thread: usize,
    /// [`UploadMode::Auto`] stages uploads of at least this many bytes (default
    /// [`DEFAULT_AUTO_MIN_BYTES`](Self::DEFAULT_AUTO_MIN_BYTES)).
    pub auto_min_bytes: usize,
}

impl StagingConfig {
    /// The default [`auto_min_bytes`](Self::auto_min_bytes): 8 MiB. Below it the driver's own
    /// pageable path is as fast (13-16 GB/s at 1-16 MiB on the reference host) and needs no
    /// page-locked chunks.
    pub const DEFAULT_AUTO_MIN_BYTES: usize = 8 << 20;
}

impl Default for StagingConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2);
        Self {
            chunk_bytes: 4 << 20,
            threads: (cores / 2).clamp(1, 8),
            in_flight_per_thread: 2,
            auto_min_bytes: Self::DEFAULT_AUTO_MIN_BYTES,
        }
    }
}

/// Stages pageable uploads to one device through a pool of page-locked chunks (pageable
/// chunks on the `Cpu` device, where the same code paths run).
///
/// A stager owns its copying threads (`threads - 1` of them; the caller's thread is the last)
/// and reserves its chunks when it is made, so an upload neither spawns a thread nor
/// allocates page-locked memory.
pub struct Stager {
    /// The device's id, not a [`Device`]: the device keeps its default stager, and a handle
    /// back would make a cycle that keeps both (and the stager's page-locked chunks) alive.
    device: DeviceId,
    config: StagingConfig,
    pool: PinnedPool,
    /// The copying threads besides the caller's; `None` with one thread.
    workers: Option<rayon::ThreadPool>,
}

impl std::fmt::Debug for Stager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stager")
            .field("device", &self.device)
            .field("config", &self.config)
            .field("pool", &self.pool)
            .finish_non_exhaustive()
    }
}

impl Stager {
    /// A stager for `device` with its own chunk pool, sized to what can be in flight at once,
    /// and its own copying threads.
    ///
    /// The chunks that can be in flight at once (`threads * in_flight_per_thread`) are
    /// allocated here rather than during the first upload; if that fails (page-locked memory
    /// refused) the stager is still made and allocates, or falls back to pageable chunks,
    /// as uploads need.
    pub fn new(device: &Device, config: StagingConfig) -> Result<Self> {
        if config.chunk_bytes == 0 || config.threads == 0 || config.in_flight_per_thread == 0 {
            return Err(TransferError::Invalid(format!(
                "staging needs a non-zero chunk size, thread count and depth, got {config:?}"
            )));
        }
        let kind = if device.is_cpu() {
            MemoryKind::Pageable
        } else {
            MemoryKind::PageLocked
        };
        let in_flight = config
            .threads
            .saturating_mul(config.in_flight_per_thread)
            .saturating_mul(config.chunk_bytes);
        let pool = PinnedPool::new(
            PoolConfig::for_kind(kind)
                .budget(
                    in_flight
                        .saturating_mul(2)
                        .max(config.chunk_bytes.saturating_mul(2)),
                )
                .policy(BudgetPolicy::FallbackPageable)
                .register_above(None),
        )?;
        let want = config.threads.saturating_mul(config.in_flight_per_thread);
        match pool.reserve(config.chunk_bytes, want) {
            Ok(got) if got < want => {
                tracing::debug!(target: "longshore::transfer", device = %device.id(), want, got, "staging chunks reserved up to the budget")
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(target: "longshore::transfer", device = %device.id(), error = %e, "could not reserve staging chunks ahead; uploads will allocate them")
            }
        }
        let workers = if config.threads > 1 {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(config.threads - 1)
                .thread_name(|i| format!("longshore-stage-{i}"))
                .build()
                .map_err(|e| {
                    TransferError::Invalid(format!(
                        "could not start {} staging threads: {e}",
                        config.threads - 1
                    ))
                })?;
            Some(pool)
        } else {
            None
        };
        Ok(Self {
            device: device.id(),
            config,
            pool,
            workers,
        })
    }

    /// The device this stager uploads to.
    pub fn device_id(&self) -> DeviceId {
        self.device
    }

    /// The settings.
    pub fn config(&self) -> &StagingConfig {
        &self.config
    }

    /// The pool of chunks (its [`stats`](PinnedPool::stats) show reuse and fallbacks).
    pub fn pool(&self) -> &PinnedPool {
        &self.pool
    }

    /// Stages `src` into `dst` at `offset` on `stream`; returns the event of the last chunk.
    /// When this returns, `src` has been consumed.
    pub fn upload(
        &self,
        stream: &Stream,
        src: &[u8],
        dst: &mut DeviceBuffer,
        offset: usize,
    ) -> Result<Event> {
        for (what, id) in [
            ("the stream", stream.device().id()),
            ("the destination buffer", dst.device().id()),
        ] {
            if id != self.device {
                return Err(TransferError::DeviceMismatch {
                    op: "staged upload",
                    what,
                    expected: self.device,
                    found: id,
                });
            }
        }
        if offset
            .checked_add(src.len())
            .is_none_or(|end| end > dst.len())
        {
            return Err(TransferError::OutOfBounds {
                op: "staged upload",
                bytes: src.len(),
                offset,
                capacity: dst.len(),
            });
        }
        dst.before_write(stream)?;
        self.upload_raw(stream, src, dst, offset)?;
        let ev = stream.record()?;
        dst.after_write(&ev);
        Ok(ev)
    }

    /// The staging loop, without checks or tracking.
    pub(crate) fn upload_raw(
        &self,
        stream: &Stream,
        src: &[u8],
        dst: &DeviceBuffer,
        offset: usize,
    ) -> Result<()> {
        let chunk = self.config.chunk_bytes;
        let n = src.len().div_ceil(chunk);
        let threads = self.config.threads.min(n).max(1);
        let depth = self.config.in_flight_per_thread;
        let next = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        let failure: Mutex<Option<TransferError>> = Mutex::new(None);
        let fail = |e: TransferError| {
            stop.store(true, Ordering::Relaxed);
            failure
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert(e);
        };
        let work = || {
            let mut in_flight: VecDeque<Event> = VecDeque::with_capacity(depth);
            while !stop.load(Ordering::Relaxed) {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                if in_flight.len() >= depth {
                    if let Some(oldest) = in_flight.pop_front() {
                        if let Err(e) = oldest.synchronize() {
                            fail(e);
                            break;
                        }
                    }
                }
                let start = i * chunk;
                let end = (start + chunk).min(src.len());
                match self.stage_chunk(stream, &src[start..end], dst, offset + start) {
                    Ok(ev) => in_flight.push_back(ev),
                    Err(e) => {
                        fail(e);
                        break;
                    }
                }
            }
        };
        tracing::trace!(target: "longshore::transfer", stream_id = stream.id(), bytes = src.len(), chunks = n, threads, "staged upload");
        match &self.workers {
            Some(workers) if threads > 1 => workers.in_place_scope(|s| {
                for _ in 1..threads {
                    s.spawn(|_| work());
                }
                work();
            }),
            _ => work(),
        }
        match failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn stage_chunk(
        &self,
        stream: &Stream,
        src: &[u8],
        dst: &DeviceBuffer,
        offset: usize,
    ) -> Result<Event> {
        let mut lease = self.pool.alloc(src.len())?;
        lease.as_bytes_mut().copy_from_slice(src);
        let ptr = HostPtr {
            ptr: lease.as_bytes().as_ptr(),
            len: src.len(),
        };
        // SAFETY: the lease is dropped below only after the copy's event has been recorded on
        // it, and the pool (or, for a pageable fallback, HostBuffer's drop) neither reuses nor
        // frees a block before its fences complete; nobody writes it in between.
        unsafe { stream.enqueue_htod_raw(ptr, dst, offset) }?;
        let ev = stream.record()?;
        lease.record_fence(ev.to_fence());
        drop(lease);
        Ok(ev)
    }
}
