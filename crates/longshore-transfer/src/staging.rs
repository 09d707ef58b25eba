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
#[cfg(feature = "cuda")]
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

#[cfg(feature = "cuda")]
use longshore_host::PoolBuffer;
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
    /// per-operation latencies. Empty on `Cpu`, whose pieces go on the caller's stream.
    #[cfg(feature = "cuda")]
    lanes: Vec<Arc<cudarc::driver::CudaStream>>,
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
        #[cfg(feature = "cuda")]
        let lanes = match device.cuda_device() {
            Some(cu) => (0..config.threads)
                .map(|_| cu.new_stream())
                .collect::<Result<Vec<_>>>()?,
            None => Vec::new(),
        };
        Ok(Self {
            device: device.id(),
            config,
            pool,
            workers,
            #[cfg(feature = "cuda")]
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

    /// The staging loop, without checks or tracking.
    pub(crate) fn upload_raw(
        &self,
        stream: &Stream,
        src: &[u8],
        dst: &DeviceBuffer,
        offset: usize,
    ) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let (
            crate::stream::StreamBackend::Cuda { dev, stream: cu },
            crate::buffer::DeviceMem::Cuda(mem),
        ) = (stream.backend(), &dst.mem)
        {
            if self.lanes.len() >= self.config.threads {
                return self.upload_lanes(stream, dev, cu, src, mem.ptr + offset as u64);
            }
        }
        let chunk = self.piece_bytes(src.len());
        let n = src.len().div_ceil(chunk);
        let threads = self.config.threads.min(n).max(1);
        let depth = self.config.in_flight_per_thread;
        let next = AtomicUsize::new(0);
        let failure = FirstError::default();
        let fail = |e: TransferError| failure.record(e);
        let work = || {
            let mut in_flight: VecDeque<Event> = VecDeque::with_capacity(depth);
            while !failure.stopped() {
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
        tracing::trace!(target: "longshore::transfer", stream_id = stream.id(), bytes = src.len(), piece = chunk, pieces = n, threads, "staged upload");
        match &self.workers {
            Some(workers) if threads > 1 => workers.in_place_scope(|s| {
                for _ in 1..threads {
                    s.spawn(|_| work());
                }
                work();
            }),
            _ => work(),
        }
        failure.into_result()
    }

    /// The CUDA path: thread `t` stages its pieces on lane stream `t`. The lanes first wait for
    /// the work already on `stream` (an event, no host wait), and `stream` then waits for every
    /// lane, so the upload is ordered on `stream` exactly as if it had been enqueued there.
    #[cfg(feature = "cuda")]
    fn upload_lanes(
        &self,
        stream: &Stream,
        dev: &Arc<crate::backend::cuda::CudaDevice>,
        cu: &Arc<cudarc::driver::CudaStream>,
        src: &[u8],
        dst: u64,
    ) -> Result<()> {
        use crate::backend::cuda::{CuEvent, err};
        use crate::event::EventInner;

        let piece = self.piece_bytes(src.len());
        let n = src.len().div_ceil(piece);
        let threads = self.config.threads.min(n).max(1);
        let depth = self.config.in_flight_per_thread;
        dev.bind()?;
        let start = CuEvent::record(dev, cu, stream.id())?;
        let next = AtomicUsize::new(0);
        let failure = FirstError::default();
        let fail = |e: TransferError| failure.record(e);
        let lane_err = |call: &'static str, e, what: String| err(call, e, dev.ordinal, what);
        // One lane's share: its pieces, then the event the caller's stream waits for. A lane
        // leases `depth` blocks once and cycles through them (double buffering by default):
        // before a block is refilled, the event recorded after its last copy is waited for,
        // so a piece costs a memcpy, a copy call and an event record, and no pool traffic.
        let work = |lane: &Arc<cudarc::driver::CudaStream>| -> Option<CuEvent> {
            let ring = (|| -> Result<Vec<(PoolBuffer, CuEvent, bool)>> {
                dev.bind()?;
                lane.wait(start.raw()).map_err(|e| {
                    lane_err("cuStreamWaitEvent", e, "ordering a staging lane".into())
                })?;
                (0..depth)
                    .map(|_| {
                        Ok((
                            self.pool.alloc(self.config.chunk_bytes)?,
                            CuEvent::create(dev)?,
                            false,
                        ))
                    })
                    .collect()
            })();
            let mut ring = match ring {
                Ok(r) => r,
                Err(e) => {
                    fail(e);
                    return None;
                }
            };
            let mut k = 0usize;
            while !failure.stopped() {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let (block, ev, used) = &mut ring[k % depth];
                k += 1;
                let begin = i * piece;
                let part = &src[begin..(begin + piece).min(src.len())];
                let staged = (|| {
                    if *used {
                        ev.synchronize()?;
                    }
                    block.as_bytes_mut()[..part.len()].copy_from_slice(part);
                    // SAFETY: `dst + begin .. + part.len()` lies in the destination buffer
                    // (the caller checked the whole range) in this lane's context. The block
                    // is not written again before `ev`, recorded just below, has completed
                    // (waited for above on its next turn), and goes back to the pool with
                    // `ev` as its fence, so it is neither reused nor freed under the copy.
                    unsafe {
                        crate::backend::cuda::htod(
                            lane,
                            dst + begin as u64,
                            block.as_bytes().as_ptr(),
                            part.len(),
                        )
                    }
                    .map_err(|e| {
                        lane_err(
                            "cuMemcpyHtoDAsync",
                            e,
                            format!("staging {} bytes at offset {begin}", part.len()),
                        )
                    })?;
                    *used = true; // a copy is in flight from here on
                    ev.rerecord(lane, stream.id()).inspect_err(|_| {
                        // `ev` still marks the block's previous copy and would let the block
                        // go before this one: wait for the lane instead.
                        let _ = lane.synchronize();
                    })
                })();
                if let Err(e) = staged {
                    fail(e);
                    break;
                }
            }
            // The blocks go back fenced by their last copies' events. Even after a failure,
            // the caller's stream must not run ahead of what this lane has enqueued.
            let done = CuEvent::record(dev, lane, stream.id());
            for (mut block, ev, used) in ring {
                if used {
                    let fence =
                        Event::new(EventInner::Cuda(Arc::new(ev)), self.device, stream.id());
                    block.record_fence(fence.to_fence());
                }
                drop(block);
            }
            match done {
                Ok(done) => Some(done),
                Err(e) => {
                    // Nothing can order the caller's stream after this lane: wait here.
                    let _ = lane.synchronize();
                    fail(e);
                    None
                }
            }
        };
        tracing::trace!(target: "longshore::transfer", stream_id = stream.id(), bytes = src.len(), piece, pieces = n, lanes = threads, "staged upload");
        let done: Mutex<Vec<CuEvent>> = Mutex::new(Vec::with_capacity(threads));
        let run = |t: usize| {
            if let Some(ev) = work(&self.lanes[t]) {
                done.lock().unwrap_or_else(|p| p.into_inner()).push(ev);
            }
        };
        match &self.workers {
            Some(workers) if threads > 1 => workers.in_place_scope(|s| {
                for t in 1..threads {
                    let run = &run;
                    s.spawn(move |_| run(t));
                }
                run(0);
            }),
            _ => run(0),
        }
        for ev in done.into_inner().unwrap_or_else(|p| p.into_inner()) {
            if let Err(e) = cu.wait(ev.raw()) {
                // Nothing else can order the caller's stream after this lane: wait here.
                tracing::error!(target: "longshore::transfer", error = ?e.0, "cuStreamWaitEvent on a staging lane failed; waiting on the host");
                let _ = ev.synchronize();
                fail(lane_err(
                    "cuStreamWaitEvent",
                    e,
                    "joining a staging lane".into(),
                ));
            }
        }
        failure.into_result()
    }

    fn stage_chunk(
        &self,
        stream: &Stream,
        src: &[u8],
        dst: &DeviceBuffer,
        offset: usize,
    ) -> Result<Event> {
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
        unsafe { stream.enqueue_htod_raw(ptr, dst, offset) }?;
        let ev = stream.record()?;
        lease.record_fence(ev.to_fence());
        drop(lease);
        Ok(ev)
    }
}

/// The first error of the threads of one upload; once one is recorded the others stop.
#[derive(Default)]
struct FirstError {
    stop: AtomicBool,
    first: Mutex<Option<TransferError>>,
}

impl FirstError {
    fn record(&self, e: TransferError) {
        self.stop.store(true, Ordering::Relaxed);
        self.first
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(e);
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn into_result(self) -> Result<()> {
        match self.first.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
