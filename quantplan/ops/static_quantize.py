"""Static quantization and dequantization: QuantizePlan and DequantizePlan.

Formulas (SPEC section 4; arithmetic in float32, float64 for F64 data; rne = round half to even):

* quantize, integer codes: ``q = clamp(rne(x / scale) + zp, q_min, q_max)``; NaN -> ``zp``;
  +-Inf clamps to ``q_max`` / ``q_min``.
* quantize, FP8 codes: ``q = fp8_rne_saturate(x / scale)``; +-Inf saturate to +-max; NaN -> 0x7F.
* dequantize: ``y = (q - zp) * scale`` (FP8: ``y = q * scale``), rounded once to the output type.

Kernels: ``kernels/quantize.cu`` (``quantize_rows``) and ``kernels/dequantize.cu``
(``dequantize_rows``), launched through :class:`quantplan.runtime._affine.AffineRows`; reference:
:func:`quantplan.reference.quantize` / ``dequantize``; tests: ``tests/test_static_quantize_*.py``
and ``tests/test_reference_static_quantize.py``. Their gradients (``quantize_backward_rows``,
``dequantize_backward_rows``, compiled in the same units) are planned by
:mod:`quantplan.ops.quantize_backward`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from quantplan import reference
from quantplan.runtime._affine import (
    AffineArgs,
    AffineOperands,
    AffineProblem,
    AffineRows,
    DequantizeDescriptor,
    QuantizeDescriptor,
    dequantize_problem,
    quantize_problem,
    storage_shape,
)
from quantplan.runtime._device import device_info, stream_device_id
from quantplan.runtime._operands import Operand, OperandChecks, check_outputs, check_param_values, reference_uniform
from quantplan.runtime._plan import Plan, choose_backend, preferred
from quantplan.runtime._selection import SCHEDULES, choose_rows
from quantplan.runtime.workspace import Workspace
from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.errors import InvalidProblem
from quantplan.vocabulary.types import BackendKind, OpCategory, PlanPreference, QuantMode, TensorScope


class QuantizeArgs(AffineArgs):
    """Arguments of :class:`QuantizePlan`: ``input`` (floats), ``output`` (codes), ``scale``,
    ``zero_point`` and, for STOCHASTIC rounding, ``rng_seed`` / ``rng_offset`` (Python ints in
    [0, 2**64) or one-element int64 device arrays; element ``i`` of the flattened input uses
    Philox counter ``(i // 4, offset)`` and key ``seed``).

    Arrays may be CuPy arrays, PyTorch CUDA tensors (bfloat16 and float8 included) or, for the
    reference backend, NumPy arrays. CuPy has no bfloat16 / float8: pass uint16 / uint8 views.
    """

    __slots__ = ()


class DequantizeArgs(AffineArgs):
    """Arguments of :class:`DequantizePlan`: ``input`` (codes), ``output`` (floats), ``scale``, ``zero_point``."""

    __slots__ = ()


class StaticAffinePlan(OperandChecks, Plan[AffineArgs, AffineOperands]):
    """Base of QuantizePlan and DequantizePlan: the row kernel in one direction, with its checks."""

    #: True when the plan reads floats and writes codes (quantize), False for the reverse.
    _float_to_code: ClassVar[bool]
    _checked = AffineOperands
    _extract_fields = ("input", "output", "scale", "zero_point", "rng_seed", "rng_offset")

    def __init__(self, problem: AffineProblem, device_id: int | None, rows: AffineRows | None) -> None:
        float_shape, code_shape = problem.shape, problem.code_shape
        floats, codes = problem.float_kind, problem.code_kind
        if self._float_to_code:
            in_shape, out_shape, in_kind, out_kind = float_shape, code_shape, floats, codes
        else:
            in_shape, out_shape, in_kind, out_kind = code_shape, float_shape, codes, floats
        if rows is None:
            super().__init__(problem, None, in_kind, out_kind)
        else:
            variant = f"{problem.scope.kind}/{problem.mode.value}/{rows.layout.describe()}"
            super().__init__(problem, device_id, in_kind, out_kind, variant, prepared=rows.pair.launches)
        self._rows = rows
        self._in_shape, self._out_shape = in_shape, out_shape
        self._in_info, self._out_info = ELEMENTS[in_kind], ELEMENTS[out_kind]
        self._param_shape = problem.param_shape
        self._param_dtype = problem.scale_dtype
        self._int32 = np.dtype(np.int32)
        self._tensor_scope = isinstance(problem.scope, TensorScope)
        self._symmetric = problem.mode is QuantMode.SYMMETRIC
        self._stochastic = self._float_to_code and problem.stochastic

    @classmethod
    def _make(cls, stream: Any, problem: AffineProblem, pref: PlanPreference | None) -> Any:
        op = "quantize" if cls._float_to_code else "dequantize"
        if choose_backend(pref, stream, SCHEDULES[op]) is BackendKind.REFERENCE:
            return cls(problem, None, None)
        device_id = stream_device_id(stream)
        forced = None if pref is None else pref.schedule
        choice = choose_rows(problem, cls._float_to_code, device_info(device_id), forced)
        return cls(problem, device_id, AffineRows.prepare(problem, cls._float_to_code, device_id, choice.dense))

    # ---- arguments ------------------------------------------------------------------------

    def _check(self, args: AffineArgs) -> AffineOperands:
        x = self._tensor(args.input, "input", self._in_shape, self._in_info)
        y = self._tensor(args.output, "output", self._out_shape, self._out_info)
        scale = self._positive_scale(args.scale, self._param_dtype)
        zp: Operand | int | None = None
        if self._symmetric:
            if args.zero_point is not None:
                raise InvalidProblem("zero_point must be None in SYMMETRIC mode (the zero point is 0)")
        else:
            zp = self._int32_zero_point(args.zero_point, self._int32, self.problem.q_min, self.problem.q_max)
        seed, offset = self._rng(self._stochastic, args.rng_seed, args.rng_offset)
        check_outputs((("output", y),), (("input", x), ("scale", scale), ("zero_point", zp)))
        return AffineOperands(x, y, scale, zp, seed, offset)

    def _check_values(self, checked: AffineOperands) -> None:
        check_param_values(checked.scale, checked.zp, self.problem.q_min, self.problem.q_max)

    # ---- execution ------------------------------------------------------------------------

    def _launch(self, handle: int, workspace: Workspace | None, a: AffineOperands) -> None:
        assert self._rows is not None
        self._rows.launch(handle, a.x.ptr, a.y.ptr, a.scale, a.zp, a.seed, a.offset)

    def _run_reference(self, a: AffineOperands) -> None:
        p = self.problem
        shape = p.shape if p.shape else (1,)
        scale_np = self._broadcast_param(a.scale, shape, p.scope, self._param_dtype)
        zp_np: np.ndarray | int = 0
        if isinstance(a.zp, Operand):
            zp_np = self._broadcast_param(a.zp, shape, p.scope)
        elif a.zp is not None:
            zp_np = int(a.zp)
        uniform = reference_uniform(shape, a.seed, a.offset) if self._stochastic else None
        in_kind = self._in_info.kind
        src = self._host_view(a.x, storage_shape(shape, in_kind), self._in_info)
        if self._float_to_code:
            result = reference.quantize(
                src, scale_np, zp_np, p.code_kind, p.q_min, p.q_max, p.precision, p.nibble_order, uniform=uniform
            )
        else:
            result = reference.dequantize(
                src, scale_np, zp_np, p.code_kind, p.float_kind, shape[-1], p.precision, p.nibble_order
            )
        self._write_host(a.y, result.view(self._out_info.numpy_dtype))


class QuantizePlan(StaticAffinePlan):
    """Static-parameter quantization of a float tensor to integer or FP8 codes.

    Formula: ``q = clamp(rne(x / scale) + zp, q_min, q_max)`` (integer codes; NaN -> zp, +-Inf
    clamp), ``q = fp8_rne_saturate(x / scale)`` (FP8; NaN -> 0x7F).

    **When to use:** you already hold the scale (and zero point) — calibrated activations, weights
    quantized offline — and want one pass over memory. If the scale comes from the data itself,
    use the dynamic-range plan instead.

    **Dtypes:** input F16 / BF16 / F32 / F64; output S8 / U8 / S4 / U4 (packed, either nibble
    order) / FP8_E4M3 / FP8_E5M2. ``scale`` float32 (float64 for F64 input); ``zero_point`` int32.

    **Shape limits:** any rank, any extents; 64-bit indexing; no limit on rows. The last axis (or
    the axes merged into a row) must be shorter than 2**31 elements.

    **Schedules:** ``dense-rows`` (one (row, chunk) item per block: F16 / BF16, nearest rounding,
    the hot layouts) or ``row-layout``, chosen by :func:`quantplan.runtime._selection.choose_rows`;
    ``PlanPreference(schedule=...)`` forces one (Unsupported where it cannot serve). DequantizePlan
    takes the same two.

    **Workspace:** none (``workspace_size() == 0``).

    **Precision guarantee:** float32 arithmetic (float64 for F64), IEEE division, round half to
    even; equal bit for bit to :func:`quantplan.reference.quantize`; deterministic.
    """

    _args_type = QuantizeArgs
    _category = OpCategory.QUANTIZE
    _float_to_code = True

    @classmethod
    def select(cls, stream: Any, desc: QuantizeDescriptor, pref: PlanPreference | None = None) -> QuantizePlan:
        """Validate ``desc``, pick the backend and kernel variant, compile it on first use.

        ``stream`` decides the device (None: CuPy's current device). Raises InvalidProblem for a
        malformed descriptor and Unsupported for a valid one this library does not serve.
        """
        return preferred(cls._make(stream, quantize_problem(desc), pref), pref)  # type: ignore[no-any-return]


class DequantizePlan(StaticAffinePlan):
    """Dequantization of integer or FP8 codes to a float tensor.

    Formula: ``y = (q - zp) * scale`` (FP8: ``y = q * scale``), computed in float32 (float64 for
    F64 output), rounded once to the output type.

    **When to use:** reconstructing weights or activations stored as codes (W8A16, W4A16, FP8
    checkpoints), or checking a quantizer's error.

    **Dtypes:** input S8 / U8 / S4 / U4 (packed, either nibble order) / FP8_E4M3 / FP8_E5M2;
    output F16 / BF16 / F32 / F64. ``scale`` float32 (float64 for F64 output); ``zero_point`` int32.

    **Shape limits:** as QuantizePlan.

    **Workspace:** none.

    **Precision guarantee:** one product in the accumulator type, one rounding to the output;
    equal bit for bit to :func:`quantplan.reference.dequantize` (NaN payloads aside); deterministic.
    """

    _args_type = DequantizeArgs
    _category = OpCategory.DEQUANTIZE
    _float_to_code = False

    @classmethod
    def select(cls, stream: Any, desc: DequantizeDescriptor, pref: PlanPreference | None = None) -> DequantizePlan:
        """Validate ``desc``, pick the backend and kernel variant, compile it on first use."""
        return preferred(cls._make(stream, dequantize_problem(desc), pref), pref)  # type: ignore[no-any-return]


__all__ = [
    "DequantizeArgs",
    "DequantizeDescriptor",
    "DequantizePlan",
    "QuantizeArgs",
    "QuantizeDescriptor",
    "QuantizePlan",
]
