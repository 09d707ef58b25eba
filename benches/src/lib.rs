//! Support code for longshore's benchmarks: the `longshore-bench` report binary (run it with
//! `cargo xtask bench`) and the criterion benches in `benches/benches/`.
//!
//! * [`workload`]: generation of the `.npy` workloads the loader section and the PyTorch
//!   baseline both read.
//! * [`measure`]: medians and timing helpers.
//! * [`results`]: the `results.json` schema written by the binary.
#![forbid(unsafe_code)]

pub mod measure;
pub mod results;
pub mod workload;
