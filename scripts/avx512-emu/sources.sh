#!/usr/bin/env bash
# Prints one hash of everything the emulated AVX-512 run (run.sh's default set) depends
# on: the library's sources outside the device backend, the two test files it runs and
# the test binary's root (tests/suite/main.rs), the lock file, and the emulation scripts. `run.sh` writes it to `checked` when that set
# passes (under Bochs, or natively on an AVX-512 CPU with `run.sh --native`); `.ci/run`
# runs the emulation only when the hash of the tree differs from `checked`.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
{
  git ls-files -- crates/decoda/src crates/decoda/Cargo.toml Cargo.lock \
    crates/decoda/tests/suite/main.rs crates/decoda/tests/suite/conformance_cpu.rs \
    crates/decoda/tests/suite/fast_vs_reference.rs \
    scripts/avx512-emu ':!crates/decoda/src/wgpu' ':!scripts/avx512-emu/checked'
} | LC_ALL=C sort | while read -r f; do
  printf '%s\n' "$f"
  sha256sum < "$f"
done | sha256sum | cut -d' ' -f1
