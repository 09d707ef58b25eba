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

/// A checkpoint of one rank's share is refused on another number of ranks, also when the
/// batch counts happen to agree (100 samples, batch 32: 50 a rank on 2 ranks and 34 on 3 are
/// both 2 batches), which without the recorded rank count resumed a position in another list.
#[test]
fn a_checkpoint_resumes_on_the_same_number_of_ranks_only() {
    let two = rank_loader(100, 2, 0, false, 32, 0);
    let mut it = two.iter();
    it.next().unwrap().unwrap();
    let state = two.state_dict().unwrap();
    drop(it);
    assert_eq!(state.num_replicas, Some(2));
    let json = serde_json::to_string(&state).unwrap();
    assert!(json.contains("\"num_replicas\":2"), "{json}");

    let three = rank_loader(100, 3, 0, false, 32, 0);
    assert_eq!(
        three.len(),
        two.len(),
        "the case where the batch counts agree"
    );
    let err = three.load_state_dict(&state).unwrap_err().to_string();
    assert!(
        err.contains("over 2 ranks") && err.contains("over 3") && err.contains("same number"),
        "{err}"
    );
    // Refused: the loader is as it was, and yields its own full epoch.
    assert_eq!(three.iter().count(), 2);

    // The same number of ranks resumes: the second batch of rank 0's epoch.
    let again = rank_loader(100, 2, 0, false, 32, 2);
    again.load_state_dict(&state).unwrap();
    let rest: Vec<Vec<usize>> = again.iter().map(|b| ids(b.unwrap())).collect();
    let whole: Vec<Vec<usize>> = rank_loader(100, 2, 0, false, 32, 0)
        .iter()
        .map(|b| ids(b.unwrap()))
        .collect();
    assert_eq!(rest, whole[1..]);

    // A state from before the field (or of a loader without such a sampler) still loads.
    let mut old = state.clone();
    old.num_replicas = None;
    let fresh = rank_loader(100, 2, 0, false, 32, 0);
    fresh.load_state_dict(&old).unwrap();
    // And a loader without a DistributedSampler records none.
    let plain = DataLoader::builder(VecDataset::new(vec![([1u32],); 10]))
        .batch_size(4)
        .build()
        .unwrap();
    assert_eq!(plain.state_dict().unwrap().num_replicas, None);
}
