//! Pageable uploads staged through pooled page-locked chunks by several threads.
//!
//! From pageable memory the CUDA driver copies through one small hidden bounce buffer with one
//! thread: two copies in series, 8.5 GB/s at 256 MiB on the reference host against 55 GB/s from
//! page-locked memory. A [`Stager`] splits the source into pieces, and `threads` threads each
//! `memcpy` a piece into a page-locked block leased from its [`PinnedPool`], enqueue the DMA of
//! that piece, and go on with the next piece while earlier ones are in flight.
//!
//! On CUDA each thread has its own stream (a "lane") and a ring of `in_flight_per_thread`
//! blocks leased once per upload (double buffering by default): before a block is refilled the
//! event recorded after its last copy is waited for, so a piece costs a `memcpy`, a copy call
//! and an event record, with no pool traffic and no thread queueing behind another's copies on
//! one stream. The lanes wait for the caller's stream first and the caller's stream waits for
//! every lane after, so the upload is ordered on the caller's stream as if enqueued there. The
//! blocks go back to the pool fenced by their last copies' events: reused only after those
//! DMAs complete. On the `Cpu` device the pieces go on the caller's stream, each block leased
//! per piece and returned with the piece's event.
//!
//! Piece size. The DMA cannot start before the first piece is copied, and at the end every
//! thread's last piece waits for the DMA of the others: large pieces waste time on mid-sized
//! uploads, small ones pay a fixed cost per piece. Each upload is cut into about
//! [`StagingConfig::PIECES_PER_THREAD`] pieces a thread, between `min_chunk_bytes` and
//! `chunk_bytes` (measured with the `staging-sweep` bench binary on an H200 host, 8 threads:
//! 1 MiB pieces are best at 8-16 MiB, 2 MiB at 64 MiB, 4 MiB at 256 MiB; 256 KiB pieces cap
//! near 20 GB/s whatever the size). Blocks are always `chunk_bytes` long, so every lease is
//! the one size class the stager reserved.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use longshore_host::{BudgetPolicy, MemoryKind, PinnedPool, PoolConfig};

use crate::backend::stage::{FirstError, Plan};
use crate::backend::{EventImpl, HostPtr, Lanes, MemImpl, StreamImpl};
use crate::device::Device;
use crate::error::{Result, TransferError};
use crate::id::DeviceId;

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
    /// Bytes per page-locked block, the largest piece an upload is cut into (default 4 MiB).
    pub chunk_bytes: usize,
    /// The smallest piece (default 1 MiB; at most `chunk_bytes`): below it, the fixed cost per
    /// piece outweighs a shorter pipeline fill.
    pub min_chunk_bytes: usize,
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

    /// How many pieces a staged upload gives each thread (fewer where `min_chunk_bytes` says
    /// so); see [`Stager::piece_bytes`].
    pub const PIECES_PER_THREAD: usize = 4;
}

impl Default for StagingConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2);
        Self {
            chunk_bytes: 4 << 20,
            min_chunk_bytes: 1 << 20,
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
    /// On CUDA, one stream per copying thread: pieces from different threads do not queue
    /// behind each other's copy and event on one stream, and the driver overlaps their
    /// per-operation latencies. None on `Cpu`, whose pieces go on the caller's stream.
    lanes: Lanes,
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
        if config.min_chunk_bytes == 0 || config.min_chunk_bytes > config.chunk_bytes {
            return Err(TransferError::Invalid(format!(
                "staging needs 0 < min_chunk_bytes <= chunk_bytes, got {} and {}",
                config.min_chunk_bytes, config.chunk_bytes
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
        let lanes = device.shared.backend.new_lanes(config.threads)?;
        Ok(Self {
            device: device.id(),
            config,
            pool,
            workers,
            lanes,
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

    /// The piece size for an upload of `len` bytes: about
    /// [`PIECES_PER_THREAD`](StagingConfig::PIECES_PER_THREAD) pieces a
    /// thread, within `min_chunk_bytes..=chunk_bytes`, in whole 64 KiB (or whole
    /// `min_chunk_bytes`, if smaller).
    ///
    /// ```
    /// # use longshore_transfer::{Device, Stager, StagingConfig};
    /// let config = StagingConfig { threads: 8, ..StagingConfig::default() }; // 1..=4 MiB
    /// let stager = Stager::new(&Device::cpu(), config)?;
    /// assert_eq!(stager.piece_bytes(64 << 20), 2 << 20);  // 32 pieces, 4 a thread
    /// assert_eq!(stager.piece_bytes(100 << 20), 3200 << 10);
    /// assert_eq!(stager.piece_bytes(1 << 30), 4 << 20);   // capped by chunk_bytes
    /// assert_eq!(stager.piece_bytes(4096), 1 << 20);      // at least min_chunk_bytes
    /// # Ok::<(), longshore_transfer::TransferError>(())
    /// ```
    pub fn piece_bytes(&self, len: usize) -> usize {
        let c = &self.config;
        let grain = c.min_chunk_bytes.min(64 << 10);
        let want = len.div_ceil(c.threads.saturating_mul(StagingConfig::PIECES_PER_THREAD));
        let rounded = want.div_ceil(grain).saturating_mul(grain);
        rounded.clamp(c.min_chunk_bytes, c.chunk_bytes)
    }

    /// The staging loop, without checks or tracking: on the lanes where the backend has them,
    /// otherwise on `stream`, each piece's block leased and returned with the piece's event.
    pub(crate) fn upload_raw(
        &self,
        stream: &StreamImpl,
        stream_id: u64,
        src: &[u8],
        dst: (&MemImpl, usize),
    ) -> Result<()> {
        let piece = self.piece_bytes(src.len());
        let pieces = src.len().div_ceil(piece);
        let plan = Plan {
            pool: &self.pool,
            block_bytes: self.config.chunk_bytes,
            piece,
            pieces,
            threads: self.config.threads.min(pieces).max(1),
            threads_max: self.config.threads,
            depth: self.config.in_flight_per_thread,
            workers: self.workers.as_ref(),
            stream_id,
        };
        if let Some(done) = self.lanes.upload(&plan, stream, src, dst) {
            return done;
        }
        let next = AtomicUsize::new(0);
        let failure = FirstError::default();
        let fail = |e: TransferError| failure.record(e);
        let work = |_thread: usize| {
            let mut in_flight: VecDeque<EventImpl> = VecDeque::with_capacity(plan.depth);
            while !failure.stopped() {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= pieces {
                    break;
                }
                if in_flight.len() >= plan.depth
                    && let Some(oldest) = in_flight.pop_front()
                    && let Err(e) = oldest.synchronize()
                {
                    fail(e);
                    break;
                }
                let range = plan.range(i, src.len());
                let at = dst.1 + range.start;
                match self.stage_chunk(stream, &src[range], (dst.0, at)) {
                    Ok(ev) => in_flight.push_back(ev),
                    Err(e) => {
                        fail(e);
                        break;
                    }
                }
            }
        };
        tracing::trace!(target: "longshore::transfer", stream_id, bytes = src.len(), piece, pieces, threads = plan.threads, "staged upload");
        plan.run(work);
        failure.into_result()
    }

    fn stage_chunk(
        &self,
        stream: &StreamImpl,
        src: &[u8],
        dst: (&MemImpl, usize),
    ) -> Result<EventImpl> {
        // Always a whole block, whatever the piece: one size class, the one reserved.
        let mut lease = self.pool.alloc(self.config.chunk_bytes)?;
        lease.as_bytes_mut()[..src.len()].copy_from_slice(src);
        let ptr = HostPtr {
            ptr: lease.as_bytes().as_ptr(),
            len: src.len(),
        };
        // SAFETY: the lease is dropped below only after the copy's event has been recorded on
        // it, and the pool (or, for a pageable fallback, HostBuffer's drop) neither reuses nor
        // frees a block before its fences complete; nobody writes it in between.
        unsafe { stream.htod(dst.0, dst.1, ptr) }?;
        let ev = stream.record()?;
        lease.record_fence(Arc::new(ev.clone()));
        drop(lease);
        Ok(ev)
    }
}

/// A device's default stager, kept in the device's local state.
#[derive(Default)]
struct DefaultStager(Mutex<Option<Arc<Stager>>>);

impl Device {
    fn default_stager_slot(&self) -> Result<Arc<DefaultStager>> {
        self.local(|| Ok(DefaultStager::default()))
    }

    /// The device's default [`Stager`] for pageable uploads (created on first use with
    /// [`StagingConfig::default`]).
    pub fn stager(&self) -> Result<Arc<Stager>> {
        let slot = self.default_stager_slot()?;
        let mut guard = slot.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = &*guard {
            return Ok(s.clone());
        }
        let s = Arc::new(Stager::new(self, StagingConfig::default())?);
        *guard = Some(s.clone());
        Ok(s)
    }

    /// The size from which [`UploadMode::Auto`] stages an upload: the default stager's
    /// `auto_min_bytes`, without making the stager (and reserving its page-locked chunks) for
    /// an upload that will not use it.
    pub(crate) fn auto_stage_min_bytes(&self) -> usize {
        self.local_if_made::<DefaultStager>()
            .and_then(|slot| {
                let guard = slot.0.lock().unwrap_or_else(|p| p.into_inner());
                guard.as_ref().map(|s| s.config().auto_min_bytes)
            })
            .unwrap_or(StagingConfig::DEFAULT_AUTO_MIN_BYTES)
    }

    /// Replaces the device's default [`Stager`] (e.g. with other chunk sizes or thread counts).
    pub fn set_stager(&self, stager: Arc<Stager>) -> Result<()> {
        if stager.device_id() != self.id() {
            return Err(TransferError::DeviceMismatch {
                op: "set_stager",
                what: "the stager",
                expected: self.id(),
                found: stager.device_id(),
            });
        }
        let slot = self.default_stager_slot()?;
        *slot.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(stager);
        Ok(())
    }
}
