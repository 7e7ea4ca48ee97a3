#!/usr/bin/env python3
"""Golden outputs for decoda's Qwen3-MoE from mlx-lm (an implementation nobody here wrote).

For each case this writes a random checkpoint with `decoda tiny-model` (f32, seeded, so the
Rust test rebuilds the same files), loads it with `mlx_lm.utils.load_model`, and records
64 greedy tokens and the raw logits of some steps. The quantized cases are made by MLX
itself from the f32 checkpoint (`mlx_lm.utils.quantize_model`, which keeps the router at
8 bits as mlx-lm does for Qwen3-MoE) and saved with `mlx_lm.utils.save_model`; those
directories are committed, so `cargo test` needs no Python.

    pip install "mlx[cpu]" mlx-lm
    cargo build --release -p decoda-cli
    python3 scripts/mlx_qwen3_golden.py            # rewrites crates/decoda/tests/golden/

The output, golden/qwen3_moe.json: a list of cases, each with the tiny-model flags (or the
directory of an MLX-quantized checkpoint), the prompt, the greedy ids, and the logits of
the steps in `logit_steps` (step 0 = the prefill's last position). The test holds every
case to greedy ids equal for all 64 steps and logits within 1e-4 of the row's largest
magnitude.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model, quantize_model, save_config, save_model

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "crates" / "decoda" / "tests" / "golden"
DECODA = ROOT / "target" / "release" / "decoda"
STEPS = 64
LOGIT_STEPS = [0, 1, 2, 3, 8, 16, 32, 63]

# f32 checkpoints of several shapes: the tiny-model flags, and a prompt
CASES = [
    {
        "name": "default",
        "flags": ["--seed", "1"],
        "prompt": [256, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100],
    },
    {
        # tied embeddings, every layer MoE, no renormalisation, q width != hidden, MHA
        "name": "tied_mha",
        "flags": ["--seed", "2", "--hidden", "96", "--layers", "2", "--heads", "4",
                  "--kv-heads", "4", "--head-dim", "32", "--experts", "16", "--top-k", "4",
                  "--moe-intermediate", "32", "--dense-layers", "", "--tie", "--no-norm-topk"],
        # longer than the default sort cutoff: the prefill sorts
        "prompt": list(range(40, 64)),
    },
    {
        # MLX's stacked layout, two shards, one KV head, a larger vocabulary
        "name": "mqa_sharded",
        "flags": ["--seed", "3", "--hidden", "128", "--layers", "4", "--heads", "8",
                  "--kv-heads", "1", "--head-dim", "16", "--experts", "32", "--top-k", "8",
                  "--moe-intermediate", "64", "--intermediate", "192", "--dense-layers", "0,2",
                  "--vocab", "1000", "--mlx-layout", "--shards", "2"],
        "prompt": [256, 10, 20, 30, 40, 50, 60, 70],
    },
]

# MLX-quantized checkpoints made from the "default" case's f32 checkpoint
QUANT = [(4, 32), (4, 64), (8, 64)]


def greedy(model, prompt):
    cache = make_prompt_cache(model)
    logits = model(mx.array([prompt]), cache=cache)[0, -1]
    ids, rows = [], {}
    for step in range(STEPS):
        mx.eval(logits)
        if step in LOGIT_STEPS:
            rows[step] = np.array(logits, dtype=np.float32).tolist()
        t = int(mx.argmax(logits).item())
        ids.append(t)
        if step + 1 < STEPS:
            logits = model(mx.array([[t]]), cache=cache)[0, -1]
    return ids, [rows[s] for s in LOGIT_STEPS]


def main():
    if not DECODA.exists():
        sys.exit(f"{DECODA} is missing: cargo build --release -p decoda-cli")
    GOLDEN.mkdir(parents=True, exist_ok=True)
    out = []
    tmp = Path(tempfile.mkdtemp())
    for case in CASES:
        d = tmp / case["name"]
        subprocess.run([str(DECODA), "tiny-model", str(d), *case["flags"]], check=True)
        model, config = load_model(d)
        ids, logits = greedy(model, case["prompt"])
        out.append({"name": case["name"], "flags": case["flags"], "prompt": case["prompt"],
                    "ids": ids, "logit_steps": LOGIT_STEPS, "logits": logits})
        print(case["name"], ids[:16], file=sys.stderr)
        if case["name"] == "default":
            for bits, group in QUANT:
                model, config = load_model(d)
                model, qconfig = quantize_model(model, config, group, bits)
                name = f"mlx_q{bits}g{group}"
                qdir = GOLDEN / name
                if qdir.exists():
                    shutil.rmtree(qdir)
                save_model(qdir, model)
                save_config(qconfig, qdir / "config.json")
                shutil.copy(d / "tokenizer.json", qdir / "tokenizer.json")
                model, _ = load_model(qdir)
                qids, qlogits = greedy(model, case["prompt"])
                out.append({"name": name, "dir": name, "prompt": case["prompt"], "ids": qids,
                            "logit_steps": LOGIT_STEPS, "logits": qlogits})
                print(name, qids[:16], file=sys.stderr)
    (GOLDEN / "qwen3_moe.json").write_text(json.dumps({
        "generator": f"scripts/mlx_qwen3_golden.py with mlx {mx.__version__}",
        "cases": out,
    }))
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
