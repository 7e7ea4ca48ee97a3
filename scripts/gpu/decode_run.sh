#!/usr/bin/env bash
# Issue 55's GPU measurements in one call on a lent NVIDIA machine (after device_run.sh,
# or alone: it sets up what it needs through setup.sh): the decode step and the MoE layer
# of a Qwen3-30B-A3B-shaped checkpoint, the new build beside the old one and beside
# PyTorch, in the same call. Carried with the call (the device tool's `carry`):
#   .gl/                  the Vulkan loader packages (as device_run.sh)
#   .gpu/decoda.xz        this build's CLI (cargo build --release -p decoda-cli; strip; xz -9)
#   .gpu/decoda-old.xz    (optional) the build to compare against: every step runs it too
# PyTorch is the machine's own (torch_peers.py). Writes into $OUT: moe.jsonl,
# moe-profile.jsonl, gen.jsonl, profile.jsonl, prefill.jsonl, torch.jsonl (each line with
# "build": "new" or "old"). Each step has its own time limit, so one that hangs leaves
# the others. Test it first on lavapipe: OUT=/tmp/o LAYERS=1 QUICK=1 bash scripts/gpu/decode_run.sh
set -u
# shellcheck source=scripts/gpu/setup.sh
source scripts/gpu/setup.sh
LAYERS=${LAYERS:-4}
QUICK=${QUICK:-0}
builds=(new)
if [ -f .gpu/decoda-old.xz ]; then
  xz -dc .gpu/decoda-old.xz > /tmp/decoda-old && chmod +x /tmp/decoda-old
  builds+=(old)
fi
bin() { if [ "$1" = old ]; then echo /tmp/decoda-old; else echo "$D"; fi; }
tag() { sed "s/^{/{\"build\":\"$1\",/"; }
if [ "$QUICK" = 1 ]; then
  # the script's own check on lavapipe: small shapes, a small checkpoint
  TOKENS=1,8; DTYPES="q4g64"; T=600; EXPERTS="--experts 8 --hidden 256 --intermediate 128"
  SHAPE="--vocab 1024 --layers 2 --quantize q4g64"; MAXTOK=4
else
  TOKENS=1,8,16,32,64,128,512; DTYPES="bf16 q4g64 q8g64"; T=180
  EXPERTS="--experts 128 --hidden 2048 --intermediate 768"
  SHAPE="--preset qwen3-30b-a3b --layers $LAYERS"; MAXTOK=64
fi

step machine
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>/dev/null
"$D" bench --device wgpu --vocab 1000 --rows 1 --config greedy --time-ms 1 2>&1 | head -1

# 1. the MoE layer (E 128, k 8, D 2048, H 768): wall time per call by token count, both
#    builds; the new build's profile (device time per kernel beside its bytes) too
step moe-bench
for b in "${builds[@]}"; do
  for dt in $DTYPES; do
    # shellcheck disable=SC2086
    timeout $T "$(bin "$b")" moe-bench --device wgpu $EXPERTS --top-k 8 --tokens "$TOKENS" \
      --dtype "$dt" --time-ms 200 --json 2>> /tmp/moe.err | tag "$b" >> "$OUT/moe.jsonl"
    echo "$b $dt rc=${PIPESTATUS[0]}"
  done
done
for dt in $DTYPES; do
  # shellcheck disable=SC2086
  timeout $T "$D" moe-bench --device wgpu $EXPERTS --top-k 8 --tokens "$TOKENS" --dtype "$dt" \
    --time-ms 1 --profile --json 2>> /tmp/moe.err | tag new >> "$OUT/moe-profile.jsonl"
  echo "profile $dt rc=${PIPESTATUS[0]}"
done
tail -2 /tmp/moe.err

# 2. a Qwen3-30B-A3B-shaped checkpoint of $LAYERS layers (q4g64, 779 MB a layer)
step "tiny-model $SHAPE"
M=/tmp/q3shape-$QUICK
# shellcheck disable=SC2086
[ -d "$M" ] || timeout 300 "$D" tiny-model "$M" $SHAPE
for n in 8 32; do
  for i in $(seq 1 $n); do echo '{"prompt_ids": [1, 2, 3, 4, 5, 6, 7, 8], "seed": '"$i"'}'; done > /tmp/p$n.jsonl
done

# 3. generate, both builds: device and host sampling at B = 1, 8 and 32
step generate
gen() { local b=$1; shift
  timeout $T "$(bin "$b")" generate --model "$M" --max-tokens "$MAXTOK" --temperature 0.8 --json "$@" \
    2>> /tmp/gen.err | sed "s|^{|{\"args\":\"$*\",|" | tag "$b" >> "$OUT/gen.jsonl"
  echo "$b $* rc=${PIPESTATUS[0]}"; }
for b in "${builds[@]}"; do
  for host in "" --host-sampling; do
    # shellcheck disable=SC2086
    gen "$b" --prompt-ids 1,2,3,4,5,6,7,8 --device wgpu $host
    # shellcheck disable=SC2086
    gen "$b" --prompts /tmp/p8.jsonl --device wgpu $host
    # shellcheck disable=SC2086
    gen "$b" --prompts /tmp/p32.jsonl --device wgpu $host
  done
done
gen new --prompt-ids 1,2,3,4,5,6,7,8 --device cpu
tail -2 /tmp/gen.err

# 4. where a step's time goes (new build): per kernel, device time beside the planned
#    bytes at the measured copy rate, B = 1 and 32
step profile
for p in "--prompt-ids 1,2,3,4,5,6,7,8" "--prompts /tmp/p32.jsonl"; do
  # shellcheck disable=SC2086
  timeout $T "$D" generate --model "$M" --max-tokens 16 --temperature 0.8 --device wgpu \
    --profile --json $p 2>> /tmp/gen.err | tag new >> "$OUT/profile.jsonl"
  echo "profile $p rc=${PIPESTATUS[0]}"
done

# 5. prefill of 512 tokens (prefill_ms of a 512-token prompt; tok/s = 512000 / prefill_ms)
step prefill
ids=$(seq -s, 1 512)
for b in "${builds[@]}"; do
  timeout $T "$(bin "$b")" generate --model "$M" --prompt-ids "$ids" --max-tokens 1 \
    --device wgpu --json 2>> /tmp/gen.err | tag "$b" >> "$OUT/prefill.jsonl"
  echo "$b prefill rc=${PIPESTATUS[0]}"
done

# 6. the peers in the same call: PyTorch's grouped GEMM and eager loop for the MoE layer
#    (bf16), and transformers' generate on the same checkpoint's config
step torch
if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  timeout $T python3 scripts/gpu-peers/torch_peers.py moe >> "$OUT/torch.jsonl" 2>> /tmp/torch.err
  echo "torch moe rc=$?"
  timeout $T python3 scripts/gpu-peers/torch_peers.py hf "$M" >> "$OUT/torch.jsonl" 2>> /tmp/torch.err
  echo "torch hf rc=$?"
  tail -2 /tmp/torch.err
else
  echo "no CUDA torch here: peers skipped"
fi
step done
