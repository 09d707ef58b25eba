//! Mixtures of sharded datasets (`ShardedDataset::mixture`) through the loader's own API,
//! property-tested over member sizes, weights, stop rules, ranks, workers, batch sizes,
//! `drop_last` and resume points: every rank yields `len()` batches; the samples delivered are
//! the schedule's (per member, the mixture's draws; `first_exhausted` never repeats a sample,
//! `all_exhausted` draws every one); a checkpoint resumes exactly on the same layout and, on
//! another number of workers or ranks, delivers the rest of the epoch's draws. Then the same
//! mixture of two WebDataset members in the in-process S3 server over 2 ranks x 2 workers,
//! resumed on 3 ranks; a `Samples(n)` epoch resumed with other weights; refusals.

mod support;

use std::collections::BTreeMap;

use longshore_data::dataset::mixture::Stop;
use longshore_shards::ShardError;
use longshore_shards::dataset::ShardedDataset;
use proptest::prelude::*;
use support::data::{
    Read, Seen, checkpoint_after, delivered, epoch_of_ranks, pattern, rank_loader, ranks_of,
    resume_ranks, take_batches, write_shards,
};

/// Member `s`'s shards (`write_shards` numbers each member's samples from 0 in `val`).
fn write_members(root: &std::path::Path, members: &[Vec<u64>]) -> Vec<String> {
    members
        .iter()
        .enumerate()
        .map(|(s, counts)| {
            let dir = root.join(format!("m{s}"));
            write_shards(&dir, counts);
            pattern(&dir.display().to_string(), counts.len())
        })
        .collect()
}

fn member(url: &str) -> ShardedDataset {
    ShardedDataset::webdataset([url.to_owned()])
        .rank(0)
        .world_size(1)
        .build()
        .unwrap()
}

/// Member of each global id, and the id's place in its member (its `val`).
struct Ids(Vec<u64>);

impl Ids {
    fn new(members: &[Vec<u64>]) -> Ids {
        let mut starts = vec![0];
        for m in members {
            starts.push(starts.last().unwrap() + m.iter().sum::<u64>());
        }
        Ids(starts)
    }

    fn member(&self, global: u64) -> usize {
        self.0.partition_point(|&s| s <= global) - 1
    }

    fn check(&self, s: &Seen) {
        let m = self.member(s.global);
        assert_eq!(
            s.val,
            s.global - self.0[m],
            "sample {} of member {m}",
            s.global
        );
    }
}

#[derive(Debug, Clone)]
struct Case {
    members: Vec<Vec<u64>>,
    weights: Vec<f64>,
    stop: Stop,
    world: usize,
    workers: usize,
    workers2: usize,
    world2: usize,
    batch_size: usize,
    drop_last: bool,
    seed: u64,
    shuffle_block: u64,
    epoch: u64,
    cut: f64,
}

fn case() -> impl Strategy<Value = Case> {
    let member =
        prop::collection::vec(0u64..9, 1..4).prop_filter("samples", |c| c.iter().sum::<u64>() > 0);
    (
        prop::collection::vec(member, 2..4),
        prop::collection::vec(1u32..6, 3),
        prop_oneof![
            Just(Stop::FirstExhausted),
            Just(Stop::AllExhausted),
            (1u64..60).prop_map(Stop::Samples)
        ],
        (1usize..3, 0usize..3, 0usize..3, 1usize..4),
        (1usize..5, any::<bool>(), any::<u64>()),
        prop_oneof![Just(0u64), Just(4), Just(u64::MAX)],
        (0u64..3, 0.0f64..1.0),
    )
        .prop_map(
            |(
                members,
                w,
                stop,
                (world, workers, workers2, world2),
                (batch_size, drop_last, seed),
                shuffle_block,
                (epoch, cut),
            )| Case {
                weights: w[..members.len()].iter().map(|&x| f64::from(x)).collect(),
                members,
                stop,
                world,
                workers,
                workers2,
                world2,
                batch_size,
                drop_last,
                seed,
                shuffle_block,
                epoch,
                cut,
            },
        )
}

/// The non-padding samples of `seen`, counted by global id.
fn multiset<'a>(seen: impl IntoIterator<Item = &'a Seen>) -> BTreeMap<u64, u64> {
    let mut m = BTreeMap::new();
    for s in seen.into_iter().filter(|s| !s.pad) {
        *m.entry(s.global).or_insert(0) += 1;
    }
    m
}

fn run(c: &Case) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let urls = write_members(dir.path(), &c.members);
    let members: Vec<ShardedDataset> = urls.iter().map(|u| member(u)).collect();
    let refs: Vec<&ShardedDataset> = members.iter().collect();
    let ids = Ids::new(&c.members);
    let ranks = |world| {
        ranks_of(world, || {
            ShardedDataset::mixture(&refs, &c.weights, c.stop)
                .unwrap()
                .seed(c.seed)
                .shuffle_block(c.shuffle_block)
                .cache_dir(dir.path().join("cache"))
        })
    };
    let read = Read::new(c.batch_size, c.workers)
        .drop_last(c.drop_last)
        .epoch(c.epoch);

    // The uninterrupted epoch, per rank.
    let datasets = ranks(c.world);
    let draws = datasets[0].member_draws().unwrap();
    prop_assert_eq!(draws.iter().sum::<u64>(), datasets[0].len());
    let full = epoch_of_ranks(&datasets, read);
    let n = full[0].len();
    let plan = datasets[0].plan(c.epoch).unwrap();
    let all: Vec<Seen> = full.iter().flatten().flatten().copied().collect();
    all.iter().for_each(|s| ids.check(s));
    let got = multiset(&all);
    let real: u64 = got.values().sum();
    prop_assert_eq!(real, datasets[0].len() - plan.dropped());
    prop_assert_eq!(all.iter().filter(|s| s.pad).count() as u64, plan.padding());
    if !c.drop_last {
        // Per member, the schedule's draws.
        let mut by_member = vec![0u64; c.members.len()];
        for (g, k) in &got {
            by_member[ids.member(*g)] += k;
        }
        prop_assert_eq!(&by_member, &draws);
        let sizes: Vec<u64> = c.members.iter().map(|m| m.iter().sum()).collect();
        match c.stop {
            Stop::FirstExhausted => prop_assert!(got.values().all(|&k| k == 1), "a repeat"),
            Stop::AllExhausted => prop_assert_eq!(
                got.len() as u64,
                sizes.iter().sum::<u64>(),
                "every sample drawn"
            ),
            _ => {}
        }
    }
    if n == 0 {
        return Ok(());
    }
    // Interrupted after k batches; on the same layout, exactly the rest of the uninterrupted
    // run.
    let k = ((n as f64) * c.cut) as usize;
    let state = checkpoint_after(&ranks(c.world), read, &full, k);
    for (rank, rest) in resume_ranks(&ranks(c.world), read, &state)
        .iter()
        .enumerate()
    {
        prop_assert_eq!(&rest[..], &full[rank][k..], "rank {}'s rest", rank);
    }
    // Another number of ranks and workers: the rest of the epoch's draws, each once.
    let mut seen: Vec<Seen> = full
        .iter()
        .flat_map(|f| f[..k].iter().flatten().copied())
        .collect();
    let rest = resume_ranks(&ranks(c.world2), read.workers(c.workers2), &state);
    seen.extend(rest.into_iter().flatten().flatten());
    seen.iter().for_each(|s| ids.check(s));
    let again = multiset(&seen);
    if c.drop_last {
        // Only what drop_last leaves out (at most a batch per rank, per segment) differs.
        let (a, b): (u64, u64) = (again.values().sum(), datasets[0].len());
        prop_assert!(a <= b && b - a < 2 * (c.world.max(c.world2) * c.batch_size) as u64);
    } else {
        prop_assert_eq!(
            again,
            got,
            "the resumed epoch draws what the whole one drew"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn mixtures_through_the_loader_and_resume(c in case()) {
        run(&c)?;
    }
}

/// Two WebDataset members in S3 (the in-process server), 2 ranks x 2 workers: the realised
/// proportions are the weights', the repeats of the small member are augmented anew, and a
/// checkpoint resumes on 3 ranks with the rest of the epoch.
#[test]
fn two_buckets_worth_of_shards_mixed_over_ranks_and_resumed_on_three() {
    let server = support::s3::start();
    let local = tempfile::tempdir().unwrap();
    let counts = [vec![40u64, 35, 45], vec![9u64, 6]];
    for (s, c) in counts.iter().enumerate() {
        let dir = local.path().join(format!("m{s}"));
        write_shards(&dir, c);
        for i in 0..c.len() {
            let name = format!("shard-{i:06}.tar");
            server.put(
                &format!("mix/m{s}/{name}"),
                &std::fs::read(dir.join(&name)).unwrap(),
            );
        }
        server.put(
            &format!("mix/m{s}/shard-index.json"),
            &std::fs::read(dir.join("shard-index.json")).unwrap(),
        );
    }
    let store = server.store_builder().build();
    let members: Vec<ShardedDataset> = (0..2)
        .map(|s| {
            ShardedDataset::webdataset([pattern(
                &server.url(&format!("mix/m{s}")),
                counts[s].len(),
            )])
            .store(store.clone())
            .rank(0)
            .world_size(1)
            .build()
            .unwrap()
        })
        .collect();
    let ids = Ids::new(&counts);
    let cache = tempfile::tempdir().unwrap();
    let ranks = |world| {
        ranks_of(world, || {
            ShardedDataset::mixture(&[&members[0], &members[1]], &[0.7, 0.3], Stop::AllExhausted)
                .unwrap()
                .seed(3)
                .shuffle_block(32)
                .cache_dir(cache.path())
        })
    };
    let datasets = ranks(2);
    // The first member's 120 samples at 70% of the positions: the second member's 15 samples
    // drawn again and again.
    let draws = datasets[0].member_draws().unwrap();
    assert_eq!(draws.iter().sum::<u64>(), datasets[0].len());
    assert_eq!(draws[0], 120);
    let read = Read::new(8, 2);
    let full: Vec<Vec<Vec<Seen>>> = datasets
        .iter()
        .map(|d| delivered(take_batches(&rank_loader(d, read), None)))
        .collect();
    let all: Vec<Seen> = full.iter().flatten().flatten().copied().collect();
    all.iter().for_each(|s| ids.check(s));
    let got = multiset(&all);
    let mut by_member = [0u64; 2];
    for (g, k) in &got {
        by_member[ids.member(*g)] += k;
    }
    assert_eq!(by_member.to_vec(), draws);
    // The datasets' own counts: every sample its workers read (padding repeats included).
    let mut yielded = [0u64; 2];
    for s in &all {
        yielded[ids.member(s.global)] += 1;
    }
    let counted: Vec<u64> = (0..2)
        .map(|m| datasets.iter().map(|d| d.stats().members[m]).sum())
        .collect();
    assert_eq!(counted, yielded.to_vec());
    let share = draws[0] as f64 / datasets[0].len() as f64;
    assert!((share - 0.7).abs() < 0.01, "realised share {share}");
    // A repeated sample is augmented anew in its later pass.
    let mut seeds: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for s in all.iter().filter(|s| !s.pad) {
        seeds.entry(s.global).or_default().push(s.seed);
    }
    let repeated: Vec<_> = seeds.values().filter(|v| v.len() > 1).collect();
    assert!(!repeated.is_empty());
    for v in repeated {
        let mut d = v.clone();
        d.sort_unstable();
        d.dedup();
        assert_eq!(d.len(), v.len(), "a repeat drew the same augmentation seed");
    }
    // Checkpoint after 5 batches per rank; resume on 3 ranks with 1 worker each.
    let k = 5;
    let mut seen: Vec<Seen> = full
        .iter()
        .flat_map(|f| f[..k].iter().flatten().copied())
        .collect();
    let loader = rank_loader(&ranks(2)[0], read);
    let _ = delivered(take_batches(&loader, Some(k)));
    let state = loader.state_dict().unwrap();
    for ds in &ranks(3) {
        let loader = rank_loader(ds, read.workers(1));
        loader.load_state_dict(&state).unwrap();
        seen.extend(delivered(take_batches(&loader, None)).into_iter().flatten());
    }
    assert_eq!(
        multiset(&seen),
        got,
        "the resumed epoch draws what the whole one drew"
    );
}

/// A `Samples(n)` epoch keeps its length with other weights: a checkpoint loads, and the
/// positions left follow the new weights.
#[test]
fn a_fixed_length_epoch_resumes_with_other_weights() {
    let dir = tempfile::tempdir().unwrap();
    let counts = [vec![30u64, 30], vec![30u64, 30]];
    let urls = write_members(dir.path(), &counts);
    let members: Vec<ShardedDataset> = urls.iter().map(|u| member(u)).collect();
    let ids = Ids::new(&counts);
    let mixture = |w: [f64; 2], stop| {
        ShardedDataset::mixture(&[&members[0], &members[1]], &w, stop)
            .unwrap()
            .rank(0)
            .world_size(1)
            .cache_dir(dir.path().join("cache"))
            .build()
            .unwrap()
    };
    let mix = |w| mixture(w, Stop::Samples(100));
    let read = Read::new(10, 1);
    let first = rank_loader(&mix([1.0, 1.0]), read);
    let head = delivered(take_batches(&first, Some(5)));
    let state = first.state_dict().unwrap();
    let again = rank_loader(&mix([9.0, 1.0]), read);
    again.load_state_dict(&state).unwrap();
    let rest = delivered(take_batches(&again, None));
    assert_eq!(head.len() + rest.len(), 10);
    let count = |b: &[Vec<Seen>], m: usize| {
        b.iter()
            .flatten()
            .filter(|s| ids.member(s.global) == m)
            .count()
    };
    assert!(
        (20..=30).contains(&count(&head, 1)),
        "half of the first 50 from member 1"
    );
    assert!(
        count(&rest, 1) <= 10,
        "a tenth of the last 50 from member 1: {}",
        count(&rest, 1)
    );
    // Another stop rule's length changes with the weights: refused, naming the lengths.
    let dataset = |w| mixture(w, Stop::FirstExhausted);
    let first = rank_loader(&dataset([1.0, 1.0]), read);
    let _ = delivered(take_batches(&first, Some(2)));
    let state = first.state_dict().unwrap();
    let again = rank_loader(&dataset([3.0, 1.0]), read);
    let err = again.load_state_dict(&state).and_then(|()| {
        take_batches(&again, None)
            .into_iter()
            .find_map(Result::err)
            .map_or(Ok(()), |e| Err(longshore_loader::LoaderError::State(e)))
    });
    assert!(err.is_err(), "a checkpoint of another length resumed");
}

#[test]
fn mixtures_that_cannot_be_made_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let urls = write_members(dir.path(), &[vec![5], vec![4]]);
    let (a, b) = (member(&urls[0]), member(&urls[1]));
    let refused = |r: Result<_, ShardError>| r.map(|_| ()).unwrap_err().to_string();
    let e = refused(ShardedDataset::mixture(
        &[&a, &b],
        &[1.0],
        Stop::FirstExhausted,
    ));
    assert!(e.contains("1 weights for 2 members"), "{e}");
    let e = refused(ShardedDataset::mixture(
        &[&a, &b],
        &[1.0, -1.0],
        Stop::FirstExhausted,
    ));
    assert!(e.contains("weights"), "{e}");
    let e = refused(ShardedDataset::mixture(&[], &[], Stop::FirstExhausted));
    assert!(e.contains("needs a member"), "{e}");
    let mixed = ShardedDataset::mixture(&[&a, &b], &[1.0, 1.0], Stop::FirstExhausted)
        .unwrap()
        .rank(0)
        .world_size(1)
        .build()
        .unwrap();
    let e = refused(ShardedDataset::mixture(
        &[&mixed, &a],
        &[1.0, 1.0],
        Stop::FirstExhausted,
    ));
    assert!(e.contains("member 0 is a mixture"), "{e}");
    // The spec travels to other ranks as JSON, the mixture with it.
    let spec = longshore_shards::dataset::DatasetSpec::from_json(&mixed.spec().to_json()).unwrap();
    assert_eq!(&spec, mixed.spec());
    assert_eq!(
        ShardedDataset::from_spec(spec)
            .rank(0)
            .world_size(1)
            .build()
            .unwrap()
            .len(),
        mixed.len()
    );
}

/// The guide's example (docs/guide/migrating-from-pytorch.md, "Mixtures of sharded datasets").
#[test]
fn the_guides_example() {
    use longshore_shards::webdataset::ShardWriter;
    let dir = tempfile::tempdir().unwrap();
    let mut members = Vec::new();
    for (name, n) in [("web", 700), ("books", 100)] {
        let mut w = ShardWriter::new(dir.path().join(name), 16 << 10).unwrap();
        for i in 0..n {
            w.write(&format!("{name}{i:04}"), &[("txt", name.as_bytes())])
                .unwrap();
        }
        let last = w.finish().unwrap().shardlist.len() - 1;
        let urls = format!(
            "{}/{name}/shard-{{000000..{last:06}}}.tar",
            dir.path().display()
        );
        members.push(ShardedDataset::webdataset([urls]).build().unwrap());
    }
    let mix = ShardedDataset::mixture(&[&members[0], &members[1]], &[0.7, 0.3], Stop::AllExhausted)
        .unwrap()
        .seed(0)
        .cache_dir(dir.path().join("cache"))
        .build()
        .unwrap();
    assert_eq!(mix.member_draws(), Some(vec![700, 300]));
}

/// A damaged member: a mixture of it is refused under `Raise`, naming the shard; under
/// `Skip` every rank still yields its planned batches, the failed samples (all of the damaged
/// shard) counted and made up for.
#[test]
fn a_damaged_member_is_named_or_its_losses_counted_on_every_rank() {
    use longshore_loader::SampleErrorPolicy;
    use longshore_shards::dataset::OnSampleError;
    use support::data::{planned, run_rank, truncate};
    let dir = tempfile::tempdir().unwrap();
    let counts = [vec![9u64, 7, 11], vec![13u64, 6]];
    let urls = write_members(dir.path(), &counts);
    truncate(&dir.path().join("m1"), 0, 6); // member 1's first shard: cut in sample 6 of 13
    let members: Vec<ShardedDataset> = urls
        .iter()
        .map(|u| {
            ShardedDataset::webdataset([u.clone()])
                .rank(0)
                .world_size(1)
                .on_sample_error(OnSampleError::Skip)
                .build()
                .unwrap()
        })
        .collect();
    let ids = Ids::new(&counts);
    let mixture = || {
        ShardedDataset::mixture(&[&members[0], &members[1]], &[1.0, 1.0], Stop::AllExhausted)
            .unwrap()
            .cache_dir(dir.path().join("cache"))
    };
    let err = mixture().rank(0).world_size(1).build().unwrap_err();
    assert!(
        matches!(&err, ShardError::Damaged { shard, .. } if shard.ends_with("m1/shard-000000.tar")),
        "{err}"
    );
    for drop_last in [false, true] {
        let (mut failed, mut padded) = (0, 0);
        let mut seen = Vec::new();
        for ds in ranks_of(2, || mixture().on_sample_error(OnSampleError::Skip)) {
            let read = Read::new(4, 2)
                .drop_last(drop_last)
                .policy(SampleErrorPolicy::Skip);
            let batches = run_rank(&ds, read, None);
            assert_eq!(batches.len(), planned(&ds, read), "drop_last {drop_last}");
            let stats = ds.stats();
            failed += stats.failed();
            padded += stats.padded;
            seen.extend(delivered(batches).into_iter().flatten());
        }
        assert!(
            failed > 0 && failed == padded,
            "{failed} failed, {padded} padded"
        );
        seen.iter().for_each(|s| ids.check(s));
        // What is lost is of the damaged shard (member 1's globals 27..40, from sample 6 on,
        // the 5 before the cut possibly distrusted).
        let got: std::collections::BTreeSet<u64> =
            seen.iter().filter(|s| !s.pad).map(|s| s.global).collect();
        if !drop_last {
            let lost: Vec<u64> = (0..46).filter(|g| !got.contains(g)).collect();
            assert!(lost.iter().all(|g| (27 + 5..40).contains(g)), "{lost:?}");
        }
    }
}
