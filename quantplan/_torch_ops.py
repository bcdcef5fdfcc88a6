"""quantplan's ``torch.library`` operators (namespace ``quantplan``) for the functional layer and
the collectives, and what every front-end uses to define its own.

Operators are defined with ``torch.library.Library("quantplan", "FRAGMENT").define`` and given a
kernel per dispatch key -- the same Python function for ``CPU`` (the NumPy reference backend) and
``CUDA`` (the kernels, on the current PyTorch stream of the tensors' device) -- a fake
implementation (output shapes and dtypes only; torch.compile traces with it, and meta tensors
get shape inference) and an Autograd kernel: :mod:`quantplan.pytorch` registers its own for the
differentiable fake-quantize operators (their backward is made of operators too); the
quantize / dequantize operators here fall through their Autograd key, so their outputs require no
gradient. ``torch.compile(fullgraph=True)``
then traces a function that calls them: each call is one node of the graph, and the compiled
code calls the operator, which runs the plan.

Operators take no Python objects, only what a schema holds: a scope is ``int[] scope`` =
``[kind, axis, group_size]`` (:func:`scope_ints`; kind 0 TensorScope, 1 ChannelScope,
2 TokenScope, 3 GroupScope), an :class:`~quantplan.ElementKind` or
:class:`~quantplan.NibbleOrder` its index in the enum, a Python-number parameter a ``float`` /
``Scalar?`` beside its ``Tensor?`` twin, and a Philox seed or offset in [2**63, 2**64) its two's
complement (schema ints are signed 64-bit; :func:`signed_seed`).

Operators here:

* ``quantize_dynamic(x, ...) -> (codes, scale, zero_point)`` and ``quantize_static(x, scale, ...)
  -> codes`` (:func:`quantplan.quantize` on a tensor), ``dequantize(codes, scale, ...) -> y``
  (:func:`quantplan.dequantize`); not differentiable (their outputs require no grad, as in eager);
* ``dynamic_quantize_out``, ``dequantize_out``, ``swizzled_quantize_out``, ``dequant_reduce_out``:
  the plans of :mod:`quantplan.distributed` writing into given buffers (mutating operators).

:func:`quantize` / :func:`dequantize` are what :mod:`quantplan.functional` calls under
torch.compile: they build the :class:`~quantplan.functional.QuantizedTensor` around the
operators' plain tensors, with its descriptor made outside the trace (by the operators' fake
implementations, see :func:`_traced_descriptor`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import torch

from quantplan._frontend import Target, remember_replay, replay, replay_of
from quantplan._torch_library import (
    _KIND_INDEX,
    _KINDS,
    LIBRARY,
    define,
    fresh_like,
    kind_index,
    scope_ints,
    scope_of,
    signed_seed,
    unsigned_seed,
)
from quantplan.ops import static_quantize as _static_quantize
from quantplan.ops.dequant_reduce import DequantReduceArgs, DequantReduceDescriptor, DequantReducePlan
from quantplan.ops.dynamic_range import (
    DynamicRangeQuantizeArgs,
    DynamicRangeQuantizeDescriptor,
    DynamicRangeQuantizePlan,
)
from quantplan.ops.static_quantize import DequantizeArgs, DequantizePlan, QuantizeArgs
from quantplan.ops.swizzled_quantize import SwizzledQuantizeArgs, SwizzledQuantizeDescriptor, SwizzledQuantizePlan
from quantplan.runtime._affine import storage_shape
from quantplan.runtime._layout import param_shape
from quantplan.vocabulary.errors import InvalidProblem
from quantplan.vocabulary.formats import affine_scale_dtype
from quantplan.vocabulary.types import (
    ElementKind,
    NibbleOrder,
    QuantMode,
    Rounding,
    Scope,
)

#: The parameters' dtype for each float data element: the affine formats' scale element
#: (:mod:`quantplan.vocabulary.formats`), never inferred from the arithmetic precision.
_PARAM_DTYPES: dict[ElementKind, Any] = {
    kind: getattr(torch, affine_scale_dtype(kind).name)
    for kind in (ElementKind.F16, ElementKind.BF16, ElementKind.F32, ElementKind.F64)
}

_NIBBLES = tuple(NibbleOrder)
_NIBBLE_INDEX = {order: i for i, order in enumerate(_NIBBLES)}
_MODES = (QuantMode.SYMMETRIC, QuantMode.ASYMMETRIC)
_FLOAT_KINDS = {
    torch.float16: ElementKind.F16,
    torch.bfloat16: ElementKind.BF16,
    torch.float32: ElementKind.F32,
    torch.float64: ElementKind.F64,
}
_TORCH_OF = {kind: dtype for dtype, kind in _FLOAT_KINDS.items()}
_CODE_DTYPES = {
    ElementKind.S8: torch.int8,
    ElementKind.U8: torch.uint8,
    ElementKind.S4: torch.uint8,
    ElementKind.U4: torch.uint8,
    ElementKind.FP8_E4M3: torch.float8_e4m3fn,
    ElementKind.FP8_E5M2: torch.float8_e5m2,
}


# ---- what every operator uses ----------------------------------------------------------------------


def _kind_at(index: int) -> ElementKind:
    if not 0 <= index < len(_KINDS):
        raise InvalidProblem(f"element index {index} is not an ElementKind (0 to {len(_KINDS) - 1})")
    return _KINDS[index]


def _number_or_tensor(tensor: Any, value: Any) -> Any:
    return value if tensor is None else tensor


def _not_differentiable(name: str) -> None:
    """Operator ``name``'s Autograd key falls through to its CPU / CUDA kernel (no Python on that
    key): its outputs require no gradient, whatever its inputs, as in eager. A Python autograd
    kernel (``torch.library.register_autograd``) cost every eager call as much as the operator's
    own dispatch again (``benchmarks/host_torch_ops.py``)."""
    LIBRARY.impl(name, torch.library.fallthrough_kernel, "Autograd")


# ---- the functional layer: quantize / dequantize ------------------------------------------------


def _rounding(stochastic: bool) -> Rounding:
    return Rounding.STOCHASTIC if stochastic else Rounding.NEAREST_EVEN


def _quantize_layout(
    shape: tuple[Any, ...], scope: tuple[int, ...], asymmetric: bool, float_kind: int, code: int, nibble: int
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """(codes storage shape, parameter shape) of a quantize problem: the descriptor's when the
    shape is concrete (its checks included), else (symbolic sizes while tracing with dynamic
    shapes) the same formulas on the sizes."""
    if all(type(e) is int for e in shape):
        return _concrete_layout(shape, scope, asymmetric, float_kind, code, nibble)
    return storage_shape(shape, _kind_at(code)), param_shape(shape, scope_of(scope))


@lru_cache(maxsize=256)
def _concrete_layout(
    shape: tuple[int, ...], scope: tuple[int, ...], asymmetric: bool, float_kind: int, code: int, nibble: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    desc = _static_quantize.QuantizeDescriptor(
        shape=shape,
        scope=scope_of(scope),
        mode=_MODES[asymmetric],
        input_element=_kind_at(float_kind),
        output_element=_kind_at(code),
        nibble_order=_NIBBLES[nibble],
    )
    return desc.output_shape, desc.param_shape


def _float_kind_of(x: Any) -> ElementKind:
    kind = _FLOAT_KINDS.get(x.dtype)
    if kind is None:
        raise InvalidProblem(f"input has dtype {x.dtype}; quantize float16, bfloat16, float32 or float64 data")
    return kind


def _rng(stochastic: bool, rng_seed: int | None, rng_offset: int) -> tuple[int | None, int | None]:
    """The plans' (rng_seed, rng_offset): None for nearest rounding; a stochastic call without a
    seed draws a fresh 64-bit one (as :func:`quantplan.quantize`)."""
    if not stochastic:
        if rng_seed is not None:
            raise InvalidProblem("seed= applies to rounding=Rounding.STOCHASTIC only")
        return None, None
    seed = int.from_bytes(os.urandom(8), "little") if rng_seed is None else unsigned_seed(rng_seed)
    return seed, unsigned_seed(rng_offset)


def _storage(codes_shape: tuple[int, ...], code: ElementKind, x: Any) -> tuple[Any, Any]:
    """(the codes tensor returned, its storage as the plans take it: FP8 as uint8 bits)."""
    dtype = _CODE_DTYPES[code]
    if code in (ElementKind.FP8_E4M3, ElementKind.FP8_E5M2):
        bits = x.new_empty(codes_shape, dtype=torch.uint8)
        return bits.view(dtype), bits
    codes = x.new_empty(codes_shape, dtype=dtype)
    return codes, codes


def _prepare(x: Any) -> tuple[Target, Any, ElementKind]:
    target = Target.of(x)
    xc = target.contiguous(x)
    return target, xc, _float_kind_of(xc)


#: The quantize operators' (plan, descriptor) classes: the same descriptor fields.
_DYNAMIC = (DynamicRangeQuantizePlan, DynamicRangeQuantizeDescriptor)
_STATIC = (_static_quantize.QuantizePlan, _static_quantize.QuantizeDescriptor)


def _code_plan(
    classes: tuple[Any, Any],
    target: Target,
    shape: tuple[int, ...],
    kind: ElementKind,
    scope: list[int],
    asymmetric: bool,
    code_kind: ElementKind,
    q_min: int | None,
    q_max: int | None,
    nibble_order: int,
    stochastic: bool,
) -> Any:
    """The cached plan of a quantize operator (dynamic or static): its descriptor from the
    operator's flat arguments, selected once per key; ``classes``: :data:`_DYNAMIC` or :data:`_STATIC`."""
    plan_cls, desc_cls = classes
    key = (shape, kind, tuple(scope), asymmetric, code_kind, q_min, q_max, nibble_order, stochastic)
    return target.plan(
        plan_cls,
        key,
        lambda: desc_cls(
            shape=shape,
            scope=scope_of(scope),
            mode=_MODES[asymmetric],
            input_element=kind,
            output_element=code_kind,
            q_min=q_min,
            q_max=q_max,
            nibble_order=_NIBBLES[nibble_order],
            rounding=_rounding(stochastic),
        ),
    )


def _quantize_dynamic_impl(
    x: Any,
    code: int,
    scope: list[int],
    asymmetric: bool,
    q_min: int | None,
    q_max: int | None,
    nibble_order: int,
    stochastic: bool,
    rng_seed: int | None,
    rng_offset: int,
) -> tuple[Any, Any, Any]:
    key: tuple[Any, ...] | None = None
    if not stochastic and rng_seed is None:
        # A call like an earlier one (CUDA, nearest rounding): replayed, allocate the outputs and launch.
        try:
            key = (
                _quantize_dynamic_impl,
                type(x),
                x.dtype,
                x.shape,
                code,
                tuple(scope),
                asymmetric,
                q_min,
                q_max,
                nibble_order,
            )
            fast = replay_of(key)
        except (AttributeError, TypeError):  # not a tensor; an unhashable argument
            key = fast = None
        if fast is not None:
            out = fast(x)
            if out is not None:
                return out  # type: ignore[no-any-return]
    target, xc, kind = _prepare(x)
    shape = tuple(xc.shape)
    code_kind = _kind_at(code)
    plan = _code_plan(
        _DYNAMIC, target, shape, kind, scope, asymmetric, code_kind, q_min, q_max, nibble_order, stochastic
    )
    codes_shape, pshape = _quantize_layout(shape, tuple(scope), asymmetric, _KIND_INDEX[kind], code, nibble_order)
    codes, bits = _storage(codes_shape, code_kind, xc)
    scale = xc.new_empty(pshape, dtype=_PARAM_DTYPES[kind])
    zp = xc.new_empty(pshape if asymmetric else (0,), dtype=torch.int32)
    seed, offset = _rng(stochastic, rng_seed, rng_offset)
    arg = target.arg
    args = DynamicRangeQuantizeArgs(arg(xc), arg(bits), arg(scale), arg(zp) if asymmetric else None, seed, offset)
    target.run_with_workspace(plan, args)
    # Remembered where the plan ran on x itself and wrote the returned codes (FP8 codes are a view
    # of their bits, which the replay does not make: not remembered).
    if key is not None and xc is x and codes is bits and scale.numel():
        outputs = [(codes_shape, _DTYPE_NAMES[codes.dtype]), (pshape, _DTYPE_NAMES[scale.dtype])]
        if asymmetric:
            outputs.append((pshape, "int32"))
        finish = _finish_asymmetric if asymmetric else _finish_symmetric
        remember_replay(key, target, lambda: replay(target, plan, args, 1, outputs, finish))
    return codes, scale, zp


_DTYPE_NAMES = {torch.int8: "int8", torch.uint8: "uint8", torch.float32: "float32", torch.float64: "float64"}


def _finish_symmetric(x: Any, codes: Any, scale: Any) -> tuple[Any, Any, Any]:
    """A replayed symmetric ``quantize_dynamic``'s outputs: its zero point is an empty int32 tensor."""
    return codes, scale, x.new_empty((0,), dtype=torch.int32)


def _finish_asymmetric(x: Any, codes: Any, scale: Any, zp: Any) -> tuple[Any, Any, Any]:
    """A replayed asymmetric ``quantize_dynamic``'s outputs."""
    return codes, scale, zp


def _fake_layout(
    x: Any, code: int, scope: list[int], asymmetric: bool, nibble: int
) -> tuple[ElementKind, tuple[Any, ...], tuple[Any, ...]]:
    """(float kind, codes shape, parameter shape) of a quantize operator's fake call, which also
    stores the descriptor its QuantizedTensor reads (:func:`_traced_descriptor`)."""
    float_kind = _float_kind_of(x)
    float_index = _KIND_INDEX[float_kind]
    codes_shape, pshape = _quantize_layout(tuple(x.shape), tuple(scope), asymmetric, float_index, code, nibble)
    _store_descriptor(tuple(x.shape), tuple(scope), asymmetric, code, float_index, nibble)
    return float_kind, codes_shape, pshape


def _quantize_dynamic_fake(x: Any, code: int, scope: list[int], asymmetric: bool, *rest: Any) -> tuple[Any, Any, Any]:
    float_kind, codes_shape, pshape = _fake_layout(x, code, scope, asymmetric, rest[2])
    pdtype = _PARAM_DTYPES[float_kind]
    codes = x.new_empty(codes_shape, dtype=_CODE_DTYPES[_kind_at(code)])
    zp = x.new_empty(pshape if asymmetric else (0,), dtype=torch.int32)
    return codes, x.new_empty(pshape, dtype=pdtype), zp


quantize_dynamic_op = define(
    "quantize_dynamic(Tensor x, int code, int[] scope, bool asymmetric, int? q_min, int? q_max, int nibble_order, "
    "bool stochastic, int? rng_seed, int rng_offset) -> (Tensor, Tensor, Tensor)",
    _quantize_dynamic_impl,
    _quantize_dynamic_fake,
)
_not_differentiable("quantize_dynamic")


def _quantize_static_impl(
    x: Any,
    scale: Any,
    scale_value: float,
    zero_point: Any,
    zero_point_value: int | None,
    code: int,
    scope: list[int],
    q_min: int | None,
    q_max: int | None,
    nibble_order: int,
    stochastic: bool,
    rng_seed: int | None,
    rng_offset: int,
) -> Any:
    target, xc, kind = _prepare(x)
    shape = tuple(xc.shape)
    code_kind = _kind_at(code)
    asymmetric = zero_point is not None or zero_point_value is not None
    plan = _code_plan(
        _STATIC, target, shape, kind, scope, asymmetric, code_kind, q_min, q_max, nibble_order, stochastic
    )
    codes_shape, _ = _quantize_layout(shape, tuple(scope), asymmetric, _KIND_INDEX[kind], code, nibble_order)
    codes, bits = _storage(codes_shape, code_kind, xc)
    seed, offset = _rng(stochastic, rng_seed, rng_offset)
    arg = target.arg
    s = _number_or_tensor(scale, scale_value)
    z = _number_or_tensor(zero_point, zero_point_value)
    target.run_with_workspace(plan, QuantizeArgs(arg(xc), arg(bits), arg(s), arg(z), seed, offset))
    return codes


def _quantize_static_fake(
    x: Any,
    scale: Any,
    scale_value: float,
    zero_point: Any,
    zero_point_value: Any,
    code: int,
    scope: list[int],
    *rest: Any,
) -> Any:
    asymmetric = zero_point is not None or zero_point_value is not None
    _, codes_shape, _ = _fake_layout(x, code, scope, asymmetric, rest[2])
    return x.new_empty(codes_shape, dtype=_CODE_DTYPES[_kind_at(code)])


quantize_static_op = define(
    "quantize_static(Tensor x, Tensor? scale, float scale_value, Tensor? zero_point, int? zero_point_value, "
    "int code, int[] scope, int? q_min, int? q_max, int nibble_order, bool stochastic, int? rng_seed, "
    "int rng_offset) -> Tensor",
    _quantize_static_impl,
    _quantize_static_fake,
)
_not_differentiable("quantize_static")


@lru_cache(maxsize=256)
def _dequantize_descriptor(
    shape: tuple[int, ...], scope: tuple[int, ...], asymmetric: bool, code: int, output: int, nibble: int
) -> _static_quantize.DequantizeDescriptor:
    return _static_quantize.DequantizeDescriptor(
        shape=shape,
        scope=scope_of(scope),
        mode=_MODES[asymmetric],
        input_element=_kind_at(code),
        output_element=_kind_at(output),
        nibble_order=_NIBBLES[nibble],
    )


def _dequantize_impl(
    codes: Any,
    scale: Any,
    scale_value: float,
    zero_point: Any,
    zero_point_value: int | None,
    shape: list[int],
    scope: list[int],
    code: int,
    output: int,
    nibble_order: int,
) -> Any:
    asymmetric = zero_point is not None or zero_point_value is not None
    desc = _dequantize_descriptor(tuple(shape), tuple(scope), asymmetric, code, output, nibble_order)
    target = Target.of(codes)
    plan = target.plan(DequantizePlan, desc)
    out_kind = desc.output_element
    if out_kind not in _TORCH_OF:
        raise InvalidProblem(f"dequantize output {out_kind.name}: float16, bfloat16, float32 or float64")
    y = codes.new_empty(desc.shape, dtype=_TORCH_OF[out_kind])
    if scale is not None:
        pdtype = _PARAM_DTYPES[out_kind]
        scale = scale if scale.dtype == pdtype else scale.to(pdtype)
    if codes.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        codes = codes.view(torch.uint8)  # the plans read FP8 codes as their bits
    arg = target.arg
    s = _number_or_tensor(scale, scale_value)
    z = _number_or_tensor(zero_point, zero_point_value)
    target.run(plan, DequantizeArgs(arg(target.contiguous(codes)), arg(y), arg(s), arg(z)))
    return y


def _dequantize_fake(codes: Any, *rest: Any) -> Any:
    shape, output = rest[4], rest[7]
    kind = _kind_at(output)
    if kind not in _TORCH_OF:
        raise InvalidProblem(f"dequantize output {kind.name}: float16, bfloat16, float32 or float64")
    return codes.new_empty(tuple(shape), dtype=_TORCH_OF[kind])


dequantize_op = define(
    "dequantize(Tensor codes, Tensor? scale, float scale_value, Tensor? zero_point, int? zero_point_value, "
    "int[] shape, int[] scope, int code, int output, int nibble_order) -> Tensor",
    _dequantize_impl,
    _dequantize_fake,
)
_not_differentiable("dequantize")


class _RecordedDescriptors:
    """The descriptors of the QuantizedTensors that traced quantize calls return, one attribute per
    problem (:func:`_descriptor_name`); the fake implementations set them, see
    :func:`_traced_descriptor`."""


_DESCRIPTORS = _RecordedDescriptors()


def _descriptor_name(key: tuple[Any, ...]) -> str:
    """The attribute of :data:`_DESCRIPTORS` that holds problem ``key``'s descriptor."""
    shape, scope, asymmetric, code, output, nibble = key
    return f"d_{'_'.join(str(e) for e in shape)}__{'_'.join(str(e) for e in scope)}_{int(asymmetric)}_{code}_{output}_{nibble}".replace(
        "-", "m"
    )


def _store_descriptor(
    shape: tuple[int, ...], scope: tuple[int, ...], asymmetric: bool, code: int, output: int, nibble: int
) -> None:
    key = (shape, scope, asymmetric, code, output, nibble)
    if all(type(e) is int for e in shape):  # not for symbolic sizes
        name = _descriptor_name(key)
        if not hasattr(_DESCRIPTORS, name):
            setattr(_DESCRIPTORS, name, _dequantize_descriptor(*key))


def _traced_descriptor(key: tuple[Any, ...]) -> _static_quantize.DequantizeDescriptor:
    """The QuantizedTensor's descriptor in a traced call. torch.compile cannot trace a pydantic
    model's construction, so the descriptor is made outside the trace: the quantize operators'
    fake implementations (which torch.compile runs as plain Python while it traces the call)
    store it in :data:`_DESCRIPTORS`, and the trace reads it from there. One attribute per
    problem: torch.compile reads an attribute when the trace first asks for it, after the fake
    implementation stored it, whereas it would keep the first view it took of a shared dict, from
    before a later call of the same trace stored that call's descriptor."""
    found = getattr(_DESCRIPTORS, _descriptor_name(key), None)
    if found is None:  # pragma: no cover - the fake implementation ran first
        raise InvalidProblem(f"no descriptor was recorded for the traced quantize problem {key}")
    return found  # type: ignore[no-any-return]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def quantize(
    make: Callable[..., Any],
    x: Any,
    code_kind: ElementKind,
    scope: Scope | None,
    group_size: int | None,
    axis: int | None,
    asymmetric: bool,
    scale: Any,
    zero_point: Any,
    q_min: int | None,
    q_max: int | None,
    rounding: Rounding,
    seed: int | None,
    offset: int,
    nibble_order: NibbleOrder,
) -> Any:
    """:func:`quantplan.quantize` of a tensor through the operators (what it calls under
    torch.compile, with the code kind resolved and ``make`` the QuantizedTensor class): the same
    checks, arguments and results. A stochastic call without ``seed`` draws its seed when the
    operator runs (every call of a compiled function a fresh one)."""
    given = [name for name, v in (("scope", scope), ("group_size", group_size), ("axis", axis)) if v is not None]
    if len(given) > 1:
        raise InvalidProblem(f"give one of scope=, group_size=, axis= (got {', '.join(given)})")
    if group_size is not None:
        scope_list = [3, -1, group_size]
    elif axis is not None:
        scope_list = [1, axis, 0]
    else:
        scope_list = [0, 0, 0] if scope is None else scope_ints(scope)
    float_kind = _float_kind_of(x)
    code = _KIND_INDEX[code_kind]
    if rounding is not Rounding.STOCHASTIC and seed is not None:
        raise InvalidProblem("seed= applies to rounding=Rounding.STOCHASTIC only")
    stochastic = rounding is Rounding.STOCHASTIC
    nibble = _NIBBLE_INDEX[nibble_order]
    dynamic = scale is None
    if dynamic and zero_point is not None:
        raise InvalidProblem("zero_point= goes with a static scale=; without a scale both come from the data")
    mode_asymmetric = bool(asymmetric or zero_point is not None)
    if not dynamic and mode_asymmetric and zero_point is None:
        raise InvalidProblem("asymmetric=True with a static scale= needs zero_point= too")
    key = (tuple(x.shape), tuple(scope_list), mode_asymmetric, code, _KIND_INDEX[float_kind], nibble)
    seed_arg, offset_arg = signed_seed(seed), signed_seed(offset)
    if dynamic:
        codes, s, z = quantize_dynamic_op(
            x, code, scope_list, mode_asymmetric, q_min, q_max, nibble, stochastic, seed_arg, offset_arg
        )
        return make(codes, s, z if mode_asymmetric else None, _traced_descriptor(key))
    s_t, s_v = (None, float(scale)) if _is_number(scale) else (scale, 0.0)
    z_t, z_v = (None, zero_point) if zero_point is None or _is_number(zero_point) else (zero_point, None)
    codes = quantize_static_op(
        x, s_t, s_v, z_t, z_v, code, scope_list, q_min, q_max, nibble, stochastic, seed_arg, offset_arg
    )
    return make(codes, scale, zero_point, _traced_descriptor(key))


def dequantize(qt: Any, out_kind: ElementKind) -> Any:
    """:func:`quantplan.dequantize` of QuantizedTensor ``qt`` to ``out_kind`` through the
    ``dequantize`` operator (what it calls under torch.compile)."""
    desc = qt.descriptor
    scale, zero_point = qt.scale, qt.zero_point
    s_t, s_v = (None, float(scale)) if _is_number(scale) else (scale, 0.0)
    if s_t is not None:
        pdtype = _PARAM_DTYPES[out_kind]
        if s_t.dtype != pdtype:  # another precision: the scale rounded to its parameter type first
            s_t = s_t.to(pdtype)
    z_t, z_v = (None, zero_point) if zero_point is None or _is_number(zero_point) else (zero_point, None)
    return dequantize_op(
        qt.codes,
        s_t,
        s_v,
        z_t,
        z_v,
        list(desc.shape),
        scope_ints(desc.scope),
        _KIND_INDEX[desc.input_element],
        _KIND_INDEX[out_kind],
        _NIBBLE_INDEX[desc.nibble_order],
    )


# ---- the collectives' plans, writing into given buffers -------------------------------------------


def _run(target: Target, plan: Any, args: Any) -> None:
    target.run_with_workspace(plan, args)


def _dynamic_quantize_out_impl(
    x: Any, output: Any, scale_out: Any, zero_point_out: Any, code: int, scope: list[int], asymmetric: bool
) -> None:
    target = Target.of(x)
    kind = _float_kind_of(x)
    shape = tuple(x.shape)
    sc = scope_of(scope)
    plan = target.plan(
        DynamicRangeQuantizePlan,
        (shape, kind, tuple(scope), asymmetric, code),
        lambda: DynamicRangeQuantizeDescriptor(
            shape=shape, scope=sc, mode=_MODES[asymmetric], input_element=kind, output_element=_kind_at(code)
        ),
    )
    arg = target.arg
    _run(target, plan, DynamicRangeQuantizeArgs(arg(x), arg(output), arg(scale_out), arg(zero_point_out)))


def _nothing(*args: Any) -> None:
    return None


dynamic_quantize_out_op = define(
    "dynamic_quantize_out(Tensor x, Tensor(a!) output, Tensor(b!) scale_out, Tensor(c!)? zero_point_out, int code, "
    "int[] scope, bool asymmetric) -> ()",
    _dynamic_quantize_out_impl,
    _nothing,
)


def _dequantize_out_impl(
    codes: Any, scale: Any, zero_point: Any, output: Any, code: int, scope: list[int], nibble_order: int
) -> None:
    target = Target.of(codes)
    out_kind = _FLOAT_KINDS.get(output.dtype)
    if out_kind is None:
        raise InvalidProblem(f"output has dtype {output.dtype}; dequantize to float16, bfloat16, float32 or float64")
    shape = tuple(output.shape)
    asymmetric = zero_point is not None
    desc = _dequantize_descriptor(shape, tuple(scope), asymmetric, code, _KIND_INDEX[out_kind], nibble_order)
    plan = target.plan(DequantizePlan, desc)
    arg = target.arg
    _run(target, plan, DequantizeArgs(arg(codes), arg(output), arg(scale), arg(zero_point)))


dequantize_out_op = define(
    "dequantize_out(Tensor codes, Tensor scale, Tensor? zero_point, Tensor(a!) output, int code, int[] scope, "
    "int nibble_order) -> ()",
    _dequantize_out_impl,
    _nothing,
)


def _swizzled_quantize_out_impl(
    x: Any,
    output: Any,
    scale_out: Any,
    zero_point_out: Any,
    group_size: int,
    nodes: int,
    devices_per_node: int,
    code: int,
    asymmetric: bool,
) -> None:
    target = Target.of(x)
    kind = _float_kind_of(x)
    shape = tuple(x.shape)
    plan = target.plan(
        SwizzledQuantizePlan,
        (shape, kind, group_size, nodes, devices_per_node, code, asymmetric),
        lambda: SwizzledQuantizeDescriptor(
            shape=shape,
            group_size=group_size,
            nodes=nodes,
            devices_per_node=devices_per_node,
            pipeline=1,
            mode=_MODES[asymmetric],
            input_element=kind,
            output_element=_kind_at(code),
        ),
    )
    arg = target.arg
    view = (1, devices_per_node, -1)
    args = SwizzledQuantizeArgs(
        input=arg(x),
        output=arg(output.view(view)),
        scale_out=arg(scale_out.view(view)),
        zero_point_out=None if zero_point_out is None else arg(zero_point_out.view(view)),
    )
    _run(target, plan, args)


swizzled_quantize_out_op = define(
    "swizzled_quantize_out(Tensor x, Tensor(a!) output, Tensor(b!) scale_out, Tensor(c!)? zero_point_out, "
    "int group_size, int nodes, int devices_per_node, int code, bool asymmetric) -> ()",
    _swizzled_quantize_out_impl,
    _nothing,
)


def _dequant_reduce_out_impl(
    codes: Any,
    scale: Any,
    zero_point: Any,
    output: Any,
    scale_out: Any,
    zero_point_out: Any,
    peers: int,
    chunk_elements: int,
    input_group_size: int,
    output_group_size: int | None,
    input_code: int,
    output_element: int,
    average: bool,
) -> None:
    target = Target.of(codes)
    asymmetric = zero_point is not None
    key = (peers, chunk_elements, input_group_size, output_group_size, asymmetric, input_code, output_element, average)
    plan = target.plan(
        DequantReducePlan,
        key,
        lambda: DequantReduceDescriptor(
            peers=peers,
            chunk_elements=chunk_elements,
            input_group_size=input_group_size,
            output_group_size=output_group_size,
            mode=_MODES[asymmetric],
            input_element=_kind_at(input_code),
            output_element=_kind_at(output_element),
            average=average,
        ),
    )
    arg = target.arg
    args = DequantReduceArgs(
        input=arg(codes),
        scale=arg(scale),
        output=arg(output),
        scale_out=arg(scale_out),
        zero_point=arg(zero_point),
        zero_point_out=arg(zero_point_out),
    )
    _run(target, plan, args)


dequant_reduce_out_op = define(
    "dequant_reduce_out(Tensor codes, Tensor scale, Tensor? zero_point, Tensor(a!) output, Tensor(b!)? scale_out, "
    "Tensor(c!)? zero_point_out, int peers, int chunk_elements, int input_group_size, int? output_group_size, "
    "int input_code, int output_element, bool average) -> ()",
    _dequant_reduce_out_impl,
    _nothing,
)


__all__ = [
    "LIBRARY",
    "define",
    "dequant_reduce_out_op",
    "dequantize",
    "dequantize_op",
    "dequantize_out_op",
    "dynamic_quantize_out_op",
    "fresh_like",
    "kind_index",
    "quantize",
    "quantize_dynamic_op",
    "quantize_static_op",
    "scope_ints",
    "scope_of",
    "signed_seed",
    "swizzled_quantize_out_op",
    "unsigned_seed",
]
