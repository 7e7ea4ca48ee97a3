#!/usr/bin/env python3
"""Prefill and decode speed of `decoda generate` next to mlx-lm, on one checkpoint, in one run.

    cargo build --release -p decoda-cli
    python3 scripts/generate_bench.py DIR [--prompt-len 64] [--tokens 32] [--devices cpu,wgpu]
                                          [--repeat 3] [--no-mlx]

For each device it runs greedy generation with the default sort cutoff, with
--sort-cutoff 1 (every MoE call of more than one token sorts: the prefill, and decode
steps of 4 sequences) and with none sorted (a huge cutoff), one sequence and 4 at once
(rotations of the prompt, so decode calls have N = 4); on wgpu also with
--host-sampling (the logits copied to the host each step and sampled there instead of by
the head on the device). mlx-lm (`pip install "mlx[cpu]" mlx-lm`) runs the same prompt
greedily on the CPU through `mlx_lm.utils.load_model` and a KV cache. Each figure is the
median of --repeat runs. Prints a Markdown table; --json prints JSON lines.
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DECODA = ROOT / "target" / "release" / "decoda"


def decoda(model, prompt, tokens, device, extra, batch=1):
    if batch == 1:
        src = ["--prompt-ids", ",".join(map(str, prompt))]
    else:
        f = Path(tempfile.mkstemp(suffix=".jsonl")[1])
        f.write_text("".join(json.dumps({"prompt_ids": prompt[i:] + prompt[:i], "seed": i}) + "\n"
                             for i in range(batch)))
        src = ["--prompts", str(f)]
    cmd = [str(DECODA), "generate", "--model", str(model), *src,
           "--max-tokens", str(tokens), "--temperature", "0", "--device", device, "--json", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)}\n{r.stderr}")
    v = json.loads(r.stdout)
    if batch > 1:
        v["tokens"] = v["sequences"][0]["tokens"]
    prefill_tok_s = v["prefill_tokens"] / (v["prefill_ms"] / 1e3)
    return {"device": v["device"], "prefill_tok_s": prefill_tok_s, "decode_tok_s": v["decode_tok_s"],
            "moe": v["moe"], "tokens": v["tokens"]}


def mlx(model, prompt, tokens):
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load_model
    m, _ = load_model(Path(model))
    cache = make_prompt_cache(m)
    t0 = time.perf_counter()
    logits = m(mx.array([prompt]), cache=cache)[0, -1]
    tok = mx.argmax(logits)
    mx.eval(tok)
    t1 = time.perf_counter()
    ids = [int(tok.item())]
    for _ in range(tokens - 1):
        logits = m(tok.reshape(1, 1), cache=cache)[0, -1]
        tok = mx.argmax(logits)
        mx.eval(tok)
        ids.append(int(tok.item()))
    t2 = time.perf_counter()
    return {"device": f"mlx-lm {mx.__version__} (cpu)", "prefill_tok_s": len(prompt) / (t1 - t0),
            "decode_tok_s": (tokens - 1) / (t2 - t1), "moe": {}, "tokens": ids}


def median_of(runs):
    out = dict(runs[0])
    for k in ("prefill_tok_s", "decode_tok_s"):
        out[k] = statistics.median(r[k] for r in runs)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--devices", default="cpu,wgpu")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-mlx", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    cfg = json.loads((Path(a.model) / "config.json").read_text())
    prompt = [(7 * i + 11) % min(cfg["vocab_size"], 256) for i in range(a.prompt_len)]
    rows = []
    for dev in a.devices.split(","):
        variants = [("default cutoff", [], 1), ("sort cutoff 1", ["--sort-cutoff", "1"], 1),
                    ("never sort", ["--sort-cutoff", "1000000000"], 1),
                    ("4 sequences, sort cutoff 1", ["--sort-cutoff", "1"], 4),
                    ("4 sequences, never sort", ["--sort-cutoff", "1000000000"], 4)]
        if dev == "wgpu":
            variants.insert(1, ("host sampling", ["--host-sampling"], 1))
        for name, extra, batch in variants:
            r = median_of([decoda(a.model, prompt, a.tokens, dev, extra, batch) for _ in range(a.repeat)])
            r["variant"] = name
            r["batch"] = batch
            rows.append(r)
    if not a.no_mlx:
        r = median_of([mlx(a.model, prompt, a.tokens) for _ in range(a.repeat)])
        r["variant"] = "greedy"
        r["batch"] = 1
        rows.append(r)
    ref = rows[0]["tokens"]
    for r in rows:
        r["same_ids"] = r["tokens"] == ref if r["batch"] == 1 else None
    if a.json:
        for r in rows:
            print(json.dumps({k: v for k, v in r.items() if k != "tokens"}))
        return
    print(f"checkpoint {a.model}: prompt {a.prompt_len} tokens, {a.tokens} generated, median of {a.repeat}\n")
    print("(decode tok/s counts every sequence's tokens; prefill runs one sequence at a time)\n")
    print("| engine | variant | prefill tok/s | decode tok/s | MoE prefill / decode | ids as row 1 |")
    print("|---|---|---:|---:|---|---|")
    for r in rows:
        moe = f"{r['moe'].get('prefill') or '-'} / {r['moe'].get('decode') or '-'}" if r["moe"] else "-"
        print(f"| {r['device']} | {r['variant']} | {r['prefill_tok_s']:.1f} | {r['decode_tok_s']:.1f} | {moe} | "
              f"{'-' if r['same_ids'] is None else 'yes' if r['same_ids'] else 'no'} |")


if __name__ == "__main__":
    main()
