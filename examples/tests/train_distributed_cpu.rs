//! Data-parallel `train` with 2 and 3 ranks as threads on the Cpu device (a `CpuGroup`)
//! follows the loss curve of one process with the same global batch, every rank reports the
//! same figures, and across the ranks every sample is seen exactly once per epoch (the tail
//! that does not split evenly dropped); a failing rank makes the others fail, not hang.

use std::time::{Duration, Instant};

use anyhow::bail;
use longshore::data::Sampler;
use longshore::transfer::Device;
use longshore_examples::dist::run_cpu_ranks;
use longshore_examples::train::{
    TrainConfig, make_dataset, rank_sampler, train, train_distributed,
};

fn config(tag: &str, samples: usize) -> TrainConfig {
    let dir =
        std::env::temp_dir().join(format!("longshore-train-dist-{tag}-{}", std::process::id()));
    let mut cfg = TrainConfig::new(dir);
    cfg.samples = samples;
    cfg.epochs = 3;
    cfg.batch_size = 96; // 48 per rank with 2 ranks, 32 with 3
    cfg.hidden = 32;
    cfg.workers = 1;
    cfg.seed = 5;
    cfg.progress = false;
    make_dataset(&cfg.data_dir, cfg.samples, cfg.seed).unwrap();
    cfg
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-12)
}

#[test]
fn ranks_follow_the_single_process_loss_curve() {
    let cfg = config("curve", 3072);
    let single = train(&cfg, &Device::cpu()).unwrap();
    eprintln!("1 rank : loss {:?}", single.epoch_loss);
    assert!(
        single.final_loss() < 0.8 * single.first_loss(),
        "{:?}",
        single.epoch_loss
    );
    for world in [2usize, 3] {
        let start = Instant::now();
        let ranks =
            run_cpu_ranks(world, |comm| train_distributed(&cfg, &Device::cpu(), &comm)).unwrap();
        eprintln!(
            "{world} ranks: loss {:?} ({:.1} s)",
            ranks[0].epoch_loss,
            start.elapsed().as_secs_f64()
        );
        for (r, s) in ranks.iter().enumerate() {
            assert_eq!((s.rank, s.world_size), (r, world));
            // All-reduced totals: the same bits on every rank.
            assert_eq!(s.epoch_loss, ranks[0].epoch_loss, "rank {r}");
            assert_eq!(s.epoch_accuracy, ranks[0].epoch_accuracy, "rank {r}");
            assert_eq!(s.epoch_samples, vec![3072; 3], "rank {r}");
        }
        for (e, (d, s)) in ranks[0]
            .epoch_loss
            .iter()
            .zip(&single.epoch_loss)
            .enumerate()
        {
            assert!(
                rel(*d, *s) < 1e-4,
                "{world} ranks, epoch {e}: loss {d} vs single-process {s}"
            );
        }
        for (d, s) in ranks[0].epoch_accuracy.iter().zip(&single.epoch_accuracy) {
            assert!((d - s).abs() <= 2.0 / 3072.0, "accuracy {d} vs {s}");
        }
    }
    let _ = std::fs::remove_dir_all(&cfg.data_dir);
}

#[test]
fn every_sample_is_seen_once_per_epoch_and_batches_match_the_single_process() {
    for samples in [3072usize, 3070] {
        let mut cfg = TrainConfig::new(std::env::temp_dir());
        cfg.samples = samples;
        cfg.batch_size = 96;
        let single_order = |epoch: u64| {
            let mut s = rank_sampler(&cfg).unwrap();
            s.set_epoch(epoch);
            s.iter().collect::<Vec<usize>>()
        };
        for world in [2usize, 3] {
            let b = cfg.batch_size / world;
            for epoch in 0..3u64 {
                let orders: Vec<Vec<usize>> = (0..world)
                    .map(|rank| {
                        let mut c = cfg.clone();
                        (c.rank, c.world_size) = (rank, world);
                        let mut s = rank_sampler(&c).unwrap();
                        s.set_epoch(epoch);
                        s.iter().collect()
                    })
                    .collect();
                // Exactly once each, the uneven tail dropped.
                let mut all: Vec<usize> = orders.concat();
                let n = all.len();
                assert_eq!(n, samples / world * world);
                all.sort_unstable();
                all.dedup();
                assert_eq!(all.len(), n, "a sample seen twice");
                assert!(all.iter().all(|&i| i < samples));
                // The k-th batches of all ranks together are the single process's k-th batch.
                let single = single_order(epoch);
                for (k, want) in single.chunks(cfg.batch_size).enumerate() {
                    let mut got: Vec<usize> = orders
                        .iter()
                        .flat_map(|o| o.chunks(b).nth(k).unwrap_or_default().to_vec())
                        .collect();
                    let mut want = want.to_vec();
                    if got.len() < want.len() {
                        // The last batch: only the dropped tail is missing.
                        assert_eq!(samples % world, want.len() - got.len());
                        want.truncate(got.len());
                    }
                    got.sort_unstable();
                    want.sort_unstable();
                    assert_eq!(
                        got, want,
                        "samples {samples} world {world} epoch {epoch} batch {k}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_failing_rank_makes_the_others_fail_instead_of_hanging() {
    let cfg = config("fail", 1536);
    let start = Instant::now();
    let err = run_cpu_ranks(2, |comm| {
        if comm.rank() == 1 {
            bail!("rank 1 gives up");
        }
        train_distributed(&cfg, &Device::cpu(), &comm)
    })
    .unwrap_err();
    let msg = format!("{err:#}");
    assert!(
        msg.contains("rank 1 left the group") || msg.contains("rank 1 gives up"),
        "{msg}"
    );
    assert!(start.elapsed() < Duration::from_secs(60));
    let _ = std::fs::remove_dir_all(&cfg.data_dir);
}
