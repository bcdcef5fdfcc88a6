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
``kernels/dequantize.cu``, compiled in the forward plans' units (:func:`quantplan.static_quantize.quantize_unit`,
:func:`~quantplan.static_quantize.dequantize_unit`); reference: :func:`quantplan.reference.quantize_backward`
/ :func:`~quantplan.reference.dequantize_backward`; tests: ``tests/test_quantize_backward_*.py`` and
``tests/test_reference_quantize_backward.py``.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from . import reference
from ._affine import AffineProblem, OperandChecks, choose_backend, resolve_affine_problem
from ._device import device_info, stream_device_id
from ._launch import PreparedLaunch, launch_on, stream_handle
from ._layout import BLOCK_THREADS, RowLayout, RowLayoutArgs, row_layout
from ._operands import Operand, overlaps, same_or_disjoint
from .compiler import compile_options, load_kernels, template_name
from .elements import ELEMENTS, ElementInfo, param_element, param_numpy_dtype
from .errors import InvalidProblem, Unsupported
from .static_quantize import (
    DequantizeDescriptor,
    QuantizeDescriptor,
    backward_widths,
    dequantize_unit,
    quantize_problem,
    quantize_unit,
)
from .types import (
    HOST_ARCH,
    BackendKind,
    KernelSku,
    MathPrecision,
    NibbleOrder,
    OpCategory,
    PlanPreference,
    PrecisionGuarantee,
    QuantizeKind,
    QuantMode,
    TensorScope,
)
from .workspace import Workspace, check_workspace

#: Threads one SM keeps resident (sizes the small-problem chunking of ``row_layout``).
_RESIDENT_THREADS_PER_SM = 2048
_INT32 = (-(2**31), 2**31 - 1)


class QuantizeBackwardDescriptor(QuantizeDescriptor):
    """The gradient of a :class:`~quantplan.QuantizeDescriptor` problem (same fields, same meaning).

    ``dx = dq / scale`` where ``q_min <= rne(x / scale) + zp <= q_max`` (FP8: ``|x / scale| <= fp8_max``),
    else ``+0``. Build it from the forward's fields, or with :meth:`from_forward`. ``rounding``
    must be NEAREST_EVEN (a stochastic forward's mask depends on its random draws: Unsupported).

    Shapes it implies: ``grad_shape`` (``input``, ``grad_output`` and ``grad_input``: the float
    shape, unpacked even for 4-bit codes) and ``param_shape``. (``output_shape`` is the forward's
    code storage, not an operand of the backward.)
    """

    @classmethod
    def from_forward(cls, desc: QuantizeDescriptor) -> QuantizeBackwardDescriptor:
        """The backward descriptor of the forward problem ``desc`` (every field copied)."""
        return cls(**{name: getattr(desc, name) for name in QuantizeDescriptor.model_fields})

    @property
    def grad_shape(self) -> tuple[int, ...]:
        """Shape of ``input``, ``grad_output`` and ``grad_input``."""
        return self.shape


class DequantizeBackwardDescriptor(DequantizeDescriptor):
    """The gradient of a :class:`~quantplan.DequantizeDescriptor` problem w.r.t. the codes (same fields).

    ``dq = dy * scale``, in the forward's ``output_element`` (the float type of ``dy``); the
    codes' kind, mode and nibble order are validated as for the forward but do not change the
    gradient. Build it from the forward's fields, or with :meth:`from_forward`.

    Shapes it implies: ``grad_shape`` (``grad_output`` and ``grad_input``: the float shape,
    unpacked even for 4-bit codes) and ``param_shape``.
    """

    @classmethod
    def from_forward(cls, desc: DequantizeDescriptor) -> DequantizeBackwardDescriptor:
        """The backward descriptor of the forward problem ``desc`` (every field copied)."""
        return cls(**{name: getattr(desc, name) for name in DequantizeDescriptor.model_fields})

    @property
    def grad_shape(self) -> tuple[int, ...]:
        """Shape of ``grad_output`` and ``grad_input``."""
        return self.shape


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


def _acc_type(precision: MathPrecision) -> type[ctypes.c_float] | type[ctypes.c_double]:
    return ctypes.c_double if precision is MathPrecision.F64 else ctypes.c_float


def _params_struct(name: str, pointers: tuple[str, ...], precision: MathPrecision, zp: bool) -> type[ctypes.Structure]:
    """Argument block of a gradient row kernel: data pointers, scale (and zero point), layout."""
    fields: list[tuple[str, Any]] = [(p, ctypes.c_uint64) for p in pointers]
    fields += [("scale_ptr", ctypes.c_uint64)] + ([("zp_ptr", ctypes.c_uint64)] if zp else [])
    fields += [("scale_value", _acc_type(precision))] + ([("zp_value", ctypes.c_int32)] if zp else [])
    fields += [("layout", RowLayoutArgs)]
    return type(name, (ctypes.Structure,), {"_fields_": fields})


#: quantize_backward_rows(x, dq, dx, scale_ptr, zp_ptr, scale_value, zp_value, lay)
_QUANTIZE_BACKWARD_PARAMS = {
    p: _params_struct("QuantizeBackwardParams", ("x", "dq", "dx"), p, True) for p in MathPrecision
}
#: dequantize_backward_rows(dy, dq, scale_ptr, scale_value, lay)
_DEQUANTIZE_BACKWARD_PARAMS = {
    p: _params_struct("DequantizeBackwardParams", ("dy", "dq"), p, False) for p in MathPrecision
}


class _GradLaunches:
    """A gradient kernel with aligned vector I/O and its one-element-vector twin for misaligned operands."""

    __slots__ = ("align", "fallback", "primary")

    def __init__(self, primary: PreparedLaunch, fallback: PreparedLaunch, align: int) -> None:
        self.primary, self.fallback, self.align = primary, fallback, align

    def pick(self, *ptrs: int) -> PreparedLaunch:
        return self.primary if all(p % self.align == 0 for p in ptrs) else self.fallback


class _AffineBackwardPlan(OperandChecks):
    """Shared parts of the two gradient plans: backend, operand and parameter checks, launches, SKU."""

    _family: ClassVar[str]
    _kernel: ClassVar[str]
    #: Parameter block per precision (the kernel's arguments).
    _params: ClassVar[dict[MathPrecision, type[ctypes.Structure]]]

    def __init__(
        self,
        problem: AffineProblem,
        backend: BackendKind,
        device_id: int | None,
        arch_name: str,
        variant: str,
        launches: _GradLaunches | None,
    ) -> None:
        self.problem = problem
        self.backend = backend
        self.device_id = device_id
        self._arch_name = arch_name
        self._variant = variant
        self._launches = launches
        self._param_shape = problem.param_shape
        self._tensor_scope = isinstance(problem.scope, TensorScope)
        self._info: ElementInfo = ELEMENTS[problem.float_kind]
        self._param_dtype = param_numpy_dtype(problem.precision)

    # ---- selection ------------------------------------------------------------------------

    @classmethod
    def _kernel_name(cls, problem: AffineProblem, vec: int) -> str:
        raise NotImplementedError

    @classmethod
    def _unit(cls, problem: AffineProblem) -> list[str]:
        raise NotImplementedError

    @classmethod
    def _build(cls, stream: Any, problem: AffineProblem, pref: PlanPreference) -> Any:
        backend = choose_backend(pref)
        if backend is BackendKind.REFERENCE:
            return cls(problem, backend, None, HOST_ARCH.name, "numpy", None)
        import cupy

        device_id = stream_device_id(stream)
        info = device_info(device_id)
        functions = load_kernels(cls._family, cls._unit(problem), info.arch, device_id, compile_options())
        busy = info.sm_count * _RESIDENT_THREADS_PER_SM
        vec_max = backward_widths(problem.float_kind)[0]

        def prepare(layout: RowLayout) -> PreparedLaunch:
            fn = functions[cls._kernel_name(problem, layout.vec)]
            per_sm = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.ptr, BLOCK_THREADS, 0)
            return PreparedLaunch(
                fn,
                layout.blocks(max(1, per_sm) * info.sm_count),
                BLOCK_THREADS,
                cls._params[problem.precision],
                layout=layout.args(problem.q_min, problem.q_max),
            )

        primary = row_layout(problem.shape, problem.scope, vec_max, False, busy)
        fallback = row_layout(problem.shape, problem.scope, 1, False, busy)
        align = min(16, primary.vec * ELEMENTS[problem.float_kind].storage_bits // 8)
        launches = _GradLaunches(prepare(primary), prepare(fallback), align)
        variant = f"{problem.scope.kind}/{problem.mode.value}/{primary.describe()}"
        return cls(problem, backend, device_id, info.arch.name, variant, launches)

    # ---- introspection --------------------------------------------------------------------

    def workspace_size(self) -> int:
        """Bytes of workspace ``run`` needs: always 0 (elementwise)."""
        return 0

    def precision_guarantee(self) -> PrecisionGuarantee:
        """float32 arithmetic (float64 for F64 data), no reduction, bit-exact to the reference, deterministic."""
        return PrecisionGuarantee(
            math_precision=self.problem.precision, accumulator=param_element(self.problem.precision)
        )

    def sku(self) -> KernelSku:
        """Identity of the selected kernel: category GRADIENT, ``element`` the float type of the
        gradients, ``aux_element`` the forward's code kind, ``variant`` the row layout."""
        return KernelSku(
            category=OpCategory.GRADIENT,
            op=QuantizeKind.STATIC,
            element=self.problem.float_kind,
            aux_element=self.problem.code_kind,
            variant=self._variant,
            arch=self._arch_name,
            backend=self.backend,
            precision_guarantee=self.precision_guarantee(),
        )

    # ---- argument checks ------------------------------------------------------------------

    def _data(self, value: Any, name: str) -> Operand:
        return self._tensor(value, name, self.problem.shape, self._info)

    def _set_scale(self, params: Any, scale: Operand | float) -> None:
        if isinstance(scale, Operand):
            params.scale_ptr, params.scale_value = scale.ptr, 1.0
        else:
            params.scale_ptr, params.scale_value = 0, scale


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

    _family = "quantize"
    _kernel = "quantize_backward_rows"
    _params = _QUANTIZE_BACKWARD_PARAMS

    @classmethod
    def _kernel_name(cls, problem: AffineProblem, vec: int) -> str:
        f_tag, c_tag = ELEMENTS[problem.float_kind].cpp_tag, ELEMENTS[problem.code_kind].cpp_tag
        return template_name(cls._kernel, f_tag, c_tag, vec)

    @classmethod
    def _unit(cls, problem: AffineProblem) -> list[str]:
        high_first = problem.nibble_order is NibbleOrder.HIGH_FIRST
        return quantize_unit(problem.float_kind, problem.code_kind, high_first, False)

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
        plan = cls._build(stream, problem, pref or PlanPreference())
        assert isinstance(plan, QuantizeBackwardPlan)
        return plan

    def _zero_point(self, value: Any) -> Operand | int | None:
        """``zero_point`` as QuantizePlan takes it: None for SYMMETRIC, else an int32 array of
        ``param_shape`` or, for TensorScope, an integer in the int32 range."""
        if self.problem.mode is QuantMode.SYMMETRIC:
            if value is not None:
                raise InvalidProblem("zero_point must be None in SYMMETRIC mode (the zero point is 0)")
            return None
        zp = self._param(value, "zero_point", np.dtype(np.int32), allow_none=False)
        if isinstance(zp, Operand):
            return zp
        assert zp is not None
        if float(zp) != int(zp) or not _INT32[0] <= int(zp) <= _INT32[1]:
            raise InvalidProblem(f"zero_point={zp!r} must be an integer in the int32 range")
        return int(zp)

    def _check(
        self, args: QuantizeBackwardArgs
    ) -> tuple[Operand, Operand, Operand, Operand | float, Operand | int | None]:
        x = self._data(args.input, "input")
        dq = self._data(args.grad_output, "grad_output")
        dx = self._data(args.grad_input, "grad_input")
        same_or_disjoint(dx, "grad_input", dq, "grad_output")
        if overlaps(dx, x):
            raise InvalidProblem("grad_input overlaps input; the plan reads input while writing grad_input")
        return x, dq, dx, self._positive_scale(args.scale, self._param_dtype), self._zero_point(args.zero_point)

    def can_implement(self, args: QuantizeBackwardArgs) -> bool:
        """Check ``args`` against the plan (shape, dtype, device, contiguity, alignment, overlap,
        parameters). Returns True, or raises InvalidProblem / MisalignedOperand naming the argument."""
        self._check(args)
        return True

    def run(self, stream: Any, workspace: Workspace | None, args: QuantizeBackwardArgs) -> None:
        """Compute ``grad_input`` on ``stream`` (CuPy / PyTorch stream, raw handle, or None for the
        current CuPy stream): one launch, no allocation, no synchronisation (capturable in a CUDA graph).
        Every check runs before anything is launched or written."""
        check_workspace(workspace, 0)
        x, dq, dx, scale, zp = self._check(args)
        p = self.problem
        if self.backend is BackendKind.REFERENCE:
            zp_np: np.ndarray | int = (
                0
                if zp is None
                else self._broadcast_param(zp, self.problem.shape, self.problem.scope, np.dtype(np.int32))
            )
            result = reference.quantize_backward(
                self._host_view(x, self.problem.shape, self._info),
                self._host_view(dq, self.problem.shape, self._info),
                self._broadcast_param(scale, self.problem.shape, self.problem.scope, self._param_dtype),
                zp_np,
                p.code_kind,
                p.q_min,
                p.q_max,
                p.precision,
            )
            self._write_host(dx, result)
            return
        if p.numel == 0:
            return
        assert self._launches is not None and self.device_id is not None
        launch = self._launches.pick(x.ptr, dq.ptr, dx.ptr)
        params = launch.params
        params.x, params.dq, params.dx = x.ptr, dq.ptr, dx.ptr
        self._set_scale(params, scale)
        if isinstance(zp, Operand):
            params.zp_ptr, params.zp_value = zp.ptr, 0
        else:
            params.zp_ptr, params.zp_value = 0, zp or 0
        launch_on(self.device_id, stream_handle(stream), launch)


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

    _family = "dequantize"
    _kernel = "dequantize_backward_rows"
    _params = _DEQUANTIZE_BACKWARD_PARAMS

    @classmethod
    def _kernel_name(cls, problem: AffineProblem, vec: int) -> str:
        return template_name(cls._kernel, ELEMENTS[problem.float_kind].cpp_tag, vec)

    @classmethod
    def _unit(cls, problem: AffineProblem) -> list[str]:
        high_first = problem.nibble_order is NibbleOrder.HIGH_FIRST
        return dequantize_unit(problem.float_kind, problem.code_kind, high_first)

    @classmethod
    def select(
        cls, stream: Any, desc: DequantizeDescriptor, pref: PlanPreference | None = None
    ) -> DequantizeBackwardPlan:
        """Validate ``desc`` (a :class:`DequantizeBackwardDescriptor`, or the forward's
        :class:`~quantplan.DequantizeDescriptor`), pick the backend and kernel variant, compile
        it on first use (one module with the forward's kernels). Raises InvalidProblem for a
        malformed descriptor (the forward's rules)."""
        problem = resolve_affine_problem(
            desc.shape, desc.scope, desc.mode, desc.output_element, desc.input_element, None, None, desc.nibble_order
        )
        plan = cls._build(stream, problem, pref or PlanPreference())
        assert isinstance(plan, DequantizeBackwardPlan)
        return plan

    def _check(self, args: DequantizeBackwardArgs) -> tuple[Operand, Operand, Operand | float]:
        dy = self._data(args.grad_output, "grad_output")
        dq = self._data(args.grad_input, "grad_input")
        same_or_disjoint(dq, "grad_input", dy, "grad_output")
        return dy, dq, self._positive_scale(args.scale, self._param_dtype)

    def can_implement(self, args: DequantizeBackwardArgs) -> bool:
        """Check ``args`` against the plan (shape, dtype, device, contiguity, alignment, overlap,
        scale). Returns True, or raises InvalidProblem / MisalignedOperand naming the argument."""
        self._check(args)
        return True

    def run(self, stream: Any, workspace: Workspace | None, args: DequantizeBackwardArgs) -> None:
        """Compute ``grad_input`` on ``stream``: one launch, no allocation, no synchronisation
        (capturable in a CUDA graph). Every check runs before anything is launched or written."""
        check_workspace(workspace, 0)
        dy, dq, scale = self._check(args)
        p = self.problem
        if self.backend is BackendKind.REFERENCE:
            result = reference.dequantize_backward(
                self._host_view(dy, self.problem.shape, self._info),
                self._broadcast_param(scale, self.problem.shape, self.problem.scope, self._param_dtype),
                p.precision,
            )
            self._write_host(dq, result)
            return
        if p.numel == 0:
            return
        assert self._launches is not None and self.device_id is not None
        launch = self._launches.pick(dy.ptr, dq.ptr)
        params = launch.params
        params.dy, params.dq = dy.ptr, dq.ptr
        self._set_scale(params, scale)
        launch_on(self.device_id, stream_handle(stream), launch)


__all__ = [
    "DequantizeBackwardArgs",
    "DequantizeBackwardDescriptor",
    "DequantizeBackwardPlan",
    "QuantizeBackwardArgs",
    "QuantizeBackwardDescriptor",
    "QuantizeBackwardPlan",
]
