"""The fast path of ``Plan.run`` on CUDA: one generated function per remembered call signature.

A call that passes ``Plan._check_call`` (or, with ``check=False``, goes through ``_extract``)
leaves its *signature* here, and a function is generated for it that, on a later call with an
equal signature, does everything ``run`` would do, in straight-line Python: compare the
signature, write the new pointers into the prepared argument blocks, and call the driver.

The checked signature:

* per Args field (every dataclass field, in order): None; a Python ``int`` / ``float`` (its type
  and exact value, the sign of zero included); or an array (its type, dtype object, shape,
  contiguity, device and pointer class: pointer mod 256, or -1 for a null pointer);
* the workspace: None, or its type, ``nbytes`` and its buffer as an array;
* the pairwise relation of the arrays' byte ranges (same start; shared byte, as
  :func:`quantplan.runtime._operands.overlaps` computes it);
* the stream (type and handle) and the current device.

The checks read nothing else (they are pure functions of these), so a later call with an equal
signature gets the same verdict and the same operand record, but for the pointers. Anything else
(another dtype, shape, device, alignment, overlap, scalar, a NumPy scalar, a list...) is a miss:
the call goes through ``_check_call`` again, which raises the detailed error or passes and is
remembered. ``check=False`` has its own signatures, keyed on the layout of the call (which fields
are None, scalars and their values, array types, pointer class; the full array properties where
``_extract``'s record carries them) and the current device.

**What the generated function launches.** ``Plan._launch`` turns the record into stores into the
plan's prepared argument blocks (:class:`~quantplan.runtime._launch.PreparedLaunch`) and driver launches.
For one signature, which kernels launch and the value of every field stored are functions of the
record's pointers alone, each field either constant or one pointer plus a constant. The learner
finds them by *tracing* ``_launch`` three times on probe records (the remembered pointers moved
by multiples of 2**40, which keeps every alignment class and null pointer): the argument blocks
filled with a poison byte first (a field that keeps the poison was not written) and the driver
replaced by a recorder of each launch and of its argument block's bytes at that moment. Two
traces with the same probe and different poison give the fields written and their values, a third
with one offset per operand tells which pointer a field follows. The argument blocks are restored
afterwards. A plan whose ``_launch`` does more than stores and launches (``_launch_traceable``
False), an instance whose ``_launch`` was replaced, or a trace that does not resolve, keeps the
generic tail: the remembered record with the new pointers written into it, passed to ``_launch``.

The generated functions hold no reference to the caller's arrays. A plan is not for concurrent
``run`` from several threads (see :mod:`quantplan.runtime._launch`); the argument blocks are shared.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import sys
from collections.abc import Callable
from functools import cache
from typing import Any

from quantplan.runtime import _launch
from quantplan.runtime._launch import PreparedLaunch, stream_handle
from quantplan.runtime._operand import Operand
from quantplan.runtime._readers import _READERS, _cupy_operand, _cupy_operand_direct, _torch_operand, operand

#: Signatures kept per mode (checked / unchecked).
KEEP = 4
#: Signatures a plan tries to remember per Args type and mode over its life (each costs a code
#: generation and a trace, a few hundred microseconds): calls whose scalars change every time (a
#: Philox offset counting up), or that hold a value without a fast path (a NumPy scalar), stop
#: being remembered after these and take the checks, at no extra cost.
REMEMBER_LIMIT = 8
#: The pointer class of an array: its pointer mod ALIGN_CLASS (every alignment a check or a
#: launch asks for divides it), -1 for a null pointer.
ALIGN_CLASS = 256

_PLAIN = (type(None), bool, int, float, str)

#: A fast function: ``fast(args, workspace, stream) -> bool`` (True: the call is done).
FastCall = Callable[[Any, Any, Any], bool]


def _array_props(value: Any) -> tuple[Any, tuple[int, ...], bool, int, int, int] | None:
    """(dtype, shape, contiguous, device, pointer, itemsize) of a CuPy / PyTorch array as the
    checks read it, or None for any other value (no fast path)."""
    reader = _READERS.get(type(value))
    if reader is _cupy_operand_direct or reader is _cupy_operand or reader is _torch_operand:
        op = operand(value, "")
        device = value.get_device() if reader is _torch_operand else -1 if op.device_id is None else op.device_id
        shape = tuple(op.shape)
        exact = type(op.contiguous) is bool and type(device) is int and type(op.ptr) is int
        if exact and all(type(extent) is int for extent in shape):  # written into the matcher as literals
            return value.dtype, shape, op.contiguous, device, op.ptr, op.itemsize
    return None


def _pointer_class(ptr: int) -> str:
    """The test that a pointer variable keeps the class of ``ptr`` (null, or its residue)."""
    return f"% {ALIGN_CLASS} != {ptr % ALIGN_CLASS} or not " if ptr else ""


class _Source:
    """The source of one generated function: straight-line tests of one remembered call, each
    ``return False`` on a difference, then the tail that launches."""

    def __init__(self, prefix: str = "k") -> None:
        self.lines: list[str] = []
        self.names: dict[str, Any] = {"copysign": math.copysign}
        #: The first letter of the constants' names (the checked and unchecked functions of one
        #: plan use different ones: :func:`_dispatcher` puts both bodies in one function).
        self.prefix = prefix
        #: Pointer-class tests not yet written: (pointer variable, remembered pointer); written
        #: together by :meth:`pointer_classes` or :meth:`relations`.
        self.classes: list[tuple[str, int]] = []

    def const(self, value: Any) -> str:
        """A name for ``value`` in the generated function's globals."""
        name = f"{self.prefix}{len(self.names)}"
        self.names[name] = value
        return name

    def miss_if(self, condition: str) -> None:
        self.lines.append(f"    if {condition}: return False")

    def stream(self, stream: Any, key: tuple[Any, ...]) -> None:
        """The stream: same type and handle (read as ``stream_handle`` reads it), same current device."""
        kind, handle, device = key
        if kind is int:
            self.miss_if(f"type(s) is not int or s != {handle!r}")
        elif kind in _launch._PTR_STREAMS:  # a CuPy stream: its .ptr
            self.miss_if(f"type(s) is not {self.const(kind)} or 'cuda_stream' in s.__dict__ or s.ptr != {handle!r}")
        elif kind.__module__.startswith("torch.") and type(getattr(stream, "cuda_stream", None)) is int:
            self.miss_if(f"type(s) is not {self.const(kind)} or s.cuda_stream != {handle!r}")
        elif stream is None:  # CuPy's current stream
            self.miss_if(f"s is not None or {self.const(_launch)}._current_stream().ptr != {handle!r}")
        else:  # any other stream: read as the checks would
            self.miss_if(f"{self.const(_stream_key)}(s) != {self.const(key)}")
            return
        self.device(device)

    def device(self, device: int) -> None:
        """The current device is ``device``."""
        self.miss_if(f"{self.const(sys.modules[__name__])}.current_device() != {device!r}")

    def handle(self, stream: Any) -> None:
        """``h``: the stream's raw handle (``check=False``: read per call, as ``stream_handle`` does)."""
        kind = type(stream)
        general = self.const(stream_handle)
        if kind is int:
            self.lines.append(f"    h = s if type(s) is int else {general}(s)")
        elif kind in _launch._PTR_STREAMS:
            test = f"type(s) is {self.const(kind)} and 'cuda_stream' not in s.__dict__"
            self.lines.append(f"    h = s.ptr if {test} else {general}(s)")
        elif kind.__module__.startswith("torch.") and type(getattr(stream, "cuda_stream", None)) is int:
            self.lines.append(f"    h = s.cuda_stream if type(s) is {self.const(kind)} else {general}(s)")
        elif stream is None:
            self.lines.append(f"    h = {self.const(_launch)}._current_stream().ptr if s is None else {general}(s)")
        else:
            self.lines.append(f"    h = {general}(s)")

    def scalar(self, expr: str, value: Any) -> None:
        """An exact Python int / float (type, value, and the sign of a float zero)."""
        test = f"type(t := {expr}) is not {type(value).__name__} or t != {self.const(value)}"
        if type(value) is float and value == 0:
            test += f" or copysign(1.0, t) != {math.copysign(1.0, value)!r}"
        self.miss_if(test)

    def array(self, expr: str, i: int, value: Any, props: tuple[Any, ...]) -> None:
        """An array of the remembered type, dtype, shape, contiguity, device and pointer class."""
        dtype, shape, contiguous, device, ptr, _ = props
        v, p = f"v{i}", f"p{i}"
        self.lines.append(f"    {v} = {expr}")
        kind, dt = self.const(type(value)), self.const(dtype)
        if _READERS[type(value)] is _torch_operand:
            self.miss_if(
                f"type({v}) is not {kind} or {v}.dtype is not {dt} or {v}.get_device() != {device!r} "
                f"or {v}.shape != {shape!r} or {v}.is_contiguous() is not {contiguous!r}"
            )
            self.lines.append(f"    {p} = {v}.data_ptr()" if device >= 0 else f"    {p} = 0")
        else:
            flag = f"{v}._c_contiguous" if _READERS[type(value)] is _cupy_operand_direct else f"{v}.flags.c_contiguous"
            self.miss_if(f"type({v}) is not {kind} or {v}.dtype is not {dt} or {v}.shape != {shape!r}")
            self.lines.append(f"    m{i} = {v}.data")
            self.lines.append(f"    {p} = m{i}.ptr")
            self.miss_if(f"{flag} is not {contiguous!r} or m{i}.device_id != {device!r}")
        self.classes.append((p, ptr))

    def pointer(self, expr: str, i: int, value: Any, ptr: int) -> None:
        """Any array of the remembered type and pointer class: its pointer only (``check=False``)."""
        v, p = f"v{i}", f"p{i}"
        self.lines.append(f"    {v} = {expr}")
        self.miss_if(f"type({v}) is not {self.const(type(value))}")
        if _READERS[type(value)] is _torch_operand:
            self.lines.append(f"    {p} = {v}.data_ptr() if {v}.get_device() >= 0 else 0")
        else:
            self.lines.append(f"    {p} = {v}.data.ptr")
        self.classes.append((p, ptr))

    def _class_tests(self) -> list[str]:
        """The deferred pointer-class tests, one condition each (true: a miss); emptied."""
        tests = [f"{p} {_pointer_class(ptr)}{p}" if ptr else p for p, ptr in self.classes]
        self.classes = []
        return tests

    def pointer_classes(self) -> None:
        """The deferred pointer-class tests. Where every remembered pointer is non-null and of
        class 0 (an allocation's alignment, the common case), one test for all of them:
        ``(p0 | p1 | ...) % ALIGN_CLASS`` is 0 exactly when each is, and ``p0 and p1 and ...``
        exactly when none is null."""
        pointers = [p for p, ptr in self.classes if ptr and ptr % ALIGN_CLASS == 0]
        if len(pointers) > 1 and len(pointers) == len(self.classes):
            self.classes = []
            self.miss_if(f"({' | '.join(pointers)}) % {ALIGN_CLASS} or not ({' and '.join(pointers)})")
            return
        for test in self._class_tests():
            self.miss_if(test)

    def relations(self, arrays: list[tuple[int, int, int]]) -> None:
        """The deferred pointer-class tests and the pairwise relation of the arrays' byte ranges:
        same start, shared byte (``overlaps``).

        Where the remembered arrays are all non-empty, non-null, of pointer class 0 and pairwise
        disjoint (the common case), a cheaper test decides first: the pointers in the remembered
        address order, each array ending at or before the next one starts, and the class of all
        of them at once. It holds only when every individual test below passes (disjoint
        intervals in a chain are pairwise disjoint and distinct; the lowest pointer non-null makes
        them all non-null), so the individual tests run only when it fails, with the same verdict."""
        tests = self._class_tests()
        for n, (i, a, size_a) in enumerate(arrays):
            for j, b, size_b in arrays[n + 1 :]:
                same, shared = a == b, bool(a and b and a < b + size_b and b < a + size_a)
                pi, pj = f"p{i}", f"p{j}"
                if a and b and not same and not shared:  # the common case: two disjoint arrays
                    tests.append(f"{pi} < {pj} + {size_b} and {pj} < {pi} + {size_a} or {pi} == {pj}")
                else:
                    tests.append(
                        f"({pi} == {pj}) is not {same} or bool({pi} and {pj} and {pi} < {pj} + {size_b} "
                        f"and {pj} < {pi} + {size_a}) is not {shared}"
                    )
        chain = _disjoint_chain(arrays)
        if chain is None:
            for test in tests:
                self.miss_if(test)
            return
        self.lines.append(f"    if not ({chain}):")
        self.lines += [f"        if {test}: return False" for test in tests]

    def compile(self, params: str, traced: bool) -> FastCall:
        """The generated function (its ``traced``: whether it launches by itself, without ``_launch``)."""
        self.lines.append("    return True")
        namespace = dict(self.names)
        exec(compile(f"def fast({params}):\n" + "\n".join(self.lines), "<quantplan fast path>", "exec"), namespace)
        fast = namespace["fast"]
        fast.traced = traced
        fast.body = self.lines[:-1]
        fast.names = self.names
        return fast  # type: ignore[no-any-return]


def _disjoint_chain(arrays: list[tuple[int, int, int]]) -> str | None:
    """For (field, pointer, bytes) of the arrays of a remembered call: the condition that holds
    when the call's arrays are again of pointer class 0, non-null and disjoint in the same address
    order, or None where the remembered arrays were not all so (an empty array, a null pointer,
    another class, two arrays sharing bytes)."""
    if not arrays or any(not ptr or ptr % ALIGN_CLASS or size <= 0 for _, ptr, size in arrays):
        return None
    ordered = sorted(arrays, key=lambda item: item[1])
    if any(a + size_a > b for (_, a, size_a), (_, b, _) in zip(ordered, ordered[1:], strict=False)):
        return None
    names = [f"p{i}" for i, _, _ in arrays]
    steps = [f"p{i} + {size} <= p{j}" for (i, _, size), (j, _, _) in zip(ordered, ordered[1:], strict=False)]
    return " and ".join([f"not ({' | '.join(names)}) % {ALIGN_CLASS}", f"p{ordered[0][0]}", *steps])


def _cuda_current_device() -> int:
    from cupy.cuda import runtime

    global current_device
    current_device = runtime.getDevice
    return current_device()  # type: ignore[no-any-return]


#: The current CUDA device (CuPy's ``runtime.getDevice`` once CuPy is imported).
current_device: Callable[[], int] = _cuda_current_device


def _stream_key(stream: Any) -> tuple[Any, ...] | None:
    """What the checks may read of the stream: its type, handle and the current device."""
    try:
        handle = stream_handle(stream)
    except Exception:  # a bad stream: the slow path reports it
        return None
    return type(stream), handle, current_device()


def _operand_template(record: Any, values: list[Any], ptrs: list[int]) -> tuple[Any, list[tuple[Operand, int]]] | None:
    """The record as a reusable template (its operands copied, without the caller's arrays) and,
    per operand, the field whose pointer it carries; None when the record holds anything else."""
    if not isinstance(record, tuple) or not hasattr(record, "_fields"):
        return None
    items: list[Any] = []
    slots: list[tuple[Operand, int]] = []
    for item in record:
        if type(item) is Operand:
            field = next((i for i, v in enumerate(values) if v is item.obj), -1)
            if field < 0 or ptrs[field] != item.ptr:
                return None
            copy = Operand(None, item.ptr, item.shape, item.dtype_name, item.itemsize, item.contiguous, item.device_id)
            slots.append((copy, field))
            items.append(copy)
        elif type(item) in _PLAIN:
            items.append(item)
        else:
            return None
    return type(record)(*items), slots


@cache
def _args_fields(kind: type) -> tuple[str, ...] | None:
    """The fields of an Args dataclass with slots (None for any other Args type: no fast path);
    once per type (``dir`` costs microseconds)."""
    if not dataclasses.is_dataclass(kind) or "__dict__" in dir(kind) or not hasattr(kind, "__slots__"):
        return None
    return tuple(f.name for f in dataclasses.fields(kind))


# ---- tracing a plan's _launch ----------------------------------------------------------------------

#: The probe's shift of every pointer (trace 1 and 2) and the unit of the per-operand shifts (trace 3).
_SHIFT = 1 << 44
_UNIT = 1 << 40
#: The stream handle the traces pass (a launch on any other handle does not resolve).
_PROBE_HANDLE = 0x5EED_0000_0000
_INTEGER_FIELDS = {ctypes.sizeof(ctypes.c_uint64): (ctypes.c_uint64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_size_t)}


class _ProbeWorkspace:
    """The workspace a trace passes: only its pointer (a ``_launch`` reading more does not resolve)."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


def _leaf_fields(
    struct_type: type, base: int = 0, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], int, Any]]:
    """(path, byte offset, ctype) of every scalar field of a ``ctypes.Structure``, nested ones
    flattened; TypeError for a field of any other kind (an array: none today)."""
    leaves: list[tuple[tuple[str, ...], int, Any]] = []
    for name, ctype, *bits in struct_type._fields_:  # type: ignore[attr-defined]
        offset = base + getattr(struct_type, name).offset
        if isinstance(ctype, type) and issubclass(ctype, ctypes.Structure):
            leaves += _leaf_fields(ctype, offset, (*path, name))
        elif bits or not (isinstance(ctype, type) and issubclass(ctype, ctypes._SimpleCData)):
            raise TypeError(f"argument field {name} is neither a scalar nor a structure")
        else:
            leaves.append(((*path, name), offset, ctype))
    return leaves


class _Trace:
    """One traced ``_launch``: the launches it made, each with its argument block's bytes."""

    def __init__(self, plan: Any, record: Any, workspace: Any, poison: int) -> None:
        self.events: list[tuple[PreparedLaunch, tuple[int, ...], bytes]] = []
        by_params = {launch._kernel_params: launch for launch in plan._prepared}

        def recorder(fn: int, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, *rest: int) -> None:
            smem, handle, params, extra = rest
            launch = by_params[params]
            blob = ctypes.string_at(ctypes.addressof(launch.params), ctypes.sizeof(launch.params))
            self.events.append((launch, (fn, gx, gy, gz, bx, by, bz, smem, handle, extra), blob))

        for launch in plan._prepared:
            ctypes.memset(ctypes.addressof(launch.params), poison, ctypes.sizeof(launch.params))
            launch._driver_launch = recorder
        from cupy.cuda import runtime

        memset = runtime.memsetAsync

        def refuse(*args: Any) -> None:  # an enqueue besides the prepared launches: no traced tail
            raise _Untraceable

        runtime.memsetAsync = refuse
        try:
            plan._launch(_PROBE_HANDLE, workspace, record)
        finally:
            runtime.memsetAsync = memset
            for launch in plan._prepared:
                launch._driver_launch = _driver_launch()


class _Untraceable(Exception):
    """A traced ``_launch`` did something the fast path cannot replay."""


def _driver_launch() -> Any:
    from cupy.cuda import driver

    return driver.launchKernel


def _probe(record: Any, slots: list[tuple[Operand, int]], shift: Callable[[int, int], int]) -> Any:
    """``record`` with each operand's pointer moved by ``shift(field, ptr)`` (null pointers stay)."""
    moved = {
        id(op): Operand(None, shift(field, op.ptr), op.shape, op.dtype_name, op.itemsize, op.contiguous, op.device_id)
        for op, field in slots
        if op.ptr
    }
    return type(record)(*(moved.get(id(item), item) if type(item) is Operand else item for item in record))


def _launch_tail(
    plan: Any, source: _Source, template: Any, slots: list[tuple[Operand, int]], workspace_ptr: int | None, handle: str
) -> bool:
    """Append to ``source`` the stores and launches of ``plan._launch`` for this signature
    (pointers in ``p<field>``, the workspace's in ``pw``); False when the trace does not resolve."""
    if not getattr(plan, "_launch_traceable", False) or "_launch" in getattr(plan, "__dict__", {}):
        return False
    prepared = plan._prepared
    saved = [ctypes.string_at(ctypes.addressof(lp.params), ctypes.sizeof(lp.params)) for lp in prepared]
    fields = sorted({field for _, field in slots})
    index = {field: n + 1 for n, field in enumerate(fields)}
    ws_index = len(fields) + 1

    def common(field: int, ptr: int) -> int:
        return ptr + _SHIFT

    def apart(field: int, ptr: int) -> int:
        return ptr + _UNIT * index[field]

    def workspace(shift: Callable[[int, int], int]) -> Any:
        return None if workspace_ptr is None else _ProbeWorkspace(shift(-1, workspace_ptr) if workspace_ptr else 0)

    index[-1] = ws_index
    try:
        traces = [
            _Trace(plan, _probe(template, slots, common), workspace(common), 0xA5),
            _Trace(plan, _probe(template, slots, common), workspace(common), 0x5A),
            _Trace(plan, _probe(template, slots, apart), workspace(apart), 0xA5),
        ]
    except Exception:  # a _launch reading more than the record's pointers: the generic tail
        return False
    finally:
        for launch, blob in zip(prepared, saved, strict=True):
            ctypes.memmove(ctypes.addressof(launch.params), blob, len(blob))
    first, second, third = (t.events for t in traces)
    if not first or len(first) != len(second) or len(first) != len(third):
        return False
    pointers = {n: f"p{field}" for field, n in index.items() if field >= 0}
    pointers[ws_index] = "pw"
    bases = {n: ptr for op, field in slots for n in [index[field]] if (ptr := op.ptr)}
    if workspace_ptr:
        bases[ws_index] = workspace_ptr
    stored: dict[tuple[int, tuple[str, ...]], str] = {}
    views: dict[tuple[int, tuple[str, ...]], str] = {}
    launcher = source.const(_driver_launch())
    #: Where every kernel launches once, the stores are made before the launches and only when needed:
    #: the constants when another call wrote the blocks since (see ``Plan._tail_owner``), the pointer
    #: fields also when a pointer differs from the last ones this function stored. Else every store is
    #: made every time, in launch order.
    once = len({id(event[0]) for event in first}) == len(first)
    constants: list[str] = []
    variable: list[str] = []
    used: set[str] = set()
    body: list[str] = []
    for number, ((launch, call, one), (launch2, call2, two), (launch3, call3, three)) in enumerate(
        zip(first, second, third, strict=True)
    ):
        if launch is not launch2 or launch is not launch3 or call != call2 or call != call3:
            return False
        fn, gx, gy, gz, bx, by, bz, smem, probe_handle, extra = call
        if probe_handle != _PROBE_HANDLE:
            return False
        try:
            leaves = _leaf_fields(type(launch.params))
        except TypeError:
            return False
        for path, offset, ctype in leaves:
            size = ctypes.sizeof(ctype)
            b1, b2, b3 = one[offset : offset + size], two[offset : offset + size], three[offset : offset + size]
            if b1 == bytes([0xA5]) * size and b2 == bytes([0x5A]) * size:
                continue  # not written: the value fixed at select
            if b1 != b2:
                return False  # a value that depends on the field's earlier content
            expr = _field_value(ctype, b1, b3, bases, pointers, source)
            if expr is None:
                return False
            key = (id(launch), path)
            if stored.get(key) == expr:
                continue
            stored[key] = expr
            target = views.get(key[:1] + (path[:-1],))
            if target is None:
                view: Any = launch.params
                for name in path[:-1]:
                    view = getattr(view, name)
                target = views[key[:1] + (path[:-1],)] = source.const(view)
            store = f"    {target}.{path[-1]} = {expr}"
            if not once:
                body.append(store)
            elif b1 == b3:
                constants.append(store)
            else:
                variable.append(store)
                used.add(expr.split(" ", 1)[0])
        arguments = f"{fn}, {gx}, {gy}, {gz}, {bx}, {by}, {bz}, {smem}, {handle}, {launch._kernel_params}, {extra}"
        if number == 0:  # a thread without a context fails here, before anything is enqueued: slow path
            body += ["    try:", f"        {launcher}({arguments})", "    except Exception:", "        return False"]
        else:
            body.append(f"    {launcher}({arguments})")
    cell = source.const(plan._tail_owner)
    if constants or variable:
        _owned_stores(source, cell, constants, variable, sorted(used, key=lambda name: (len(name), name)))
    elif body:  # stores in launch order: another function's stores (and their pointers) are gone
        source.lines.append(f"    {cell}[0] = None")
    source.lines += body
    return True


def _owned_stores(source: _Source, cell: str, constants: list[str], variable: list[str], used: list[str]) -> None:
    """The stores of a function whose kernels each launch once, made only when the argument blocks
    do not already hold them. ``Plan._tail_owner[0]`` is this function's token exactly while the
    blocks hold its last stores: every other writer (``_launch``, the generic tail, another
    signature's function, a front-end's launcher) sets the cell to None or to its own token first.
    The function's list holds the pointers of those last stores: the pointer fields are stored again
    only when one of them differs (a training loop reusing its buffers stores nothing)."""
    token = source.const(object())
    last = source.const([None] * len(used))
    remember = [f"        {last}[{n}] = {name}" for n, name in enumerate(used)]
    source.lines.append(f"    if {cell}[0] is not {token}:")
    source.lines += ["    " + line for line in constants + variable]
    source.lines.append(f"        {cell}[0] = {token}")
    if not variable:
        return
    source.lines += remember
    source.lines.append(f"    elif {' or '.join(f'{name} != {last}[{n}]' for n, name in enumerate(used))}:")
    source.lines += ["    " + line for line in variable]
    source.lines += remember


def _field_value(
    ctype: Any, b1: bytes, b3: bytes, bases: dict[int, int], pointers: dict[int, str], source: _Source
) -> str | None:
    """The expression of one written field: a constant, or a pointer variable plus a constant."""
    if b1 == b3:
        value = ctype.from_buffer_copy(b1).value
        if isinstance(value, float) and not math.isfinite(value) or value is None:
            return source.const(value)
        return repr(value)
    if ctype not in _INTEGER_FIELDS.get(len(b1), ()):
        return None
    v1, v3 = int.from_bytes(b1, "little"), int.from_bytes(b3, "little")
    for n, base in bases.items():
        if v3 - v1 == _UNIT * n - _SHIFT:
            delta = v1 - _SHIFT - base
            return (
                pointers[n] if delta == 0 else f"{pointers[n]} + {delta}" if delta > 0 else f"{pointers[n]} - {-delta}"
            )
    return None


class CallCache:
    """The remembered signatures of one plan (module docstring): ``fast[check]`` is the list of
    generated functions ``run`` tries, the newest first."""

    __slots__ = ("_count", "_run", "fast")

    def __init__(self) -> None:
        #: The plan's ``run`` made by :func:`_dispatcher` (set on the plan instance), None before.
        self._run: Any = None
        #: [unchecked functions, checked functions]: ``fast(args, workspace, stream) -> bool``.
        self.fast: tuple[list[FastCall], list[FastCall]] = ([], [])
        #: (checked, Args type) -> attempts to remember a call so far (at most REMEMBER_LIMIT).
        self._count: dict[tuple[bool, type], int] = {}

    def _names(self, checked: bool, kind: type) -> tuple[str, ...] | None:
        """The Args fields to remember a call by, or None (no fast path, or no attempt left: every
        attempt counts, also one that finds a value without a fast path)."""
        attempts = self._count.get((checked, kind), 0)
        if attempts >= REMEMBER_LIMIT:
            return None
        self._count[checked, kind] = attempts + 1
        return _args_fields(kind)

    def _add(self, plan: Any, checked: bool, fast: FastCall) -> None:
        entries = self.fast[checked]
        entries.insert(0, fast)
        del entries[KEEP:]
        if "run" not in getattr(plan, "__dict__", {"run": None}) or plan.__dict__["run"] is self._run:
            self._run = plan.run = _dispatcher(plan, self.fast[True][:1], self.fast[False][:1])

    def remember(self, plan: Any, stream: Any, workspace: Any, args: Any, record: Any) -> None:
        """Remember a call that passed ``_check_call`` (nothing when it has no fast path)."""
        names = self._names(True, type(args))
        key = _stream_key(stream)
        if names is None or key is None:
            return
        exprs = [f"a.{name}" for name in names]
        values = [getattr(args, name) for name in names]
        if workspace is not None:  # the workspace's buffer: one more array
            if type(getattr(workspace, "nbytes", None)) is not int:
                return
            exprs.append("w.buffer")
            values.append(getattr(workspace, "buffer", None))
        source = _Source("c")
        source.miss_if(f"type(a) is not {source.const(type(args))}")
        source.stream(stream, key)
        if workspace is None:
            source.miss_if("w is not None")
        else:
            source.miss_if(f"type(w) is not {source.const(type(workspace))} or w.nbytes != {workspace.nbytes!r}")
        ptrs: list[int] = []
        arrays: list[tuple[int, int, int]] = []
        for i, (expr, value) in enumerate(zip(exprs, values, strict=True)):
            ptrs.append(0)
            if value is None:
                source.miss_if(f"{expr} is not None")
            elif type(value) is int or type(value) is float:
                source.scalar(expr, value)
            else:
                props = _array_props(value)
                if props is None:
                    return
                source.array(expr, i, value, props)
                ptrs[i] = props[4]
                arrays.append((i, props[4], math.prod(props[1]) * props[5]))
        template = _operand_template(record, values, ptrs)
        if template is None:
            return
        source.relations(arrays)
        traced = self._tail(plan, source, template, workspace, repr(key[1]))
        self._add(plan, True, source.compile("a, w, s", traced))

    def remember_unchecked(self, plan: Any, stream: Any, workspace: Any, args: Any, record: Any) -> None:
        """Remember the layout of an unchecked call and its ``_extract`` record. Where the launch is
        traced, arrays are matched by type and pointer class alone (the caller vouches for the rest,
        as ``check=False`` says); else also by the properties the record carries."""
        names = self._names(False, type(args))
        if names is None or not isinstance(record, tuple) or plan.device_id is None:
            return
        try:
            stream_handle(stream)
        except Exception:  # a bad stream: run raises it every time
            return
        values = [getattr(args, name) for name in names]
        full = {id(item.obj) for item in record if type(item) is Operand and item.dtype_name}
        for pointers_only in (True, False):
            made = self._unchecked_source(plan, stream, workspace, args, record, names, values, full, pointers_only)
            if made is None:
                return
            source, traced = made
            if traced or not pointers_only:
                self._add(plan, False, source.compile("a, w, s", traced))
                return

    def _unchecked_source(
        self,
        plan: Any,
        stream: Any,
        workspace: Any,
        args: Any,
        record: Any,
        names: tuple[str, ...],
        values: list[Any],
        full: set[int],
        pointers_only: bool,
    ) -> tuple[_Source, bool] | None:
        """The generated function of an unchecked call, and whether its launch is traced."""
        source = _Source("u")
        source.miss_if(f"type(a) is not {source.const(type(args))}")
        ptrs: list[int] = []
        arrays: list[int] = []
        for i, (name, value) in enumerate(zip(names, values, strict=True)):
            expr = f"a.{name}"
            ptrs.append(0)
            if value is None:
                source.miss_if(f"{expr} is not None")
                continue
            if type(value) is int or type(value) is float:
                source.scalar(expr, value)
                continue
            props = _array_props(value)
            if props is None:
                return None
            if id(value) in full and not pointers_only:  # the record carries the array's properties
                source.array(expr, i, value, props)
            else:
                source.pointer(expr, i, value, props[4])
            ptrs[i] = props[4]
            for j in arrays:  # one array in two fields: the same pointer twice
                if values[j] is value:
                    source.miss_if(f"p{i} != p{j}")
            arrays.append(i)
        template = _operand_template(record, values, ptrs)
        if template is None:
            return None
        source.pointer_classes()
        source.device(plan.device_id)
        source.handle(stream)
        return source, self._tail(plan, source, template, workspace, "h")

    @staticmethod
    def _tail(
        plan: Any, source: _Source, template: tuple[Any, list[tuple[Operand, int]]], workspace: Any, handle: str
    ) -> bool:
        """The launch: traced stores and driver calls (True), else the record passed to ``_launch``."""
        if plan._empty:
            return True
        record, slots = template
        ws_ptr = None if workspace is None else int(getattr(workspace, "ptr", 0) or 0)
        lines = len(source.lines)
        if ws_ptr is not None:
            source.lines.append("    if w is None: return False")
            source.lines.append("    pw = w.ptr")
        if _launch_tail(plan, source, record, slots, ws_ptr, handle):
            return True
        del source.lines[lines:]
        for op, field in slots:
            source.lines.append(f"    {source.const(op)}.ptr = p{field}")
        # _launch writes the argument blocks (as in _run_slow): a traced function stores its constants again
        source.lines.append(f"    {source.const(plan._tail_owner)}[0] = None")
        source.lines.append(f"    {source.const(plan._launch)}({handle}, w, {source.const(record)})")
        return False


def _dispatcher(plan: Any, checked: list[Any], unchecked: list[Any]) -> Callable[..., None]:
    """The plan's ``run`` for its newest remembered signatures: ``run(stream, workspace, args, *,
    check=True)`` with the body of the newest generated function of each mode inline (no frame
    of its own), and ``Plan.run`` of the plan's class on a miss (the other remembered signatures,
    then the checks). A call takes the same path and launches the same as through ``Plan.run``."""
    names: dict[str, Any] = {"fallback": type(plan).run, "plan": plan}
    lines = ["def run(stream, workspace, args, *, check=True):", "    a = args", "    w = workspace", "    s = stream"]
    for test, fast in (("if check is True:", checked), ("if check is False:", unchecked)):
        if not fast:
            continue
        names.update(fast[0].names)
        lines += [f"    {test}", "        while True:"]
        lines += [
            "        " + (line[:-12] + "break" if line.endswith("return False") else line) for line in fast[0].body
        ]
        lines.append("            return")
    lines.append("    fallback(plan, stream, workspace, args, check=check)")
    exec(compile("\n".join(lines), "<quantplan run>", "exec"), names)
    return names["run"]  # type: ignore[no-any-return]


#: The workspace pointer a :func:`pointer_launcher` is traced with (any aligned, non-null address).
_WORKSPACE_PROBE = ALIGN_CLASS << 24


def pointer_launcher(
    plan: Any, args: Any, *, device_checked: bool = False, workspace: bool = False
) -> Callable[..., bool] | None:
    """``launch(h, p0, p1, ...) -> bool`` for a front-end that makes or vouches for every operand:
    the launches of ``plan.run(h, None, args, check=False)`` with the arrays of ``args`` (its
    array fields, in field order) at pointers ``p0, p1, ...`` on raw stream ``h``; scalars and
    None fields as in ``args``. False (nothing launched) when a pointer is of another alignment
    class or null-ness than in ``args``, or the current device is not the plan's (not tested with
    ``device_checked``: the caller made sure it is). With ``workspace``, a plan that needs one
    takes its pointer last (``launch(h, p0, ..., pw)``: a fresh buffer of ``workspace_size()``
    bytes, aligned as an allocation is). None when the plan has no traced tail for this call (a
    workspace without ``workspace``, an untraceable ``_launch``, the reference backend, an empty
    problem)."""
    kind: type = type(args)
    names = _args_fields(kind)
    if names is None or plan.device_id is None or plan._empty or plan._is_reference:
        return None
    if plan._workspace_bytes and not workspace:
        return None
    workspace_ptr = _WORKSPACE_PROBE if plan._workspace_bytes else None
    values = [getattr(args, name) for name in names]
    record = plan._extract(args)
    source = _Source()
    ptrs: list[int] = []
    params: list[str] = []
    for i, value in enumerate(values):
        ptrs.append(0)
        if value is None or type(value) in _PLAIN:
            continue
        props = _array_props(value)
        if props is None:
            return None
        ptrs[i] = props[4]
        params.append(f"p{i}")
        source.classes.append((f"p{i}", props[4]))
    template = _operand_template(record, values, ptrs)
    if template is None:
        return None
    if workspace_ptr is not None:
        params.append("pw")
        source.classes.append(("pw", workspace_ptr))
    source.pointer_classes()
    if not device_checked:
        source.device(plan.device_id)
    if not _launch_tail(plan, source, template[0], template[1], workspace_ptr, "h"):
        return None
    return source.compile(", ".join(["h", *params]), True)


__all__ = ["ALIGN_CLASS", "KEEP", "REMEMBER_LIMIT", "CallCache", "FastCall", "pointer_launcher"]
