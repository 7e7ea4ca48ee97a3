"""Fits the polynomials of the top-p normaliser's `2^w` (crates/decoda/src/cpu/kernels.rs),
minimising the relative error by iteratively reweighted least squares on Chebyshev nodes:

- `EXP2_Q8` (the AVX2 kernel, after an eight-entry table): 2^r ~ 1 + r (Q0 + r (Q1 + r Q2))
  on |r| <= 1/16;
- `EXP2_P5` (the baseline kernels, no table): 2^f ~ 1 + f (P0 + f (P1 + ... + f P4)) on
  |f| <= 1/2, checked as the kernels evaluate it: f32 multiplies and adds, unfused;
- `EXP2_Q8_COARSE` and `EXP2_P4_COARSE`: the same one degree lower (the coarse terms of
  the tokens outside the top-p candidate list, `Terms::Coarse`);
- `EXP2_SQ_TABLE`, `EXP2_SQ_B`, `EXP2_SQ_C` (the AVX-512 kernel): 2^(j/32 + r) ~
  A[j] ((r + b)^2 + c) on 0 <= r < 1/32 with A[j] = a 2^(j/32), the quadratic fitted as
  above and moved by a few f32 ulps (and `a` by a few parts in 10^8) to the least error
  of the whole term as the kernel makes it (an add, a multiply-add, times the f32 table
  entry, each rounded to f32), searched over w in [0, 1) in steps of 2^-17 and
  checked in steps of 2^-21.

Prints the f32 coefficients (highest degree first) and the worst relative error on a fine
grid.

    python3 scripts/fit_exp2_poly.py   (needs numpy)
"""
import numpy as np


def fit(half_width, terms, nodes, rounds, lo=None):
    """Coefficients c (lowest first) of q with 2^r ~ 1 + r q(r), as f32, on
    [-half_width, half_width] (or [lo, lo + 2 half_width])."""
    r = np.cos(np.linspace(0, np.pi, nodes)) * half_width
    if lo is not None:
        r = r + lo + half_width
    r = r[r != 0]
    target = (np.exp2(r) - 1) / r  # q(r), so that 1 + r q(r) = 2^r
    weight = np.abs(r) / np.exp2(r)  # turns q's error into 2^r's relative error
    basis = np.stack([r**k for k in range(terms)], 1)
    w = np.ones_like(r)
    for _ in range(rounds):
        c, *_ = np.linalg.lstsq(basis * (weight * w)[:, None], target * weight * w, rcond=None)
        err = (1 + r * (basis @ c)) / np.exp2(r) - 1
        w *= 1 + 50 * np.abs(err) / np.abs(err).max()
        w /= w.max()
    return c.astype(np.float32)


def worst_f64(c, half_width):
    g = np.linspace(-half_width, half_width, 200001)
    q = np.zeros_like(g)
    for k in reversed(range(len(c))):
        q = q * g + float(c[k])
    return np.abs((1 + g * q) / np.exp2(g) - 1).max()


def worst_f32_unfused(c, half_width):
    g = np.linspace(-half_width, half_width, 2000001).astype(np.float32)
    p = np.full_like(g, c[-1])
    for k in reversed(range(len(c) - 1)):
        p = (p * g).astype(np.float32) + c[k]
    p = (p * g).astype(np.float32) + np.float32(1)
    return np.abs(p.astype(np.float64) / np.exp2(g.astype(np.float64)) - 1).max()


def show(name, c, err):
    print(f"{name} = [{', '.join(repr(float(x)) for x in c[::-1])}]  worst relative error {err:.3g}")


q8 = fit(1 / 16, 3, 4001, 60)
show("EXP2_Q8", q8, worst_f64(q8, 1 / 16))
p5 = fit(1 / 2, 5, 8001, 100)
show("EXP2_P5", p5, worst_f32_unfused(p5, 1 / 2))
q8c = fit(1 / 16, 2, 4001, 60)
show("EXP2_Q8_COARSE", q8c, worst_f64(q8c, 1 / 16))
p4c = fit(1 / 2, 4, 8001, 100)
show("EXP2_P4_COARSE", p4c, worst_f32_unfused(p4c, 1 / 2))


def f32(x):
    return np.asarray(x, np.float64).astype(np.float32).astype(np.float64)


def avx512_terms(a, b, c, w):
    """The AVX-512 terms of `w` as the kernel makes them: with w = n + j/32 + r rounded
    down (0 <= r < 1/32), A[j] ((r + b)^2 + c) 2^n with A[j] = a 2^(j/32), each step
    rounded to f32."""
    table = f32(a * np.exp2(np.arange(32) / 32))
    down = np.floor(w * 32)
    r = f32(w - down / 32)
    u = f32(r + float(b))
    p = f32(u * u + float(c))
    return f32(table[down.astype(np.int64) % 32] * p) * np.exp2(np.floor(w))


def worst_avx512(a, b, c, steps):
    w = f32(np.arange(steps) / steps)
    return np.abs(avx512_terms(a, b, c, w) / np.exp2(w) - 1).max()


# 1 + r (d0 + r d1) = a ((r + b)^2 + c), then the least worst error near it
d = fit(1 / 64, 2, 4001, 80, lo=0.0).astype(np.float64)
a0 = d[1]
b0 = np.float32(d[0] / (2 * d[1]))
c0 = np.float32(1 / d[1] - (d[0] / (2 * d[1])) ** 2)
near = [
    (a0 * (1 + m * 3e-8), b0 + i * np.spacing(b0), c0 + k * np.spacing(c0))
    for m in range(-4, 5)
    for i in range(-6, 7)
    for k in range(-6, 7)
]
a, b, c = min(near, key=lambda t: worst_avx512(*t, 2**17))
table = f32(a * np.exp2(np.arange(32) / 32)).astype(np.float32)
short = lambda x: np.format_float_positional(np.float32(x), unique=True)  # noqa: E731
print(f"EXP2_SQ_TABLE (a = {float(a)!r}) = [{', '.join(short(x) for x in table)}]")
print(f"EXP2_SQ_B, EXP2_SQ_C = {short(b)}, {short(c)}  worst relative error of the term {worst_avx512(a, b, c, 2**21):.3g}")
