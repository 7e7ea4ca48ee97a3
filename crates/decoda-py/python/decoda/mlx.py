"""decoda as mlx-lm's sampler: seeded, reproducible sampling for ``mlx_lm.generate``,
``stream_generate`` and ``BatchGenerator``.

mlx-lm's own ``make_sampler`` draws from MLX's global random state, so a request's seed
does not make its text repeat, and its top-p sorts the whole vocabulary. The sampler
made here draws row ``r`` at step ``n`` (its ``n``-th call) with decoda's contract: the
same seed gives the same tokens, whatever else runs::

    from mlx_lm import load, stream_generate
    import decoda.mlx
    model, tokenizer = load("Qwen/Qwen3-0.6B")
    sampler = decoda.mlx.make_sampler(temp=0.7, top_p=0.9, seed=42)
    for r in stream_generate(model, tokenizer, "Hello", sampler=sampler):
        print(r.text, end="")

Give each request its own sampler (``BatchGenerator.insert(..., samplers=[...])``):
its step count is the request's own, so its tokens do not depend on the other
requests in the batch. A sampler shared by a batch draws every row with its seed.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from . import Sampler

__all__ = ["make_sampler", "DecodaSampler"]


class DecodaSampler:
    """A callable for mlx-lm: log-probabilities ``[B, V]`` (an ``mx.array``) in, one
    token per row out (``mx.array`` of uint32), drawn at this sampler's seed and its
    next step. ``step`` is the step of the next call (the request's token index)."""

    def __init__(self, params: dict, seed: int, step: int, sampler: Sampler) -> None:
        self.params = params
        self.seed = seed
        self.step = step
        self._sampler = sampler

    def __call__(self, logprobs: Any) -> Any:
        import mlx.core as mx

        x = np.asarray(logprobs.astype(mx.float32))
        out = self._sampler.sample(x, self.params, seeds=self.seed, steps=self.step)
        self.step += 1
        for r, e in enumerate(out.errors):
            if e is not None:
                raise RuntimeError(f"decoda: row {r}: {e['kind']}: {e['message']}")
        return mx.array(out.tokens.astype(np.uint32))


def make_sampler(
    temp: Optional[float] = None,
    top_p: float = 0.0,
    min_p: float = 0.0,
    min_tokens_to_keep: int = 1,
    top_k: int = 0,
    xtc_probability: float = 0.0,
    xtc_threshold: float = 0.1,
    *,
    temperature: Optional[float] = None,
    seed: Optional[int] = None,
    step: int = 0,
    device: str = "cpu",
    threads: Optional[int] = None,
    **params: Any,
) -> DecodaSampler:
    """A sampler with mlx-lm's ``make_sampler`` arguments (``temp`` or ``temperature``,
    default 0 as mlx-lm: greedy; ``top_p`` 0 or 1 is off, as mlx-lm), keyed by ``seed``
    (from the OS when None: read it back from ``.seed``) and counting steps from
    ``step``. Any other parameter of decoda's contract (``typical_p``, ``top_n_sigma``,
    ``dry_multiplier``, ``logit_bias``...) by keyword. ``min_tokens_to_keep`` is
    accepted for mlx-lm's signature: decoda's filters always keep the most likely token.
    ``device``: ``"cpu"`` (default: logprobs arrive on the host anyway), ``"wgpu"`` or
    ``"auto"``."""
    from . import _native

    t = temperature if temperature is not None else (temp if temp is not None else 0.0)
    p = dict(params)
    p["temperature"] = float(t)
    if 0.0 < top_p < 1.0:
        p["top_p"] = float(top_p)
    if min_p:
        p["min_p"] = float(min_p)
    if top_k:
        p["top_k"] = int(top_k)
    if xtc_probability:
        p["xtc_probability"] = float(xtc_probability)
        p["xtc_threshold"] = float(xtc_threshold)
    del min_tokens_to_keep
    s = seed if seed is not None else _native.entropy_seed()
    return DecodaSampler(p, int(s), int(step), Sampler(device=device, threads=threads))
