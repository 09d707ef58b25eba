//! `cargo xtask`: project automation for longshore.

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "longshore project automation")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the criterion benchmarks of the workspace (`cargo bench -p longshore-benches`).
    Bench {
        /// Small sizes and short measurement times, to prove the benchmarks run.
        #[arg(long)]
        quick: bool,
        /// Only run benchmarks whose name contains this string.
        #[arg(long)]
        only: Option<String>,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Bench { quick, only } => {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let mut cmd = std::process::Command::new(cargo);
            cmd.args(["bench", "-p", "longshore-benches"]);
            if quick {
                cmd.env("LONGSHORE_BENCH_QUICK", "1");
            }
            cmd.arg("--");
            if let Some(filter) = only {
                cmd.arg(filter);
            }
            if quick {
                cmd.args(["--warm-up-time", "0.2", "--measurement-time", "0.5"]);
            }
            let status = cmd.status()?;
            anyhow::ensure!(status.success(), "cargo bench failed: {status}");
            Ok(())
        }
    }
}
