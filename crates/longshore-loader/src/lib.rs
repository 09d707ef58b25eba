//! The multi-worker DataLoader of longshore.
//!
//! This crate is filled by the loader issue; it holds no functionality yet.
