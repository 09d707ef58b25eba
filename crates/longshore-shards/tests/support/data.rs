//! Shards to read and the loader runs of the dataset tests.

use std::path::Path;

use longshore_data::{IterMap, IterableExt, StackCollate};
use longshore_loader::{DataLoader, IterableLoader, SampleErrorPolicy};
use longshore_shards::dataset::{ShardSample, ShardedDataset};
use longshore_shards::webdataset::{ShardIndex, ShardWriter};

/// What the tests see of a delivered sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Seen {
    pub global: u64,
    pub pad: bool,
    pub seed: u64,
    /// The `val` field's value (the sample's global id, as written).
    pub val: u64,
}

/// Writes `counts[i]` samples into shard `i` of `dir` (`shard-000000.tar`, ...) with fields
/// `val` (the global id as text) and `bin` (a few bytes that depend on it), and the
/// writer's `shard-index.json`. Returns the index.
pub fn write_shards(dir: &Path, counts: &[u64]) -> ShardIndex {
    std::fs::create_dir_all(dir).unwrap();
    let mut index = ShardIndex::default();
    let mut global = 0u64;
    for (i, &n) in counts.iter().enumerate() {
        // One ShardWriter per shard keeps the sample counts exact (a size target would not).
        let sub = dir.join(format!(".w{i}"));
        let mut w = ShardWriter::new(&sub, u64::MAX).unwrap();
        for _ in 0..n {
            let val = global.to_string();
            let bin = vec![(global % 251) as u8; 1 + (global % 700) as usize];
            w.write(
                &format!("s{global:07}"),
                &[("val", val.as_bytes()), ("bin", &bin)],
            )
            .unwrap();
            global += 1;
        }
        let name = format!("shard-{i:06}.tar");
        if n == 0 {
            // An empty tar (just the end-of-archive blocks).
            std::fs::write(dir.join(&name), [0u8; 1024]).unwrap();
            index
                .shardlist
                .push(longshore_shards::webdataset::ShardEntry {
                    url: name,
                    nsamples: 0,
                    filesize: Some(1024),
                });
        } else {
            let written = w.finish().unwrap();
            std::fs::rename(sub.join("shard-000000.tar"), dir.join(&name)).unwrap();
            let mut entry = written.shardlist[0].clone();
            entry.url = name;
            index.shardlist.push(entry);
        }
        let _ = std::fs::remove_dir_all(&sub);
    }
    index.write(dir.join("shard-index.json")).unwrap();
    index
}

/// The size of the largest of the `n` shards [`write_shards`] wrote into `dir`.
pub fn largest_shard(dir: &Path, n: usize) -> u64 {
    (0..n)
        .map(|i| {
            std::fs::metadata(dir.join(format!("shard-{i:06}.tar")))
                .unwrap()
                .len()
        })
        .max()
        .unwrap()
}

/// The pattern naming the `n` shards of [`write_shards`] under `base` (a directory or URL).
pub fn pattern(base: &str, n: usize) -> String {
    if n == 1 {
        format!("{base}/shard-000000.tar")
    } else {
        format!("{base}/shard-{{000000..{:06}}}.tar", n - 1)
    }
}

/// What a test keeps of a sample: its id, pad mark, seed and `val` field.
pub fn seen(s: ShardSample) -> (i64, u8, i64, i64) {
    let val: i64 = s.sample.int("val").unwrap_or(-1);
    (s.id.global as i64, u8::from(s.pad), s.seed as i64, val)
}

/// How a rank's loader reads a dataset: the loader's options (the dataset lays its epoch out
/// by them).
#[derive(Debug, Clone, Copy)]
pub struct Read {
    pub batch_size: usize,
    pub drop_last: bool,
    pub workers: usize,
    /// The epoch the loader runs (`set_epoch`).
    pub epoch: u64,
    pub policy: SampleErrorPolicy,
}

impl Read {
    /// Batches of `batch_size` from `workers` workers, epoch 0, no `drop_last`, failing batches.
    pub fn new(batch_size: usize, workers: usize) -> Read {
        Read {
            batch_size,
            drop_last: false,
            workers,
            epoch: 0,
            policy: SampleErrorPolicy::FailBatch,
        }
    }

    pub fn drop_last(self, drop_last: bool) -> Read {
        Read { drop_last, ..self }
    }

    pub fn epoch(self, epoch: u64) -> Read {
        Read { epoch, ..self }
    }

    pub fn policy(self, policy: SampleErrorPolicy) -> Read {
        Read { policy, ..self }
    }

    pub fn workers(self, workers: usize) -> Read {
        Read { workers, ..self }
    }
}

/// The loader of one rank over `dataset`, reading as `read` says (its epoch set).
pub fn rank_loader(dataset: &ShardedDataset, read: Read) -> RankLoader {
    let loader = DataLoader::iterable(dataset.clone().map(seen as SeenFn))
        .batch_size(read.batch_size)
        .drop_last(read.drop_last)
        .num_workers(read.workers)
        .seed(7)
        .on_sample_error(read.policy)
        .collate(StackCollate::new())
        .build()
        .unwrap();
    loader.set_epoch(read.epoch);
    loader
}

type SeenFn = fn(ShardSample) -> (i64, u8, i64, i64);

/// The loader [`rank_loader`] builds.
pub type RankLoader = IterableLoader<IterMap<ShardedDataset, SeenFn>>;

/// One epoch of `loader`, at most `take` batches: the batches' samples, in delivery order.
pub fn take_batches(loader: &RankLoader, take: Option<usize>) -> Vec<Result<Vec<Seen>, String>> {
    let mut out = Vec::new();
    // `take` stops before pulling one more: a batch the iterator yields counts as delivered.
    for batch in loader.iter().take(take.unwrap_or(usize::MAX)) {
        out.push(batch.map_err(|e| chain(&e)).map(|b| {
            let g = b.tensor::<i64>(0).unwrap();
            let p = b.tensor::<u8>(1).unwrap();
            let s = b.tensor::<i64>(2).unwrap();
            let v = b.tensor::<i64>(3).unwrap();
            (0..g.len())
                .map(|i| Seen {
                    global: g[i] as u64,
                    pad: p[i] != 0,
                    seed: s[i] as u64,
                    val: v[i] as u64,
                })
                .collect()
        }));
    }
    out
}

/// Runs one rank's loader over `dataset` as `read` says, taking at most `take` batches; returns
/// the batches' samples, in delivery order.
pub fn run_rank(
    dataset: &ShardedDataset,
    read: Read,
    take: Option<usize>,
) -> Vec<Result<Vec<Seen>, String>> {
    take_batches(&rank_loader(dataset, read), take)
}

/// The batches a rank's loader yields per epoch, as the dataset plans them for `read`.
pub fn planned(dataset: &ShardedDataset, read: Read) -> usize {
    rank_loader(dataset, read)
        .len()
        .expect("a sharded dataset knows its batches")
}

/// Epoch 0 of `dataset` read by one worker outside a loader: the samples' global ids, sorted,
/// each checked against its `val` field.
pub fn read_epoch_sorted(dataset: &ShardedDataset) -> Vec<u64> {
    use longshore_data::{IterableDataset, WorkerInfo};
    let mut seen: Vec<u64> = dataset
        .iter(WorkerInfo::single(0))
        .map(|s| {
            let s = s.unwrap_or_else(|e| panic!("{}", chain(&e)));
            assert_eq!(s.sample.int("val").unwrap() as u64, s.id.global);
            s.id.global
        })
        .collect();
    seen.sort_unstable();
    seen
}

/// An error and its causes, joined with `: `.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text += &format!(": {c}");
        cause = c.source();
    }
    text
}

/// The batches of `got`, every one delivered (a failed batch fails the test).
pub fn delivered(got: Vec<Result<Vec<Seen>, String>>) -> Vec<Vec<Seen>> {
    got.into_iter()
        .map(|b| b.unwrap_or_else(|e| panic!("a batch failed: {e}")))
        .collect()
}

/// One whole epoch of each rank's loader (`datasets[r]` is rank `r`'s, read as `read`): its
/// batches, `len()` of them on every rank (checked).
pub fn epoch_of_ranks(datasets: &[ShardedDataset], read: Read) -> Vec<Vec<Vec<Seen>>> {
    let full: Vec<Vec<Vec<Seen>>> = datasets
        .iter()
        .map(|ds| {
            let loader = rank_loader(ds, read);
            let len = loader.len();
            let got = delivered(take_batches(&loader, None));
            assert_eq!(len, Some(got.len()), "len() is what an epoch yields");
            got
        })
        .collect();
    assert!(full.iter().all(|f| f.len() == full[0].len()), "equal ranks");
    full
}

/// Each rank's loader interrupted after `k` batches (checked to be the first `k` of `full`,
/// the uninterrupted epoch): the checkpoint every rank takes then (checked to be one), through
/// JSON.
pub fn checkpoint_after(
    datasets: &[ShardedDataset],
    read: Read,
    full: &[Vec<Vec<Seen>>],
    k: usize,
) -> longshore_loader::LoaderState {
    let mut state: Option<longshore_loader::LoaderState> = None;
    for (rank, ds) in datasets.iter().enumerate() {
        let loader = rank_loader(ds, read);
        let got = delivered(take_batches(&loader, Some(k)));
        assert_eq!(
            &got[..],
            &full[rank][..k],
            "rank {rank}'s first {k} batches"
        );
        let s = loader.state_dict().unwrap();
        assert_eq!(s.epoch, read.epoch);
        assert!(
            state.as_ref().is_none_or(|t| *t == s),
            "the ranks' states differ"
        );
        state = Some(s);
    }
    let json = serde_json::to_string(&state.expect("a rank")).unwrap();
    serde_json::from_str(&json).unwrap()
}

/// Each rank's loader (`datasets[r]`, read as `read`) resumed from `state`: the rest of its
/// epoch, and every rank yields as many batches (checked).
pub fn resume_ranks(
    datasets: &[ShardedDataset],
    read: Read,
    state: &longshore_loader::LoaderState,
) -> Vec<Vec<Vec<Seen>>> {
    let rest: Vec<Vec<Vec<Seen>>> = datasets
        .iter()
        .map(|ds| {
            let loader = rank_loader(ds, read.epoch(0));
            loader.load_state_dict(state).unwrap();
            delivered(take_batches(&loader, None))
        })
        .collect();
    assert!(
        rest.iter().all(|r| r.len() == rest[0].len()),
        "equal ranks after the resume"
    );
    rest
}

/// The datasets of `world` ranks: `make()`'s builder as rank `r` of `world`, for each `r`.
pub fn ranks_of(
    world: usize,
    make: impl Fn() -> longshore_shards::dataset::ShardedDatasetBuilder,
) -> Vec<ShardedDataset> {
    (0..world)
        .map(|rank| make().rank(rank).world_size(world).build().unwrap())
        .collect()
}

/// The byte spans of shard `i`'s samples.
pub fn spans(dir: &Path, i: usize) -> Vec<longshore_shards::webdataset::SampleSpan> {
    let bytes = std::fs::read(dir.join(format!("shard-{i:06}.tar"))).unwrap();
    longshore_shards::webdataset::ShardReader::new("x", bytes.as_slice())
        .scan()
        .unwrap()
}

/// Cuts shard `i` in the middle of sample `sample`'s data.
pub fn truncate(dir: &Path, i: usize, sample: usize) {
    let path = dir.join(format!("shard-{i:06}.tar"));
    let s = &spans(dir, i)[sample];
    let cut = s.offset + 512 + (s.end - s.offset - 512) / 2;
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..cut as usize]).unwrap();
}
