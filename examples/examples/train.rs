//! Trains a small MLP classifier on a generated dataset, memory-mapped from `.npy` files and fed
//! to the device by longshore's `DataLoader`, with all the math in `longshore::transfer::ops`.
//!
//! ```text
//! cargo run --release --example train                      # GPU if there is one, else CPU
//! cargo run --release --example train -- --device cpu --epochs 3 --json
//! ```

use std::path::PathBuf;

use anyhow::Result;
use clap::Parser;
use longshore_examples::train::{TrainConfig, train};
use longshore_examples::{DeviceChoice, data_root, pick_device};

/// Train an MLP (64 -> hidden -> 10, ReLU, softmax cross-entropy, SGD with momentum) on a
/// generated, learnable dataset.
#[derive(Debug, Parser)]
struct Args {
    /// Passes over the data.
    #[arg(long, default_value_t = 5)]
    epochs: usize,
    /// Samples in the generated dataset.
    #[arg(long, default_value_t = 65_536)]
    samples: usize,
    /// Samples per batch.
    #[arg(long, default_value_t = 256)]
    batch_size: usize,
    /// Loader worker threads.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Hidden layer width.
    #[arg(long, default_value_t = 256)]
    hidden: usize,
    /// Learning rate.
    #[arg(long, default_value_t = 0.05)]
    lr: f32,
    /// Seed of the data, the weights and the shuffling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Where to generate (or find) the data; default target/longshore-examples.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The device to train on.
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto)]
    device: DeviceChoice,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let (device, note) = pick_device(args.device)?;
    if let Some(note) = note {
        eprintln!("{note}");
    }
    let mut cfg = TrainConfig::new(data_root(args.data_dir.as_deref()));
    cfg.epochs = args.epochs;
    cfg.samples = args.samples;
    cfg.batch_size = args.batch_size;
    cfg.workers = args.workers;
    cfg.hidden = args.hidden;
    cfg.lr = args.lr;
    cfg.seed = args.seed;
    cfg.progress = !args.json;
    if !args.json {
        println!(
            "training 64 -> {} -> 10 on {} ({} samples, batch {}, {} workers, data in {})",
            cfg.hidden,
            device.name(),
            cfg.samples,
            cfg.batch_size,
            cfg.workers,
            cfg.data_dir.display()
        );
    }
    let s = train(&cfg, &device)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    println!("summary");
    println!("  device            {}", s.device);
    println!(
        "  loss              {:.4} (epoch 1) -> {:.4} (epoch {})",
        s.first_loss(),
        s.final_loss(),
        s.epochs
    );
    println!(
        "  accuracy          {:.1}% (epoch 1) -> {:.1}% (epoch {})",
        100.0 * s.epoch_accuracy[0],
        100.0 * s.final_accuracy(),
        s.epochs
    );
    println!(
        "  throughput        {:.0} samples/s ({:.2} s for {} epochs)",
        s.samples_per_sec, s.seconds, s.epochs
    );
    println!(
        "  waited for data   {:.1}% of the loop ({})",
        100.0 * s.wait_fraction,
        if s.wait_fraction < 0.1 {
            "the model is the bottleneck"
        } else {
            "the input pipeline is the bottleneck"
        }
    );
    Ok(())
}
