//! `longshore-bench`: what longshore does on this machine, in one run.
//!
//! Runs the sections of [`SECTIONS`] in order, prints a compact table for each as it goes,
//! and writes every figure to `<out>/results.json` (rendered into `report.md` and SVG plots
//! by `cargo xtask report`). Usually started through `cargo xtask bench`.
//!
//! One module per section; [`drive`] holds the loader workloads and the steady-state driver
//! they share, [`timing`] the medians. A new section is one module and one line in
//! [`SECTIONS`].

mod bandwidth;
mod budget;
mod drive;
mod limits;
mod loader;
mod machine;
mod overlap;
mod pool;
mod profile;
mod pytorch;
mod ranks;
mod roofline;
mod scaling;
mod timing;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Parser;
use longshore::transfer::Device;
use longshore_benches::results::{Results, SCHEMA};

pub(crate) const MIB: usize = 1 << 20;
pub(crate) const KIB: usize = 1 << 10;

/// A section of the benchmark: its name (for `--only` and `results.json`) and what runs it.
pub(crate) struct Section {
    /// The name used by `--only`, in `results.json` and by the report.
    pub(crate) name: &'static str,
    /// One line for `--help`.
    pub(crate) about: &'static str,
    /// Runs the section, recording into the context.
    pub(crate) run: fn(&mut Ctx) -> Result<()>,
}

/// Every section, in the order they run.
pub(crate) const SECTIONS: &[Section] = &[
    Section {
        name: "bandwidth",
        about: "host<->device copies per memory kind and size against the bare driver copy",
        run: bandwidth::run,
    },
    Section {
        name: "pool",
        about: "a pool hit against a raw allocation, per memory kind and size",
        run: pool::run,
    },
    Section {
        name: "limits",
        about: "hardware limits: H2D link, host memory bandwidth, random gather, normalise rate",
        run: limits::run,
    },
    Section {
        name: "loader",
        about: "the DataLoader over two memory-mapped workloads, num_workers x pin_memory",
        run: loader::run,
    },
    Section {
        name: "scaling",
        about: "samples/s against num_workers from 1 to twice the core count",
        run: scaling::run,
    },
    Section {
        name: "ranks",
        about: "the image pipelines with one loader per GPU, on 1, 2, ... GPUs at once",
        run: ranks::run,
    },
    Section {
        name: "overlap",
        about: "how long the consumer waits for data when compute outlasts the copy",
        run: overlap::run,
    },
    Section {
        name: "pytorch",
        about: "PyTorch's DataLoader on the same files, when `torch` imports",
        run: pytorch::run,
    },
    Section {
        name: "budget",
        about: "images-u8 at 16 workers under pinned budgets from unconstrained to 2 batches",
        run: budget::run,
    },
    Section {
        name: "roofline",
        about: "the loader's best rates as fractions of the measured limits",
        run: roofline::run,
    },
];

#[derive(Debug, Parser)]
#[command(
    name = "longshore-bench",
    about = "Measure what longshore does on this machine; writes results.json"
)]
pub(crate) struct Args {
    /// Small sizes and few repetitions: proves every section runs (CI).
    #[arg(long)]
    quick: bool,
    /// Only these sections (comma-separated; `--list` names them).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// List the sections and exit.
    #[arg(long)]
    list: bool,
    /// Where results.json goes.
    #[arg(long, default_value = "target/longshore-bench")]
    out: PathBuf,
    /// Where the loader workloads are generated and reused (default: `<out>/data`).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The Python interpreter for the PyTorch baseline.
    #[arg(long, default_value = "python3")]
    pub(crate) python: String,
    /// The PyTorch baseline script (default: `xtask/pytorch/dataloader_bench.py`).
    #[arg(long)]
    pub(crate) pytorch_script: Option<PathBuf>,
    /// Images in the image workloads' file, so in one epoch (default 8192; quick 512). Longer
    /// epochs amortise each epoch's pipeline fill: the scaling curve at two lengths tells the
    /// fill from the steady rate.
    #[arg(long)]
    pub(crate) image_rows: Option<usize>,
    /// Sample every thread during each steady-state loader run's timed window and write a
    /// flame graph and a per-thread summary per run into this folder (see `profile.rs`).
    #[arg(long)]
    pub(crate) profile: Option<PathBuf>,
}

/// The best configuration found for a workload by the loader sweep (and the scaling curve).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Best {
    pub(crate) samples_per_s: f64,
    pub(crate) num_workers: usize,
    pub(crate) pin_memory: bool,
}

impl Best {
    /// Keeps `candidate` as `workload`'s best in `best` if it is faster than the one there.
    pub(crate) fn offer(
        best: &mut BTreeMap<&'static str, Best>,
        workload: &'static str,
        candidate: Best,
    ) {
        let b = best.entry(workload).or_insert(candidate);
        if candidate.samples_per_s > b.samples_per_s {
            *b = candidate;
        }
    }
}

/// What every section reads and records into.
pub(crate) struct Ctx {
    pub(crate) quick: bool,
    pub(crate) out: PathBuf,
    pub(crate) data_dir: PathBuf,
    pub(crate) cuda: Option<Device>,
    pub(crate) results: Results,
    /// The loader sweep's best configuration per workload (read by `pytorch`).
    pub(crate) best: BTreeMap<&'static str, Best>,
    /// Steady-state loader runs already measured, by workload and options.
    pub(crate) runs: BTreeMap<(&'static str, drive::Opts), drive::Run>,
    /// What the `limits` section measured (read by `roofline`).
    pub(crate) limits: Option<limits::Limits>,
    pub(crate) args: Args,
}

impl Ctx {
    fn save(&self) -> Result<()> {
        let path = self.out.join("results.json");
        let text = serde_json::to_string_pretty(&self.results)?;
        std::fs::write(&path, text + "\n").with_context(|| format!("writing {}", path.display()))
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.list {
        for s in SECTIONS {
            println!("{:<10} {}", s.name, s.about);
        }
        return Ok(());
    }
    if let Some(bad) = args
        .only
        .iter()
        .find(|o| !SECTIONS.iter().any(|s| s.name == o.as_str()))
    {
        let names: Vec<&str> = SECTIONS.iter().map(|s| s.name).collect();
        bail!("unknown section {bad:?}; sections: {}", names.join(", "));
    }
    let sections: Vec<&Section> = SECTIONS
        .iter()
        .filter(|s| args.only.is_empty() || args.only.iter().any(|o| o == s.name))
        .collect();
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let data_dir = args
        .data_dir
        .clone()
        .unwrap_or_else(|| args.out.join("data"));

    let (cuda, cuda_reason) = match Device::cuda(0) {
        Ok(d) => (Some(d), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let machine = machine::machine(args.quick, cuda.as_ref(), cuda_reason);
    println!(
        "longshore-bench{}: {} ({} cores, {:.1} GiB RAM), gpu: {}, {}",
        if args.quick { " --quick" } else { "" },
        machine.cpu,
        machine.cores,
        machine.ram_bytes as f64 / (1u64 << 30) as f64,
        machine.gpu.as_deref().unwrap_or("none"),
        machine.date_utc
    );
    if let Some(r) = &machine.cuda_reason {
        println!("  CUDA unavailable: {r}");
    }
    let mut ctx = Ctx {
        quick: args.quick,
        out: args.out.clone(),
        data_dir,
        cuda,
        results: Results {
            schema: SCHEMA,
            machine,
            sections: Vec::new(),
            figures: Vec::new(),
            notes: Vec::new(),
        },
        best: BTreeMap::new(),
        runs: BTreeMap::new(),
        limits: None,
        args,
    };
    let started = Instant::now();
    for s in sections {
        let t0 = Instant::now();
        ctx.results.sections.push(s.name.to_owned());
        if let Err(e) = (s.run)(&mut ctx) {
            ctx.results.note(s.name, format!("section failed: {e:#}"));
            ctx.save()?;
            return Err(e.context(format!("section {}", s.name)));
        }
        println!("  ({} took {:.1} s)", s.name, t0.elapsed().as_secs_f64());
        ctx.save()?;
    }
    println!(
        "\nwrote {} in {:.1} s",
        ctx.out.join("results.json").display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
