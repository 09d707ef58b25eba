//! longshore-collective runs collective operations across ranks on longshore device buffers:
//! a [`Communicator`] whose [`all_reduce_sum`](Communicator::all_reduce_sum) adds an f32
//! region of a device buffer across every rank, in place, enqueued on a stream like any
//! operation of [`longshore_ops`].
//!
//! It is a support crate of longshore's example training binaries (`examples/`, the
//! data-parallel `train`), not part of the library and not published.
//!
//! ```
//! use longshore_transfer::Device;
//! use longshore_collective::CpuGroup;
//! use longshore_ops::ViewMut;
//!
//! // Two ranks as two threads, each with its own Cpu-device stream.
//! let group = CpuGroup::new(2)?;
//! let sums = std::thread::scope(|s| {
//!     let handles: Vec<_> = (0..2)
//!         .map(|rank| {
//!             let group = group.clone();
//!             s.spawn(move || {
//!                 let comm = group.join(rank)?;
//!                 let stream = Device::cpu().new_stream()?;
//!                 let mut grad = stream.to_device(&[rank as f32 + 1.0, 10.0])?;
//!                 comm.all_reduce_sum(&stream, ViewMut::from(&mut grad), 2)?;
//!                 let sum = stream.read_to_vec::<f32>(&grad)?;
//!                 comm.check()?;
//!                 Ok::<_, longshore_collective::CollectiveError>(sum)
//!             })
//!         })
//!         .collect();
//!     handles.into_iter().map(|h| h.join().unwrap()).collect::<Result<Vec<_>, _>>()
//! })?;
//! assert_eq!(sums, vec![vec![3.0, 20.0], vec![3.0, 20.0]]);
//! # Ok::<(), longshore_collective::CollectiveError>(())
//! ```
//!
//! # Backends
//!
//! * **Cpu** ([`CpuGroup`]): N ranks in one process, as N threads each driving its own
//!   Cpu-device stream. The all-reduce is a job on each rank's stream thread: it deposits its
//!   values, the last rank to arrive adds every deposit **in rank order** (so every rank gets
//!   bit-identical results, whatever the arrival order), and every rank copies the sum back.
//!   A rank that drops its communicator (or whose thread ends) while others still wait makes
//!   them fail with an error naming it; a rank that does not arrive within the group's timeout
//!   makes every rank fail, naming the missing ranks. Nothing waits forever. This backend lets
//!   data-parallel training be tested without GPUs.
//! * **CUDA** ([`Communicator::nccl`]): NCCL's `ncclAllReduce` (sum, f32, in place) on the
//!   stream's `CUstream`, one process (or thread) per GPU. libnccl is loaded at run time; when
//!   it cannot be, [`nccl_available`] and every constructor return an error naming the library,
//!   never a panic. The ranks share NCCL's [`UniqueId`] through a [`Rendezvous`]: over TCP
//!   (rank 0 listens, the others connect with retries) or through a shared file.
//!
//! # Launchers
//!
//! Under torchrun (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`), use
//! [`Rendezvous::torchrun`]: the unique id travels over `MASTER_ADDR:(MASTER_PORT + 1)`, because
//! torchrun's own TCP store already listens on `MASTER_PORT`. Where that port is not free, or
//! the ranks share a file system but not a network, use [`Rendezvous::File`] (the `train`
//! example reads `LONGSHORE_NCCL_ID_FILE`). Reading the launcher's variables lives above this
//! crate (`longshore_data::DistEnv`), so this module takes rank, world size and address as
//! arguments.
//!
//! # Ordering and errors
//!
//! An all-reduce takes part in the buffer's cross-stream tracking like an operation of
//! [`longshore_ops`] (it writes the buffer). Every rank must issue the same all-reduces, with
//! the same lengths, in the same order. A failure of an enqueued all-reduce cannot be returned
//! by the call that enqueued it: it is kept on the communicator and returned by the next call,
//! and by [`check`](Communicator::check) (call it after synchronising the stream). After a
//! failure the buffer holds this rank's own values, not a sum.
//!
//! # When a rank dies (CUDA)
//!
//! NCCL's kernels wait for every rank, so without help the survivors of a dead rank would
//! spin forever, and so would any host thread synchronising their streams. Each NCCL
//! communicator has a watchdog thread that looks every 100 ms at:
//! * the other ranks: after the TCP rendezvous ([`Rendezvous::Tcp`], torchrun's) every rank
//!   keeps its connection to rank 0 open. A process's sockets close when it dies, however it
//!   dies, so rank 0 sees which rank is gone and tells the others (whose own connection's end
//!   means rank 0 died). A dead rank is named within about 0.2 s;
//! * NCCL's asynchronous error of the communicator;
//! * the oldest all-reduce not yet complete, against the timeout (300 s by default,
//!   [`Communicator::set_timeout`]): the only bound with [`Rendezvous::File`] or
//!   [`Communicator::nccl`], which keep no connections.
//!
//! On any of these it aborts the communicator (`ncclCommAbort`), which makes its kernels
//! return, so the blocked stream and the thread waiting on it go on; the next
//! [`all_reduce_sum`](Communicator::all_reduce_sum) and [`check`](Communicator::check) return
//! a [`CollectiveError::Rank`] naming the rank, e.g. "rank 1 of 2 died (its connection to
//! rank 0 closed without a goodbye)". A rank that drops its communicator says goodbye: if the
//! others still wait on an all-reduce they fail naming it ("left"); if not, only their next
//! all-reduce fails.

//!
//! # Built on transfer's public seams
//!
//! Like longshore-ops, this crate reaches longshore-transfer only through its public API: the
//! all-reduce is enqueued with [`Stream::enqueue_work`] (ordered after the buffer's earlier
//! uses, recorded as its latest use), on the `CUstream` of [`Stream::as_raw`] with the
//! buffer's [`DeviceBuffer::cuda_device_ptr`] (NCCL), or as a job on the `Cpu` stream's
//! executor thread over [`DeviceBuffer::cpu_memory`]; libnccl is found by
//! [`cuda_libs`](longshore_transfer::cuda_libs) from this crate's [`NCCL`] spec. Errors are
//! this crate's [`CollectiveError`]: [`Rank`](CollectiveError::Rank) for what a rank or the
//! rendezvous did, [`Transfer`](CollectiveError::Transfer) for longshore-transfer's errors
//! (arguments, devices, NCCL not loadable as `LibraryUnavailable`).

// Unsafe code only in the NCCL FFI module, each block with its SAFETY comment.
#![deny(unsafe_code)]

mod bootstrap;
mod cpu;
mod error;
mod liveness;
#[allow(unsafe_code)]
mod nccl;

use longshore_ops::ViewMut;
use longshore_transfer::{DeviceBuffer, DeviceId, Stream, TransferError};

pub use bootstrap::{Rendezvous, share_unique_id};
pub use cpu::CpuGroup;
pub use error::{CollectiveError, Result};
pub use nccl::{NCCL, UniqueId, nccl_available};

/// One rank's handle on a group of ranks that run collective operations together.
///
/// Made by [`CpuGroup::join`] (ranks as threads on the Cpu device) or [`Communicator::nccl`]
/// / [`Communicator::nccl_rendezvous`] (one GPU per rank). `Send + Sync`; calls from several
/// threads are serialised.
#[derive(Debug)]
pub struct Communicator {
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    Cpu(cpu::CpuRank),
    Nccl(nccl::NcclComm),
}

impl Communicator {
    /// This rank, `0..world_size`.
    pub fn rank(&self) -> usize {
        match &self.inner {
            Inner::Cpu(c) => c.rank(),
            Inner::Nccl(c) => c.rank,
        }
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        match &self.inner {
            Inner::Cpu(c) => c.world_size(),
            Inner::Nccl(c) => c.world,
        }
    }

    /// The device whose streams and buffers this communicator works on.
    pub fn device(&self) -> DeviceId {
        match &self.inner {
            Inner::Cpu(_) => DeviceId::Cpu,
            Inner::Nccl(c) => DeviceId::Cuda(c.ordinal()),
        }
    }

    /// A communicator over NCCL for `rank` of `world_size`, on `stream`'s CUDA device, from a
    /// [`UniqueId`] that rank 0 made with [`UniqueId::new`] and shared with every rank (see
    /// [`share_unique_id`]). Blocks until every rank has called it (`ncclCommInitRank`).
    pub fn nccl(stream: &Stream, rank: usize, world_size: usize, id: &UniqueId) -> Result<Self> {
        let DeviceId::Cuda(ordinal) = stream.device().id() else {
            return Err(TransferError::Invalid(
                "an NCCL communicator needs a CUDA stream; on the Cpu device use CpuGroup"
                    .to_owned(),
            )
            .into());
        };
        validate_rank("nccl init", rank, world_size)?;
        Ok(Self {
            inner: Inner::Nccl(nccl::NcclComm::init(ordinal, rank, world_size, id, None)?),
        })
    }

    /// [`nccl`](Communicator::nccl) with the unique id made by rank 0 and shared through
    /// `rendezvous` ([`share_unique_id`]). With [`Rendezvous::File`], rank 0 removes the file
    /// once every rank has joined.
    pub fn nccl_rendezvous(
        stream: &Stream,
        rank: usize,
        world_size: usize,
        rendezvous: &Rendezvous,
    ) -> Result<Self> {
        validate_rank("nccl init", rank, world_size)?;
        let DeviceId::Cuda(ordinal) = stream.device().id() else {
            return Err(TransferError::Invalid(
                "an NCCL communicator needs a CUDA stream; on the Cpu device use CpuGroup"
                    .to_owned(),
            )
            .into());
        };
        // Fail before the rendezvous (which other ranks wait on) when NCCL is missing here.
        nccl::require(ordinal)?;
        let (id, links) = bootstrap::share(rank, world_size, rendezvous, UniqueId::new)?;
        let watch = |e: std::io::Error| CollectiveError::Rank {
            op: "nccl rendezvous",
            rank,
            world_size,
            reason: format!("watching the other ranks' connections: {e}"),
        };
        let liveness = match links {
            bootstrap::Links::None => None,
            bootstrap::Links::Rank0(conns) => {
                Some(liveness::Liveness::rank0(conns).map_err(watch)?)
            }
            bootstrap::Links::Peer(conn) => Some(liveness::Liveness::peer(conn).map_err(watch)?),
        };
        let comm = Self {
            inner: Inner::Nccl(nccl::NcclComm::init(
                ordinal, rank, world_size, &id, liveness,
            )?),
        };
        if rank == 0 {
            rendezvous.cleanup();
        }
        Ok(comm)
    }

    /// Enqueues on `stream` the sum over every rank of `len_f32` f32 values of `buf`, written
    /// back into `buf` on every rank (in place).
    ///
    /// Checked on the host before anything is enqueued: the region fits the buffer and is
    /// 4-byte aligned, the stream and the buffer are on this communicator's device. A failure
    /// while the all-reduce runs (a rank left, timed out, or had another length) is returned by
    /// the next call and by [`check`](Communicator::check); see the [module docs](self).
    pub fn all_reduce_sum(&self, stream: &Stream, buf: ViewMut<'_>, len_f32: usize) -> Result<()> {
        const OP: &str = "all_reduce_sum";
        self.check()?;
        if len_f32 == 0 {
            return Err(TransferError::Invalid(format!("{OP}: len_f32 is 0")).into());
        }
        let expected = self.device();
        let found = stream.device().id();
        if expected != found {
            return Err(TransferError::DeviceMismatch {
                op: OP,
                what: "the stream",
                expected,
                found,
            }
            .into());
        }
        let b: &DeviceBuffer = buf.buffer();
        let r = region(OP, b, buf.offset(), len_f32)?;
        let mismatch = || TransferError::DeviceMismatch {
            op: OP,
            what: "the stream",
            expected,
            found,
        };
        // `enqueue_work`'s closure returns transfer's errors: ours is kept aside and returned
        // after it, once the buffer's use is recorded (as `enqueue_work` does with a failure
        // it is handed).
        let mut refused = None;
        stream.enqueue_work(&[], &[b], || {
            refused = match &self.inner {
                Inner::Cpu(c) => {
                    let mem = b.cpu_memory().ok_or_else(mismatch)?;
                    c.enqueue(stream, mem, r)
                }
                Inner::Nccl(c) => {
                    let ptr = b.cuda_device_ptr().ok_or_else(mismatch)? + r.offset as u64;
                    c.all_reduce(stream, ptr, len_f32)
                }
            }
            .err();
            Ok(())
        })?;
        if let Some(e) = refused {
            return Err(e);
        }
        if let Inner::Nccl(c) = &self.inner {
            // The watchdog bounds how long this all-reduce may stay incomplete.
            c.track(stream.record()?);
        }
        Ok(())
    }

    /// How long an all-reduce may stay incomplete before the communicator gives up on it
    /// (CUDA: the watchdog aborts the NCCL communicator, so a stream blocked behind it is
    /// released, and every later call returns the error). Default 300 s. A rank that dies is
    /// reported much sooner, through the rendezvous connections (see the module docs). The
    /// Cpu backend's bound is its [`CpuGroup`]'s timeout; there this call changes nothing.
    pub fn set_timeout(&self, timeout: std::time::Duration) {
        if let Inner::Nccl(c) = &self.inner {
            c.set_timeout(timeout);
        }
    }

    /// The first error of an all-reduce that has already run (Cpu), or NCCL's asynchronous
    /// error of the communicator (CUDA). Synchronise the stream first to cover everything
    /// enqueued.
    pub fn check(&self) -> Result<()> {
        match &self.inner {
            Inner::Cpu(c) => c.check(),
            Inner::Nccl(c) => c.check(),
        }
    }
}

fn validate_rank(op: &'static str, rank: usize, world_size: usize) -> Result<()> {
    if world_size == 0 || rank >= world_size {
        return Err(CollectiveError::Rank {
            op,
            rank,
            world_size,
            reason: format!("rank {rank} is not in 0..{world_size}"),
        });
    }
    Ok(())
}

/// A checked f32 region of a buffer: its byte offset and length.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Region {
    pub(crate) offset: usize,
    pub(crate) bytes: usize,
}

/// Checks that `len_f32` f32 values at byte `offset` fit `buf` and are 4-byte aligned.
fn region(op: &'static str, buf: &DeviceBuffer, offset: usize, len_f32: usize) -> Result<Region> {
    if !offset.is_multiple_of(4) {
        return Err(TransferError::Invalid(format!(
            "{op}: buf starts at byte offset {offset}, which is not a multiple of its 4-byte \
             element"
        ))
        .into());
    }
    let bytes = len_f32.checked_mul(4);
    match bytes.and_then(|b| offset.checked_add(b).map(|end| (b, end))) {
        Some((bytes, end)) if end <= buf.len() => Ok(Region { offset, bytes }),
        _ => Err(TransferError::OutOfBounds {
            op,
            bytes: bytes.unwrap_or(usize::MAX),
            offset,
            capacity: buf.len(),
        }
        .into()),
    }
}
