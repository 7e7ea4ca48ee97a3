#!/usr/bin/env bash
# The GPU measurements of BENCHMARKS.md ("The device sampler on an H200") in one call on
# a lent NVIDIA machine, run from the repository root there. What it needs travels with
# the call (the device tool's `carry`), prepared here first:
#   .gl/                        the Vulkan loader packages (`apt-get download libvulkan1 ...`)
#   .gpu/decoda.xz              the release CLI: cargo build --release -p decoda-cli;
#                               strip and `xz -9` a copy of target/release/decoda
#   .gpu/decoda-old.xz          (optional) the same of the build to compare against:
#                               then step 1b times it on the same grid, same call
#   scripts/gpu-peers/.whl/     scripts/gpu-peers/fetch_wheels.sh, then prebuild.sh: FlashInfer
#                               and its sampling modules built for sm_90a
# It writes into $OUT: decoda.jsonl (decoda-old.jsonl), wide.jsonl (`--law wide`
# cells), peers.jsonl (+ the kit's peers_table.txt and
# jit_build.log), peers.log, selftest.log, stress.log, cpu.txt; the machine's facts go to
# stdout.
# Each step has its own time limit, so one that hangs leaves the others.
set -u
# shellcheck source=scripts/gpu/setup.sh
source scripts/gpu/setup.sh

step machine
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem --format=csv
lscpu | grep -E 'Model name|^CPU\(s\)'
grep -o -m1 -w avx512f /proc/cpuinfo || echo "no avx512f"

step adapter
"$D" bench --device wgpu --vocab 1000 --rows 1 --config greedy --time-ms 1 2>&1 | head -1
ls /usr/local/nvidia/share/vulkan/icd.d /etc/vulkan/icd.d /usr/share/vulkan/icd.d 2>/dev/null | head

# 1. decoda on the GPU: the peers' rows, shapes and parameters (k 50, p 0.9, T 0.8,
#    min-p 0.1), f32 and bf16 logits, calls rotating over 256 MiB of inputs.
step decoda bench
timeout 200 "$D" bench --device wgpu --law affine --vocab 131072 \
  --rows 1,8,32,128,256,512,1024 --dtype f32,bf16 \
  --config greedy,temp,topk50,topp09,topk50_topp09,minp01,full --time-ms 120 --json \
  > "$OUT/decoda.jsonl" 2> /tmp/decoda.err
echo "rc=$? $(wc -l < "$OUT/decoda.jsonl") cells"; tail -2 /tmp/decoda.err

# 1b. the old build, same grid, same call (old vs new side by side).
if [ -f .gpu/decoda-old.xz ]; then
  step decoda-old bench
  xz -dc .gpu/decoda-old.xz > /tmp/decoda-old && chmod +x /tmp/decoda-old
  timeout 200 /tmp/decoda-old bench --device wgpu --law affine --vocab 131072 \
    --rows 1,8,32,128,256,512,1024 --dtype f32,bf16 \
    --config greedy,temp,topk50,topp09,topk50_topp09,minp01,full --time-ms 120 --json \
    > "$OUT/decoda-old.jsonl" 2> /tmp/decoda-old.err
  echo "rc=$? $(wc -l < "$OUT/decoda-old.jsonl") cells"; tail -2 /tmp/decoda-old.err
fi

# 1c. rows spanning about 30 units (`--law wide`, as an LLM's do; the affine law spans
#     about 14): where the scan's gated Gumbel (the reach test) skips most tokens' noise
#     and division, so `temp` should come close to `greedy`. This build only (older ones
#     have no `--law wide`).
step decoda wide law
timeout 60 "$D" bench --device wgpu --law wide --vocab 151936 --rows 1,32,1024 \
  --config greedy,temp,topp09 --time-ms 60 --json > "$OUT/wide.jsonl" 2> /tmp/wide.err
echo "rc=$? $(wc -l < "$OUT/wide.jsonl") cells"; tail -1 /tmp/wide.err

# 2. PyTorch and FlashInfer on the same GPU, in the same call.
step peers
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --target /tmp/site scripts/gpu-peers/.whl/*.whl > /tmp/pip.log 2>&1 || tail -3 /tmp/pip.log
PYTHONPATH=/tmp/site timeout 200 python3 scripts/gpu-peers/bench_peers.py --vocab 131072 \
  --budget-s 170 ${PEERS_ARGS:-} --out "$OUT/peers.jsonl" > "$OUT/peers.log" 2>&1
echo "rc=$? $(wc -l < "$OUT/peers.jsonl" 2>/dev/null) lines"; tail -4 "$OUT/peers.log"

# 3. parity with the CPU reference on this GPU.
step selftest
timeout 110 "$D" selftest --device wgpu --parity-rows 100000 > "$OUT/selftest.log" 2>&1
echo "rc=$?"; grep -E "^conformance|FAIL|parity:|passed" "$OUT/selftest.log" | tail -6

# 3b. the stress run: STRESS calls (default 10^6) of random shapes and stages against the
#     reference, stopped after STRESS_S seconds (default 140) with the counts so far.
step stress
timeout $(( ${STRESS_S:-140} + 30 )) "$D" selftest --device wgpu --stress "${STRESS:-1000000}" \
  --stress-secs "${STRESS_S:-140}" > "$OUT/stress.log" 2>&1
echo "rc=$?"; grep -E "MISMATCH|^stress:" "$OUT/stress.log" | tail -9

# 4. the CPU of the GPU machine (issue 16's ratios on a server part).
step cpu bench
timeout 40 "$D" bench --device cpu --vocab 131072 --rows 1,64 --threads 1,0 --time-ms 100 \
  --config greedy,temp,topp09,topk50_topp09,full > "$OUT/cpu.txt" 2>&1
echo "rc=$?"; cat "$OUT/cpu.txt"
step done
