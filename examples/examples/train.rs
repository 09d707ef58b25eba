//! Trains a small MLP classifier on a generated dataset, memory-mapped from `.npy` files and fed
//! to the device by longshore's `DataLoader`, with all the math in `longshore_ops`.
//!
//! ```text
//! cargo run --release --example train                      # GPU if there is one, else CPU
//! cargo run --release --example train -- --device cpu --epochs 3 --json
//! cargo run --release --example train -- --device cpu --world-cpu 2   # 2 ranks as threads
//! torchrun --nproc-per-node 2 --no-python target/release/examples/train --distributed
//! ```
//!
//! `--batch-size` is the global batch: with N ranks each loads `batch_size / N` per step, so a
//! run of N ranks follows the loss curve of one process with the same `--batch-size` (up to
//! float summation order). `--json` prints one JSON line per epoch, then the summary as one
//! JSON line (rank 0 only). Under torchrun each rank drives GPU `LOCAL_RANK`; NCCL's id is
//! shared over `MASTER_ADDR:(MASTER_PORT + 1)` or through `LONGSHORE_NCCL_ID_FILE` (see
//! `longshore_examples::dist`).
#![forbid(unsafe_code)]

use std::path::PathBuf;

use anyhow::Result;
use anyhow::{Context, ensure};
use clap::Parser;
use longshore::transfer::Device;
use longshore_examples::train::{TrainConfig, make_dataset, train, train_distributed};
use longshore_examples::{DeviceChoice, data_root, dist, pick_device};

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
    /// Samples per batch, over all ranks.
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
    /// Print one JSON line per epoch and the summary as a JSON line.
    #[arg(long)]
    json: bool,
    /// Data-parallel over the processes of a launcher (torchrun, srun, mpirun): one GPU per
    /// rank (`LOCAL_RANK`), gradients all-reduced with NCCL.
    #[arg(long, conflicts_with = "world_cpu")]
    distributed: bool,
    /// Data-parallel over N ranks as threads of this process on the Cpu device.
    #[arg(long, value_name = "N")]
    world_cpu: Option<usize>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let mut cfg = TrainConfig::new(data_root(args.data_dir.as_deref()));
    cfg.epochs = args.epochs;
    cfg.samples = args.samples;
    cfg.batch_size = args.batch_size;
    cfg.workers = args.workers;
    cfg.hidden = args.hidden;
    cfg.lr = args.lr;
    cfg.seed = args.seed;
    cfg.progress = !args.json;
    cfg.json_epochs = args.json;
    let (s, device) = if args.distributed {
        // One process per GPU: GPU LOCAL_RANK, NCCL over the launcher's rendezvous.
        let device = longshore::loader::dist::local_device()?;
        ensure!(
            !device.is_cpu(),
            "--distributed needs a GPU per rank (none usable here); use --world-cpu N to run \
             ranks as threads on the Cpu device"
        );
        let (env, comm) = dist::communicator_from_env(&device.new_stream()?)?;
        if env.rank == 0 && !args.json {
            announce(&cfg, &device, env.world_size);
        }
        (train_distributed(&cfg, &device, &comm)?, device)
    } else if let Some(world) = args.world_cpu {
        ensure!(world > 0, "--world-cpu needs at least one rank");
        // Generate the data once, before the ranks start.
        make_dataset(&cfg.data_dir, cfg.samples, cfg.seed).context("generating the dataset")?;
        let device = Device::cpu();
        if !args.json {
            announce(&cfg, &device, world);
        }
        let summaries =
            dist::run_cpu_ranks(world, |comm| train_distributed(&cfg, &Device::cpu(), &comm))?;
        (summaries.into_iter().next().context("no rank ran")?, device)
    } else {
        let (device, note) = pick_device(args.device)?;
        if let Some(note) = note {
            eprintln!("{note}");
        }
        if !args.json {
            announce(&cfg, &device, 1);
        }
        (train(&cfg, &device)?, device)
    };
    let _ = device;
    if s.rank != 0 {
        // Only rank 0 prints on stdout; with --json the others' summaries go to stderr, so a
        // launcher's log shows every rank's figures (and its pool back to zero).
        if args.json {
            eprintln!("{}", serde_json::to_string(&s)?);
        }
        return Ok(());
    }
    if args.json {
        println!("{}", serde_json::to_string(&s)?);
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
    if s.world_size > 1 {
        println!(
            "  per rank          {:.0} samples/s on rank 0 of {}",
            s.rank_samples_per_sec, s.world_size
        );
    }
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

fn announce(cfg: &TrainConfig, device: &Device, world: usize) {
    let ranks = if world > 1 {
        format!(", {world} ranks of batch {}", cfg.batch_size / world.max(1))
    } else {
        String::new()
    };
    println!(
        "training 64 -> {} -> 10 on {} ({} samples, batch {}{ranks}, {} workers, data in {})",
        cfg.hidden,
        device.name(),
        cfg.samples,
        cfg.batch_size,
        cfg.workers,
        cfg.data_dir.display()
    );
}
