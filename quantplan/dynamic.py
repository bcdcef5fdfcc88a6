"""DynamicRangeQuantizePlan: scale (and zero point) from the tensor's runtime range, then quantize.

SPEC section 4, dynamic range. The CUDA path runs four launches on one stream: statistics reset,
per-segment range (lo, hi, non-finite flag) by order-independent integer atomics, parameters,
and the quantization kernel of :class:`~quantplan.QuantizePlan` reading those parameters.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from . import reference
from ._affine import (
    AffineProblem,
    CheckedArgs,
    choose_backend,
    device_arg,
    reference_uniform,
    resolve_affine_problem,
)
from ._device import device_info, stream_device_id
from ._launch import PreparedLaunch, launch_on, stream_handle
from ._layout import BLOCK_THREADS, RowLayout, RowLayoutArgs, row_layout
from ._operands import Operand, operand
from .compiler import compile_options, load_kernels, register_family, template_name
from .elements import ELEMENTS, FLOAT_KINDS, param_element, param_numpy_dtype
from .errors import InvalidProblem
from .quantize import QuantizeDescriptor, QuantizePlan
from .types import (
    HOST_ARCH,
    BackendKind,
    ElementKind,
    KernelSku,
    MathPrecision,
    OpCategory,
    PlanPreference,
    PrecisionGuarantee,
    QuantizeKind,
    QuantMode,
    Rounding,
)
from .workspace import Workspace, check_workspace

_FAMILY = "dynamic_range"


class DynamicRangeQuantizeDescriptor(QuantizeDescriptor):
    """A dynamic-range quantization problem: parameters from the data, then ``q``.

    The fields and implied shapes of :class:`~quantplan.QuantizeDescriptor` (``shape``, ``scope``,
    ``mode``, ``input_element``, ``output_element``, ``q_min`` / ``q_max``, ``nibble_order``,
    ``rounding``; ``output_shape``, ``param_shape``); here ``param_shape`` is the shape of
    ``scale_out`` and ``zero_point_out``, which the plan writes.
    """


@dataclass(slots=True)
class DynamicRangeQuantizeArgs:
    """Arguments of :class:`DynamicRangeQuantizePlan`.

    ``input`` (floats), ``output`` (codes), ``scale_out`` (float32, float64 for F64 input, of
    ``param_shape``), ``zero_point_out`` (int32 of ``param_shape`` for ASYMMETRIC, None for
    SYMMETRIC), and for STOCHASTIC rounding ``rng_seed`` / ``rng_offset`` (Python ints in
    [0, 2**64) or one-element int64 device arrays).
    """

    input: Any
    output: Any
    scale_out: Any
    zero_point_out: Any = None
    rng_seed: Any = None
    rng_offset: Any = None


def _params_struct(name: str, fields: list[tuple[str, Any]]) -> type[ctypes.Structure]:
    return type(name, (ctypes.Structure,), {"_fields_": fields})


_INIT_PARAMS = _params_struct("RangeInitParams", [("stats", ctypes.c_uint64), ("count", ctypes.c_int64)])
_STATS_PARAMS = _params_struct(
    "RangeStatsParams", [("x", ctypes.c_uint64), ("stats", ctypes.c_uint64), ("layout", RowLayoutArgs)]
)
_PARAMS_PARAMS = {
    precision: _params_struct(
        "RangeParamsParams",
        [
            ("stats", ctypes.c_uint64),
            ("scale_out", ctypes.c_uint64),
            ("zp_out", ctypes.c_uint64),
            ("count", ctypes.c_int64),
            ("mode", ctypes.c_int32),
            ("q_min", ctypes.c_int32),
            ("q_max", ctypes.c_int32),
            ("divisor", acc),
        ],
    )
    for precision, acc in ((MathPrecision.F32, ctypes.c_float), (MathPrecision.F64, ctypes.c_double))
}


def _acc_tag(precision: MathPrecision) -> str:
    return "double" if precision is MathPrecision.F64 else "float"


def dynamic_range_unit(float_kind: ElementKind) -> list[str]:
    """The range kernels of one input kind: reset, every vector width of the statistics pass, parameters."""
    precision = ELEMENTS[float_kind].math_precision
    acc = _acc_tag(precision)
    vec_max = 4 if float_kind is ElementKind.F64 else 8
    tag = ELEMENTS[float_kind].cpp_tag
    rows = [template_name("range_stats_rows", tag, v, True) for v in (8, 4, 2, 1) if v <= vec_max]
    return [template_name("range_stats_init", acc), *rows, template_name("range_params", acc)]


@register_family(_FAMILY)
def dynamic_range_units() -> list[list[str]]:
    """Compile units of ``kernels/dynamic_range.cu``: one per input float kind."""
    return [dynamic_range_unit(k) for k in FLOAT_KINDS]


class DynamicRangeQuantizePlan:
    """Quantization with parameters computed from the tensor's runtime range, per segment of ``scope``.

    Formulas (SPEC section 4; arithmetic in float32, float64 for F64 input):

    * SYMMETRIC: ``scale = max|x| / q_max`` (FP8: ``/ fp8_max``), ``q = clamp(rne(x / scale), q_min, q_max)``.
    * ASYMMETRIC: ``lo = min(min x, 0)``, ``hi = max(max x, 0)``, ``scale = (hi - lo) / (q_max - q_min)``,
      ``zp = clamp(q_min - rne(lo / scale), q_min, q_max)``, ``q = clamp(rne(x / scale) + zp, q_min, q_max)``.
    * ``scale == 0`` (all-zero segment, or a range whose scale underflows) -> ``scale = 1`` (zero maps
      to the zero point exactly); a segment holding NaN or +-Inf -> ``scale = NaN``, ``zp = 0`` and
      every code of it 0 (the zero point; FP8 byte 0x00).
    * ``Rounding.STOCHASTIC`` replaces rne by Philox stochastic rounding (see QuantizeDescriptor).

    ``scale_out`` / ``zero_point_out`` feed :class:`~quantplan.DequantizePlan` directly.

    **When to use:** activations and gradients whose range is only known at run time (LLM
    inference per token, per-group int4 weights produced on the fly). With a known scale, use
    QuantizePlan (one pass instead of two).

    **Dtypes:** input F16 / BF16 / F32 / F64; output S8 / U8 / S4 / U4 (packed, either nibble
    order) / FP8_E4M3 / FP8_E5M2 (FP8: SYMMETRIC only). ``scale_out`` float32 (float64 for F64);
    ``zero_point_out`` int32.

    **Shape limits:** any rank, any extents, 64-bit indexing, no row limit.

    **Workspace:** ``workspace_size()`` bytes (three integers per segment) on the GPU;
    a smaller workspace raises WorkspaceTooSmall. None on the reference backend.

    **Precision guarantee:** bit-exact to :func:`quantplan.reference.dynamic_quantize` (codes,
    scales and zero points); deterministic (the range reductions are exact, order-independent
    min / max).
    """

    def __init__(
        self,
        desc: DynamicRangeQuantizeDescriptor,
        problem: AffineProblem,
        backend: BackendKind,
        device_id: int | None,
        arch_name: str,
        quantize: QuantizePlan | None,
        launches: dict[str, PreparedLaunch] | None,
        stats_fallback: PreparedLaunch | None,
        stats_align: int,
        variant: str,
    ) -> None:
        self.descriptor = desc
        self.problem = problem
        self.backend = backend
        self.device_id = device_id
        self._arch_name = arch_name
        self._quantize = quantize
        self._launches = launches or {}
        self._stats_fallback = stats_fallback
        self._stats_align = stats_align
        self._variant = variant
        self._param_shape = problem.param_shape
        self._param_count = math.prod(self._param_shape) if self._param_shape else 1
        self._param_dtype = param_numpy_dtype(problem.precision)
        self._key_bytes = 8 if problem.precision is MathPrecision.F64 else 4

    # ---- selection ------------------------------------------------------------------------

    @classmethod
    def select(
        cls, stream: Any, desc: DynamicRangeQuantizeDescriptor, pref: PlanPreference | None = None
    ) -> DynamicRangeQuantizePlan:
        """Validate ``desc``, pick the backend, compile the kernels on first use.

        Raises InvalidProblem for a malformed descriptor (including SYMMETRIC integer codes with
        ``q_max <= 0``, ASYMMETRIC with ``q_min >= q_max``, ASYMMETRIC FP8).
        """
        pref = pref or PlanPreference()
        problem = resolve_affine_problem(
            desc.shape,
            desc.scope,
            desc.mode,
            desc.input_element,
            desc.output_element,
            desc.q_min,
            desc.q_max,
            desc.nibble_order,
        )
        problem = replace(problem, stochastic=desc.rounding is Rounding.STOCHASTIC, layout_flags=1)
        if not ELEMENTS[problem.code_kind].is_fp8:
            if problem.mode is QuantMode.SYMMETRIC and problem.q_max <= 0:
                raise InvalidProblem(
                    f"SYMMETRIC dynamic range needs q_max > 0 (scale = amax / q_max), got {problem.q_max}"
                )
            if problem.mode is QuantMode.ASYMMETRIC and problem.q_min >= problem.q_max:
                raise InvalidProblem(
                    f"ASYMMETRIC dynamic range needs q_min < q_max, got q_min={problem.q_min}, q_max={problem.q_max}"
                )
        backend = choose_backend(pref)
        if backend is BackendKind.REFERENCE:
            return cls(desc, problem, backend, None, HOST_ARCH.name, None, None, None, 1, "numpy")
        import cupy

        device_id = stream_device_id(stream) if stream is not None else int(cupy.cuda.runtime.getDevice())
        info = device_info(device_id)
        quantize = QuantizePlan._select(stream, problem, pref)
        assert isinstance(quantize, QuantizePlan)
        functions = load_kernels(
            _FAMILY, dynamic_range_unit(problem.float_kind), info.arch, device_id, compile_options()
        )
        acc = _acc_tag(problem.precision)
        busy = info.sm_count * 2048
        vec_max = 4 if problem.float_kind is ElementKind.F64 else 8
        tag = ELEMENTS[problem.float_kind].cpp_tag

        def stats_launch(layout: RowLayout) -> PreparedLaunch:
            fn = functions[template_name("range_stats_rows", tag, layout.vec, True)]
            per_sm = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.ptr, BLOCK_THREADS, 0)
            grid = layout.blocks(max(1, per_sm) * info.sm_count)
            return PreparedLaunch(
                fn, grid, BLOCK_THREADS, _STATS_PARAMS, layout=layout.args(problem.q_min, problem.q_max)
            )

        primary = row_layout(problem.shape, problem.scope, vec_max, False, busy)
        fallback = row_layout(problem.shape, problem.scope, 1, False, busy)
        count = math.prod(problem.param_shape) if problem.param_shape else 1
        small_grid = max(1, min(info.sm_count * 8, -(-count // BLOCK_THREADS)))
        code = ELEMENTS[problem.code_kind]
        if code.is_fp8:
            assert code.fp8_max is not None
            divisor = code.fp8_max
        elif problem.mode is QuantMode.SYMMETRIC:
            divisor = float(problem.q_max)
        else:
            divisor = float(problem.q_max - problem.q_min)
        launches = {
            "init": PreparedLaunch(
                functions[template_name("range_stats_init", acc)], small_grid, BLOCK_THREADS, _INIT_PARAMS, count=count
            ),
            "stats": stats_launch(primary),
            "params": PreparedLaunch(
                functions[template_name("range_params", acc)],
                small_grid,
                BLOCK_THREADS,
                _PARAMS_PARAMS[problem.precision],
                count=count,
                mode=0 if problem.mode is QuantMode.SYMMETRIC else 1,
                q_min=problem.q_min,
                q_max=problem.q_max,
                divisor=divisor,
            ),
        }
        in_bytes = ELEMENTS[problem.float_kind].storage_bits // 8
        variant = f"{problem.scope.kind}/{problem.mode.value}/range-atomics+{quantize.sku().variant}"
        return cls(
            desc,
            problem,
            backend,
            device_id,
            info.arch.name,
            quantize,
            launches,
            stats_launch(fallback),
            min(16, primary.vec * in_bytes),
            variant,
        )

    # ---- introspection --------------------------------------------------------------------

    def workspace_size(self) -> int:
        """Bytes of workspace ``run`` needs: three integer statistics per segment on the GPU, 0 on the reference backend."""
        if self.backend is BackendKind.REFERENCE:
            return 0
        return 3 * self._key_bytes * self._param_count

    def precision_guarantee(self) -> PrecisionGuarantee:
        """float32 arithmetic (float64 for F64), exact order-independent range reductions, bit-exact to the reference."""
        return PrecisionGuarantee(
            math_precision=self.problem.precision, accumulator=param_element(self.problem.precision)
        )

    def sku(self) -> KernelSku:
        """Identity of the selected kernels (variant: scope, mode, range pass and quantize layout)."""
        return KernelSku(
            category=OpCategory.QUANTIZE,
            op=QuantizeKind.DYNAMIC_RANGE,
            element=self.problem.float_kind,
            aux_element=self.problem.code_kind,
            variant=self._variant,
            arch=self._arch_name,
            backend=self.backend,
            precision_guarantee=self.precision_guarantee(),
        )

    # ---- arguments --------------------------------------------------------------------------

    def _check(self, args: DynamicRangeQuantizeArgs) -> tuple[CheckedArgs, Operand, Operand | None]:
        helper = self._quantize if self._quantize is not None else _reference_helper(self.problem)
        p = self.problem
        x = helper._tensor(args.input, "input", p.shape, ELEMENTS[p.float_kind])
        y = helper._tensor(args.output, "output", p.code_shape, ELEMENTS[p.code_kind])
        scale = self._param_out(args.scale_out, "scale_out", self._param_dtype)
        zp: Operand | None = None
        if p.mode is QuantMode.ASYMMETRIC:
            zp = self._param_out(args.zero_point_out, "zero_point_out", np.dtype(np.int32))
        elif args.zero_point_out is not None:
            raise InvalidProblem("zero_point_out must be None in SYMMETRIC mode (the zero point is 0)")
        seed: Operand | int | None = None
        offset: Operand | int | None = None
        if p.stochastic:
            seed = helper._rng_value(args.rng_seed, "rng_seed")
            offset = helper._rng_value(args.rng_offset, "rng_offset")
        elif args.rng_seed is not None or args.rng_offset is not None:
            raise InvalidProblem("rng_seed / rng_offset apply only to Rounding.STOCHASTIC plans; leave them None")
        outputs = [("output", y), ("scale_out", scale)] + ([("zero_point_out", zp)] if zp is not None else [])
        for name, out in outputs:
            if self.backend is BackendKind.CUDA and _overlaps(out, x):
                raise InvalidProblem(f"{name} overlaps input; the plan reads the input twice")
        return CheckedArgs(x, y, 0.0, None, seed, offset), scale, zp

    def _param_out(self, value: Any, name: str, dtype: np.dtype) -> Operand:
        helper = self._quantize if self._quantize is not None else _reference_helper(self.problem)
        if value is None:
            raise InvalidProblem(f"{name} is required: an array of shape {self._param_shape} ({dtype.name})")
        op = operand(value, name)
        helper._check_residence(op, name)
        pshape = self._param_shape
        if op.shape != pshape and not (math.prod(pshape) == 1 and op.size == 1):
            raise InvalidProblem(f"{name} has shape {op.shape}, but the scope's parameter shape is {pshape}")
        if op.dtype_name != dtype.name:
            raise InvalidProblem(f"{name} has dtype {op.dtype_name}; this plan writes {dtype.name}")
        if not op.contiguous or op.ptr % op.itemsize:
            raise InvalidProblem(f"{name} must be C-contiguous and aligned to its {op.itemsize}-byte elements")
        return op

    def can_implement(self, args: DynamicRangeQuantizeArgs) -> bool:
        """Check ``args`` (shapes, dtypes, device, contiguity, alignment, rng); True or raises."""
        self._check(args)
        return True

    # ---- execution ------------------------------------------------------------------------

    def run(self, stream: Any, workspace: Workspace | None, args: DynamicRangeQuantizeArgs) -> None:
        """Compute the parameters and quantize on ``stream``; no allocation, no synchronisation.

        Four launches on the GPU (capturable in a CUDA graph); NumPy on the reference backend.
        """
        check_workspace(workspace, self.workspace_size())
        a, scale, zp = self._check(args)
        if self.backend is BackendKind.REFERENCE:
            self._run_reference(a, scale, zp)
            return
        if self.problem.numel == 0:
            return
        assert workspace is not None and self._quantize is not None and self.device_id is not None
        handle = stream_handle(stream)
        stats_ptr = workspace.ptr
        init, params = self._launches["init"], self._launches["params"]
        stats = self._launches["stats"] if a.x.ptr % self._stats_align == 0 else self._stats_fallback
        assert stats is not None
        init.params.stats = stats_ptr
        stats.params.x = a.x.ptr
        stats.params.stats = stats_ptr
        params.params.stats = stats_ptr
        params.params.scale_out = scale.ptr
        params.params.zp_out = 0 if zp is None else zp.ptr
        launch_on(self.device_id, handle, init, stats, params)
        self._quantize.launch_on_device(
            handle,
            a.x.ptr,
            a.y.ptr,
            (scale.ptr, 0.0),
            (0, 0) if zp is None else (zp.ptr, 0),
            device_arg(a.seed),
            device_arg(a.offset),
        )

    def _run_reference(self, a: CheckedArgs, scale: Operand, zp: Operand | None) -> None:
        p = self.problem
        shape = p.shape
        x = np.asarray(a.x.obj).view(ELEMENTS[p.float_kind].numpy_dtype).reshape(shape)
        uniform = reference_uniform(shape, a.seed, a.offset) if p.stochastic else None
        q, s, z = reference.dynamic_quantize(
            x, p.scope, p.mode, p.code_kind, p.q_min, p.q_max, p.precision, p.nibble_order, uniform
        )
        out = np.asarray(a.y.obj).view(ELEMENTS[p.code_kind].numpy_dtype)
        np.copyto(out, q.reshape(out.shape).view(out.dtype), casting="no")
        np.copyto(np.asarray(scale.obj), s.reshape(np.asarray(scale.obj).shape), casting="no")
        if zp is not None and z is not None:
            np.copyto(np.asarray(zp.obj), z.reshape(np.asarray(zp.obj).shape), casting="no")


def _overlaps(a: Operand, b: Operand) -> bool:
    if not a.ptr or not b.ptr:
        return False
    a_end = a.ptr + a.size * a.itemsize
    b_end = b.ptr + b.size * b.itemsize
    return a.ptr < b_end and b.ptr < a_end


def _reference_helper(problem: AffineProblem) -> QuantizePlan:
    """A reference-backend QuantizePlan: reuses its operand checks on the reference backend."""
    plan = QuantizePlan._select(None, problem, PlanPreference(backend=BackendKind.REFERENCE))
    assert isinstance(plan, QuantizePlan)
    return plan


__all__ = ["DynamicRangeQuantizeArgs", "DynamicRangeQuantizeDescriptor", "DynamicRangeQuantizePlan"]
