//! NUMA: how many memory nodes the host has, and placing an allocation on one of them by
//! setting the calling thread's memory policy to `MPOL_PREFERRED` around it (then restoring
//! the policy it had).
//!
//! The [`PinnedPool`](crate::PinnedPool) uses this when it is given a node
//! ([`PoolConfig::numa_node`](crate::PoolConfig::numa_node),
//! [`PinnedPool::set_numa_node`](crate::PinnedPool::set_numa_node)): page-locked blocks are
//! faulted in by the allocating thread (`cuMemHostAlloc`) or by pre-fault threads it spawns,
//! which inherit its policy, so the blocks land on the GPU's node. On a host with one node
//! nothing is called. A policy the kernel refuses (containers often forbid `set_mempolicy`)
//! is logged once and the allocation goes on where the kernel puts it.
//!
//! ```
//! use longshore_host::numa;
//!
//! // Allocates on node 0 where the host has several nodes; just allocates otherwise.
//! let v = numa::with_preferred_node(0, || vec![0u8; 1 << 20]);
//! assert_eq!(v.len(), 1 << 20);
//! println!("memory nodes: {:?}", numa::node_count());
//! ```

use std::fmt;
use std::io;
use std::path::Path;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::cpuset::{CpuSet, MAX_CPU};

/// The memory nodes the host has online (`<sysfs>/devices/system/node/online`), or `None` if
/// the file is missing or unreadable (not Linux, no NUMA support: treat as one node).
pub fn online_nodes_at(sysfs: &Path) -> Option<CpuSet> {
    let path = sysfs.join("devices/system/node/online");
    let text = std::fs::read_to_string(&path).ok()?;
    match text.parse::<CpuSet>() {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(target: "longshore::host", path = %path.display(), error = %e, "cannot parse the online memory nodes");
            None
        }
    }
}

/// Number of memory nodes online on this host (read once from `/sys`), `None` if unknown.
pub fn node_count() -> Option<usize> {
    static COUNT: OnceLock<Option<usize>> = OnceLock::new();
    *COUNT.get_or_init(|| online_nodes_at(Path::new("/sys")).map(|s| s.len()))
}

/// A thread's memory policy: a mode (`MPOL_*`, with its mode flags) and a node set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MemPolicy {
    /// `libc::MPOL_DEFAULT`, `libc::MPOL_PREFERRED`, ... (with `MPOL_F_*` flags as the kernel
    /// reports them).
    pub(crate) mode: i32,
    /// The nodes the mode applies to (empty for `MPOL_DEFAULT`).
    pub(crate) nodes: CpuSet,
}

impl MemPolicy {
    /// `MPOL_PREFERRED` on `node`: allocate there while it has free memory, elsewhere after.
    pub(crate) fn preferred(node: usize) -> Self {
        MemPolicy {
            mode: libc::MPOL_PREFERRED,
            nodes: [node].into_iter().collect(),
        }
    }
}

/// The calling thread's memory-policy calls, behind a trait so that the order of calls can be
/// checked without a NUMA host. [`SystemMemPolicy`] makes the system calls.
pub(crate) trait MemPolicyOps: Send + Sync + fmt::Debug {
    /// `get_mempolicy`: the calling thread's policy.
    fn get(&self) -> io::Result<MemPolicy>;
    /// `set_mempolicy`: sets the calling thread's policy.
    fn set(&self, policy: &MemPolicy) -> io::Result<()>;
}

/// The real `get_mempolicy` / `set_mempolicy` system calls.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SystemMemPolicy;

impl MemPolicyOps for SystemMemPolicy {
    fn get(&self) -> io::Result<MemPolicy> {
        // The kernel refuses a mask smaller than its node count (EINVAL): grow until it fits.
        let mut words = 16usize;
        loop {
            let mut mode: libc::c_int = 0;
            let mut mask = vec![0u64; words];
            // SAFETY: `mode` is a writable int; `mask` is writable for `words * 64` bits, the
            // `maxnode` passed; a null address and flags 0 ask for the thread's policy.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_get_mempolicy,
                    &mut mode as *mut libc::c_int,
                    mask.as_mut_ptr(),
                    (words * 64) as libc::c_ulong,
                    std::ptr::null_mut::<libc::c_void>(),
                    0 as libc::c_ulong,
                )
            };
            if rc == 0 {
                return Ok(MemPolicy {
                    mode,
                    nodes: CpuSet::from_words(&mask),
                });
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINVAL) || words > MAX_CPU / 64 {
                return Err(e);
            }
            words *= 2;
        }
    }

    fn set(&self, policy: &MemPolicy) -> io::Result<()> {
        let words = policy.nodes.as_words();
        let (ptr, maxnode) = if words.is_empty() {
            (std::ptr::null(), 0)
        } else {
            // The kernel reads `maxnode - 1` bits (libnuma passes one more than it means).
            (words.as_ptr(), words.len() * 64 + 1)
        };
        // SAFETY: `ptr` is null with maxnode 0, or readable for `words.len() * 64` bits, all
        // the kernel reads for this maxnode; it only reads.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_set_mempolicy,
                policy.mode as libc::c_long,
                ptr,
                maxnode as libc::c_ulong,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

/// Runs `f` with the calling thread's memory policy set to prefer `node`, when the host has
/// more than one memory node; otherwise just runs `f`.
///
/// The current policy is read, `MPOL_PREFERRED` on `node` set, `f` run, and the old policy
/// set again (also if `f` panics). A thread whose policy is not the default (a binding or
/// interleaving the user chose) keeps it: `f` just runs. If the policy cannot be read or set,
/// `f` still runs (logged once per process at `warn`, target `"longshore::host"`): placement
/// is an optimisation, never a reason to fail.
pub fn with_preferred_node<R>(node: usize, f: impl FnOnce() -> R) -> R {
    with_preferred_node_using(&SystemMemPolicy, node_count().unwrap_or(1), node, f)
}

/// The `MPOL_F_*` flags the kernel may report in a mode (`MPOL_F_STATIC_NODES`,
/// `MPOL_F_RELATIVE_NODES`, `MPOL_F_NUMA_BALANCING`).
const MODE_FLAGS: i32 = (1 << 15) | (1 << 14) | (1 << 13);

/// Runs `f` with the calling thread's memory policy set to prefer `node` through `ops`: the
/// current policy is read, `MPOL_PREFERRED` on `node` set, `f` run, and the old policy set
/// again (also if `f` panics). A thread whose policy is not the default (a binding or
/// interleaving the user chose) keeps it: `f` just runs. With `host_nodes <= 1` no call is made. If the policy cannot be
/// read or set, `f` still runs (logged once per process at `warn`, target
/// `"longshore::host"`): placement is an optimisation, never a reason to fail.
pub(crate) fn with_preferred_node_using<R>(
    ops: &dyn MemPolicyOps,
    host_nodes: usize,
    node: usize,
    f: impl FnOnce() -> R,
) -> R {
    if host_nodes <= 1 {
        return f();
    }
    let old = match ops.get() {
        Ok(p) => p,
        Err(e) => {
            warn_once("get_mempolicy", node, &e);
            return f();
        }
    };
    // A policy the user chose (`numactl --membind`, `--interleave`, ...) wins over ours: only
    // the default (local) policy is replaced.
    if old.mode & !MODE_FLAGS != libc::MPOL_DEFAULT {
        static SAID: AtomicBool = AtomicBool::new(false);
        if !SAID.swap(true, Ordering::Relaxed) {
            tracing::info!(target: "longshore::host", mode = old.mode, nodes = %old.nodes, node, "the thread has a memory policy of its own: page-locked blocks are not placed on the GPU's node");
        }
        return f();
    }
    if let Err(e) = ops.set(&MemPolicy::preferred(node)) {
        warn_once("set_mempolicy", node, &e);
        return f();
    }
    struct Restore<'a> {
        ops: &'a dyn MemPolicyOps,
        old: MemPolicy,
    }
    impl Drop for Restore<'_> {
        fn drop(&mut self) {
            if let Err(e) = self.ops.set(&self.old) {
                tracing::error!(target: "longshore::host", error = %e, mode = self.old.mode, nodes = %self.old.nodes, "cannot restore the thread's memory policy");
            }
        }
    }
    let _restore = Restore { ops, old };
    f()
}

fn warn_once(call: &str, node: usize, e: &io::Error) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(target: "longshore::host", call, numa.node = node, error = %e, "cannot place memory on a NUMA node; allocating where the kernel chooses (logged once)");
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Records every call; `fail_set` makes the first `set` fail.
    #[derive(Debug, Default)]
    pub(crate) struct Recorder {
        pub(crate) calls: Mutex<Vec<String>>,
        pub(crate) fail_get: bool,
        pub(crate) fail_set: bool,
        /// The policy `get` reports (`None`: the default policy).
        pub(crate) current: Option<MemPolicy>,
    }

    impl MemPolicyOps for Recorder {
        fn get(&self) -> io::Result<MemPolicy> {
            self.calls.lock().unwrap().push("get".into());
            if self.fail_get {
                return Err(io::Error::from_raw_os_error(libc::EPERM));
            }
            Ok(self.current.clone().unwrap_or(MemPolicy {
                mode: libc::MPOL_DEFAULT,
                nodes: CpuSet::new(),
            }))
        }
        fn set(&self, p: &MemPolicy) -> io::Result<()> {
            let mut calls = self.calls.lock().unwrap();
            calls.push(format!("set {} {}", p.mode, p.nodes));
            if self.fail_set {
                return Err(io::Error::from_raw_os_error(libc::EPERM));
            }
            Ok(())
        }
    }

    fn calls(r: &Recorder) -> Vec<String> {
        r.calls.lock().unwrap().clone()
    }

    #[test]
    fn prefers_then_restores_on_several_nodes() {
        let r = Recorder::default();
        let out = with_preferred_node_using(&r, 2, 1, || {
            assert_eq!(calls(&r), ["get", "set 1 1"]);
            7
        });
        assert_eq!(out, 7);
        assert_eq!(calls(&r), ["get", "set 1 1", "set 0 "]);
    }

    #[test]
    fn restores_after_a_panic() {
        let r = Recorder::default();
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            with_preferred_node_using(&r, 4, 3, || panic!("boom"))
        }));
        assert!(caught.is_err());
        assert_eq!(calls(&r), ["get", "set 1 3", "set 0 "]);
    }

    #[test]
    fn a_policy_the_user_chose_is_kept() {
        let r = Recorder {
            current: Some(MemPolicy {
                mode: libc::MPOL_BIND,
                nodes: [0].into_iter().collect(),
            }),
            ..Recorder::default()
        };
        assert_eq!(with_preferred_node_using(&r, 2, 1, || 7), 7);
        assert_eq!(calls(&r), vec!["get".to_owned()], "read, never replaced");
    }

    #[test]
    fn one_node_makes_no_call() {
        let r = Recorder::default();
        assert_eq!(with_preferred_node_using(&r, 1, 0, || 5), 5);
        assert_eq!(with_preferred_node_using(&r, 0, 0, || 6), 6);
        assert!(calls(&r).is_empty());
    }

    #[test]
    fn refused_policy_still_runs_f() {
        let r = Recorder {
            fail_get: true,
            ..Recorder::default()
        };
        assert_eq!(with_preferred_node_using(&r, 2, 0, || 1), 1);
        assert_eq!(calls(&r), ["get"]);
        let r = Recorder {
            fail_set: true,
            ..Recorder::default()
        };
        assert_eq!(with_preferred_node_using(&r, 2, 0, || 2), 2);
        assert_eq!(calls(&r), ["get", "set 1 0"]);
    }

    fn pool(ops: Arc<Recorder>, host_nodes: usize, node: Option<usize>) -> crate::PinnedPool {
        let config = crate::PoolConfig::for_kind(crate::MemoryKind::Pageable)
            .budget(64 << 20)
            .numa_node(node);
        crate::PinnedPool::with_placement(
            Arc::new(crate::PageableAllocator::default()),
            config,
            ops,
            host_nodes,
        )
        .unwrap()
    }

    #[test]
    fn pool_places_each_new_block_and_not_cache_hits() {
        let r = Arc::new(Recorder::default());
        let p = pool(r.clone(), 2, Some(1));
        assert_eq!(p.numa_node(), Some(1));
        let a = p.alloc(1 << 20).unwrap();
        assert_eq!(calls(&r), ["get", "set 1 1", "set 0 "]);
        drop(a);
        let b = p.alloc(1 << 20).unwrap(); // a hit: no allocation, no policy
        assert_eq!(calls(&r).len(), 3);
        p.set_numa_node(Some(0));
        let c = p.alloc(4 << 20).unwrap();
        assert_eq!(calls(&r)[3..], ["get", "set 1 0", "set 0 "]);
        p.set_numa_node(None);
        let d = p.alloc(8 << 20).unwrap();
        assert_eq!(calls(&r).len(), 6);
        drop((b, c, d));
    }

    #[test]
    fn pool_on_one_node_host_makes_no_call() {
        let r = Arc::new(Recorder::default());
        let p = pool(r.clone(), 1, Some(0));
        let _a = p.alloc(1 << 20).unwrap();
        assert!(calls(&r).is_empty());
        let r = Arc::new(Recorder::default());
        let p = pool(r.clone(), 2, None);
        let _a = p.alloc(1 << 20).unwrap();
        assert!(calls(&r).is_empty());
    }

    #[test]
    fn online_nodes_from_a_fake_sysfs() {
        let dir = std::env::temp_dir().join(format!("longshore-numa-{}", std::process::id()));
        let node_dir = dir.join("devices/system/node");
        std::fs::create_dir_all(&node_dir).unwrap();
        assert_eq!(online_nodes_at(&dir.join("missing")), None);
        std::fs::write(node_dir.join("online"), "0-1\n").unwrap();
        assert_eq!(online_nodes_at(&dir).map(|s| s.len()), Some(2));
        std::fs::write(node_dir.join("online"), "garbage\n").unwrap();
        assert_eq!(online_nodes_at(&dir), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn system_policy_reads_and_restores_when_allowed() {
        // Containers may forbid the calls (seccomp): then there is nothing to check here.
        let ops = SystemMemPolicy;
        std::thread::spawn(move || {
            let Ok(before) = ops.get() else { return };
            if ops.set(&MemPolicy::preferred(0)).is_err() {
                return;
            }
            let now = ops.get().unwrap();
            assert_eq!(now.mode & 0xff, libc::MPOL_PREFERRED);
            assert!(now.nodes.contains(0));
            ops.set(&before).unwrap();
            assert_eq!(ops.get().unwrap(), before);
        })
        .join()
        .unwrap();
    }
}
