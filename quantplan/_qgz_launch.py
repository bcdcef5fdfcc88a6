"""Launch machinery shared by the qgZ plans (SwizzledQuantizePlan, DequantReducePlan).

Both plans quantize a *source* (the input, ``x + e``, or a sum of dequantized peers) in groups
with ``kernels/qp_qgz.cuh``. Their launches come in two shapes, fixed at ``select``:

* **fused**: one launch, a team of threads holds each group in registers (one read); groups of
  at most ``MAX_TEAM * 32`` elements, 4-bit codes with even groups. An element-I/O twin serves
  operands whose pointers are not aligned to the vector width.
* **two-pass**: any group size: ``*_group_params`` (a block scans each group and writes its
  parameters), then ``*_elements`` (every element again, quantized with its group's parameters).

This module holds the kernels' by-value structures (mirrors of the C++ structs), the choice
between the shapes and the per-call pointer writes.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ._device import DeviceInfo
from ._launch import PreparedLaunch, launch_on
from ._operands import Operand
from .dynamic_range import MAX_TEAM, SegmentGeometry, SegmentLayoutArgs, fused_segment_geometry
from .elements import ELEMENTS
from .types import ElementKind, QuantMode

#: Threads of a block of the element pass (``__launch_bounds__(256)``).
ELEMENT_BLOCK = 256
#: Elements one thread of the fused pass holds (the scan element is float32 or 16-bit: 32).
QGZ_ELEMENTS_PER_THREAD = 32


class QgzOutputArgs(ctypes.Structure):
    """``struct QgzOutputArgs`` of ``kernels/qp_qgz.cuh``."""

    _fields_ = [
        ("q", ctypes.c_uint64),
        ("scale_out", ctypes.c_uint64),
        ("zp_out", ctypes.c_uint64),
        ("error", ctypes.c_uint64),
        ("beta", ctypes.c_float),
        ("one_minus_beta", ctypes.c_float),
    ]


class SwizzleMapArgs(ctypes.Structure):
    """``struct SwizzleMap`` of ``kernels/qp_qgz.cuh``."""

    _fields_ = [
        ("slice_groups", ctypes.c_int64),
        ("nodes", ctypes.c_int32),
        ("devices_per_node", ctypes.c_int32),
        ("pipeline", ctypes.c_int32),
        ("pad", ctypes.c_int32),
    ]


class PeerSumArgs(ctypes.Structure):
    """``struct PeerSumArgs`` of ``kernels/qp_qgz.cuh``."""

    _fields_ = [
        ("q", ctypes.c_uint64),
        ("scale", ctypes.c_uint64),
        ("zp", ctypes.c_uint64),
        ("peer_bytes", ctypes.c_int64),
        ("peer_params", ctypes.c_int64),
        ("in_group", ctypes.c_int64),
        ("peers", ctypes.c_int32),
        ("average", ctypes.c_int32),
        ("peers_f", ctypes.c_float),
        ("in_group_shift", ctypes.c_int32),
    ]


def error_tag(kind: ElementKind | None) -> str:
    """The kernels' ``Err`` template argument: the buffer's element tag, or ``qp::no_error``."""
    return "qp::no_error" if kind is None else ELEMENTS[kind].cpp_tag


def layout_args(
    groups: int, group_size: int, team: int, q_min: int, q_max: int, mode: QuantMode, own_range: bool = False
) -> SegmentLayoutArgs:
    """The kernels' ``SegmentLayout``: ``groups`` groups of ``group_size``, teams of ``team`` threads.

    Its ``mode``: 0 SYMMETRIC (|x|max), 1 ASYMMETRIC with the range widened to hold zero (SPEC
    section 4), 2 ASYMMETRIC over the group's own min / max (``own_range``: the DeepSpeed formats).
    """
    code = 0 if mode is QuantMode.SYMMETRIC else 2 if own_range else 1
    return SegmentLayoutArgs(groups, group_size, team.bit_length() - 1, q_min, q_max, code, 0)


def qgz_geometry(
    groups: int, group_size: int, packed: bool, vec_max: int, info: DeviceInfo
) -> tuple[SegmentGeometry, SegmentGeometry] | None:
    """The fused pass's geometry for aligned operands and its element-I/O twin, or None (two-pass)."""
    busy = info.sm_count * 2048
    primary = fused_segment_geometry(groups, group_size, packed, QGZ_ELEMENTS_PER_THREAD, vec_max, busy)
    if primary is None:
        return None
    fallback = fused_segment_geometry(groups, group_size, packed, QGZ_ELEMENTS_PER_THREAD, 1, busy)
    assert fallback is not None
    return primary, fallback


def occupancy_grid(function: Any, block: int, wanted: int, info: DeviceInfo) -> int:
    """Blocks to launch: ``wanted``, at most the resident blocks of every multiprocessor."""
    import cupy

    per_sm = max(1, cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(function.ptr, block, 0))
    return max(1, min(wanted, per_sm * info.sm_count))


def group_params_block(group_size: int) -> int:
    """Threads of a block of the group-parameter pass: a power of two, 32 to ``MAX_TEAM``, about one per element."""
    block = 32
    while block < min(group_size, MAX_TEAM):
        block *= 2
    return block


@dataclass
class QgzLaunches:
    """The launches of one qgZ plan.

    ``fused`` / ``fused_fallback`` (aligned operands / any alignment), or ``two_pass`` (group
    parameters, then elements). ``alignments``: (field name, bytes) pairs the fused launch's
    vector I/O needs; ``describe`` names the variant for KernelSku.
    """

    fused: PreparedLaunch | None
    fused_fallback: PreparedLaunch | None
    two_pass: tuple[PreparedLaunch, ...]
    alignments: tuple[int, ...]
    describe: str

    def chosen(self, pointers: tuple[int, ...]) -> tuple[PreparedLaunch, ...]:
        """The launches for operands at ``pointers`` (in the order of ``alignments``)."""
        if self.fused is None:
            return self.two_pass
        assert self.fused_fallback is not None
        if all(p % a == 0 for p, a in zip(pointers, self.alignments, strict=True)):
            return (self.fused,)
        return (self.fused_fallback,)

    def run(self, device_id: int, handle: int, pointers: tuple[int, ...], set_fields: Any) -> None:
        """Write the per-call fields with ``set_fields(params)`` into each chosen launch and enqueue them."""
        launches = self.chosen(pointers)
        for launch in launches:
            set_fields(launch.params)
        launch_on(device_id, handle, *launches)


@dataclass(frozen=True)
class QgzKernels:
    """One plan's loaded kernels and the fields every launch of it fixes at ``select``.

    ``segments(vec, vector_io)``: the fused pass at a vector width; ``group_params`` /
    ``elements``: the two-pass kernels; ``params_type``: the kernels' argument block (shared by
    all three); ``fixed``: its fields known at ``select`` (``layout`` is added here).
    """

    segments: Callable[[int, bool], Any]
    group_params: Any
    elements: Any
    params_type: type[ctypes.Structure]
    fixed: dict[str, Any]


def prepare_qgz_launches(
    kernels: QgzKernels,
    geometry: tuple[SegmentGeometry, SegmentGeometry] | None,
    groups: int,
    group_size: int,
    element_units: int,
    q_min: int,
    q_max: int,
    mode: QuantMode,
    alignment_bits: Sequence[int],
    info: DeviceInfo,
    own_range: bool = False,
) -> QgzLaunches:
    """The launches of a qgZ plan: the fused pass (``geometry``: aligned and element-I/O twins)
    or, where ``geometry`` is None, the two passes (``element_units``: work items of the element
    pass, pairs for 4-bit codes). ``alignment_bits``: the element bits of each operand the
    fused pass moves in vectors, in the order the plan passes its pointers to ``run``;
    ``own_range``: see :func:`layout_args`."""
    fixed = kernels.fixed
    if geometry is not None:
        primary, fallback = geometry

        def fused(g: SegmentGeometry) -> PreparedLaunch:
            fn = kernels.segments(g.vec, g.vector_io)
            wanted = -(-g.segments // (g.block // g.team))
            layout = layout_args(groups, group_size, g.team, q_min, q_max, mode, own_range)
            grid = occupancy_grid(fn, g.block, wanted, info)
            return PreparedLaunch(fn, grid, g.block, kernels.params_type, layout=layout, **fixed)

        aligns = tuple(vector_alignment(primary.vec, b) for b in alignment_bits)
        return QgzLaunches(fused(primary), fused(fallback), (), aligns, primary.describe())
    block = group_params_block(group_size)
    layout = layout_args(groups, group_size, 1, q_min, q_max, mode, own_range)
    params_fn, elements_fn = kernels.group_params, kernels.elements
    element_grid = occupancy_grid(elements_fn, ELEMENT_BLOCK, -(-element_units // ELEMENT_BLOCK), info)
    two_pass = (
        PreparedLaunch(
            params_fn,
            occupancy_grid(params_fn, block, groups, info),
            block,
            kernels.params_type,
            layout=layout,
            **fixed,
        ),
        PreparedLaunch(elements_fn, element_grid, ELEMENT_BLOCK, kernels.params_type, layout=layout, **fixed),
    )
    return QgzLaunches(None, None, two_pass, (), f"two-pass[group-params({block}t),elements]")


def log2_or_minus_one(value: int) -> int:
    """log2(value) for a power of two (the kernels then shift instead of dividing), else -1."""
    return value.bit_length() - 1 if value & (value - 1) == 0 else -1


def widest_dividing(value: int, widest: int) -> int:
    """The largest power of two <= ``widest`` that divides ``value``."""
    vec = widest
    while value % vec:
        vec //= 2
    return vec


def prepare_float_values(
    kernel: Callable[[int, bool], Any],
    params_type: type[ctypes.Structure],
    peer_input: PeerSumArgs,
    n: int,
    vec_in: int,
    code_kind: ElementKind,
    out_kind: ElementKind,
    info: DeviceInfo,
) -> QgzLaunches:
    """The launches writing a peer sum's ``n`` float values (``kernel(vec, vector_io)``, argument
    block ``params_type`` with fields ``input``, ``y``, ``n``): vectors of ``vec_in`` (a divisor of
    the input group size; 4-bit codes need 2) and the element-I/O twin. Pointer order for
    ``run``: the codes, the second peer's codes, the output."""
    code, out = ELEMENTS[code_kind], ELEMENTS[out_kind]
    vec = vec_in if (vec_in >= 2 or not code.is_packed) else 1

    def values(v: int, vector_io: bool) -> PreparedLaunch:
        fn = kernel(v, vector_io)
        wanted = -(-n // (v * ELEMENT_BLOCK))
        return PreparedLaunch(fn, occupancy_grid(fn, ELEMENT_BLOCK, wanted, info), ELEMENT_BLOCK, params_type, n=n)

    fallback = values(1, False)
    primary = values(vec, True) if vec > 1 else fallback
    aligns = (vector_alignment(vec, code.storage_bits),) * 2 + (vector_alignment(vec, out.storage_bits),)
    for launch in (primary, fallback):
        launch.params.input = peer_input  # type: ignore[attr-defined]
    return QgzLaunches(primary, fallback, (), aligns, f"float-sum[vec{vec}]")


def set_output_args(
    out: QgzOutputArgs, y: Operand, scale: Operand | None, zp: Operand | None, error: Operand | None
) -> None:
    """The per-call pointers of ``QgzOutputArgs`` (0 where absent)."""
    out.q = y.ptr
    out.scale_out = 0 if scale is None else scale.ptr
    out.zp_out = 0 if zp is None else zp.ptr
    out.error = 0 if error is None else error.ptr


def vector_alignment(vec: int, element_bits: int) -> int:
    """Bytes of alignment a vector of ``vec`` elements of ``element_bits`` bits needs (at most 16)."""
    return max(1, min(16, vec * element_bits // 8))


__all__ = [
    "ELEMENT_BLOCK",
    "PeerSumArgs",
    "QgzKernels",
    "QgzLaunches",
    "QgzOutputArgs",
    "SwizzleMapArgs",
    "error_tag",
    "group_params_block",
    "layout_args",
    "log2_or_minus_one",
    "occupancy_grid",
    "prepare_float_values",
    "prepare_qgz_launches",
    "qgz_geometry",
    "set_output_args",
    "vector_alignment",
    "widest_dividing",
]
