//! Token sequences through the loader from Rust: `TokenSequences` over flat token files,
//! shuffled, batched straight into pinned buffers by the workers, whole epochs after a warm-up.
//!
//! `tokens-bench --dir DIR [--seq-len 2048] [--batch 8] [--workers 0,2,4] [--epochs 3]
//! [--no-targets] [--separator N] [--json]`: every `*.bin` of DIR (u16 tokens, nanoGPT's
//! format) in name order. Without `--dir`, writes `--tokens` random tokens first. Prints one
//! row per worker count (sequences/s and tokens/s, median of the epochs after the first), or
//! one JSON object per row with `--json` (what `xtask/python/tokens_bench.py` reads, so the
//! Rust and Python front doors are measured in one call).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use clap::Parser;
use longshore::data::dataset::mixture::{Mixture, Stop};
use longshore::data::formats::tokens::TokenSequences;
use longshore::data::{DType, Dataset, DirectCollate, DirectDataset};
use longshore::prelude::DataLoader;
use longshore_benches::measure::median;

#[derive(Parser, Debug)]
#[command(about = "Token sequences through the loader from Rust")]
struct Args {
    /// Folder of `*.bin` token files (u16); random tokens are written when absent.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Tokens to write when there is no `--dir`.
    #[arg(long, default_value_t = 16 << 20)]
    tokens: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 2048)]
    seq_len: usize,
    /// Sequences per batch.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Worker counts to run.
    #[arg(long, value_delimiter = ',', default_value = "0,2,4")]
    workers: Vec<usize>,
    /// Epochs per worker count (the first is a warm-up).
    #[arg(long, default_value_t = 3)]
    epochs: usize,
    /// Inputs only (no shifted targets).
    #[arg(long)]
    no_targets: bool,
    /// Document separator: adds position and document ids.
    #[arg(long)]
    separator: Option<u32>,
    /// One JSON object per row.
    #[arg(long)]
    json: bool,
    /// Also a 3-way mixture of thirds of the files (weights 5:3:2) against each third alone.
    #[arg(long)]
    mixture: bool,
}

/// Sequences per second of `dataset` through the loader on `workers` workers: the median of
/// the epochs after the first.
fn rate<D>(dataset: &D, args: &Args, workers: usize) -> Result<f64>
where
    D: DirectDataset + Clone + 'static,
{
    let names = ["input_ids", "targets"];
    let loader = DataLoader::builder(dataset.clone())
        .collate(DirectCollate::new().with_names(names.into_iter().take(dataset.fields().len())))
        .batch_size(args.batch)
        .shuffle(true)
        .seed(0)
        .num_workers(workers)
        .pin_memory(true)
        .build()?;
    let mut rates = Vec::new();
    for epoch in 0..args.epochs {
        loader.set_epoch(epoch as u64);
        let t0 = Instant::now();
        let mut n = 0usize;
        let mut check = 0i64;
        for batch in loader.iter() {
            let batch = batch?;
            n += batch.batch_size();
            // Touch the batch as a consumer would (one value per batch).
            check ^= batch.tensor::<i64>(0)?[0];
        }
        std::hint::black_box(check);
        ensure!(
            n == dataset.len(),
            "epoch delivered {n} of {} sequences",
            dataset.len()
        );
        if epoch > 0 {
            rates.push(n as f64 / t0.elapsed().as_secs_f64());
        }
    }
    Ok(median(&rates))
}

fn row(args: &Args, front: &str, workers: usize, seq_rate: f64) {
    let tok_rate = seq_rate * args.seq_len as f64;
    if args.json {
        println!(
            "{{\"front\": \"{front}\", \"workers\": {workers}, \"sequences_per_s\": {seq_rate:.1}, \"tokens_per_s\": {tok_rate:.0}}}"
        );
    } else {
        println!(
            "| {front} | {workers} | {seq_rate:.0} | {:.1} M |",
            tok_rate / 1e6
        );
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    ensure!(
        args.epochs >= 2,
        "--epochs must be at least 2 (one warm-up)"
    );
    let mut written = None;
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => {
            let d = std::env::temp_dir().join(format!("tokens-bench-{}", std::process::id()));
            std::fs::create_dir_all(&d)?;
            let mut x = 0x9E37_79B9u32;
            let bytes: Vec<u8> = (0..args.tokens)
                .flat_map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    ((x % 50_257) as u16).to_le_bytes()
                })
                .collect();
            std::fs::write(d.join("train.bin"), bytes)?;
            written = Some(d.clone());
            d
        }
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "bin"))
        .collect();
    files.sort();
    ensure!(!files.is_empty(), "no .bin files in {}", dir.display());
    let mut b = TokenSequences::builder(&files)
        .seq_len(args.seq_len)
        .token_dtype(DType::U16)
        .targets(!args.no_targets);
    if let Some(sep) = args.separator {
        b = b.documents(sep);
    }
    let seqs = b.build()?;
    if !args.json {
        println!(
            "tokens-bench: {} files, {} tokens, {} sequences of {} ({:?}), batch {}",
            files.len(),
            seqs.total_tokens(),
            seqs.len(),
            args.seq_len,
            seqs.field_names(),
            args.batch
        );
        println!("| loader | workers | sequences/s | tokens/s |\n| --- | --- | --- | --- |");
    }
    for &workers in &args.workers {
        let seq_rate = rate(&seqs, &args, workers)?;
        row(&args, "rust", workers, seq_rate);
    }
    if args.mixture {
        // A 3-way mixture of thirds of the files (weights 5:3:2, until every member is
        // exhausted) against each member alone, best worker count each.
        ensure!(files.len() >= 3, "--mixture needs at least 3 token files");
        let thirds: Vec<Vec<PathBuf>> = (0..3)
            .map(|k| files.iter().skip(k).step_by(3).cloned().collect())
            .collect();
        let mut members = Vec::new();
        for (k, paths) in thirds.iter().enumerate() {
            let member = TokenSequences::builder(paths)
                .seq_len(args.seq_len)
                .token_dtype(DType::U16)
                .targets(!args.no_targets)
                .build()?;
            let best = args
                .workers
                .iter()
                .map(|&w| rate(&member, &args, w).map(|r| (w, r)))
                .collect::<Result<Vec<_>>>()?
                .into_iter()
                .fold((0, 0.0), |a, b| if b.1 > a.1 { b } else { a });
            row(&args, &format!("rust member {k}"), best.0, best.1);
            members.push(member);
        }
        let mixture = Mixture::new(members, &[5.0, 3.0, 2.0], Stop::AllExhausted)?;
        for &workers in &args.workers {
            row(
                &args,
                "rust mixture",
                workers,
                rate(&mixture, &args, workers)?,
            );
        }
    }
    if let Some(d) = written {
        std::fs::remove_dir_all(d)?;
    }
    Ok(())
}
