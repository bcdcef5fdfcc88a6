"""SwizzledQuantizePlan: group quantization written in the order of a hierarchical all-to-all (ZeRO++ qgZ).

The flattened input is cut into groups of ``group_size`` contiguous elements; each group is
quantized with dynamic-range parameters (SPEC section 4), and codes and parameters are written
in the swizzled order ``[pipeline][device][node][group][E]``
(:func:`quantplan.reference.swizzle_order`), so that chunk ``d`` of the output is everything
local device ``d`` reduces (one intra-node all-to-all delivers it) and its content is already
ordered by node for the inter-node all-to-all that follows :class:`~quantplan.DequantReducePlan`.
Optional LoCo error feedback keeps the quantization error in a buffer and adds it back next step.

Kernels: ``kernels/swizzled_quantize.cu`` (shared device code in ``kernels/qp_qgz.cuh``);
reference: :func:`quantplan.reference.swizzled_quantize`; tests:
``tests/test_reference_swizzled_quantize.py``, ``tests/test_swizzled_quantize_plan_errors.py``,
``tests/test_swizzled_quantize_gpu.py``; benchmark: ``benchmarks/bench_zeropp.py``.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Any

from pydantic import ConfigDict

from quantplan import reference
from quantplan.runtime import _qgz_launch
from quantplan.runtime._affine import ResolvedCodeRange
from quantplan.runtime._device import device_info, stream_device_id
from quantplan.runtime._kernel_names import (
    QGZ_WIDTHS,
    error_tag,
    swizzled_dense_name,
    swizzled_quantize_unit,
)
from quantplan.runtime._launch import launch_on
from quantplan.runtime._operands import TensorArgs, check_disjoint, check_positive, check_writeable, host_view
from quantplan.runtime._plan import Plan, check_descriptor, choose_backend, snapshot
from quantplan.runtime._qgz_launch import QgzOperands, beta_pair, set_output_args
from quantplan.runtime._segments import SegmentLayoutArgs, range_divisor_of
from quantplan.runtime._selection import SCHEDULES as SELECTION_SCHEDULES
from quantplan.runtime._selection import GroupProblem, choose_groups, dense_quantize_geometry, group_misfit
from quantplan.runtime._tuning import kernel_options
from quantplan.runtime.compiler import load_kernels, template_name
from quantplan.runtime.workspace import Workspace
from quantplan.vocabulary import types
from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.errors import InvalidProblem
from quantplan.vocabulary.types import ElementKind, NibbleOrder, QuantMode, Shape

_FROZEN = ConfigDict(frozen=True, extra="forbid")
_FAMILY = "swizzled_quantize"
_SWIZZLE_PARAMS = type(
    "SwizzledQuantizeParams",
    (ctypes.Structure,),
    {
        "_fields_": [
            ("x", ctypes.c_uint64),
            ("out", _qgz_launch.QgzOutputArgs),
            ("layout", SegmentLayoutArgs),
            ("divisor", ctypes.c_float),
            ("map", _qgz_launch.SwizzleMapArgs),
        ]
    },
)
_F32, _I32 = ELEMENTS[ElementKind.F32], ELEMENTS[ElementKind.I32]
#: The op's name in :data:`quantplan.runtime._selection.SCHEDULES`.
_OP = "swizzled_quantize"


#: The schedules of :class:`SwizzledQuantizePlan` (:data:`quantplan.runtime._selection.SCHEDULES`), the
#: order ``select`` tries them in (the first that serves the problem); ``PlanPreference(schedule=...)``
#: forces one of them.
SCHEDULES = SELECTION_SCHEDULES[_OP]


def flat_view(desc: SwizzledQuantizeDescriptor) -> SwizzledQuantizeDescriptor:
    """``desc`` with its input viewed flat, ``shape == (numel,)``.

    The swizzle's groups are runs of ``group_size`` consecutive elements of the input in C order,
    and its slices runs of ``slice_elements``: neither depends on how the input's extents are
    split into dimensions, so every view of the same bytes (a flat bucket, rows, any rank) is one
    problem. ``select`` resolves the view here, and the schedule and the launches read only this
    flat problem: the same bytes get the same kernels, grids and argument bytes at every rank.
    """
    return desc if len(desc.shape) == 1 else desc.model_copy(update={"shape": (desc.numel,)})


def _groups(flat: SwizzledQuantizeDescriptor) -> GroupProblem:
    packed = ELEMENTS[flat.output_element].is_packed
    return GroupProblem(flat.groups, flat.group_size, flat.input_element, packed, flat.error_element is None)


def schedule_misfit(flat: SwizzledQuantizeDescriptor, schedule: str) -> str | None:
    """Why ``schedule`` cannot serve the flat problem ``flat``, or None where it can
    (:func:`quantplan.runtime._selection.group_misfit`).

    * ``dense``: F16 / BF16 input without LoCo, fewer than ``2**31`` elements, groups of exactly
      ``team * 8 * nv`` elements (``team`` a power of two up to 256, ``nv`` in ``QGZ_DENSE_NV``);
    * ``fused`` / ``fused-element-io``: groups a team holds (at most ``MAX_TEAM * 32`` elements;
      4-bit codes: even groups);
    * ``two-pass``: every problem.
    """
    return group_misfit(_OP, schedule, _groups(flat), None)


def choose_schedule(flat: SwizzledQuantizeDescriptor, forced: str | None = None) -> str:
    """The schedule of the flat problem ``flat`` (:func:`quantplan.runtime._selection.choose_groups`):
    ``forced`` (Unsupported where it cannot serve the problem), else the first of
    :data:`SCHEDULES` that can (dense, fused, two-pass; the element-I/O twin is never the first
    choice: it serves misaligned operands at ``run``). An empty problem launches nothing:
    two-pass, whatever is forced. No condition depends on the device."""
    return choose_groups(_OP, _groups(flat), None, forced).schedule


def prepare_swizzled_quantize(
    flat: SwizzledQuantizeDescriptor, q_min: int, q_max: int, device_id: int, schedule: str
) -> _qgz_launch.QgzLaunches:
    """Compile (first use) and prepare the launches of the flat problem ``flat`` (:func:`flat_view`)
    on ``device_id`` in ``schedule`` (:func:`choose_schedule`). ``dense`` and ``fused`` keep the
    fused pass's element-I/O twin for operands not aligned to their vectors."""
    assert len(flat.shape) == 1, "launches are prepared from the flat view only"
    info = device_info(device_id)
    code = ELEMENTS[flat.output_element]
    high_first = code.is_packed and flat.nibble_order is NibbleOrder.HIGH_FIRST
    unit = swizzled_quantize_unit(flat.input_element, flat.error_element, flat.output_element, high_first)
    functions = load_kernels(_FAMILY, unit, info.arch, device_id, kernel_options())
    tags = (ELEMENTS[flat.input_element].cpp_tag, error_tag(flat.error_element), code.cpp_tag)
    fixed = dict(
        divisor=range_divisor_of(flat.mode, q_min, q_max),
        map=_qgz_launch.SwizzleMapArgs(flat.slice_groups, flat.nodes, flat.devices_per_node, flat.pipeline, 0),
    )
    kernels = _qgz_launch.QgzKernels(
        lambda vec, vector_io: functions[
            template_name("swizzled_quantize_segments", *tags, vec, vector_io, high_first)
        ],
        functions[template_name("swizzled_quantize_group_params", tags[0], tags[1])],
        functions[template_name("swizzled_quantize_elements", *tags, high_first)],
        _SWIZZLE_PARAMS,
        fixed,
    )
    bits = [ELEMENTS[flat.input_element].storage_bits, code.storage_bits]
    if flat.error_element is not None:
        bits.append(ELEMENTS[flat.error_element].storage_bits)
    geometry = None
    if schedule != "two-pass":
        geometry = _qgz_launch.qgz_geometry(flat.groups, flat.group_size, code.is_packed, QGZ_WIDTHS[0], info)
        assert geometry is not None
        if schedule == "fused-element-io":
            geometry = (geometry[1], geometry[1])
    dense = None
    if schedule == "dense":
        shape = dense_quantize_geometry(flat.groups, flat.group_size, info.busy_threads)
        assert shape is not None
        team, nv = shape
        fn = functions[swizzled_dense_name(flat.input_element, flat.output_element, high_first, nv)]
        dense = _qgz_launch.DenseLaunch(fn, team, 8, f"dense[{team}t-per-group,{nv}vec8-per-thread]")
    return _qgz_launch.prepare_qgz_launches(
        kernels,
        geometry,
        flat.groups,
        flat.group_size,
        flat.numel // (2 if code.is_packed else 1),
        q_min,
        q_max,
        flat.mode,
        bits,
        info,
        dense=dense,
    )


# ---- SwizzledQuantizePlan -----------------------------------------------------------------------


class SwizzledQuantizeDescriptor(ResolvedCodeRange):
    """A swizzled group-quantization problem (see :class:`SwizzledQuantizePlan`).

    Fields: ``shape`` of the input (any rank; its flat C order defines the groups);
    ``group_size`` elements per group (any size >= 1); ``nodes``, ``devices_per_node`` (the
    partitions, one per global rank ``node * devices_per_node + device``) and ``pipeline``
    (stages per partition); ``mode`` SYMMETRIC or ASYMMETRIC; ``input_element`` F16, BF16 or
    F32; ``output_element`` S8, U8, S4 or U4; ``q_min`` / ``q_max`` narrow the code range;
    ``nibble_order`` of 4-bit codes; ``error_element`` None (no error feedback) or the element
    of the LoCo error buffer (F16, BF16 or F32).

    Padding rule: none. ``numel`` must be a multiple of ``nodes * devices_per_node * pipeline *
    group_size`` (every slice is whole groups), and for 4-bit codes every slice must hold an
    even number of elements (a slice starts on a byte); ``select`` raises InvalidProblem
    otherwise, naming the next valid size. Pad the flattened tensor yourself (zeros in a padded
    tail only enter the statistics of the groups they fill) — the plan never invents elements.
    """

    model_config = _FROZEN
    shape: Shape
    group_size: int
    nodes: int = 1
    devices_per_node: int = 1
    pipeline: int = 1
    mode: QuantMode = QuantMode.SYMMETRIC
    input_element: ElementKind
    output_element: ElementKind
    q_min: int | None = None
    q_max: int | None = None
    nibble_order: NibbleOrder = NibbleOrder.LOW_FIRST
    error_element: ElementKind | None = None

    @property
    def numel(self) -> int:
        """Elements of the input."""
        return math.prod(self.shape)

    @property
    def groups(self) -> int:
        """Number of groups: ``numel / group_size``."""
        return self.numel // self.group_size if self.group_size > 0 else 0

    @property
    def slices(self) -> int:
        """Number of slices: ``nodes * devices_per_node * pipeline``."""
        return self.nodes * self.devices_per_node * self.pipeline

    @property
    def slice_elements(self) -> int:
        """Elements per slice (one pipeline stage of one partition)."""
        return self.numel // self.slices if self.slices > 0 else 0

    @property
    def slice_groups(self) -> int:
        """Groups per slice."""
        return self.slice_elements // self.group_size if self.group_size > 0 else 0

    @property
    def output_shape(self) -> tuple[int, ...]:
        """``(pipeline, devices_per_node, nodes * slice_elements)`` codes; 4-bit: last extent halved (bytes)."""
        width = self.nodes * self.slice_elements
        if ELEMENTS[self.output_element].is_packed:
            width //= 2
        return (self.pipeline, self.devices_per_node, width)

    @property
    def param_shape(self) -> tuple[int, ...]:
        """``(pipeline, devices_per_node, nodes * slice_groups)``: shape of ``scale_out`` / ``zero_point_out``."""
        return (self.pipeline, self.devices_per_node, self.nodes * self.slice_groups)


@dataclass(slots=True)
class SwizzledQuantizeArgs(TensorArgs):
    """Arguments of :class:`SwizzledQuantizePlan`.

    ``input`` (the descriptor's ``shape``, F16 / BF16 / F32; bfloat16 or its uint16 bits);
    ``output`` (``output_shape``; int8 for S8, uint8 for U8 and packed S4 / U4);
    ``scale_out`` (float32, ``param_shape``); ``zero_point_out`` (int32, ``param_shape``;
    ASYMMETRIC only, None for SYMMETRIC). LoCo error feedback (descriptor ``error_element`` set):
    ``error_feedback`` (the input's shape, ``error_element``; read and updated in place, in the
    input's order, not swizzled) and ``error_beta`` (a real number in [0, 1]).
    """

    scale_out: Any
    zero_point_out: Any = None
    error_feedback: Any = None
    error_beta: Any = None


class SwizzledQuantizePlan(_qgz_launch.QgzChecks, Plan[SwizzledQuantizeArgs, QgzOperands]):
    """Group quantization of a flat tensor, written in the swizzled order of a hierarchical all-to-all.

    Formulas (SPEC section 4, float32; rne = round half to even), per group of ``E =
    group_size`` contiguous elements of the flattened input ``v`` (``v = x``, or ``v = x + e`` in
    float32 with LoCo error feedback):

    * SYMMETRIC: ``scale = max|v| / q_max``; ``q = clamp(rne(v / scale), q_min, q_max)``.
    * ASYMMETRIC: ``lo = min(min v, 0)``, ``hi = max(max v, 0)``, ``scale = (hi - lo) / (q_max - q_min)``,
      ``zp = clamp(q_min - rne(lo / scale), q_min, q_max)``, ``q = clamp(rne(v / scale) + zp, q_min, q_max)``.
    * ``scale == 0`` -> 1; a group holding NaN or +-Inf: ``scale = NaN``, ``zp = 0``, codes 0.
    * Order: the input is viewed as ``[P = nodes * devices_per_node][pipeline][groups / (P *
      pipeline)][E]`` (partition ``z = node * devices_per_node + device``); codes and parameters
      are written ``[pipeline][device][node][group][E]``. 2 nodes x 4 devices: partitions
      ``0 1 2 3 4 5 6 7`` come out ``0 4 1 5 2 6 3 7``. ``output[p, d]`` is the chunk for local
      device ``d`` at stage ``p``, and ``scale_out[p, d]`` its parameters, group for group.
    * LoCo (``error_element`` set): ``v = x + e`` (float32, one rounding) is quantized;
      ``e <- (b * e) + (c * (v - dequant(q)))`` with ``b = f32(error_beta)``, ``c = 1 - b`` in
      float32, ``dequant(q) = (q - zp) * scale`` in float32, each operation rounded once in
      float32 (no FMA), the result rounded once to the buffer's element. The buffer is in the
      input's order (not swizzled) and updated in the same run.

    **When to use:** ZeRO++ qgZ gradient communication: quantize a gradient bucket once, send
    ``output[p, d]`` / ``scale_out[p, d]`` to local device ``d`` (intra-node all-to-all), reduce
    there with :class:`~quantplan.DequantReducePlan`, exchange across nodes.

    **Dtypes:** input F16 / BF16 / F32 (F64: Unsupported); output S8 / U8 / S4 / U4 (4-bit
    packed two per byte along the flat swizzled stream, either nibble order; FP8: Unsupported);
    ``scale_out`` float32, ``zero_point_out`` int32; error buffer F16 / BF16 / F32.

    **Shape limits:** any rank and any group size; ``numel`` a multiple of ``nodes *
    devices_per_node * pipeline * group_size`` and, for 4-bit codes, even slices (no implicit
    padding: InvalidProblem names the next valid size). Zero-size inputs are a no-op.

    **Kernel variants:** ``fused-single-pass[...]`` (groups of at most 32768 elements; 4-bit
    codes: even groups): a team of threads holds each group in registers, so the input (and the
    error buffer) is read once; an element-I/O twin serves operands not aligned to the vector
    width. ``dense[...]`` (F16 / BF16 without error feedback, below 2**31 elements, groups of ``team * 8 * nv``
    elements, ``team`` a power of two up to 256 and ``nv`` 1, 2 or 4, 16-byte aligned input):
    the fused pass specialised for these groups (each thread's share staged in shared memory,
    32 registers). ``two-pass[...]`` (any other group size): a block scans each group for its
    parameters, then every element is read again and quantized. ``numpy`` on the reference
    backend.

    **Schedule selection** (``select``, on the flat view of the input: :func:`flat_view`; a
    1-D bucket and any other view of the same bytes get the same kernels, grids and argument
    bytes): the first of ``dense``, ``fused``, ``two-pass`` that serves the problem
    (:func:`schedule_misfit`); ``PlanPreference(schedule=...)`` forces one of :data:`SCHEDULES`
    (``fused-element-io``: the element-I/O twin for every operand), Unsupported where it cannot
    serve the problem. Operands not aligned to the vectors of ``dense`` or ``fused`` take the
    element-I/O twin at ``run``, forced or not.

    **Workspace:** none.

    **Precision guarantee:** float32 arithmetic; exact min / max reductions; bit-exact to
    :func:`quantplan.reference.swizzled_quantize`; deterministic.
    """

    _args_type = SwizzledQuantizeArgs
    _category = types.OpCategory.QUANTIZE
    _op = types.QuantizeKind.DYNAMIC_RANGE

    def __init__(
        self,
        desc: SwizzledQuantizeDescriptor,
        q_min: int,
        q_max: int,
        device_id: int | None = None,
        launches: _qgz_launch.QgzLaunches | None = None,
    ) -> None:
        kinds = desc.input_element, desc.output_element
        if launches is None:
            super().__init__(desc, None, *kinds)
        else:
            super().__init__(desc, device_id, *kinds, launches.describe, prepared=launches.launches)
        self.descriptor = desc
        self._d = snapshot(desc, "numel", "output_shape", "param_shape")
        self.q_min = q_min
        self.q_max = q_max
        self._launches = launches
        self._input_info, self._output_info = ELEMENTS[desc.input_element], ELEMENTS[desc.output_element]

    @classmethod
    def select(
        cls, stream: Any, desc: SwizzledQuantizeDescriptor, pref: types.PlanPreference | None = None
    ) -> SwizzledQuantizePlan:
        """Validate ``desc``, pick the backend, and compile and prepare the kernels (CUDA, first use).

        Raises InvalidProblem for a malformed descriptor (negative extents, group or partition
        counts < 1, a size that does not split into whole groups per slice, odd 4-bit slices,
        bad code range) and Unsupported for F64 input or FP8 output.
        """
        check_descriptor(desc, SwizzledQuantizeDescriptor)
        for name in ("group_size", "nodes", "devices_per_node", "pipeline"):
            check_positive(name, getattr(desc, name))
        _qgz_launch.check_float_kind(desc.input_element, "input_element")
        _qgz_launch.check_code_kind(desc.output_element, "output_element")
        _qgz_launch.check_error_kind(desc.error_element)
        q_min, q_max = _qgz_launch.dynamic_code_range(desc.mode, desc.output_element, desc.q_min, desc.q_max)
        unit = desc.slices * desc.group_size
        if desc.numel % unit:
            raise InvalidProblem(
                f"{desc.numel} elements (shape {desc.shape}) do not split into nodes * devices_per_node * pipeline "
                f"= {desc.slices} slices of whole groups of {desc.group_size}: the size must be a multiple of {unit}; "
                f"pad the flattened tensor to {-(-desc.numel // unit) * unit} elements (or pick another group_size)"
            )
        if ELEMENTS[desc.output_element].is_packed and desc.slice_elements % 2:
            raise InvalidProblem(
                f"{desc.output_element.name} codes pack two per byte, so every slice must hold an even number of "
                f"elements; each of the {desc.slices} slices holds {desc.slice_elements} (pad to "
                f"{desc.numel + unit} elements, or use an even group_size)"
            )
        backend = choose_backend(pref, stream, SCHEDULES)
        flat = flat_view(desc)
        schedule = choose_schedule(flat, None if pref is None else pref.schedule)
        if backend is types.BackendKind.REFERENCE:
            return cls(desc, q_min, q_max)
        device_id = stream_device_id(stream)
        launches = prepare_swizzled_quantize(flat, q_min, q_max, device_id, schedule)
        return cls(desc, q_min, q_max, device_id, launches)

    # ---- arguments ------------------------------------------------------------------------

    def _check(self, args: SwizzledQuantizeArgs) -> QgzOperands:
        d = self._d
        x = self._required(args.input, "input", d.shape, self._input_info)
        y = self._required(args.output, "output", d.output_shape, self._output_info)
        scale = self._required(args.scale_out, "scale_out", d.param_shape, _F32)
        zp = self._zero_point(args.zero_point_out, "zero_point_out", d.param_shape, d.mode is QuantMode.ASYMMETRIC)
        err, beta = self._loco(args.error_feedback, args.error_beta, d.shape, d.error_element)
        check_writeable(("output", y), ("scale_out", scale), ("zero_point_out", zp), ("error_feedback", err))
        check_disjoint(
            ("input", x), ("output", y), ("scale_out", scale), ("zero_point_out", zp), ("error_feedback", err)
        )
        return QgzOperands(x, None, None, y, scale, zp, err, *beta_pair(beta))

    # ---- execution ------------------------------------------------------------------------

    def _launch(self, handle: int, workspace: Workspace | None, a: QgzOperands) -> None:
        assert self._launches is not None and self.device_id is not None
        pointers = (a.x.ptr, a.y.ptr) if a.err is None else (a.x.ptr, a.y.ptr, a.err.ptr)
        launches = self._launches.chosen(pointers)
        for launch in launches:
            params = launch.params
            params.x = a.x.ptr
            set_output_args(params.out, a.y, a.params_out, a.zp_out, a.err, a.beta, a.one_minus_beta)
        launch_on(self.device_id, handle, *launches)

    def _run_reference(self, a: QgzOperands) -> None:
        d = self._d
        if d.numel == 0:
            return
        q, s, z, new_err = reference.swizzled_quantize(
            host_view(a.x, self._input_info),
            d.group_size,
            d.nodes,
            d.devices_per_node,
            d.pipeline,
            d.mode,
            d.output_element,
            self.q_min,
            self.q_max,
            d.nibble_order,
            _qgz_launch.error_view(a.err, d.error_element),
            a.beta if a.err is not None else 0.0,
        )
        _qgz_launch.write_reference_outputs(a, self._output_info, q, s, z, new_err, d.error_element)


__all__ = ["SwizzledQuantizeArgs", "SwizzledQuantizeDescriptor", "SwizzledQuantizePlan"]
