"""Scratch memory a plan may need (``plan.workspace_size()`` bytes)."""

from __future__ import annotations

from typing import Any

import numpy as np

from quantplan.runtime._cuda import cuda_available
from quantplan.vocabulary.errors import InvalidArgumentType, InvalidProblem, WorkspaceTooSmall


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
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)):
            raise InvalidArgumentType(
                f"workspace nbytes must be an integer, got {type(nbytes).__name__} {nbytes!r}; "
                f"pass plan.workspace_size()"
            )
        if nbytes < 0:
            raise InvalidProblem(f"workspace nbytes must be >= 0, got {nbytes}; pass plan.workspace_size()")
        nbytes = int(nbytes)
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


def check_workspace(workspace: Workspace | None, required: int, on_device: bool = False) -> None:
    """Raise unless ``workspace`` is None or a :class:`Workspace` (InvalidArgumentType) holding
    ``required`` bytes (WorkspaceTooSmall), in device memory when ``on_device`` and bytes are needed
    (InvalidProblem)."""
    if workspace is None:
        have = 0
    elif not isinstance(workspace, Workspace):
        raise InvalidArgumentType(
            f"workspace must be None or a quantplan.Workspace, got {type(workspace).__name__}; "
            f"allocate it with Workspace.allocate(plan.workspace_size())"
        )
    else:
        have = workspace.nbytes
    if have < required:
        raise WorkspaceTooSmall(
            f"workspace of {have} bytes is smaller than the {required} bytes this plan needs; "
            f"allocate it with Workspace.allocate(plan.workspace_size())"
        )
    if on_device and required and isinstance(workspace.buffer, np.ndarray):  # type: ignore[union-attr]
        raise InvalidProblem(
            "workspace lives in host memory, but this plan runs on a GPU; allocate it with "
            "Workspace.allocate(plan.workspace_size(), device=True)"
        )


__all__ = ["Workspace", "check_workspace"]
