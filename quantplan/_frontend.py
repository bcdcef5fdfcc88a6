"""Where a front-end call runs: one target per (library, device, stream), one plan cache.

The array front-ends (:mod:`quantplan.pytorch`, :mod:`quantplan.distributed`,
:mod:`quantplan.compat.deepspeed`) take the user's arrays as they come and run plans where they
live. :meth:`Target.of` reads that from the arrays:

* NumPy arrays and PyTorch CPU tensors run on the NumPy reference backend (PyTorch CPU tensors
  reach the plans as zero-copy NumPy views, bfloat16 as its uint16 bits);
* PyTorch CUDA tensors run on the CUDA backend on ``torch.cuda.current_stream()`` of their device,
  CuPy arrays on CuPy's current stream of their device; outputs and workspaces are allocated by the
  same library on the same device (stream-ordered by its caching allocator).

A :class:`Target` is made once per (library, device, stream) and reused, so the per-call work is
a type lookup, a device index and (CUDA) the current stream's handle. Plans are selected once per
(plan class, problem key, device) and kept in ONE per-thread cache of :data:`PLAN_CACHE_SIZE`
entries (least recently used dropped first; plans are not safe to run from two host threads at
once); the key is whatever cheap tuple the front-end builds (shapes, dtypes, modes: no descriptor
is built on a hit). :func:`clear_plan_cache` empties the caches of every thread.

Nothing here imports PyTorch or CuPy before an array of theirs arrives.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from quantplan.runtime._fast_check import _args_fields, pointer_launcher
from quantplan.runtime._launch import make_context_current
from quantplan.runtime._readers import _READERS, _cupy_operand_direct
from quantplan.runtime._readers import dtype_name as _dtype_name
from quantplan.runtime.workspace import Workspace
from quantplan.vocabulary.errors import InvalidArgumentType, InvalidProblem, Unsupported
from quantplan.vocabulary.types import BackendKind, PlanPreference

#: Plans one thread keeps (least recently used dropped first).
PLAN_CACHE_SIZE = 256

NUMPY, CUPY, TORCH = "numpy", "cupy", "torch"

_CUDA = PlanPreference(backend=BackendKind.CUDA)
_REFERENCE = PlanPreference(backend=BackendKind.REFERENCE)


class DeviceStream:
    """A raw ``cudaStream_t`` and the device it belongs to, in the form the plans read
    (``cuda_stream`` for the handle, ``device_id`` for ``select``)."""

    __slots__ = ("cuda_stream", "device_id")

    def __init__(self, cuda_stream: int, device_id: int) -> None:
        self.cuda_stream = cuda_stream
        self.device_id = device_id

    def __repr__(self) -> str:
        return f"DeviceStream(cuda_stream={self.cuda_stream:#x}, device_id={self.device_id})"


class ArrayWorkspace(Workspace):
    """A :class:`~quantplan.Workspace` over a uint8 array of any library (its device pointer read once)."""

    __slots__ = ("_ptr",)

    def __init__(self, buffer: Any, nbytes: int, ptr: int) -> None:
        super().__init__(buffer, nbytes)
        self._ptr = ptr

    @property
    def ptr(self) -> int:
        """Device pointer of the buffer."""
        return self._ptr


# ---- dtypes ------------------------------------------------------------------------------------


def dtype_name(a: Any) -> str:
    """The element type of array ``a`` as a NumPy-style name (``float16``, ``bfloat16``, ``int8``, ...)."""
    return _dtype_name(a.dtype)


#: PyTorch, imported when the first tensor arrives (None before: NumPy / CuPy users need no PyTorch).
torch: Any = None
_TORCH_DTYPES: dict[str, Any] = {}


def _import_torch() -> Any:
    global torch
    if torch is None:
        import torch as module

        for name in ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64"):
            _TORCH_DTYPES[name] = getattr(module, name)
        torch = module
    return torch


# ---- packed outputs ------------------------------------------------------------------------------

#: The alignment of every region of a packed allocation (:func:`packed_offsets`): CuPy's memory
#: pool's own, so a packed output is as aligned as one allocated alone.
PACKED_ALIGNMENT = 256


def nbytes_of(shape: Sequence[int], dtype: np.dtype[Any]) -> int:
    """The bytes of a C-contiguous array of ``shape`` and ``dtype``."""
    return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


#: The largest packed allocation a replay keeps for its next call (:func:`replay` with ``memory``):
#: the result that held it died with none of its arrays made. Host-bound problems are small; a
#: larger output costs more GPU time than its allocation costs host time.
RECYCLE_BYTES = 1 << 20


def packed_offsets(sizes: Sequence[int]) -> tuple[list[int], int]:
    """Where regions of ``sizes`` bytes lie in one allocation, in order: ``(offsets, total)``,
    offset i = the end of region i-1 rounded up to :data:`PACKED_ALIGNMENT` (region 0 at 0), total =
    the end of the last region. An empty region counts as one byte, so every region starts at
    its own address."""
    offsets: list[int] = []
    end = 0
    for size in sizes:
        start = -(-end // PACKED_ALIGNMENT) * PACKED_ALIGNMENT
        offsets.append(start)
        end = start + max(int(size), 1)
    return offsets, end


# ---- targets -----------------------------------------------------------------------------------


class Target:
    """The library, device and stream of one call, and what runs a plan there.

    ``library``: ``"numpy"``, ``"cupy"`` or ``"torch"``; ``index``: the CUDA device (None on the
    host); ``cuda``: whether plans run on the CUDA backend; ``stream``: the library's current
    stream of that device as a :class:`DeviceStream` (None on the host); ``handle``: its raw
    ``cudaStream_t`` (None on the host), what ``run`` is given; ``device``: the ``torch.device``
    of a PyTorch target.
    """

    __slots__ = ("cuda", "device", "handle", "index", "library", "pref", "stream")

    def __init__(self, library: str, index: int | None, handle: int | None, device: Any = None) -> None:
        self.library = library
        self.index = index
        self.cuda = index is not None
        self.pref = _CUDA if self.cuda else _REFERENCE
        self.handle = handle
        self.stream = None if index is None or handle is None else DeviceStream(handle, index)
        self.device = device

    def __repr__(self) -> str:
        where = "host" if self.index is None else f"cuda:{self.index}, stream {self.handle:#x}"
        return f"Target({self.library}, {where})"

    # ---- where -----------------------------------------------------------------------------

    @staticmethod
    def of(array: Any, *more: Any, names: tuple[str, ...] = ()) -> Target:
        """The target of a call whose array arguments are ``array`` and ``more`` (None entries
        of ``more`` skipped): one library, one device (InvalidProblem otherwise, naming the
        argument from ``names`` where it is not an array: InvalidArgumentType, as the plans raise)."""
        try:
            target = _target_of(array)
            for other in more:
                if other is not None:
                    found = _target_of(other)
                    if found is not target:
                        _mismatch(target, found)
        except _NotAnArray as exc:
            position = next(i for i, a in enumerate((array, *more)) if a is exc.array)
            name = names[position] if position < len(names) else "an argument"
            raise InvalidArgumentType(
                f"{name} is a {type(exc.array).__name__}; expected a NumPy array, a CuPy array or a PyTorch tensor"
            ) from None
        return target

    @staticmethod
    def of_torch_device(device: Any) -> Target:
        """The target of PyTorch tensors on ``device`` (a ``torch.device``, CUDA or CPU; CUDA: the
        current stream of that device now)."""
        _import_torch()
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            return _cuda_target(TORCH, index, _torch_stream(index))
        if device.type == "cpu":
            return _torch_cpu_target()
        raise InvalidProblem(
            f"tensors live on a {device.type!r} device; quantplan runs CUDA tensors (CUDA backend) and CPU "
            f"tensors (reference backend)"
        )

    # ---- plans -----------------------------------------------------------------------------

    def plan(self, plan_cls: Any, key: Hashable, make_desc: Callable[[], Any] | None = None) -> Any:
        """``plan_cls.select`` on this target, once per (``plan_cls``, ``key``, device).

        ``key``: the descriptor itself, or (with ``make_desc``) any cheap hashable tuple that
        determines it; ``make_desc()`` builds the descriptor on a miss only.
        """
        cache = _LOCAL.plans
        if cache is None:
            cache = _new_cache()
        full = (plan_cls, self.index, key)
        found = cache.get(full)
        if found is not None:
            cache.move_to_end(full)
            return found
        return _store(cache, full, self.select(plan_cls, key if make_desc is None else make_desc()))

    def cached(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """What ``build()`` returns (e.g. a plan with facts derived from its problem), once per
        (``key``, device), in the same cache as :meth:`plan`. ``key`` should start with something
        that names what is cached (a class), so it cannot meet another front-end's keys."""
        cache = _LOCAL.plans
        if cache is None:
            cache = _new_cache()
        full = (key, self.index)
        found = cache.get(full)
        if found is not None:
            cache.move_to_end(full)
            return found
        return _store(cache, full, build())

    def select(self, plan_cls: Any, desc: Any) -> Any:
        """``plan_cls.select(stream, desc, pref)`` for this target, uncached (CUDA: with the
        target's device current, so kernels load there)."""
        if not self.cuda:
            return plan_cls.select(None, desc, self.pref)
        import cupy

        assert self.index is not None
        with cupy.cuda.Device(self.index):
            make_context_current(self.index)  # e.g. in autograd's backward thread, which may have none
            return plan_cls.select(self.stream, desc, self.pref)

    def run(self, plan: Any, args: Any, workspace: Workspace | None = None, *, check: bool = True) -> None:
        """``plan.run`` on this target's stream. ``check=False`` where the front-end has established
        everything the plan's argument checks would (the operands it made or checked itself)."""
        plan.run(self.handle, workspace, args, check=check)

    def run_with_workspace(self, plan: Any, args: Any, *, check: bool = True) -> None:
        """:meth:`run` with a fresh workspace of ``plan.workspace_size()`` bytes (none when 0)."""
        nbytes = plan.workspace_size()
        self.run(plan, args, self.workspace(nbytes) if nbytes else None, check=check)

    # ---- memory ----------------------------------------------------------------------------

    def workspace(self, nbytes: int) -> Workspace | None:
        """Scratch of ``nbytes`` on this target (None when 0), from the library's allocator."""
        if nbytes <= 0:
            return None
        if not self.cuda:
            return Workspace.allocate(nbytes, device=False)
        buffer = self.empty((nbytes,), "uint8")
        ptr = buffer.data_ptr() if self.library == TORCH else buffer.data.ptr
        return ArrayWorkspace(buffer, nbytes, int(ptr))

    def empty(self, shape: tuple[int, ...], dtype: str) -> Any:
        """An uninitialized array of ``shape`` and ``dtype`` (a NumPy-style name) on this target."""
        if self.library == TORCH:  # sizes as arguments: PyTorch parses them faster than a tuple
            return (
                torch.empty(*shape, dtype=_TORCH_DTYPES[dtype], device=self.device)
                if shape
                else torch.empty((), dtype=_TORCH_DTYPES[dtype], device=self.device)
            )
        if self.library == NUMPY:
            return np.empty(shape, dtype)
        import cupy

        with cupy.cuda.Device(self.index):
            return cupy.empty(shape, dtype)

    def empty_many(
        self, specs: Sequence[tuple[tuple[int, ...], str]], workspace: int = 0
    ) -> tuple[list[Any], Workspace | None]:
        """Uninitialized arrays of ``specs`` ((shape, NumPy-style dtype) each) on this target, in
        order, and a workspace of ``workspace`` bytes (None when 0). CuPy: all of them regions of
        ONE allocation from CuPy's current allocator, at the offsets of :func:`packed_offsets`
        (256-byte aligned, disjoint; the workspace last), as a replay allocates them; the arrays
        own it jointly (it is freed when the last of them dies). PyTorch and NumPy: one
        :meth:`empty` each, and :meth:`workspace`."""
        if self.library != CUPY:
            return [self.empty(shape, dtype) for shape, dtype in specs], self.workspace(workspace)
        import cupy

        dtypes = [np.dtype(dtype) for _, dtype in specs]
        regions = [nbytes_of(shape, d) for (shape, _), d in zip(specs, dtypes, strict=True)]
        offsets, total = packed_offsets([*regions, workspace] if workspace > 0 else regions)
        if not offsets:
            return [], None
        with cupy.cuda.Device(self.index):
            memory = cupy.cuda.alloc(total)
            arrays = [
                cupy.ndarray(shape, d, memory + offset)
                for (shape, _), d, offset in zip(specs, dtypes, offsets[: len(specs)], strict=True)
            ]
            if workspace <= 0:
                return arrays, None
            buffer = cupy.ndarray((workspace,), np.uint8, memory + offsets[-1])
        return arrays, ArrayWorkspace(buffer, workspace, memory.ptr + offsets[-1])

    def arg(self, a: Any) -> Any:
        """What a plan takes for array ``a`` of this target: the array itself, or for a PyTorch
        CPU tensor a zero-copy NumPy view (bfloat16 as its uint16 bits). Anything else (None, a
        Python number) as it is."""
        if self.cuda or self.library != TORCH or not isinstance(a, torch.Tensor):
            return a
        if a.requires_grad:
            a = a.detach()
        if a.dtype is torch.bfloat16:
            return a.view(torch.int16).numpy().view(np.uint16)
        return a.numpy()

    # ---- array operations in the target's library --------------------------------------------

    def is_contiguous(self, a: Any) -> bool:
        """Whether ``a`` is C-contiguous."""
        return bool(a.is_contiguous()) if self.library == TORCH else bool(a.flags.c_contiguous)

    def contiguous(self, a: Any) -> Any:
        """``a`` itself (detached, for a PyTorch tensor that requires grad) when C-contiguous, else
        a contiguous copy."""
        if self.library == TORCH:
            if a.requires_grad:
                a = a.detach()
            return a if a.is_contiguous() else a.contiguous()
        if a.flags.c_contiguous:
            return a
        if self.library == NUMPY:
            return np.ascontiguousarray(a)
        import cupy

        return cupy.ascontiguousarray(a)

    def writable(self, a: Any) -> bool:
        """Whether ``a`` may be written (a read-only NumPy array may not)."""
        return self.library != NUMPY or bool(a.flags.writeable)

    def numel(self, a: Any) -> int:
        """The element count of ``a``."""
        return int(a.numel()) if self.library == TORCH else int(a.size)

    def view(self, a: Any, dtype: str) -> Any:
        """``a`` reinterpreted as ``dtype`` (a NumPy-style name of the same itemsize), no copy."""
        return a.view(_TORCH_DTYPES[dtype]) if self.library == TORCH else a.view(dtype)

    def copy_into(self, dst: Any, src: Any) -> None:
        """``dst[...] = src`` (same shape, same library)."""
        if self.library == TORCH:
            dst.copy_(src)
        else:
            dst[...] = src


_NUMPY_TARGET = Target(NUMPY, None, None)
_TORCH_CPU: list[Target] = []
#: (library, device index, stream handle) -> Target.
_TARGETS: dict[tuple[str, int, int], Target] = {}
_TARGETS_LOCK = threading.Lock()


def flat(a: Any) -> Any:
    """``a`` as a 1-D array (itself when it is one; a view when contiguous), any library."""
    return a if a.ndim == 1 else a.reshape(-1)


def shaped(a: Any, shape: tuple[int, ...]) -> Any:
    """``a`` reshaped to ``shape`` (itself when it has that shape already), any library."""
    return a if a.shape == shape else a.reshape(shape)


class _NotAnArray(InvalidArgumentType):
    """An argument that is no array (:meth:`Target.of` names it)."""

    def __init__(self, array: Any) -> None:
        super().__init__(f"expected a NumPy array, a CuPy array or a PyTorch tensor, got {type(array).__name__}")
        self.array = array


#: array type -> library, filled on first sight of each type; top-level module -> library.
_LIBRARIES: dict[type, str] = {np.ndarray: NUMPY}
_MODULES = {"numpy": NUMPY, "cupy": CUPY, "torch": TORCH}


def _library(a: Any) -> str:
    kind = type(a)
    library = _LIBRARIES.get(kind)
    if library is None:
        library = NUMPY if isinstance(a, np.ndarray) else _MODULES.get(kind.__module__.partition(".")[0])
        if library is None or library == NUMPY and not isinstance(a, np.ndarray):
            raise _NotAnArray(a)
        if library == TORCH:
            _import_torch()
        _LIBRARIES[kind] = library
    return library


def _target_of(a: Any) -> Target:
    library = _library(a)
    if library == TORCH:
        if a.is_cuda:
            index = a.get_device()
            return _cuda_target(TORCH, index, _torch_stream(index))
        if a.is_cpu:
            return _torch_cpu_target()
        raise InvalidProblem(
            f"a tensor lives on a {a.device.type!r} device; quantplan runs CUDA tensors (CUDA backend) and CPU "
            f"tensors (reference backend): move it with .cuda() or .cpu()"
        )
    if library == NUMPY:
        return _NUMPY_TARGET
    index = int(a.device.id)
    return _cuda_target(CUPY, index, _cupy_stream(index))


def _cuda_target(library: str, index: int, handle: int) -> Target:
    key = (library, index, handle)
    found = _TARGETS.get(key)
    if found is None:
        device = torch.device("cuda", index) if library == TORCH else None
        with _TARGETS_LOCK:
            found = _TARGETS.setdefault(key, Target(library, index, handle, device))
    return found


def _torch_cpu_target() -> Target:
    if not _TORCH_CPU:
        _TORCH_CPU.append(Target(TORCH, None, None, torch.device("cpu")))
    return _TORCH_CPU[0]


_RAW_STREAM: list[Callable[[int], int]] = []
_NEW_EMPTY: dict[tuple[Any, Any], Callable[..., Any]] = {}


def torch_new_empty(device: Any, dtype: Any) -> Callable[..., Any]:
    """``new(*sizes)``: a fresh contiguous tensor of ``dtype`` on ``device`` (``new_empty`` of an
    empty tensor of theirs, one per pair, kept): what ``torch.empty(*sizes, dtype=dtype,
    device=device)`` allocates, through PyTorch's caching allocator, without parsing the dtype and
    the device on every call (the replays' allocations)."""
    key = (device, dtype)
    new = _NEW_EMPTY.get(key)
    if new is None:
        new = _NEW_EMPTY[key] = torch.empty(0, dtype=dtype, device=device).new_empty
    return new


def _torch_stream(index: int) -> int:
    """The raw handle of ``torch.cuda.current_stream(index)`` (through PyTorch's raw-stream getter
    where it has one: no Stream object per call)."""
    if not _RAW_STREAM:
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        _RAW_STREAM.append(raw if raw is not None else lambda i: int(torch.cuda.current_stream(i).cuda_stream))
    return int(_RAW_STREAM[0](index))


def _cupy_stream(index: int) -> int:
    """The raw handle of CuPy's current stream of device ``index``."""
    import cupy

    try:
        return int(cupy.cuda.get_current_stream(index).ptr)
    except TypeError:  # a CuPy whose get_current_stream takes no device
        with cupy.cuda.Device(index):
            return int(cupy.cuda.get_current_stream().ptr)


def _mismatch(a: Target, b: Target) -> None:
    if a.library != b.library:
        raise InvalidProblem(
            f"the arrays of one call must come from one library, got {sorted({a.library, b.library})}; "
            f"move them all to NumPy (reference) or all to the GPU (CuPy or PyTorch CUDA)"
        )
    where = sorted("cpu" if t.index is None else f"cuda:{t.index}" for t in (a, b))
    if a.index == b.index:  # same device, two streams: cannot happen within one call
        raise InvalidProblem(f"the arrays of one call must share one stream, got {a} and {b}")
    raise InvalidProblem(f"the arrays of one call must live on one device, got {where}")


def cupy_stream(device: Any) -> Any:
    """``torch.cuda.current_stream(device)`` as a ``cupy.cuda.ExternalStream`` (cached per
    (device, stream handle); creating one makes no CUDA call, so it is safe during graph capture)."""
    _import_torch()
    index = device.index if device.index is not None else torch.cuda.current_device()
    handle = _torch_stream(index)
    key = (index, handle)
    stream = _EXTERNAL.get(key)
    if stream is None:
        try:
            import cupy
        except ImportError as exc:
            raise Unsupported(
                "CUDA tensors run on quantplan's CUDA backend, which needs CuPy: "
                'python -m pip install -e ".[cuda12]" (or ".[cuda13]") in the quantplan checkout; CPU tensors need no CuPy'
            ) from exc
        stream = cupy.cuda.ExternalStream(handle, index)
        with _TARGETS_LOCK:
            _EXTERNAL[key] = stream
    return stream


_EXTERNAL: dict[tuple[int, int], Any] = {}


# ---- plan cache --------------------------------------------------------------------------------


class _ThreadCaches(threading.local):
    plans: OrderedDict[Hashable, Any] | None = None


_LOCAL = _ThreadCaches()
_ALL_CACHES: list[OrderedDict[Hashable, Any]] = []
_ALL_CACHES_LOCK = threading.Lock()


def _new_cache() -> OrderedDict[Hashable, Any]:
    cache: OrderedDict[Hashable, Any] = OrderedDict()
    _LOCAL.plans = cache
    with _ALL_CACHES_LOCK:
        _ALL_CACHES.append(cache)
    return cache


def _release_kept(value: Any) -> None:
    """Free the allocation a dropped cache entry's replay kept for its next call (a replay's
    function and its names form a cycle, which would hold the memory until the cyclic collector
    ran)."""
    spare = getattr(value, "__globals__", {}).get("spare")
    if type(spare) is list:
        spare.clear()


def _store(cache: OrderedDict[Hashable, Any], key: Hashable, value: Any) -> Any:
    cache[key] = value
    if len(cache) > PLAN_CACHE_SIZE:
        _release_kept(cache.popitem(last=False)[1])
    return value


def clear_plan_cache() -> None:
    """Drop every cached plan of every front-end and thread (their kernels stay loaded), and the
    allocations their replays kept (:data:`RECYCLE_BYTES`); the next call of each op selects
    again."""
    with _ALL_CACHES_LOCK:
        for cache in _ALL_CACHES:
            for value in list(cache.values()):
                _release_kept(value)
            cache.clear()


# ---- Philox streams ------------------------------------------------------------------------------


def check_seed(value: Any, name: str = "seed") -> int:
    """``value`` as a Philox seed / offset: an integer in [0, 2**64) (InvalidProblem otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= int(value) < 2**64:
        raise InvalidProblem(f"{name}={value!r} must be an integer in [0, 2**64)")
    return int(value)


class PhiloxCounter:
    """A Philox key (``seed``) and a counter ``offset`` that hands out fresh, reproducible draws:
    :meth:`take` returns ``(seed, offset)`` and advances the offset (modulo 2**64)."""

    __slots__ = ("offset", "seed")

    def __init__(self, seed: int, offset: int = 0) -> None:
        self.seed = check_seed(seed, "seed")
        self.offset = check_seed(offset, "offset")

    def take(self, count: int) -> tuple[int, int]:
        """``(seed, offset)`` for one call, then the offset advances by ``count``."""
        offset = self.offset
        self.offset = (offset + count) % 2**64
        return self.seed, offset


def replay(
    target: Target,
    plan: Any,
    args: Any,
    inputs: int,
    outputs: Sequence[tuple[tuple[int, ...], str]],
    finish: Callable[..., Any],
    order: Sequence[str] | None = None,
    memory: bool = False,
    packed_inputs: Sequence[int] | None = None,
) -> Callable[..., Any] | None:
    """A front-end call of one signature, replayed: ``fast(*arrays)`` for the ``inputs`` first
    array fields of ``args`` (the caller's arrays, of the dtypes and shapes of this call: the
    caller keys the replay on them) checks each is C-contiguous on the target's device, allocates
    ``outputs`` ((shape, NumPy-style dtype) each, the remaining array fields of ``args``, in
    order) on it, and the plan's workspace where it needs one (a fresh buffer per call, as the
    full path's), launches ``plan`` on the library's current stream through
    :func:`quantplan.runtime._fast_check.pointer_launcher`, and returns ``finish(*arrays, *outputs)``. It returns
    None when a check fails or the launch is refused (nothing launched: the caller takes its full
    path). None instead of a replay where the call has none (not CUDA, no traced launch).
    ``order``: the array fields of ``args`` as ``"x<i>"`` (input i) / ``"o<n>"`` (output n), where
    they are not the inputs then the outputs (an array updated in place: an input named twice).
    ``memory``: no output array is made; ``finish(*arrays, memory, stream, spare)`` receives the
    one allocation (CuPy: a ``cupy.cuda.MemoryPointer``; PyTorch: a 1-D uint8 tensor, its length
    rounded up to :data:`PACKED_ALIGNMENT`) that holds the outputs at the offsets of
    :func:`packed_offsets` of ``outputs`` (and the workspace after them), for a result that makes
    its arrays when they are first read; ``stream`` (the raw handle it launched on) and
    ``spare`` (the replay's list of at most one ``(stream, memory)`` pair; None above
    :data:`RECYCLE_BYTES`) let a result that dies with none of its arrays made (nothing else can
    reach its memory) append its allocation when the list is empty, and the next call on the
    same stream takes it instead of allocating: stream order makes the reuse safe on that
    stream, as the caching allocators' own reuse is. ``packed_inputs``: the inputs are
    regions of one allocation at these byte offsets; ``fast(memory)`` takes that allocation (as
    ``memory`` gives it, checked to be on the target's device; its regions are contiguous by
    construction) and ``finish(memory, *outputs)`` receives it in place of the arrays."""
    if not target.cuda or target.index is None or plan.device_id != target.index:
        return None
    index = target.index
    names: dict[str, Any] = {"finish": finish, "index": index}
    xs = [f"x{i}" for i in range(inputs)]
    results = ", ".join([*xs, *(f"o{n}" for n in range(len(outputs)))])
    lines = [f"def fast({', '.join(xs)}):"]
    nbytes = plan.workspace_size()  # a fresh workspace per call, as the full path allocates one
    if target.library == TORCH:
        launcher = pointer_launcher(plan, args, workspace=True)
        names.update(stream=_RAW_STREAM[0] if _RAW_STREAM else None)
        if names["stream"] is None or launcher is None:
            return None
        if packed_inputs is not None:  # the inputs: regions of one uint8 tensor (contiguous by construction)
            lines = ["def fast(xm):", "    if xm.get_device() != index: return None", "    q = xm.data_ptr()"]
            results = ", ".join(["xm", *(f"o{n}" for n in range(len(outputs)))])
            inputs_at = [f"q + {offset}" if offset else "q" for offset in packed_inputs]
        else:
            for x in xs:
                lines.append(f"    if {x}.get_device() != index or not {x}.is_contiguous(): return None")
            inputs_at = [f"{x}.data_ptr()" for x in xs]
        lines.append("    h = stream(index)")
        if memory:  # every output and the workspace: regions of ONE uint8 tensor (packed_offsets' layout)
            regions = [nbytes_of(shape, np.dtype(dtype)) for shape, dtype in outputs]
            offsets, total = packed_offsets([*regions, nbytes] if nbytes else regions)
            total = -(-total // PACKED_ALIGNMENT) * PACKED_ALIGNMENT  # whole aligned units: it reads as any dtype
            names["new"] = torch_new_empty(target.device, _TORCH_DTYPES["uint8"])
            lines += [f"    {line}" for line in _take_spare(names, total, "new")]
            lines.append("    p = mem.data_ptr()")
            at = [f"p + {offset}" if offset else "p" for offset in offsets]
            results = ", ".join([*xs, "mem", "h", "spare"])
        else:
            for n, (shape, dtype) in enumerate(outputs):
                names[f"new{n}"] = torch_new_empty(target.device, _TORCH_DTYPES[dtype])
                sizes = ", ".join(str(extent) for extent in shape) if shape else "()"
                lines.append(f"    o{n} = new{n}({sizes})")
            at = [f"o{n}.data_ptr()" for n in range(len(outputs))]
            if nbytes:
                names["new_ws"] = torch_new_empty(target.device, _TORCH_DTYPES["uint8"])
                lines.append(f"    ws = new_ws({nbytes})")
                at.append("ws.data_ptr()")
        pointers = _launch_pointers(order, len(xs), len(outputs), inputs_at, at, bool(nbytes))
        lines.append(f"    if not launch(h, {pointers}): return None")
        lines.append(f"    return finish({results})")
    else:
        # The launcher does not test the current device: the replay makes it the arrays' own.
        launcher = pointer_launcher(plan, args, device_checked=True, workspace=True)
        if launcher is None:
            return None
        import cupy
        from cupy.cuda import runtime

        names.update(
            new=cupy.ndarray, current=cupy.cuda.get_current_stream, Device=cupy.cuda.Device, device=runtime.getDevice
        )
        if packed_inputs is not None:
            lines = ["def fast(xm):", "    if xm.device_id != index: return None", "    q = xm.ptr"]
            results = ", ".join(["xm", *(f"o{n}" for n in range(len(outputs)))])
            inputs_at = [f"q + {offset}" if offset else "q" for offset in packed_inputs]
        else:
            inputs_at = [f"m{i}.ptr" for i in range(inputs)]
        kinds = _input_types(args, inputs, order) if packed_inputs is None else []
        for i, x in enumerate(
            xs if packed_inputs is None else []
        ):  # the caller's arrays: on the device, C-contiguous (the key fixed the rest)
            direct = _READERS.get(kinds[i]) is _cupy_operand_direct  # CuPy's flag without a flags object
            contiguous = f"{x}._c_contiguous" if direct else f"{x}.flags.c_contiguous"
            lines.append(f"    m{i} = {x}.data")
            lines.append(f"    if m{i}.device_id != index or not {contiguous}: return None")
        # Every output and the workspace: regions of ONE allocation (Target.empty_many's layout);
        # a lone region is allocated by its array (one call fewer).
        body = []
        dtypes = [np.dtype(dtype) for _, dtype in outputs]
        regions = [nbytes_of(shape, d) for (shape, _), d in zip(outputs, dtypes, strict=True)]
        offsets, total = packed_offsets([*regions, nbytes] if nbytes else regions)
        for n, d in enumerate(dtypes):
            names[f"d{n}"] = d
        launch_stream = "current().ptr"
        if memory:  # the outputs stay regions of `mem` until the result makes them
            names["alloc"] = cupy.cuda.alloc
            body += ["h = current().ptr", *_take_spare(names, total, "alloc"), "p = mem.ptr"]
            results = ", ".join([*xs, "mem", "h", "spare"])
            launch_stream = "h"
        elif len(offsets) > 1:
            names["alloc"] = cupy.cuda.alloc  # CuPy's current allocator (set_allocator's, when set)
            body += [f"mem = alloc({total})", "p = mem.ptr"]
            for n, (shape, _) in enumerate(outputs):
                region = f"mem + {offsets[n]}" if offsets[n] else "mem"
                body.append(f"o{n} = new({tuple(shape)!r}, d{n}, {region})")
        elif outputs:
            body += [f"o0 = new({tuple(outputs[0][0])!r}, d0)", "p = o0.data.ptr"]
        elif nbytes:
            names["u8"] = np.dtype("uint8")
            body += [f"ws = new(({nbytes},), u8)", "p = ws.data.ptr"]
        at = [f"p + {offset}" if offset else "p" for offset in offsets]
        pointers = _launch_pointers(order, len(xs), len(outputs), inputs_at, at, bool(nbytes))
        body.append(f"if not launch({launch_stream}, {pointers}): return None")
        lines.append("    if device() != index:  # outputs allocated and the plan launched on the arrays' device")
        lines.append("        with Device(index):")
        lines += [f"            {line}" for line in body]
        lines.append(f"        return finish({results})")
        lines += [f"    {line}" for line in body]
        lines.append(f"    return finish({results})")
    names["launch"] = launcher
    exec(compile("\n".join(lines), "<quantplan front-end replay>", "exec"), names)
    return names["fast"]  # type: ignore[no-any-return]


def _launch_pointers(
    order: Sequence[str] | None, inputs: int, outputs: int, inputs_at: list[str], at: list[str], workspace: bool
) -> str:
    """The launcher's pointer arguments of a replay, as source: input ``i``'s ``inputs_at[i]`` and
    output ``n``'s ``at[n]`` in ``order`` (default: the inputs, then the outputs), and the
    workspace's (``at[-1]``) last where the plan has one."""
    arrays = (
        list(order) if order is not None else [*(f"x{i}" for i in range(inputs)), *(f"o{n}" for n in range(outputs))]
    )
    pointers = ", ".join(inputs_at[int(name[1:])] if name[0] == "x" else at[int(name[1:])] for name in arrays)
    return f"{pointers}, {at[-1]}" if workspace else pointers


def _take_spare(names: dict[str, Any], total: int, allocate: str) -> list[str]:
    """The lines of a replay that set ``mem``: the allocation its last result gave back (see
    :func:`replay`'s ``memory``) when there is one for stream ``h``, else ``allocate(total)``.
    ``names["spare"]`` is the replay's list of at most one ``(stream, memory)`` pair (None when
    ``total`` exceeds :data:`RECYCLE_BYTES`: nothing is kept). Pop, then test: a result dying in
    another thread may append between a test and a pop."""
    if total > RECYCLE_BYTES:
        names["spare"] = None
        return [f"mem = {allocate}({total})"]
    names["spare"] = []
    return [
        "mem = None",
        "if spare:",
        "    try:",
        "        home, mem = spare.pop()",
        "        if home != h: mem = None",
        "    except IndexError: pass",
        f"if mem is None: mem = {allocate}({total})",
    ]


def _input_types(args: Any, inputs: int, order: Sequence[str] | None) -> list[type]:
    """The types of the arrays of ``args`` that a replay's inputs ``x<i>`` stand for."""
    kind: type = type(args)
    fields = _args_fields(kind) or ()
    arrays = [v for v in (getattr(args, name) for name in fields) if v is not None and not isinstance(v, (int, float))]
    named = list(order) if order is not None else [f"x{i}" for i in range(inputs)]
    return [type(arrays[named.index(f"x{i}")]) if f"x{i}" in named else object for i in range(inputs)]


def replay_of(key: Hashable) -> Callable[..., Any] | None:
    """The replay this thread remembered under ``key`` (in the front-ends' plan cache), or None."""
    cache = _LOCAL.plans
    return None if cache is None else cache.get(key)


_NO_ARRAY: Any = object()


def array_signature(a: Any, b: Any = _NO_ARRAY) -> tuple[Any, ...] | None:
    """``(type, dtype, shape)`` of ``a`` (and of ``b``), flat: the array part of a replay key;
    None when one of them is not an array."""
    try:
        if b is _NO_ARRAY:
            return (type(a), a.dtype, a.shape)
        return (type(a), a.dtype, a.shape, type(b), b.dtype, b.shape)
    except AttributeError:
        return None


def replayed(key: Hashable | None, *arrays: Any) -> Any:
    """The result of the call this thread remembered under ``key`` (:func:`remember_replay`),
    replayed on ``arrays``; None when there is none (no key, no such call, an unhashable key) or
    the replay declined (another device, a non-contiguous array, another alignment): the caller
    then takes its full path. A front-end's hot path: one dictionary lookup, then the replay."""
    if key is None:
        return None
    try:
        fast = _LOCAL.plans.get(key)  # type: ignore[union-attr]
    except (AttributeError, TypeError):  # no plan cache yet; an unhashable argument
        return None
    return None if fast is None else fast(*arrays)


def _declined(*arrays: Any) -> None:
    """The replay of a call that has none: every call takes the full path."""
    return None


def remember_replay(key: Hashable, target: Target, make: Callable[[], Callable[..., Any] | None]) -> None:
    """Keep ``make()`` (a :func:`replay`, or None where the call has none) under ``key`` in this
    thread's plan cache, once per key: a call without a replay is remembered as declined, so
    the full path does not try to make it again. ``key`` should start with the front-end
    function it replays, so it cannot meet a plan's key. A call on the host (``target`` not CUDA)
    remembers nothing: the key does not name the device, and a PyTorch CPU tensor's declined
    replay would shut out the CUDA tensor of the same shape and dtype."""
    if not target.cuda:
        return
    cache = _LOCAL.plans
    if cache is None:
        cache = _new_cache()
    try:
        if key in cache:
            return
    except TypeError:  # an unhashable argument in the key: nothing to remember
        return
    _store(cache, key, make() or _declined)


__all__ = [
    "array_signature",
    "nbytes_of",
    "packed_offsets",
    "PACKED_ALIGNMENT",
    "remember_replay",
    "replayed",
    "replay",
    "replay_of",
    "CUPY",
    "NUMPY",
    "PLAN_CACHE_SIZE",
    "TORCH",
    "ArrayWorkspace",
    "DeviceStream",
    "PhiloxCounter",
    "Target",
    "check_seed",
    "clear_plan_cache",
    "cupy_stream",
    "dtype_name",
    "flat",
    "shaped",
]
