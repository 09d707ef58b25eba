//! Example training binaries for longshore live in `examples/examples/` as `[[example]]` targets.
