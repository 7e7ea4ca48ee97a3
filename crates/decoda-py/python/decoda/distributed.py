"""Vocabulary-sharded sampling over a distributed group (docs/CONTRACT.md, "Sampling a
vocabulary split across shards").

Each rank holds the logits of its slice of the vocabulary (ids ``offset .. offset +
Vs``); :func:`sample` exchanges a few small summaries over the group (an ``mpi4py``
communicator, or a ``torch.distributed`` process group) and returns on every rank what
:meth:`decoda.Sampler.sample` returns for the whole rows: the same tokens, the same
log-probabilities (within ``1e-5``, as backends agree).
"""

import json
from typing import Any, Callable, List, Optional, Sequence, Union

import numpy as np

from . import Params, SampleResult, _logits_2d, _native, _requests

__all__ = ["sample"]


def _allgather(group: Any) -> Callable[[Any], List[Any]]:
    """The group's all-gather of a picklable object: an mpi4py communicator's
    ``allgather``, or ``torch.distributed.all_gather_object`` (a torch ``ProcessGroup``
    has an ``allgather`` method too, of tensors: it is told apart by mpi4py's
    ``Get_rank``)."""
    if hasattr(group, "Get_rank") and hasattr(group, "allgather"):
        return group.allgather
    import torch.distributed as dist

    def gather(obj: Any) -> List[Any]:
        out: List[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(out, obj, group=group)
        return out

    return gather


def _exchange(gather: Callable[[Any], List[Any]], make: Callable[[], Any]) -> List[Any]:
    """One round: every rank's payload, or the first rank's error raised on every rank
    (a rank that fails still takes part in the exchange, so none waits forever)."""
    try:
        mine = ("ok", make())
    except (ValueError, TypeError, RuntimeError) as e:
        mine = ("error", str(e))
    got = gather(mine)
    for rank, (kind, payload) in enumerate(got):
        if kind == "error":
            raise ValueError(f"rank {rank}: {payload}")
    return [payload for _, payload in got]


def sample(
    shard: Any,
    params: Params = None,
    *,
    seeds: Union[int, Sequence[int]],
    steps: Union[None, int, Sequence[int]] = None,
    outputs: Optional[Sequence[Any]] = None,
    prompts: Optional[Sequence[Any]] = None,
    masks: Any = None,
    offset: int,
    vocab: int,
    group: Any,
) -> SampleResult:
    """Samples B rows whose logits are split by vocabulary across ``group``'s ranks.

    ``shard``: this rank's ``[B, Vs]`` logits, the ids ``offset .. offset + Vs`` of a
    vocabulary of ``vocab`` (the ranks' slices must cover it once, in any order and any
    sizes). ``params``, ``seeds``, ``steps``, ``outputs``, ``prompts`` and ``masks`` are
    :meth:`decoda.Sampler.sample`'s for the whole rows (ids global, masks over the whole
    vocabulary) and must be the same on every rank (checked: a digest in the first
    round); ``seeds`` are required. Returns, on every rank, the whole rows' result.

    Mask, bias, penalties, DRY, greedy, temperature, top-k, min-p and log-probabilities
    run sharded; top-p, typical-p, top-n-σ, XTC and the kept distribution raise
    ``ValueError`` naming the field. Any rank's error is raised on every rank.
    """
    if seeds is None:
        raise ValueError("seeds: give every row's seed, the same on every rank")
    gather = _allgather(group)
    call: List[Any] = []

    def first() -> str:
        x = np.ascontiguousarray(np.asarray(_logits_2d(shard), dtype=np.float32))
        requests, _ = _requests(x.shape[0], params, seeds, steps, prompts, outputs, masks)
        call.append(_native.ShardCall(x, requests, int(offset), int(vocab)))
        return call[0].round1()

    r1 = _exchange(gather, first)
    r2 = _exchange(gather, lambda: call[0].round2(r1))
    r3 = _exchange(gather, lambda: call[0].round3(r2))
    tokens, extras = call[0].finish([] if r3[0] is None else r3)
    rows = len(tokens)
    seed_list = [int(s) for s in np.broadcast_to(np.asarray(seeds), (rows,))]
    result = SampleResult(tokens=tokens, seeds=seed_list)
    for e in json.loads(extras) if extras is not None else [None] * rows:
        e = e or {}
        result.errors.append(e.get("error"))
        result.logprobs.append(e.get("logprobs"))
        result.kept.append(e.get("kept"))
    return result
