#!/usr/bin/env python3
"""MLX's own MoE layer on the CPU, for BENCHMARKS.md: mlx-lm's SwitchGLU (gather_mm, or
gather_qmm for quantized weights, with its own sort rule: sort when N * k >= 64) and the
same layer with the sort forced on and off, on the shape `decoda moe-bench` uses.

    pip install "mlx[cpu]" mlx-lm
    python3 scripts/mlx_moe_bench.py --dtype bf16 --tokens 1,8,64,512

Prints one JSON line per N: impl, dtype, tokens, switchglu_us, sorted_us, unsorted_us.
"""
import argparse
import json
import time

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import switch_layers as sl


def median_us(f, time_ms):
    f()
    mx.synchronize()
    samples = []
    start = time.perf_counter()
    while len(samples) < 5 or (time.perf_counter() - start) * 1e3 < time_ms:
        t = time.perf_counter()
        f()
        mx.synchronize()
        samples.append((time.perf_counter() - t) * 1e6)
    samples.sort()
    return samples[len(samples) // 2]


def forced(layer, x, indices, sort):
    """SwitchGLU.__call__ with the sort decision forced."""
    x = mx.expand_dims(x, (-2, -3))
    idx, inv = indices, None
    if sort:
        x, idx, inv = sl._gather_sort(x, indices)
    up = layer.up_proj(x, idx, sorted_indices=sort)
    gate = layer.gate_proj(x, idx, sorted_indices=sort)
    y = layer.down_proj(layer.activation(up, gate), idx, sorted_indices=sort)
    if sort:
        y = sl._scatter_unsort(y, inv, indices.shape)
    return y.squeeze(-2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--intermediate", type=int, default=384)
    ap.add_argument("--dtype", default="bf16", help="f32, bf16, f16, q4g32, q4g64, q8g64")
    ap.add_argument("--tokens", default="1,2,4,8,16,32,64,128,256,512,1024")
    ap.add_argument("--time-ms", type=float, default=500)
    a = ap.parse_args()
    mx.set_default_device(mx.cpu)
    mx.random.seed(11)
    layer = sl.SwitchGLU(a.hidden, a.intermediate, a.experts)
    if a.dtype.startswith("q"):
        bits, group = a.dtype[1:].split("g")
        nn.quantize(layer, group_size=int(group), bits=int(bits))
    else:
        dt = {"f32": mx.float32, "bf16": mx.bfloat16, "f16": mx.float16}[a.dtype]
        layer.set_dtype(dt)
    mx.eval(layer.parameters())
    for n in [int(t) for t in a.tokens.split(",")]:
        x = mx.random.uniform(-1, 1, (n, a.hidden)).astype(mx.float32)
        logits = mx.random.uniform(-2, 2, (n, a.experts))
        idx = mx.argpartition(-logits, kth=a.top_k - 1, axis=-1)[:, : a.top_k].astype(mx.uint32)
        mx.eval(x, idx)
        line = {
            "impl": "mlx " + mx.__version__,
            "dtype": a.dtype,
            "experts": a.experts,
            "top_k": a.top_k,
            "hidden": a.hidden,
            "intermediate": a.intermediate,
            "tokens": n,
            "switchglu_us": round(median_us(lambda: mx.eval(layer(x, idx)), a.time_ms), 1),
            "sorted_us": round(median_us(lambda: mx.eval(forced(layer, x, idx, True)), a.time_ms), 1),
            "unsorted_us": round(median_us(lambda: mx.eval(forced(layer, x, idx, False)), a.time_ms), 1),
        }
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
