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
from collections.abc import Callable
from typing import Any, Protocol

from quantplan.runtime._operand import Operand
from quantplan.vocabulary.errors import InvalidArgumentType


def fields(ctype: Any, *names: str) -> list[tuple[str, Any]]:
    """Argument-block fields ``names``, all of C type ``ctype``: ``fields(ctypes.c_uint64, "x", "y")``."""
    return [(name, ctype) for name in names]


#: The Philox seed / offset fields of a stochastic kernel's argument block (SPEC section 4): each
#: a device pointer to a one-element int64 array, or 0 and the value itself.
RNG_FIELDS: list[tuple[str, Any]] = [
    *fields(ctypes.c_uint64, "seed_ptr", "offset_ptr", "seed_value", "offset_value"),
]


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


class LaunchPair:
    """A kernel with aligned vector I/O and its twin for any alignment (element I/O).

    ``align_in`` / ``align_out``: bytes the vector I/O needs of the pointers read / written.
    """

    __slots__ = ("align_in", "align_out", "fallback", "primary")

    def __init__(self, primary: PreparedLaunch, fallback: PreparedLaunch, align_in: int, align_out: int = 0) -> None:
        self.primary, self.fallback = primary, fallback
        self.align_in, self.align_out = align_in, align_out or align_in

    def pick(self, src: int, dst: int, other: int = 0) -> PreparedLaunch:
        """The primary launch when ``src`` (and ``other``, also read) and ``dst`` are aligned, else the twin."""
        if src % self.align_in or dst % self.align_out or other % self.align_in:
            return self.fallback
        return self.primary

    @property
    def launches(self) -> tuple[PreparedLaunch, PreparedLaunch]:
        return self.primary, self.fallback


def params_struct(name: str, fields: list[tuple[str, Any]]) -> type[ctypes.Structure]:
    """A ``ctypes.Structure`` named ``name`` with ``fields``: a kernel's argument block, field for field."""
    return type(name, (ctypes.Structure,), {"_fields_": fields})


class MultiprocessorCount(Protocol):
    """What :func:`occupancy_grid` reads of a device (``_device.DeviceInfo`` has it): the launch kit
    takes the count, not the device layer."""

    @property
    def sm_count(self) -> int: ...


def occupancy_grid(function: Any, block: int, wanted: int, info: MultiprocessorCount) -> int:
    """Blocks to launch: ``wanted``, at most the resident blocks of every multiprocessor (grid-stride beyond)."""
    import cupy

    per_sm = max(1, cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(function.ptr, block, 0))
    return max(1, min(wanted, per_sm * info.sm_count))


def vector_alignment(vec: int, element_bits: int) -> int:
    """Bytes of alignment a vector of ``vec`` elements of ``element_bits`` bits needs (at most 16)."""
    return max(1, min(16, vec * element_bits // 8))


def device_arg(value: Operand | float | int | None) -> tuple[int, float | int]:
    """A kernel parameter that is a device pointer or a value: ``(pointer, 0)`` or ``(0, value)``."""
    if type(value) is Operand:
        return value.ptr, 0  # type: ignore[union-attr]
    return 0, 0 if value is None else value  # type: ignore[return-value]


def set_rng(params: Any, seed: Operand | int | None, offset: Operand | int | None) -> None:
    """Write the Philox seed and offset of a stochastic launch (see :data:`RNG_FIELDS`)."""
    params.seed_ptr, params.seed_value = device_arg(seed)
    params.offset_ptr, params.offset_value = device_arg(offset)


def _bind_current_device() -> int:
    from cupy.cuda import runtime

    global current_device
    current_device = runtime.getDevice
    return runtime.getDevice()  # type: ignore[no-any-return]


#: The current CUDA device (CuPy's ``runtime.getDevice``, bound on first use: no import per call).
current_device: Callable[[], int] = _bind_current_device


def launch_on(device_id: int, handle: int, *launches: PreparedLaunch) -> None:
    """Enqueue ``launches`` in order on ``handle`` with ``device_id``'s context current.

    The device switch happens only when the current device differs (one runtime query otherwise).
    """
    if current_device() == device_id:
        try:
            for launch in launches:
                launch.launch(handle)
        except Exception as exc:  # a thread with no current context (e.g. autograd's backward thread)
            if "CUDA_ERROR_INVALID_CONTEXT" not in str(exc) or launch is not launches[0]:
                raise
            make_context_current(device_id)
            for launch in launches:
                launch.launch(handle)
        return
    import cupy

    with cupy.cuda.Device(device_id):
        make_context_current(device_id)
        for launch in launches:
            launch.launch(handle)


def make_context_current(device_id: int) -> None:
    """Make ``device_id``'s primary context current on this thread.

    ``cudaSetDevice`` does that since CUDA 12; a thread that has only asked for the current device
    (a fresh thread, e.g. PyTorch's autograd worker, reports device 0 without any context) has none,
    and driver calls (module loads, ``cuLaunchKernel``) then fail with CUDA_ERROR_INVALID_CONTEXT.
    """
    from cupy.cuda import runtime

    runtime.setDevice(device_id)


def stream_handle(stream: Any) -> int:
    """The raw ``cudaStream_t`` of ``stream``.

    Accepts a CuPy ``Stream`` / ``ExternalStream`` (``.ptr``), a PyTorch ``torch.cuda.Stream``
    (``.cuda_stream``), a raw handle as int, or None (CuPy's current stream).
    """
    kind = type(stream)
    if kind is int:
        return stream  # type: ignore[no-any-return]
    if kind in _PTR_STREAMS and "cuda_stream" not in stream.__dict__:  # a CuPy stream (.ptr)
        return int(stream.ptr)
    if stream is None:
        return int(_current_stream().ptr)
    handle = getattr(stream, "cuda_stream", None)
    if handle is None:
        handle = getattr(stream, "ptr", None)
        if handle is not None and kind.__module__.startswith("cupy.") and _no_cuda_stream(kind):
            _PTR_STREAMS.add(kind)
    if handle is None or isinstance(stream, bool):
        raise InvalidArgumentType(
            f"stream of type {type(stream).__name__} is not a CUDA stream; pass a cupy.cuda.Stream, "
            "a torch.cuda.Stream, a raw cudaStream_t int, or None for the current CuPy stream"
        )
    return int(handle)


#: CuPy stream types (their handle is ``.ptr`` unless an instance was given a ``cuda_stream``).
_PTR_STREAMS: set[type] = set()


def _no_cuda_stream(kind: type) -> bool:
    """True when only an instance's own ``__dict__`` could give ``kind`` a ``cuda_stream``."""
    return not hasattr(kind, "cuda_stream") and not hasattr(kind, "__getattr__") and kind.__dictoffset__ != 0


def _bind_current_stream() -> Any:
    import cupy

    global _current_stream
    _current_stream = cupy.cuda.get_current_stream
    return cupy.cuda.get_current_stream()


#: CuPy's current stream (``cupy.cuda.get_current_stream``, bound on first use).
_current_stream: Callable[[], Any] = _bind_current_stream


#: Stream types :func:`check_stream` has accepted (a set lookup per call after the first).
_STREAM_TYPES: set[type] = {int, type(None)}


def check_stream(stream: Any) -> None:
    """The stream rule of :func:`stream_handle`, on every backend (the reference backend takes the
    same streams the CUDA backend does, and ignores them): InvalidArgumentType otherwise."""
    kind = type(stream)
    if kind in _STREAM_TYPES:
        return
    if getattr(stream, "cuda_stream", None) is None and getattr(stream, "ptr", None) is None or kind is bool:
        stream_handle(stream)  # raises, naming the type
    _STREAM_TYPES.add(kind)


__all__ = [
    "make_context_current",
    "RNG_FIELDS",
    "check_stream",
    "LaunchPair",
    "PreparedLaunch",
    "device_arg",
    "fields",
    "launch_on",
    "occupancy_grid",
    "params_struct",
    "set_rng",
    "stream_handle",
    "vector_alignment",
]
