"""Plans in DeepSpeed's formats: what :mod:`quantplan.compat.deepspeed` builds and runs.

Each plan follows quantplan's plan API (``select`` validates, ``can_implement`` checks operands,
``workspace_size`` / ``precision_guarantee`` / ``sku``, ``run``) on flat operands. Their
numerics are DeepSpeed's (:mod:`quantplan.compat._deepspeed_reference`), not SPEC section 4's,
which is why they are separate from :class:`~quantplan.SwizzledQuantizePlan` and
:class:`~quantplan.DequantReducePlan`. Symmetric dequantization needs no plan of its own: its
formula ``x = q * (1/scale)`` is :class:`~quantplan.DequantizePlan`'s with ``scale = 1/scale``
stored and ``zp = 0``, and :mod:`quantplan.compat.deepspeed` runs it there.

**Kernel variants:** reference only in this release; on the CUDA backend ``select`` raises
Unsupported ("CUDA kernel not yet implemented"). The kernels that will carry these formulas:
a DeepSpeed-parameter variant (multiplier ``2**(b-1) / absmax`` or ``2**b / (max - min)`` and
midpoint offset, stored ``1 / scale``, high-nibble-first signed int4) of the swizzled-quantize
kernel (``DeepSpeedQuantizePlan``) and of the dequantize-reduce kernel (``DeepSpeedReducePlan``),
an asymmetric-offset variant of the dequantize row kernel (``DeepSpeedDequantizePlan``), and a
MoQ variant of the dynamic fake-quantize segment kernel (``MoQFakeQuantizePlan``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from .._affine import choose_backend, reference_uniform
from .._operands import Operand
from ..elements import ELEMENTS, ElementInfo
from ..errors import InvalidProblem, Unsupported
from ..swizzled_quantize import (
    QgzOperands,
    check_error_kind,
    check_float_kind,
    check_positive,
    host_view,
    qgz_precision_guarantee,
    write_back,
)
from ..types import (
    HOST_ARCH,
    BackendKind,
    ElementKind,
    KernelSku,
    OpCategory,
    PlanPreference,
    PrecisionGuarantee,
    QuantizeKind,
    QuantMode,
)
from ..workspace import Workspace, check_workspace
from . import _deepspeed_reference as dsref

_FROZEN = ConfigDict(frozen=True, extra="forbid")
#: DeepSpeed's code storage: int8 tensors (4-bit: two signed nibbles per byte); uint8 views accepted.
_DS_CODES = ElementInfo(
    ElementKind.S8,
    "qp::s8",
    8,
    np.dtype(np.int8),
    frozenset({"int8", "uint8"}),
    is_integer_code=True,
    code_range=(-128, 127),
)
_VARIANT = "numpy-deepspeed-format"


def reference_only_backend(pref: PlanPreference, plan: str) -> BackendKind:
    """REFERENCE, or Unsupported where the backend choice is CUDA (the DeepSpeed-format kernels
    are not in this release)."""
    backend = choose_backend(pref)
    if backend is BackendKind.CUDA:
        raise Unsupported(
            f"{plan}: the CUDA kernel is not yet implemented (reference only in this release); select with "
            f"PlanPreference(backend=BackendKind.REFERENCE) and pass NumPy arrays"
        )
    return backend


def _check_groups(numel: int, groups: int) -> None:
    if isinstance(numel, bool) or numel < 0:
        raise InvalidProblem(f"numel={numel!r} must be >= 0")
    check_positive("groups", groups)
    if numel % groups:
        raise InvalidProblem(
            f"{numel} elements do not split into {groups} equal groups; pick a groups count that divides the "
            f"element count (any group size works, it need not be a multiple of 8)"
        )


def _check_bits(bits: int, allowed: tuple[int, ...]) -> None:
    if bits not in allowed:
        raise InvalidProblem(f"num_bits={bits!r}: this function takes {' or '.join(map(str, allowed))} bits")


def _storage_bytes(elements: int, bits: int) -> int:
    return elements * bits // 8


class _DeepSpeedPlan:
    """What the DeepSpeed-format plans share: backend, operand checks, workspace, guarantee, sku."""

    _category: ClassVar[OpCategory]
    _op: ClassVar[QuantizeKind] = QuantizeKind.DYNAMIC_RANGE

    def __init__(self, backend: BackendKind, element: ElementKind, aux_element: ElementKind) -> None:
        self.backend = backend
        self.device_id: int | None = None
        self._operands = QgzOperands(backend, None)
        self._element = element
        self._aux_element = aux_element

    def workspace_size(self) -> int:
        """Bytes of workspace ``run`` needs: 0."""
        return 0

    def precision_guarantee(self) -> PrecisionGuarantee:
        """float32 arithmetic, fixed order, bit-exact to the DeepSpeed-format reference, deterministic."""
        return qgz_precision_guarantee()

    def sku(self) -> KernelSku:
        """Identity of the selected implementation (variant ``numpy-deepspeed-format``)."""
        return KernelSku(
            category=self._category,
            op=self._op,
            element=self._element,
            aux_element=self._aux_element,
            variant=_VARIANT,
            arch=HOST_ARCH.name,
            backend=self.backend,
            precision_guarantee=self.precision_guarantee(),
        )

    def _codes(self, value: Any, name: str, nbytes: int) -> Operand:
        """A flat code operand of ``nbytes`` bytes: int8 (DeepSpeed's dtype) or uint8."""
        if value is None:
            raise InvalidProblem(f"{name} is required: a flat int8 array of {nbytes} bytes")
        return self._operands._tensor(value, name, (nbytes,), _DS_CODES)

    def _check(self, args: Any) -> Any:
        raise NotImplementedError

    def can_implement(self, args: Any) -> bool:
        """Check ``args`` against the plan (shapes, dtypes, residence, contiguity); True or raises."""
        self._check(args)
        return True


def _bytes(op: Operand) -> np.ndarray:
    return np.asarray(op.obj).view(np.uint8)


# ---- quantize / swizzle_quant / loco_swizzle_quant ---------------------------------------------


class DeepSpeedQuantizeDescriptor(BaseModel):
    """DeepSpeed-format group quantization, optionally swizzled and with LoCo error feedback.

    Fields: ``numel`` elements in ``groups`` equal contiguous groups; ``num_bits`` 8 or 4;
    ``mode``; ``input_element`` F16 / BF16 / F32; ``nodes``, ``devices_per_node``, ``pipeline``
    (swizzle; 1, 1, 1 = plain ``quantize``); ``error_element`` None or the LoCo buffer's element.
    """

    model_config = _FROZEN
    numel: int
    groups: int
    num_bits: int
    mode: QuantMode = QuantMode.SYMMETRIC
    input_element: ElementKind
    nodes: int = 1
    devices_per_node: int = 1
    pipeline: int = 1
    error_element: ElementKind | None = None

    @property
    def output_bytes(self) -> int:
        """Bytes of the flat code output: ``numel * num_bits / 8``."""
        return _storage_bytes(self.numel, self.num_bits)

    @property
    def param_shape(self) -> tuple[int, int]:
        """``(groups, 1)`` (SYMMETRIC) or ``(groups, 2)`` (ASYMMETRIC)."""
        return (self.groups, dsref.params_per_group(self.mode))


@dataclass(slots=True)
class DeepSpeedQuantizeArgs:
    """``input`` (flat, ``numel``), ``output`` (flat int8 / uint8, ``output_bytes``), ``params_out``
    (float32 ``param_shape``); LoCo: ``error_feedback`` (flat, ``numel``, updated in place) and
    ``error_beta``."""

    input: Any
    output: Any
    params_out: Any
    error_feedback: Any = None
    error_beta: Any = None


class DeepSpeedQuantizePlan(_DeepSpeedPlan):
    """DeepSpeed's ``quantize`` / ``swizzle_quant`` / ``loco_swizzle_quant`` formulas on flat operands.

    Formula (:func:`quantplan.compat._deepspeed_reference.swizzled_quantize`): per group,
    SYMMETRIC ``scale = 2**b / (2 * absmax)``, ``q = clamp(rne(v * scale), -2**(b-1), 2**(b-1) - 1)``,
    stored ``1 / scale``; ASYMMETRIC ``scale = 2**b / (max - min)``, ``offset = (max + min) / 2``,
    ``q = clamp(rne((v - offset) * scale), ...)``, stored ``(1 / scale, offset)``; codes and
    parameter rows in swizzled order ``[pipeline][device][node][group]``; int4 signed nibbles,
    element ``2i`` high. LoCo: ``v = x + e``, ``e <- b e + (1 - b)(v - dequant(q))`` in float32.

    **When to use:** through :mod:`quantplan.compat.deepspeed`; new code should prefer
    :class:`~quantplan.SwizzledQuantizePlan` (SPEC numerics, integer zero points).

    **Dtypes:** input F16 / BF16 / F32; codes int8 (or uint8) bytes; params float32; error
    buffer F16 / BF16 / F32.

    **Shape limits:** any group size (no multiple-of-8 rule, no 16384 / 40960 cap); ``groups``
    divides ``numel`` and, swizzled, ``nodes * devices_per_node * pipeline`` divides ``groups``;
    4-bit: even slices.

    **Workspace:** none.

    **Precision guarantee:** float32 arithmetic, deterministic, bit-exact to the reference.
    """

    _category = OpCategory.QUANTIZE

    def __init__(self, desc: DeepSpeedQuantizeDescriptor, backend: BackendKind) -> None:
        super().__init__(backend, desc.input_element, ElementKind.S4 if desc.num_bits == 4 else ElementKind.S8)
        self.descriptor = desc

    @classmethod
    def select(
        cls, stream: Any, desc: DeepSpeedQuantizeDescriptor, pref: PlanPreference | None = None
    ) -> DeepSpeedQuantizePlan:
        """Validate ``desc`` (InvalidProblem / Unsupported) and pick the backend (REFERENCE in this release)."""
        _check_groups(desc.numel, desc.groups)
        _check_bits(desc.num_bits, (4, 8))
        check_float_kind(desc.input_element, "input_element")
        check_error_kind(desc.error_element)
        for name in ("nodes", "devices_per_node", "pipeline"):
            check_positive(name, getattr(desc, name))
        slices = desc.nodes * desc.devices_per_node * desc.pipeline
        if desc.groups % slices:
            raise InvalidProblem(
                f"groups={desc.groups} must be a multiple of nodes * devices_per_node * pipeline_size = {slices} "
                f"(every slice holds whole groups)"
            )
        if desc.num_bits == 4 and (desc.numel // slices) % 2:
            raise InvalidProblem(
                f"4-bit codes pack two per byte: each of the {slices} slices must hold an even number of "
                f"elements, got {desc.numel // slices}"
            )
        return cls(desc, reference_only_backend(pref or PlanPreference(), "DeepSpeedQuantizePlan"))

    def _check(self, args: DeepSpeedQuantizeArgs) -> tuple[Operand, Operand, Operand, Operand | None, float]:
        d = self.descriptor
        ops = self._operands
        x = ops.tensor(args.input, "input", (d.numel,), d.input_element)
        y = self._codes(args.output, "output", d.output_bytes)
        p = ops.tensor(args.params_out, "params_out", d.param_shape, ElementKind.F32)
        err, beta = ops.loco(args.error_feedback, args.error_beta, (d.numel,), d.error_element)
        return x, y, p, err, beta

    def run(self, stream: Any, workspace: Workspace | None, args: DeepSpeedQuantizeArgs) -> None:
        """Quantize (swizzled) and update the LoCo buffer; all checks before any write; zero size: no-op."""
        check_workspace(workspace, 0)
        x, y, p, err, beta = self._check(args)
        d = self.descriptor
        if d.numel == 0:
            return
        error = None if err is None or d.error_element is None else host_view(err, d.error_element)
        q, params, new_err = dsref.swizzled_quantize(
            host_view(x, d.input_element),
            d.groups,
            d.num_bits,
            d.mode,
            d.nodes,
            d.devices_per_node,
            d.pipeline,
            error,
            beta,
        )
        np.copyto(_bytes(y), q, casting="no")
        write_back(p, ElementKind.F32, params)
        if err is not None and new_err is not None and d.error_element is not None:
            write_back(err, d.error_element, new_err)


# ---- dequantize (asymmetric; symmetric runs on DequantizePlan) ---------------------------------


class DeepSpeedDequantizeDescriptor(BaseModel):
    """DeepSpeed-format dequantization: ``numel`` codes in ``groups`` groups, ``num_bits`` 8 / 4,
    ``mode``, ``output_element`` F16 / BF16 / F32."""

    model_config = _FROZEN
    numel: int
    groups: int
    num_bits: int
    mode: QuantMode = QuantMode.ASYMMETRIC
    output_element: ElementKind

    @property
    def input_bytes(self) -> int:
        """Bytes of the flat code input."""
        return _storage_bytes(self.numel, self.num_bits)

    @property
    def param_shape(self) -> tuple[int, int]:
        """``(groups, 1)`` or ``(groups, 2)``."""
        return (self.groups, dsref.params_per_group(self.mode))


@dataclass(slots=True)
class DeepSpeedDequantizeArgs:
    """``input`` (flat int8 / uint8 codes), ``params`` (float32 ``param_shape``), ``output`` (flat floats)."""

    input: Any
    params: Any
    output: Any


class DeepSpeedDequantizePlan(_DeepSpeedPlan):
    """DeepSpeed's ``dequantize``: ``x = q * p0`` (SYMMETRIC) or ``x = (q * p0) + p1`` (ASYMMETRIC).

    ``p0`` is the stored ``1 / scale`` and ``p1`` the midpoint offset of the element's group;
    float32, two roundings for ASYMMETRIC (no FMA), then one rounding to the output.

    **When to use:** through :mod:`quantplan.compat.deepspeed` (which runs SYMMETRIC on
    :class:`~quantplan.DequantizePlan`, the same formula).

    **Dtypes:** codes int8 / uint8 bytes (4-bit: high-nibble-first signed); params float32;
    output F16 / BF16 / F32.

    **Shape limits:** any group size; ``groups`` divides ``numel``; 4-bit: even ``numel``.

    **Workspace:** none.

    **Precision guarantee:** float32 arithmetic, bit-exact to the reference, deterministic.
    """

    _category = OpCategory.DEQUANTIZE
    _op = QuantizeKind.STATIC

    def __init__(self, desc: DeepSpeedDequantizeDescriptor, backend: BackendKind) -> None:
        super().__init__(backend, ElementKind.S4 if desc.num_bits == 4 else ElementKind.S8, desc.output_element)
        self.descriptor = desc

    @classmethod
    def select(
        cls, stream: Any, desc: DeepSpeedDequantizeDescriptor, pref: PlanPreference | None = None
    ) -> DeepSpeedDequantizePlan:
        """Validate ``desc`` and pick the backend (REFERENCE in this release)."""
        _check_groups(desc.numel, desc.groups)
        _check_bits(desc.num_bits, (4, 8))
        check_float_kind(desc.output_element, "output_element")
        if desc.num_bits == 4 and desc.numel % 2:
            raise InvalidProblem(f"4-bit codes pack two per byte: numel must be even, got {desc.numel}")
        return cls(desc, reference_only_backend(pref or PlanPreference(), "DeepSpeedDequantizePlan"))

    def _check(self, args: DeepSpeedDequantizeArgs) -> tuple[Operand, Operand, Operand]:
        d = self.descriptor
        q = self._codes(args.input, "input", d.input_bytes)
        p = self._operands.tensor(args.params, "params", d.param_shape, ElementKind.F32)
        y = self._operands.tensor(args.output, "output", (d.numel,), d.output_element)
        return q, p, y

    def run(self, stream: Any, workspace: Workspace | None, args: DeepSpeedDequantizeArgs) -> None:
        """Dequantize; all checks before any write; zero size: no-op."""
        check_workspace(workspace, 0)
        q, p, y = self._check(args)
        d = self.descriptor
        if d.numel == 0:
            return
        values = dsref.dequantize(_bytes(q), host_view(p, ElementKind.F32), d.numel, d.groups, d.num_bits, d.mode)
        write_back(y, d.output_element, values.astype(ELEMENTS[d.output_element].numpy_dtype))


# ---- quantized_reduction / loco_quantized_reduction ----------------------------------------------


class DeepSpeedReduceDescriptor(BaseModel):
    """DeepSpeed-format dequantize-reduce: ``numel`` input codes = ``devices_per_node`` chunks,
    ``in_groups`` input groups (``in_groups / dpn`` per chunk), ``out_groups`` output groups over
    the ``numel / dpn`` reduced elements; ``num_bits`` 8 / 4 (both sides); ``mode``;
    ``error_element`` None or the LoCo buffer's element."""

    model_config = _FROZEN
    numel: int
    in_groups: int
    out_groups: int
    num_bits: int
    mode: QuantMode = QuantMode.SYMMETRIC
    devices_per_node: int
    error_element: ElementKind | None = None

    @property
    def chunk_elements(self) -> int:
        """Elements per peer chunk, and of the output: ``numel / devices_per_node``."""
        return self.numel // max(1, self.devices_per_node)

    @property
    def input_bytes(self) -> int:
        """Bytes of the flat code input."""
        return _storage_bytes(self.numel, self.num_bits)

    @property
    def output_bytes(self) -> int:
        """Bytes of the flat code output."""
        return _storage_bytes(self.chunk_elements, self.num_bits)

    @property
    def input_param_shape(self) -> tuple[int, int]:
        """``(in_groups, 1|2)``."""
        return (self.in_groups, dsref.params_per_group(self.mode))

    @property
    def param_shape(self) -> tuple[int, int]:
        """``(out_groups, 1|2)``."""
        return (self.out_groups, dsref.params_per_group(self.mode))


@dataclass(slots=True)
class DeepSpeedReduceArgs:
    """``input`` (flat codes, ``input_bytes``), ``params`` (float32 ``input_param_shape``),
    ``output`` (flat codes, ``output_bytes``), ``params_out`` (float32 ``param_shape``); LoCo:
    ``error_feedback`` (flat, ``chunk_elements``, updated in place) and ``error_beta``."""

    input: Any
    params: Any
    output: Any
    params_out: Any
    error_feedback: Any = None
    error_beta: Any = None


class DeepSpeedReducePlan(_DeepSpeedPlan):
    """DeepSpeed's ``quantized_reduction`` / ``loco_quantized_reduction`` formulas.

    Formula (:func:`quantplan.compat._deepspeed_reference.quantized_reduction`): chunk ``j``
    dequantized with its own rows (``q * p0 (+ p1)``, float32), summed in float32 in peer order
    (not averaged), ``+ e`` with LoCo, re-quantized with DeepSpeed's group formula in
    ``out_groups`` groups (stored ``1 / scale`` (+ offset)); LoCo update as
    :func:`quantplan.reference.loco_error_update`.

    **When to use:** through :mod:`quantplan.compat.deepspeed`; new code should prefer
    :class:`~quantplan.DequantReducePlan`.

    **Dtypes:** codes int8 / uint8 bytes; params float32; error buffer F16 / BF16 / F32.

    **Shape limits:** any group sizes; ``in_groups`` divides ``numel`` and is a multiple of
    ``devices_per_node``; ``out_groups`` divides ``numel / devices_per_node``; 4-bit: even chunks.

    **Workspace:** none.

    **Precision guarantee:** float32 dequantization and sum (DeepSpeed sums in fp16), fixed
    order, bit-exact to the reference, deterministic.
    """

    _category = OpCategory.COLLECTIVE

    def __init__(self, desc: DeepSpeedReduceDescriptor, backend: BackendKind) -> None:
        code = ElementKind.S4 if desc.num_bits == 4 else ElementKind.S8
        super().__init__(backend, code, code)
        self.descriptor = desc

    @classmethod
    def select(
        cls, stream: Any, desc: DeepSpeedReduceDescriptor, pref: PlanPreference | None = None
    ) -> DeepSpeedReducePlan:
        """Validate ``desc`` and pick the backend (REFERENCE in this release)."""
        _check_groups(desc.numel, desc.in_groups)
        _check_bits(desc.num_bits, (4, 8))
        check_positive("devices_per_node", desc.devices_per_node)
        check_positive("out_groups", desc.out_groups)
        check_error_kind(desc.error_element)
        if desc.in_groups % desc.devices_per_node:
            raise InvalidProblem(
                f"in_groups={desc.in_groups} must be a multiple of devices_per_node={desc.devices_per_node} "
                f"(each peer chunk holds whole groups)"
            )
        if desc.chunk_elements % desc.out_groups:
            raise InvalidProblem(
                f"out_groups={desc.out_groups} does not divide the {desc.chunk_elements} reduced elements"
            )
        if desc.num_bits == 4 and desc.chunk_elements % 2:
            raise InvalidProblem(f"4-bit codes pack two per byte: chunks must be even, got {desc.chunk_elements}")
        return cls(desc, reference_only_backend(pref or PlanPreference(), "DeepSpeedReducePlan"))

    def _check(self, args: DeepSpeedReduceArgs) -> tuple[Operand, Operand, Operand, Operand, Operand | None, float]:
        d = self.descriptor
        ops = self._operands
        q = self._codes(args.input, "input", d.input_bytes)
        p = ops.tensor(args.params, "params", d.input_param_shape, ElementKind.F32)
        y = self._codes(args.output, "output", d.output_bytes)
        p_out = ops.tensor(args.params_out, "params_out", d.param_shape, ElementKind.F32)
        err, beta = ops.loco(args.error_feedback, args.error_beta, (d.chunk_elements,), d.error_element)
        return q, p, y, p_out, err, beta

    def run(self, stream: Any, workspace: Workspace | None, args: DeepSpeedReduceArgs) -> None:
        """Reduce and re-quantize; LoCo update; all checks before any write; zero size: no-op."""
        check_workspace(workspace, 0)
        q, p, y, p_out, err, beta = self._check(args)
        d = self.descriptor
        if d.numel == 0:
            return
        error = None if err is None or d.error_element is None else host_view(err, d.error_element)
        codes, params, new_err = dsref.quantized_reduction(
            _bytes(q),
            host_view(p, ElementKind.F32),
            d.numel,
            d.in_groups,
            d.out_groups,
            d.num_bits,
            d.mode,
            d.devices_per_node,
            error,
            beta,
        )
        np.copyto(_bytes(y), codes, casting="no")
        write_back(p_out, ElementKind.F32, params)
        if err is not None and new_err is not None and d.error_element is not None:
            write_back(err, d.error_element, new_err)


# ---- MoQ fake quantization -----------------------------------------------------------------------


class MoQFakeQuantizeDescriptor(BaseModel):
    """DeepSpeed MoQ fake quantization: ``numel`` elements in ``groups`` groups, ``num_bits`` 1 to 8,
    ``mode``, ``stochastic`` rounding, ``element`` F16 / BF16 / F32 (in and out)."""

    model_config = _FROZEN
    numel: int
    groups: int
    num_bits: int
    mode: QuantMode = QuantMode.SYMMETRIC
    stochastic: bool = False
    element: ElementKind


@dataclass(slots=True)
class MoQFakeQuantizeArgs:
    """``input`` and ``output`` (flat, same dtype; ``output`` may be ``input``); with
    ``stochastic``: ``rng_seed`` / ``rng_offset`` (ints in [0, 2**64), SPEC section 4 Philox)."""

    input: Any
    output: Any
    rng_seed: Any = None
    rng_offset: Any = None


class MoQFakeQuantizePlan(_DeepSpeedPlan):
    """DeepSpeed's MoQ fake quantization (``ds_quantize_*`` / ``ds_sr_quantize_*``), defects fixed.

    Formula: :func:`quantplan.compat._deepspeed_reference.moq_fake_quantize` (SYMMETRIC
    ``scale = 2**b / (2 * absmax + 1e-5)``, ``x <- clamp(rne(x * scale)) / scale``; ASYMMETRIC
    ``step = (max - min + 1e-5) / 2**b``, ``x <- round_half_away((x - min) / step) * step + min``;
    stochastic variants round with Philox uniforms, element ``i`` using SPEC section 4's stream).
    Unlike DeepSpeed, the stochastic ASYMMETRIC variant runs the asymmetric formula and the F32
    SYMMETRIC variant returns ``q / scale`` (not the integer ``q``).

    **When to use:** through :mod:`quantplan.compat.deepspeed`; new QAT code should prefer
    :class:`~quantplan.DynamicRangeFakeQuantizePlan`.

    **Dtypes:** F16 / BF16 / F32 in and out.

    **Shape limits:** any group size (no ~1M-element cap); ``groups`` divides ``numel``.

    **Workspace:** none.

    **Precision guarantee:** float32 arithmetic, bit-exact to the reference, deterministic for a
    given seed and offset.
    """

    _category = OpCategory.FAKE_QUANTIZE

    def __init__(self, desc: MoQFakeQuantizeDescriptor, backend: BackendKind) -> None:
        super().__init__(backend, desc.element, desc.element)
        self.descriptor = desc

    @classmethod
    def select(
        cls, stream: Any, desc: MoQFakeQuantizeDescriptor, pref: PlanPreference | None = None
    ) -> MoQFakeQuantizePlan:
        """Validate ``desc`` and pick the backend (REFERENCE in this release)."""
        _check_groups(desc.numel, desc.groups)
        _check_bits(desc.num_bits, tuple(range(1, 9)))
        check_float_kind(desc.element, "element")
        return cls(desc, reference_only_backend(pref or PlanPreference(), "MoQFakeQuantizePlan"))

    def _check(self, args: MoQFakeQuantizeArgs) -> tuple[Operand, Operand, Any, Any]:
        d = self.descriptor
        ops = self._operands
        x = ops.tensor(args.input, "input", (d.numel,), d.element)
        y = ops.tensor(args.output, "output", (d.numel,), d.element)
        seed: Any = None
        offset: Any = None
        if d.stochastic:
            seed = ops._rng_value(args.rng_seed, "rng_seed")
            offset = ops._rng_value(args.rng_offset, "rng_offset")
        elif args.rng_seed is not None or args.rng_offset is not None:
            raise InvalidProblem("rng_seed / rng_offset apply only to stochastic plans; leave them None")
        return x, y, seed, offset

    def run(self, stream: Any, workspace: Workspace | None, args: MoQFakeQuantizeArgs) -> None:
        """Fake-quantize; all checks before any write; zero size: no-op."""
        check_workspace(workspace, 0)
        x, y, seed, offset = self._check(args)
        d = self.descriptor
        if d.numel == 0:
            return
        uniform = reference_uniform((d.numel,), seed, offset) if d.stochastic else None
        values = dsref.moq_fake_quantize(host_view(x, d.element), d.groups, d.num_bits, d.mode, uniform)
        write_back(y, d.element, values)


__all__ = [
    "DeepSpeedDequantizeArgs",
    "DeepSpeedDequantizeDescriptor",
    "DeepSpeedDequantizePlan",
    "DeepSpeedQuantizeArgs",
    "DeepSpeedQuantizeDescriptor",
    "DeepSpeedQuantizePlan",
    "DeepSpeedReduceArgs",
    "DeepSpeedReduceDescriptor",
    "DeepSpeedReducePlan",
    "MoQFakeQuantizeArgs",
    "MoQFakeQuantizeDescriptor",
    "MoQFakeQuantizePlan",
]
