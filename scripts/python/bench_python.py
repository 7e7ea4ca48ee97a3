"""Times decoda from Python: the Python layer's cost over the native call, and the
mlx-lm sampler with decoda against mlx-lm's own chain on MLX's CPU backend.

    pip install ./crates/decoda-py "mlx[cpu]" mlx-lm
    python scripts/python/bench_python.py [--vocab 151936] [--iters 300]

Prints one line per measurement (median and p10/p90 in microseconds per call, B = 1).
The Rust call, the native entry point and the Python call are timed in turn, in blocks
of 100 back-to-back calls, so a drift of the machine's speed hits the three alike.
"""

import argparse
import json
import time

import numpy as np

import decoda


def timed(f, iters):
    f()  # warm up
    ts = []
    for _ in range(iters):
        t = time.perf_counter()
        f()
        ts.append((time.perf_counter() - t) * 1e6)
    ts.sort()
    return ts[len(ts) // 2], ts[len(ts) // 10], ts[len(ts) * 9 // 10]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--iters", type=int, default=300)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    ranks = rng.permutation(a.vocab) + 1
    x = (-1.1 * np.log(ranks) + 0.3 * rng.standard_normal(a.vocab)).astype(np.float32)[None, :]
    s = decoda.Sampler(device="cpu")
    rows = []
    for name, params in [("temp", {"temperature": 0.8}), ("topp09", {"temperature": 0.8, "top_p": 0.9})]:
        req = json.dumps([dict(params, seed=1, step=17)])
        # the three ways in blocks of 100 calls in turn, so a drift of the machine hits
        # them alike while each block runs back to back (as a decode loop would)
        rust, native, full = [], [], []
        for _ in range(max(1, a.iters // 100)):
            rust.extend(s._native._time_rust(x, req, 100))
            for _ in range(100):
                t = time.perf_counter()
                s._native.sample(x, req)
                native.append((time.perf_counter() - t) * 1e6)
            for _ in range(100):
                t = time.perf_counter()
                s.sample(x, params, seeds=1, steps=17)
                full.append((time.perf_counter() - t) * 1e6)
        for label, ts in [("Rust call alone (in Rust)", rust), ("decoda native call", native),
                          ("decoda.Sampler.sample", full)]:
            ts.sort()
            n = len(ts)
            rows.append((f"{label}, {name}", (ts[n // 2], ts[n // 10], ts[n * 9 // 10])))
    try:
        import mlx.core as mx
        from mlx_lm.sample_utils import make_sampler as mlx_make

        from decoda import mlx as decoda_mlx

        lp = mx.array(x)
        lp = lp - mx.logsumexp(lp, axis=-1, keepdims=True)
        mx.eval(lp)
        theirs = mlx_make(temp=0.8, top_p=0.9)
        ours = decoda_mlx.make_sampler(temp=0.8, top_p=0.9, seed=1)
        rows.append(("mlx-lm make_sampler top-p 0.9 (MLX CPU)",
                     timed(lambda: mx.eval(theirs(lp)), a.iters)))
        rows.append(("decoda.mlx.make_sampler top-p 0.9", timed(lambda: mx.eval(ours(lp)), a.iters)))
    except ImportError as e:
        print(f"(mlx-lm rows skipped: {e})")
    print(f"V = {a.vocab}, B = 1, {a.iters} calls each; microseconds per call")
    for name, (med, p10, p90) in rows:
        print(f"{name:45s} median {med:9.1f}  p10 {p10:9.1f}  p90 {p90:9.1f}")


if __name__ == "__main__":
    main()
