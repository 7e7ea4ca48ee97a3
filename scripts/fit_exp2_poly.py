"""Fits the polynomials of the top-p normaliser's `2^w` (crates/decoda/src/cpu/kernels.rs),
minimising the relative error by iteratively reweighted least squares on Chebyshev nodes:

- `EXP2_Q8` (the AVX2 kernel, after an eight-entry table): 2^r ~ 1 + r (Q0 + r (Q1 + r Q2))
  on |r| <= 1/16;
- `EXP2_P5` (the baseline kernels, no table): 2^f ~ 1 + f (P0 + f (P1 + ... + f P4)) on
  |f| <= 1/2, checked as the kernels evaluate it: f32 multiplies and adds, unfused;
- `EXP2_Q8_COARSE` and `EXP2_P4_COARSE`: the same one degree lower (the coarse terms of
  the tokens outside the top-p candidate list, `Terms::Coarse`).

Prints the f32 coefficients (highest degree first) and the worst relative error on a fine
grid.

    python3 scripts/fit_exp2_poly.py   (needs numpy)
"""
import numpy as np


def fit(half_width, terms, nodes, rounds):
    """Coefficients c (lowest first) of q with 2^r ~ 1 + r q(r), as f32."""
    r = np.cos(np.linspace(0, np.pi, nodes)) * half_width
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
