//! Worker placement and scheduling class, observed from inside the workers: each `get()`
//! reads its own thread's `Cpus_allowed_list`, policy and nice value from `/proc`.
//!
//! Runs on the Cpu backend; the GPU topology is a fake sysfs tree (one or two NUMA nodes).
//! Tests that need to see an affinity change start from a thread narrowed to one CPU (workers
//! inherit it), so they need a process allowed on at least 2 CPUs; they skip otherwise.

use std::path::Path;
use std::sync::Mutex;

use longshore_data::{DataError, Dataset};
use longshore_host::CpuSet;
use longshore_host::thread::{self, Tid};
use longshore_loader::{BACKGROUND_NICE, DataLoader, Fetch, Placement, WorkerPriority};
use longshore_transfer::GpuTopology;

/// What a worker thread saw of itself.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    cpus: CpuSet,
    /// `SCHED_*` number from `/proc/.../sched`.
    policy: i32,
    nice: i32,
}

fn proc_file(tid: Tid, name: &str) -> String {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/{name}")).unwrap()
}

fn seen_by(tid: Tid) -> Seen {
    let status = proc_file(tid, "status");
    let cpus = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list in status")
        .parse()
        .unwrap();
    let sched = proc_file(tid, "sched");
    let policy = sched
        .lines()
        .find(|l| l.starts_with("policy"))
        .and_then(|l| l.split(':').nth(1))
        .expect("policy in sched")
        .trim()
        .parse()
        .unwrap();
    // Field 19 of stat is the nice value; the command name (field 2) may hold spaces, so
    // count from the closing parenthesis.
    let stat = proc_file(tid, "stat");
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let nice = after.split(' ').nth(16).unwrap().parse().unwrap();
    Seen { cpus, policy, nice }
}

/// Each `get` records what its thread sees of itself.
#[derive(Debug)]
struct SelfProbe {
    len: usize,
    seen: Mutex<Vec<(String, Seen)>>,
}

impl SelfProbe {
    fn new(len: usize) -> Self {
        SelfProbe {
            len,
            seen: Mutex::new(Vec::new()),
        }
    }
}

impl Dataset for SelfProbe {
    type Item = [u32; 1];
    fn len(&self) -> usize {
        self.len
    }
    fn get(&self, index: usize) -> Result<[u32; 1], DataError> {
        let name = std::thread::current().name().unwrap_or("").to_owned();
        self.seen
            .lock()
            .unwrap()
            .push((name, seen_by(Tid::current())));
        Ok([index as u32])
    }
}

/// A fake sysfs tree with `nodes` online and a GPU on `node` near `cpus`.
fn fake_topology(dir: &Path, nodes: &str, node: &str, cpus: &str) -> GpuTopology {
    let d = dir.join("devices/system/node");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("online"), nodes).unwrap();
    let dev = dir.join("bus/pci/devices/0000:3b:00.0");
    std::fs::create_dir_all(&dev).unwrap();
    std::fs::write(dev.join("numa_node"), node).unwrap();
    std::fs::write(dev.join("local_cpulist"), cpus).unwrap();
    GpuTopology::from_sysfs(dir, "0000:3B:00.0")
}

/// The process's CPUs, if there are at least 2 (else the test is skipped, with a reason).
fn two_cpus() -> Option<CpuSet> {
    let all = thread::process_affinity().unwrap();
    if all.len() < 2 {
        eprintln!("skipping: this process may run on only {all}");
        return None;
    }
    Some(all)
}

/// Runs `f` on a fresh thread narrowed to `cpu` (threads it starts inherit that).
fn narrowed<R: Send + 'static>(cpu: usize, f: impl FnOnce() -> R + Send + 'static) -> R {
    std::thread::spawn(move || {
        let one: CpuSet = [cpu].into_iter().collect();
        thread::set_affinity(Tid::current(), &one).unwrap();
        f()
    })
    .join()
    .unwrap()
}

/// Runs one epoch.
fn worker_views<F: Fetch>(loader: &DataLoader<F>) {
    for b in loader {
        b.unwrap();
    }
}

fn collect(probe: &SelfProbe) -> Vec<Seen> {
    let seen = std::mem::take(&mut *probe.seen.lock().unwrap());
    assert!(!seen.is_empty());
    for (name, _) in &seen {
        assert!(name.starts_with("longshore-worker-"), "{name}");
    }
    seen.into_iter().map(|(_, s)| s).collect()
}

#[test]
fn explicit_cpus_pin_every_worker_and_are_reported() {
    let all = thread::process_affinity().unwrap();
    let last = all.iter().last().unwrap();
    let probe = std::sync::Arc::new(SelfProbe::new(32));
    let want: CpuSet = [last].into_iter().collect();
    let loader = DataLoader::builder(probe.clone())
        .batch_size(4)
        .num_workers(2)
        .cpu_placement(Placement::Cpus(want.clone()))
        .build()
        .unwrap();
    worker_views(&loader);
    for s in collect(&probe) {
        assert_eq!(s.cpus, want);
    }
    let placement = loader.stats().placement;
    assert_eq!(placement.cpus, Some(want.clone()));
    assert_eq!(loader.placement(), placement);
    assert_eq!(loader.config().options.cpu_placement, Placement::Cpus(want));
    // The consumer thread is not pinned.
    assert_eq!(thread::affinity(Tid::current()).unwrap(), all);
}

#[test]
fn gpu_local_on_two_nodes_pins_workers_to_the_gpu_cpus() {
    let Some(all) = two_cpus() else { return };
    let dir = tempfile::tempdir().unwrap();
    let gpu_cpus = all.to_string();
    let topo = fake_topology(dir.path(), "0-1\n", "1\n", &format!("{gpu_cpus}\n"));
    let first = all.iter().next().unwrap();
    let (seen, placement, pool_node) = narrowed(first, move || {
        let probe = std::sync::Arc::new(SelfProbe::new(32));
        let loader = DataLoader::builder(probe.clone())
            .batch_size(4)
            .num_workers(2)
            .persistent_workers(true)
            .gpu_topology(topo)
            .build()
            .unwrap();
        worker_views(&loader);
        (
            collect(&probe),
            loader.placement(),
            loader.pool().numa_node(),
        )
    });
    // Inherited {first}, widened to the GPU's CPUs.
    for s in seen {
        assert_eq!(s.cpus, all);
    }
    assert_eq!(placement.cpus, Some(all.clone()));
    assert_eq!(placement.gpu_local_cpus, Some(all));
    assert_eq!(placement.numa_node, Some(1));
    // The loader's own pool allocates on the GPU's node.
    assert_eq!(pool_node, Some(1));
}

#[test]
fn placement_off_and_one_node_leave_workers_untouched() {
    let Some(all) = two_cpus() else { return };
    let first = all.iter().next().unwrap();
    let only_first: CpuSet = [first].into_iter().collect();
    for (nodes, placement) in [("0-1\n", Placement::Off), ("0\n", Placement::GpuLocal)] {
        let dir = tempfile::tempdir().unwrap();
        let topo = fake_topology(dir.path(), nodes, "0\n", &format!("{all}\n"));
        let (seen, report, pool_node) = narrowed(first, move || {
            let probe = std::sync::Arc::new(SelfProbe::new(16));
            let loader = DataLoader::builder(probe.clone())
                .batch_size(4)
                .num_workers(2)
                .gpu_topology(topo)
                .cpu_placement(placement)
                .build()
                .unwrap();
            worker_views(&loader);
            (
                collect(&probe),
                loader.placement(),
                loader.pool().numa_node(),
            )
        });
        for s in seen {
            assert_eq!(s.cpus, only_first, "{nodes:?}");
        }
        assert_eq!(report.cpus, None);
        assert_eq!(pool_node, None);
        if nodes == "0\n" {
            // One node: nothing pinned, but the GPU's CPUs are still reported.
            assert_eq!(report.gpu_local_cpus, Some(all.clone()));
            assert!(report.reason.contains("one NUMA node"), "{}", report.reason);
        } else {
            assert!(report.reason.contains("off"), "{}", report.reason);
        }
    }
}

#[test]
fn persistent_workers_follow_a_topology_change() {
    let Some(all) = two_cpus() else { return };
    let first = all.iter().next().unwrap();
    let only_first: CpuSet = [first].into_iter().collect();
    let dir = tempfile::tempdir().unwrap();
    let topo = fake_topology(dir.path(), "0-1\n", "0\n", &format!("{all}\n"));
    let (before, during, after) = narrowed(first, move || {
        let probe = std::sync::Arc::new(SelfProbe::new(16));
        // Without the next epoch's prefetch: the first batches of the next epoch would be
        // loaded at the end of this one, before the topology changes, and be counted with it.
        let loader = DataLoader::builder(probe.clone())
            .batch_size(4)
            .num_workers(2)
            .persistent_workers(true)
            .prefetch_next_epoch(false)
            .build()
            .unwrap();
        worker_views(&loader);
        let before = collect(&probe);
        loader.set_gpu_topology(Some(topo));
        worker_views(&loader);
        let during = collect(&probe);
        loader.set_gpu_topology(None);
        worker_views(&loader);
        (before, during, collect(&probe))
    });
    assert!(before.iter().all(|s| s.cpus == only_first));
    assert!(during.iter().all(|s| s.cpus == all));
    // Lifted: back to the affinity they started with.
    assert!(after.iter().all(|s| s.cpus == only_first), "{after:?}");
}

#[test]
fn gpu_local_without_a_gpu_changes_nothing() {
    let probe = std::sync::Arc::new(SelfProbe::new(8));
    let loader = DataLoader::builder(probe.clone())
        .batch_size(4)
        .num_workers(1)
        .build()
        .unwrap();
    let mine = thread::affinity(Tid::current()).unwrap();
    worker_views(&loader);
    for s in collect(&probe) {
        assert_eq!(s.cpus, mine);
    }
    // The Cpu device has no topology: to_device leaves the workers where they were.
    let mut n = 0;
    for b in loader
        .to_device(&longshore_transfer::Device::cpu(), 2)
        .unwrap()
    {
        b.unwrap().wait().unwrap();
        n += 1;
    }
    assert_eq!(n, 2);
    assert_eq!(loader.placement().cpus, None);
    assert!(loader.placement().reason.contains("no GPU topology"));
}

#[test]
fn background_priority_sets_batch_and_nice_on_workers_only() {
    let me = seen_by(Tid::current());
    let probe = std::sync::Arc::new(SelfProbe::new(16));
    let loader = DataLoader::builder(probe.clone())
        .batch_size(4)
        .num_workers(2)
        .worker_priority(WorkerPriority::Background)
        .build()
        .unwrap();
    assert_eq!(
        loader.config().options.worker_priority,
        WorkerPriority::Background
    );
    worker_views(&loader);
    for s in collect(&probe) {
        assert_eq!(s.policy, libc_sched_batch());
        assert_eq!(s.nice, BACKGROUND_NICE.max(me.nice));
    }
    // The consumer thread is unchanged.
    assert_eq!(seen_by(Tid::current()), me);
}

#[test]
fn normal_priority_leaves_workers_as_their_parent() {
    let me = seen_by(Tid::current());
    let probe = std::sync::Arc::new(SelfProbe::new(8));
    let loader = DataLoader::builder(probe.clone())
        .batch_size(4)
        .num_workers(2)
        .build()
        .unwrap();
    worker_views(&loader);
    for s in collect(&probe) {
        assert_eq!((s.policy, s.nice), (me.policy, me.nice));
    }
}

/// `SCHED_BATCH` (3 on Linux).
fn libc_sched_batch() -> i32 {
    3
}
