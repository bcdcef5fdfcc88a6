"""The typed vocabulary of quantplan: element kinds, modes, scopes, kernel identity.

Everything here is a plain enum, a frozen pydantic model or a small frozen dataclass, so
descriptors that hold them are hashable and can key caches.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic._internal._model_construction import ModelMetaclass  # BaseModel's metaclass (no public name)

from quantplan.vocabulary._kinds import (
    BackendKind,
    NibbleOrder,
    OpCategory,
    QuantizeKind,
    QuantMode,
    Rounding,
)
from quantplan.vocabulary.elements import ElementKind, MathPrecision
from quantplan.vocabulary.errors import InvalidProblem

# ---------------------------------------------------------------------------------------------
# Scopes: which elements share one scale / zero point.
# ---------------------------------------------------------------------------------------------

_FROZEN = ConfigDict(frozen=True, extra="forbid")


def _validation_message(model: str, exc: ValidationError) -> str:
    """One line per field pydantic refused: the field path, its rule and the value given."""
    parts = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(p) for p in err["loc"]) or "(model)"
        given = f" (got {err['input']!r})" if "input" in err and err["type"] != "missing" else ""
        parts.append(f"{where}: {err['msg']}{given}")
    return f"{model}: " + "; ".join(parts) + f"; fix the field(s) and construct the {model} again"


def _brief(value: Any) -> str:
    """A field value as the concise repr shows it: enum members by name, the rest by repr."""
    return value.name if isinstance(value, enum.Enum) else repr(value)


class Model(BaseModel):
    """Base of every descriptor, scope and preference: frozen, hashable, no extra fields, and its
    validation errors raised as :class:`~quantplan.InvalidProblem` naming the field (so
    ``except qp.QuantPlanError`` catches them; InvalidProblem is also a ``ValueError``).

    ``repr`` / ``str``: one line, every field by name, enum members by name
    (``QuantizeDescriptor(shape=(16, 4096), scope=TokenScope(), mode=SYMMETRIC, ...)``); a
    scope's constant ``kind`` tag is left out (the class name says it)."""

    model_config = _FROZEN

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise InvalidProblem(_validation_message(type(self).__name__, exc)) from None

    def __repr__(self) -> str:
        parts = []
        for name, info in type(self).model_fields.items():
            value = self.__dict__.get(name)
            if name == "kind" and value == info.default:
                continue
            parts.append(f"{name}={_brief(value)}")
        return f"{type(self).__name__}({', '.join(parts)})"

    def __str__(self) -> str:
        return self.__repr__()

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            super().__setattr__(name, value)
        except ValidationError:
            raise InvalidProblem(
                f"{type(self).__name__} is frozen: {name} cannot be assigned; build a new one "
                f"(model_copy(update={{{name!r}: ...}}))"
            ) from None


#: Most elements one problem may hold: the kernels index elements with signed 64-bit offsets.
MAX_ELEMENTS = 2**63 - 1


def check_element_count(numel: int, what: str) -> int:
    """``numel`` (the elements of ``what``), or InvalidProblem when it exceeds :data:`MAX_ELEMENTS`."""
    if numel > MAX_ELEMENTS:
        raise InvalidProblem(
            f"{what} holds {numel} elements, more than the 2**63 - 1 that 64-bit offsets index; split the problem"
        )
    return numel


def _check_extents(shape: tuple[int, ...]) -> tuple[int, ...]:
    numel = 1
    for extent in shape:
        if extent < 0:
            raise ValueError(f"shape {shape} has a negative extent; every extent must be >= 0")
        numel *= extent
    check_element_count(numel, f"shape {shape}")
    return shape


#: A descriptor's ``shape``: integer extents >= 0 whose product fits 64-bit offsets.
Shape = Annotated[tuple[int, ...], AfterValidator(_check_extents)]


#: The scopes made so far, by class and keyword arguments (each value with its type, so that
#: ``axis=True`` or ``axis=1.0`` are validated on their own and never meet ``axis=1``).
_SCOPES: dict[tuple[Any, ...], Any] = {}
_SCOPES_LIMIT = 1024


class _ScopeValues(ModelMetaclass):
    """Scopes are frozen values: a call with the arguments of an earlier one returns that
    scope (equal, and immutable) without validating again, so ``qp.quantize(x, "int8",
    scope=qp.TokenScope())`` in a loop costs a dictionary lookup, not a pydantic validation
    (about a microsecond and a half). Up to :data:`_SCOPES_LIMIT` argument sets are kept; a bad
    argument raises every time."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if args:
            return super().__call__(*args, **kwargs)
        try:
            key = (cls, *((name, type(value), value) for name, value in kwargs.items())) if kwargs else (cls,)
            return _SCOPES[key]
        except KeyError:
            made = super().__call__(**kwargs)
            if len(_SCOPES) < _SCOPES_LIMIT:
                _SCOPES[key] = made
            return made
        except TypeError:  # an unhashable argument: validation says what is wrong with it
            return super().__call__(**kwargs)


class TensorScope(Model, metaclass=_ScopeValues):
    """One scale (and zero point) for the whole tensor. Parameter shape: all extents 1."""

    model_config = _FROZEN
    kind: Literal["tensor"] = "tensor"


class TokenScope(Model, metaclass=_ScopeValues):
    """One parameter per row: all axes but the last. Parameter shape: input shape, last extent 1."""

    model_config = _FROZEN
    kind: Literal["token"] = "token"


class ChannelScope(Model, metaclass=_ScopeValues):
    """One parameter per index along ``axis`` (negative axes count from the end).

    Parameter shape: all extents 1 except ``axis``.
    """

    model_config = _FROZEN
    kind: Literal["channel"] = "channel"
    axis: int


class GroupScope(Model, metaclass=_ScopeValues):
    """One parameter per contiguous run of ``group_size`` elements along ``axis``.

    Parameter shape: the input shape with the ``axis`` extent divided by ``group_size``
    (which must divide it).
    """

    model_config = _FROZEN
    kind: Literal["group"] = "group"
    axis: int = -1
    group_size: int = Field(gt=0)


Scope = Annotated[TensorScope | TokenScope | ChannelScope | GroupScope, Field(discriminator="kind")]


# ---------------------------------------------------------------------------------------------
# Kernel identity and guarantees.
# ---------------------------------------------------------------------------------------------


def normalize_axis(axis: int, rank: int, what: str) -> int:
    """``axis`` in [0, rank), or InvalidProblem."""
    if not -rank <= axis < rank:
        raise InvalidProblem(f"{what} axis {axis} is out of range for a rank-{rank} tensor; use -{rank}..{rank - 1}")
    return axis % rank


def expand_params(params: np.ndarray, shape: tuple[int, ...], scope: Scope) -> np.ndarray:
    """Broadcastable view of a parameter tensor over ``shape`` (groups repeated along their axis)."""
    if isinstance(scope, GroupScope):
        axis = normalize_axis(scope.axis, len(shape), "group scope")
        return np.repeat(params, scope.group_size, axis=axis)
    return params


def param_shape(shape: tuple[int, ...], scope: Scope) -> tuple[int, ...]:
    """Shape of the scale / zero-point tensor of ``scope`` on ``shape`` (SPEC section 3)."""
    rank = len(shape)
    if isinstance(scope, TensorScope):
        return (1,) * rank
    if rank == 0:
        raise InvalidProblem(f"{scope.kind} scope needs a tensor of rank >= 1, got shape ()")
    if isinstance(scope, TokenScope):
        return (*shape[:-1], 1)
    if isinstance(scope, ChannelScope):
        axis = normalize_axis(scope.axis, rank, "channel scope")
        return tuple(e if i == axis else 1 for i, e in enumerate(shape))
    axis = normalize_axis(scope.axis, rank, "group scope")
    g = scope.group_size
    if shape[axis] % g != 0:
        raise InvalidProblem(
            f"group_size {g} does not divide the extent {shape[axis]} of axis {scope.axis} in shape {shape}; "
            f"choose a group size that divides it (or pad the tensor)"
        )
    return tuple(e // g if i == axis else e for i, e in enumerate(shape))


@dataclass(frozen=True)
class ArchSku:
    """A GPU architecture by compute capability (``ArchSku(9, 0)`` is sm_90), or ``HOST``."""

    major: int
    minor: int

    @property
    def name(self) -> str:
        return "host" if self.major == 0 else f"sm_{self.major}{self.minor}"

    @property
    def nvrtc_arch(self) -> str:
        """The ``-arch`` value NVRTC compiles for (``sm_90``)."""
        return f"sm_{self.major}{self.minor}"

    @classmethod
    def from_compute_capability(cls, cc: str | tuple[int, int]) -> ArchSku:
        """``ArchSku.from_compute_capability("90")`` or ``((9, 0))``."""
        if isinstance(cc, str):
            return cls(int(cc[:-1]), int(cc[-1]))
        return cls(int(cc[0]), int(cc[1]))

    @classmethod
    def parse(cls, text: str) -> ArchSku:
        """An architecture as users write it: ``sm_90``, ``90`` or ``9.0`` (sm_70 to sm_129).

        Raises :class:`~quantplan.InvalidProblem` naming ``text`` and the accepted forms otherwise.
        """
        match = re.fullmatch(r"(?:sm_)?(\d{1,2})(\d)|(\d{1,2})\.(\d)", text.strip())
        if match:
            major, minor = (match.group(1), match.group(2)) if match.group(1) else (match.group(3), match.group(4))
            if 7 <= int(major) <= 12:
                return cls(int(major), int(minor))
        raise InvalidProblem(
            f"{text!r} is not a CUDA architecture quantplan compiles for; write it as sm_80, sm_90 or sm_120 "
            f"(or 90, 9.0)"
        )

    def __str__(self) -> str:
        return self.name


HOST_ARCH = ArchSku(0, 0)


class PrecisionGuarantee(Model):
    """What a plan promises about its numbers.

    ``math_precision``: arithmetic type. ``accumulator``: element kind of any reduction.
    ``bit_stable_on_same_hardware``: the same inputs give the same bits on every run on one GPU.
    ``deterministic``: no run-to-run variation from scheduling (no order-dependent atomics).
    ``matches_reference``: the CUDA backend equals the NumPy reference bit for bit.
    """

    model_config = _FROZEN
    math_precision: MathPrecision
    accumulator: ElementKind
    bit_stable_on_same_hardware: bool = True
    deterministic: bool = True
    matches_reference: bool = True

    def __str__(self) -> str:
        """``F32 math, F32 accumulator, deterministic, bit-stable on the same hardware, matches the reference``."""
        flags = [
            ("deterministic", self.deterministic),
            ("bit-stable on the same hardware", self.bit_stable_on_same_hardware),
            ("matches the reference bit for bit", self.matches_reference),
        ]
        said = ", ".join(text if ok else f"not {text}" for text, ok in flags)
        return f"{self.math_precision.name} math, {self.accumulator.name} accumulator, {said}"


class KernelSku(Model):
    """Identity of the kernel a plan runs: what it computes, on which types, which variant, where."""

    model_config = _FROZEN
    category: OpCategory
    op: QuantizeKind
    element: ElementKind
    aux_element: ElementKind
    variant: str
    arch: str
    backend: BackendKind
    precision_guarantee: PrecisionGuarantee

    def __str__(self) -> str:
        """``quantize/static F32 / S8, variant 'numpy', reference backend on host`` (the repr has every field)."""
        return (
            f"{self.category.value}/{self.op.value} {self.element.name} / {self.aux_element.name}, "
            f"variant {self.variant!r}, {self.backend.value} backend on {self.arch}"
        )


class PlanPreference(Model):
    """Caller's wishes for ``select``.

    ``backend``: None picks CUDA when a GPU is present and REFERENCE otherwise; CUDA demands the
    GPU (``Unsupported`` without one); REFERENCE forces the NumPy backend.

    ``validate_values``: False (default) leaves the values inside array parameters unchecked on
    the hot path (NaN, zero or negative entries of a scale array, zero points outside the code
    range). True makes every checked ``run`` / ``can_implement`` of the plan copy them to the
    host and inspect them, raising InvalidProblem naming the first bad index: for debugging,
    not for production (a device-to-host copy per array parameter per call).

    ``schedule``: None lets the plan choose how its kernels cover the problem; a name forces
    one of the plan's schedules, for tests and measurements (:mod:`quantplan.runtime._selection` lists
    them per plan, in the one order the plans try them: ``"row-shares"``, ``"cluster"``,
    ``"lanes"``, ``"rows"``, ``"dense"``, ``"fused"``, ``"fused-element-io"``, ``"dense-rows"``,
    ``"row-layout"``, ``"flat"``, ``"two-pass"``, ``"multi-pass"``). Plans with a choice take it:
    DynamicRangeQuantizePlan, DynamicRangeFakeQuantizePlan, QuantizePlan, DequantizePlan,
    FakeQuantizePlan, SwizzledQuantizePlan and the DeepSpeed-format quantize, MoQ and reduce
    plans. ``select`` raises Unsupported for a name the plan does not list, for a schedule that
    cannot serve the problem (on the CUDA backend; the reference backend checks the name, and
    SwizzledQuantizePlan and the DeepSpeed-format quantize and MoQ plans the device-independent
    conditions too), and on plans that
    take no forced schedule. The bits do not depend on the schedule.
    """

    model_config = _FROZEN
    backend: BackendKind | None = None
    validate_values: bool = False
    schedule: str | None = None


__all__ = [
    "param_shape",
    "expand_params",
    "normalize_axis",
    "HOST_ARCH",
    "ArchSku",
    "BackendKind",
    "ChannelScope",
    "ElementKind",
    "GroupScope",
    "KernelSku",
    "MAX_ELEMENTS",
    "MathPrecision",
    "Model",
    "NibbleOrder",
    "OpCategory",
    "PlanPreference",
    "PrecisionGuarantee",
    "QuantMode",
    "QuantizeKind",
    "Rounding",
    "Scope",
    "Shape",
    "TensorScope",
    "TokenScope",
    "check_element_count",
]
