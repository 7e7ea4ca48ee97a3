"""Type stubs of decoda's native module (wrapped by the ``decoda`` package)."""

from typing import List, Optional, Tuple

import numpy as np

__version__: str
REQUEST_KEYS: List[str]

def entropy_seed() -> int:
    """A fresh seed from the operating system's entropy."""

class Sampler:
    """A sampler on one device (``cpu``, ``wgpu`` or ``auto``)."""

    def __init__(self, device: str = "auto", threads: Optional[int] = None) -> None: ...
    @property
    def device(self) -> str:
        """The backend's name."""
    def sample(self, logits: np.ndarray, requests: str) -> Tuple[np.ndarray, Optional[str]]:
        """Tokens (int64, -1 for a failed row) and per-row extras as JSON (or None)."""
    def verify(
        self, logits: np.ndarray, requests: str, drafts: List[List[int]]
    ) -> Tuple[List[int], List[List[int]], str]:
        """Accepted counts, emitted tokens and per-row extras (JSON) of a coupled verification."""
    def verify_rejection(
        self,
        logits: np.ndarray,
        requests: str,
        drafts: List[List[int]],
        draft_logits: Optional[np.ndarray] = None,
        draft_params: Optional[str] = None,
    ) -> Tuple[List[int], List[List[int]], str]:
        """Accepted counts, emitted tokens and per-row extras of a rejection verification."""
    def _time_rust(self, logits: np.ndarray, requests: str, iters: int) -> List[float]:
        """For benchmarks: microseconds of each of `iters` Rust calls."""

class Head:
    """A sampling head (slots of decode state) on one device."""

    def __init__(self, slots: int, vocab: int, device: str = "auto") -> None: ...
    @property
    def device(self) -> str:
        """The head's name."""
    @property
    def shape(self) -> Tuple[int, int]:
        """Slots and vocabulary size."""
    def join(
        self, slot: int, request: str, max_tokens: Optional[int] = None, stop: Optional[List[int]] = None
    ) -> int:
        """Joins a slot with a JSON request; returns its seed."""
    def leave(self, slot: int) -> None:
        """Frees a slot."""
    def set_params(self, slot: int, params: str) -> None:
        """Replaces a slot's parameters (JSON)."""
    def step(
        self, logits: np.ndarray, rows: List[int], masks: Optional[np.ndarray] = None
    ) -> Tuple[np.ndarray, List[Optional[str]], Optional[str]]:
        """Tokens, finishes and per-row extras (JSON or None)."""
    def verify(
        self, logits: np.ndarray, rows: List[int], drafts: List[List[int]]
    ) -> Tuple[List[int], List[List[int]], List[Optional[str]], str]:
        """Accepted counts, emitted tokens, finishes and per-row extras of a verify step."""

class Generation:
    """An iterator of (sequence, token) pairs; ``report`` (JSON) once exhausted."""

    def __iter__(self) -> "Generation": ...
    def __next__(self) -> Tuple[int, int]: ...
    @property
    def report(self) -> Optional[str]:
        """The run's report as JSON, once the iterator is exhausted."""

class Model:
    """A loaded Qwen3-MoE checkpoint."""

    def __init__(self, model_dir: str, device: str = "auto", sort_cutoff: int = 16) -> None: ...
    @property
    def vocab_size(self) -> int:
        """The vocabulary size."""
    def encode(self, text: str) -> List[int]:
        """Token ids of a text."""
    def decode(self, ids: List[int]) -> str:
        """The text of token ids."""
    def generate(
        self,
        sequences: str,
        stop_strings: List[str],
        draft: Optional["Model"] = None,
        speculate: int = 4,
    ) -> Generation:
        """Starts a generation (sequences as JSON); with ``draft``, speculative decoding
        with ``speculate`` drafted tokens a round."""

class ShardCall:
    """One rank's shard of a vocabulary-sharded call (``decoda.distributed``)."""

    def __init__(self, logits: np.ndarray, requests: str, offset: int, vocab: int) -> None: ...
    def round1(self) -> str: ...
    def round2(self, gathered: List[str]) -> str: ...
    def round3(self, gathered: List[str]) -> Optional[str]: ...
    def finish(self, gathered: List[str]) -> Tuple[np.ndarray, Optional[str]]: ...
