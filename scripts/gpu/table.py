#!/usr/bin/env python3
"""Tables for BENCHMARKS.md from one GPU call of scripts/gpu/device_run.sh.

  python3 scripts/gpu/table.py OUT/decoda.jsonl OUT/peers.jsonl

For each element type, one markdown table per workload (top-k 50 + top-p 0.9, plain
temperature, min-p 0.1, greedy), decoda next to the PyTorch and FlashInfer peers that
compute the same thing, one column per batch size. A cell is `device-only µs (% of the
measured copy bandwidth, one read of the logits)`; a second table per workload gives the
back-to-back (eager) times. Then decoda's stage profile.
"""

import json
import sys

GROUPS = [
    ("top-k 50 + top-p 0.9, T 0.8", "topk50_topp09",
     ["torch_hf_sort", "torch_gumbel", "torch_rowsort", "fi_tktp_rows", "fi_tktp_scalar",
      "fi_pipe_rows", "fi_cake_rows"]),
    ("plain temperature 0.8", "temp", ["fi_plain_T", "fi_plain"]),
    ("min-p 0.1, T 0.8", "minp01", ["fi_minp_pipe", "fi_minp_probs"]),
    ("greedy", "greedy", []),
]


def load(path):
    out = []
    for line in open(path):
        line = line.strip()
        if line:
            out.append(json.loads(line))
    return out


def main():
    dec = [r for r in load(sys.argv[1]) if "median_us" in r]
    peers = load(sys.argv[2]) if len(sys.argv) > 2 else []
    env = next((r for r in peers if r.get("impl") == "env"), {})
    copy = next((r for r in peers if r.get("impl") == "hbm_copy"), None)
    peer_bw = copy["gbps"] * 1e9 if copy else None
    rows = sorted({r["rows"] for r in dec} | {r["rows"] for r in peers if "rows" in r and "median_us" in r})
    dev = dec[0]["device"] if dec else "?"
    print(f"decoda on {dev} (wgpu copy bandwidth {dec[0]['copy_bw_gbs'] if dec else '?'} GB/s); "
          f"peers: {env.get('gpu', '?')}, torch {env.get('torch', '?')}, flashinfer {env.get('flashinfer', '?')}, "
          f"d2d copy {peer_bw / 1e9 if peer_bw else float('nan'):.0f} GB/s\n")
    # one bandwidth for every fraction: the peers' copy probe (2 GiB), else decoda's
    for dtype in ("f32", "bf16"):
        for title, config, impls in GROUPS:
            for kind, key in (("device-only", "gpu_us"), ("back to back", "median_us")):
                print(f"**{title}, {dtype}, V = 131072: {kind} µs (% of copy bandwidth)**\n")
                print("| impl | " + " | ".join(f"B={b}" for b in rows) + " |")
                print("|---|" + "---|" * len(rows))
                lines = [("decoda", [r for r in dec if r["config"] == config and r["dtype"] == dtype])]
                lines += [(i, [r for r in peers if r.get("impl") == i and r.get("dtype") == dtype]) for i in impls]
                for name, recs in lines:
                    cells = []
                    for b in rows:
                        r = next((x for x in recs if x["rows"] == b and key in x), None)
                        if r is None:
                            cells.append("-")
                            continue
                        bw = peer_bw or r.get("copy_bw_gbs", 0) * 1e9
                        pct = 100 * r["bytes_read"] / (r[key] * 1e-6) / bw if bw else float("nan")
                        flag = "" if r.get("check", "ok") == "ok" else " (check failed)"
                        cells.append(f"{r[key]:.1f} ({pct:.0f}%){flag}" if r[key] < 100
                                     else f"{r[key]:.0f} ({pct:.0f}%){flag}")
                    if any(c != "-" for c in cells):
                        print(f"| {name} | " + " | ".join(cells) + " |")
                print()
    print("**decoda's stages, device µs (each stage in a pass of its own), f32**\n")
    # every stage any row reports, in the step's order (walk and decide: the full-row
    # path's phases, summed)
    order = ["probe", "scan", "settle", "settle_finish", "draw_finish", "walk", "decide",
             "draw_many", "lp", "finish"]
    seen = {k for r in dec if r.get("stages_us") for k in r["stages_us"]}
    stages = [s for s in order if s in seen] + sorted(seen - set(order))
    print("| config | B | " + " | ".join(stages) + " | sum | one pass |")
    print("|---|---|" + "---|" * (len(stages) + 2))
    for r in dec:
        if r["dtype"] != "f32" or not r.get("stages_us"):
            continue
        st = r["stages_us"]
        print(f"| {r['config']} | {r['rows']} | " + " | ".join(f"{st.get(s, 0):.1f}" for s in stages)
              + f" | {sum(st.values()):.1f} | {r['gpu_us']:.1f} |")


if __name__ == "__main__":
    main()
