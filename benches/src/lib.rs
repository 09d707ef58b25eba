//! Criterion benchmarks for longshore live in `benches/benches/`; run them with `cargo xtask bench`.
