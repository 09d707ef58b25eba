#!/usr/bin/env bash
# Builds the `longshore-loader` wheel (import name `longshore`): abi3 (one wheel for CPython
# 3.10 and later) and manylinux2014 (glibc 2.17 or later), so that one `pip install` of the file
# works on any such Linux x86_64 machine.
#   bash python/ci/wheel.sh [OUT_DIR]     # default target/python-ci/wheels
# Earlier longshore wheels in OUT_DIR are removed first, so it holds one.
# Needs a Rust toolchain and python3; maturin and ziglang come from PyPI into the virtual
# environment target/python-ci/venv. Zig links against glibc 2.17's symbols, which is what
# makes the wheel manylinux2014 without a manylinux docker image; maturin checks the tag.
# OUT_DIR as the caller meant it, before env.sh moves to the repository root.
if [ $# -gt 0 ]; then
    mkdir -p "$1" && out="$(cd "$1" && pwd)" || exit 1
fi
source "$(dirname "$0")/env.sh"
out="${out:-$ci/wheels}"
ensure_venv
# ziglang: zig as the linker, for the manylinux2014 link without docker. Pinned to the zig
# minor release tested with this maturin (maturin 1.16, zig 0.17.1): zig's command line is not
# stable before 1.0, and maturin drives it.
"$venv/bin/python" -m pip install --quiet "maturin>=1.16,<2" "ziglang>=0.17.1,<0.18"
mkdir -p "$out"
rm -f "$out"/longshore_loader-*.whl "$out"/longshore-*.whl
# maturin finds zig as `python -m ziglang` through the venv's python on PATH. A target folder
# of its own (zig under the workspace's): the zig linker would otherwise rebuild the
# workspace's release artifacts back and forth.
(
    cd python
    PATH="$venv/bin:$PATH" CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}/zig" \
        "$venv/bin/maturin" build --release --zig --compatibility manylinux2014 \
        --interpreter "$venv/bin/python" --out "$out"
)
ls "$out"
