"""Where a :mod:`quantplan.compat.deepspeed` call runs, chosen from its array arguments.

NumPy arrays run on the reference backend; CuPy arrays and PyTorch CUDA tensors run on the CUDA
backend, on the current stream of their library (CuPy's current stream, or
``torch.cuda.current_stream(device)``), and outputs are allocated by the same library on the same
device. Arguments of one call come from one library and one device (InvalidProblem otherwise).
Plans are selected once per (plan class, descriptor, device) and kept in a small cache.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._operands import operand
from ..errors import InvalidProblem, Unsupported
from ..types import BackendKind, PlanPreference
from ..workspace import Workspace

_REFERENCE = PlanPreference(backend=BackendKind.REFERENCE)
_CUDA = PlanPreference(backend=BackendKind.CUDA)
#: Plans kept per process (selection compiles or loads kernels and prepares launches).
PLAN_CACHE_SIZE = 128
_PLANS: OrderedDict[tuple[Any, ...], Any] = OrderedDict()


def _library(a: Any) -> str:
    if isinstance(a, np.ndarray):
        return "numpy"
    module = type(a).__module__
    if module.startswith("cupy"):
        return "cupy"
    if module.startswith("torch"):
        return "torch"
    raise InvalidProblem(f"expected a NumPy array, a CuPy array or a PyTorch CUDA tensor, got {type(a).__name__}")


class _TorchWorkspace(Workspace):
    """A :class:`~quantplan.Workspace` over a PyTorch uint8 CUDA tensor."""

    __slots__ = ()

    @property
    def ptr(self) -> int:
        return int(self.buffer.data_ptr())


@dataclass(frozen=True)
class DeviceStream:
    """A raw ``cudaStream_t`` and the device it belongs to, in the form the plans read
    (``cuda_stream`` for the handle, ``device_id`` for ``select``)."""

    cuda_stream: int
    device_id: int


@dataclass(frozen=True)
class ArrayTarget:
    """The library (``numpy`` / ``cupy`` / ``torch``), device and stream of one call."""

    library: str
    device: int | None
    stream: Any
    torch_device: Any = None

    @classmethod
    def of(cls, *arrays: Any) -> ArrayTarget:
        """The target of a call whose array arguments are ``arrays`` (None entries skipped)."""
        present = [a for a in arrays if a is not None]
        libraries = {_library(a) for a in present}
        if len(libraries) != 1:
            raise InvalidProblem(
                f"the arrays of one call must come from one library, got {sorted(libraries)}; "
                f"move them all to NumPy (reference) or all to the GPU (CuPy or PyTorch CUDA)"
            )
        library = libraries.pop()
        if library == "numpy":
            return cls("numpy", None, None)
        found = [operand(a, "array").device_id for a in present]
        devices = {d for d in found if d is not None}
        if len(devices) != len(set(found)):
            raise Unsupported(
                "PyTorch CPU tensors are not served: pass CUDA tensors (CUDA backend) or NumPy arrays "
                "(reference backend, .numpy())"
            )
        if len(devices) != 1:
            raise InvalidProblem(f"the arrays of one call must live on one device, got devices {sorted(devices)}")
        device = devices.pop()
        if library == "torch":
            import torch

            torch_device = torch.device("cuda", device)
            return cls("torch", device, torch.cuda.current_stream(torch_device), torch_device)
        import cupy

        # The current stream of the array's device with its device id (CuPy's null stream reports
        # none, and the plans pick their device from the stream).
        with cupy.cuda.Device(device):
            handle = int(cupy.cuda.get_current_stream().ptr)
        return cls("cupy", device, DeviceStream(handle, device))

    @property
    def preference(self) -> PlanPreference:
        """REFERENCE for NumPy, CUDA otherwise."""
        return _REFERENCE if self.device is None else _CUDA

    def plan(self, plan_cls: Any, desc: Any) -> Any:
        """``plan_cls.select`` for ``desc`` on this target, from the cache when selected before."""
        key = (plan_cls, desc, self.device)
        found = _PLANS.get(key)
        if found is not None:
            _PLANS.move_to_end(key)
            return found
        chosen = plan_cls.select(self.stream, desc, self.preference)
        _PLANS[key] = chosen
        if len(_PLANS) > PLAN_CACHE_SIZE:
            _PLANS.popitem(last=False)
        return chosen

    def run(self, plan: Any, args: Any) -> None:
        """``plan.run`` on this target's stream, with a workspace of ``plan.workspace_size()`` bytes."""
        plan.run(self.stream, self.workspace(int(plan.workspace_size())), args)

    def workspace(self, nbytes: int) -> Workspace | None:
        """Scratch of ``nbytes`` on this target (None when 0), stream-ordered by its library's allocator."""
        if nbytes == 0:
            return None
        if self.library == "numpy":
            return Workspace.allocate(nbytes, device=False)
        return (
            Workspace(self.empty((nbytes,), "uint8"), nbytes)
            if self.library == "cupy"
            else _TorchWorkspace(self.empty((nbytes,), "uint8"), nbytes)
        )

    def empty(self, shape: tuple[int, ...], dtype: str) -> Any:
        """An uninitialized array of ``shape`` and ``dtype`` (a NumPy dtype name) on this target."""
        if self.library == "numpy":
            return np.empty(shape, dtype)
        if self.library == "torch":
            import torch

            return torch.empty(shape, dtype=getattr(torch, dtype), device=self.torch_device)
        import cupy

        with cupy.cuda.Device(self.device):
            return cupy.empty(shape, dtype)

    def contiguous(self, a: Any) -> Any:
        """``a`` itself when C-contiguous, else a contiguous copy (same library and device)."""
        if self.library == "numpy":
            return np.ascontiguousarray(a)
        if self.library == "torch":
            return a.detach() if a.is_contiguous() else a.detach().contiguous()
        import cupy

        return cupy.ascontiguousarray(a)

    def is_contiguous(self, a: Any) -> bool:
        """Whether ``a`` is C-contiguous."""
        return bool(a.is_contiguous()) if self.library == "torch" else bool(a.flags.c_contiguous)

    def view(self, a: Any, dtype: str) -> Any:
        """``a`` reinterpreted as ``dtype`` (same itemsize), no copy."""
        if self.library == "torch":
            import torch

            return a.view(getattr(torch, dtype))
        return a.view(dtype)

    def copy_into(self, dst: Any, src: Any) -> None:
        """``dst[...] = src`` (same shape, same library)."""
        if self.library == "torch":
            dst.copy_(src)
        else:
            dst[...] = src


def dtype_name(a: Any, name: str) -> str:
    """The element type of ``a`` as a NumPy-style name (``float16``, ``bfloat16``, ``int8``, ...)."""
    return operand(a, name).dtype_name


def clear_plan_cache() -> None:
    """Drop every cached plan (their kernels stay loaded)."""
    _PLANS.clear()


__all__ = ["PLAN_CACHE_SIZE", "ArrayTarget", "DeviceStream", "clear_plan_cache", "dtype_name"]
