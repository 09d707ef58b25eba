//! Distributed runs of the examples: the NCCL communicator of a job started by a launcher
//! (torchrun; or `srun`/`mpirun` with `MASTER_ADDR`/`MASTER_PORT` exported), and N ranks as
//! threads on the Cpu device.
//!
//! NCCL's unique id travels from rank 0 to the other ranks either
//! * over TCP (default): rank 0 listens on `MASTER_PORT + 1` (torchrun's own store listens on
//!   `MASTER_PORT`), the others connect to `MASTER_ADDR:(MASTER_PORT + 1)`, retrying; or
//! * through a file, when `LONGSHORE_NCCL_ID_FILE` names one on a file system every rank sees
//!   (unique per job: a stale file would be read as this job's; rank 0 removes it once every
//!   rank has joined).
//!
//! `LONGSHORE_NCCL_TIMEOUT_S` (default 300) bounds the wait for the other ranks at the
//! rendezvous; `LONGSHORE_COLLECTIVE_TIMEOUT_S` (default 300) bounds one all-reduce (the NCCL
//! communicator's watchdog; a rank that dies is named within about 0.2 s whatever it is).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use longshore::data::DistEnv;
use longshore::transfer::Stream;
use longshore_collective::{Communicator, CpuGroup, Rendezvous};

/// The variable naming the shared file of the file rendezvous.
pub const ID_FILE_VAR: &str = "LONGSHORE_NCCL_ID_FILE";
/// The variable bounding the rendezvous, in seconds.
pub const TIMEOUT_VAR: &str = "LONGSHORE_NCCL_TIMEOUT_S";

/// The variable bounding one all-reduce, in seconds (the communicator's watchdog timeout).
pub const COLLECTIVE_TIMEOUT_VAR: &str = "LONGSHORE_COLLECTIVE_TIMEOUT_S";

/// A positive number of seconds from the variable `name`, if set.
fn seconds_var(name: &str) -> Result<Option<Duration>> {
    match std::env::var(name) {
        Ok(v) => Ok(Some(Duration::from_secs_f64(
            v.trim()
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s > 0.0)
                .with_context(|| format!("{name}=`{v}` is not a positive number"))?,
        ))),
        Err(_) => Ok(None),
    }
}

/// How this job's ranks share NCCL's unique id (see the module docs).
pub fn rendezvous(env: &DistEnv) -> Result<Rendezvous> {
    let timeout = seconds_var(TIMEOUT_VAR)?.unwrap_or(Duration::from_secs(300));
    if let Some(path) = std::env::var_os(ID_FILE_VAR) {
        return Ok(Rendezvous::File {
            path: PathBuf::from(path),
            timeout,
        });
    }
    match (&env.master_addr, env.master_port) {
        (Some(addr), Some(port)) => Ok(Rendezvous::torchrun(addr, port, timeout)?),
        _ => bail!(
            "rank {} of {}: set MASTER_ADDR and MASTER_PORT (torchrun does) or {ID_FILE_VAR} \
             so the ranks can share NCCL's id",
            env.rank,
            env.world_size
        ),
    }
}

/// The launcher's view of this process and its NCCL communicator on `stream`'s GPU (use the
/// device of `longshore::loader::dist::local_device()`). An error outside a launcher.
pub fn communicator_from_env(stream: &Stream) -> Result<(DistEnv, Communicator)> {
    let env = DistEnv::from_env()?.context(
        "no launcher variables (RANK/WORLD_SIZE, SLURM_PROCID/SLURM_NTASKS, ...): start with \
         torchrun --nproc-per-node N --no-python <binary> ...",
    )?;
    let rv = rendezvous(&env)?;
    let comm = Communicator::nccl_rendezvous(stream, env.rank, env.world_size, &rv)
        .with_context(|| format!("creating the NCCL communicator of rank {}", env.rank))?;
    if let Some(t) = seconds_var(COLLECTIVE_TIMEOUT_VAR)? {
        comm.set_timeout(t);
    }
    Ok((env, comm))
}

/// Runs `f(communicator)` for `world` ranks as threads of this process, each with its own
/// communicator of one [`CpuGroup`]; the results in rank order. A rank's failure makes the
/// others' all-reduces fail (and return) instead of waiting for it.
pub fn run_cpu_ranks<T: Send>(
    world: usize,
    f: impl Fn(Communicator) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    let group = CpuGroup::new(world)?;
    let comms = group.communicators()?;
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                let f = &f;
                s.spawn(move || f(comm))
            })
            .collect();
        let results: Vec<Result<T>> = handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| {
                h.join()
                    .unwrap_or_else(|_| bail!("rank {rank} panicked"))
                    .with_context(|| format!("rank {rank}"))
            })
            .collect();
        results.into_iter().collect()
    })
}
