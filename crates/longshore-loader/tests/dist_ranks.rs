//! N ranks simulated in one process on the Cpu device: across ranks, every sample is seen
//! exactly as PyTorch's DistributedSampler prescribes (each index once; with padding, the
//! wrapped-around head twice; with drop_last, the tail never), after set_epoch, and after a
//! mid-epoch resume of each rank.

use std::collections::BTreeMap;

use longshore_data::{DistEnv, DistributedSampler, VecDataset};
use longshore_loader::DataLoader;
use proptest::prelude::*;

type Loader = DataLoader<
    longshore_loader::MapFetch<
        VecDataset<([u32; 1],)>,
        longshore_data::FetchCollate<longshore_data::StackCollate>,
    >,
>;

fn rank_loader(
    len: usize,
    world: usize,
    rank: usize,
    drop_last: bool,
    batch: usize,
    workers: usize,
) -> Loader {
    let env = DistEnv::from_vars(|k| match k {
        "RANK" => Some(rank.to_string()),
        "WORLD_SIZE" => Some(world.to_string()),
        "LOCAL_RANK" => Some(rank.to_string()),
        _ => None,
    })
    .unwrap()
    .unwrap();
    let data = VecDataset::new((0..len as u32).map(|i| ([i],)).collect::<Vec<_>>());
    let mut b = DataLoader::builder(data)
        .sampler(env.sampler(len, true, 7, drop_last).unwrap())
        .batch_size(batch);
    b = b.num_workers(workers);
    b.build().unwrap()
}

fn ids(batch: longshore_data::Batch<longshore_host::PoolBuffer>) -> Vec<usize> {
    batch
        .tensor::<u32>(0)
        .unwrap()
        .iter()
        .map(|&i| i as usize)
        .collect()
}

/// What every rank together must see in `epoch`: PyTorch's padded (or truncated) list.
fn expected_counts(
    len: usize,
    world: usize,
    drop_last: bool,
    epoch: u64,
) -> BTreeMap<usize, usize> {
    let mut s = DistributedSampler::builder(len, world, 0)
        .shuffle(true)
        .seed(7)
        .drop_last(drop_last)
        .build()
        .unwrap();
    longshore_data::Sampler::set_epoch(&mut s, epoch);
    let mut m = BTreeMap::new();
    for i in s.global_indices() {
        *m.entry(i).or_insert(0) += 1;
    }
    m
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn ranks_cover_the_dataset_as_pytorch_prescribes(
        len in 1usize..200, world in 1usize..5, drop_last in any::<bool>(), batch in 1usize..9,
        epoch in 0u64..4, workers in 0usize..3, stop_frac in 0.0f64..1.0,
    ) {
        prop_assume!(!(drop_last && len < world));
        let mut seen: BTreeMap<usize, usize> = BTreeMap::new();
        let mut per_rank = Vec::new();
        for rank in 0..world {
            let loader = rank_loader(len, world, rank, drop_last, batch, workers);
            loader.set_epoch(epoch);
            // Stop part-way, checkpoint, and let a fresh loader finish the epoch.
            let total = loader.len().unwrap();
            let stop = (total as f64 * stop_frac) as usize;
            let mut n = 0;
            let state = {
                let mut it = loader.iter();
                for _ in 0..stop {
                    for i in ids(it.next().unwrap().unwrap()) {
                        *seen.entry(i).or_insert(0) += 1;
                        n += 1;
                    }
                }
                loader.state_dict().unwrap()
            };
            let resumed = rank_loader(len, world, rank, drop_last, batch, workers);
            resumed.load_state_dict(&state).unwrap();
            for b in resumed.iter() {
                for i in ids(b.unwrap()) {
                    *seen.entry(i).or_insert(0) += 1;
                    n += 1;
                }
            }
            per_rank.push(n);
        }
        // Equal shares, and together exactly the prescribed multiset.
        prop_assert!(per_rank.windows(2).all(|w| w[0] == w[1]), "unequal shares {:?}", per_rank);
        let expected = expected_counts(len, world, drop_last, epoch);
        prop_assert_eq!(seen, expected);
    }
}

#[test]
fn without_padding_or_dropping_every_sample_is_seen_exactly_once() {
    for drop_last in [false, true] {
        for epoch in 0..3 {
            let mut all = Vec::new();
            for rank in 0..4 {
                let l = rank_loader(120, 4, rank, drop_last, 7, 2);
                l.set_epoch(epoch);
                for b in l.iter() {
                    all.extend(ids(b.unwrap()));
                }
            }
            all.sort();
            assert_eq!(
                all,
                (0..120).collect::<Vec<_>>(),
                "epoch {epoch} drop_last {drop_last}"
            );
        }
    }
}

#[test]
fn set_epoch_changes_every_ranks_order_identically() {
    let order = |epoch| {
        let l = rank_loader(64, 2, 1, false, 8, 0);
        l.set_epoch(epoch);
        l.iter().flat_map(|b| ids(b.unwrap())).collect::<Vec<_>>()
    };
    assert_eq!(order(1), order(1));
    assert_ne!(order(1), order(2));
}

#[test]
fn launcher_variables_are_read_and_checked() {
    let env = |vars: &[(&str, &str)]| {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        DistEnv::from_vars(move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    };
    let t = env(&[
        ("RANK", "3"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "29500"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(
        (t.rank, t.world_size, t.local_rank, t.master_port),
        (3, 8, 1, Some(29500))
    );
    assert_eq!(t.launcher, longshore_data::Launcher::Torchrun);
    let s = env(&[
        ("SLURM_PROCID", "5"),
        ("SLURM_NTASKS", "6"),
        ("SLURM_LOCALID", "1"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(
        (s.rank, s.world_size, s.local_rank, s.launcher),
        (5, 6, 1, longshore_data::Launcher::Slurm)
    );
    let m = env(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")])
        .unwrap()
        .unwrap();
    assert_eq!(
        (m.rank, m.local_rank, m.launcher),
        (0, 0, longshore_data::Launcher::OpenMpi)
    );
    // torchrun's variables win inside a SLURM allocation.
    let both = env(&[
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "1"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(both.launcher, longshore_data::Launcher::Torchrun);
    assert!(env(&[]).unwrap().is_none());
    for bad in [
        &[("RANK", "2"), ("WORLD_SIZE", "2")][..],
        &[("RANK", "x"), ("WORLD_SIZE", "2")],
        &[("RANK", "0"), ("WORLD_SIZE", "0")],
        &[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "99999")],
    ] {
        let e = env(bad).unwrap_err().to_string();
        assert!(
            e.contains("RANK")
                || e.contains("WORLD_SIZE")
                || e.contains("MASTER_PORT")
                || e.contains("world_size"),
            "{e}"
        );
    }
}

/// Rank 0's state after one batch of 32, 100 samples over 2 ranks.
fn after_one_batch_of_two_ranks() -> longshore_loader::LoaderState {
    let two = rank_loader(100, 2, 0, false, 32, 0);
    let mut it = two.iter();
    it.next().unwrap().unwrap();
    let state = two.state_dict().unwrap();
    drop(it);
    state
}

/// A checkpoint of one rank's share records its number of ranks and batch size; on the same
/// number it resumes the rank's own epoch exactly.
#[test]
fn a_checkpoint_records_its_ranks_and_resumes_on_the_same_number_exactly() {
    let state = after_one_batch_of_two_ranks();
    assert_eq!((state.num_replicas, state.batch_size), (Some(2), Some(32)));
    let json = serde_json::to_string(&state).unwrap();
    assert!(json.contains("\"num_replicas\":2"), "{json}");

    let again = rank_loader(100, 2, 0, false, 32, 2);
    again.load_state_dict(&state).unwrap();
    let rest: Vec<Vec<usize>> = again.iter().map(|b| ids(b.unwrap())).collect();
    let whole: Vec<Vec<usize>> = rank_loader(100, 2, 0, false, 32, 0)
        .iter()
        .map(|b| ids(b.unwrap()))
        .collect();
    assert_eq!(rest, whole[1..]);

    // A loader without a DistributedSampler records none.
    let plain = DataLoader::builder(VecDataset::new(vec![([1u32],); 10]))
        .batch_size(4)
        .build()
        .unwrap();
    assert_eq!(plain.state_dict().unwrap().num_replicas, None);
}

/// On another number of ranks, a state without its batch size (older) or taken after batches
/// delivered out of order is refused by name, and the loader is left as it was.
#[test]
fn a_checkpoint_that_cannot_say_what_was_consumed_is_refused_on_other_ranks() {
    let state = after_one_batch_of_two_ranks();
    let three = rank_loader(100, 3, 0, false, 32, 0);
    let mut old = state.clone();
    old.batch_size = None;
    let err = three.load_state_dict(&old).unwrap_err().to_string();
    assert!(err.contains("does not say its batch size"), "{err}");
    let mut unordered = state.clone();
    unordered.done_extra = vec![2];
    let err = three.load_state_dict(&unordered).unwrap_err().to_string();
    assert!(err.contains("out of order"), "{err}");
    assert_eq!(
        three.iter().count(),
        2,
        "its own epoch: 34 samples in batches of 32"
    );
    // The same number of ranks loads an older state (no batch size) as before.
    rank_loader(100, 2, 0, false, 32, 0)
        .load_state_dict(&old)
        .unwrap();
}

/// Every rank's delivered indices of `epoch`, each rank's loader made by `make(rank)` and
/// given `state` first; `take`: batches a rank delivers before its state is taken (all when
/// `None`). Returns the indices and the state rank 0 took after them.
fn run_ranks(
    world: usize,
    make: impl Fn(usize) -> Loader,
    state: Option<&longshore_loader::LoaderState>,
    take: Option<usize>,
) -> (Vec<usize>, longshore_loader::LoaderState) {
    let mut seen = Vec::new();
    let mut taken = None;
    let mut per_rank = Vec::new();
    for rank in 0..world {
        let loader = make(rank);
        if let Some(s) = state {
            loader.load_state_dict(s).unwrap();
        }
        let mut it = loader.iter();
        let mut n = 0;
        while take.is_none_or(|k| n < k) {
            let Some(b) = it.next() else { break };
            seen.extend(ids(b.unwrap()));
            n += 1;
        }
        per_rank.push(n);
        if rank == 0 {
            taken = Some(loader.state_dict().unwrap());
        }
        drop(it);
    }
    assert!(
        per_rank.iter().all(|&n| n == per_rank[0]),
        "every rank the same number of batches: {per_rank:?}"
    );
    (seen, taken.unwrap())
}

fn sampler_loader(
    len: usize,
    world: usize,
    rank: usize,
    drop_last: bool,
    batch: usize,
    workers: usize,
) -> Loader {
    let data = VecDataset::new((0..len as u32).map(|i| ([i],)).collect::<Vec<_>>());
    let sampler = DistributedSampler::builder(len, world, rank)
        .shuffle(true)
        .seed(11)
        .drop_last(drop_last)
        .build()
        .unwrap();
    DataLoader::builder(data)
        .sampler(sampler)
        .batch_size(batch)
        .num_workers(workers)
        .seed(3)
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// A checkpoint taken on `w1` ranks with batches of `b1` resumes on `w2` ranks with
    /// batches of `b2`, and a checkpoint of that resumed epoch on `w3` ranks with `b3`: every
    /// rank yields the same number of batches, and over the three runs every sample is
    /// delivered (at least once; duplicates only as DistributedSampler's padding, at most a
    /// rank's worth per run), or with the sampler's drop_last at most once (at most a rank's
    /// worth per run left out).
    #[test]
    fn a_checkpoint_resumes_on_other_numbers_of_ranks_and_batch_sizes(
        len in 1usize..90,
        (w1, w2, w3) in (1usize..5, 1usize..5, 1usize..5),
        (b1, b2, b3) in (1usize..9, 1usize..9, 1usize..9),
        (f1, f2) in (0.0f64..1.0, 0.0f64..1.0),
        drop_last in any::<bool>(),
        workers in 0usize..3,
    ) {
        let mk = |w: usize, b: usize| move |rank: usize| sampler_loader(len, w, rank, drop_last, b, workers);
        let n1 = mk(w1, b1)(0).len().unwrap();
        let k1 = (f1 * n1 as f64) as usize;
        let (mut seen, s1) = run_ranks(w1, mk(w1, b1), None, Some(k1));
        let n2 = {
            let l = mk(w2, b2)(0);
            l.load_state_dict(&s1).unwrap();
            l.len().unwrap()
        };
        let k2 = (f2 * n2 as f64) as usize;
        let (more, s2) = run_ranks(w2, mk(w2, b2), Some(&s1), Some(k2));
        seen.extend(more);
        // A state taken once the second run finished the epoch is the next epoch's start.
        if s2.epoch == s1.epoch {
            let (rest, _) = run_ranks(w3, mk(w3, b3), Some(&s2), None);
            seen.extend(rest);
        }
        let mut counts = vec![0usize; len];
        for &i in &seen {
            counts[i] += 1;
        }
        let slack = w1 + w2 + w3;
        if drop_last {
            prop_assert!(counts.iter().all(|&c| c <= 1), "{counts:?}");
            let missing = counts.iter().filter(|&&c| c == 0).count();
            prop_assert!(missing < slack, "{missing} left out: {counts:?}");
        } else {
            prop_assert!(counts.iter().all(|&c| c >= 1), "{counts:?}");
            prop_assert!(seen.len() - len < slack, "{} repeats: {counts:?}", seen.len() - len);
        }
    }
}
