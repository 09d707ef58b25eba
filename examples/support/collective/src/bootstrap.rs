//! Sharing rank 0's NCCL [`UniqueId`] with every rank: over TCP, or through a shared file.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::nccl::UniqueId;
use crate::{CollectiveError, Result};
use longshore_transfer::TransferError;

const MAGIC: &[u8; 8] = b"LSNCCLID";
/// Magic, world size (u32 LE), id.
const MESSAGE: usize = 8 + 4 + UniqueId::LEN;
const RETRY: Duration = Duration::from_millis(100);

/// How the ranks of a job find rank 0's [`UniqueId`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rendezvous {
    /// Rank 0 listens on `port` (on every interface) and sends the id to each other rank,
    /// which connects to `addr:port`, retrying until `timeout`. Rank 0 waits up to `timeout`
    /// for every rank.
    Tcp {
        /// Rank 0's host name or address (torchrun's `MASTER_ADDR`).
        addr: String,
        /// The port rank 0 listens on.
        port: u16,
        /// How long to wait for the other side.
        timeout: Duration,
    },
    /// Rank 0 writes the id to `path` (through a temporary file and a rename, so a reader never
    /// sees half of it); the others poll for it until `timeout`. Use a path unique to the job
    /// on a file system every rank sees: a stale file of an earlier job would be read as this
    /// job's. Rank 0 removes it once every rank has joined
    /// ([`Communicator::nccl_rendezvous`](super::Communicator::nccl_rendezvous)).
    File {
        /// The shared file.
        path: PathBuf,
        /// How long the other ranks wait for it.
        timeout: Duration,
    },
}

impl Rendezvous {
    /// The TCP rendezvous of a torchrun job: `master_addr:(master_port + 1)`, because
    /// torchrun's own TCP store listens on `MASTER_PORT` itself.
    pub fn torchrun(master_addr: &str, master_port: u16, timeout: Duration) -> Result<Self> {
        let port = master_port.checked_add(1).ok_or_else(|| {
            CollectiveError::from(TransferError::Invalid(format!(
                "MASTER_PORT {master_port} leaves no port above it for the nccl rendezvous"
            )))
        })?;
        Ok(Rendezvous::Tcp {
            addr: master_addr.to_owned(),
            port,
            timeout,
        })
    }

    pub(crate) fn cleanup(&self) {
        if let Rendezvous::File { path, .. } = self
            && let Err(e) = std::fs::remove_file(path)
        {
            tracing::warn!(target: "longshore_collective", path = %path.display(), error = %e, "removing the nccl id file");
        }
    }
}

fn fail(rank: usize, world: usize, reason: String) -> CollectiveError {
    CollectiveError::Rank {
        op: "nccl rendezvous",
        rank,
        world_size: world,
        reason,
    }
}

fn encode(world: usize, id: &UniqueId) -> [u8; MESSAGE] {
    let mut m = [0u8; MESSAGE];
    m[..8].copy_from_slice(MAGIC);
    m[8..12].copy_from_slice(&(world as u32).to_le_bytes());
    m[12..].copy_from_slice(&id.to_bytes());
    m
}

fn decode(m: &[u8], world: usize) -> std::result::Result<UniqueId, String> {
    if m.len() != MESSAGE || &m[..8] != MAGIC {
        return Err(format!(
            "not a longshore nccl id ({} bytes, expected {MESSAGE})",
            m.len()
        ));
    }
    let theirs = u32::from_le_bytes([m[8], m[9], m[10], m[11]]) as usize;
    if theirs != world {
        return Err(format!(
            "rank 0 runs a world of {theirs}, this rank one of {world}"
        ));
    }
    UniqueId::from_bytes(&m[12..]).map_err(|e| e.to_string())
}

/// Shares rank 0's unique id with every rank through `rendezvous`: rank 0 calls `make` (e.g.
/// [`UniqueId::new`]) and hands the id out; every rank returns it. Blocks until the exchange is
/// done or the rendezvous's timeout passes.
pub fn share_unique_id(
    rank: usize,
    world_size: usize,
    rendezvous: &Rendezvous,
    make: impl FnOnce() -> Result<UniqueId>,
) -> Result<UniqueId> {
    share(rank, world_size, rendezvous, make).map(|(id, _)| id)
}

/// The TCP connections of a rendezvous, kept open for the [`Liveness`](crate::liveness) watch:
/// rank 0's to every other rank, or this rank's to rank 0. Empty for the file rendezvous.
pub(crate) enum Links {
    None,
    Rank0(Vec<(usize, TcpStream)>),
    Peer(TcpStream),
}

/// [`share_unique_id`], keeping the rendezvous's connections.
pub(crate) fn share(
    rank: usize,
    world_size: usize,
    rendezvous: &Rendezvous,
    make: impl FnOnce() -> Result<UniqueId>,
) -> Result<(UniqueId, Links)> {
    super::validate_rank("nccl rendezvous", rank, world_size)?;
    match rendezvous {
        Rendezvous::Tcp {
            addr,
            port,
            timeout,
        } => {
            if rank == 0 {
                let id = make()?;
                let conns = serve(world_size, *port, *timeout, &id)?;
                Ok((id, Links::Rank0(conns)))
            } else {
                let (id, conn) = fetch(rank, world_size, addr, *port, *timeout)?;
                Ok((id, Links::Peer(conn)))
            }
        }
        Rendezvous::File { path, timeout } => {
            if rank == 0 {
                let id = make()?;
                let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
                std::fs::write(&tmp, encode(world_size, &id))
                    .and_then(|()| std::fs::rename(&tmp, path))
                    .map_err(|e| {
                        fail(rank, world_size, format!("writing {}: {e}", path.display()))
                    })?;
                Ok((id, Links::None))
            } else {
                let timeout = *timeout;
                let id = retry_until(timeout, || match std::fs::read(path) {
                    Ok(m) => decode(&m, world_size).map_err(Retry::Again),
                    Err(e) => Err(Retry::Again(e.to_string())),
                })
                .map_err(|(Retry::Again(last) | Retry::Fatal(last))| {
                    fail(
                        rank,
                        world_size,
                        format!(
                            "no id from rank 0 in {} after {timeout:?}: {last}",
                            path.display()
                        ),
                    )
                })?;
                Ok((id, Links::None))
            }
        }
    }
}

/// Rank 0: accept every other rank (each says which it is) and send it the id; the
/// connections, by rank.
fn serve(
    world: usize,
    port: u16,
    timeout: Duration,
    id: &UniqueId,
) -> Result<Vec<(usize, TcpStream)>> {
    let e = |reason: String| fail(0, world, reason);
    let mut conns = Vec::with_capacity(world.saturating_sub(1));
    if world == 1 {
        return Ok(conns);
    }
    let listener = TcpListener::bind(("0.0.0.0", port))
        .map_err(|err| e(format!("listening on port {port}: {err}")))?;
    listener
        .set_nonblocking(true)
        .map_err(|err| e(err.to_string()))?;
    let message = encode(world, id);
    let deadline = Instant::now() + timeout;
    let mut served = vec![false; world];
    served[0] = true;
    while served.iter().any(|s| !s) {
        match listener.accept() {
            Ok((mut conn, peer)) => {
                let greet = (|| -> std::io::Result<usize> {
                    conn.set_nonblocking(false)?;
                    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
                    conn.set_write_timeout(Some(Duration::from_secs(10)))?;
                    let mut hello = [0u8; 12];
                    conn.read_exact(&mut hello)?;
                    if &hello[..8] != MAGIC {
                        return Err(std::io::Error::other("not a longshore rank"));
                    }
                    let r = u32::from_le_bytes([hello[8], hello[9], hello[10], hello[11]]);
                    conn.write_all(&message)?;
                    Ok(r as usize)
                })();
                match greet {
                    Ok(r) if r < world && !served[r] => {
                        served[r] = true;
                        conns.push((r, conn));
                    }
                    Ok(r) => {
                        tracing::warn!(target: "longshore_collective", %peer, rank = r, world, "nccl rendezvous: a rank outside the world, or one already served, connected")
                    }
                    Err(err) => {
                        tracing::warn!(target: "longshore_collective", %peer, error = %err, "nccl rendezvous: ignored a connection")
                    }
                }
            }
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing: Vec<usize> = (0..world).filter(|&r| !served[r]).collect();
                    return Err(e(format!(
                        "rank(s) {missing:?} did not connect to port {port} within {timeout:?}"
                    )));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(err) => return Err(e(format!("accepting on port {port}: {err}"))),
        }
    }
    Ok(conns)
}

/// Ranks other than 0: connect to rank 0 (retrying until the deadline) and read the id.
fn fetch(
    rank: usize,
    world: usize,
    addr: &str,
    port: u16,
    timeout: Duration,
) -> Result<(UniqueId, TcpStream)> {
    retry_until(timeout, || {
        let attempt = (|| -> std::result::Result<(UniqueId, TcpStream), String> {
            let addrs: Vec<SocketAddr> = (addr, port)
                .to_socket_addrs()
                .map_err(|e| format!("resolving {addr}: {e}"))?
                .collect();
            let mut errs = Vec::new();
            for a in addrs {
                let io = (|| -> std::io::Result<([u8; MESSAGE], TcpStream)> {
                    let mut c = TcpStream::connect_timeout(&a, Duration::from_secs(2))?;
                    c.set_read_timeout(Some(Duration::from_secs(10)))?;
                    let mut hello = [0u8; 12];
                    hello[..8].copy_from_slice(MAGIC);
                    hello[8..].copy_from_slice(&(rank as u32).to_le_bytes());
                    c.write_all(&hello)?;
                    let mut m = [0u8; MESSAGE];
                    c.read_exact(&mut m)?;
                    Ok((m, c))
                })();
                match io {
                    Ok((m, c)) => return decode(&m, world).map(|id| (id, c)),
                    Err(e) => errs.push(format!("{a}: {e}")),
                }
            }
            Err(errs.join("; "))
        })();
        match attempt {
            Ok(v) => Ok(v),
            // A world-size mismatch will not heal: fail at once.
            Err(e) if e.contains("runs a world of") => Err(Retry::Fatal(e)),
            Err(e) => Err(Retry::Again(e)),
        }
    })
    .map_err(|last| match last {
        Retry::Fatal(e) => fail(rank, world, e),
        Retry::Again(last) => fail(
            rank,
            world,
            format!("could not get the id from rank 0 at {addr}:{port} within {timeout:?}: {last}"),
        ),
    })
}

/// Why one attempt of [`retry_until`] failed.
enum Retry {
    /// Try again until the deadline; the text is kept for the final error.
    Again(String),
    /// Give up at once.
    Fatal(String),
}

/// Calls `attempt` every [`RETRY`] until it succeeds, fails fatally, or `timeout` has passed;
/// the error is the last attempt's. The one wait loop of both rendezvous kinds.
fn retry_until<T>(
    timeout: Duration,
    mut attempt: impl FnMut() -> std::result::Result<T, Retry>,
) -> std::result::Result<T, Retry> {
    let deadline = Instant::now() + timeout;
    loop {
        match attempt() {
            Ok(v) => return Ok(v),
            Err(Retry::Fatal(e)) => return Err(Retry::Fatal(e)),
            Err(Retry::Again(e)) if Instant::now() >= deadline => return Err(Retry::Again(e)),
            Err(Retry::Again(_)) => std::thread::sleep(RETRY),
        }
    }
}
