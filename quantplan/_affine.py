"""Shared machinery of the static affine plans (QuantizePlan, DequantizePlan).

Both plans map between a float tensor and a tensor of codes through per-segment parameters
(scale, zero point) and run the same row kernels; only the direction differs. This module
holds the resolved problem, the operand checks and the CUDA / reference launch paths once.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import numpy as np

from ._device import cuda_available, device_info, stream_device_id
from ._launch import PreparedLaunch, launch_on, stream_handle
from ._layout import BLOCK_THREADS, RowLayout, RowLayoutArgs, expand_params, param_shape, row_layout
from ._operands import Operand, is_scalar, operand
from .compiler import compile_options, load_kernels, template_name
from .elements import ELEMENTS, ElementInfo, param_element, param_numpy_dtype
from .errors import InvalidProblem, MisalignedOperand, Unsupported
from .philox import uniform_for_elements
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
    Scope,
    TensorScope,
)
from .workspace import Workspace, check_workspace

_INT32 = (-(2**31), 2**31 - 1)
#: Threads one SM keeps resident (sizes the small-problem chunking of ``row_layout``).
_RESIDENT_THREADS_PER_SM = 2048


def storage_shape(shape: tuple[int, ...], kind: ElementKind) -> tuple[int, ...]:
    """Shape of the array holding ``shape`` elements of ``kind`` (4-bit kinds: last axis halved, rounded up)."""
    if not ELEMENTS[kind].is_packed:
        return shape
    dims = shape if shape else (1,)
    return (*dims[:-1], (dims[-1] + 1) // 2)


class ScopedProblem:
    """What every validated problem derives from its ``shape``, ``scope`` and ``float_kind``."""

    shape: tuple[int, ...]
    scope: Scope
    float_kind: ElementKind

    @property
    def precision(self) -> MathPrecision:
        return ELEMENTS[self.float_kind].math_precision

    @property
    def param_shape(self) -> tuple[int, ...]:
        return param_shape(self.shape, self.scope)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class AffineProblem(ScopedProblem):
    """A validated static affine problem: float side, code side, scope, parameters, code range."""

    shape: tuple[int, ...]
    scope: Scope
    mode: QuantMode
    float_kind: ElementKind
    code_kind: ElementKind
    q_min: int
    q_max: int
    nibble_order: NibbleOrder
    #: Philox stochastic rounding instead of rne (quantize direction only).
    stochastic: bool = False
    #: RowLayout.flags of the kernel (quantize.cu bit 0: NaN scale -> FP8 code 0, dynamic range).
    layout_flags: int = 0

    @property
    def code_shape(self) -> tuple[int, ...]:
        return storage_shape(self.shape, self.code_kind)


def resolve_affine_problem(
    shape: tuple[int, ...],
    scope: Scope,
    mode: QuantMode,
    float_kind: ElementKind,
    code_kind: ElementKind,
    q_min: int | None,
    q_max: int | None,
    nibble_order: NibbleOrder,
) -> AffineProblem:
    """Validate the descriptor fields shared by the affine plans; raise InvalidProblem / Unsupported."""
    if any(e < 0 for e in shape):
        raise InvalidProblem(f"shape {shape} has a negative extent")
    if not ELEMENTS[float_kind].is_float:
        raise InvalidProblem(f"float element must be one of F16, BF16, F32, F64, got {float_kind.name}")
    code = ELEMENTS[code_kind]
    if not code.is_code:
        raise InvalidProblem(
            f"quantized element must be one of S8, U8, S4, U4, FP8_E4M3, FP8_E5M2, got {code_kind.name}"
        )
    param_shape(shape, scope)  # validates axis and group divisibility
    if code.is_fp8:
        if mode is QuantMode.ASYMMETRIC:
            raise InvalidProblem(f"{code_kind.name} codes are symmetric only; use QuantMode.SYMMETRIC")
        if q_min is not None or q_max is not None:
            raise InvalidProblem(f"q_min/q_max do not apply to {code_kind.name}; leave them None")
        lo, hi = 0, 0
    else:
        assert code.code_range is not None
        lo, hi = code.code_range
        lo = lo if q_min is None else q_min
        hi = hi if q_max is None else q_max
        if not (code.code_range[0] <= lo <= code.code_range[1] and code.code_range[0] <= hi <= code.code_range[1]):
            raise InvalidProblem(
                f"q_min={lo}, q_max={hi} fall outside the {code_kind.name} range {code.code_range}; "
                f"narrow within it (e.g. symmetric int8 uses q_min=-127)"
            )
        if lo > hi:
            raise InvalidProblem(f"q_min={lo} > q_max={hi}; q_min must not exceed q_max")
    return AffineProblem(tuple(shape), scope, mode, float_kind, code_kind, lo, hi, nibble_order)


def choose_backend(pref: PlanPreference) -> BackendKind:
    """CUDA when a GPU is present (or demanded), else REFERENCE."""
    if pref.backend is BackendKind.REFERENCE:
        return BackendKind.REFERENCE
    if cuda_available():
        return BackendKind.CUDA
    if pref.backend is BackendKind.CUDA:
        raise Unsupported("PlanPreference(backend=CUDA) but no CUDA GPU is visible (CuPy sees no device)")
    return BackendKind.REFERENCE


def _row_kernel_params(acc: type[ctypes.c_float] | type[ctypes.c_double], rng: bool) -> type[ctypes.Structure]:
    """Argument block of ``dequantize_rows`` (``rng`` False) / ``quantize_rows`` (``rng`` True)."""
    fields: list[tuple[str, Any]] = [
        ("src", ctypes.c_uint64),
        ("dst", ctypes.c_uint64),
        ("scale_ptr", ctypes.c_uint64),
        ("zp_ptr", ctypes.c_uint64),
        ("scale_value", acc),
        ("zp_value", ctypes.c_int32),
        ("layout", RowLayoutArgs),
    ]
    if rng:
        fields += [
            ("seed_ptr", ctypes.c_uint64),
            ("offset_ptr", ctypes.c_uint64),
            ("seed_value", ctypes.c_uint64),
            ("offset_value", ctypes.c_uint64),
        ]

    class RowKernelParams(ctypes.Structure):
        _fields_ = fields

    return RowKernelParams


_ROW_KERNEL_PARAMS = {
    (precision, rng): _row_kernel_params(acc, rng)
    for precision, acc in ((MathPrecision.F32, ctypes.c_float), (MathPrecision.F64, ctypes.c_double))
    for rng in (False, True)
}
_UINT64 = (0, 2**64 - 1)


def device_arg(value: Operand | float | int | None) -> tuple[int, float | int]:
    """A kernel parameter that is a device pointer or a value: ``(pointer, 0)`` or ``(0, value)``."""
    if isinstance(value, Operand):
        return value.ptr, 0
    return 0, 0 if value is None else value


def reference_uniform(shape: tuple[int, ...], seed: Operand | int | None, offset: Operand | int | None) -> np.ndarray:
    """The Philox uniforms of a run on the reference backend (seed / offset: ints or 1-element arrays)."""

    def value(v: Operand | int | None) -> int:
        return int(np.asarray(v.obj).reshape(-1)[0]) % 2**64 if isinstance(v, Operand) else int(v or 0)

    n = math.prod(shape)
    return uniform_for_elements(n, value(seed), value(offset)).reshape(shape)


class CheckedArgs(NamedTuple):
    """Arguments of one run after the checks: operands, or Python scalars where allowed."""

    x: Operand
    y: Operand
    scale: Operand | float
    zp: Operand | int | None
    seed: Operand | int | None
    offset: Operand | int | None


@dataclass(slots=True)
class AffineArgs:
    """Tensors of one static affine run: ``input``, ``output``, ``scale``, ``zero_point`` and,
    for stochastic rounding, ``rng_seed`` / ``rng_offset``.

    ``rng_seed``, ``rng_offset``: Python ints in [0, 2**64) or one-element int64 device arrays
    (read by the kernel, so a captured graph replays with whatever the caller stored there);
    required with ``Rounding.STOCHASTIC``, None otherwise. ``scale``: array of the descriptor's ``param_shape`` (float32; float64 for F64 plans) or, for
    TensorScope, a Python float or a one-element device array. ``zero_point``: None for
    SYMMETRIC; for ASYMMETRIC an int32 array of ``param_shape`` or, for TensorScope, a Python int
    or one-element array.
    """

    input: Any
    output: Any
    scale: Any
    zero_point: Any = None
    rng_seed: Any = None
    rng_offset: Any = None


class OperandChecks:
    """Checks of one plan's operands against its backend, device and parameter shape.

    Shared by every plan: a tensor's residence, shape, dtype, contiguity and alignment; a
    parameter (array of ``_param_shape``, or a scalar for TensorScope); a Philox seed / offset.
    """

    backend: BackendKind
    device_id: int | None
    _param_shape: tuple[int, ...]
    _tensor_scope: bool

    def _tensor(self, value: Any, name: str, shape: tuple[int, ...], info: ElementInfo) -> Operand:
        op = operand(value, name)
        self._check_residence(op, name)
        if op.shape != shape:
            raise InvalidProblem(f"{name} has shape {op.shape}, but the descriptor implies {shape}")
        if op.dtype_name not in info.dtype_names:
            raise InvalidProblem(
                f"{name} has dtype {op.dtype_name}; {info.kind.name} needs one of {sorted(info.dtype_names)}"
            )
        if not op.contiguous:
            raise MisalignedOperand(
                f"{name} is not C-contiguous; pass a contiguous tensor (.contiguous() / ascontiguousarray)"
            )
        if op.ptr % op.itemsize:
            raise MisalignedOperand(f"{name} pointer {op.ptr:#x} is not aligned to its {op.itemsize}-byte elements")
        return op

    def _check_residence(self, op: Operand, name: str) -> None:
        if self.backend is BackendKind.REFERENCE:
            if not isinstance(op.obj, np.ndarray):
                raise InvalidProblem(
                    f"{name} is a {type(op.obj).__name__}; this plan runs on the REFERENCE backend, which takes "
                    f"NumPy arrays (select a CUDA plan for device tensors)"
                )
        elif op.device_id != self.device_id:
            where = "host memory" if op.device_id is None else f"device {op.device_id}"
            raise InvalidProblem(f"{name} lives in {where}, but the plan was selected for device {self.device_id}")

    def _param(self, value: Any, name: str, dtype: np.dtype, allow_none: bool) -> Operand | float | int | None:
        if value is None:
            if allow_none:
                return None
            raise InvalidProblem(f"{name} is required for this plan")
        if is_scalar(value):
            if not self._tensor_scope:
                raise InvalidProblem(
                    f"{name} is a scalar, which only TensorScope takes; pass an array of shape {self._param_shape}"
                )
            return value  # type: ignore[no-any-return]
        op = operand(value, name)
        self._check_residence(op, name)
        if op.shape != self._param_shape and not (self._tensor_scope and op.size == 1):
            raise InvalidProblem(f"{name} has shape {op.shape}, but the scope's parameter shape is {self._param_shape}")
        if op.dtype_name != dtype.name:
            raise InvalidProblem(f"{name} has dtype {op.dtype_name}; this plan needs {dtype.name}")
        if not op.contiguous:
            raise MisalignedOperand(f"{name} is not C-contiguous")
        if op.ptr % op.itemsize:
            raise MisalignedOperand(f"{name} pointer {op.ptr:#x} is not aligned to its {op.itemsize}-byte elements")
        return op

    def _positive_scale(self, value: Any, dtype: np.dtype) -> Operand | float:
        """``scale`` as every plan takes it: an array of ``_param_shape`` or, for TensorScope, a
        scalar that is finite and > 0 and stays so when rounded to ``dtype``."""
        scale = self._param(value, "scale", dtype, allow_none=False)
        assert scale is not None
        if isinstance(scale, Operand):
            return scale
        s = float(scale)
        if not (math.isfinite(s) and s > 0):
            raise InvalidProblem(f"scale={scale!r}: a scalar scale must be finite and > 0 in {dtype.name}")
        with np.errstate(over="ignore", under="ignore"):
            rounded = float(dtype.type(s))
        if not 0 < rounded < math.inf:
            raise InvalidProblem(
                f"scale={scale!r}: a scalar scale must be finite and > 0 in {dtype.name} "
                f"(it rounds to 0 or Inf in {dtype.name})"
            )
        return s

    def _broadcast_param(
        self, value: Operand | float | int, shape: tuple[int, ...], scope: Scope, dtype: np.dtype | None = None
    ) -> np.ndarray:
        """A parameter (array or scalar) broadcast against data of ``shape`` on the reference backend."""
        pshape = self._param_shape if self._param_shape else (1,)
        shape = shape if shape else (1,)
        arr = np.asarray(value.obj).reshape(pshape) if isinstance(value, Operand) else np.full(pshape, value, dtype)
        return expand_params(arr, shape, scope)

    @staticmethod
    def _host_view(op: Operand, shape: tuple[int, ...], info: ElementInfo) -> np.ndarray:
        """A reference-backend operand as a NumPy array of ``info``'s dtype and ``shape``."""
        return np.asarray(op.obj).view(info.numpy_dtype).reshape(shape if shape else (1,))

    @staticmethod
    def _write_host(op: Operand, value: np.ndarray) -> None:
        """Copy a reference result into the caller's NumPy array (its shape and raw dtype)."""
        out = np.asarray(op.obj)
        np.copyto(out, value.reshape(out.shape).view(out.dtype), casting="no")

    def _param_output(self, value: Any, name: str, dtype: np.dtype, required: bool) -> Operand | None:
        """A parameter array the plan writes (``scale_out`` / ``zero_point_out``): ``_param_shape``
        (any one-element shape when that is all ones), ``dtype``, C-contiguous and aligned; None
        when ``value`` is None and not ``required``."""
        if value is None:
            if required:
                raise InvalidProblem(f"{name} is required: an array of shape {self._param_shape} ({dtype.name})")
            return None
        op = operand(value, name)
        self._check_residence(op, name)
        pshape = self._param_shape
        if op.shape != pshape and not (math.prod(pshape) == 1 and op.size == 1):
            raise InvalidProblem(f"{name} has shape {op.shape}, but the scope's parameter shape is {pshape}")
        if op.dtype_name != dtype.name:
            raise InvalidProblem(f"{name} has dtype {op.dtype_name}; this plan writes {dtype.name}")
        if not op.contiguous or op.ptr % op.itemsize:
            raise InvalidProblem(f"{name} must be C-contiguous and aligned to its {op.itemsize}-byte elements")
        return op

    def _rng_value(self, value: Any, name: str) -> Operand | int:
        """A seed / offset: a Python int in [0, 2**64) or a one-element int64 array on the plan's device."""
        if value is None:
            raise InvalidProblem(
                f"{name} is required with Rounding.STOCHASTIC (a Python int or a 1-element int64 array)"
            )
        if is_scalar(value):
            if not isinstance(value, (int, np.integer)) or not _UINT64[0] <= int(value) <= _UINT64[1]:
                raise InvalidProblem(f"{name}={value!r} must be an integer in [0, 2**64)")
            return int(value)
        op = operand(value, name)
        self._check_residence(op, name)
        if op.size != 1 or op.dtype_name != "int64":
            raise InvalidProblem(
                f"{name} must be a Python int or a 1-element int64 array, got {op.dtype_name} {op.shape}"
            )
        if op.ptr % 8:
            raise MisalignedOperand(f"{name} pointer {op.ptr:#x} is not 8-byte aligned")
        return op


class StaticAffinePlan(OperandChecks):
    """Base of QuantizePlan and DequantizePlan: select once, check arguments, run the row kernel."""

    _family: ClassVar[str]
    _kernel: ClassVar[str]
    _category: ClassVar[OpCategory]
    #: True when the plan reads floats and writes codes (quantize), False for the reverse.
    _float_to_code: ClassVar[bool]

    def __init__(
        self,
        problem: AffineProblem,
        backend: BackendKind,
        device_id: int | None,
        arch_name: str,
        primary: PreparedLaunch | None,
        fallback: PreparedLaunch | None,
        align: tuple[int, int],
        variant: str,
    ) -> None:
        self.problem = problem
        self.backend = backend
        self.device_id = device_id
        self._arch_name = arch_name
        self._primary = primary
        self._fallback = fallback
        self._align_in, self._align_out = align
        self._variant = variant
        float_shape, code_shape = problem.shape, problem.code_shape
        self._in_shape, self._out_shape = (
            (float_shape, code_shape) if self._float_to_code else (code_shape, float_shape)
        )
        self._in_kind, self._out_kind = (
            (problem.float_kind, problem.code_kind) if self._float_to_code else (problem.code_kind, problem.float_kind)
        )
        self._in_info: ElementInfo = ELEMENTS[self._in_kind]
        self._out_info: ElementInfo = ELEMENTS[self._out_kind]
        self._param_shape = problem.param_shape
        self._param_dtype = param_numpy_dtype(problem.precision)
        self._scalar_type = np.float64 if problem.precision is MathPrecision.F64 else np.float32
        self._tensor_scope = isinstance(problem.scope, TensorScope)

    # ---- selection ------------------------------------------------------------------------

    @classmethod
    def _vec_max(cls, problem: AffineProblem) -> int:
        return 4 if problem.float_kind is ElementKind.F64 else 8

    @classmethod
    def _name(cls, problem: AffineProblem, layout: RowLayout) -> str:
        float_tag, code_tag = ELEMENTS[problem.float_kind].cpp_tag, ELEMENTS[problem.code_kind].cpp_tag
        in_tag, out_tag = (float_tag, code_tag) if cls._float_to_code else (code_tag, float_tag)
        high_first = ELEMENTS[problem.code_kind].is_packed and problem.nibble_order is NibbleOrder.HIGH_FIRST
        extra = (problem.stochastic,) if cls._float_to_code else ()
        return template_name(cls._kernel, in_tag, out_tag, layout.vec, layout.vector_io, high_first, *extra)

    @classmethod
    def _compile_unit(cls, problem: AffineProblem) -> list[str]:
        """Name expressions compiled together with this problem's kernel."""
        raise NotImplementedError

    @classmethod
    def _select(cls, stream: Any, problem: AffineProblem, pref: PlanPreference) -> StaticAffinePlan:
        backend = choose_backend(pref)
        packed = ELEMENTS[problem.code_kind].is_packed
        if backend is BackendKind.REFERENCE:
            return cls(problem, backend, None, HOST_ARCH.name, None, None, (1, 1), "numpy")
        import cupy

        device_id = stream_device_id(stream)
        info = device_info(device_id)
        busy = info.sm_count * _RESIDENT_THREADS_PER_SM
        primary_layout = row_layout(problem.shape, problem.scope, cls._vec_max(problem), packed, busy)
        fallback_layout = row_layout(problem.shape, problem.scope, 1, packed, busy)
        variant = f"{problem.scope.kind}/{problem.mode.value}/{primary_layout.describe()}"
        names = [cls._name(problem, primary_layout), cls._name(problem, fallback_layout)]
        # One NVRTC program per (input, output, nibble order): every vector width at once, so
        # plans of other shapes with the same dtypes reuse the loaded module.
        unit = cls._compile_unit(problem)
        functions = load_kernels(cls._family, unit, info.arch, device_id, compile_options())

        params_type = _ROW_KERNEL_PARAMS[problem.precision, cls._float_to_code]

        def prepare(layout: RowLayout, name: str) -> PreparedLaunch:
            fn = functions[name]
            per_sm = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.ptr, BLOCK_THREADS, 0)
            grid = layout.blocks(max(1, per_sm) * info.sm_count)
            return PreparedLaunch(
                fn,
                grid,
                BLOCK_THREADS,
                params_type,
                layout=layout.args(problem.q_min, problem.q_max, problem.layout_flags),
            )

        in_bits, out_bits = (
            (ELEMENTS[problem.float_kind].storage_bits, ELEMENTS[problem.code_kind].storage_bits)
            if cls._float_to_code
            else (ELEMENTS[problem.code_kind].storage_bits, ELEMENTS[problem.float_kind].storage_bits)
        )
        v = primary_layout.vec
        align = (min(16, v * in_bits // 8), min(16, max(1, v * out_bits // 8)))
        return cls(
            problem,
            backend,
            device_id,
            info.arch.name,
            prepare(primary_layout, names[0]),
            prepare(fallback_layout, names[1]),
            align,
            variant,
        )

    # ---- introspection --------------------------------------------------------------------

    def workspace_size(self) -> int:
        """Bytes of workspace ``run`` needs: always 0 for these elementwise plans."""
        return 0

    def precision_guarantee(self) -> PrecisionGuarantee:
        """f32 arithmetic (f64 for F64 data), no reduction, bit-exact to the reference, deterministic."""
        return PrecisionGuarantee(
            math_precision=self.problem.precision, accumulator=param_element(self.problem.precision)
        )

    def sku(self) -> KernelSku:
        """Identity of the selected kernel (variant names the row layout and vector width)."""
        return KernelSku(
            category=self._category,
            op=QuantizeKind.STATIC,
            element=self._in_kind,
            aux_element=self._out_kind,
            variant=self._variant,
            arch=self._arch_name,
            backend=self.backend,
            precision_guarantee=self.precision_guarantee(),
        )

    # ---- argument checks (the helpers are OperandChecks') -------------------------------

    def _check(self, args: AffineArgs) -> CheckedArgs:
        x = self._tensor(args.input, "input", self._in_shape, self._in_info)
        y = self._tensor(args.output, "output", self._out_shape, self._out_info)
        scale = self._param(args.scale, "scale", self._param_dtype, allow_none=False)
        assert scale is not None
        if not isinstance(scale, Operand):
            s = float(scale)
            if not (math.isfinite(s) and s > 0):
                raise InvalidProblem(f"scale={scale!r}: a scalar scale must be finite and > 0")
            with np.errstate(over="ignore", under="ignore"):
                rounded = float(self._scalar_type(s))
            if rounded == 0 or not math.isfinite(rounded):
                raise InvalidProblem(f"scale={scale!r} rounds to 0 or Inf in {self._param_dtype.name}")
        if self.problem.mode is QuantMode.SYMMETRIC:
            if args.zero_point is not None:
                raise InvalidProblem("zero_point must be None in SYMMETRIC mode (the zero point is 0)")
            zp: Operand | int | None = None
        else:
            zp = self._param(args.zero_point, "zero_point", np.dtype(np.int32), allow_none=False)  # type: ignore[assignment]
            if not isinstance(zp, Operand):
                if float(zp) != int(zp) or not _INT32[0] <= int(zp) <= _INT32[1]:  # type: ignore[arg-type]
                    raise InvalidProblem(f"zero_point={zp!r} must be an integer in the int32 range")
        seed: Operand | int | None = None
        offset: Operand | int | None = None
        if self.problem.stochastic:
            seed = self._rng_value(args.rng_seed, "rng_seed")
            offset = self._rng_value(args.rng_offset, "rng_offset")
        elif args.rng_seed is not None or args.rng_offset is not None:
            raise InvalidProblem("rng_seed / rng_offset apply only to Rounding.STOCHASTIC plans; leave them None")
        return CheckedArgs(x, y, scale, zp, seed, offset)

    def _unchecked(self, args: AffineArgs) -> CheckedArgs:
        def view(value: Any, name: str) -> Any:
            return value if value is None or is_scalar(value) else operand(value, name)

        return CheckedArgs(
            operand(args.input, "input"),
            operand(args.output, "output"),
            view(args.scale, "scale"),
            view(args.zero_point, "zero_point"),
            view(args.rng_seed, "rng_seed"),
            view(args.rng_offset, "rng_offset"),
        )

    def can_implement(self, args: AffineArgs) -> bool:
        """Check ``args`` against the plan (shape, dtype, device, contiguity, alignment, parameters).

        Returns True, or raises InvalidProblem / MisalignedOperand naming the offending argument.
        """
        self._check(args)
        return True

    # ---- execution ------------------------------------------------------------------------

    def run(self, stream: Any, workspace: Workspace | None, args: AffineArgs, *, check: bool = True) -> None:
        """Launch on ``stream`` (CuPy / PyTorch stream, raw handle, or None for CuPy's current stream).

        No allocation, no synchronisation, no compilation: capturable in a CUDA graph.
        ``check=False`` skips the argument checks (the caller vouches for ``args``).
        """
        if check:
            check_workspace(workspace, 0)
        a = self._check(args) if check else self._unchecked(args)
        if self.backend is BackendKind.REFERENCE:
            self._run_reference(a)
            return
        if self.problem.numel == 0:
            return
        self.launch_on_device(
            stream_handle(stream),
            a.x.ptr,
            a.y.ptr,
            device_arg(a.scale),
            device_arg(a.zp),
            device_arg(a.seed),
            device_arg(a.offset),
        )

    def launch_on_device(
        self,
        handle: int,
        src_ptr: int,
        dst_ptr: int,
        scale: tuple[int, float | int],
        zp: tuple[int, float | int],
        seed: tuple[int, float | int] = (0, 0),
        offset: tuple[int, float | int] = (0, 0),
    ) -> None:
        """Enqueue the kernel on raw stream ``handle``; each parameter is (device pointer or 0, value).

        Internal: for ``run`` and for plans that chain this kernel after their own (no checks).
        """
        aligned = src_ptr % self._align_in == 0 and dst_ptr % self._align_out == 0
        launch = self._primary if aligned else self._fallback
        assert launch is not None
        params = launch.params
        params.src = src_ptr
        params.dst = dst_ptr
        params.scale_ptr, params.scale_value = scale
        params.zp_ptr, params.zp_value = zp[0], int(zp[1])
        if self.problem.stochastic:
            params.seed_ptr, params.seed_value = seed[0], int(seed[1])
            params.offset_ptr, params.offset_value = offset[0], int(offset[1])
        assert self.device_id is not None
        launch_on(self.device_id, handle, launch)

    def _run_reference(self, a: CheckedArgs) -> None:
        p = self.problem
        shape = p.shape if p.shape else (1,)
        pshape = self._param_shape if self._param_shape else (1,)
        if isinstance(a.scale, Operand):
            scale_np = np.asarray(a.scale.obj).reshape(pshape)
        else:
            scale_np = np.full(pshape, a.scale, dtype=self._param_dtype)
        scale_np = expand_params(scale_np, shape, p.scope)
        zp_np: np.ndarray | int = 0
        if isinstance(a.zp, Operand):
            zp_np = expand_params(np.asarray(a.zp.obj).reshape(pshape), shape, p.scope)
        elif a.zp is not None:
            zp_np = int(a.zp)
        uniform = reference_uniform(shape, a.seed, a.offset) if p.stochastic else None
        src = np.asarray(a.x.obj).view(self._in_info.numpy_dtype).reshape(storage_shape(shape, self._in_kind))
        result = self._reference(src, scale_np, zp_np, shape, uniform)
        out = np.asarray(a.y.obj).view(self._out_info.numpy_dtype)
        np.copyto(out, result.reshape(out.shape).view(self._out_info.numpy_dtype), casting="no")

    def _reference(
        self,
        src: np.ndarray,
        scale: np.ndarray,
        zp: np.ndarray | int,
        shape: tuple[int, ...],
        uniform: np.ndarray | None = None,
    ) -> np.ndarray:
        raise NotImplementedError


__all__ = [
    "AffineArgs",
    "OperandChecks",
    "ScopedProblem",
    "CheckedArgs",
    "device_arg",
    "reference_uniform",
    "AffineProblem",
    "StaticAffinePlan",
    "choose_backend",
    "resolve_affine_problem",
    "storage_shape",
]
