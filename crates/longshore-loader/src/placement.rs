//! Where worker threads run and how they are scheduled: pinned to the CPUs nearest the GPU
//! the loader delivers to ([`Placement`]), and optionally in the background
//! ([`WorkerPriority`]), so that they leave the consumer thread, which issues the copies, its
//! share of the cores.
//!
//! The choice is settled on the consumer's side ([`resolve`]) when a loader is built, given a
//! topology, or asked to deliver to a device; each worker thread applies it to itself before
//! its next task ([`ThreadSetup`]), so persistent workers follow a change too.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use longshore_host::CpuSet;
use longshore_host::thread::{self, SchedPolicy, Tid};
use longshore_transfer::GpuTopology;

use crate::sync::lock;

/// Where a loader's worker threads may run ([`DataLoaderBuilder::cpu_placement`](crate::DataLoaderBuilder::cpu_placement)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Placement {
    /// On the CPUs nearest the GPU the loader delivers to (the default): when the loader
    /// delivers to a CUDA device ([`DataLoader::to_device`](crate::DataLoader::to_device)) or
    /// is given its topology, on a host with several NUMA nodes, workers are pinned to the
    /// GPU's `local_cpulist` (within the CPUs the process may use) and the loader's own pool
    /// allocates on the GPU's node. Not pinned when there is no GPU, one node, or fewer than 2
    /// such CPUs (the reason is in [`WorkerPlacement::reason`]).
    #[default]
    GpuLocal,
    /// Workers run wherever the OS schedules them; nothing is changed.
    Off,
    /// Workers are pinned to these CPUs (within the CPUs the process may use).
    Cpus(CpuSet),
}

/// How a loader's worker threads are scheduled ([`DataLoaderBuilder::worker_priority`](crate::DataLoaderBuilder::worker_priority)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum WorkerPriority {
    /// As the thread that started them (the default).
    #[default]
    Normal,
    /// `SCHED_BATCH` and nice value [`BACKGROUND_NICE`] (or the inherited one if higher):
    /// with more busy workers than cores, the consumer thread that issues the copies and
    /// launches the model's work still gets the CPU when it wakes up. Allowed without
    /// privileges; a refusal is logged and the worker runs at normal priority.
    Background,
}

/// The nice value of [`WorkerPriority::Background`] workers.
pub const BACKGROUND_NICE: i32 = 10;

/// What [`Placement`] became on this machine: reported in
/// [`LoaderStats::placement`](crate::LoaderStats::placement) and
/// [`DataLoader::placement`](crate::DataLoader::placement).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerPlacement {
    /// The CPUs the workers are pinned to; `None` when they are not pinned.
    pub cpus: Option<CpuSet>,
    /// The CPUs nearest the GPU, when known (reported on one-node hosts too, where nothing is
    /// pinned).
    pub gpu_local_cpus: Option<CpuSet>,
    /// The GPU's NUMA node, when known; the loader's own pool allocates there on hosts with
    /// several nodes.
    pub numa_node: Option<usize>,
    /// Why the workers are or are not pinned.
    pub reason: String,
}

impl Default for WorkerPlacement {
    fn default() -> Self {
        WorkerPlacement {
            cpus: None,
            gpu_local_cpus: None,
            numa_node: None,
            reason: "no GPU topology: the loader has not delivered to a CUDA device".to_owned(),
        }
    }
}

/// Settles `placement` for a GPU of topology `topo` (if any), within the CPUs `allowed` to
/// the process.
pub(crate) fn resolve(
    placement: &Placement,
    topo: Option<&GpuTopology>,
    allowed: &CpuSet,
) -> WorkerPlacement {
    let gpu_local_cpus = topo.and_then(|t| t.local_cpus.clone());
    let numa_node = topo.and_then(|t| t.numa_node);
    let unpinned = |reason: String| WorkerPlacement {
        cpus: None,
        gpu_local_cpus: gpu_local_cpus.clone(),
        numa_node,
        reason,
    };
    let pinned = |cpus: CpuSet, reason: String| WorkerPlacement {
        cpus: Some(cpus),
        gpu_local_cpus: gpu_local_cpus.clone(),
        numa_node,
        reason,
    };
    match placement {
        Placement::Off => unpinned("cpu_placement is off".to_owned()),
        Placement::Cpus(set) => {
            let eff = set.intersection(allowed);
            if eff.is_empty() {
                unpinned(format!(
                    "none of the given cpus {set} is allowed to this process (allowed: {allowed})"
                ))
            } else {
                pinned(eff, "the cpus given to cpu_placement".to_owned())
            }
        }
        Placement::GpuLocal => {
            let Some(t) = topo else {
                return WorkerPlacement::default();
            };
            let Some(local) = &t.local_cpus else {
                return unpinned(format!(
                    "the local cpus of GPU {} are unknown",
                    t.pci_bus_id
                ));
            };
            if !t.multi_node() {
                return unpinned(format!(
                    "one NUMA node: the cpus of GPU {} ({local}) are all of them, nothing to pin",
                    t.pci_bus_id
                ));
            }
            let eff = local.intersection(allowed);
            if eff.len() < 2 {
                return unpinned(format!(
                    "only {} of GPU {}'s cpus ({local}) are allowed to this process ({allowed}): \
                     not pinning the workers to fewer than 2 cpus",
                    eff.len(),
                    t.pci_bus_id
                ));
            }
            let node = t
                .numa_node
                .map_or_else(|| "?".to_owned(), |n| n.to_string());
            pinned(
                eff,
                format!("the cpus of GPU {} on NUMA node {node}", t.pci_bus_id),
            )
        }
    }
}

/// What each worker applies to its own thread, shared by every worker of a loader (and its
/// later engines). `version` changes when the placement does; a worker re-applies when it
/// sees a version it has not applied.
#[derive(Debug)]
pub(crate) struct ThreadSetup {
    version: AtomicU64,
    cpus: Mutex<Option<CpuSet>>,
    pub(crate) priority: WorkerPriority,
}

impl ThreadSetup {
    pub(crate) fn new(priority: WorkerPriority) -> Arc<Self> {
        Arc::new(ThreadSetup {
            version: AtomicU64::new(1),
            cpus: Mutex::new(None),
            priority,
        })
    }

    /// Sets the CPUs workers pin themselves to (`None`: back to what they started with).
    pub(crate) fn set_cpus(&self, cpus: Option<CpuSet>) {
        let mut guard = lock(&self.cpus);
        if *guard != cpus {
            *guard = cpus;
            self.version.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// One worker thread's side of [`ThreadSetup`].
#[derive(Debug)]
pub(crate) struct WorkerThread {
    setup: Arc<ThreadSetup>,
    worker: usize,
    tid: Tid,
    applied: u64,
    /// The affinity the thread started with, restored when the placement is lifted.
    initial: Option<CpuSet>,
    pinned: bool,
}

impl WorkerThread {
    /// Called on the worker thread when it starts: applies the priority.
    pub(crate) fn start(setup: Arc<ThreadSetup>, worker: usize) -> Self {
        let tid = Tid::current();
        if setup.priority == WorkerPriority::Background {
            background(tid, worker);
        }
        WorkerThread {
            setup,
            worker,
            tid,
            applied: 0,
            initial: None,
            pinned: false,
        }
    }

    /// Called on the worker thread before each task: applies a changed placement.
    pub(crate) fn refresh(&mut self) {
        let v = self.setup.version.load(Ordering::Acquire);
        if v == self.applied {
            return;
        }
        self.applied = v;
        let cpus = lock(&self.setup.cpus).clone();
        let target = match (&cpus, self.pinned) {
            (Some(c), _) => c.clone(),
            (None, true) => match &self.initial {
                Some(c) => c.clone(),
                None => return,
            },
            (None, false) => return,
        };
        if self.initial.is_none() {
            self.initial = thread::affinity(self.tid).ok();
        }
        match thread::set_affinity(self.tid, &target) {
            Ok(()) => {
                self.pinned = cpus.is_some();
                tracing::debug!(target: "longshore::loader", cpus = %target, worker.id = self.worker, "worker placed");
            }
            Err(e) => {
                tracing::warn!(target: "longshore::loader", error = %e, cpus = %target, worker.id = self.worker, "cannot pin the worker thread; it runs where the OS schedules it");
            }
        }
    }
}

fn background(tid: Tid, worker: usize) {
    if let Err(e) = thread::set_sched_policy(tid, SchedPolicy::Batch) {
        tracing::warn!(target: "longshore::loader", error = %e, worker.id = worker, "cannot move the worker to SCHED_BATCH");
    }
    match thread::nice(tid) {
        Ok(n) if n >= BACKGROUND_NICE => {}
        Ok(_) => {
            if let Err(e) = thread::set_nice(tid, BACKGROUND_NICE) {
                tracing::warn!(target: "longshore::loader", error = %e, worker.id = worker, "cannot raise the worker's nice value");
            }
        }
        Err(e) => {
            tracing::warn!(target: "longshore::loader", error = %e, worker.id = worker, "cannot read the worker's nice value");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topo(nodes: &str, node: &str, cpus: &str) -> (tempfile::TempDir, GpuTopology) {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("devices/system/node");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("online"), nodes).unwrap();
        let dev = dir.path().join("bus/pci/devices/0000:3b:00.0");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("numa_node"), node).unwrap();
        std::fs::write(dev.join("local_cpulist"), cpus).unwrap();
        let t = GpuTopology::from_sysfs(dir.path(), "0000:3b:00.0");
        (dir, t)
    }

    fn set(s: &str) -> CpuSet {
        s.parse().unwrap()
    }

    #[test]
    fn gpu_local_on_two_nodes_pins_within_allowed() {
        let (_d, t) = topo("0-1", "1", "8-15");
        let r = resolve(&Placement::GpuLocal, Some(&t), &set("0-15"));
        assert_eq!(r.cpus, Some(set("8-15")));
        assert_eq!(r.numa_node, Some(1));
        assert!(r.reason.contains("NUMA node 1"), "{}", r.reason);
        let r = resolve(&Placement::GpuLocal, Some(&t), &set("0-9"));
        assert_eq!(r.cpus, Some(set("8-9")));
    }

    #[test]
    fn gpu_local_does_not_pin_to_fewer_than_two() {
        let (_d, t) = topo("0-1", "1", "8-15");
        let r = resolve(&Placement::GpuLocal, Some(&t), &set("0-8"));
        assert_eq!(r.cpus, None);
        assert!(r.reason.contains("fewer than 2"), "{}", r.reason);
        assert_eq!(r.gpu_local_cpus, Some(set("8-15")));
    }

    #[test]
    fn gpu_local_on_one_node_reports_but_does_not_pin() {
        let (_d, t) = topo("0", "0", "0-15");
        let r = resolve(&Placement::GpuLocal, Some(&t), &set("0-15"));
        assert_eq!(r.cpus, None);
        assert_eq!(r.gpu_local_cpus, Some(set("0-15")));
        assert!(r.reason.contains("one NUMA node"), "{}", r.reason);
    }

    #[test]
    fn gpu_local_unknown_and_absent() {
        let (_d, t) = topo("0-1", "-1", "\n");
        let r = resolve(&Placement::GpuLocal, Some(&t), &set("0-15"));
        assert_eq!((r.cpus, r.numa_node), (None, None));
        assert!(r.reason.contains("unknown"), "{}", r.reason);
        assert_eq!(
            resolve(&Placement::GpuLocal, None, &set("0-3")),
            WorkerPlacement::default()
        );
    }

    #[test]
    fn off_and_explicit_sets() {
        let (_d, t) = topo("0-1", "1", "8-15");
        assert_eq!(resolve(&Placement::Off, Some(&t), &set("0-15")).cpus, None);
        let r = resolve(&Placement::Cpus(set("3")), None, &set("0-15"));
        assert_eq!(r.cpus, Some(set("3")));
        let r = resolve(&Placement::Cpus(set("30-31")), None, &set("0-15"));
        assert_eq!(r.cpus, None);
        assert!(r.reason.contains("30-31"), "{}", r.reason);
    }
}
