#!/usr/bin/env bash
# Issue 43's GPU measurements in one call on a lent NVIDIA machine (a second call after
# device_run.sh, which sets up the same things): the MoE layer at Qwen3-30B-A3B's shape
# per dtype and token count, and a checkpoint of that shape through `generate` on the
# GPU and on the machine's CPU, device against host sampling, B = 1 and 32. Needs
# .gl/ and .gpu/decoda.xz as device_run.sh does. Writes into $OUT: moe.jsonl, gen.jsonl.
set -u
# shellcheck source=scripts/gpu/setup.sh
source scripts/gpu/setup.sh
LAYERS=${LAYERS:-4}

# 1. the MoE layer (E 128, k 8, D 2048, H 768): device time per call by token count
step moe-bench
for dt in bf16 q4g64 q8g64; do
  timeout 90 "$D" moe-bench --device wgpu --experts 128 --top-k 8 --hidden 2048 \
    --intermediate 768 --tokens 1,8,64,512 --dtype "$dt" --time-ms 200 --json \
    >> "$OUT/moe.jsonl" 2>> /tmp/moe.err
  echo "$dt rc=$?"
done
tail -2 /tmp/moe.err

# 2. a Qwen3-30B-A3B-shaped checkpoint of $LAYERS layers (q4g64, 779 MB a layer)
step "tiny-model --preset qwen3-30b-a3b --layers $LAYERS"
M=/tmp/q3shape
timeout 120 "$D" tiny-model "$M" --preset qwen3-30b-a3b --layers "$LAYERS"
for i in $(seq 1 32); do echo '{"prompt_ids": [1, 2, 3, 4, 5, 6, 7, 8], "seed": '"$i"'}'; done > /tmp/p32.jsonl

# 3. generate: GPU (device sampling, host sampling), CPU; B = 1 and 32
step generate
run() { timeout 120 "$D" generate --model "$M" --max-tokens 64 --temperature 0.8 --json "$@" \
  | sed "s/^{/{\"args\":\"$*\",/" >> "$OUT/gen.jsonl"; echo "$* rc=$?"; }
run --prompt-ids 1,2,3,4,5,6,7,8 --device wgpu
run --prompt-ids 1,2,3,4,5,6,7,8 --device wgpu --host-sampling
run --prompts /tmp/p32.jsonl --device wgpu
run --prompts /tmp/p32.jsonl --device wgpu --host-sampling
run --prompt-ids 1,2,3,4,5,6,7,8 --device cpu
step done
