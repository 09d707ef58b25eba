//! The launcher's view of a distributed job: which rank this process is, of how many, and
//! which GPU of its node it drives — read from the environment that torchrun, SLURM's `srun`
//! or `mpirun` set, so a [`DistributedSampler`] is configured in one call.
//!
//! | launcher | rank | world size | local rank | rendezvous |
//! | --- | --- | --- | --- | --- |
//! | torchrun | `RANK` | `WORLD_SIZE` | `LOCAL_RANK` | `MASTER_ADDR`, `MASTER_PORT` |
//! | SLURM `srun` | `SLURM_PROCID` | `SLURM_NTASKS` | `SLURM_LOCALID` | `MASTER_ADDR`/`MASTER_PORT` if exported |
//! | Open MPI `mpirun` | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` | `MASTER_ADDR`/`MASTER_PORT` if exported |
//!
//! torchrun's variables win when several sets are present (torchrun inside a SLURM allocation
//! sets both, and its own are the ones that describe this process).

use crate::DataError;
use crate::sampler::DistributedSampler;

/// Which launcher set the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Launcher {
    /// torchrun (`torch.distributed.run`) or anything setting its variables.
    Torchrun,
    /// SLURM's `srun`.
    Slurm,
    /// Open MPI's `mpirun`.
    OpenMpi,
}

/// This process's place in a distributed job.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DistEnv {
    /// Global rank, `0..world_size`.
    pub rank: usize,
    /// Number of processes.
    pub world_size: usize,
    /// Rank within this node: the GPU ordinal to use.
    pub local_rank: usize,
    /// Rendezvous host (rank 0's address), when set.
    pub master_addr: Option<String>,
    /// Rendezvous port, when set.
    pub master_port: Option<u16>,
    /// Who set the variables.
    pub launcher: Launcher,
}

impl DistEnv {
    /// Reads the process environment. `Ok(None)` when no launcher variables are set (a
    /// single-process run); an error names a variable that is set but invalid.
    pub fn from_env() -> Result<Option<DistEnv>, DataError> {
        DistEnv::from_vars(|k| std::env::var(k).ok())
    }

    /// Reads the variables through `var` (for tests and for custom launchers).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<DistEnv>, DataError> {
        let sets: [(Launcher, &str, &str, &str); 3] = [
            (Launcher::Torchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK"),
            (
                Launcher::Slurm,
                "SLURM_PROCID",
                "SLURM_NTASKS",
                "SLURM_LOCALID",
            ),
            (
                Launcher::OpenMpi,
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK",
            ),
        ];
        for (launcher, rank_var, size_var, local_var) in sets {
            let (Some(rank), Some(size)) = (var(rank_var), var(size_var)) else {
                continue;
            };
            let rank = parse(rank_var, &rank)?;
            let world_size = parse(size_var, &size)?;
            if world_size == 0 {
                return Err(DataError::arg(
                    "world_size",
                    format!("{size_var} must be at least 1"),
                ));
            }
            if rank >= world_size {
                return Err(DataError::arg(
                    "rank",
                    format!("{rank_var}={rank} must be less than {size_var}={world_size}"),
                ));
            }
            let local_rank = match var(local_var) {
                Some(v) => parse(local_var, &v)?,
                None => 0,
            };
            let master_port = match var("MASTER_PORT") {
                Some(p) => Some(p.trim().parse::<u16>().map_err(|_| {
                    DataError::arg("MASTER_PORT", format!("`{p}` is not a port number"))
                })?),
                None => None,
            };
            return Ok(Some(DistEnv {
                rank,
                world_size,
                local_rank,
                master_addr: var("MASTER_ADDR"),
                master_port,
                launcher,
            }));
        }
        Ok(None)
    }

    /// This process's [`DistributedSampler`] over a dataset of `len` items.
    pub fn sampler(
        &self,
        len: usize,
        shuffle: bool,
        seed: u64,
        drop_last: bool,
    ) -> Result<DistributedSampler, DataError> {
        DistributedSampler::builder(len, self.world_size, self.rank)
            .shuffle(shuffle)
            .seed(seed)
            .drop_last(drop_last)
            .build()
    }
}

fn parse(name: &'static str, v: &str) -> Result<usize, DataError> {
    v.trim()
        .parse::<usize>()
        .map_err(|_| DataError::arg(name, format!("`{v}` is not a non-negative integer")))
}

impl DistributedSampler {
    /// The sampler of this process in a job started by torchrun, `srun` or `mpirun` (see
    /// [`DistEnv`]); a single-process run (no launcher variables) gets replica 0 of 1.
    pub fn from_env(
        len: usize,
        shuffle: bool,
        seed: u64,
        drop_last: bool,
    ) -> Result<DistributedSampler, DataError> {
        match DistEnv::from_env()? {
            Some(env) => env.sampler(len, shuffle, seed, drop_last),
            None => DistributedSampler::builder(len, 1, 0)
                .shuffle(shuffle)
                .seed(seed)
                .drop_last(drop_last)
                .build(),
        }
    }
}
