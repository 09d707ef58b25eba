//! Distributed jobs: the device this process should drive, from the launcher's environment.
//!
//! longshore plugs into the launchers users already have (torchrun, SLURM's `srun`,
//! `mpirun`); see [`longshore_data::DistEnv`] for the variables read. Each rank builds its
//! loader with its share of the data:
//!
//! ```
//! use longshore_data::{DistEnv, DistributedSampler, VecDataset};
//! use longshore_loader::DataLoader;
//!
//! let data = VecDataset::new((0..100u32).map(|i| ([i],)).collect::<Vec<_>>());
//! // torchrun --nproc-per-node 2 sets RANK/WORLD_SIZE/LOCAL_RANK; a plain run is rank 0 of 1.
//! let sampler = DistributedSampler::from_env(100, true, 42, false)?;
//! let device = longshore_loader::dist::local_device()?;
//! let loader = DataLoader::builder(data).sampler(sampler).batch_size(10).build()?;
//! loader.set_epoch(0); // reaches the DistributedSampler, as sampler.set_epoch in PyTorch
//! # let _ = device;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! **Resuming across ranks**: every rank's [`state_dict`](crate::DataLoader::state_dict)
//! describes only its own position. Save them together, one per rank (e.g.
//! `checkpoint/loader-rank{RANK}.json` next to the model, written by each rank, or gathered to
//! rank 0), and have each rank restore its own after the restart with the same world size.
//!
//! **Gradients across ranks**: the `train` example's support crate `longshore-collective`
//! (`examples/support/collective`, not part of the library) has a `Communicator` whose
//! `all_reduce_sum` sums a device buffer over every rank in place: NCCL on the GPU of
//! [`local_device`], its unique id shared through
//! `Rendezvous::torchrun(MASTER_ADDR, MASTER_PORT, ..)` (rank 0 listens on `MASTER_PORT + 1`,
//! since torchrun's own store holds `MASTER_PORT`) or a shared file; or a `CpuGroup` of ranks
//! as threads on the Cpu device, to test data-parallel code without GPUs. The `train` example
//! (`--distributed`, `--world-cpu N`) puts the pieces together, reading the launcher's
//! variables with [`DistEnv`] (`longshore_examples::dist`).

use longshore_data::DistEnv;
use longshore_transfer::Device;

use crate::error::LoaderError;

/// The device this process should drive: GPU `LOCAL_RANK` (or `SLURM_LOCALID`, ...) when a
/// launcher set one, GPU 0 in a single-process run, and the Cpu device when no CUDA device is
/// available (logged).
pub fn local_device() -> Result<Device, LoaderError> {
    let env = DistEnv::from_env()?;
    let ordinal = env.as_ref().map_or(0, |e| e.local_rank);
    if Device::cuda_count() == 0 {
        tracing::warn!(target: "longshore::loader", reason = ?longshore_host::driver_unavailable_reason(), "no CUDA device: using the Cpu device");
        return Ok(Device::cpu());
    }
    Ok(Device::cuda(ordinal)?)
}
