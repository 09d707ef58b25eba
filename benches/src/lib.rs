//! Support code for longshore's benchmarks: the `longshore-bench` report binary (run it with
//! `cargo xtask bench`) and the criterion benches in `benches/benches/`.
//!
//! * [`collate`]: [`NormalizeCollate`](collate::NormalizeCollate), which normalises `u8`
//!   images to `f32` straight into the batch slot as the worker collates.
//! * [`workload`]: generation of the `.npy` workloads the loader section and the PyTorch
//!   baseline both read.
//! * [`measure`]: medians and timing helpers.
//! * [`results`]: the `results.json` schema written by the binary.

pub mod collate;
pub mod measure;
pub mod results;
pub mod workload;
