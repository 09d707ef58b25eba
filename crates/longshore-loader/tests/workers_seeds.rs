//! Worker identity and randomness: WorkerInfo reaches datasets and worker_init, per-worker
//! seeds differ (pytorch#5059 cannot happen) and reproduce; persistent workers survive epochs;
//! the pool stops allocating after the first epoch.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use longshore_data::{DataError, Dataset, worker};
use longshore_loader::{DataLoader, worker_seed};
use rand::Rng as _;

/// What worker_init saw: (id, num_workers, seed).
type InitLog = Arc<Mutex<Vec<(usize, usize, u64)>>>;

/// Each sample reports (worker id, thread id hash, a random draw from the worker's generator).
#[derive(Debug)]
struct WhoAmI(usize);

impl Dataset for WhoAmI {
    type Item = ([u64; 3],);
    fn len(&self) -> usize {
        self.0
    }
    fn get(&self, _: usize) -> Result<Self::Item, DataError> {
        let info = worker::current().expect("inside a worker");
        let tid = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            std::thread::current().id().hash(&mut h);
            h.finish()
        };
        let draw = worker::with_rng(|r| r.random::<u64>());
        Ok(([info.id as u64, tid, draw],))
    }
}

fn run_epoch(
    loader: &DataLoader<
        impl longshore_loader::Fetch<Output = longshore_data::Batch<longshore_host::PoolBuffer>>,
    >,
) -> Vec<[u64; 3]> {
    let mut out = Vec::new();
    for b in loader {
        let b = b.unwrap();
        out.extend(
            b.tensor::<u64>(0)
                .unwrap()
                .chunks_exact(3)
                .map(|c| [c[0], c[1], c[2]]),
        );
    }
    out
}

#[test]
fn workers_draw_distinct_reproducible_random_streams() {
    let inits = Arc::new(Mutex::new(Vec::new()));
    let i2 = inits.clone();
    let build = |inits: Option<InitLog>| {
        let mut b = DataLoader::builder(WhoAmI(64))
            .batch_size(4)
            .num_workers(4)
            .seed(99);
        if let Some(inits) = inits {
            b = b.worker_init(move |w| inits.lock().unwrap().push((w.id, w.num_workers, w.seed)));
        }
        b.build().unwrap()
    };
    let loader = build(Some(i2));
    let e0 = run_epoch(&loader);
    // First draws of each worker's stream differ between workers.
    let mut first_draw: HashMap<u64, u64> = HashMap::new();
    for s in &e0 {
        first_draw.entry(s[0]).or_insert(s[2]);
    }
    assert_eq!(first_draw.len(), 4, "every worker loaded something");
    let distinct: HashSet<u64> = first_draw.values().copied().collect();
    assert_eq!(distinct.len(), 4, "two workers share a random stream");
    // worker_init saw each worker once with its info and seed.
    let mut seen = inits.lock().unwrap().clone();
    seen.sort();
    let expect: Vec<(usize, usize, u64)> = (0..4).map(|i| (i, 4, worker_seed(99, 0, i))).collect();
    assert_eq!(seen, expect);
    // Same seed and epoch: the same draws (so a resumed run augments identically).
    let again = run_epoch(&build(None));
    let draws = |v: &[[u64; 3]]| v.iter().map(|s| (s[0], s[2])).collect::<Vec<_>>();
    assert_eq!(draws(&e0), draws(&again));
    // The next epoch draws differently.
    let e1 = run_epoch(&loader);
    assert_ne!(draws(&e0), draws(&e1));
}

#[test]
fn persistent_workers_keep_their_threads_across_epochs() {
    let threads = |persistent: bool| {
        let loader = DataLoader::builder(WhoAmI(32))
            .batch_size(4)
            .num_workers(2)
            .persistent_workers(persistent)
            .build()
            .unwrap();
        let a: HashSet<u64> = run_epoch(&loader).iter().map(|s| s[1]).collect();
        let b: HashSet<u64> = run_epoch(&loader).iter().map(|s| s[1]).collect();
        (a, b)
    };
    let (a, b) = threads(true);
    assert_eq!(
        a, b,
        "persistent workers run on the same threads each epoch"
    );
    let (a, b) = threads(false);
    assert!(
        a.is_disjoint(&b),
        "non-persistent workers are new threads each epoch"
    );
}

#[test]
fn pooled_blocks_are_bounded_by_the_in_flight_limit_and_reused_across_epochs() {
    // At most num_workers * prefetch_factor batches are in flight (counted until yielded, as
    // PyTorch counts outstanding tasks), plus the one the consumer holds: so the pool never
    // needs more blocks than that, however many epochs run.
    let (workers, prefetch) = (3, 2);
    let loader = DataLoader::builder(WhoAmI(256))
        .batch_size(16)
        .num_workers(workers)
        .prefetch_factor(prefetch)
        .pin_memory(true)
        .build()
        .unwrap();
    for _ in 0..4 {
        run_epoch(&loader);
    }
    let s = loader.pool().stats();
    assert!(
        s.allocations as usize <= workers * prefetch + 1,
        "{} allocations for at most {} live batches",
        s.allocations,
        workers * prefetch + 1
    );
    assert!(s.hits >= 4 * 16 - s.allocations);
    assert_eq!(s.bytes_in_use, 0);
    assert!(s.peak_bytes_held <= s.budget);
    let st = loader.stats();
    assert_eq!(st.samples, 4 * 256);
    assert!(st.peak_in_flight <= workers * prefetch);
    assert!(st.consumer_time >= st.consumer_wait);
}
