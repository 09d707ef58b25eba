//! A `Mixture` through the loader: shuffled positions on worker threads, the loader's epoch
//! reaching the members' orders, the realised draws equal to the schedule's, and a checkpoint
//! resumed on another number of workers giving the uninterrupted run's batches.

use std::collections::BTreeMap;

use longshore::data::dataset::mixture::{Mixture, Stop};
use longshore::prelude::*;

type Members = VecDataset<([u32; 2],)>;

fn mixture() -> Mixture<Members> {
    let members = [(0u32, 300u32), (1, 90), (2, 40)]
        .into_iter()
        .map(|(s, n)| VecDataset::new((0..n).map(|i| ([s, i],)).collect()))
        .collect();
    Mixture::new(members, &[5.0, 3.0, 2.0], Stop::AllExhausted)
        .unwrap()
        .seed(4)
}

fn rows(loader: &StackLoader<Mixture<Members>>) -> Vec<Vec<[u32; 2]>> {
    loader
        .iter()
        .map(|b| {
            let b = b.unwrap();
            b.tensor::<u32>(0)
                .unwrap()
                .chunks(2)
                .map(|c| [c[0], c[1]])
                .collect()
        })
        .collect()
}

fn loader(workers: usize) -> StackLoader<Mixture<Members>> {
    DataLoader::builder(mixture())
        .batch_size(16)
        .shuffle(true)
        .seed(2)
        .num_workers(workers)
        .build()
        .unwrap()
}

#[test]
fn draws_match_the_schedule_and_resume_on_other_worker_counts() {
    let m = mixture();
    let whole = loader(2);
    let mut orders = Vec::new();
    for epoch in [0u64, 1] {
        whole.set_epoch(epoch);
        let batches = rows(&whole);
        let mut draws: BTreeMap<u32, u64> = BTreeMap::new();
        for r in batches.iter().flatten() {
            *draws.entry(r[0]).or_default() += 1;
        }
        assert_eq!(draws.values().copied().collect::<Vec<_>>(), m.draws());
        // Every position once: the rows are the mixture's items for this epoch.
        m.set_epoch(epoch);
        let mut want: Vec<[u32; 2]> = (0..m.len()).map(|p| m.get(p).unwrap().0).collect();
        let mut got: Vec<[u32; 2]> = batches.iter().flatten().copied().collect();
        want.sort_unstable();
        got.sort_unstable();
        assert_eq!(got, want, "epoch {epoch}");
        // Resumed after 5 batches on 0 and on 3 workers.
        for workers in [0, 3] {
            let first = loader(2);
            first.set_epoch(epoch);
            let state = {
                let mut it = first.iter();
                for _ in 0..5 {
                    it.next().unwrap().unwrap();
                }
                first.state_dict().unwrap()
            };
            let second = loader(workers);
            second.load_state_dict(&state).unwrap();
            assert_eq!(
                rows(&second),
                batches[5..],
                "epoch {epoch}, {workers} workers"
            );
        }
        orders.push(batches);
    }
    assert_ne!(
        orders[0], orders[1],
        "the loader's epoch reaches the members' orders"
    );
}

#[test]
fn a_checkpoint_of_other_weights_is_refused_by_name() {
    let first = loader(2);
    let state = {
        let mut it = first.iter();
        it.next().unwrap().unwrap();
        first.state_dict().unwrap()
    };
    // Other weights: another schedule, another epoch length.
    let members: Vec<Members> = mixture().members().to_vec();
    let other = Mixture::new(members, &[1.0, 1.0, 1.0], Stop::AllExhausted).unwrap();
    assert_ne!(other.len(), mixture().len());
    let resumed = DataLoader::builder(other)
        .batch_size(16)
        .shuffle(true)
        .seed(2)
        .build()
        .unwrap();
    let e = resumed.load_state_dict(&state).unwrap_err().to_string();
    assert!(e.contains(&mixture().len().to_string()), "{e}");
}

#[test]
fn with_a_fixed_epoch_new_weights_apply_from_the_checkpoint_on() {
    let members = || mixture().members().to_vec();
    let make = |weights: &[f64]| {
        let m = Mixture::new(members(), weights, Stop::Samples(320)).unwrap();
        DataLoader::builder(m)
            .batch_size(16)
            .shuffle(true)
            .seed(2)
            .build()
            .unwrap()
    };
    let first = make(&[5.0, 3.0, 2.0]);
    let state = {
        let mut it = first.iter();
        for _ in 0..10 {
            it.next().unwrap().unwrap();
        }
        first.state_dict().unwrap()
    };
    // Only member 2 from here on: the 10 batches left read it alone.
    let second = make(&[0.0, 0.0, 1.0]);
    second.load_state_dict(&state).unwrap();
    let rest = rows(&second);
    assert_eq!(rest.len(), 10);
    assert!(rest.iter().flatten().all(|r| r[0] == 2), "{rest:?}");
}
