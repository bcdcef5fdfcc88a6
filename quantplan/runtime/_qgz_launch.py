"""Launch machinery shared by the qgZ plans (SwizzledQuantizePlan, DequantReducePlan).

Both plans quantize a *source* (the input, ``x + e``, or a sum of dequantized peers) in groups
with ``kernels/qp_qgz.cuh``. Their launches come in two shapes, fixed at ``select``:

* **fused**: one launch, a team of threads holds each group in registers (one read); groups of
  at most ``MAX_TEAM * 32`` elements, 4-bit codes with even groups. An element-I/O twin serves
  operands whose pointers are not aligned to the vector width.
* **two-pass**: any group size: ``*_group_params`` (a block scans each group and writes its
  parameters), then ``*_elements`` (every element again, quantized with its group's parameters).

This module holds what the qgZ plans and the DeepSpeed-format plans of :mod:`quantplan.compat`
share: the descriptor checks (element kinds, code range, LoCo), the operand checks
(:class:`QgzChecks`), the kernels' by-value structures (mirrors of the C++ structs), the choice
between the shapes and the per-call pointer writes.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import numpy as np

from quantplan.runtime._device import DeviceInfo
from quantplan.runtime._kernel_names import QGZ_CODE_KINDS, QGZ_FLOAT_KINDS
from quantplan.runtime._launch import PreparedLaunch, fields, occupancy_grid, vector_alignment
from quantplan.runtime._operands import Operand, OperandChecks, host_view, is_scalar, pointer_view, write_back
from quantplan.runtime._segment_geometry import (
    DENSE_MAX_ELEMENTS,
    MAX_TEAM,
    QGZ_ELEMENTS_PER_THREAD,
    SegmentGeometry,
    fused_segment_geometry,
    segment_layout,
)
from quantplan.runtime._tuning import TUNING
from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.errors import InvalidProblem, Unsupported
from quantplan.vocabulary.formats import BLOCK_ONLY_KINDS, format_of
from quantplan.vocabulary.types import ElementKind, QuantMode

#: Threads of a block of the element pass (``__launch_bounds__(256)``).
ELEMENT_BLOCK = 256
#: Threads of a block of the dense passes (``QP_QGZ_DENSE_BLOCK`` of ``kernels/qp_qgz.cuh``).
DENSE_BLOCK = TUNING.qgz_dense_block


class QgzOutputArgs(ctypes.Structure):
    """``struct QgzOutputArgs`` of ``kernels/qp_qgz.cuh``."""

    _fields_ = [
        *fields(ctypes.c_uint64, "q", "scale_out", "zp_out", "error"),
        *fields(ctypes.c_float, "beta", "one_minus_beta"),
    ]


class SwizzleMapArgs(ctypes.Structure):
    """``struct SwizzleMap`` of ``kernels/qp_qgz.cuh``."""

    _fields_ = [
        ("slice_groups", ctypes.c_int64),
        *fields(ctypes.c_int32, "nodes", "devices_per_node", "pipeline", "pad"),
    ]


class PeerSumArgs(ctypes.Structure):
    """``struct PeerSumArgs`` of ``kernels/qp_qgz.cuh``."""

    _fields_ = [
        *fields(ctypes.c_uint64, "q", "scale", "zp"),
        *fields(ctypes.c_int64, "peer_bytes", "peer_params", "in_group"),
        *fields(ctypes.c_int32, "peers", "average"),
        ("peers_f", ctypes.c_float),
        ("in_group_shift", ctypes.c_int32),
    ]


# ---- descriptor checks ----------------------------------------------------------------------------


def check_float_kind(kind: ElementKind, name: str) -> None:
    """F16 / BF16 / F32 pass; F64 is Unsupported (no qgZ kernel for it); anything else InvalidProblem."""
    if kind in QGZ_FLOAT_KINDS:
        return
    if kind is ElementKind.F64:
        raise Unsupported(f"{name}=F64 is not served by the qgZ plans; use F32, BF16 or F16")
    raise InvalidProblem(f"{name} must be one of F16, BF16, F32, got {kind.name}")


def check_code_kind(kind: ElementKind, name: str) -> None:
    """S8 / U8 / S4 / U4 pass; FP8 and the block-scaled elements are Unsupported here; anything
    else InvalidProblem."""
    if kind in QGZ_CODE_KINDS:
        return
    if ELEMENTS[kind].is_fp8 or kind in BLOCK_ONLY_KINDS:
        raise Unsupported(f"{name}={kind.name}: the qgZ plans write integer codes only (S8, U8, S4, U4)")
    raise InvalidProblem(f"{name} must be one of S8, U8, S4, U4, got {kind.name}")


def check_error_kind(kind: ElementKind | None) -> None:
    """The LoCo error buffer element: None (no error feedback) or F16 / BF16 / F32."""
    if kind is not None and kind not in QGZ_FLOAT_KINDS:
        raise InvalidProblem(f"error_element must be None or one of F16, BF16, F32, got {kind.name}")


def dynamic_code_range(mode: QuantMode, code: ElementKind, q_min: int | None, q_max: int | None) -> tuple[int, int]:
    """The code range of dynamic-range quantization to ``code``: the kind's default range,
    optionally narrowed; SYMMETRIC needs ``q_max > 0``, ASYMMETRIC ``q_min < q_max`` (InvalidProblem)."""
    full = format_of(code).element.code_range
    assert full is not None
    lo = full[0] if q_min is None else q_min
    hi = full[1] if q_max is None else q_max
    if not (full[0] <= lo <= full[1] and full[0] <= hi <= full[1]):
        raise InvalidProblem(f"q_min={lo}, q_max={hi} fall outside the {code.name} range {full}; narrow within it")
    if mode is QuantMode.SYMMETRIC and hi <= 0:
        raise InvalidProblem(f"SYMMETRIC dynamic range needs q_max > 0 (scale = amax / q_max), got q_max={hi}")
    if mode is QuantMode.ASYMMETRIC and lo >= hi:
        raise InvalidProblem(f"ASYMMETRIC dynamic range needs q_min < q_max, got q_min={lo}, q_max={hi}")
    if lo > hi:
        raise InvalidProblem(f"q_min={lo} > q_max={hi}; q_min must not exceed q_max")
    return lo, hi


def check_beta(value: Any) -> float:
    """LoCo's ``error_beta``: a real number in [0, 1] (InvalidProblem otherwise)."""
    if not is_scalar(value) or isinstance(value, (bool, np.bool_)):
        raise InvalidProblem(f"error_beta={value!r} must be a Python or NumPy real number in [0, 1]")
    beta = float(value)
    if not (math.isfinite(beta) and 0.0 <= beta <= 1.0):
        raise InvalidProblem(f"error_beta={value!r} must lie in [0, 1] (e <- beta * e + (1 - beta) * residual)")
    return beta


class QgzOperands(NamedTuple):
    """Operands of one qgZ or DeepSpeed-format run: ``x`` the data read (floats, or the peers'
    codes) with its parameters ``params`` / ``zp`` (None where the plan computes them), the output
    ``y`` with its parameters ``params_out`` / ``zp_out``, the LoCo buffer ``err`` with
    ``(b, 1 - b)``, and the Philox seed / offset (MoQ)."""

    x: Operand
    params: Operand | None
    zp: Operand | None
    y: Operand
    params_out: Operand | None
    zp_out: Operand | None
    err: Operand | None = None
    beta: float = 0.0
    one_minus_beta: float = 1.0
    seed: Any = None
    offset: Any = None


class QgzChecks(OperandChecks):
    """Operand checks of the qgZ and DeepSpeed-format plans: flat tensors of a given shape and
    kind (no parameter scope), and the LoCo error buffer with its beta."""

    _param_shape: tuple[int, ...] = ()
    _tensor_scope = False
    #: ``check=False``: the Args attributes of the QgzOperands fields ``x`` to ``err`` (an
    #: attribute the Args lack reads as None: SwizzledQuantizeArgs has no ``scale``); then
    #: ``error_beta``, ``rng_seed``, ``rng_offset``.
    _extract_fields: ClassVar[tuple[str, ...]] = (
        "input",
        "scale",
        "zero_point",
        "output",
        "scale_out",
        "zero_point_out",
        "error_feedback",
    )

    def _extract(self, args: Any) -> QgzOperands:
        x, params, zp, y, params_out, zp_out, err = (
            pointer_view(getattr(args, name, None), name) for name in self._extract_fields
        )
        beta = getattr(args, "error_beta", None)
        b, c = beta_pair(0.0 if beta is None else float(beta))
        seed, offset = getattr(args, "rng_seed", None), getattr(args, "rng_offset", None)
        return QgzOperands(x, params, zp, y, params_out, zp_out, err, b, c, seed, offset)

    def _loco(
        self, error: Any, beta: Any, shape: tuple[int, ...], kind: ElementKind | None
    ) -> tuple[Operand | None, float]:
        """The error buffer and beta of LoCo error feedback, or (None, 0.0) when the plan has none."""
        if kind is None:
            if error is not None or beta is not None:
                raise InvalidProblem(
                    "error_feedback / error_beta given, but the descriptor has no error_element; "
                    "set error_element (F16, BF16 or F32) for LoCo error feedback"
                )
            return None, 0.0
        if beta is None:
            raise InvalidProblem("error_beta is required with error feedback (a real number in [0, 1])")
        return self._required(error, "error_feedback", shape, ELEMENTS[kind]), check_beta(beta)

    def _zero_point(self, value: Any, name: str, shape: tuple[int, ...], asymmetric: bool) -> Operand | None:
        """The int32 zero-point operand ``name`` of an ASYMMETRIC plan; SYMMETRIC: None, and
        ``value`` must be None."""
        if asymmetric:
            return self._required(value, name, shape, ELEMENTS[ElementKind.I32])
        if value is not None:
            raise InvalidProblem(f"{name} must be None in SYMMETRIC mode (the zero point is 0)")
        return None


def error_view(err: Operand | None, kind: ElementKind | None) -> np.ndarray | None:
    """The host LoCo buffer in its storage dtype, or None without error feedback."""
    return None if err is None or kind is None else host_view(err, ELEMENTS[kind])


def write_reference_outputs(
    a: QgzOperands,
    output: Any,
    codes: np.ndarray,
    params: np.ndarray | None,
    zero_point: np.ndarray | None,
    new_error: np.ndarray | None,
    error_kind: ElementKind | None,
) -> None:
    """Copy a reference result into the host operands: ``codes`` (storage of ``output``, an
    ``ElementInfo``), then what the plan has of float32 parameters, int32 zero points and the LoCo
    buffer."""
    write_back(a.y, output, codes)
    if a.params_out is not None and params is not None:
        write_back(a.params_out, ELEMENTS[ElementKind.F32], params)
    if a.zp_out is not None and zero_point is not None:
        write_back(a.zp_out, ELEMENTS[ElementKind.I32], zero_point)
    if a.err is not None and new_error is not None and error_kind is not None:
        write_back(a.err, ELEMENTS[error_kind], new_error)


def beta_pair(beta: float) -> tuple[float, float]:
    """LoCo's ``(b, 1 - b)`` with ``b = f32(beta)``, the difference computed in float32."""
    if not beta:
        return 0.0, 1.0
    b = np.float32(beta)
    return float(b), float(np.float32(1) - b)


# ---- launches ------------------------------------------------------------------------------------


def qgz_geometry(
    groups: int, group_size: int, packed: bool, vec_max: int, info: DeviceInfo
) -> tuple[SegmentGeometry, SegmentGeometry] | None:
    """The fused pass's geometry for aligned operands and its element-I/O twin, or None (two-pass)."""
    busy = info.busy_threads
    primary = fused_segment_geometry(groups, group_size, packed, QGZ_ELEMENTS_PER_THREAD, vec_max, busy)
    if primary is None:
        return None
    fallback = fused_segment_geometry(groups, group_size, packed, QGZ_ELEMENTS_PER_THREAD, 1, busy)
    assert fallback is not None
    return primary, fallback


@dataclass(frozen=True)
class DenseLaunch:
    """A dense pass (``kernels/qp_qgz.cuh``) that replaces the fused pass for aligned operands:
    its kernel, the team of threads per group, the vector width (elements) its operands'
    alignment comes from, its variant tag, and its threads per block (a power of two, at
    least the team). ``even_passes``: launch the fewest blocks that still take the same number
    of grid-stride passes, so every block does the same work (no tail of blocks with one pass
    more than the rest)."""

    function: Any
    team: int
    vec: int
    describe: str
    block: int = DENSE_BLOCK
    even_passes: bool = False


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
        for pointer, alignment in zip(pointers, self.alignments, strict=True):
            if pointer % alignment:
                return (self.fused_fallback,)
        return (self.fused,)

    @property
    def launches(self) -> tuple[PreparedLaunch, ...]:
        """Every prepared launch (for the plan's ``_prepared``)."""
        fused = tuple(launch for launch in (self.fused, self.fused_fallback) if launch is not None)
        return fused + self.two_pass


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
    dense: DenseLaunch | None = None,
) -> QgzLaunches:
    """The launches of a qgZ plan: the fused pass (``geometry``: aligned and element-I/O twins)
    or, where ``geometry`` is None, the two passes (``element_units``: work items of the element
    pass, pairs for 4-bit codes). ``alignment_bits``: the element bits of each operand the
    fused pass moves in vectors, in the order the plan passes its pointers to ``run``;
    ``own_range``: see :func:`layout_args`; ``dense``: a dense pass that serves aligned operands
    in place of the fused pass (the element-I/O twin stays for the others)."""
    fixed = kernels.fixed
    if geometry is not None:
        primary, fallback = geometry

        def fused(g: SegmentGeometry) -> PreparedLaunch:
            fn = kernels.segments(g.vec, g.vector_io)
            wanted = -(-g.segments // (g.block // g.team))
            layout = segment_layout(groups, group_size, g.team, q_min, q_max, mode, own_range)
            grid = occupancy_grid(fn, g.block, wanted, info)
            return PreparedLaunch(fn, grid, g.block, kernels.params_type, layout=layout, **fixed)

        if dense is not None:
            layout = segment_layout(groups, group_size, dense.team, q_min, q_max, mode, own_range)
            wanted = -(-groups // (dense.block // dense.team))
            grid = occupancy_grid(dense.function, dense.block, wanted, info)
            if dense.even_passes:
                grid = -(-wanted // -(-wanted // grid))
            launch = PreparedLaunch(dense.function, grid, dense.block, kernels.params_type, layout=layout, **fixed)
            aligns = tuple(vector_alignment(dense.vec, b) for b in alignment_bits)
            return QgzLaunches(launch, fused(fallback), (), aligns, dense.describe)
        aligns = tuple(vector_alignment(primary.vec, b) for b in alignment_bits)
        return QgzLaunches(fused(primary), fused(fallback), (), aligns, primary.describe())
    block = group_params_block(group_size)
    layout = segment_layout(groups, group_size, 1, q_min, q_max, mode, own_range)
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
    out: QgzOutputArgs,
    y: Operand,
    scale: Operand | None,
    zp: Operand | None,
    error: Operand | None,
    beta: float,
    one_minus_beta: float,
) -> None:
    """The per-call fields of ``QgzOutputArgs`` (pointers 0 where absent; LoCo's ``b``, ``1 - b``)."""
    out.q = y.ptr
    out.scale_out = 0 if scale is None else scale.ptr
    out.zp_out = 0 if zp is None else zp.ptr
    out.error = 0 if error is None else error.ptr
    out.beta = beta
    out.one_minus_beta = one_minus_beta


__all__ = [
    "DENSE_BLOCK",
    "DENSE_MAX_ELEMENTS",
    "ELEMENT_BLOCK",
    "DenseLaunch",
    "PeerSumArgs",
    "QgzChecks",
    "QgzKernels",
    "QgzLaunches",
    "QgzOperands",
    "QgzOutputArgs",
    "SwizzleMapArgs",
    "beta_pair",
    "check_beta",
    "check_code_kind",
    "check_error_kind",
    "check_float_kind",
    "dynamic_code_range",
    "error_view",
    "group_params_block",
    "log2_or_minus_one",
    "prepare_float_values",
    "prepare_qgz_launches",
    "qgz_geometry",
    "set_output_args",
    "widest_dividing",
    "write_reference_outputs",
]
