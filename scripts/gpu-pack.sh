#!/usr/bin/env bash
# Builds everything the GPU machine runs and packs it into gpu-pack/gpu.tar.xz (git-ignored
# through .git/info/exclude), small enough to travel with the working tree:
#   ../shared/tools/gpu-bundle (release test binaries, examples, xtask) into .gpu/,
#   plus the criterion bench binaries as .gpu/bin/<name>-bench.
# On the GPU machine: python3 -c "import tarfile; tarfile.open('gpu-pack/gpu.tar.xz').extractall()"
# then scripts/gpu-verify.sh and scripts/gpu-bench.sh.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mkdir -p .git/info gpu-pack
for p in /.gpu/ /gpu-pack/ /gpu-out/; do
  grep -qx "$p" .git/info/exclude 2>/dev/null || echo "$p" >> .git/info/exclude
done
../shared/tools/gpu-bundle "$@"
# A proc-macro crate's own unit-test binary links libstd dynamically (proc macros are built
# with prefer-dynamic), and the GPU machine has no Rust toolchain: leave it out (it has no
# CUDA path; CI runs it).
rm -f .gpu/tests/longshore_derive-*
cargo bench -p longshore-benches --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["bench"]:
        print(m["target"]["name"] + "\t" + m["executable"])
' | while IFS=$'\t' read -r name exe; do
  cp "$exe" ".gpu/bin/$name-bench"; strip ".gpu/bin/$name-bench"
done
# The sampling profiler of `longshore-bench --profile` names functions from the symbol table:
# keep it (debug info only is stripped).
strip --strip-debug -o .gpu/bin/longshore-bench target/release/longshore-bench
tar -cJf gpu-pack/gpu.tar.xz .gpu
ls -la gpu-pack/gpu.tar.xz
