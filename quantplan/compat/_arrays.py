"""Where a :mod:`quantplan.compat.deepspeed` call runs: :class:`quantplan._frontend.Target`, as
DeepSpeed's functions take arrays.

NumPy arrays run on the reference backend; CuPy arrays and PyTorch CUDA tensors run on the CUDA
backend, on the current stream of their library (CuPy's current stream, or
``torch.cuda.current_stream(device)``), and outputs are allocated by the same library on the same
device. Arguments of one call come from one library and one device (InvalidProblem otherwise);
PyTorch CPU tensors are refused (Unsupported: DeepSpeed's binding takes CUDA tensors; NumPy
arrays run on the reference backend). Plans are kept in the front-ends' one plan cache.
"""

from __future__ import annotations

from typing import Any

from .._frontend import PLAN_CACHE_SIZE, TORCH, DeviceStream, Target, clear_plan_cache, dtype_name
from ..errors import Unsupported


def target(array: Any, *more: Any, names: tuple[str, ...] = ()) -> Target:
    """The target of a call whose array arguments are ``array`` and ``more`` (None entries of
    ``more`` skipped; ``names`` name them in errors)."""
    found = Target.of(array, *more, names=names)
    if found.library == TORCH and not found.cuda:
        raise Unsupported(
            "PyTorch CPU tensors are not served: pass CUDA tensors (CUDA backend) or NumPy arrays "
            "(reference backend, .numpy())"
        )
    return found


__all__ = ["PLAN_CACHE_SIZE", "DeviceStream", "Target", "clear_plan_cache", "dtype_name", "target"]
