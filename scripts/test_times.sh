#!/usr/bin/env bash
# The quick tier's time per test binary, as docs/TESTING.md reports it.
#
#   scripts/test_times.sh                    # this machine as it is
#   scripts/test_times.sh --without-avx512   # as a machine without AVX-512 runs it
#   scripts/test_times.sh --cold             # with lavapipe's shader cache empty
#
# --without-avx512 withholds AVX-512 from both sides that use it: Mesa's llvmpipe
# (GALLIUM_OVERRIDE_CPU_CAPS=avx clears its AVX-512 flags and keeps AVX2, FMA and F16C,
# so the kernels' LLVM code is what an AVX2-only CPU gets; GALLIUM_DUMP_CPU=1 prints the
# flags) and the CPU sampler's kernels (DECODA_ISA=avx2). The core itself stays this
# machine's. --cold points Mesa's disk cache at an empty folder (MESA_SHADER_CACHE_DIR),
# as on a fresh CI machine. Prints the binaries summed (the harness's own figures),
# the wall time of the run, its CPU time (how many cores it kept busy) and the largest
# binaries; the whole log is kept in $LOG.
set -euo pipefail
cd "$(dirname "$0")/.."

cold=0
for a in "$@"; do
  case "$a" in
    --without-avx512) export GALLIUM_OVERRIDE_CPU_CAPS=avx DECODA_ISA=avx2 ;;
    --cold) cold=1 ;;
    *) echo "usage: $0 [--without-avx512] [--cold]" >&2; exit 2 ;;
  esac
done
export DECODA_REQUIRE_GPU=1
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
  export XDG_RUNTIME_DIR="/tmp/xdg-runtime-$(id -u)"
  mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
fi
if [ "$cold" = 1 ]; then
  MESA_SHADER_CACHE_DIR="$(mktemp -d)"
  export MESA_SHADER_CACHE_DIR
fi
LOG="${LOG:-$(mktemp /tmp/test_times.XXXXXX)}"

cargo test --release --no-run -q
rc=0
# the run's wall and CPU time (its processes' user and system time, from bash's `time`):
# how many of the cores the run kept busy
TIMEFORMAT='%R %U %S'
cpu=$({ time cargo test --release >"$LOG" 2>&1; } 2>&1) || rc=$?

# "Running tests/x.rs (...)" names a binary (the library's integration tests are one,
# tests/suite/main.rs); its "test result: ... finished in S s" follows.
awk -v rc="$rc" -v cpu="$cpu" '
  /Running / { name = $2; if (name == "unittests") name = $2 " " $3 }
  /test result:/ {
    s = $NF; sub(/s$/, "", s); total += s
    if (s >= 1) line[++n] = sprintf("%7.1f s  %s", s, name)
  }
  END {
    split(cpu, t, " ")
    printf "binaries summed: %.1f s; the run: %.0f s; rc %d\n", total, t[1], rc
    printf "CPU: %.0f s user + %.0f s system over %.0f s: %.2f cores busy on average\n", t[2], t[3], t[1], (t[2] + t[3]) / t[1]
    for (i = 1; i <= n; i++) print line[i]
  }' "$LOG" | { read -r head; read -r cpuline; echo "$head"; echo "$cpuline"; sort -rn | head -12; }
echo "log: $LOG"
exit "$rc"
