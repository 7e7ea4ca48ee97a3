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
