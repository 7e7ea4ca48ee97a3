"""decoda: exact, seeded, batch-invariant token sampling for LLMs.

A token is a pure function of (logits row, parameters, seed, step, history): not of the
batch it sits in, the thread count or the device. The parameters are the keys of the
CLI's ``--params`` (docs/CONTRACT.md in the repository): temperature, top_k, top_p,
min_p, repetition_penalty, frequency_penalty, presence_penalty, logit_bias, logprobs,
logprobs_mode, dry_*, top_n_sigma, typical_p, xtc_probability, xtc_threshold, kept.

>>> import numpy as np, decoda
>>> s = decoda.Sampler(device="cpu")
>>> out = s.sample(np.array([[0.5, 2.0, 1.0]], dtype=np.float32),
...                params={"temperature": 0.0}, seeds=7)
>>> out.tokens.tolist()
[1]
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

# Mesa's device-selection layer (an implicit Vulkan layer installed with Mesa's drivers)
# connects to the Wayland and X displays when it orders the GPUs, and on a machine
# without a desktop session prints "error: XDG_RUNTIME_DIR is invalid or not set in the
# environment." at every adapter probe. decoda picks its adapter itself and presents
# nothing, so the layer is switched off by its documented variable, as the CLI does,
# unless the user configured it. Set before the native module asks for any adapter.
if "NODEVICE_SELECT" not in os.environ and "MESA_VK_DEVICE_SELECT" not in os.environ:
    os.environ["NODEVICE_SELECT"] = "1"

from . import _native  # noqa: E402

__all__ = [
    "Sampler", "SampleResult", "VerifyResult", "Head", "StepResult", "load", "Model", "Generation",
    "REQUEST_KEYS", "__version__",
]

__version__: str = _native.__version__
#: The keys a request may hold: the sampling parameters, ``seed``, ``step``,
#: ``prompt``, ``output`` and ``allowed`` (a token mask as a list of words).
REQUEST_KEYS: List[str] = list(_native.REQUEST_KEYS)
_KEYS = frozenset(REQUEST_KEYS)

Params = Union[None, Mapping[str, Any], Sequence[Mapping[str, Any]]]


@dataclass
class SampleResult:
    """The result of :meth:`Sampler.sample`, one entry per row.

    ``tokens``: int64 array, ``-1`` where the row failed. ``seeds``: the seed each row
    used (drawn from the OS when none was given: keep it to reproduce the row).
    ``errors``: ``None`` or ``{"kind", "message"}`` per row (``NonFiniteLogits``,
    ``NoCandidate``, ...). ``logprobs`` and ``kept``: per row, what the row asked for
    (``{"logprob", "rank", "top": [{"token", "logprob"}]}`` and ``{"size", "top":
    [{"id", "p"}]}``), else ``None``.
    """

    tokens: np.ndarray
    seeds: List[int]
    errors: List[Optional[Dict[str, str]]] = field(default_factory=list)
    logprobs: List[Optional[Dict[str, Any]]] = field(default_factory=list)
    kept: List[Optional[Dict[str, Any]]] = field(default_factory=list)


def _per_row(name: str, value: Any, rows: int) -> List[Any]:
    if value is None:
        return [None] * rows
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return [int(value)] * rows
    values = list(value)
    if len(values) != rows:
        raise ValueError(f"{name}: {len(values)} values for {rows} rows")
    return values


def _plain_requests(params: dict, seeds: Any, steps: Any, rows: int) -> tuple:
    """The requests' JSON for one mapping of parameters shared by every row, with each
    row's seed and step (the common call, built as one string)."""
    if not _KEYS.issuperset(params):
        unknown = sorted(set(params) - _KEYS)
        raise ValueError(f"row 0: unknown keys {unknown} (known: {REQUEST_KEYS})")
    body = json.dumps(params)[1:-1]
    if body:
        body += ","
    seed_list = [
        s if s is not None else _native.entropy_seed() for s in _per_row("seeds", seeds, rows)
    ]
    step_list = _per_row("steps", steps, rows)
    parts = []
    for seed, step in zip(seed_list, step_list):
        tail = "" if step is None else ',"step":%d' % int(step)
        parts.append('{%s"seed":%d%s}' % (body, int(seed), tail))
    return "[" + ",".join(parts) + "]", seed_list


def _ids(name: str, row: int, value: Any) -> Optional[List[int]]:
    if value is None:
        return None
    ids = [int(t) for t in np.asarray(value).reshape(-1)]
    if any(t < 0 for t in ids):
        raise ValueError(f"{name} of row {row}: token ids are >= 0")
    return ids


def _requests(rows: int, params: Params, seeds: Any, steps: Any, prompts: Any, outputs: Any,
              masks: Any) -> tuple:
    """The requests' JSON for ``rows`` rows from :meth:`Sampler.sample`'s arguments, and
    each row's seed (drawn from the OS where none was given)."""
    if params is None or isinstance(params, Mapping):
        per_row = [dict(params or {})] * rows
    else:
        per_row = [dict(p) for p in params]
        if len(per_row) != rows:
            raise ValueError(f"params: {len(per_row)} mappings for {rows} rows")
    seed_list = [
        s if s is not None else _native.entropy_seed()
        for s in _per_row("seeds", seeds, rows)
    ]
    step_list = _per_row("steps", steps, rows)
    prompt_list = _per_row("prompts", prompts, rows)
    output_list = _per_row("outputs", outputs, rows)
    if masks is not None and not isinstance(masks, (list, tuple)):
        masks = np.asarray(masks)
        if masks.ndim == 1:
            masks = [masks] * rows
    mask_list = _per_row("masks", masks, rows)
    requests = []
    for r in range(rows):
        req = dict(per_row[r])
        if not _KEYS.issuperset(req):
            unknown = sorted(set(req) - _KEYS)
            raise ValueError(f"row {r}: unknown keys {unknown} (known: {REQUEST_KEYS})")
        req["seed"] = int(seed_list[r])
        if step_list[r] is not None:
            req["step"] = int(step_list[r])
        for key, value in (("prompt", prompt_list[r]), ("output", output_list[r])):
            ids = _ids(key, r, value)
            if ids is not None:
                req[key] = ids
        if mask_list[r] is not None:
            words = np.asarray(mask_list[r]).reshape(-1)
            if words.dtype not in (np.int32, np.uint32):
                raise TypeError(f"masks of row {r}: int32 or uint32 words, not {words.dtype}")
            req["allowed"] = words.astype(np.uint32).tolist()
        requests.append(req)
    return json.dumps(requests), seed_list


class Sampler:
    """A sampler on ``device``: ``"cpu"``, ``"wgpu"`` (a GPU through Vulkan, Metal or
    DX12; software adapters such as lavapipe included) or ``"auto"`` (a hardware GPU
    when there is one, else the CPU). ``threads`` sets the CPU's pool size (default:
    every core)."""

    def __init__(self, device: str = "auto", threads: Optional[int] = None) -> None:
        self._native = _native.Sampler(device, threads)

    @property
    def device(self) -> str:
        """The backend's name: ``cpu`` or ``wgpu:<adapter>``."""
        return self._native.device

    def sample(
        self,
        logits: Any,
        params: Params = None,
        *,
        seeds: Union[None, int, Sequence[int]] = None,
        steps: Union[None, int, Sequence[int]] = None,
        prompts: Optional[Sequence[Any]] = None,
        outputs: Optional[Sequence[Any]] = None,
        masks: Any = None,
    ) -> SampleResult:
        """Draws one token per row of ``logits``.

        ``logits``: a ``[B, V]`` (or ``[V]``) array of float32, float16 or bfloat16:
        numpy, or anything with ``__dlpack__`` on the CPU (torch, MLX, JAX), read in
        place when C-contiguous (other float types are converted to float32). ``params``: one
        mapping for every row or one per row (the keys of :data:`REQUEST_KEYS`).
        ``seeds`` and ``steps``: one int for every row or one per row (a row without a
        seed gets one from the OS, reported in the result). ``prompts`` and
        ``outputs``: per row, the token ids of the history (penalties and DRY).
        ``masks``: a ``[B, ceil(V/32)]`` int32/uint32 array of allowed-token bits
        (xgrammar's layout), or one per row (``None`` for none).

        A whole-call problem (shapes, a parameter out of range: the message names the
        row, the field and the value) raises ``ValueError``; a row's own problem (NaN
        logits, nothing left to draw) is that row's entry in ``errors``.
        """
        x = _logits_2d(logits)
        rows = x.shape[0]
        if (params is None or type(params) is dict) and prompts is None and outputs is None \
                and masks is None:
            # the common call, one mapping for every row and no history: its JSON once
            requests, seed_list = _plain_requests(params or {}, seeds, steps, rows)
            return self._result(x, requests, seed_list, rows)
        requests, seed_list = _requests(rows, params, seeds, steps, prompts, outputs, masks)
        return self._result(x, requests, seed_list, rows)

    def verify(
        self,
        logits: Any,
        drafts: Any,
        params: Params = None,
        *,
        seeds: Union[None, int, Sequence[int]] = None,
        steps: Union[None, int, Sequence[int]] = None,
        prompts: Optional[Sequence[Any]] = None,
        outputs: Optional[Sequence[Any]] = None,
        masks: Any = None,
        rule: str = "coupled",
        draft_logits: Any = None,
        draft_params: Params = None,
    ) -> "VerifyResult":
        """Verifies drafted tokens (speculative decoding; docs/CONTRACT.md).

        ``rule="coupled"`` (the draft sampled with the target's noise): the tokens
        :meth:`sample` would draw position by position, each at step ``step + i`` with the
        history extended by the drafted tokens before it, up to and including the first
        that differs from its drafted token. ``rule="rejection"`` (drafts made elsewhere):
        each drafted token stands with probability min(1, q / p), the first rejection
        draws from max(0, q - p); p is the draft's processed distribution of
        ``draft_logits`` (``[B, K, V]``) under ``draft_params`` (default: ``params``), or
        one-hot without ``draft_logits``. Computed on the host, tokens only.

        ``logits``: the target's ``[B, K + 1, V]`` (or ``[K + 1, V]``) logits, each row's
        K + 1 positions. ``drafts``: ``[B, K]`` (or ``[K]``) drafted ids. The other
        arguments are :meth:`sample`'s, per row, for the first drafted position (a mask
        applies at every position).
        """
        if rule not in ("coupled", "rejection"):
            raise ValueError(f'rule must be "coupled" or "rejection", not {rule!r}')
        if rule == "coupled" and (draft_logits is not None or draft_params is not None):
            raise ValueError('draft_logits and draft_params go with rule="rejection"')
        flat, d = _drafted(logits, drafts)
        rows, vocab = d.shape[0], flat.shape[1]
        requests, seed_list = _requests(rows, params, seeds, steps, prompts, outputs, masks)
        ids = d.astype(np.int64).tolist()
        if rule == "coupled":
            accepted, tokens, extras = self._native.verify(flat, requests, ids)
        else:
            dl, dp = None, None
            if draft_logits is not None:
                dl = np.ascontiguousarray(np.asarray(_host_array(draft_logits), dtype=np.float32))
                if dl.ndim == 2:
                    dl = dl.reshape((1,) + dl.shape)
                if dl.shape != (rows, d.shape[1], vocab):
                    raise ValueError(
                        f"draft_logits of shape {list(dl.shape)}: the drafts need "
                        f"{[rows, int(d.shape[1]), vocab]}"
                    )
                dl = dl.reshape(rows * d.shape[1], vocab)
                per = draft_params if draft_params is not None else params
                if per is None or isinstance(per, Mapping):
                    per = [dict(per or {})] * rows
                dp = json.dumps([dict(p) for p in per])
            accepted, tokens, extras = self._native.verify_rejection(flat, requests, ids, dl, dp)
        result = VerifyResult(
            accepted=np.asarray(accepted, dtype=np.int64),
            tokens=[list(t) for t in tokens],
            seeds=[int(s) for s in seed_list],
            drafted=int(d.shape[1]),
        )
        for e in json.loads(extras):
            result.errors.append(e.get("error"))
            result.logprobs.append(e.get("logprobs"))
        return result

    def _result(self, x: np.ndarray, requests: str, seed_list: List[Any], rows: int) -> SampleResult:
        tokens, extras = self._native.sample(x, requests)
        result = SampleResult(tokens=tokens, seeds=[int(s) for s in seed_list])
        rows_extra = json.loads(extras) if extras is not None else [None] * rows
        for e in rows_extra:
            e = e or {}
            result.errors.append(e.get("error"))
            result.logprobs.append(e.get("logprobs"))
            result.kept.append(e.get("kept"))
        return result


@dataclass
class VerifyResult:
    """The result of :meth:`Sampler.verify` and :meth:`Head.verify`, one entry per row:
    ``accepted`` (int64, how many drafted tokens stand), ``tokens`` (the tokens the row
    emits: the accepted ones, then the target's own draw, unless ``errors`` holds the
    row error that stopped it or a stop ended the slot), ``seeds`` (the sampler's),
    ``errors`` and ``logprobs`` (per emitted token, when asked)."""

    accepted: np.ndarray
    tokens: List[List[int]]
    seeds: List[int]
    drafted: int
    errors: List[Optional[Dict[str, str]]] = field(default_factory=list)
    logprobs: List[Optional[List[Any]]] = field(default_factory=list)
    #: :meth:`Head.verify`: each slot's finish (``"stop"``, ``"length"`` or ``None``)
    finished: List[Optional[str]] = field(default_factory=list)

    @property
    def acceptance(self) -> float:
        """Accepted drafted tokens over drafted ones."""
        total = self.drafted * len(self.tokens)
        return float(self.accepted.sum()) / total if total else 0.0


@dataclass
class StepResult:
    """The result of :meth:`Head.step`, one entry per row (row ``r`` is slot
    ``slots[r]``): ``tokens`` (int64, ``-1`` where no token was drawn), ``finished``
    (``"stop"``, ``"length"`` or ``None``: the slot is done from this step on),
    ``errors``, ``logprobs`` and ``kept`` as in :class:`SampleResult`."""

    slots: List[int]
    tokens: np.ndarray
    finished: List[Optional[str]]
    errors: List[Optional[Dict[str, str]]] = field(default_factory=list)
    logprobs: List[Optional[Dict[str, Any]]] = field(default_factory=list)
    kept: List[Optional[Dict[str, Any]]] = field(default_factory=list)


def _is_bf16(obj: Any) -> bool:
    return "bfloat16" in str(getattr(obj, "dtype", ""))


def _host_array(logits: Any) -> np.ndarray:
    """A numpy view of ``logits`` without a copy where the layout allows: numpy arrays
    as they are; anything with ``__dlpack__`` on the CPU (torch CPU tensors, MLX and JAX
    arrays) through DLPack; bfloat16 as its bits (uint16), viewed by the array's own
    library first since DLPack has no bfloat16 for numpy."""
    if isinstance(logits, np.ndarray):
        if logits.dtype.char not in "fdeH" and logits.dtype.name == "bfloat16":
            return logits.view(np.uint16)  # ml_dtypes' bfloat16 (JAX's numpy arrays)
        return logits
    if _is_bf16(logits) and hasattr(logits, "view"):
        for bits in ("uint16", "int16"):
            try:
                module = type(logits).__module__.split(".")[0]
                lib = __import__(module)
                dt = getattr(lib, bits, None) or getattr(getattr(lib, "core", lib), bits)
                return np.from_dlpack(logits.view(dt)).view(np.uint16)
            except Exception:  # noqa: BLE001 - try the next spelling, then convert
                continue
    if hasattr(logits, "__dlpack__"):
        try:
            return np.from_dlpack(logits)
        except (TypeError, BufferError, RuntimeError, ValueError):
            pass
    return np.asarray(logits)


def _logits_2d(logits: Any) -> np.ndarray:
    # the common case first, in attribute reads only: a C-contiguous [B, V] float32 or
    # float16 numpy array goes through as it is
    if (
        type(logits) is np.ndarray
        and logits.ndim == 2
        and logits.dtype.char in "fe"
        and logits.flags.c_contiguous
    ):
        return logits
    x = _host_array(logits)
    if x.ndim == 1:
        x = x.reshape(1, -1)
    if x.ndim != 2:
        raise ValueError(f"logits must have shape [V] or [B, V], not {list(x.shape)}")
    if x.dtype not in (np.float32, np.float16, np.uint16):
        if not np.issubdtype(x.dtype, np.floating):
            raise TypeError(f"logits must be floating point, not {x.dtype}")
        x = x.astype(np.float32)
    return np.ascontiguousarray(x)


def _drafted(logits: Any, drafts: Any) -> tuple:
    """A verification's inputs: the target's ``[B, K + 1, V]`` (or ``[K + 1, V]``)
    logits as ``[B (K + 1), V]`` rows, and the ``[B, K]`` (or ``[K]``) drafted ids."""
    x = _host_array(logits)
    if x.ndim == 2:
        x = x.reshape((1,) + x.shape)
    d = np.asarray(drafts)
    if d.ndim == 1:
        d = d.reshape(1, -1)
    if x.ndim != 3 or d.ndim != 2 or d.shape[0] != x.shape[0] or d.shape[1] + 1 != x.shape[1]:
        raise ValueError(
            f"drafts of shape {list(d.shape)} for logits of shape {list(x.shape)}: "
            "the logits need [B, K + 1, V] for drafts of [B, K]"
        )
    if not np.issubdtype(d.dtype, np.integer) or (d < 0).any():
        raise ValueError("drafts: token ids, integers >= 0")
    return _logits_2d(x.reshape(x.shape[0] * x.shape[1], x.shape[2])), d


class Head:
    """A sampling head: ``slots`` slots of decode state over a vocabulary of ``vocab``
    tokens, on ``device`` (``"cpu"``, ``"wgpu"`` or ``"auto"``). Each slot holds a
    sequence's parameters, seed, step, history, stop ids, ``max_tokens`` and fixed
    token mask; :meth:`step` draws a token for each given slot and advances it, so a
    decode loop passes only the logits (on a GPU the state stays on the device).
    The device head runs every stage and ``kept``, but DRY only over windows of up to
    4,096 tokens (``dry_penalty_last_n <= 4096``, or ``-1`` with ``max_tokens`` keeping
    the history within it): a longer window is a ``ValueError``; the CPU head takes any."""

    def __init__(self, slots: int, vocab: int, device: str = "auto") -> None:
        self._native = _native.Head(slots, vocab, device)

    @property
    def device(self) -> str:
        """The head's name: ``cpu`` or ``wgpu:<adapter>``."""
        return self._native.device

    @property
    def slots(self) -> int:
        """The number of slots."""
        return self._native.shape[0]

    @property
    def vocab(self) -> int:
        """The vocabulary size."""
        return self._native.shape[1]

    def join(
        self,
        slot: int,
        params: Optional[Mapping[str, Any]] = None,
        *,
        seed: Optional[int] = None,
        step: int = 0,
        prompt: Any = None,
        output: Any = None,
        max_tokens: Optional[int] = None,
        stop: Optional[Sequence[int]] = None,
        mask: Any = None,
    ) -> int:
        """Puts a sequence in the free ``slot``; returns its seed (drawn from the OS
        when ``seed`` is None). ``prompt`` and ``output``: its history; ``stop``: ids
        that end it (drawn, they are part of its output); ``mask``: a fixed
        allowed-token mask (``ceil(V/32)`` int32/uint32 words) at every step."""
        req = dict(params or {})
        unknown = sorted(set(req) - _KEYS)
        if unknown:
            raise ValueError(f"slot {slot}: unknown keys {unknown} (known: {REQUEST_KEYS})")
        if seed is not None:
            req["seed"] = int(seed)
        req["step"] = int(step)
        for key, value in (("prompt", prompt), ("output", output)):
            ids = _ids(key, slot, value)
            if ids is not None:
                req[key] = ids
        if mask is not None:
            words = np.asarray(mask).reshape(-1)
            if words.dtype not in (np.int32, np.uint32):
                raise TypeError(f"mask: int32 or uint32 words, not {words.dtype}")
            req["allowed"] = words.astype(np.uint32).tolist()
        stops = None if stop is None else [int(t) for t in stop]
        return self._native.join(int(slot), json.dumps(req), max_tokens, stops)

    def leave(self, slot: int) -> None:
        """Frees ``slot``."""
        self._native.leave(int(slot))

    def set_params(self, slot: int, params: Mapping[str, Any]) -> None:
        """Replaces a joined slot's sampling parameters; its seed, step and history stay."""
        self._native.set_params(int(slot), json.dumps(dict(params)))

    def step(
        self, logits: Any, slots: Optional[Sequence[int]] = None, masks: Any = None
    ) -> StepResult:
        """Draws row ``r`` of ``logits`` for slot ``slots[r]`` (default: row ``r`` for
        slot ``r``) and advances each slot. ``masks``: per row, allowed-token words for
        this step only (a ``[B, ceil(V/32)]`` array, or a list with ``None`` for
        unmasked rows)."""
        x = _logits_2d(logits)
        rows = list(range(x.shape[0])) if slots is None else [int(s) for s in slots]
        m = None
        if masks is not None:
            w = (x.shape[1] + 31) // 32
            if isinstance(masks, (list, tuple)):
                m = np.stack([
                    np.full(w, 0xFFFFFFFF, dtype=np.uint32) if k is None
                    else np.asarray(k).reshape(-1).astype(np.uint32)
                    for k in masks
                ])
            else:
                m = np.asarray(masks)
                if m.dtype not in (np.int32, np.uint32):
                    raise TypeError(f"masks: int32 or uint32 words, not {m.dtype}")
                m = m.astype(np.uint32).reshape(x.shape[0], -1)
            m = np.ascontiguousarray(m)
        tokens, finished, extras = self._native.step(x, rows, m)
        out = StepResult(slots=rows, tokens=tokens, finished=list(finished))
        for e in (json.loads(extras) if extras is not None else [None] * len(rows)):
            e = e or {}
            out.errors.append(e.get("error"))
            out.logprobs.append(e.get("logprobs"))
            out.kept.append(e.get("kept"))
        return out

    def verify(self, logits: Any, drafts: Any, slots: Optional[Sequence[int]] = None) -> "VerifyResult":
        """The verify step of speculative decoding: slot ``slots[r]`` (default ``r``)
        drafted ``drafts[r]``; ``logits`` is ``[B, K + 1, V]``, each row's K + 1
        positions. Each slot advances by the tokens plain steps would give it, up to and
        including the first that differs from its drafted token (a stop id or
        ``max_tokens`` ends it where a step would); ``finished`` says which did."""
        flat, d = _drafted(logits, drafts)
        rows = list(range(d.shape[0])) if slots is None else [int(s) for s in slots]
        accepted, tokens, finished, extras = self._native.verify(
            flat, rows, d.astype(np.int64).tolist()
        )
        out = VerifyResult(
            accepted=np.asarray(accepted, dtype=np.int64),
            tokens=[list(t) for t in tokens],
            seeds=[],
            drafted=int(d.shape[1]),
            finished=list(finished),
        )
        for e in json.loads(extras):
            out.errors.append(e.get("error"))
            out.logprobs.append(e.get("logprobs"))
        return out


class Generation:
    """The tokens of :meth:`Model.generate` as they are drawn: iterating yields
    ``(sequence, token_id)`` pairs. Once exhausted, ``report`` holds the run
    (``outputs`` per sequence: ``tokens``, ``finish``; ``prefill_ms``, ``decode_tok_s``,
    ``device``...) and ``texts`` each sequence's text (with a tokenizer; cut right
    before a stop string, whose tokens are then dropped from ``report``)."""

    def __init__(self, native: Any, model: "Model", stop_str: Sequence[str]) -> None:
        self._native = native
        self._model = model
        self._stop_str = list(stop_str)
        self.report: Optional[Dict[str, Any]] = None
        self.texts: List[Optional[str]] = []

    def __iter__(self) -> "Generation":
        return self

    def __next__(self) -> tuple:
        try:
            return self._native.__next__()
        except StopIteration:
            if self.report is None and self._native.report is not None:
                self._finish(json.loads(self._native.report))
            raise

    def _finish(self, report: Dict[str, Any]) -> None:
        for out in report["outputs"]:
            text = None
            if self._model.has_tokenizer:
                text = self._model.decode(out["tokens"])
                cuts = [text.find(s) for s in self._stop_str if s in text]
                if cuts:
                    at = min(cuts)
                    before = text[:at]
                    n = 0
                    while n < len(out["tokens"]) and before.startswith(
                        self._model.decode(out["tokens"][: n + 1])
                    ):
                        n += 1
                    out["tokens"] = out["tokens"][:n]
                    out["finish"] = "stop"
                    text = before
            self.texts.append(text)
        self.report = report

    def collect(self) -> Dict[str, Any]:
        """Runs the generation to its end and returns the report."""
        for _ in self:
            pass
        assert self.report is not None
        return self.report


class Model:
    """A Qwen3-MoE checkpoint loaded by :func:`load`."""

    def __init__(self, native: Any) -> None:
        self._native = native
        try:
            native.encode("")
            self.has_tokenizer = True
        except ValueError:
            self.has_tokenizer = False

    @property
    def vocab_size(self) -> int:
        """The vocabulary size."""
        return self._native.vocab_size

    def encode(self, text: str) -> List[int]:
        """Token ids of ``text`` (needs ``tokenizer.json``)."""
        return list(self._native.encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` (needs ``tokenizer.json``)."""
        return self._native.decode([int(t) for t in ids])

    def generate(
        self,
        prompt: Union[None, str, Sequence[int]] = None,
        *,
        prompts: Optional[Sequence[Union[str, Sequence[int]]]] = None,
        max_tokens: int = 32,
        params: Optional[Mapping[str, Any]] = None,
        seed: Optional[int] = None,
        stop: Optional[Sequence[int]] = None,
        stop_str: Optional[Sequence[str]] = None,
        n: int = 1,
        grammar_mask: Any = None,
        draft: Optional["Model"] = None,
        speculate: int = 4,
    ) -> Generation:
        """Generates from ``prompt`` (text through the tokenizer, or token ids) or from
        several ``prompts``, as ``decoda generate`` does: ``max_tokens`` per sequence,
        the sampling ``params`` (the keys of :data:`REQUEST_KEYS`), ``seed`` (sequence
        ``i`` draws with ``seed + i``; from the OS when None), ``stop`` ids,
        ``stop_str`` strings, ``n`` sequences of the one prompt (prefilled once) and a
        fixed ``grammar_mask``. Returns an iterator of ``(sequence, token)`` pairs.

        With ``draft`` (another loaded checkpoint of the same vocabulary), speculative
        decoding: the draft proposes ``speculate`` tokens a round with the same seeds
        and parameters and this model verifies them in one forward; the tokens are those
        of plain decoding, and the report adds ``acceptance``, ``drafted`` and
        ``accepted``."""
        if (prompt is None) == (prompts is None):
            raise ValueError("give prompt or prompts")
        if n < 1:
            raise ValueError(f"n = {n}: at least 1")
        items = [prompt] if prompts is None else list(prompts)
        if n > 1:
            if len(items) != 1:
                raise ValueError("n takes one prompt, not prompts")
            items = items * n
        p = dict(params or {})
        unknown = sorted(set(p) - _KEYS)
        if unknown:
            raise ValueError(f"unknown keys {unknown} (known: {REQUEST_KEYS})")
        base_seed = seed if seed is not None else _native.entropy_seed()
        seqs = []
        for i, item in enumerate(items):
            ids = self.encode(item) if isinstance(item, str) else [int(t) for t in item]
            req = dict(p, seed=int(base_seed) + i)
            if grammar_mask is not None:
                req["allowed"] = np.asarray(grammar_mask).reshape(-1).astype(np.uint32).tolist()
            seqs.append({
                "prompt_ids": ids,
                "request": req,
                "max_tokens": int(max_tokens),
                "stop": [int(t) for t in (stop or [])],
            })
        stops = list(stop_str or [])
        native_draft = None if draft is None else draft._native
        return Generation(
            self._native.generate(json.dumps(seqs), stops, native_draft, int(speculate)),
            self,
            stops,
        )


def load(model_dir: Union[str, "os.PathLike[str]"], device: str = "auto", sort_cutoff: int = 16) -> Model:
    """Loads a Qwen3-MoE checkpoint (``config.json``, ``*.safetensors``, and
    ``tokenizer.json`` for text) for ``device`` (``"cpu"``, ``"wgpu"`` or ``"auto"``):
    the checkpoints ``decoda generate`` loads, MLX's quantized ones included."""
    return Model(_native.Model(str(model_dir), device, sort_cutoff))
