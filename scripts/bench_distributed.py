"""Times decoda.distributed.sample against gathering the rows whole and sampling them
(what engines do under tensor parallelism), over MPI.

    mpirun -n 2 python scripts/bench_distributed.py [--rows 1,64,256] [--iters 20]

Each rank holds an equal slice of V = 151,936 columns. Prints, per B and parameters,
rank 0's median wall time of both (each call ends with every rank holding the tokens),
and the bytes one rank sends in each round of the sharded call per row (its JSON
summaries' size; the gather sends V / P * 4 bytes a row).
"""

import argparse
import json
import time

import numpy as np
from mpi4py import MPI

import decoda
import decoda.distributed
from decoda import _native, _requests

V = 151936


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,64,256")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    cuts = [V * r // size for r in range(size + 1)]
    lo, hi = cuts[rank], cuts[rank + 1]
    sampler = decoda.Sampler("cpu")
    for b in [int(r) for r in args.rows.split(",")]:
        x = np.random.default_rng(b).standard_normal((b, V)).astype(np.float32) * 3
        shard = np.ascontiguousarray(x[:, lo:hi])
        seeds = list(range(b))
        for name, params in (("greedy", {"temperature": 0}),
                             ("T 1.0", {"temperature": 1.0}),
                             ("top_k 50, T 0.8", {"temperature": 0.8, "top_k": 50})):
            def sharded():
                return decoda.distributed.sample(shard, params, seeds=seeds, offset=lo,
                                                 vocab=V, group=comm).tokens

            def gathered():
                full = np.empty((size, b, hi - lo), dtype=np.float32)
                comm.Allgather(shard, full)
                whole = np.concatenate(list(full), axis=1)
                return sampler.sample(whole, params, seeds=seeds).tokens

            assert sharded().tolist() == gathered().tolist()
            times = {}
            for label, fn in (("sharded", sharded), ("gather + sample", gathered)):
                ts = []
                for _ in range(args.iters):
                    comm.Barrier()
                    t = time.perf_counter()
                    fn()
                    ts.append(time.perf_counter() - t)
                times[label] = float(np.median(ts)) * 1e3
            # the bytes of each round's summary from this rank, per row
            req, _ = _requests(b, params, seeds, None, None, None, None)
            call = _native.ShardCall(shard, req, lo, V)
            r1 = call.round1()
            r1s = comm.allgather(r1)
            r2 = call.round2(r1s)
            sizes = [len(r1.encode()) / b, len(r2.encode()) / b]
            if rank == 0:
                print(json.dumps({
                    "ranks": size, "rows": b, "params": name,
                    "sharded_ms": round(times["sharded"], 3),
                    "gather_sample_ms": round(times["gather + sample"], 3),
                    "bytes_per_row_per_round": [round(s) for s in sizes],
                    "gather_bytes_per_row": (hi - lo) * 4,
                }), flush=True)


if __name__ == "__main__":
    main()
