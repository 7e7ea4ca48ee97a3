"""Fits the AVX2 top-p normaliser's polynomial (`EXP2_Q8` in crates/decoda/src/cpu/kernels.rs):
2^r ~ 1 + r (Q0 + r (Q1 + r Q2)) on |r| <= 1/16, minimising the relative error by
iteratively reweighted least squares on Chebyshev nodes. Prints [Q2, Q1, Q0] as f32 and the
worst relative error of the f32 coefficients on a fine grid.

    python3 scripts/fit_exp2_poly.py   (needs numpy)
"""
import numpy as np

A = 1 / 16
r = np.cos(np.linspace(0, np.pi, 4001)) * A
r = r[r != 0]
target = (np.exp2(r) - 1) / r           # q(r), so that 1 + r q(r) = 2^r
weight = np.abs(r) / np.exp2(r)         # turns q's error into 2^r's relative error
basis = np.stack([np.ones_like(r), r, r * r], 1)
w = np.ones_like(r)
for _ in range(60):
    c, *_ = np.linalg.lstsq(basis * (weight * w)[:, None], target * weight * w, rcond=None)
    err = (1 + r * (basis @ c)) / np.exp2(r) - 1
    w *= 1 + 50 * np.abs(err) / np.abs(err).max()
    w /= w.max()
q0, q1, q2 = c.astype(np.float32)
grid = np.linspace(-A, A, 200001)
worst = np.abs((1 + grid * (q0 + grid * (q1 + grid * q2))) / np.exp2(grid) - 1).max()
print(f"EXP2_Q8 = [{float(q2)!r}, {float(q1)!r}, {float(q0)!r}]  worst relative error {worst:.3g}")
