"""Gradients of static quantization: QuantizeBackwardPlan and DequantizeBackwardPlan.

Formulas (arithmetic in float32, float64 for F64 data; IEEE division and product; each result
rounded once to the data type):

* quantize backward (straight-through estimator with the chain rule): the forward was
  ``q = clamp(rne(x / scale) + zp, q_min, q_max)`` (integer codes) or
  ``q = fp8_rne_saturate(x / scale)`` (FP8);
  ``dx = dq / scale`` where the forward's pre-clamp value is inside the range, else ``+0``:
  integer codes ``q_min <= rne(x / scale) + zp <= q_max`` (inclusive), FP8 ``|x / scale| <= fp8_max``;
  NaN and +-Inf ``x`` are outside. ``x / scale`` and its rounding are exactly the forward's, so the
  mask agrees with :class:`~quantplan.QuantizePlan`'s codes bit for bit.
* dequantize backward: the forward was ``y = (q - zp) * scale``; ``dq = dy * scale`` (no mask).

Chained (dequantize backward, then quantize backward) they give ``dx = (dy * scale) / scale * mask``:
:class:`~quantplan.FakeQuantizeBackwardPlan`'s straight-through ``dy * mask`` up to that one
rounding round trip (exact for power-of-two scales), and up to the rare input where the fake
quantizer's ``rne(x * rn(1 / scale))`` and ``rne(x / scale)`` round differently at a tie.

Kernels: ``quantize_backward_rows`` in ``kernels/quantize.cu`` and ``dequantize_backward_rows`` in
``kernels/dequantize.cu``, compiled in the forward plans' units (:func:`quantplan.runtime._families.quantize_unit`,
:func:`~quantplan.runtime._families.dequantize_unit`); reference: :func:`quantplan.reference.quantize_backward`
/ :func:`~quantplan.reference.dequantize_backward`; tests: ``tests/test_quantize_backward_*.py`` and
``tests/test_reference_quantize_backward.py``.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import numpy as np

from quantplan import reference
from quantplan.runtime._affine import (
    AffineProblem,
    DequantizeDescriptor,
    GradientOf,
    QuantizeDescriptor,
    dequantize_problem,
    quantize_problem,
)
from quantplan.runtime._device import device_info, stream_device_id
from quantplan.runtime._kernel_names import ROW_DENSE_FLOAT_KINDS, dense_row_kernel_name, dequantize_unit, quantize_unit
from quantplan.runtime._launch import LaunchPair, PreparedLaunch, device_arg, launch_on, occupancy_grid, params_struct
from quantplan.runtime._layout import BLOCK_THREADS, RowLayout, RowLayoutArgs, dense_row_layout, row_layout
from quantplan.runtime._operands import Operand, OperandChecks, check_outputs, check_param_values
from quantplan.runtime._plan import REFERENCE_VARIANT, Plan, choose_backend, preferred
from quantplan.runtime._tuning import kernel_options
from quantplan.runtime.compiler import load_kernels, template_name
from quantplan.runtime.workspace import Workspace
from quantplan.vocabulary.elements import ELEMENTS, acc_ctype
from quantplan.vocabulary.errors import InvalidProblem, Unsupported
from quantplan.vocabulary.types import BackendKind, MathPrecision, OpCategory, PlanPreference, QuantMode, TensorScope


class QuantizeBackwardDescriptor(GradientOf, QuantizeDescriptor):
    """The gradient of a :class:`~quantplan.QuantizeDescriptor` problem (same fields, same meaning).

    ``dx = dq / scale`` where ``q_min <= rne(x / scale) + zp <= q_max`` (FP8: ``|x / scale| <= fp8_max``),
    else ``+0``. Build it from the forward's fields, or with :meth:`from_forward`. ``rounding``
    must be NEAREST_EVEN (a stochastic forward's mask depends on its random draws: Unsupported).

    Shapes it implies: ``grad_shape`` (``input``, ``grad_output`` and ``grad_input``: the float
    shape, unpacked even for 4-bit codes) and ``param_shape``. (``output_shape`` is the forward's
    code storage, not an operand of the backward.)
    """


class DequantizeBackwardDescriptor(GradientOf, DequantizeDescriptor):
    """The gradient of a :class:`~quantplan.DequantizeDescriptor` problem w.r.t. the codes (same fields).

    ``dq = dy * scale``, in the forward's ``output_element`` (the float type of ``dy``); the
    codes' kind, mode and nibble order are validated as for the forward but do not change the
    gradient. Build it from the forward's fields, or with :meth:`from_forward`.

    Shapes it implies: ``grad_shape`` (``grad_output`` and ``grad_input``: the float shape,
    unpacked even for 4-bit codes) and ``param_shape``.
    """


@dataclass(slots=True)
class QuantizeBackwardArgs:
    """Arguments of :class:`QuantizeBackwardPlan`.

    ``input``: the forward's float input ``x``; ``grad_output``: ``dq``, the gradient w.r.t. the
    codes as floats (``x``'s shape and dtype, unpacked for 4-bit codes); ``grad_input``: ``dx``,
    written (``x``'s shape and dtype; may be ``grad_output`` itself, in place); ``scale`` /
    ``zero_point`` exactly as :class:`~quantplan.QuantizeArgs` takes them (float32 array of
    ``param_shape``, float64 for F64; TensorScope also a Python float or a one-element array;
    ``zero_point`` None for SYMMETRIC, else int32 array or, for TensorScope, a Python int).
    """

    input: Any
    grad_output: Any
    grad_input: Any
    scale: Any
    zero_point: Any = None


@dataclass(slots=True)
class DequantizeBackwardArgs:
    """Arguments of :class:`DequantizeBackwardPlan`.

    ``grad_output``: ``dy``, the gradient w.r.t. the dequantized floats (the forward output's
    shape and dtype); ``grad_input``: ``dq``, written (same shape and dtype; may be
    ``grad_output`` itself, in place); ``scale`` as :class:`~quantplan.DequantizeArgs` takes it.
    The zero point does not enter the gradient, so there is none.
    """

    grad_output: Any
    grad_input: Any
    scale: Any


def _params_struct(name: str, pointers: tuple[str, ...], precision: MathPrecision, zp: bool) -> type[ctypes.Structure]:
    """Argument block of a gradient row kernel: data pointers, scale (and zero point), layout."""
    fields: list[tuple[str, Any]] = [(p, ctypes.c_uint64) for p in pointers]
    fields += [("scale_ptr", ctypes.c_uint64)] + ([("zp_ptr", ctypes.c_uint64)] if zp else [])
    fields += [("scale_value", acc_ctype(precision))] + ([("zp_value", ctypes.c_int32)] if zp else [])
    return params_struct(name, [*fields, ("layout", RowLayoutArgs)])


#: quantize_backward_rows(x, dq, dx, scale_ptr, zp_ptr, scale_value, zp_value, lay)
_QUANTIZE_BACKWARD_PARAMS = {
    p: _params_struct("QuantizeBackwardParams", ("x", "dq", "dx"), p, True) for p in MathPrecision
}
#: dequantize_backward_rows(dy, dq, scale_ptr, scale_value, lay)
_DEQUANTIZE_BACKWARD_PARAMS = {
    p: _params_struct("DequantizeBackwardParams", ("dy", "dq"), p, False) for p in MathPrecision
}


class _Checked(NamedTuple):
    """Operands of one gradient run: the data read (``x``: the forward input, or None), the
    gradient read (``dy``) and written (``dx``), the scale and the zero point."""

    x: Operand | None
    dy: Operand
    dx: Operand
    scale: Operand | float
    zp: Operand | int | None


class _AffineBackwardPlan(OperandChecks, Plan[Any, _Checked]):
    """Shared parts of the two gradient plans: the row kernel, its selection and checks."""

    _category = OpCategory.GRADIENT
    _checked = _Checked
    #: (DequantizeBackwardArgs has no ``input`` or ``zero_point``: they read as None.)
    _extract_fields = ("input", "grad_output", "grad_input", "scale", "zero_point")
    _family: ClassVar[str]
    _kernel: ClassVar[str]
    #: The dense row kernel (``kernels/qp_row_layout.cuh``, ``dense_item``) of the hot layouts.
    _dense_kernel: ClassVar[str]
    #: The problem's element kinds the row kernel is templated on, in template order (then the vector width).
    _template_kinds: ClassVar[tuple[str, ...]]
    #: Parameter block per precision (the kernel's arguments).
    _params: ClassVar[dict[MathPrecision, type[ctypes.Structure]]]

    def __init__(self, problem: AffineProblem, device_id: int | None, pair: LaunchPair | None, variant: str) -> None:
        prepared = () if pair is None else pair.launches
        super().__init__(problem, device_id, problem.float_kind, problem.code_kind, variant, prepared=prepared)
        self._pair = pair
        self._param_shape = problem.param_shape
        self._tensor_scope = isinstance(problem.scope, TensorScope)
        self._info = ELEMENTS[problem.float_kind]
        self._param_dtype = problem.scale_dtype

    # ---- selection ------------------------------------------------------------------------

    @classmethod
    def _kernel_name(cls, problem: AffineProblem, vec: int) -> str:
        tags = [ELEMENTS[getattr(problem, kind)].cpp_tag for kind in cls._template_kinds]
        return template_name(cls._kernel, *tags, vec)

    @classmethod
    def _unit(cls, problem: AffineProblem) -> list[str]:
        raise NotImplementedError

    @classmethod
    def _build(cls, stream: Any, problem: AffineProblem, pref: PlanPreference | None) -> Any:
        if choose_backend(pref, stream) is BackendKind.REFERENCE:
            return cls(problem, None, None, REFERENCE_VARIANT)
        device_id = stream_device_id(stream)
        info = device_info(device_id)
        functions = load_kernels(cls._family, cls._unit(problem), info.arch, device_id, kernel_options())

        def prepare(layout: RowLayout) -> PreparedLaunch:
            fn = functions[cls._kernel_name(problem, layout.vec)]
            grid = occupancy_grid(fn, BLOCK_THREADS, layout.blocks(2**62), info)
            args = layout.args(problem.q_min, problem.q_max)
            return PreparedLaunch(fn, grid, BLOCK_THREADS, cls._params[problem.precision], layout=args)

        float_info = ELEMENTS[problem.float_kind]
        primary = row_layout(problem.shape, problem.scope, float_info.vec_max, False, info.busy_threads)
        fallback = row_layout(problem.shape, problem.scope, 1, False, info.busy_threads)
        primary_launch: PreparedLaunch | None = None
        if problem.float_kind in ROW_DENSE_FLOAT_KINDS:
            dense = dense_row_layout(
                problem.shape, problem.scope, cls._dense_kernel, False, info.sm_count, problem.float_kind
            )
            if dense is not None:
                primary = dense
                name = dense_row_kernel_name(cls._dense_kernel, problem.float_kind, problem.code_kind, False, dense.vec)
                args = dense.args(problem.q_min, problem.q_max)
                primary_launch = PreparedLaunch(
                    functions[name], dense.items, dense.threads, cls._params[problem.precision], layout=args
                )
        align = min(16, primary.vec * float_info.storage_bits // 8)
        pair = LaunchPair(primary_launch or prepare(primary), prepare(fallback), align)
        variant = f"{problem.scope.kind}/{problem.mode.value}/{primary.describe()}"
        return cls(problem, device_id, pair, variant)

    # ---- arguments --------------------------------------------------------------------------

    def _data(self, value: Any, name: str) -> Operand:
        return self._tensor(value, name, self.problem.shape, self._info)

    def _grads(self, dy_value: Any, dy_name: str, dx_value: Any, dx_name: str) -> tuple[Operand, Operand]:
        return self._data(dy_value, dy_name), self._data(dx_value, dx_name)

    def _check_values(self, checked: _Checked) -> None:
        check_param_values(checked.scale, checked.zp, self.problem.q_min, self.problem.q_max)

    # ---- execution --------------------------------------------------------------------------

    def _launch(self, handle: int, workspace: Workspace | None, a: _Checked) -> None:
        assert self._pair is not None and self.device_id is not None
        x_ptr = 0 if a.x is None else a.x.ptr
        launch = self._pair.pick(a.dy.ptr, a.dx.ptr, x_ptr)
        params = launch.params
        if a.x is None:
            params.dy, params.dq = a.dy.ptr, a.dx.ptr
        else:
            params.x, params.dq, params.dx = x_ptr, a.dy.ptr, a.dx.ptr
            params.zp_ptr, params.zp_value = device_arg(a.zp)
        params.scale_ptr, params.scale_value = device_arg(a.scale)
        launch_on(self.device_id, handle, launch)


class QuantizeBackwardPlan(_AffineBackwardPlan):
    """The straight-through gradient of :class:`~quantplan.QuantizePlan` w.r.t. its float input.

    Formula: ``dx = dq / scale`` where the forward's pre-clamp value is inside the code range,
    else ``+0`` (a select, not a product: ``dq`` NaN or Inf outside still gives ``+0``):

    * integer codes (S8 / U8 / S4 / U4, any ``q_min`` / ``q_max``): ``q_min <= rne(x / scale) + zp <= q_max``,
      inclusive at both ends;
    * FP8 codes: ``|x / scale| <= fp8_max`` (448 for E4M3, 57344 for E5M2);
    * NaN and +-Inf ``x`` are outside (so their ``dx`` is ``+0``).

    ``x / scale`` is the forward's own quotient and rounding (the same device helpers, exact
    division fallback included), so the mask agrees with QuantizePlan's codes bit for bit.
    ``dq / scale`` is an IEEE division in float32 (float64 for F64), rounded once to the data
    type. Chained after :class:`DequantizeBackwardPlan` (``dq = dy * scale``) this gives
    ``(dy * scale) / scale * mask``: :class:`~quantplan.FakeQuantizeBackwardPlan`'s ``dy * mask``
    up to that one rounding round trip (exact for power-of-two scales), and up to inputs where
    the fake quantizer's ``rne(x * rn(1 / scale))`` and this ``rne(x / scale)`` round differently at a tie.

    **When to use:** training through an explicit quantize -> dequantize pair (W8A8 / FP8
    training, a custom ``torch.autograd.Function`` around QuantizePlan) when the straight-through
    estimator should see the scale: the gradient w.r.t. the float input from the gradient
    w.r.t. the codes. For fused fake quantization use FakeQuantizeBackwardPlan.

    **Dtypes:** ``input``, ``grad_output``, ``grad_input`` of the descriptor's ``input_element``
    (F16 / BF16 / F32 / F64; uint16 raw bits for BF16); any ``output_element`` (S8 / U8 / S4 / U4 /
    FP8_E4M3 / FP8_E5M2) and nibble order. ``scale`` float32 (float64 for F64); ``zero_point`` int32.

    **Shape limits:** any rank, any extents, every scope (tensor, token, channel, group); 64-bit
    indexing, no limit on rows; a row (merged trailing axes) below 2**31 elements. All three
    tensors have the float shape (4-bit codes: unpacked). In place allowed (``grad_input`` is
    ``grad_output``); ``grad_input`` must not overlap ``input``. Rounding.STOCHASTIC descriptors
    raise Unsupported. Array scales are used as given (not checked on the device).

    **Workspace:** none.

    **Precision guarantee:** float32 arithmetic (float64 for F64), IEEE division, one rounding to
    the data type; equal bit for bit to :func:`quantplan.reference.quantize_backward` (NaN
    payloads aside); deterministic.
    """

    _args_type = QuantizeBackwardArgs
    _family = "quantize"
    _kernel = "quantize_backward_rows"
    _dense_kernel = "quantize_backward_dense"
    _params = _QUANTIZE_BACKWARD_PARAMS
    _template_kinds = ("float_kind", "code_kind")

    @classmethod
    def _unit(cls, problem: AffineProblem) -> list[str]:
        return quantize_unit(problem.float_kind, problem.code_kind, problem.high_first, problem.rounding)

    @classmethod
    def select(cls, stream: Any, desc: QuantizeDescriptor, pref: PlanPreference | None = None) -> QuantizeBackwardPlan:
        """Validate ``desc`` (a :class:`QuantizeBackwardDescriptor`, or the forward's
        :class:`~quantplan.QuantizeDescriptor`), pick the backend and kernel variant, compile it
        on first use (one module with the forward's kernels).

        Raises InvalidProblem for a malformed descriptor (the forward's rules), Unsupported for
        Rounding.STOCHASTIC.
        """
        problem = quantize_problem(desc)
        if problem.stochastic:
            raise Unsupported(
                "QuantizeBackwardPlan needs rounding=NEAREST_EVEN: the mask of a stochastically rounded "
                "forward depends on its random draws; take the nearest-even mask or use FakeQuantizeBackwardPlan"
            )
        return preferred(cls._build(stream, problem, pref), pref)  # type: ignore[no-any-return]

    def _check(self, args: QuantizeBackwardArgs) -> _Checked:
        x = self._data(args.input, "input")
        dq, dx = self._grads(args.grad_output, "grad_output", args.grad_input, "grad_input")
        scale = self._positive_scale(args.scale, self._param_dtype)
        zp: Operand | int | None = None
        if self.problem.mode is QuantMode.SYMMETRIC:
            if args.zero_point is not None:
                raise InvalidProblem("zero_point must be None in SYMMETRIC mode (the zero point is 0)")
        else:
            zp = self._int32_zero_point(args.zero_point, np.dtype(np.int32))
        read = (("grad_output", dq), ("input", x), ("scale", scale), ("zero_point", zp))
        check_outputs((("grad_input", dx),), read, in_place=("grad_input", "grad_output"))
        return _Checked(x, dq, dx, scale, zp)

    def _run_reference(self, a: _Checked) -> None:
        p = self.problem
        assert a.x is not None
        zp_np: np.ndarray | int = (
            0 if a.zp is None else self._broadcast_param(a.zp, p.shape, p.scope, np.dtype(np.int32))
        )
        result = reference.quantize_backward(
            self._host_view(a.x, p.shape, self._info),
            self._host_view(a.dy, p.shape, self._info),
            self._broadcast_param(a.scale, p.shape, p.scope, self._param_dtype),
            zp_np,
            p.code_kind,
            p.q_min,
            p.q_max,
            p.precision,
        )
        self._write_host(a.dx, result)


class DequantizeBackwardPlan(_AffineBackwardPlan):
    """The gradient of :class:`~quantplan.DequantizePlan` w.r.t. its codes (taken as floats).

    Formula: ``dq = dy * scale`` in float32 (float64 for F64), rounded once to the data type. The
    forward ``y = (q - zp) * scale`` is affine in ``q``: no mask, and the zero point does not
    enter. Followed by :class:`QuantizeBackwardPlan` (``dx = dq / scale * mask``) this gives the
    straight-through gradient of a quantize -> dequantize pair, ``(dy * scale) / scale * mask``:
    :class:`~quantplan.FakeQuantizeBackwardPlan`'s ``dy * mask`` up to that one rounding round trip.

    **When to use:** backpropagating through a dequantization whose codes come from a quantizer
    (quantize -> dequantize training, FP8 / int8 activations with a straight-through estimator).

    **Dtypes:** ``grad_output`` / ``grad_input`` of the descriptor's ``output_element`` (F16 / BF16 /
    F32 / F64; uint16 raw bits for BF16); any ``input_element`` (S8 / U8 / S4 / U4 / FP8_E4M3 /
    FP8_E5M2), mode and nibble order (validated as for the forward). ``scale`` float32 (float64 for F64).

    **Shape limits:** any rank, any extents, every scope; 64-bit indexing, no limit on rows; a
    row below 2**31 elements. Both tensors have the float shape (4-bit codes: unpacked). In place
    allowed (``grad_input`` is ``grad_output``).

    **Workspace:** none.

    **Precision guarantee:** one product in float32 (float64 for F64), one rounding to the data
    type; equal bit for bit to :func:`quantplan.reference.dequantize_backward` (NaN payloads
    aside); deterministic.
    """

    _args_type = DequantizeBackwardArgs
    _family = "dequantize"
    _kernel = "dequantize_backward_rows"
    _dense_kernel = "dequantize_backward_dense"
    _params = _DEQUANTIZE_BACKWARD_PARAMS
    _template_kinds = ("float_kind",)

    @classmethod
    def _unit(cls, problem: AffineProblem) -> list[str]:
        return dequantize_unit(problem.float_kind, problem.code_kind, problem.high_first)

    @classmethod
    def select(
        cls, stream: Any, desc: DequantizeDescriptor, pref: PlanPreference | None = None
    ) -> DequantizeBackwardPlan:
        """Validate ``desc`` (a :class:`DequantizeBackwardDescriptor`, or the forward's
        :class:`~quantplan.DequantizeDescriptor`), pick the backend and kernel variant, compile
        it on first use (one module with the forward's kernels). Raises InvalidProblem for a
        malformed descriptor (the forward's rules)."""
        return preferred(cls._build(stream, dequantize_problem(desc), pref), pref)  # type: ignore[no-any-return]

    def _check(self, args: DequantizeBackwardArgs) -> _Checked:
        dy, dq = self._grads(args.grad_output, "grad_output", args.grad_input, "grad_input")
        scale = self._positive_scale(args.scale, self._param_dtype)
        check_outputs(
            (("grad_input", dq),), (("grad_output", dy), ("scale", scale)), in_place=("grad_input", "grad_output")
        )
        return _Checked(None, dy, dq, scale, None)

    def _run_reference(self, a: _Checked) -> None:
        p = self.problem
        result = reference.dequantize_backward(
            self._host_view(a.dy, p.shape, self._info),
            self._broadcast_param(a.scale, p.shape, p.scope, self._param_dtype),
            p.precision,
        )
        self._write_host(a.dx, result)


__all__ = [
    "DequantizeBackwardArgs",
    "DequantizeBackwardDescriptor",
    "DequantizeBackwardPlan",
    "QuantizeBackwardArgs",
    "QuantizeBackwardDescriptor",
    "QuantizeBackwardPlan",
]
