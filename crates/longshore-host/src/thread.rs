//! Placing and scheduling threads (Linux): CPU affinity, the scheduling policy and the nice
//! value of one thread, named by its kernel thread id ([`Tid`]).
//!
//! Used by the loader to pin its worker threads to the CPUs nearest a GPU and to run them in
//! the background (`SCHED_BATCH`, a higher nice value). Every call here is allowed to an
//! unprivileged process on its own threads: narrowing or widening an affinity within the
//! process's cpuset, switching between `SCHED_OTHER` and `SCHED_BATCH`, raising a nice value.
//!
//! ```
//! use longshore_host::thread::{self, Tid};
//!
//! let me = Tid::current();
//! let allowed = thread::affinity(me)?;
//! assert!(!allowed.is_empty());
//! thread::set_affinity(me, &allowed)?; // a no-op change
//! # Ok::<(), longshore_host::thread::ThreadError>(())
//! ```

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use crate::cpuset::CpuSet;

/// A kernel thread id (`gettid()`), which names one thread to the scheduler calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tid(i32);

impl Tid {
    /// The calling thread's id.
    pub fn current() -> Tid {
        // SAFETY: gettid has no preconditions and cannot fail.
        let tid = unsafe { libc::syscall(libc::SYS_gettid) };
        Tid(tid as i32)
    }

    /// The process's main thread (whose id is the process id).
    pub fn main() -> Tid {
        Tid(std::process::id() as i32)
    }

    /// The raw id.
    pub fn as_raw(self) -> i32 {
        self.0
    }
}

impl fmt::Display for Tid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// A scheduling call on a thread failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ThreadError {
    /// The system call failed.
    #[error("{call} on thread {tid} failed: {source}")]
    Sys {
        /// The call, e.g. `sched_setaffinity`.
        call: &'static str,
        /// The thread.
        tid: i32,
        /// The OS error.
        source: io::Error,
    },
    /// An empty CPU set was given: a thread must be allowed to run somewhere.
    #[error("cannot pin thread {tid} to an empty cpu set")]
    EmptySet {
        /// The thread.
        tid: i32,
    },
}

fn sys_err(call: &'static str, tid: Tid) -> ThreadError {
    ThreadError::Sys {
        call,
        tid: tid.0,
        source: io::Error::last_os_error(),
    }
}

/// The CPUs thread `tid` may run on.
pub fn affinity(tid: Tid) -> Result<CpuSet, ThreadError> {
    // The kernel refuses a mask smaller than its own (EINVAL): grow until it fits.
    let mut words = 16usize; // 1024 CPUs, glibc's cpu_set_t
    loop {
        let mut mask = vec![0u64; words];
        // SAFETY: `mask` is writable for `words * 8` bytes, the size passed; the kernel writes
        // at most that many bytes.
        let rc = unsafe {
            libc::sched_getaffinity(
                tid.0,
                words * 8,
                mask.as_mut_ptr().cast::<libc::cpu_set_t>(),
            )
        };
        if rc == 0 {
            return Ok(CpuSet::from_words(&mask));
        }
        let err = sys_err("sched_getaffinity", tid);
        let einval = matches!(&err, ThreadError::Sys { source, .. } if source.raw_os_error() == Some(libc::EINVAL));
        if !einval || words > crate::cpuset::MAX_CPU / 64 {
            return Err(err);
        }
        words *= 2;
    }
}

/// The CPUs the process may run on, the set a thread may be pinned within: its cgroup's
/// cpuset (v2 `cpuset.cpus.effective`, v1 `cpuset.cpus`), else every online CPU, else the
/// main thread's affinity. Not a thread's affinity first: the main thread's is often narrowed
/// (Python's `os.sched_setaffinity`, OpenMP's binding of its master thread) without limiting
/// the process's other threads.
pub fn process_affinity() -> Result<CpuSet, ThreadError> {
    match process_cpus_in(Path::new("/")) {
        Some(cpus) if !cpus.is_empty() => Ok(cpus),
        _ => affinity(Tid::main()),
    }
}

/// [`process_affinity`]'s cgroup and online-CPU lookup under `root` (`/`, or a fake tree in
/// tests): `None` when none of the files can be read and parsed.
pub(crate) fn process_cpus_in(root: &Path) -> Option<CpuSet> {
    let read =
        |p: PathBuf| -> Option<CpuSet> { std::fs::read_to_string(&p).ok()?.trim().parse().ok() };
    let cgroups = std::fs::read_to_string(root.join("proc/self/cgroup")).unwrap_or_default();
    for line in cgroups.lines() {
        // "hierarchy-id:controllers:path"; v2 is "0::/path".
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let rel = path.trim_start_matches('/');
        let found = if controllers.is_empty() {
            read(
                root.join("sys/fs/cgroup")
                    .join(rel)
                    .join("cpuset.cpus.effective"),
            )
        } else if controllers.split(',').any(|c| c == "cpuset") {
            read(
                root.join("sys/fs/cgroup/cpuset")
                    .join(rel)
                    .join("cpuset.cpus"),
            )
        } else {
            None
        };
        if found.as_ref().is_some_and(|c| !c.is_empty()) {
            return found;
        }
    }
    read(root.join("sys/fs/cgroup/cpuset.cpus.effective"))
        .filter(|c| !c.is_empty())
        .or_else(|| read(root.join("sys/devices/system/cpu/online")))
}

/// Allows thread `tid` to run only on `cpus`.
///
/// CPUs outside the process's cpuset are ignored by the kernel; a set with none inside it
/// fails with `EINVAL`.
pub fn set_affinity(tid: Tid, cpus: &CpuSet) -> Result<(), ThreadError> {
    if cpus.is_empty() {
        return Err(ThreadError::EmptySet { tid: tid.0 });
    }
    let words = cpus.as_words();
    // SAFETY: `words` is readable for `len * 8` bytes, the size passed; the kernel only reads.
    let rc = unsafe {
        libc::sched_setaffinity(
            tid.0,
            std::mem::size_of_val(words),
            words.as_ptr().cast::<libc::cpu_set_t>(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(sys_err("sched_setaffinity", tid))
    }
}

/// The CPU the calling thread runs on now, if the OS says.
pub fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu has no preconditions.
    let c = unsafe { libc::sched_getcpu() };
    usize::try_from(c).ok()
}

/// A Linux scheduling policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SchedPolicy {
    /// `SCHED_OTHER`, the default time-sharing policy.
    Other,
    /// `SCHED_BATCH`: time-sharing, but treated as CPU-bound, so it preempts less and is
    /// preempted by interactive threads sooner.
    Batch,
    /// `SCHED_IDLE`: runs only when nothing else wants the CPU.
    Idle,
    /// A real-time or unknown policy, by number.
    Raw(i32),
}

/// The scheduling policy of thread `tid`.
pub fn sched_policy(tid: Tid) -> Result<SchedPolicy, ThreadError> {
    // SAFETY: sched_getscheduler has no memory preconditions.
    let p = unsafe { libc::sched_getscheduler(tid.0) };
    Ok(match p {
        -1 => return Err(sys_err("sched_getscheduler", tid)),
        libc::SCHED_OTHER => SchedPolicy::Other,
        libc::SCHED_BATCH => SchedPolicy::Batch,
        libc::SCHED_IDLE => SchedPolicy::Idle,
        other => SchedPolicy::Raw(other),
    })
}

/// Sets the policy of thread `tid` to a time-sharing one (`Other`, `Batch` or `Idle`; these
/// take priority 0). Unprivileged processes may move their threads from `Other` to `Batch`
/// or `Idle`, and back from `Batch`.
pub fn set_sched_policy(tid: Tid, policy: SchedPolicy) -> Result<(), ThreadError> {
    let raw = match policy {
        SchedPolicy::Other => libc::SCHED_OTHER,
        SchedPolicy::Batch => libc::SCHED_BATCH,
        SchedPolicy::Idle => libc::SCHED_IDLE,
        SchedPolicy::Raw(p) => p,
    };
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid sched_param that outlives the call; the kernel only reads it.
    let rc = unsafe { libc::sched_setscheduler(tid.0, raw, &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(sys_err("sched_setscheduler", tid))
    }
}

/// The nice value of thread `tid` (-20..=19; higher is lower priority).
pub fn nice(tid: Tid) -> Result<i32, ThreadError> {
    // getpriority may legitimately return -1: errno tells an error apart.
    // SAFETY: __errno_location returns the calling thread's errno slot, valid for writes.
    unsafe { *libc::__errno_location() = 0 };
    // SAFETY: getpriority has no memory preconditions.
    let v = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid.0 as libc::id_t) };
    if v == -1 && io::Error::last_os_error().raw_os_error() != Some(0) {
        return Err(sys_err("getpriority", tid));
    }
    Ok(v)
}

/// Sets the nice value of thread `tid` (per thread on Linux). Raising it is always allowed;
/// lowering it below the current value needs `CAP_SYS_NICE` or `RLIMIT_NICE`.
pub fn set_nice(tid: Tid, value: i32) -> Result<(), ThreadError> {
    // SAFETY: setpriority has no memory preconditions.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid.0 as libc::id_t, value) };
    if rc == 0 {
        Ok(())
    } else {
        Err(sys_err("setpriority", tid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` on a fresh thread (so changing its scheduling does not touch the test runner).
    fn on_thread<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
        std::thread::spawn(f).join().unwrap()
    }

    fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = d.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        d
    }

    #[test]
    fn process_cpus_come_from_the_cgroup_not_a_thread() {
        let cpus = |s: &str| s.parse::<CpuSet>().unwrap();
        // cgroup v2: the process's own cgroup.
        let v2 = tree(&[
            ("proc/self/cgroup", "0::/job/step\n"),
            ("sys/fs/cgroup/job/step/cpuset.cpus.effective", "4-7\n"),
            ("sys/devices/system/cpu/online", "0-15\n"),
        ]);
        assert_eq!(process_cpus_in(v2.path()), Some(cpus("4-7")));
        // cgroup v1: the cpuset hierarchy.
        let v1 = tree(&[
            (
                "proc/self/cgroup",
                "5:memory:/x\n3:cpuset,cpuacct:/slurm/job1\n",
            ),
            ("sys/fs/cgroup/cpuset/slurm/job1/cpuset.cpus", "0-3,8-11\n"),
            ("sys/devices/system/cpu/online", "0-15\n"),
        ]);
        assert_eq!(process_cpus_in(v1.path()), Some(cpus("0-3,8-11")));
        // No cpuset readable: every online CPU.
        let none = tree(&[
            ("proc/self/cgroup", "0::/\n"),
            ("sys/devices/system/cpu/online", "0-31\n"),
        ]);
        assert_eq!(process_cpus_in(none.path()), Some(cpus("0-31")));
        // Nothing at all.
        let empty = tree(&[]);
        assert_eq!(process_cpus_in(empty.path()), None);
    }

    #[test]
    fn affinity_round_trips_on_a_thread() {
        let all = process_affinity().unwrap();
        assert!(!all.is_empty());
        let first = all.iter().next().unwrap();
        let (before, after, back) = on_thread(move || {
            let me = Tid::current();
            let before = affinity(me).unwrap();
            let one: CpuSet = [first].into_iter().collect();
            set_affinity(me, &one).unwrap();
            let after = affinity(me).unwrap();
            (before, after, current_cpu())
        });
        assert_eq!(before, all);
        assert_eq!(after.to_string(), first.to_string());
        assert_eq!(back, Some(first));
        // The main thread was not touched.
        assert_eq!(process_affinity().unwrap(), all);
    }

    #[test]
    fn empty_set_is_refused() {
        let e = set_affinity(Tid::current(), &CpuSet::new()).unwrap_err();
        assert!(matches!(e, ThreadError::EmptySet { .. }), "{e}");
    }

    #[test]
    fn batch_policy_and_nice_on_a_thread() {
        let (policy0, policy, nice0, nice1) = on_thread(|| {
            let me = Tid::current();
            let p0 = sched_policy(me).unwrap();
            set_sched_policy(me, SchedPolicy::Batch).unwrap();
            let n0 = nice(me).unwrap();
            set_nice(me, (n0 + 5).min(19)).unwrap();
            (p0, sched_policy(me).unwrap(), n0, nice(me).unwrap())
        });
        assert_eq!(policy0, SchedPolicy::Other);
        assert_eq!(policy, SchedPolicy::Batch);
        assert_eq!(nice1, (nice0 + 5).min(19));
        // Per thread: this one is unchanged.
        assert_eq!(sched_policy(Tid::current()).unwrap(), SchedPolicy::Other);
    }

    #[test]
    fn errors_name_call_and_thread() {
        // No such thread id (pid_max is at most 2^22).
        let e = sched_policy(Tid(i32::MAX)).unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with("sched_getscheduler on thread 2147483647 failed"),
            "{text}"
        );
    }
}
