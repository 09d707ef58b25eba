//! Datasets, samplers with PyTorch's semantics, collation and memory-mapped datasets for longshore.
//!
//! This crate is filled by the datasets issue; it holds no functionality yet.
