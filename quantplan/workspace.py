"""Scratch memory a plan may need (``plan.workspace_size()`` bytes)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._device import cuda_available
from .errors import WorkspaceTooSmall


class Workspace:
    """A byte buffer handed to ``plan.run``: device memory (CuPy) on a GPU, a NumPy array otherwise.

    **When to use:** allocate once per plan (``Workspace.allocate(plan.workspace_size())``) and
    reuse it across runs; ``allocate(0)`` returns None, which every ``run`` accepts.
    """

    __slots__ = ("buffer", "nbytes")

    def __init__(self, buffer: Any, nbytes: int) -> None:
        self.buffer = buffer
        self.nbytes = int(nbytes)

    @classmethod
    def allocate(cls, nbytes: int, device: bool | None = None) -> Workspace | None:
        """``nbytes`` of scratch (None when 0). ``device``: None allocates on the GPU when one is present."""
        if nbytes < 0:
            raise ValueError(f"workspace size must be >= 0, got {nbytes}")
        if nbytes == 0:
            return None
        on_device = cuda_available() if device is None else device
        if on_device:
            import cupy

            return cls(cupy.empty(nbytes, dtype=cupy.uint8), nbytes)
        return cls(np.empty(nbytes, dtype=np.uint8), nbytes)

    @property
    def ptr(self) -> int:
        """Device pointer (0 for host buffers)."""
        data = getattr(self.buffer, "data", None)
        return int(data.ptr) if data is not None and hasattr(data, "ptr") else 0


def check_workspace(workspace: Workspace | None, required: int) -> None:
    """Raise WorkspaceTooSmall unless ``workspace`` holds ``required`` bytes."""
    have = 0 if workspace is None else workspace.nbytes
    if have < required:
        raise WorkspaceTooSmall(
            f"workspace of {have} bytes is smaller than the {required} bytes this plan needs; "
            f"allocate it with Workspace.allocate(plan.workspace_size())"
        )


__all__ = ["Workspace", "check_workspace"]
