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
from collections.abc import Callable
from operator import attrgetter
from typing import Any

from ._launch import stream_handle
from ._operands import _READERS, Operand, _cupy_operand, _cupy_operand_direct, _torch_operand, operand

#: Signatures kept per Args type and mode.
KEEP = 4
#: The pointer class of an array: its pointer mod ALIGN_CLASS (every alignment a check or a
#: launch asks for divides it), -1 for a null pointer.
ALIGN_CLASS = 256

#: Matches one value: its pointer (0 for a value that is no array), or -1 for a miss.
Matcher = Callable[[Any], int]
_PLAIN = (type(None), bool, int, float, str)


def _align(ptr: int) -> int:
    return ptr % ALIGN_CLASS if ptr else -1


def _array_props(value: Any) -> tuple[Any, tuple[int, ...], bool, int, int, int] | None:
    """(dtype, shape, contiguous, device, pointer, itemsize) of a CuPy / PyTorch array as the
    checks read it, or None for any other value (no fast path)."""
    reader = _READERS.get(type(value))
    if reader is _cupy_operand_direct or reader is _cupy_operand:
        op = operand(value, "")
        return (
            value.dtype,
            op.shape,
            op.contiguous,
            op.device_id if op.device_id is not None else -1,
            op.ptr,
            op.itemsize,
        )
    if reader is _torch_operand:
        op = operand(value, "")
        device = value.get_device()
        return value.dtype, tuple(op.shape), op.contiguous, device, op.ptr, op.itemsize
    return None


def _cupy_matcher(kind: Any, props: tuple[Any, ...], direct: bool) -> Matcher:
    dtype, shape, contiguous, device, ptr, _ = props
    align = _align(ptr)

    def match(v: Any) -> int:
        if type(v) is not kind or v.dtype is not dtype or v.shape != shape:
            return -1
        mem = v.data
        p: int = mem.ptr
        flag = v._c_contiguous if direct else v.flags.c_contiguous
        if flag is not contiguous or mem.device_id != device or (p % ALIGN_CLASS if p else -1) != align:
            return -1
        return p

    return match


def _torch_matcher(kind: Any, props: tuple[Any, ...]) -> Matcher:
    dtype, shape, contiguous, device, ptr, _ = props
    align = _align(ptr)

    def match(v: Any) -> int:
        if type(v) is not kind or v.dtype is not dtype or v.get_device() != device or v.shape != shape:
            return -1
        if v.is_contiguous() is not contiguous:
            return -1
        p: int = v.data_ptr() if device >= 0 else 0
        return p if (p % ALIGN_CLASS if p else -1) == align else -1

    return match


def _array_matcher(value: Any) -> tuple[Matcher, int, int] | None:
    """(matcher, pointer, byte size) of an array value, or None when it has no fast path."""
    props = _array_props(value)
    if props is None:
        return None
    reader = _READERS[type(value)]
    if reader is _torch_operand:
        matcher = _torch_matcher(type(value), props)
    else:
        matcher = _cupy_matcher(type(value), props, reader is _cupy_operand_direct)
    return matcher, props[4], math.prod(props[1]) * props[5]


def _none(v: Any) -> int:
    return 0 if v is None else -1


def _scalar_matcher(value: Any) -> Matcher:
    kind = type(value)
    sign = math.copysign(1.0, value) if kind is float else 1.0

    def match(v: Any) -> int:
        if type(v) is not kind or v != value or (not v and kind is float and math.copysign(1.0, v) != sign):
            return -1
        return 0

    return match


def _pointer_matcher(kind: Any) -> Matcher | None:
    """The pointer of any array of ``kind`` (``check=False``: the record carries only pointers)."""
    reader = _READERS.get(kind)
    if reader is _cupy_operand_direct or reader is _cupy_operand:

        def cupy_ptr(v: Any) -> int:
            return v.data.ptr if type(v) is kind else -1  # type: ignore[no-any-return]

        return cupy_ptr
    if reader is _torch_operand:

        def torch_ptr(v: Any) -> int:
            if type(v) is not kind:
                return -1
            return v.data_ptr() if v.get_device() >= 0 else 0  # type: ignore[no-any-return]

        return torch_ptr
    return None


def _workspace_matcher(workspace: Any) -> tuple[Matcher, int, int] | None:
    """A workspace: None, or the same type and ``nbytes`` with its buffer matched as an array."""
    if workspace is None:
        return _none, 0, -1
    buffer = getattr(workspace, "buffer", None)
    found = _array_matcher(buffer)
    if found is None:
        return None
    inner, ptr, size = found
    kind, nbytes = type(workspace), workspace.nbytes
    if type(nbytes) is not int:
        return None

    def match(w: Any) -> int:
        if type(w) is not kind or w.nbytes != nbytes:
            return -1
        return inner(w.buffer)

    return match, ptr, size


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


def _operand_template(
    record: Any, values: tuple[Any, ...], ptrs: list[int]
) -> tuple[Any, list[tuple[Operand, int]]] | None:
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


class _Entry:
    """One remembered call: the matchers of its fields, the pairwise range relations of its
    arrays, and the operand record with the pointers to rewrite."""

    __slots__ = ("active", "nones", "ptrs", "record", "relations", "slots", "stream")

    def __init__(
        self,
        matchers: list[Matcher],
        relations: list[tuple[int, int, int, int, bool, bool]],
        record: Any,
        slots: list[tuple[Operand, int]],
        stream: tuple[Any, ...] | None,
    ) -> None:
        #: The fields that must be None, and the others with their matchers.
        self.nones = tuple(i for i, m in enumerate(matchers) if m is _none)
        self.active = tuple((i, m) for i, m in enumerate(matchers) if m is not _none)
        self.ptrs = [0] * len(matchers)  # reused by every match (a plan runs on one thread)
        self.relations, self.record, self.slots, self.stream = relations, record, slots, stream

    def match(self, values: tuple[Any, ...]) -> Any:
        """The record for ``values`` (pointers written in), or None for a miss."""
        for i in self.nones:
            if values[i] is not None:
                return None
        ptrs = self.ptrs
        for i, matcher in self.active:
            p = matcher(values[i])
            if p < 0:
                return None
            ptrs[i] = p
        for i, j, size_i, size_j, same, shared in self.relations:
            a, b = ptrs[i], ptrs[j]
            if (a == b) is not same or bool(a and b and a < b + size_j and b < a + size_i) is not shared:
                return None
        for op, field in self.slots:
            op.ptr = ptrs[field]
        return self.record


def _relations(arrays: list[tuple[int, int, int]]) -> list[tuple[int, int, int, int, bool, bool]]:
    """(field i, field j, bytes i, bytes j, same start, shared byte) for every pair of arrays."""
    out = []
    for n, (i, a, size_a) in enumerate(arrays):
        for j, b, size_b in arrays[n + 1 :]:
            out.append((i, j, size_a, size_b, a == b, bool(a and b and a < b + size_b and b < a + size_a)))
    return out


def _args_getter(kind: type) -> Callable[[Any], tuple[Any, ...]] | None:
    """A reader of every field of an Args dataclass with slots (None for any other Args type)."""
    if not dataclasses.is_dataclass(kind) or "__dict__" in dir(kind) or not hasattr(kind, "__slots__"):
        return None
    names = [f.name for f in dataclasses.fields(kind)]
    if len(names) < 2:
        return None
    return attrgetter(*names)  # type: ignore[return-value]


class CallCache:
    """The remembered signatures of one plan (module docstring)."""

    __slots__ = ("_checked", "_getters", "_unchecked", "handle")

    def __init__(self) -> None:
        self._checked: dict[type, list[_Entry]] = {}
        self._unchecked: dict[type, list[_Entry]] = {}
        self._getters: dict[type, Callable[[Any], tuple[Any, ...]] | None] = {}
        #: The stream handle of the last checked hit (``run`` launches on it).
        self.handle = 0

    def _getter(self, kind: type) -> Callable[[Any], tuple[Any, ...]] | None:
        if kind not in self._getters:
            self._getters[kind] = _args_getter(kind)
        return self._getters[kind]

    # ---- checked ------------------------------------------------------------------------------

    def checked(self, stream: Any, workspace: Any, args: Any) -> Any:
        """The record of a call equal to a remembered one (``handle`` set), or None."""
        entries = self._checked.get(type(args))
        if entries is None:
            return None
        key = _stream_key(stream)
        values = (*self._getters[type(args)](args), workspace)  # type: ignore[misc]
        for entry in entries:
            if entry.stream == key:
                record = entry.match(values)
                if record is not None:
                    assert key is not None
                    self.handle = key[1]
                    return record
        return None

    def remember(self, stream: Any, workspace: Any, args: Any, record: Any) -> None:
        """Remember a call that passed ``_check_call`` (nothing when it has no fast path)."""
        getter = self._getter(type(args))
        key = _stream_key(stream)
        if getter is None or key is None:
            return
        values = (*getter(args), workspace)
        matchers: list[Matcher] = []
        ptrs: list[int] = []
        arrays: list[tuple[int, int, int]] = []
        last = len(values) - 1
        for i, value in enumerate(values):
            if i == last:
                found = _workspace_matcher(value)
            elif value is None:
                found = _none, 0, -1
            elif type(value) is int or type(value) is float:
                found = _scalar_matcher(value), 0, -1
            else:
                found = _array_matcher(value)
            if found is None:
                return
            matchers.append(found[0])
            ptrs.append(found[1])
            if found[2] >= 0:  # an array (the workspace's buffer included)
                arrays.append((i, found[1], found[2]))
        template = _operand_template(record, values, ptrs)
        if template is None:
            return
        entry = _Entry(matchers, _relations(arrays), template[0], template[1], key)
        self._checked[type(args)] = [entry, *self._checked.get(type(args), [])][:KEEP]

    # ---- unchecked ----------------------------------------------------------------------------

    def unchecked(self, args: Any) -> Any:
        """The ``_extract`` record of a call laid out as a remembered one, or None."""
        entries = self._unchecked.get(type(args))
        if entries is None:
            return None
        values = self._getters[type(args)](args)  # type: ignore[misc]
        for entry in entries:
            record = entry.match(values)
            if record is not None:
                return record
        return None

    def remember_unchecked(self, args: Any, record: Any) -> None:
        """Remember the layout of an unchecked call and its ``_extract`` record."""
        getter = self._getter(type(args))
        if getter is None:
            return
        values = getter(args)
        full = (
            {id(item.obj) for item in record if type(item) is Operand and item.dtype_name}
            if isinstance(record, tuple)
            else set()
        )
        matchers: list[Matcher] = []
        ptrs: list[int] = []
        for value in values:
            found: Matcher | tuple[Matcher, int, int] | None
            if value is None:
                found, ptr = _none, 0
            elif type(value) is int or type(value) is float:
                found, ptr = _scalar_matcher(value), 0
            elif id(value) in full:  # the record carries the array's properties: match them all
                array = _array_matcher(value)
                if array is None:
                    return
                found, ptr = array[0], array[1]
            else:
                found = _pointer_matcher(type(value))
                ptr = found(value) if found is not None else -1
            if found is None or ptr < 0:
                return
            matchers.append(found)
            ptrs.append(ptr)
        template = _operand_template(record, values, ptrs)
        if template is None:
            return
        arrays = [i for i, v in enumerate(values) if v is not None and type(v) is not int and type(v) is not float]
        same = [
            (i, j, 0, 0, True, False) for n, i in enumerate(arrays) for j in arrays[n + 1 :] if values[i] is values[j]
        ]
        entry = _Entry(matchers, same, template[0], template[1], None)  # one array twice: the same pointer twice
        self._unchecked[type(args)] = [entry, *self._unchecked.get(type(args), [])][:KEEP]


__all__ = ["ALIGN_CLASS", "KEEP", "CallCache"]
