"""The fast path of ``Plan.run`` on CUDA: a per-plan cache of call signatures that passed the checks.

A checked call that passes ``Plan._check_call`` leaves its *signature* here:

* per Args field (every dataclass field, in order): None; a Python ``int`` / ``float`` (its type
  and exact value, the sign of zero included); or an array (its type, dtype object, shape,
  contiguity, device and pointer class: pointer mod 256, or -1 for a null pointer);
* the workspace: None, or its type, ``nbytes`` and its buffer as an array;
* the pairwise relation of the arrays' byte ranges (same start; shared byte, as
  :func:`quantplan._operands.overlaps` computes it);
* the stream (type and handle) and the current device.

The checks read nothing else (they are pure functions of these), so a later call with an equal
signature gets the same verdict and the same operand record, but for the pointers: the record is
the remembered one with the new pointers written into its operands. Anything else (another
dtype, shape, device, alignment, overlap, scalar, a NumPy scalar, a list...) is a miss: the call
goes through ``_check_call`` again, which raises the detailed error or passes and is remembered.
A few signatures per Args type are kept, the newest first.

``check=False`` has its own cache, keyed on the layout of the call (which fields are None,
scalars and their values, array types; the full array properties where ``_extract``'s record
carries them), filled from ``_extract``; a hit writes only the pointers.

The remembered records hold no reference to the caller's arrays (``Operand.obj`` is None): the
CUDA launches read pointers and sizes only. A plan is not for concurrent ``run`` from several
threads (see :mod:`quantplan._launch`); the records are reused across calls.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable
from typing import Any

from . import _launch
from ._launch import stream_handle
from ._operands import _READERS, Operand, _cupy_operand, _cupy_operand_direct, _torch_operand, operand

#: Signatures kept per Args type and mode.
KEEP = 4
#: Signatures a plan tries to remember per Args type and mode over its life (each costs a code
#: generation, a few hundred microseconds): calls whose scalars change every time (a Philox offset
#: counting up), or that hold a value without a fast path (a NumPy scalar), stop being remembered
#: after these and take the checks, at no extra cost.
REMEMBER_LIMIT = 8
#: The pointer class of an array: its pointer mod ALIGN_CLASS (every alignment a check or a
#: launch asks for divides it), -1 for a null pointer.
ALIGN_CLASS = 256

_PLAIN = (type(None), bool, int, float, str)


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


class _Source:
    """The source of one generated matcher: straight-line tests of one remembered call, each
    ``return None`` on a difference, then the new pointers written into the record."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.names: dict[str, Any] = {"copysign": math.copysign}

    def const(self, value: Any) -> str:
        """A name for ``value`` in the generated function's globals."""
        name = f"k{len(self.names)}"
        self.names[name] = value
        return name

    def miss_if(self, condition: str) -> None:
        self.lines.append(f"    if {condition}: return None")

    def stream(self, stream: Any, key: tuple[Any, ...]) -> None:
        """The stream: same type and handle (read as ``stream_handle`` reads it), same current device."""
        kind, handle, device = key
        if kind is int:
            self.miss_if(f"type(s) is not int or s != {handle!r}")
        elif kind in _launch._PTR_STREAMS:  # a CuPy stream: its .ptr
            self.miss_if(f"type(s) is not {self.const(kind)} or 'cuda_stream' in s.__dict__ or s.ptr != {handle!r}")
        elif kind.__module__.startswith("torch.") and type(getattr(stream, "cuda_stream", None)) is int:
            self.miss_if(f"type(s) is not {self.const(kind)} or s.cuda_stream != {handle!r}")
        else:  # None (CuPy's current stream) and any other stream: read as the checks would
            self.miss_if(f"{self.const(_stream_key)}(s) != {self.const(key)}")
            return
        self.miss_if(f"{self.const(sys.modules[__name__])}.current_device() != {device!r}")

    def scalar(self, expr: str, value: Any) -> None:
        """An exact Python int / float (type, value, and the sign of a float zero)."""
        test = f"type({expr}) is not {type(value).__name__} or {expr} != {self.const(value)}"
        if type(value) is float and value == 0:
            test += f" or copysign(1.0, {expr}) != {math.copysign(1.0, value)!r}"
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
        self.miss_if(f"{p} % {ALIGN_CLASS} != {ptr % ALIGN_CLASS} or not {p}" if ptr else p)

    def pointer(self, expr: str, i: int, value: Any) -> None:
        """Any array of the remembered type: its pointer only (``check=False``)."""
        v, p = f"v{i}", f"p{i}"
        self.lines.append(f"    {v} = {expr}")
        self.miss_if(f"type({v}) is not {self.const(type(value))}")
        if _READERS[type(value)] is _torch_operand:
            self.lines.append(f"    {p} = {v}.data_ptr() if {v}.get_device() >= 0 else 0")
        else:
            self.lines.append(f"    {p} = {v}.data.ptr")

    def relations(self, arrays: list[tuple[int, int, int]]) -> None:
        """The pairwise relation of the arrays' byte ranges: same start, shared byte (``overlaps``)."""
        for n, (i, a, size_a) in enumerate(arrays):
            for j, b, size_b in arrays[n + 1 :]:
                same, shared = a == b, bool(a and b and a < b + size_b and b < a + size_a)
                pi, pj = f"p{i}", f"p{j}"
                if a and b and not same and not shared:  # the common case: two disjoint arrays
                    self.miss_if(f"{pi} < {pj} + {size_b} and {pj} < {pi} + {size_a} or {pi} == {pj}")
                else:
                    self.miss_if(
                        f"({pi} == {pj}) is not {same} or bool({pi} and {pj} and {pi} < {pj} + {size_b} "
                        f"and {pj} < {pi} + {size_a}) is not {shared}"
                    )

    def compile(self, params: str, record: Any, slots: list[tuple[Operand, int]]) -> Callable[..., Any]:
        """The matcher: the record with the new pointers, or None."""
        for op, field in slots:
            self.lines.append(f"    {self.const(op)}.ptr = p{field}")
        self.lines.append(f"    return {self.const(record)}")
        namespace = dict(self.names)
        exec(compile(f"def match({params}):\n" + "\n".join(self.lines), "<quantplan fast check>", "exec"), namespace)
        return namespace["match"]  # type: ignore[no-any-return]


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


def _args_fields(kind: type) -> list[str] | None:
    """The fields of an Args dataclass with slots (None for any other Args type: no fast path)."""
    if not dataclasses.is_dataclass(kind) or "__dict__" in dir(kind) or not hasattr(kind, "__slots__"):
        return None
    return [f.name for f in dataclasses.fields(kind)]


class CallCache:
    """The remembered signatures of one plan (module docstring)."""

    __slots__ = ("_checked", "_count", "_fields", "_unchecked", "handle")

    def __init__(self) -> None:
        #: Args type -> [(stream handle, matcher(args, workspace, stream))], the newest first.
        self._checked: dict[type, list[tuple[int, Callable[[Any, Any, Any], Any]]]] = {}
        #: Args type -> [matcher(args)] of ``check=False`` calls.
        self._unchecked: dict[type, list[Callable[[Any], Any]]] = {}
        self._fields: dict[type, list[str] | None] = {}
        #: (checked, Args type) -> attempts to remember a call so far (at most REMEMBER_LIMIT).
        self._count: dict[tuple[bool, type], int] = {}
        #: The stream handle of the last checked hit (``run`` launches on it).
        self.handle = 0

    def _names(self, checked: bool, kind: type) -> list[str] | None:
        """The Args fields to remember a call by, or None (no fast path, or no attempt left: every
        attempt counts, also one that finds a value without a fast path)."""
        attempts = self._count.get((checked, kind), 0)
        if attempts >= REMEMBER_LIMIT:
            return None
        self._count[checked, kind] = attempts + 1
        if kind not in self._fields:
            self._fields[kind] = _args_fields(kind)
        return self._fields[kind]

    @staticmethod
    def _add(entries: dict[type, list[Any]], kind: type, entry: Any) -> None:
        entries[kind] = [entry, *entries.get(kind, [])][:KEEP]

    # ---- checked ------------------------------------------------------------------------------

    def checked(self, stream: Any, workspace: Any, args: Any) -> Any:
        """The record of a call equal to a remembered one (``handle`` set), or None."""
        entries = self._checked.get(type(args))
        if entries is None:
            return None
        for handle, match in entries:
            record = match(args, workspace, stream)
            if record is not None:
                self.handle = handle
                return record
        return None

    def remember(self, stream: Any, workspace: Any, args: Any, record: Any) -> None:
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
        source = _Source()
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
        self._add(self._checked, type(args), (key[1], source.compile("a, w, s", *template)))

    # ---- unchecked ----------------------------------------------------------------------------

    def unchecked(self, args: Any) -> Any:
        """The ``_extract`` record of a call laid out as a remembered one, or None."""
        entries = self._unchecked.get(type(args))
        if entries is None:
            return None
        for match in entries:
            record = match(args)
            if record is not None:
                return record
        return None

    def remember_unchecked(self, args: Any, record: Any) -> None:
        """Remember the layout of an unchecked call and its ``_extract`` record."""
        names = self._names(False, type(args))
        if names is None or not isinstance(record, tuple):
            return
        values = [getattr(args, name) for name in names]
        full = {id(item.obj) for item in record if type(item) is Operand and item.dtype_name}
        source = _Source()
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
                return
            if id(value) in full:  # the record carries the array's properties: match them all
                source.array(expr, i, value, props)
            else:
                source.pointer(expr, i, value)
            ptrs[i] = props[4]
            for j in arrays:  # one array in two fields: the same pointer twice
                if values[j] is value:
                    source.miss_if(f"p{i} != p{j}")
            arrays.append(i)
        template = _operand_template(record, values, ptrs)
        if template is None:
            return
        self._add(self._unchecked, type(args), source.compile("a", *template))


__all__ = ["ALIGN_CLASS", "KEEP", "REMEMBER_LIMIT", "CallCache"]
