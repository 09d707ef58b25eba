//! Training from WebDataset shards instead of an image folder: packs a generated ImageFolder
//! into shards (or reads the shards you name, `s3://…` included), streams them through the
//! node's shard cache into the loader with the ImageNet training pipeline, and trains a linear
//! softmax classifier on the CPU. Prints, per epoch, the loss, images/s, how long the loop
//! waited for data and what the cache did; then saves and reloads the dataset's resume state.
//!
//! ```text
//! cargo run --release --example shards_train
//! cargo run --release --example shards_train -- --classes 16 --per-class 64 --epochs 3
//! AWS_ENDPOINT_URL=http://127.0.0.1:9000 cargo run --release --example shards_train -- \
//!     --urls 's3://bucket/train/shard-{000000..000009}.tar'
//! ```
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use clap::Parser;
use longshore::loader::DataLoader;
use longshore::shards::dataset::ShardedDataset;
use longshore::shards::webdataset::{ShardIndex, pack_image_folder};
use longshore::vision::shards::ImageShards;
use longshore::vision::synth::{FolderSpec, write_folder};
use longshore::vision::{Compose, Output};
use longshore_examples::data_root;

/// Train a linear classifier on image shards, on the CPU.
#[derive(Debug, Parser)]
struct Args {
    /// Classes of the generated folder.
    #[arg(long, default_value_t = 8)]
    classes: usize,
    /// Images per class of the generated folder.
    #[arg(long, default_value_t = 32)]
    per_class: usize,
    /// Side of the training crops (RandomResizedCrop).
    #[arg(long, default_value_t = 32)]
    size: usize,
    /// Target shard size in bytes.
    #[arg(long, default_value_t = 256 << 10)]
    shard_bytes: u64,
    /// Images per batch.
    #[arg(long, default_value_t = 16)]
    batch_size: usize,
    /// Loader worker threads.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Epochs.
    #[arg(long, default_value_t = 2)]
    epochs: u64,
    /// Learning rate of the SGD steps.
    #[arg(long, default_value_t = 0.002)]
    lr: f32,
    /// Shard URL patterns to read instead of the generated shards (labels in `.cls`).
    #[arg(long)]
    urls: Vec<String>,
    /// Where to generate the folder and its shards; default target/longshore-examples.
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

/// A linear softmax classifier trained with plain SGD, on the host.
struct Linear {
    features: usize,
    classes: usize,
    weights: Vec<f32>,
    bias: Vec<f32>,
}

impl Linear {
    fn new(features: usize, classes: usize) -> Linear {
        Linear {
            features,
            classes,
            weights: vec![0.0; features * classes],
            bias: vec![0.0; classes],
        }
    }

    /// One SGD step on a batch; returns the summed loss and the correct predictions.
    fn step(&mut self, images: &[f32], labels: &[i64], lr: f32) -> Result<(f64, usize)> {
        let (f, c) = (self.features, self.classes);
        let n = labels.len();
        let mut grad_w = vec![0.0f32; f * c];
        let mut grad_b = vec![0.0f32; c];
        let (mut loss, mut correct) = (0.0f64, 0);
        for (x, &label) in images.chunks_exact(f).zip(labels) {
            let label = usize::try_from(label).ok().filter(|&l| l < c);
            let label = label.with_context(|| format!("label outside 0..{c}"))?;
            let logits: Vec<f32> = (0..c)
                .map(|k| self.bias[k] + dot(&self.weights[k * f..(k + 1) * f], x))
                .collect();
            let max = logits.iter().copied().fold(f32::MIN, f32::max);
            let exp: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
            let sum: f32 = exp.iter().sum();
            loss -= f64::from((exp[label] / sum).ln());
            let best = (0..c).max_by(|&a, &b| logits[a].total_cmp(&logits[b]));
            correct += usize::from(best == Some(label));
            for k in 0..c {
                let g = exp[k] / sum - f32::from(u8::from(k == label));
                grad_b[k] += g;
                for (gw, xi) in grad_w[k * f..(k + 1) * f].iter_mut().zip(x) {
                    *gw += g * xi;
                }
            }
        }
        let scale = lr / n as f32;
        for (w, g) in self.weights.iter_mut().zip(&grad_w) {
            *w -= scale * g;
        }
        for (b, g) in self.bias.iter_mut().zip(&grad_b) {
            *b -= scale * g;
        }
        Ok((loss, correct))
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Generates the folder and packs it into shards (both reused when already there); returns
/// the shards' URL pattern.
fn generated_shards(args: &Args) -> Result<String> {
    let root = data_root(args.data_dir.as_deref())
        .join(format!("shards-{}x{}", args.classes, args.per_class));
    let folder = root.join("folder");
    let spec = FolderSpec {
        classes: args.classes,
        per_class: args.per_class,
        mean_area: 96.0 * 80.0,
        ..FolderSpec::tiny()
    };
    write_folder(&folder, &spec).with_context(|| format!("writing {}", folder.display()))?;
    let out = root.join(format!("webdataset-{}", args.shard_bytes));
    let index = match ShardIndex::read(out.join("shard-index.json")) {
        Ok(index) => index,
        Err(_) => {
            println!(
                "packing {} into shards in {}",
                folder.display(),
                out.display()
            );
            pack_image_folder(&folder, &out, args.shard_bytes, Some(0))?
        }
    };
    ensure!(
        !index.shardlist.is_empty(),
        "the folder packed into no shard"
    );
    Ok(format!(
        "{}/shard-{{000000..{:06}}}.tar",
        out.display(),
        index.shardlist.len() - 1
    ))
}

fn main() -> Result<()> {
    let args = Args::parse();
    ensure!(
        args.batch_size > 0 && args.size > 0 && args.classes > 0,
        "sizes must be positive"
    );
    let urls = if args.urls.is_empty() {
        vec![generated_shards(&args)?]
    } else {
        args.urls.clone()
    };
    let t0 = Instant::now();
    // Rank and world size from torchrun / srun / mpirun, else rank 0 of 1.
    let shards = ShardedDataset::webdataset(urls)
        .seed(0)
        .shuffle_block(256)
        .require(["cls"])
        .build()?;
    println!(
        "{} shards, {} images, rank {} of {}, resolved in {:.0?}; cache {}",
        shards.spec().shards.len(),
        shards.len(),
        shards.rank(),
        shards.world_size(),
        t0.elapsed(),
        shards.cache().config().dir.display()
    );
    // Workers read each image from its shard; the collation decodes it into the batch.
    let train = ImageShards::new(
        shards.clone(),
        Compose::train(args.size, Output::imagenet()),
    )
    .deferred();
    let collate = train.collate();
    let loader = DataLoader::iterable(train)
        .collate(collate)
        .batch_size(args.batch_size)
        .num_workers(args.workers)
        .build()?;
    let mut model = Linear::new(3 * args.size * args.size, args.classes);
    for epoch in 0..args.epochs {
        loader.set_epoch(epoch); // reaches the dataset, as DistributedSampler.set_epoch
        loader.reset_stats();
        let (t, mut seen, mut loss, mut correct) = (Instant::now(), 0, 0.0, 0);
        for batch in loader.iter() {
            let batch = batch?;
            let (l, c) = model.step(batch.tensor::<f32>(0)?, batch.tensor::<i64>(1)?, args.lr)?;
            seen += batch.batch_size();
            loss += l;
            correct += c;
        }
        let secs = t.elapsed().as_secs_f64();
        let cache = shards.cache().stats();
        println!(
            "epoch {epoch}: {seen} images, loss {:.3}, train accuracy {:.1}%, {:.0} images/s, \
             waited {:.0}% for data; cache: {} downloads, {} hits, {} evictions",
            loss / seen.max(1) as f64,
            100.0 * correct as f64 / seen.max(1) as f64,
            seen as f64 / secs,
            100.0 * loader.stats().wait_fraction(),
            cache.downloads,
            cache.hits,
            cache.evictions,
        );
    }
    // A checkpoint in the middle of the next epoch: the loader's state holds the dataset's
    // position, which resumes on any number of ranks and workers.
    loader.set_epoch(args.epochs);
    let taken = loader.iter().take(2).count();
    let state = serde_json::to_string(&loader.state_dict()?)?;
    loader.load_state_dict(&serde_json::from_str(&state)?)?;
    println!(
        "resume state after {taken} batches of epoch {}: {} bytes of JSON, {} batches left",
        args.epochs,
        state.len(),
        loader.len().unwrap_or(0) - taken
    );
    Ok(())
}
