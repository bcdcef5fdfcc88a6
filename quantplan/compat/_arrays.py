"""Where a :mod:`quantplan.compat.deepspeed` call runs: :class:`quantplan._frontend.Target`, as
DeepSpeed's functions take arrays.

NumPy arrays and PyTorch CPU tensors run on the reference backend (the tensors reach the plans as
zero-copy NumPy views: :meth:`~quantplan._frontend.Target.arg`; outputs are PyTorch CPU tensors);
CuPy arrays and PyTorch CUDA tensors run on the CUDA backend, on the current stream of their
library (CuPy's current stream, or ``torch.cuda.current_stream(device)``), and outputs are
allocated by the same library on the same device. Arguments of one call come from one library
and one device (InvalidProblem otherwise). Plans are kept in the front-ends' one plan cache.
"""

from __future__ import annotations

from typing import Any

from quantplan._frontend import PLAN_CACHE_SIZE, DeviceStream, Target, clear_plan_cache, dtype_name


def target(array: Any, *more: Any, names: tuple[str, ...] = ()) -> Target:
    """The target of a call whose array arguments are ``array`` and ``more`` (None entries of
    ``more`` skipped; ``names`` name them in errors)."""
    return Target.of(array, *more, names=names)


__all__ = ["PLAN_CACHE_SIZE", "DeviceStream", "Target", "clear_plan_cache", "dtype_name", "target"]
