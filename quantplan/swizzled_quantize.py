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

import numpy as np
from pydantic import BaseModel, ConfigDict

from . import reference
from ._affine import OperandChecks, choose_backend
from ._device import device_info, stream_device_id
from ._launch import stream_handle
from ._operands import Operand, is_scalar, overlaps
from ._qgz_launch import (
    QgzKernels,
    QgzLaunches,
    QgzOutputArgs,
    SwizzleMapArgs,
    error_tag,
    prepare_qgz_launches,
    qgz_geometry,
    set_output_args,
)
from .compiler import compile_options, load_kernels, register_family, template_name
from .dynamic_range import SegmentLayoutArgs
from .elements import ELEMENTS
from .errors import InvalidProblem, Unsupported
from .types import (
    HOST_ARCH,
    BackendKind,
    ElementKind,
    KernelSku,
    MathPrecision,
    NibbleOrder,
    OpCategory,
    PlanPreference,
    PrecisionGuarantee,
    QuantizeKind,
    QuantMode,
)
from .workspace import Workspace, check_workspace

_FROZEN = ConfigDict(frozen=True, extra="forbid")
#: Float kinds the qgZ plans read and the error buffers they keep.
QGZ_FLOAT_KINDS = (ElementKind.F16, ElementKind.BF16, ElementKind.F32)
#: Code kinds the qgZ plans write (integer codes; 4-bit packed two per byte).
QGZ_CODE_KINDS = (ElementKind.S8, ElementKind.U8, ElementKind.S4, ElementKind.U4)


# ---- validation shared by the qgZ plans (also used by DequantReducePlan and quantplan.compat) ----


def check_positive(name: str, value: int) -> None:
    """InvalidProblem unless ``value`` is an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidProblem(f"{name}={value!r} must be an integer >= 1")


def check_float_kind(kind: ElementKind, name: str) -> None:
    """F16 / BF16 / F32 pass; F64 is Unsupported (no qgZ kernel for it); anything else InvalidProblem."""
    if kind in QGZ_FLOAT_KINDS:
        return
    if kind is ElementKind.F64:
        raise Unsupported(f"{name}=F64 is not served by the qgZ plans; use F32, BF16 or F16")
    raise InvalidProblem(f"{name} must be one of F16, BF16, F32, got {kind.name}")


def check_code_kind(kind: ElementKind, name: str) -> None:
    """S8 / U8 / S4 / U4 pass; FP8 is Unsupported here; anything else InvalidProblem."""
    if kind in QGZ_CODE_KINDS:
        return
    if ELEMENTS[kind].is_fp8:
        raise Unsupported(f"{name}={kind.name}: the qgZ plans write integer codes only (S8, U8, S4, U4)")
    raise InvalidProblem(f"{name} must be one of S8, U8, S4, U4, got {kind.name}")


def dynamic_code_range(mode: QuantMode, code: ElementKind, q_min: int | None, q_max: int | None) -> tuple[int, int]:
    """The code range of dynamic-range quantization to ``code``: the kind's default range,
    optionally narrowed; SYMMETRIC needs ``q_max > 0``, ASYMMETRIC ``q_min < q_max`` (InvalidProblem)."""
    full = ELEMENTS[code].code_range
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


def check_error_kind(kind: ElementKind | None) -> None:
    """The LoCo error buffer element: None (no error feedback) or F16 / BF16 / F32."""
    if kind is not None and kind not in QGZ_FLOAT_KINDS:
        raise InvalidProblem(f"error_element must be None or one of F16, BF16, F32, got {kind.name}")


def check_beta(value: Any) -> float:
    """LoCo's ``error_beta``: a real number in [0, 1] (InvalidProblem otherwise)."""
    if not is_scalar(value) or isinstance(value, (bool, np.bool_)):
        raise InvalidProblem(f"error_beta={value!r} must be a Python or NumPy real number in [0, 1]")
    beta = float(value)
    if not (math.isfinite(beta) and 0.0 <= beta <= 1.0):
        raise InvalidProblem(f"error_beta={value!r} must lie in [0, 1] (e <- beta * e + (1 - beta) * residual)")
    return beta


class QgzOperands(OperandChecks):
    """Operand checks of the qgZ plans (residence, shape, dtype, contiguity, alignment)."""

    def __init__(self, backend: BackendKind, device_id: int | None) -> None:
        self.backend = backend
        self.device_id = device_id
        self._param_shape = ()
        self._tensor_scope = False

    def tensor(self, value: Any, name: str, shape: tuple[int, ...], kind: ElementKind) -> Operand:
        """``value`` as an operand of ``shape`` and ``kind`` (I32: int32 zero points), or InvalidProblem."""
        if value is None:
            raise InvalidProblem(f"{name} is required: an array of shape {shape} ({kind.name})")
        return self._tensor(value, name, shape, ELEMENTS[kind])

    def loco(
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
        return self.tensor(error, "error_feedback", shape, kind), check_beta(beta)


def host_view(op: Operand, kind: ElementKind) -> np.ndarray:
    """The NumPy array behind a host operand, viewed in the storage dtype of ``kind``."""
    return np.asarray(op.obj).view(ELEMENTS[kind].numpy_dtype)


def write_back(op: Operand, kind: ElementKind, value: np.ndarray) -> None:
    """Copy ``value`` (storage dtype of ``kind``) into the host operand ``op``, shape for shape."""
    out = host_view(op, kind)
    np.copyto(out, np.asarray(value).reshape(out.shape).view(out.dtype), casting="no")


def qgz_precision_guarantee() -> PrecisionGuarantee:
    """float32 arithmetic and accumulation, fixed order: deterministic and bit-stable."""
    return PrecisionGuarantee(math_precision=MathPrecision.F32, accumulator=ElementKind.F32)


def range_divisor_of(mode: QuantMode, q_min: int, q_max: int) -> float:
    """The divisor of the dynamic scale of integer codes: ``q_max`` (SYMMETRIC) or ``q_max - q_min``."""
    return float(q_max if mode is QuantMode.SYMMETRIC else q_max - q_min)


def check_disjoint(*named: tuple[str, Operand | None]) -> None:
    """InvalidProblem when two of the device operands share a byte (the kernels read and write them all)."""
    present = [(n, op) for n, op in named if op is not None]
    for i, (name_a, a) in enumerate(present):
        for name_b, b in present[i + 1 :]:
            if overlaps(a, b):
                raise InvalidProblem(f"{name_a} overlaps {name_b}; pass disjoint tensors")


_FAMILY = "swizzled_quantize"
#: Vector widths of the fused pass (elements of the input float); 4-bit codes need at least 2.
_SEGMENT_WIDTHS = (8, 4, 2, 1)

_SWIZZLE_PARAMS = type(
    "SwizzledQuantizeParams",
    (ctypes.Structure,),
    {
        "_fields_": [
            ("x", ctypes.c_uint64),
            ("out", QgzOutputArgs),
            ("layout", SegmentLayoutArgs),
            ("divisor", ctypes.c_float),
            ("map", SwizzleMapArgs),
        ]
    },
)


def swizzled_quantize_unit(
    input_kind: ElementKind, error_kind: ElementKind | None, code_kind: ElementKind, high_first: bool
) -> list[str]:
    """The kernels of one (input, error buffer, code, nibble order): the fused pass at every
    vector width (aligned vector I/O) and its element-I/O twin, then the two-pass kernels."""
    tags = (ELEMENTS[input_kind].cpp_tag, error_tag(error_kind), ELEMENTS[code_kind].cpp_tag)
    packed = ELEMENTS[code_kind].is_packed
    widths = [v for v in _SEGMENT_WIDTHS if v >= 2 or not packed]
    return [
        *(template_name("swizzled_quantize_segments", *tags, v, True, high_first) for v in widths),
        template_name("swizzled_quantize_segments", *tags, 2 if packed else 1, False, high_first),
        template_name("swizzled_quantize_group_params", tags[0], tags[1]),
        template_name("swizzled_quantize_elements", *tags, high_first),
    ]


@register_family(_FAMILY)
def swizzled_quantize_units() -> list[list[str]]:
    """Compile units of ``kernels/swizzled_quantize.cu``: one per (input, error buffer, code, nibble order)."""
    units = []
    for input_kind in QGZ_FLOAT_KINDS:
        for error_kind in (None, *QGZ_FLOAT_KINDS):
            for code_kind in QGZ_CODE_KINDS:
                for high_first in (False, True) if ELEMENTS[code_kind].is_packed else (False,):
                    units.append(swizzled_quantize_unit(input_kind, error_kind, code_kind, high_first))
    return units


def prepare_swizzled_quantize(desc: SwizzledQuantizeDescriptor, q_min: int, q_max: int, device_id: int) -> QgzLaunches:
    """Compile (first use) and prepare the launches of ``desc`` on ``device_id``."""
    info = device_info(device_id)
    code = ELEMENTS[desc.output_element]
    high_first = code.is_packed and desc.nibble_order is NibbleOrder.HIGH_FIRST
    unit = swizzled_quantize_unit(desc.input_element, desc.error_element, desc.output_element, high_first)
    functions = load_kernels(_FAMILY, unit, info.arch, device_id, compile_options())
    tags = (ELEMENTS[desc.input_element].cpp_tag, error_tag(desc.error_element), code.cpp_tag)
    fixed = dict(
        divisor=range_divisor_of(desc.mode, q_min, q_max),
        map=SwizzleMapArgs(desc.slice_groups, desc.nodes, desc.devices_per_node, desc.pipeline, 0),
    )
    kernels = QgzKernels(
        lambda vec, vector_io: functions[
            template_name("swizzled_quantize_segments", *tags, vec, vector_io, high_first)
        ],
        functions[template_name("swizzled_quantize_group_params", tags[0], tags[1])],
        functions[template_name("swizzled_quantize_elements", *tags, high_first)],
        _SWIZZLE_PARAMS,
        fixed,
    )
    bits = [ELEMENTS[desc.input_element].storage_bits, code.storage_bits]
    if desc.error_element is not None:
        bits.append(ELEMENTS[desc.error_element].storage_bits)
    return prepare_qgz_launches(
        kernels,
        qgz_geometry(desc.groups, desc.group_size, code.is_packed, _SEGMENT_WIDTHS[0], info),
        desc.groups,
        desc.group_size,
        desc.numel // (2 if code.is_packed else 1),
        q_min,
        q_max,
        desc.mode,
        bits,
        info,
    )


# ---- SwizzledQuantizePlan -----------------------------------------------------------------------


class SwizzledQuantizeDescriptor(BaseModel):
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
    shape: tuple[int, ...]
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
class SwizzledQuantizeArgs:
    """Arguments of :class:`SwizzledQuantizePlan`.

    ``input`` (the descriptor's ``shape``, F16 / BF16 / F32; bfloat16 or its uint16 bits);
    ``output`` (``output_shape``; int8 for S8, uint8 for U8 and packed S4 / U4);
    ``scale_out`` (float32, ``param_shape``); ``zero_point_out`` (int32, ``param_shape``;
    ASYMMETRIC only, None for SYMMETRIC). LoCo error feedback (descriptor ``error_element`` set):
    ``error_feedback`` (the input's shape, ``error_element``; read and updated in place, in the
    input's order, not swizzled) and ``error_beta`` (a real number in [0, 1]).
    """

    input: Any
    output: Any
    scale_out: Any
    zero_point_out: Any = None
    error_feedback: Any = None
    error_beta: Any = None


class SwizzledQuantizePlan:
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
    width. ``two-pass[...]`` (any other group size): a block scans each group for its
    parameters, then every element is read again and quantized. ``numpy`` on the reference
    backend.

    **Workspace:** none.

    **Precision guarantee:** float32 arithmetic; exact min / max reductions; bit-exact to
    :func:`quantplan.reference.swizzled_quantize`; deterministic.
    """

    def __init__(
        self,
        desc: SwizzledQuantizeDescriptor,
        q_min: int,
        q_max: int,
        backend: BackendKind,
        device_id: int | None = None,
        arch_name: str = HOST_ARCH.name,
        launches: QgzLaunches | None = None,
    ) -> None:
        self.descriptor = desc
        self.q_min = q_min
        self.q_max = q_max
        self.backend = backend
        self.device_id = device_id
        self._arch_name = arch_name
        self._launches = launches
        self._operands = QgzOperands(backend, device_id)

    @classmethod
    def select(
        cls, stream: Any, desc: SwizzledQuantizeDescriptor, pref: PlanPreference | None = None
    ) -> SwizzledQuantizePlan:
        """Validate ``desc``, pick the backend, and compile and prepare the kernels (CUDA, first use).

        Raises InvalidProblem for a malformed descriptor (negative extents, group or partition
        counts < 1, a size that does not split into whole groups per slice, odd 4-bit slices,
        bad code range) and Unsupported for F64 input or FP8 output.
        """
        if any(e < 0 for e in desc.shape):
            raise InvalidProblem(f"shape {desc.shape} has a negative extent")
        for name in ("group_size", "nodes", "devices_per_node", "pipeline"):
            check_positive(name, getattr(desc, name))
        check_float_kind(desc.input_element, "input_element")
        check_code_kind(desc.output_element, "output_element")
        check_error_kind(desc.error_element)
        q_min, q_max = dynamic_code_range(desc.mode, desc.output_element, desc.q_min, desc.q_max)
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
        backend = choose_backend(pref or PlanPreference())
        if backend is BackendKind.REFERENCE:
            return cls(desc, q_min, q_max, backend)
        device_id = stream_device_id(stream)
        launches = prepare_swizzled_quantize(desc, q_min, q_max, device_id)
        return cls(desc, q_min, q_max, backend, device_id, device_info(device_id).arch.name, launches)

    # ---- introspection --------------------------------------------------------------------

    def workspace_size(self) -> int:
        """Bytes of workspace ``run`` needs: 0."""
        return 0

    def precision_guarantee(self) -> PrecisionGuarantee:
        """float32 arithmetic, exact range reductions, bit-exact to the reference, deterministic."""
        return qgz_precision_guarantee()

    def sku(self) -> KernelSku:
        """Identity of the selected kernels (variant: ``numpy``, the fused pass's geometry, or ``two-pass``)."""
        d = self.descriptor
        return KernelSku(
            category=OpCategory.QUANTIZE,
            op=QuantizeKind.DYNAMIC_RANGE,
            element=d.input_element,
            aux_element=d.output_element,
            variant="numpy" if self._launches is None else self._launches.describe,
            arch=self._arch_name,
            backend=self.backend,
            precision_guarantee=self.precision_guarantee(),
        )

    # ---- arguments ------------------------------------------------------------------------

    def _check(
        self, args: SwizzledQuantizeArgs
    ) -> tuple[Operand, Operand, Operand, Operand | None, Operand | None, float]:
        d = self.descriptor
        ops = self._operands
        x = ops.tensor(args.input, "input", d.shape, d.input_element)
        y = ops.tensor(args.output, "output", d.output_shape, d.output_element)
        scale = ops.tensor(args.scale_out, "scale_out", d.param_shape, ElementKind.F32)
        zp: Operand | None = None
        if d.mode is QuantMode.ASYMMETRIC:
            zp = ops.tensor(args.zero_point_out, "zero_point_out", d.param_shape, ElementKind.I32)
        elif args.zero_point_out is not None:
            raise InvalidProblem("zero_point_out must be None in SYMMETRIC mode (the zero point is 0)")
        err, beta = ops.loco(args.error_feedback, args.error_beta, d.shape, d.error_element)
        check_disjoint(
            ("input", x), ("output", y), ("scale_out", scale), ("zero_point_out", zp), ("error_feedback", err)
        )
        return x, y, scale, zp, err, beta

    def can_implement(self, args: SwizzledQuantizeArgs) -> bool:
        """Check ``args`` (shapes, dtypes, residence, contiguity, LoCo buffer and beta); True or raises."""
        self._check(args)
        return True

    # ---- execution ------------------------------------------------------------------------

    def run(self, stream: Any, workspace: Workspace | None, args: SwizzledQuantizeArgs) -> None:
        """Quantize, swizzle and (LoCo) update the error buffer. Every check happens before any
        output is written; a zero-size problem returns without writing."""
        check_workspace(workspace, 0)
        x, y, scale, zp, err, beta = self._check(args)
        d = self.descriptor
        if d.numel == 0:
            return
        if self._launches is not None:
            assert self.device_id is not None
            b = np.float32(beta)
            c = np.float32(1) - b

            def fields(params: Any) -> None:
                params.x = x.ptr
                set_output_args(params.out, y, scale, zp, err)
                params.out.beta = float(b)
                params.out.one_minus_beta = float(c)

            pointers = (x.ptr, y.ptr) + (() if err is None else (err.ptr,))
            self._launches.run(self.device_id, stream_handle(stream), pointers, fields)
            return
        error = None if err is None or d.error_element is None else host_view(err, d.error_element)
        q, s, z, new_err = reference.swizzled_quantize(
            host_view(x, d.input_element),
            d.group_size,
            d.nodes,
            d.devices_per_node,
            d.pipeline,
            d.mode,
            d.output_element,
            self.q_min,
            self.q_max,
            d.nibble_order,
            error,
            beta,
        )
        write_back(y, d.output_element, q)
        write_back(scale, ElementKind.F32, s)
        if zp is not None and z is not None:
            write_back(zp, ElementKind.I32, z)
        if err is not None and new_err is not None:
            assert d.error_element is not None
            write_back(err, d.error_element, new_err)


__all__ = ["SwizzledQuantizeArgs", "SwizzledQuantizeDescriptor", "SwizzledQuantizePlan"]
