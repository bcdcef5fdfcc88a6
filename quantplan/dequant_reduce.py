"""DequantReducePlan: dequantize N peers' chunks, sum in float32, re-quantize (ZeRO++ qgZ).

The receiving side of :class:`~quantplan.SwizzledQuantizePlan`: after the intra-node all-to-all,
local device ``d`` holds chunk ``output[p, d]`` (and ``scale_out[p, d]``) from each of its N
peers. This plan dequantizes each chunk with its own parameters, sums them in float32 in peer
order (optionally averages), and re-quantizes the sum with fresh dynamic-range parameters per
output group, whose size is independent of the input groups. Optional LoCo error feedback.

Reference: :func:`quantplan.reference.dequant_reduce`; tests:
``tests/test_reference_dequant_reduce.py``, ``tests/test_swizzled_quantize_plan_errors.py``.
The CUDA kernel is not in this release (``select`` on the CUDA backend raises Unsupported).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict

from . import reference
from ._operands import Operand
from .elements import ELEMENTS
from .errors import InvalidProblem
from .swizzled_quantize import (
    QgzOperands,
    check_code_kind,
    check_error_kind,
    check_positive,
    dynamic_code_range,
    host_view,
    qgz_precision_guarantee,
    reference_only_backend,
    write_back,
)
from .types import (
    HOST_ARCH,
    BackendKind,
    ElementKind,
    KernelSku,
    NibbleOrder,
    OpCategory,
    PlanPreference,
    PrecisionGuarantee,
    QuantizeKind,
    QuantMode,
)
from .workspace import Workspace, check_workspace

_FROZEN = ConfigDict(frozen=True, extra="forbid")


def _storage(elements: int, kind: ElementKind) -> int:
    return elements // 2 if ELEMENTS[kind].is_packed else elements


class DequantReduceDescriptor(BaseModel):
    """A dequantize-reduce-requantize problem (see :class:`DequantReducePlan`).

    Fields: ``peers`` (N >= 1 chunks to reduce); ``chunk_elements`` (elements per chunk, and of
    the output); ``input_group_size`` (groups of the incoming chunks; divides ``chunk_elements``);
    ``output_group_size`` (groups of the re-quantized output; divides ``chunk_elements``,
    independent of ``input_group_size``); ``mode`` SYMMETRIC or ASYMMETRIC (both sides);
    ``input_element`` / ``output_element`` S8, U8, S4 or U4; ``q_min`` / ``q_max`` narrow the
    output code range; ``nibble_order`` of 4-bit codes (both sides); ``average`` divides the sum
    by N; ``error_element`` None or the element of the LoCo error buffer (F16, BF16, F32).

    4-bit sides need an even ``chunk_elements`` (each chunk starts on a byte).
    """

    model_config = _FROZEN
    peers: int
    chunk_elements: int
    input_group_size: int
    output_group_size: int
    mode: QuantMode = QuantMode.SYMMETRIC
    input_element: ElementKind
    output_element: ElementKind
    q_min: int | None = None
    q_max: int | None = None
    nibble_order: NibbleOrder = NibbleOrder.LOW_FIRST
    average: bool = False
    error_element: ElementKind | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        """``(peers, chunk_elements)`` codes; 4-bit: ``(peers, chunk_elements / 2)`` bytes."""
        return (self.peers, _storage(self.chunk_elements, self.input_element))

    @property
    def input_param_shape(self) -> tuple[int, ...]:
        """``(peers, chunk_elements / input_group_size)``: shape of ``scale`` / ``zero_point``."""
        return (self.peers, self.chunk_elements // max(1, self.input_group_size))

    @property
    def output_shape(self) -> tuple[int, ...]:
        """``(chunk_elements,)`` codes; 4-bit: ``(chunk_elements / 2,)`` bytes."""
        return (_storage(self.chunk_elements, self.output_element),)

    @property
    def param_shape(self) -> tuple[int, ...]:
        """``(chunk_elements / output_group_size,)``: shape of ``scale_out`` / ``zero_point_out``."""
        return (self.chunk_elements // max(1, self.output_group_size),)

    @property
    def error_shape(self) -> tuple[int, ...]:
        """``(chunk_elements,)``: shape of the LoCo error buffer (one value per output element)."""
        return (self.chunk_elements,)


@dataclass(slots=True)
class DequantReduceArgs:
    """Arguments of :class:`DequantReducePlan`.

    ``input`` (``input_shape``: row ``j`` is peer ``j``'s chunk; int8 for S8, uint8 for U8 and
    packed S4 / U4); ``scale`` (float32, ``input_param_shape``) and ``zero_point`` (int32,
    ``input_param_shape``; ASYMMETRIC only) of the incoming chunks; ``output``
    (``output_shape``); ``scale_out`` (float32, ``param_shape``) and ``zero_point_out`` (int32,
    ASYMMETRIC only). LoCo (descriptor ``error_element`` set): ``error_feedback``
    (``error_shape``, read and updated in place) and ``error_beta`` (a real number in [0, 1]).
    """

    input: Any
    scale: Any
    output: Any
    scale_out: Any
    zero_point: Any = None
    zero_point_out: Any = None
    error_feedback: Any = None
    error_beta: Any = None


class _Checked(NamedTuple):
    """Operands of one run after the checks."""

    q: Operand
    scale: Operand
    zp: Operand | None
    y: Operand
    scale_out: Operand
    zp_out: Operand | None
    err: Operand | None
    beta: float


class DequantReducePlan:
    """Dequantize N peers' chunks, sum them in float32, re-quantize with fresh per-group parameters.

    Formulas (SPEC section 4, float32; rne = round half to even):

    * per peer ``j``: ``y_j = (q_j - zp_j) * scale_j`` in float32 (kept in float32, not rounded
      to a narrower type), each input group with its own parameters;
    * ``s = ((y_0 + y_1) + y_2) + ...``: float32 additions in peer order, peer 0 first, each
      rounded once (deterministic, independent of the launch);
    * ``average``: ``s = s / float32(N)`` (IEEE float32 division, not a product with ``1 / N``);
    * LoCo (``error_element`` set): ``v = s + e`` in float32; otherwise ``v = s``;
    * re-quantization of ``v`` per output group of ``output_group_size`` elements, dynamic range
      exactly as :class:`~quantplan.DynamicRangeQuantizePlan` (SYMMETRIC ``scale = max|v| /
      q_max``; ASYMMETRIC ``scale = (hi - lo) / (q_max - q_min)``, ``zp = clamp(q_min - rne(lo /
      scale), q_min, q_max)``; ``scale == 0`` -> 1; a non-finite group -> ``scale = NaN``, ``zp = 0``,
      codes 0). A NaN scale on the input side makes its elements NaN, so the output group turns
      non-finite too: nothing is silently dropped;
    * LoCo update: ``e <- (b * e) + (c * (v - dequant(q_out)))``, ``b = f32(error_beta)``,
      ``c = 1 - b`` in float32, every operation rounded once in float32 (no FMA), the result
      rounded once to the buffer's element.

    **When to use:** the reduce step of ZeRO++ qgZ (after the intra-node all-to-all of
    :class:`~quantplan.SwizzledQuantizePlan`'s output), or any reduction of quantized shards
    that must stay quantized for the next hop. ``average=True`` gives a mean instead of a sum.

    **Dtypes:** input codes S8 / U8 / S4 / U4 (FP8: Unsupported) with float32 scales and int32
    zero points; output codes S8 / U8 / S4 / U4 (4-bit packed along the chunk, either nibble
    order, the same order on both sides); error buffer F16 / BF16 / F32.

    **Shape limits:** any N >= 1, any chunk size; both group sizes divide ``chunk_elements``;
    4-bit sides need an even chunk. Zero-size chunks are a no-op.

    **Kernel variants:** reference only in this release (``sku().variant == "numpy"``); on the
    CUDA backend ``select`` raises Unsupported ("CUDA kernel not yet implemented").

    **Workspace:** none.

    **Precision guarantee:** float32 dequantization, summation and re-quantization in a fixed
    order; bit-exact to :func:`quantplan.reference.dequant_reduce`; deterministic. The sum itself
    carries float32 rounding (relative 2**-24 per addition) on top of the quantization error.
    """

    def __init__(self, desc: DequantReduceDescriptor, q_min: int, q_max: int, backend: BackendKind) -> None:
        self.descriptor = desc
        self.q_min = q_min
        self.q_max = q_max
        self.backend = backend
        self.device_id: int | None = None
        self._operands = QgzOperands(backend, None)

    @classmethod
    def select(
        cls, stream: Any, desc: DequantReduceDescriptor, pref: PlanPreference | None = None
    ) -> DequantReducePlan:
        """Validate ``desc`` and pick the backend (REFERENCE in this release).

        Raises InvalidProblem for a malformed descriptor (N < 1, negative chunk, group sizes
        < 1 or not dividing the chunk, odd 4-bit chunks, bad code range) and Unsupported for
        FP8 codes or the CUDA backend.
        """
        check_positive("peers", desc.peers)
        if isinstance(desc.chunk_elements, bool) or desc.chunk_elements < 0:
            raise InvalidProblem(f"chunk_elements={desc.chunk_elements!r} must be >= 0")
        for name in ("input_group_size", "output_group_size"):
            size = getattr(desc, name)
            check_positive(name, size)
            if desc.chunk_elements % size:
                raise InvalidProblem(
                    f"{name}={size} does not divide chunk_elements={desc.chunk_elements}; every chunk must hold "
                    f"whole groups (pad the chunk to {-(-desc.chunk_elements // size) * size} elements)"
                )
        check_code_kind(desc.input_element, "input_element")
        check_code_kind(desc.output_element, "output_element")
        check_error_kind(desc.error_element)
        q_min, q_max = dynamic_code_range(desc.mode, desc.output_element, desc.q_min, desc.q_max)
        for name, kind in (("input_element", desc.input_element), ("output_element", desc.output_element)):
            if ELEMENTS[kind].is_packed and desc.chunk_elements % 2:
                raise InvalidProblem(
                    f"{name}={kind.name} packs two codes per byte, so chunk_elements must be even, got "
                    f"{desc.chunk_elements}"
                )
        backend = reference_only_backend(pref or PlanPreference(), "DequantReducePlan")
        return cls(desc, q_min, q_max, backend)

    # ---- introspection --------------------------------------------------------------------

    def workspace_size(self) -> int:
        """Bytes of workspace ``run`` needs: 0."""
        return 0

    def precision_guarantee(self) -> PrecisionGuarantee:
        """float32 arithmetic and accumulation in peer order; bit-exact to the reference; deterministic."""
        return qgz_precision_guarantee()

    def sku(self) -> KernelSku:
        """Identity of the selected implementation (variant ``numpy`` in this release)."""
        d = self.descriptor
        return KernelSku(
            category=OpCategory.COLLECTIVE,
            op=QuantizeKind.DYNAMIC_RANGE,
            element=d.input_element,
            aux_element=d.output_element,
            variant="numpy",
            arch=HOST_ARCH.name,
            backend=self.backend,
            precision_guarantee=self.precision_guarantee(),
        )

    # ---- arguments ------------------------------------------------------------------------

    def _check(self, args: DequantReduceArgs) -> _Checked:
        d = self.descriptor
        ops = self._operands
        q = ops.tensor(args.input, "input", d.input_shape, d.input_element)
        scale = ops.tensor(args.scale, "scale", d.input_param_shape, ElementKind.F32)
        y = ops.tensor(args.output, "output", d.output_shape, d.output_element)
        scale_out = ops.tensor(args.scale_out, "scale_out", d.param_shape, ElementKind.F32)
        zp: Operand | None = None
        zp_out: Operand | None = None
        if d.mode is QuantMode.ASYMMETRIC:
            zp = ops.tensor(args.zero_point, "zero_point", d.input_param_shape, ElementKind.I32)
            zp_out = ops.tensor(args.zero_point_out, "zero_point_out", d.param_shape, ElementKind.I32)
        elif args.zero_point is not None or args.zero_point_out is not None:
            raise InvalidProblem("zero_point / zero_point_out must be None in SYMMETRIC mode (the zero point is 0)")
        err, beta = ops.loco(args.error_feedback, args.error_beta, d.error_shape, d.error_element)
        return _Checked(q, scale, zp, y, scale_out, zp_out, err, beta)

    def can_implement(self, args: DequantReduceArgs) -> bool:
        """Check ``args`` (shapes, dtypes, residence, contiguity, LoCo buffer and beta); True or raises."""
        self._check(args)
        return True

    # ---- execution ------------------------------------------------------------------------

    def run(self, stream: Any, workspace: Workspace | None, args: DequantReduceArgs) -> None:
        """Dequantize, reduce, re-quantize and (LoCo) update the error buffer. Every check happens
        before any output is written; a zero-size chunk returns without writing."""
        check_workspace(workspace, 0)
        q, scale, zp, y, scale_out, zp_out, err, beta = self._check(args)
        d = self.descriptor
        if d.chunk_elements == 0:
            return
        error = None if err is None or d.error_element is None else host_view(err, d.error_element)
        q_new, s_new, z_new, new_err = reference.dequant_reduce(
            host_view(q, d.input_element),
            host_view(scale, ElementKind.F32),
            None if zp is None else host_view(zp, ElementKind.I32),
            d.input_element,
            d.input_group_size,
            d.output_element,
            d.output_group_size,
            d.mode,
            self.q_min,
            self.q_max,
            d.nibble_order,
            d.average,
            error,
            beta,
        )
        write_back(y, d.output_element, q_new)
        write_back(scale_out, ElementKind.F32, s_new)
        if zp_out is not None and z_new is not None:
            write_back(zp_out, ElementKind.I32, z_new)
        if err is not None and new_err is not None:
            assert d.error_element is not None
            write_back(err, d.error_element, new_err)


__all__ = ["DequantReduceArgs", "DequantReduceDescriptor", "DequantReducePlan"]
