//! Which ranks are still alive: the TCP connections of the rendezvous, kept open.
//!
//! After the TCP rendezvous every rank keeps its connection to rank 0 (a star). The kernel
//! closes a process's sockets when it dies, however it dies (a panic, `SIGKILL`, the OOM
//! killer), so an end of stream on a connection that did not say goodbye means that rank is
//! gone. Rank 0 watches every connection and tells the others which rank died; the others
//! watch their connection to rank 0, whose end means rank 0 died. A rank that drops its
//! communicator says goodbye first (it *left*). Backend-agnostic: the NCCL watchdog reads
//! [`Liveness::lost`], and nothing here needs a GPU.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the connections are polled.
const POLL: Duration = Duration::from_millis(50);
/// Goodbye: the sender drops its communicator on purpose.
const BYE: u8 = b'B';
/// From rank 0: `DIED` + rank (u32 LE) — that rank's connection ended without a goodbye.
const DIED: u8 = b'D';
/// From rank 0: `LEFT` + rank (u32 LE) — that rank said goodbye.
const LEFT: u8 = b'L';

/// A rank that is gone, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lost {
    /// The rank.
    pub(crate) rank: usize,
    /// `true` when it said goodbye (dropped its communicator), `false` when its connection
    /// ended without one (the process died).
    pub(crate) left: bool,
}

impl Lost {
    /// The reason text of a collective error, e.g. "rank 1 of 2 died (its connection to rank 0
    /// closed without a goodbye)".
    pub(crate) fn describe(&self, me: usize, world: usize) -> String {
        let via = if self.rank == 0 || me == 0 {
            format!(
                "its connection to rank {}",
                if self.rank == 0 { me } else { 0 }
            )
        } else {
            "as rank 0 saw".to_owned()
        };
        if self.left {
            format!(
                "rank {} of {world} left (dropped its communicator) while this rank still runs collectives ({via})",
                self.rank
            )
        } else {
            format!(
                "rank {} of {world} died ({via} closed without a goodbye)",
                self.rank
            )
        }
    }
}

struct Shared {
    lost: Mutex<Option<Lost>>,
    stop: AtomicBool,
}

/// The liveness watch of one rank: a thread polling its rendezvous connection(s).
pub(crate) struct Liveness {
    shared: Arc<Shared>,
    conns: Vec<TcpStream>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Liveness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Liveness")
            .field("lost", &self.lost())
            .finish()
    }
}

impl Liveness {
    /// Rank 0: watches `conns`, each `(rank, connection)`.
    pub(crate) fn rank0(conns: Vec<(usize, TcpStream)>) -> std::io::Result<Self> {
        let mut mine = Vec::with_capacity(conns.len());
        let mut watched = Vec::with_capacity(conns.len());
        for (r, c) in conns {
            mine.push(c.try_clone()?);
            watched.push(Peer {
                rank: r,
                conn: c,
                open: true,
            });
        }
        Self::start(mine, move |s| watch_rank0(watched, s))
    }

    /// Ranks other than 0: watches the connection to rank 0.
    pub(crate) fn peer(conn: TcpStream) -> std::io::Result<Self> {
        let mine = conn.try_clone()?;
        Self::start(vec![mine], move |s| watch_peer(conn, s))
    }

    /// Sets `conns` (clones of the watched sockets) non-blocking and starts `watch` on its
    /// own thread.
    fn start(
        conns: Vec<TcpStream>,
        watch: impl FnOnce(&Shared) + Send + 'static,
    ) -> std::io::Result<Self> {
        for c in &conns {
            // The clones share the socket: this makes the watched side non-blocking too.
            c.set_nonblocking(true)?;
        }
        let shared = Arc::new(Shared {
            lost: Mutex::new(None),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("longshore-liveness".into())
            .spawn(move || watch(&s))?;
        Ok(Self {
            shared,
            conns,
            thread: Some(thread),
        })
    }

    /// The first rank found gone, if any.
    pub(crate) fn lost(&self) -> Option<Lost> {
        *self.shared.lost.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ends the watch without a goodbye, as a crash would (tests).
    #[cfg(test)]
    pub(crate) fn sever(mut self) {
        self.stop_thread();
        for c in &self.conns {
            let _ = c.shutdown(Shutdown::Both);
        }
        self.conns.clear();
    }

    fn stop_thread(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Liveness {
    fn drop(&mut self) {
        self.stop_thread();
        for c in &mut self.conns {
            // Best effort: a peer that is already gone cannot be told.
            let _ = c.set_nonblocking(false);
            let _ = c.set_write_timeout(Some(Duration::from_secs(1)));
            let _ = c.write_all(&[BYE]);
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

fn record(shared: &Shared, lost: Lost) -> bool {
    let mut l = shared.lost.lock().unwrap_or_else(|p| p.into_inner());
    if l.is_none() {
        *l = Some(lost);
        tracing::error!(target: "longshore_collective", rank = lost.rank, left = lost.left, "a rank of the job is gone");
        true
    } else {
        false
    }
}

struct Peer {
    rank: usize,
    conn: TcpStream,
    open: bool,
}

/// What one poll of a connection saw.
enum Seen {
    Nothing,
    /// The stream ended: with a goodbye first (`true`) or without.
    Ended(bool),
    /// Rank 0 reported a rank gone.
    Report(Lost),
}

/// Reads what is available on `conn` (non-blocking).
fn poll(conn: &mut TcpStream, from_rank0: bool) -> Seen {
    let mut buf = [0u8; 64];
    match conn.read(&mut buf) {
        Ok(0) => Seen::Ended(false),
        Ok(n) => {
            let b = &buf[..n];
            if b[0] == BYE {
                return Seen::Ended(true);
            }
            if from_rank0 && (b[0] == DIED || b[0] == LEFT) && n >= 5 {
                let rank = u32::from_le_bytes([b[1], b[2], b[3], b[4]]) as usize;
                return Seen::Report(Lost {
                    rank,
                    left: b[0] == LEFT,
                });
            }
            Seen::Nothing
        }
        Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
            Seen::Nothing
        }
        Err(_) => Seen::Ended(false),
    }
}

fn watch_rank0(mut peers: Vec<Peer>, shared: &Shared) {
    while !shared.stop.load(Ordering::Acquire) {
        let mut gone = Vec::new();
        for p in peers.iter_mut().filter(|p| p.open) {
            if let Seen::Ended(left) = poll(&mut p.conn, false) {
                p.open = false;
                gone.push(Lost { rank: p.rank, left });
            }
        }
        for g in gone {
            record(shared, g);
            let mut msg = [0u8; 5];
            msg[0] = if g.left { LEFT } else { DIED };
            msg[1..].copy_from_slice(&(g.rank as u32).to_le_bytes());
            for p in peers.iter_mut().filter(|p| p.open) {
                // Non-blocking and tiny: fits the socket buffer; a failure means that peer is
                // gone too, which its own poll reports.
                let _ = p.conn.write(&msg);
            }
        }
        std::thread::sleep(POLL);
    }
}

fn watch_peer(mut conn: TcpStream, shared: &Shared) {
    while !shared.stop.load(Ordering::Acquire) {
        match poll(&mut conn, true) {
            Seen::Nothing => {}
            Seen::Ended(left) => {
                record(shared, Lost { rank: 0, left });
                return;
            }
            Seen::Report(lost) => {
                record(shared, lost);
            }
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::time::Instant;

    use super::*;

    /// A star of `world` ranks over loopback: rank 0's watch and the others'.
    fn star(world: usize) -> (Liveness, Vec<Liveness>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let peers: Vec<TcpStream> = (1..world)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        let accepted: Vec<(usize, TcpStream)> = (1..world)
            .map(|r| (r, listener.accept().unwrap().0))
            .collect();
        let zero = Liveness::rank0(accepted).unwrap();
        let others = peers
            .into_iter()
            .map(|c| Liveness::peer(c).unwrap())
            .collect();
        (zero, others)
    }

    fn wait_for(l: &Liveness) -> Option<Lost> {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if let Some(x) = l.lost() {
                return Some(x);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    #[test]
    fn a_dead_rank_is_named_to_every_survivor_within_a_second() {
        let (zero, mut others) = star(3);
        assert_eq!(zero.lost(), None);
        let two = others.pop().unwrap();
        let t = Instant::now();
        two.sever();
        let want = Lost {
            rank: 2,
            left: false,
        };
        assert_eq!(wait_for(&zero), Some(want));
        assert_eq!(
            wait_for(&others[0]),
            Some(want),
            "rank 1 hears it from rank 0"
        );
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        assert!(want.describe(1, 3).contains("rank 2 of 3 died"));
    }

    #[test]
    fn rank_zero_dying_is_seen_by_the_others() {
        let (zero, others) = star(3);
        zero.sever();
        for o in &others {
            assert_eq!(
                wait_for(o),
                Some(Lost {
                    rank: 0,
                    left: false
                })
            );
        }
    }

    #[test]
    fn a_dropped_rank_left_rather_than_died() {
        let (zero, mut others) = star(2);
        drop(others.pop());
        assert_eq!(
            wait_for(&zero),
            Some(Lost {
                rank: 1,
                left: true
            })
        );
        assert!(
            Lost {
                rank: 1,
                left: true
            }
            .describe(0, 2)
            .contains("left")
        );
    }

    #[test]
    fn a_killed_process_is_seen_as_dead() {
        // A real process holding the connection, killed with SIGKILL: the kernel closes its
        // socket, which is all the watch relies on.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let child = std::process::Command::new("python3")
            .args([
                "-c",
                &format!(
                    "import socket,time; s=socket.create_connection(('127.0.0.1',{port})); time.sleep(60)"
                ),
            ])
            .spawn();
        let Ok(mut child) = child else {
            eprintln!("skipped: python3 is not available to play the killed rank");
            return;
        };
        let (conn, _) = listener.accept().unwrap();
        let zero = Liveness::rank0(vec![(1, conn)]).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(zero.lost(), None);
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(
            wait_for(&zero),
            Some(Lost {
                rank: 1,
                left: false
            })
        );
    }
}
