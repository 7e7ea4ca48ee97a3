# How far f16 arithmetic in the matrix products would move an expert's output from f64, in
# the MoE suite's measure (max|dy| / max|y|, bound 1e-5, crates/decoda/src/testing/moe.rs):
# weights that are f16 values already, inputs N(0, 1) as after an RMS norm, D = 2048.
# Pure Python (struct rounds to f16 and f32): `python3 scripts/f16_products_error.py`.
import random, struct
def h(v):  # round to f16
    return struct.unpack('e', struct.pack('e', v))[0]
def f(v):  # round to f32
    return struct.unpack('f', struct.pack('f', v))[0]
random.seed(1)
D, OUT = 2048, 96
W = [[h(random.gauss(0, 0.02)) for _ in range(D)] for _ in range(OUT)]
for trial in range(2):
    x = [f(random.gauss(0, 1)) for _ in range(D)]
    xh = [h(v) for v in x]
    ref = [sum(w * v for w, v in zip(row, x)) for row in W]
    m = max(abs(v) for v in ref)
    def err(ys): return max(abs(a - b) for a, b in zip(ys, ref)) / m
    # f32: fma-free f32 accumulation in input order
    def dot32(row, xs):
        s = 0.0
        for w, v in zip(row, xs): s = f(s + f(w * v))
        return s
    # f16 multiply, f32 accumulate (x rounded to f16)
    def dot_h_mul(row):
        s = 0.0
        for w, v in zip(row, xh): s = f(s + h(w * v))
        return s
    # f16 multiply-add in chunks of 8 (half2 FMA), chunk sums added in f32
    def dot_h_chunk(row):
        s = 0.0
        for c in range(0, D, 8):
            a = 0.0
            for w, v in zip(row[c:c+8], xh[c:c+8]): a = h(a + h(w * v))
            s = f(s + a)
        return s
    print(f"trial {trial}: f32 {err([dot32(r, x) for r in W]):.2e}  "
          f"x in f16, f32 sums {err([dot32(r, xh) for r in W]):.2e}  "
          f"f16 products {err([dot_h_mul(r) for r in W]):.2e}  "
          f"f16 chunks of 8 {err([dot_h_chunk(r) for r in W]):.2e}  (bound 1e-5)")
