//! Token sequences through the loader: written straight into pinned batches with their
//! names, every sequence once per epoch across ranks (equal shares), and a checkpoint
//! resumed on another number of workers giving the uninterrupted run's batches.

use std::collections::BTreeMap;

use longshore::data::formats::tokens::TokenSequences;
use longshore::data::{Dataset, DirectCollate, DistributedSampler};
use longshore::prelude::*;

const SEP: u32 = 0;

/// Two u32 token files: token `i` of the stream is `i + 1`, every 5th (by a hash) a separator.
fn files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut paths = Vec::new();
    let mut i = 0u32;
    for (f, n) in [(0, 301u32), (1, 170)] {
        let bytes: Vec<u8> = (0..n)
            .flat_map(|_| {
                i += 1;
                let t = if i.wrapping_mul(2_654_435_761).is_multiple_of(5) {
                    SEP
                } else {
                    i
                };
                t.to_le_bytes()
            })
            .collect();
        let p = dir.join(format!("tokens-{f}.bin"));
        std::fs::write(&p, bytes).unwrap();
        paths.push(p);
    }
    paths
}

fn loader(
    seqs: &TokenSequences,
    rank: usize,
    world: usize,
    workers: usize,
) -> DirectLoader<TokenSequences> {
    let sampler = DistributedSampler::builder(seqs.len(), world, rank)
        .shuffle(true)
        .seed(11)
        .build()
        .unwrap();
    DataLoader::builder(seqs.clone())
        .collate(DirectCollate::new().with_names(seqs.field_names().iter().copied()))
        .sampler(sampler)
        .batch_size(3)
        .num_workers(workers)
        .pin_memory(true)
        .build()
        .unwrap()
}

type Rows = Vec<BTreeMap<String, Vec<i64>>>;

/// Each batch's rows: field name -> values.
fn rows(batch: &longshore::data::Batch<longshore::host::PoolBuffer>, names: &[&str]) -> Rows {
    let n = batch.batch_size();
    (0..n)
        .map(|r| {
            names
                .iter()
                .map(|name| {
                    let all: &[i64] = batch.tensor_by_name(name).unwrap();
                    let per = all.len() / n;
                    (name.to_string(), all[r * per..(r + 1) * per].to_vec())
                })
                .collect()
        })
        .collect()
}

#[test]
fn ranks_see_every_sequence_once_and_resume_on_other_worker_counts() {
    let dir = tempfile::tempdir().unwrap();
    let seqs = TokenSequences::builder(files(dir.path()))
        .seq_len(8)
        .token_dtype(longshore::data::DType::U32)
        .documents(SEP)
        .build()
        .unwrap();
    assert_eq!(seqs.len(), (471 - 1) / 8);
    let names = seqs.field_names().to_vec();
    assert_eq!(
        names,
        ["input_ids", "targets", "position_ids", "document_ids"]
    );
    // Each sequence by its inputs (unique: non-separator tokens are).
    let by_inputs: BTreeMap<Vec<i64>, usize> = (0..seqs.len())
        .map(|k| {
            (
                seqs.get(k).unwrap()[0].as_slice::<i64>().unwrap().to_vec(),
                k,
            )
        })
        .collect();
    assert_eq!(by_inputs.len(), seqs.len());

    let world = 2;
    for epoch in [0u64, 3] {
        let mut seen = BTreeMap::new();
        let mut shares = Vec::new();
        for rank in 0..world {
            let whole = loader(&seqs, rank, world, 2);
            whole.set_epoch(epoch);
            let uninterrupted: Vec<Rows> =
                whole.iter().map(|b| rows(&b.unwrap(), &names)).collect();
            // Stop after 4 batches on 2 workers, resume on 3 and on none.
            for resumed_workers in [3, 0] {
                let first = loader(&seqs, rank, world, 2);
                first.set_epoch(epoch);
                let mut got: Vec<Rows> = Vec::new();
                let state = {
                    let mut it = first.iter();
                    for _ in 0..4 {
                        got.push(rows(&it.next().unwrap().unwrap(), &names));
                    }
                    first.state_dict().unwrap()
                };
                let second = loader(&seqs, rank, world, resumed_workers);
                second.load_state_dict(&state).unwrap();
                got.extend(second.iter().map(|b| rows(&b.unwrap(), &names)));
                assert_eq!(
                    got, uninterrupted,
                    "rank {rank} epoch {epoch}, resumed on {resumed_workers} workers"
                );
            }
            let mut n = 0;
            for row in uninterrupted.iter().flatten() {
                let k = by_inputs[&row["input_ids"]];
                // Every field is the dataset's sequence, written straight into the batch.
                let want = seqs.get(k).unwrap();
                for (name, t) in names.iter().zip(&want) {
                    assert_eq!(row[*name], t.as_slice::<i64>().unwrap(), "{name} of {k}");
                }
                *seen.entry(k).or_insert(0) += 1;
                n += 1;
            }
            shares.push(n);
        }
        assert_eq!(shares[0], shares[1], "equal shares");
        // 58 sequences over 2 ranks: each once, no padding needed.
        assert_eq!(seen.len(), seqs.len(), "epoch {epoch}");
        assert!(seen.values().all(|&c| c == 1), "epoch {epoch}: {seen:?}");
    }
}
