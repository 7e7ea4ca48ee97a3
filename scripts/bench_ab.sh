#!/usr/bin/env bash
# Time two builds of the CLI against each other in one sitting: `decoda bench --json` with
# the same arguments, the two binaries alternating (A B, B A, A B, ...), so a drift of the
# machine falls on both. On a machine with `taskset`, one-thread runs can be pinned to one
# core (PIN=5 pins to core 5; the default pins nothing).
#
#   scripts/bench_ab.sh OLD_BINARY NEW_BINARY ROUNDS [bench arguments...]
#   PIN=5 scripts/bench_ab.sh /tmp/decoda-old /tmp/decoda-new 14 \
#     --device cpu --vocab 131072 --rows 1 --threads 1 --config topp09,topk50_topp09 --time-ms 500
#
# Writes every cell as a JSON line (with "variant" and "round") to ${OUT:-/tmp/bench_ab}/ab.jsonl
# and prints, per cell and binary: the lowest median, the median of the lower half of the
# rounds' medians, the median of medians and of p10s, the ratio to the floor, and the
# paired change new/old - 1 per round. Put a configuration whose code both binaries share
# next to the one that changed: it shows the noise of the sitting.
set -eu
[ $# -ge 3 ] || { sed -n 2,9p "$0"; exit 2; }
old=$1 new=$2 rounds=$3; shift 3
out=${OUT:-/tmp/bench_ab}; mkdir -p "$out"; : > "$out/ab.jsonl"
pin=(); [ -n "${PIN:-}" ] && pin=(taskset -c "$PIN")
for round in $(seq 1 "$rounds"); do
  if [ $((round % 2)) = 1 ]; then order="old new"; else order="new old"; fi
  for v in $order; do
    if [ "$v" = old ]; then bin=$old; else bin=$new; fi
    "${pin[@]}" "$bin" bench "$@" --json |
      sed "s/^{/{\"variant\":\"$v\",\"round\":$round,/" >> "$out/ab.jsonl"
  done
done
python3 - "$out/ab.jsonl" <<'PY'
import collections, json, statistics as st, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
cells = collections.defaultdict(lambda: collections.defaultdict(dict))
for r in rows:
    key = (r["config"], r["vocab"], r["rows"], r.get("threads"), r.get("dtype"))
    cells[key][r["variant"]][r["round"]] = r
for key, by in sorted(cells.items(), key=lambda kv: str(kv[0])):
    print(" ".join(f"{x}" for x in key if x is not None))
    for v in ("old", "new"):
        runs = list(by[v].values())
        med = sorted(r["median_us"] for r in runs)
        half = med[: max(1, len(med) // 2)]
        line = (f"  {v}: lowest {med[0]:.2f}  lower half {st.median(half):.2f}  "
                f"median {st.median(med):.2f}  p10 {st.median(r['p10_us'] for r in runs):.2f} µs")
        if all("floor_us" in r for r in runs):
            line += f"  x floor {st.median(r['median_us'] / r['floor_us'] for r in runs):.2f}"
        print(line)
    paired = [by["new"][k]["median_us"] / by["old"][k]["median_us"] - 1
              for k in sorted(by["old"]) if k in by["new"]]
    print(f"  new/old - 1 per round: {' '.join(f'{x:+.2f}' for x in paired)}; "
          f"median {st.median(paired):+.3f}, new faster in {sum(x < 0 for x in paired)} of {len(paired)}")
PY
