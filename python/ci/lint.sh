#!/usr/bin/env bash
# Formatting and lints of the Python extension crate (its own Cargo workspace, so the root's
# `cargo fmt --all` and `cargo clippy --workspace` do not reach it). Needs rustfmt and clippy;
# building or installing the wheel does not.
#   bash python/ci/lint.sh
source "$(dirname "$0")/env.sh"
# The workspace's target folder: the longshore crates are checked once.
export CARGO_TARGET_DIR="$root/target"
cargo fmt --manifest-path python/Cargo.toml -- --check
cargo clippy --manifest-path python/Cargo.toml --all-targets -- -D warnings
