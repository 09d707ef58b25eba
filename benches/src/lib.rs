//! Support code for longshore's benchmarks: the `longshore-bench` report binary (run it with
//! `cargo xtask bench`) and the criterion benches in `benches/benches/`.
//!
//! * [`workload`]: generation of the `.npy` workloads the loader section and the PyTorch
//!   baseline both read.
//! * [`measure`]: medians and timing helpers.
//! * [`results`]: the `results.json` schema written by the binary.
//! * [`world`]: ranks of a data-parallel job as threads, kept in step by a breakable gate.
//! * [`bare`]: the bare driver copies the copy benchmarks compare against.
//!
//! Unsafe code only in [`bare`] (two driver calls).
#![deny(unsafe_code)]

#[allow(unsafe_code)]
pub mod bare;
pub mod measure;
pub mod results;
pub mod workload;
pub mod world;
