"""Prepared kernel launches: everything but the per-call pointers is fixed at ``select``.

A :class:`PreparedLaunch` holds a loaded kernel, its grid, and a ctypes structure with one field
per kernel parameter; ``kernelParams`` (the array of pointers to those fields) is built once.
``run`` writes the fields that change per call (data pointers, scalar parameters) and calls
``cuLaunchKernel`` directly through ``cupy.cuda.driver.launchKernel``: no per-call argument
conversion, so the host cost of a launch is a few attribute stores and one driver call.

Plans are therefore not safe to ``run`` from several host threads at once (the argument block
is shared); use one plan per thread.
"""

from __future__ import annotations

import ctypes
from typing import Any

from .errors import InvalidProblem


class PreparedLaunch:
    """One kernel launch with its argument block.

    ``params_type``: a ``ctypes.Structure`` whose fields are the kernel's parameters in order
    (each field's C layout must equal the kernel parameter's). ``fixed``: field values set once.
    """

    __slots__ = ("_driver_launch", "_function", "_keep", "_kernel_params", "block", "function_ptr", "grid", "params")

    def __init__(self, function: Any, grid: int, block: int, params_type: type[ctypes.Structure], **fixed: Any) -> None:
        from cupy.cuda import driver

        self._driver_launch = driver.launchKernel
        self._function = function  # keeps the module (and so the CUfunction) alive
        self.function_ptr = int(function.ptr)
        self.grid = int(grid)
        self.block = int(block)
        self.params = params_type(**fixed)
        base = ctypes.addressof(self.params)
        names = [field[0] for field in params_type._fields_]  # type: ignore[attr-defined]
        pointers = (ctypes.c_void_p * len(names))(*(base + getattr(params_type, n).offset for n in names))
        self._keep = pointers
        self._kernel_params = ctypes.addressof(pointers)

    def launch(self, stream_handle: int) -> None:
        """Enqueue the kernel with the current field values on ``stream_handle``."""
        self._driver_launch(
            self.function_ptr, self.grid, 1, 1, self.block, 1, 1, 0, stream_handle, self._kernel_params, 0
        )


def launch_on(device_id: int, handle: int, *launches: PreparedLaunch) -> None:
    """Enqueue ``launches`` in order on ``handle`` with ``device_id``'s context current.

    The device switch happens only when the current device differs (one runtime query otherwise).
    """
    from cupy.cuda import runtime

    if runtime.getDevice() == device_id:
        for launch in launches:
            launch.launch(handle)
        return
    import cupy

    with cupy.cuda.Device(device_id):
        for launch in launches:
            launch.launch(handle)


def stream_handle(stream: Any) -> int:
    """The raw ``cudaStream_t`` of ``stream``.

    Accepts a CuPy ``Stream`` / ``ExternalStream`` (``.ptr``), a PyTorch ``torch.cuda.Stream``
    (``.cuda_stream``), a raw handle as int, or None (CuPy's current stream).
    """
    if stream is None:
        import cupy

        return int(cupy.cuda.get_current_stream().ptr)
    if type(stream) is int:
        return stream
    handle = getattr(stream, "cuda_stream", None)
    if handle is None:
        handle = getattr(stream, "ptr", None)
    if handle is None or isinstance(stream, bool):
        raise InvalidProblem(
            f"stream of type {type(stream).__name__} is not a CUDA stream; pass a cupy.cuda.Stream, "
            "a torch.cuda.Stream, a raw cudaStream_t int, or None for the current CuPy stream"
        )
    return int(handle)


__all__ = ["PreparedLaunch", "launch_on", "stream_handle"]
