#!/usr/bin/env bash
# Issue 55's GPU measurements in one call on a lent NVIDIA machine (after device_run.sh,
# or alone: it sets up what it needs through setup.sh): the decode step and the MoE layer
# of a Qwen3-30B-A3B-shaped checkpoint, the new build beside the old one and beside
# PyTorch, in the same call; then a short grid of the sampler (issue 56), both builds.
# Carried with the call (the device tool's `carry`):
#   .gl/                  the Vulkan loader packages (as device_run.sh)
#   .gpu/decoda.xz        this build's CLI (cargo build --release -p decoda-cli; strip; xz -9)
#   .gpu/decoda-old.xz    (optional) the build to compare against: the steps run it too
#                         (the last lease's: b47b500, the fastest measured decode so far)
# PyTorch is the machine's own (torch_peers.py). Writes into $OUT (8 files at most come
# back): log (this script's output), err.txt (every command's stderr), gen.jsonl (generate
# and the 512-token prefill), profile.jsonl, moe.jsonl, moe-profile.jsonl, torch.jsonl,
# sampler.jsonl; each decoda line carries "build": "new" or "old" (the speculative runs of
# step 8 are gen.jsonl lines with "--draft" in their args).
# The steps run in the order of what matters most, each under its own time limit, and
# the whole under BUDGET seconds (default 470): a step that would not fit is skipped and
# says so, so a slow step costs the ones after it, never the call.
# Test it first on lavapipe: OUT=/tmp/o LAYERS=1 QUICK=1 bash scripts/gpu/decode_run.sh
set -u
# shellcheck source=scripts/gpu/setup.sh
source scripts/gpu/setup.sh
exec > >(tee "$OUT/log") 2>&1
ERR="$OUT/err.txt"
: > "$ERR"
LAYERS=${LAYERS:-4}
QUICK=${QUICK:-0}
BUDGET=${BUDGET:-470}
builds=(new)
if [ -f .gpu/decoda-old.xz ]; then
  xz -dc .gpu/decoda-old.xz > /tmp/decoda-old && chmod +x /tmp/decoda-old
  builds+=(old)
fi
bin() { if [ "$1" = old ]; then echo /tmp/decoda-old; else echo "$D"; fi; }
tag() { sed "s/^{/{\"build\":\"$1\",/"; }
left() { echo $((BUDGET - SECONDS)); }
# fits N: true when N seconds are left in the budget, else says the step is skipped
fits() { if [ "$(left)" -ge "$1" ]; then return 0; fi; echo "skipped: needs $1 s, $(left) s left"; return 1; }
# lim T: a command's time limit, T or what is left of the budget
lim() { local l; l=$(left); if [ "$l" -lt "$1" ]; then echo $((l > 5 ? l : 5)); else echo "$1"; fi; }
if [ "$QUICK" = 1 ]; then
  # the script's own check on lavapipe: small shapes, a small checkpoint
  TOKENS=1,8; MOE_OLD=1,8; DTYPES="q4g64"; T=600; BUDGET=100000
  EXPERTS="--experts 8 --hidden 256 --intermediate 128"
  SHAPE="--vocab 1024 --layers 2 --quantize q4g64"; MAXTOK=4; V=4096; ROWS=1,8; PROF=1,8
else
  TOKENS=1,8,16,32,64,128,512; MOE_OLD=1,8,64,512; DTYPES="bf16 q4g64 q8g64"; T=120
  EXPERTS="--experts 128 --hidden 2048 --intermediate 768"
  SHAPE="--preset qwen3-30b-a3b --layers $LAYERS"; MAXTOK=128; V=131072; ROWS=1,32,1024
  PROF=1,512
fi

step machine
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>/dev/null
"$D" bench --device wgpu --vocab 1000 --rows 1 --config greedy --time-ms 1 2>>"$ERR" | head -1

# 1. a Qwen3-30B-A3B-shaped checkpoint of $LAYERS layers (q4g64, 779 MB a layer)
step "tiny-model $SHAPE"
M=/tmp/q3shape-$QUICK
# shellcheck disable=SC2086
[ -d "$M" ] || timeout "$(lim 200)" "$D" tiny-model "$M" $SHAPE 2>>"$ERR"
du -sh "$M"
for n in 8 32; do
  for i in $(seq 1 $n); do echo '{"prompt_ids": [1, 2, 3, 4, 5, 6, 7, 8], "seed": '"$i"'}'; done > /tmp/p$n.jsonl
done

# 2. generate: greedy B = 1 (new, old, new: the run-to-run spread), then T 0.8 top-p 0.9
#    with device and host sampling at B = 1, 8 and 32, both builds. (This random
#    checkpoint's rows are flat: top-p 0.9 keeps most of the vocabulary, the sampler's
#    full-row path, about 9 ms a row at dc65b97; the T 0.8 rows without top-p after
#    these show the model's pace without that cost.)
step generate
gen() { local b=$1; shift
  fits 15 || return
  timeout "$(lim $T)" "$(bin "$b")" generate --model "$M" --max-tokens "$MAXTOK" --json "$@" \
    2>>"$ERR" | sed "s|^{|{\"args\":\"$*\",|" | tag "$b" >> "$OUT/gen.jsonl"
  echo "$(date -u +%T) $b $* rc=${PIPESTATUS[0]}"; }
one="--prompt-ids 1,2,3,4,5,6,7,8"
for b in "${builds[@]}" new; do
  # shellcheck disable=SC2086
  gen "$b" $one --temperature 0 --device wgpu
done
for b in "${builds[@]}"; do
  for host in "" --host-sampling; do
    for p in "$one" "--prompts /tmp/p8.jsonl" "--prompts /tmp/p32.jsonl"; do
      # shellcheck disable=SC2086
      gen "$b" $p --temperature 0.8 --top-p 0.9 --device wgpu $host
    done
  done
done
for p in "--prompts /tmp/p8.jsonl" "--prompts /tmp/p32.jsonl"; do
  # shellcheck disable=SC2086
  gen new $p --temperature 0.8 --device wgpu
done
# shellcheck disable=SC2086
gen new $one --temperature 0 --device cpu

# 3. where a step's time goes (new build): per kernel, device time beside the planned
#    bytes at the measured copy rate, B = 1 and 32
step profile
for p in "$one" "--prompts /tmp/p32.jsonl"; do
  fits 20 || break
  # shellcheck disable=SC2086
  timeout "$(lim $T)" "$D" generate --model "$M" --max-tokens 16 --temperature 0.8 --device wgpu \
    --profile --json $p 2>>"$ERR" | tag new >> "$OUT/profile.jsonl"
  echo "profile $p rc=${PIPESTATUS[0]}"
done

# 4. the MoE layer (E 128, k 8, D 2048, H 768): wall time per call by token count, both
#    builds; the new build's profile (device time per kernel beside its bytes) too
step moe-bench
for b in "${builds[@]}"; do
  toks=$TOKENS; [ "$b" = old ] && toks=$MOE_OLD
  for dt in $DTYPES; do
    fits 25 || break
    # shellcheck disable=SC2086
    timeout "$(lim $T)" "$(bin "$b")" moe-bench --device wgpu $EXPERTS --top-k 8 --tokens "$toks" \
      --dtype "$dt" --time-ms 150 --json 2>>"$ERR" | tag "$b" >> "$OUT/moe.jsonl"
    echo "$(date -u +%T) $b $dt rc=${PIPESTATUS[0]}"
  done
done
for dt in $DTYPES; do
  fits 25 || break
  # shellcheck disable=SC2086
  timeout "$(lim $T)" "$D" moe-bench --device wgpu $EXPERTS --top-k 8 --tokens "$PROF" --dtype "$dt" \
    --time-ms 1 --profile --json 2>>"$ERR" | tag new >> "$OUT/moe-profile.jsonl"
  echo "$(date -u +%T) profile $dt rc=${PIPESTATUS[0]}"
done

# 5. prefill of 512 tokens (prefill_ms of a 512-token prompt; tok/s = 512000 / prefill_ms)
step prefill
ids=$(seq -s, 1 512)
for b in "${builds[@]}"; do
  fits 20 || break
  timeout "$(lim 60)" "$(bin "$b")" generate --model "$M" --prompt-ids "$ids" --max-tokens 1 \
    --device wgpu --json 2>>"$ERR" | sed 's|^{|{"args":"prefill 512",|' | tag "$b" >> "$OUT/gen.jsonl"
  echo "$(date -u +%T) $b prefill rc=${PIPESTATUS[0]}"
done

# 6. the peers in the same call: PyTorch's grouped GEMM and eager loop for the MoE layer
#    (bf16), and transformers' generate on the same checkpoint's config
step torch
if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  if fits 40; then
    timeout "$(lim 60)" python3 scripts/gpu-peers/torch_peers.py moe >> "$OUT/torch.jsonl" 2>>"$ERR"
    echo "$(date -u +%T) torch moe rc=$?"
  fi
  if fits 60; then
    timeout "$(lim 100)" python3 scripts/gpu-peers/torch_peers.py hf "$M" >> "$OUT/torch.jsonl" 2>>"$ERR"
    echo "$(date -u +%T) torch hf rc=$?"
  fi
else
  echo "no CUDA torch here: peers skipped"
fi

# 7. the sampler (issue 56), both builds, a short grid: V = 131,072, f32
step sampler
for b in "${builds[@]}"; do
  fits 25 || break
  timeout "$(lim 40)" "$(bin "$b")" bench --device wgpu --law affine --vocab $V --rows $ROWS \
    --dtype f32 --config greedy,temp,topp09,topk50_topp09,minp01 --time-ms 60 --json \
    2>>"$ERR" | tag "$b" >> "$OUT/sampler.jsonl"
  echo "$(date -u +%T) $b sampler rc=${PIPESTATUS[0]}"
done

# 8. speculative decoding (issue 57), new build: a draft made by perturbing the
#    checkpoint's weights (the same size: what verifying K + 1 positions costs against
#    K + 1 steps, and the acceptance), K = 4, greedy and T 0.8, B = 1 and 32; each run
#    also decodes plainly and reports both speeds ("speedup", "acceptance")
step speculative
if fits 60; then
  MD=/tmp/q3shape-draft-$QUICK
  # shellcheck disable=SC2086
  [ -d "$MD" ] || timeout "$(lim 200)" "$D" tiny-model "$MD" $SHAPE --perturb 0.02 2>>"$ERR"
  for p in "$one" "--prompts /tmp/p32.jsonl"; do
    for t in 0 0.8; do
      # shellcheck disable=SC2086
      gen new $p --temperature $t --device wgpu --draft "$MD" --speculate 4
    done
  done
fi
grep -v "^ *[0-9]*: \|^ *at " "$ERR" | tail -5
step "done ($SECONDS s)"
