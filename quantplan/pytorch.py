"""PyTorch autograd adapter: fake quantization for quantization-aware training (QAT).

``import quantplan.pytorch as qpt`` (it needs PyTorch; ``import quantplan`` does not import it).
Three ``torch.autograd.Function`` s run their forward and backward through the plans, and three
small ``torch.nn.Module`` s wrap them for a model:

* :class:`FakeQuantizeFunction` / :func:`fake_quantize` / :class:`FakeQuantize` -- static scale and
  zero point (``torch.fake_quantize_per_tensor_affine`` / ``_per_channel_affine``, bit for bit),
  straight-through gradient for the input;
* :class:`LearnableFakeQuantizeFunction` / :func:`fake_quantize_learnable` /
  :class:`LearnableFakeQuantize` -- LSQ: scale and zero point are trained
  (``torch._fake_quantize_learnable_per_tensor_affine`` / ``_per_channel_affine``);
* :class:`DynamicFakeQuantizeFunction` / :func:`dynamic_fake_quantize` / :class:`DynamicFakeQuantize`
  -- scale (and zero point) from each call's range, nearest or stochastic rounding (DeepSpeed MoQ),
  identity gradient.

Where it runs: CUDA tensors on the CUDA backend, on the CURRENT PyTorch stream of the tensor's
device (``torch.cuda.current_stream()``; inside ``torch.cuda.stream(s)`` that is ``s``, and in
backward the stream autograd gives the op), so the ops are ordered with the surrounding PyTorch
work and capturable by ``torch.cuda.graph``. CPU tensors run on the NumPy reference backend (same
results bit for bit), so a model trains in a notebook without a GPU.

Tensors: float16, bfloat16, float32 or float64. Inputs that are not C-contiguous (``.t()``,
slices, ``channels_last``) are copied with ``.contiguous()`` first, and outputs are
``torch.empty_like`` of that contiguous input: always C-contiguous. Tensors that require grad
reach the plans without a copy (CUDA: the tensor itself; CPU: a NumPy view of its ``.detach()``).

Under ``torch.compile`` the functions and modules call ``torch.library`` operators of the
``quantplan`` namespace instead (:mod:`quantplan._torch_library` has their conventions), which it
traces with ``fullgraph=True`` and records into CUDA graphs with ``mode="reduce-overhead"``;
eager calls skip the dispatcher (the autograd.Function, or the plan alone when no gradient is
recorded). Build scopes outside compiled code (a pydantic model is not traced).

Plans are selected once per problem -- (kind, shape, dtype, scope, mode, range, device) -- and
kept in quantplan's per-thread front-end cache of :data:`PLAN_CACHE_SIZE` entries (shared with
:mod:`quantplan.compat.deepspeed`; plans are not safe to run from two host threads at once), so a
training loop does not select every step; :func:`clear_plan_cache` empties it. Workspaces, where
a plan needs one, are allocated per call with ``torch.empty`` on the tensor's device (PyTorch's
caching allocator, stream-ordered on the current stream).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised only without PyTorch
    raise ImportError("quantplan.pytorch needs PyTorch: pip install torch") from exc

from quantplan._frontend import (
    PLAN_CACHE_SIZE,
    PhiloxCounter,
    Target,
    check_seed,
    clear_plan_cache,
    cupy_stream,
    dtype_name,
    remember_replay,
    replay,
    replay_of,
    shaped,
)
from quantplan._torch_library import LIBRARY, define, fresh_like, scope_ints, scope_of, signed_seed, unsigned_seed
from quantplan.ops import fake_quantize as _fake_op
from quantplan.ops.dynamic_fake_quantize import (
    DynamicRangeFakeQuantizeArgs,
    DynamicRangeFakeQuantizeDescriptor,
    DynamicRangeFakeQuantizePlan,
    dynamic_fake_quantize_range,
)
from quantplan.ops.fake_quantize import (
    FakeQuantizeArgs,
    FakeQuantizeBackwardArgs,
    FakeQuantizeBackwardDescriptor,
    FakeQuantizeBackwardPlan,
    lsq_geometry,
)
from quantplan.runtime._layout import normalize_axis, param_shape
from quantplan.runtime._operands import scalar_scale
from quantplan.vocabulary.errors import InvalidProblem
from quantplan.vocabulary.formats import affine_scale_dtype
from quantplan.vocabulary.types import (
    ChannelScope,
    ElementKind,
    GroupScope,
    QuantMode,
    Rounding,
    Scope,
    TensorScope,
    TokenScope,
)

_ELEMENTS: dict[Any, ElementKind] = {
    torch.float16: ElementKind.F16,
    torch.bfloat16: ElementKind.BF16,
    torch.float32: ElementKind.F32,
    torch.float64: ElementKind.F64,
}
#: The parameters' dtype for each data element: the affine formats' scale element
#: (:mod:`quantplan.vocabulary.formats`: float32, float64 for float64 data).
_PARAM_DTYPES: dict[ElementKind, Any] = {
    kind: getattr(torch, affine_scale_dtype(kind).name) for kind in _ELEMENTS.values()
}
_PARAM_NUMPY: dict[Any, np.dtype[Any]] = {torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64)}
_TENSOR = TensorScope()
#: True while torch.compile traces (the public functions then call the torch.library operators).
_compiling: Callable[[], bool] = torch.compiler.is_compiling
_grad_enabled: Callable[[], bool] = torch.is_grad_enabled
_MODES = (QuantMode.SYMMETRIC, QuantMode.ASYMMETRIC)
_SCOPES = (TensorScope, ChannelScope, TokenScope, GroupScope)


# ---- one call's input ------------------------------------------------------------------------------


def _contiguous(x: Any) -> Any:
    """``x`` itself when C-contiguous, else a contiguous copy (autograd records nothing here: the
    ops run inside their Function's forward / backward)."""
    return x if x.is_contiguous() else x.contiguous()


def _element(x: Any) -> ElementKind:
    kind = _ELEMENTS.get(x.dtype)
    if kind is None:
        raise InvalidProblem(
            f"input has dtype {x.dtype}; fake quantization takes float16, bfloat16, float32 or float64 "
            f"tensors (cast with .float())"
        )
    return kind


def _input(x: Any) -> tuple[Any, ElementKind, Target]:
    """``x`` C-contiguous, its element and its target."""
    if not isinstance(x, torch.Tensor):
        raise InvalidProblem(
            f"x is a {type(x).__name__}; quantplan.pytorch takes torch tensors (convert with torch.as_tensor(x))"
        )
    xc = _contiguous(x)
    kind = _element(xc)
    return xc, kind, Target.of(xc)


# ---- parameters --------------------------------------------------------------------------------


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _param(value: Any, name: str, pshape: tuple[int, ...], dtype: Any, x: Any) -> Any:
    """``value`` (tensor, sequence or number) as a C-contiguous tensor of ``dtype`` on
    ``x``'s device with the parameter count of ``pshape``: a number is broadcast, a tensor of that
    count is taken in its own shape (``(C,)`` for a channel scope, as PyTorch's per-channel ops
    take it; unchecked runs do not read it, :func:`_exact` gives it ``pshape`` where a plan checks
    it). Nothing that already fits is copied."""
    if _is_number(value):
        return torch.full(pshape, value, dtype=dtype, device=x.device)
    t = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    count = math.prod(pshape)
    if t.numel() != count:
        raise InvalidProblem(
            f"{name} has {t.numel()} elements (shape {tuple(t.shape)}); this scope on input shape "
            f"{tuple(x.shape)} has {count} segment(s) (parameter shape {pshape})"
        )
    if t.dtype is not dtype or t.get_device() != x.get_device():
        t = t.to(device=x.device, dtype=dtype)
    return t if t.is_contiguous() else t.contiguous()


def _exact(t: Any, pshape: tuple[int, ...]) -> Any:
    """Parameter tensor ``t`` (or a number, or None) in the scope's ``param_shape``."""
    return t if not isinstance(t, torch.Tensor) or t.shape == pshape else t.reshape(pshape)


def _zero_point_dtype(value: Any, float_dtype: Any) -> Any:
    """int32 for integer zero points, the scale's dtype for float (learnable-style) ones."""
    dtype = value.dtype if isinstance(value, torch.Tensor) else torch.as_tensor(value).dtype
    return float_dtype if dtype.is_floating_point else torch.int32


class _Static:
    """What one static problem (shape, dtype, scope, mode, range) needs on one device, cached
    together: the forward plan, the parameters' shape, and the straight-through backward plan
    (selected at the first backward)."""

    __slots__ = ("key", "plan", "pshape", "ste")

    def __init__(self, key: tuple[Any, ...], plan: Any, pshape: tuple[int, ...]) -> None:
        self.key, self.plan, self.pshape, self.ste = key, plan, pshape, None

    def ste_plan(self, target: Target, kind: ElementKind) -> Any:
        """The straight-through FakeQuantizeBackwardPlan of this problem."""
        if self.ste is None:
            shape, _, scope, mode, q_min, q_max = self.key
            self.ste = target.select(
                FakeQuantizeBackwardPlan,
                FakeQuantizeBackwardDescriptor(
                    shape=shape, scope=scope, mode=mode, element=kind, q_min=q_min, q_max=q_max, learnable=False
                ),
            )
        return self.ste


def _scope_key(scope: Any) -> Any:
    """A cheap hashable stand-in for ``scope`` in cache keys: its type and field values (hashing
    the frozen pydantic model itself costs a microsecond per call). Remembered per scope object
    in :data:`_SCOPE_KEYS` (a scope is frozen: its key never changes)."""
    entry = _SCOPE_KEYS.get(id(scope))
    if entry is not None and entry[0] is scope:
        return entry[1]
    if scope is _TENSOR:
        return TensorScope
    if not isinstance(scope, _SCOPES):
        return object()  # no cache entry: the build reports the bad scope
    key = (type(scope), *scope.__dict__.values())
    if len(_SCOPE_KEYS) >= _SCOPE_KEYS_KEPT:
        _SCOPE_KEYS.clear()
    _SCOPE_KEYS[id(scope)] = (scope, key)  # the scope is held, so its id is not reused meanwhile
    return key


#: id(scope) -> (scope, its :func:`_scope_key`): the scopes a model builds once and passes every call.
_SCOPE_KEYS: dict[int, tuple[Any, Any]] = {}
_SCOPE_KEYS_KEPT = 256


def _static(
    target: Target, xc: Any, kind: ElementKind, scope: Scope, mode: QuantMode, q_min: int, q_max: int
) -> _Static:
    def build() -> _Static:
        key = (tuple(xc.shape), xc.dtype, scope, mode, q_min, q_max)
        if not isinstance(scope, _SCOPES):
            raise InvalidProblem(
                f"scope={scope!r} must be TensorScope(), ChannelScope(axis), TokenScope() or GroupScope(axis, group_size)"
            )
        pshape = param_shape(key[0], scope)
        desc = _fake_op.FakeQuantizeDescriptor(
            shape=key[0], scope=scope, mode=mode, element=kind, q_min=q_min, q_max=q_max
        )
        return _Static(key, target.select(_fake_op.FakeQuantizePlan, desc), pshape)

    return target.cached((_Static, xc.shape, xc.dtype, _scope_key(scope), mode, q_min, q_max), build)  # type: ignore[no-any-return]


def _static_params(
    xc: Any, scale: Any, zero_point: Any, pshape: tuple[int, ...], scope: Scope, kind: ElementKind
) -> tuple[Any, Any]:
    """(scale, zero point) as tensors of ``pshape``'s count on ``xc``'s device, or Python numbers
    (TensorScope; a number scale checked here as the plans check it: finite and > 0)."""
    fdtype = _PARAM_DTYPES[kind]
    scalar_ok = type(scope) is TensorScope
    if scalar_ok and _is_number(scale):
        # 1e-30 < scale < 1e30 is finite and > 0 in float32 and float64 alike: the plans' rule
        # holds without asking; anything else gets the plans' own check (and its message).
        s = float(scale) if 1e-30 < scale < 1e30 else scalar_scale(scale, _PARAM_NUMPY[fdtype])
    else:
        s = _param(scale, "scale", pshape, fdtype, xc)
    if zero_point is None or (scalar_ok and _is_number(zero_point)):
        return s, zero_point
    return s, _param(zero_point, "zero_point", pshape, _zero_point_dtype(zero_point, fdtype), xc)


# ---- static fake quantization ------------------------------------------------------------------


def _lsq_plan(target: Target, xc: Any, kind: ElementKind, scope: Scope, mode: QuantMode, q_min: int, q_max: int) -> Any:
    shape = tuple(xc.shape)
    return target.plan(
        FakeQuantizeBackwardPlan,
        (shape, xc.dtype, scope, mode, q_min, q_max, True),
        lambda: FakeQuantizeBackwardDescriptor(
            shape=shape, scope=scope, mode=mode, element=kind, q_min=q_min, q_max=q_max, learnable=True
        ),
    )


# The plans run unchecked below: the input is contiguous and of the plan's shape and dtype (its
# cache key), outputs are fresh, parameters are tensors of the right count, dtype and device
# (their shape is not read) or numbers checked as the plans check them (a number zero point the
# plan checks even unchecked: it lies in [q_min, q_max]); autograd hands dy in y's shape, dtype
# and device.


def _run_forward(target: Target, xc: Any, plan: Any, s: Any, z: Any) -> Any:
    y = torch.empty_like(xc)
    args = FakeQuantizeArgs(target.arg(xc), target.arg(y), target.arg(s), target.arg(z))
    target.run(plan, args, check=False)
    return y


def _run_ste(target: Target, xc: Any, kind: ElementKind, dy: Any, s: Any, z: Any, static: _Static) -> Any:
    plan = static.ste_plan(target, kind)
    dyc = _contiguous(dy)
    dx = torch.empty_like(xc)
    args = FakeQuantizeBackwardArgs(target.arg(xc), target.arg(dyc), target.arg(dx), target.arg(s), target.arg(z))
    target.run(plan, args, check=False)
    return dx


def _check_range(q_min: int, q_max: int) -> tuple[int, int]:
    if type(q_min) is int and type(q_max) is int:
        return q_min, q_max
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (q_min, q_max)):
        raise InvalidProblem(f"q_min={q_min!r}, q_max={q_max!r} must be Python ints")
    return int(q_min), int(q_max)


def _grad_for(*inputs: Any) -> bool:
    """Whether a call on ``inputs`` records a gradient (grad mode on, a tensor requiring grad)."""
    return torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in inputs)


def _static_forward_parts(
    x: Any, scale: Any, zero_point: Any, scope: Scope, q_min: int, q_max: int
) -> tuple[Any, Any, Any, Any, _Static, ElementKind]:
    """Static fake quantization: ``(y, x contiguous, scale, zero point as run, problem, element)``."""
    xc, kind, target = _input(x)
    static = _static(target, xc, kind, scope, _MODES[zero_point is not None], q_min, q_max)
    s, z = _static_params(xc, scale, zero_point, static.pshape, scope, kind)
    return _run_forward(target, xc, static.plan, s, z), xc, s, z, static, kind


def _static_forward(x: Any, scale: Any, zero_point: Any, scope: Scope, q_min: int, q_max: int) -> Any:
    """``x`` fake-quantized with static parameters, no autograd."""
    return _static_forward_parts(x, scale, zero_point, scope, q_min, q_max)[0]


class FakeQuantizeFunction(torch.autograd.Function):
    """Static fake quantization as an autograd op (``FakeQuantizeFunction.apply(x, scale, zero_point,
    scope, q_min, q_max)``; prefer :func:`fake_quantize`).

    Forward :class:`~quantplan.FakeQuantizePlan`; backward :class:`~quantplan.FakeQuantizeBackwardPlan`
    (straight-through, ``dx = dy * (q_min <= rne(x * inv) + zp <= q_max)``). ``scale`` and
    ``zero_point`` get no gradient (use :class:`LearnableFakeQuantizeFunction` to train them).
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: Any, scale: Any, zero_point: Any, scope: Scope, q_min: int, q_max: int
    ) -> Any:
        y, xc, s, z, static, kind = _static_forward_parts(x, scale, zero_point, scope, q_min, q_max)
        s_t = s if isinstance(s, torch.Tensor) else None
        z_t = z if isinstance(z, torch.Tensor) else None
        ctx.save_for_backward(xc, s_t, z_t)
        ctx.spec = (static, kind, None if s_t is not None else s, z if z_t is None else None)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, dy: Any) -> tuple[Any, None, None, None, None, None]:  # type: ignore[override]
        xc, s_t, z_t = ctx.saved_tensors
        static, kind, s_number, z_number = ctx.spec
        s = s_number if s_t is None else s_t
        z = z_number if z_t is None else z_t
        dx = _run_ste(Target.of(xc), xc, kind, dy, s, z, static)
        return dx, None, None, None, None, None


def fake_quantize(
    x: Any,
    scale: Any,
    zero_point: Any = None,
    q_min: int = -128,
    q_max: int = 127,
    scope: Scope = _TENSOR,
) -> Any:
    """Fake-quantize ``x`` with static parameters: ``y = (clamp(rne(x * inv) + zp, q_min, q_max) - zp) * scale``.

    ``inv = rn(1 / scale)`` in float32 (float64 for float64 data), ``y`` rounded to ``x``'s dtype.
    ``scale``: a Python float (TensorScope) or a tensor with one value per segment of ``scope`` --
    either in the scope's ``param_shape`` or flat (``(C,)`` for ``ChannelScope(axis)``, as
    ``torch.fake_quantize_per_channel_affine`` takes it); cast to float32 (float64 for float64 data)
    and moved to ``x``'s device. ``zero_point``: None (symmetric, zero point 0), a Python int, or an
    integer tensor (cast to int32); a float zero point is rounded half to even and clamped to
    ``[q_min, q_max]``. Gradient: straight-through for ``x`` (zero where the code was clamped),
    none for the parameters.

    Bit-identical to ``torch.fake_quantize_per_tensor_affine(x, scale, zp, q_min, q_max)`` and
    ``torch.fake_quantize_per_channel_affine(x, scale, zp, axis, q_min, q_max)`` (``scope=
    ChannelScope(axis)``) on float16 / bfloat16 / float32, forward and gradient; also takes
    TokenScope and GroupScope(axis, group_size).
    """
    if type(q_min) is not int or type(q_max) is not int:
        q_min, q_max = _check_range(q_min, q_max)
    # _fake_quantize's body, inline (one frame less on the eager hot path)
    if _compiling():
        return _fake_quantize_call(x, scale, zero_point, scope_ints(scope), q_min, q_max)
    if getattr(x, "requires_grad", False) and _grad_enabled():
        return FakeQuantizeFunction.apply(x, scale, zero_point, scope, q_min, q_max)
    return _static_eager(x, scale, zero_point, scope, q_min, q_max)  # no autograd node to make


def _fake_quantize(x: Any, scale: Any, zero_point: Any, scope: Scope, q_min: int, q_max: int) -> Any:
    """Eager: :class:`FakeQuantizeFunction` where a gradient is recorded, else the plan alone (no
    dispatcher on the hot path: a call like an earlier one is replayed, see :func:`_static_eager`);
    under torch.compile the ``quantplan::fake_quantize`` operator."""
    if _compiling():
        return _fake_quantize_call(x, scale, zero_point, scope_ints(scope), q_min, q_max)
    if getattr(x, "requires_grad", False) and _grad_enabled():
        return FakeQuantizeFunction.apply(x, scale, zero_point, scope, q_min, q_max)
    return _static_eager(x, scale, zero_point, scope, q_min, q_max)  # no autograd node to make


def _static_eager(x: Any, scale: Any, zero_point: Any, scope: Scope, q_min: int, q_max: int) -> Any:
    """:func:`_static_forward` (no autograd). A call like an earlier one (CUDA) is replayed:
    allocate the output and launch. Python scalars are keyed by type and value (the launch holds
    them), the scale tensor by dtype and shape; a tensor zero point takes the full path."""
    key: tuple[Any, ...] | None = None
    if zero_point is None or type(zero_point) is int:
        plain = type(scale) is float or type(scale) is int
        entry = _SCOPE_KEYS.get(id(scope))
        scope_key = entry[1] if entry is not None and entry[0] is scope else _scope_key(scope)
        try:
            key = (
                _static_eager,
                type(x),
                x.dtype,
                x.shape,
                type(scale),
                scale if plain else scale.dtype,
                None if plain else scale.shape,
                zero_point,
                scope_key,
                q_min,
                q_max,
            )
            fast = replay_of(key) if type(scope_key) is not object else None
        except (AttributeError, TypeError):  # not a tensor; an unhashable argument
            key = fast = None
        if fast is not None:
            y = fast(x) if plain else fast(x, scale)
            if y is not None:
                return y
    return _static_forward_replayed(x, scale, zero_point, scope, q_min, q_max, key)


def _static_forward_replayed(
    x: Any, scale: Any, zero_point: Any, scope: Scope, q_min: int, q_max: int, key: tuple[Any, ...] | None
) -> Any:
    """:func:`_static_forward`, and (``key`` given) the call remembered under ``key`` as a replay
    (:func:`quantplan._frontend.replay`: ``x`` and a scale tensor checked contiguous on the plan's
    device, the output allocated, the plan's traced launch) where the plan ran on the caller's own
    tensors: ``x`` itself (C-contiguous), the scale tensor itself (already of the parameters'
    dtype, on ``x``'s device, contiguous) or a Python number, the zero point None or a number. A
    call that needed a copy or a cast (which the replay would not make) is not remembered."""
    y, xc, s, z, static, _ = _static_forward_parts(x, scale, zero_point, scope, q_min, q_max)
    tensor_scale = isinstance(s, torch.Tensor)
    if (
        key is not None
        and xc is x
        and (s is scale if tensor_scale else type(scale) is float or type(scale) is int)
        and not isinstance(z, torch.Tensor)
        and y.numel()
    ):
        target = Target.of(xc)
        args = FakeQuantizeArgs(target.arg(xc), target.arg(y), target.arg(s), target.arg(z))
        order = ["x0", "o0", "x1"] if tensor_scale else ["x0", "o0"]
        outputs = [(tuple(xc.shape), dtype_name(xc))]
        remember_replay(key, target, lambda: replay(target, static.plan, args, len(order) - 1, outputs, _last, order))
    return y


def _last(*arrays: Any) -> Any:
    """A replayed call's result: its last array (the output)."""
    return arrays[-1]


def _fake_quantize_call(x: Any, scale: Any, zero_point: Any, scope: list[int], q_min: int, q_max: int) -> Any:
    """The ``quantplan::fake_quantize`` operator on these arguments (a number parameter as the
    operator's ``Scalar``, a sequence as a tensor)."""
    if isinstance(scale, torch.Tensor):
        s_t, s_v = scale, 0.0
    elif _is_number(scale):
        s_t, s_v = None, float(scale)
    else:
        s_t, s_v = torch.as_tensor(scale), 0.0
    if zero_point is None or isinstance(zero_point, torch.Tensor):
        z_t, z_v = zero_point, None
    elif _is_number(zero_point):
        z_t, z_v = None, zero_point
    else:
        z_t, z_v = torch.as_tensor(zero_point), None
    return fake_quantize_op(x, s_t, s_v, z_t, z_v, scope, q_min, q_max)


def traced_functional_fake_quantize(
    x: Any, scale: Any, zero_point: Any, scope: Scope | None, axis: int | None, q_min: int, q_max: int
) -> Any:
    """:func:`quantplan.fake_quantize` of a tensor while torch.compile traces: the
    ``quantplan::fake_quantize`` operator (same bits; where ``x`` requires grad, the
    straight-through gradient flows, where eager returns a tensor without one)."""
    if scope is not None and axis is not None:
        raise InvalidProblem("give one of scope=, axis= (got scope, axis)")
    scope_list = [1, axis, 0] if axis is not None else [0, 0, 0] if scope is None else scope_ints(scope)
    return _fake_quantize_call(x, scale, zero_point, scope_list, q_min, q_max)


# ---- learnable (LSQ) fake quantization --------------------------------------------------------


def _lsq_layout(shape: tuple[int, ...], scope: Scope, kind: ElementKind) -> tuple[tuple[int, int] | None, Scope]:
    """``(move, scope)``: the ``movedim(src, dst)`` that makes ``scope``'s segments contiguous runs
    (the learnable backward needs that), or None when they already are."""
    if not math.prod(shape) or lsq_geometry(shape, scope, kind) is not None:
        return None, scope
    if isinstance(scope, ChannelScope):  # channel axis first: ChannelScope(0)
        return (normalize_axis(scope.axis, len(shape), "channel scope"), 0), ChannelScope(axis=0)
    assert isinstance(scope, GroupScope)  # group axis last: GroupScope(-1)
    axis = normalize_axis(scope.axis, len(shape), "group scope")
    return (axis, len(shape) - 1), GroupScope(axis=-1, group_size=scope.group_size)


def _run_lsq(
    xc: Any, dy: Any, s_t: Any, z_t: Any, scope: Scope, q_min: int, q_max: int, grad_factor: float
) -> tuple[Any, Any, Any]:
    """``(dx, dscale, dzero_point)`` in ``xc``'s layout and the parameters' ``param_shape``."""
    target = Target.of(xc)
    kind = _element(xc)
    mode = _MODES[z_t is not None]
    move, run_scope = _lsq_layout(tuple(xc.shape), scope, kind)
    dyc = _contiguous(dy)
    if move is not None:
        src, dst = move
        xc, dyc = (_contiguous(t.movedim(src, dst)) for t in (xc, dyc))
        s_t = _contiguous(s_t.movedim(src, dst))
        z_t = None if z_t is None else _contiguous(z_t.movedim(src, dst))
    plan = _lsq_plan(target, xc, kind, run_scope, mode, q_min, q_max)
    dx = torch.empty_like(xc)
    ds = torch.empty_like(s_t)
    dz = None if z_t is None else torch.empty_like(z_t)
    arg = target.arg
    args = FakeQuantizeBackwardArgs(
        arg(xc), arg(dyc), arg(dx), arg(s_t), arg(z_t), arg(ds), arg(dz), grad_factor=grad_factor
    )
    target.run_with_workspace(plan, args)  # checked: the plan validates grad_factor
    if move is not None:
        src, dst = move
        dx = _contiguous(dx.movedim(dst, src))
        ds = _contiguous(ds.movedim(dst, src))
        dz = None if dz is None else _contiguous(dz.movedim(dst, src))
    return dx, ds, dz


def _learnable_forward(
    x: Any, scale: Any, zero_point: Any, scope: Scope, q_min: int, q_max: int
) -> tuple[Any, Any, Any, Any, _Static, ElementKind]:
    """LSQ forward (float parameters): ``(y, x contiguous, scale, zero point, problem, element)``."""
    xc, kind, target = _input(x)
    static = _static(target, xc, kind, scope, _MODES[zero_point is not None], q_min, q_max)
    fdtype = _PARAM_DTYPES[kind]
    s_t = _param(scale, "scale", static.pshape, fdtype, xc)
    z_t = None if zero_point is None else _param(zero_point, "zero_point", static.pshape, fdtype, xc)
    return _run_forward(target, xc, static.plan, s_t, z_t), xc, s_t, z_t, static, kind


class LearnableFakeQuantizeFunction(torch.autograd.Function):
    """Learnable (LSQ) fake quantization as an autograd op (``apply(x, scale, zero_point, scope,
    q_min, q_max, grad_factor)``; prefer :func:`fake_quantize_learnable`).

    Forward :class:`~quantplan.FakeQuantizePlan` with a float zero point (rounded half to even,
    clamped); backward :class:`~quantplan.FakeQuantizeBackwardPlan` with ``learnable=True``:
    ``dx`` straight-through, ``dscale`` / ``dzero_point`` by PyTorch's LSQ formulas times
    ``grad_factor``, summed per segment. When only ``x`` needs a gradient the cheaper
    straight-through plan runs instead (same ``dx``).
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: Any,
        scale: Any,
        zero_point: Any,
        scope: Scope,
        q_min: int,
        q_max: int,
        grad_factor: float,
    ) -> Any:
        y, xc, s_t, z_t, static, kind = _learnable_forward(x, scale, zero_point, scope, q_min, q_max)
        ctx.save_for_backward(xc, s_t, z_t)
        ctx.spec = (static, scope, q_min, q_max, float(grad_factor), kind)
        ctx.param_meta = tuple(
            None if not isinstance(p, torch.Tensor) else (tuple(p.shape), p.dtype) for p in (scale, zero_point)
        )
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, dy: Any) -> tuple[Any, Any, Any, None, None, None, None]:  # type: ignore[override]
        xc, s_t, z_t = ctx.saved_tensors
        static, scope, q_min, q_max, grad_factor, kind = ctx.spec
        if not (ctx.needs_input_grad[1] or ctx.needs_input_grad[2]):
            dx = _run_ste(Target.of(xc), xc, kind, dy, s_t, z_t, static)
            return dx, None, None, None, None, None, None
        pshape = static.pshape
        dx, ds, dz = _run_lsq(xc, dy, _exact(s_t, pshape), _exact(z_t, pshape), scope, q_min, q_max, grad_factor)

        def as_param(grad: Any, meta: Any) -> Any:
            if grad is None or meta is None:
                return None
            shape, dtype = meta
            grad = shaped(grad, shape)
            return grad if grad.dtype is dtype else grad.to(dtype)

        return dx, as_param(ds, ctx.param_meta[0]), as_param(dz, ctx.param_meta[1]), None, None, None, None


def fake_quantize_learnable(
    x: Any,
    scale: Any,
    zero_point: Any = None,
    q_min: int = -128,
    q_max: int = 127,
    scope: Scope = _TENSOR,
    grad_factor: float = 1.0,
) -> Any:
    """LSQ fake quantization: the forward of :func:`fake_quantize`, with gradients for ``scale``
    and ``zero_point``.

    ``scale``: float tensor (float32 as PyTorch's learnable ops take it) with one value per
    segment (``(1,)`` per tensor, ``(C,)`` per channel, or the scope's ``param_shape``);
    ``zero_point``: None (symmetric) or a float tensor of the same count -- rounded half to even
    and clamped to ``[q_min, q_max]`` in forward and backward alike. ``grad_factor`` multiplies
    ``dscale`` / ``dzero_point`` (LSQ uses ``1 / sqrt(x.numel() * q_max)``). Gradients come back in
    the parameters' own shapes and dtypes.

    Gradients (``q = rne(x * inv) + zp``, ``gf`` = ``grad_factor``): ``dx = dy`` inside
    ``[q_min, q_max]``, else 0; inside ``dscale_i = ((dy * (y - x)) * inv) * gf``, ``dzp_i = 0``;
    below / above ``dscale_i = (dy * (q_min - zp)) * gf`` / ``(dy * (q_max - zp)) * gf``,
    ``dzp_i = (-dy * scale) * gf``; summed per segment in float64 in a fixed order (deterministic).

    Matches ``torch._fake_quantize_learnable_per_tensor_affine`` (and ``_per_channel_affine`` with
    ``scope=ChannelScope(axis)``): forward and ``dx`` bit for bit on float32, ``dscale`` / ``dzp``
    to float32 rounding (PyTorch sums float32 terms in float32). Every scope: segments that are not
    contiguous runs (e.g. ``ChannelScope(1)`` of an activation) are moved to the front / back for
    the backward (one copy of ``x`` and ``dy``).
    """
    q_min, q_max = _check_range(q_min, q_max)
    return _fake_quantize_learnable(x, scale, zero_point, scope, q_min, q_max, float(grad_factor))


def _fake_quantize_learnable(
    x: Any, scale: Any, zero_point: Any, scope: Scope, q_min: int, q_max: int, grad_factor: float
) -> Any:
    """Eager: :class:`LearnableFakeQuantizeFunction` where a gradient is recorded, else the plan
    alone; under torch.compile the
    ``quantplan::fake_quantize_learnable`` operator (parameters as tensors)."""
    if not _compiling():
        if _grad_for(x, scale, zero_point):
            return LearnableFakeQuantizeFunction.apply(x, scale, zero_point, scope, q_min, q_max, grad_factor)
        return _learnable_forward(x, scale, zero_point, scope, q_min, q_max)[0]
    if not isinstance(scale, torch.Tensor):
        scale = torch.as_tensor(scale, dtype=torch.float32)
    if zero_point is not None and not isinstance(zero_point, torch.Tensor):
        zero_point = torch.as_tensor(zero_point, dtype=torch.float32)
    return fake_quantize_learnable_op(x, scale, zero_point, scope_ints(scope), q_min, q_max, grad_factor)


# ---- dynamic-range fake quantization -----------------------------------------------------------


def _dynamic_plan(
    target: Target, xc: Any, kind: ElementKind, scope: Scope, mode: QuantMode, bits: int, rounding: Rounding
) -> Any:
    shape = tuple(xc.shape)
    return target.plan(
        DynamicRangeFakeQuantizePlan,
        (shape, xc.dtype, scope, mode, bits, rounding),
        lambda: DynamicRangeFakeQuantizeDescriptor(
            shape=shape, scope=scope, mode=mode, element=kind, bits=bits, rounding=rounding
        ),
    )


def _bits(bits: Any, mode: Any) -> int:
    """``bits`` as an int and ``mode`` a QuantMode (InvalidProblem otherwise; the range rules are the plan's)."""
    if not isinstance(mode, QuantMode):
        raise InvalidProblem(f"mode={mode!r} must be QuantMode.SYMMETRIC or QuantMode.ASYMMETRIC")
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)):
        raise InvalidProblem(f"bits={bits!r} must be an integer (1 to 8)")
    return int(bits)


def _rng_arg(value: Any, target: Target) -> Any:
    """A seed / offset as the plan takes it: a Python int as is, a tensor moved to the data's
    device (one-element int64: the plan checks it)."""
    if value is None or not isinstance(value, torch.Tensor):
        return value
    return target.arg(_contiguous(value.to(device=target.device)))


def _run_dynamic(
    x: Any, bits: int, mode: QuantMode, scope: Scope, rounding: Rounding, rng_seed: Any, rng_offset: Any
) -> Any:
    """``x`` fake-quantized by DynamicRangeFakeQuantizePlan (a fresh C-contiguous tensor)."""
    xc, kind, target = _input(x)
    plan = _dynamic_plan(target, xc, kind, scope, mode, bits, rounding)
    y = torch.empty_like(xc)
    # Unchecked where this call established what the plan would check: nearest rounding
    # without seeds, or stochastic rounding with Python-int seeds (checked here, the plan's
    # rule: [0, 2**64)). Seed tensors, and seeds given to nearest rounding, the plan checks.
    if rounding is Rounding.STOCHASTIC:
        unchecked = type(rng_seed) is int and type(rng_offset) is int
        if unchecked:
            check_seed(rng_seed, "rng_seed")
            check_seed(rng_offset, "rng_offset")
    else:
        unchecked = rng_seed is None and rng_offset is None
    args = DynamicRangeFakeQuantizeArgs(
        input=target.arg(xc),
        output=target.arg(y),
        rng_seed=_rng_arg(rng_seed, target),
        rng_offset=_rng_arg(rng_offset, target),
    )
    target.run_with_workspace(plan, args, check=not unchecked)
    return y


class DynamicFakeQuantizeFunction(torch.autograd.Function):
    """Dynamic-range fake quantization as an autograd op (``apply(x, bits, mode, scope, rounding,
    rng_seed, rng_offset)``; prefer :func:`dynamic_fake_quantize`).

    Forward ``DynamicRangeFakeQuantizePlan`` (range per segment -> scale / zero point -> fake
    quantize, in one plan); backward the identity (straight-through: the range is the data's own,
    so nothing is clamped).
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: Any,
        bits: int,
        mode: QuantMode,
        scope: Scope,
        rounding: Rounding,
        rng_seed: Any,
        rng_offset: Any,
    ) -> Any:
        return _run_dynamic(x, bits, mode, scope, rounding, rng_seed, rng_offset)

    @staticmethod
    def backward(ctx: Any, dy: Any) -> tuple[Any, None, None, None, None, None, None]:  # type: ignore[override]
        return dy, None, None, None, None, None, None


def dynamic_fake_quantize(
    x: Any,
    bits: int = 8,
    mode: QuantMode = QuantMode.SYMMETRIC,
    scope: Scope = _TENSOR,
    rounding: Rounding = Rounding.NEAREST_EVEN,
    rng_seed: int | Any = None,
    rng_offset: int | Any = None,
) -> Any:
    """Fake-quantize ``x`` to ``bits`` bits with the scale (and zero point) of each segment's own
    range, as DeepSpeed's MoQ ``fake_quantizer``; gradient: identity.

    Codes of ``bits`` bits: SYMMETRIC ``[-2**(bits-1), 2**(bits-1) - 1]`` (bits 2 to 8),
    ``scale = max|x| / q_max``; ASYMMETRIC ``[0, 2**bits - 1]`` (bits 1 to 8),
    ``scale = (hi - lo) / (q_max - q_min)`` with ``lo = min(min x, 0)``, ``hi = max(max x, 0)``,
    ``zp = clamp(q_min - rne(lo / scale), q_min, q_max)``; then ``y`` as :func:`fake_quantize`
    (``inv = rn(1 / scale)``). An all-zero segment gets ``scale = 1``; a segment holding NaN or
    +-Inf comes out all NaN. ``scope``: TensorScope, ``GroupScope(axis=-1, group_size=g)`` (MoQ's
    groups), TokenScope, ChannelScope or any GroupScope. ``rounding``: NEAREST_EVEN, or STOCHASTIC
    (``floor(v) + (u < v - floor(v))``, ``u`` Philox4x32-10 of the element index) with ``rng_seed``
    / ``rng_offset``: Python ints in [0, 2**64), or one-element int64 tensors on ``x``'s device (read
    by the kernel, so a captured CUDA graph replays with whatever the caller stores there). The same
    (seed, offset) give the same bits on every device and on the CPU.
    """
    if rounding is Rounding.STOCHASTIC and (rng_seed is None or rng_offset is None):
        raise InvalidProblem(
            "rounding=Rounding.STOCHASTIC needs rng_seed and rng_offset (ints); DynamicFakeQuantize keeps them for you"
        )
    return _dynamic_fake_quantize(x, _bits(bits, mode), mode, scope, rounding, rng_seed, rng_offset)


def _dynamic_fake_quantize(
    x: Any, bits: int, mode: QuantMode, scope: Scope, rounding: Rounding, rng_seed: Any, rng_offset: Any
) -> Any:
    """Eager: :class:`DynamicFakeQuantizeFunction` where a gradient is recorded, else the plan
    alone; under torch.compile the
    ``quantplan::dynamic_fake_quantize`` operator (a seed / offset tensor or int each)."""
    if not _compiling():
        if _grad_for(x):
            return DynamicFakeQuantizeFunction.apply(x, bits, mode, scope, rounding, rng_seed, rng_offset)
        return _run_dynamic(x, bits, mode, scope, rounding, rng_seed, rng_offset)
    seed_t = rng_seed if isinstance(rng_seed, torch.Tensor) else None
    offset_t = rng_offset if isinstance(rng_offset, torch.Tensor) else None
    seed_v = None if seed_t is not None else signed_seed(rng_seed)
    offset_v = None if offset_t is not None else signed_seed(rng_offset)
    return dynamic_fake_quantize_op(
        x,
        bits,
        mode is QuantMode.ASYMMETRIC,
        scope_ints(scope),
        rounding is Rounding.STOCHASTIC,
        seed_t,
        offset_t,
        seed_v,
        offset_v,
    )


# ---- torch.library operators ---------------------------------------------------------------------
#
# Under torch.compile the functions and modules above call operators of the ``quantplan``
# namespace (``quantplan._torch_library`` has the conventions): ``fake_quantize`` with its
# straight-through backward ``fake_quantize_ste_backward``, ``fake_quantize_learnable`` with
# ``fake_quantize_learnable_backward``, and ``dynamic_fake_quantize`` (identity gradient). Their
# CPU and CUDA kernels are the autograd.Functions' forward and backward bodies; eager calls of the
# public functions take the autograd.Functions directly (no dispatcher on the hot path).


_PLAIN = (torch.Tensor, torch.nn.Parameter)
_dispatch_modes: Callable[[], int] = torch._C._len_torch_dispatch_stack


def _register_autograd(
    name: str,
    op: Any,
    impl: Callable[..., Any],
    setup: Callable[[Any, tuple[Any, ...], Any], None],
    backward: Callable[..., tuple[Any, ...]],
    eager: Callable[..., Any],
) -> None:
    """The Autograd kernel of operator ``name``: on plain tensors with no dispatch mode active
    (an eager call) ``eager``, the adapter's autograd.Function (one Python autograd node, no
    second trip through the dispatcher), or without a gradient to record ``impl`` (the CPU /
    CUDA kernel) itself; otherwise (torch.compile tracing with fake / functional
    tensors, a dispatch mode watching) an autograd.Function whose forward re-dispatches ``op``
    below autograd and saves what ``setup`` picks, and whose backward is ``backward``, made of
    operators -- what ``torch.library.register_autograd`` builds, which costs every eager call
    about twice the dispatcher overhead (``benchmarks/host_torch_ops.py``)."""

    class Traced(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *args: Any) -> Any:
            with torch._C._AutoDispatchBelowAutograd():
                out = op(*args)
            setup(ctx, args, out)
            return out

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            return backward(ctx, *grads)

    Traced.__name__ = Traced.__qualname__ = f"{name}_autograd"

    def kernel(*args: Any) -> Any:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if _dispatch_modes() or not all(type(t) in _PLAIN for t in tensors):
            return Traced.apply(*args)
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return eager(*args)
        return impl(*args)  # no gradient to record: the CPU / CUDA kernel itself

    LIBRARY.impl(name, kernel, "Autograd")


# -- static fake quantization (straight-through gradient) --


def _fq_operator(run: Callable[..., Any]) -> Callable[..., Any]:
    """An implementation of the static fake-quantize operators (arguments ``_FQ_ARGS``): each
    parameter the tensor, else the number, then ``run(x, scale, zero_point, scope, q_min, q_max)``
    (as :class:`FakeQuantizeFunction` takes them). One closure per use, so a call adds no frame."""

    def operator(
        x: Any,
        scale: Any,
        scale_value: float,
        zero_point: Any,
        zero_point_value: Any,
        scope: list[int],
        q_min: int,
        q_max: int,
    ) -> Any:
        s = scale_value if scale is None else scale
        z = zero_point_value if zero_point is None else zero_point
        return run(x, s, z, scope_of(scope), q_min, q_max)

    return operator


def _static_operands(
    x: Any, scale: Any, zero_point: Any, scope: Scope, q_min: int, q_max: int
) -> tuple[Any, Any, ElementKind, Any, Any, Any]:
    """The straight-through backward's setup: (target, x's view, its element, the static plans,
    scale, zero point)."""
    xc, kind, target = _input(x)
    static = _static(target, xc, kind, scope, _MODES[zero_point is not None], q_min, q_max)
    s, z = _static_params(xc, scale, zero_point, static.pshape, scope, kind)
    return target, xc, kind, static, s, z


_fq_impl = _fq_operator(_static_eager)  # a call like an earlier one: replayed
_ste_operands = _fq_operator(_static_operands)


def _fq_fake(x: Any, *rest: Any) -> Any:
    _element(x)
    return fresh_like(x)


def _ste_impl(dy: Any, *args: Any) -> Any:
    target, xc, kind, static, s, z = _ste_operands(*args)
    return _run_ste(target, xc, kind, dy, s, z, static)


def _ste_fake(dy: Any, x: Any, *rest: Any) -> Any:
    return fresh_like(x)


_FQ_ARGS = (
    "Tensor? scale, float scale_value, Tensor? zero_point, Scalar? zero_point_value, int[] scope, int q_min, int q_max"
)
fake_quantize_op = define(f"fake_quantize(Tensor x, {_FQ_ARGS}) -> Tensor", _fq_impl, _fq_fake)
fake_quantize_ste_backward_op = define(
    f"fake_quantize_ste_backward(Tensor grad_output, Tensor x, {_FQ_ARGS}) -> Tensor", _ste_impl, _ste_fake
)


def _fq_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.save_for_backward(inputs[0], inputs[1], inputs[3])
    ctx.rest = (inputs[2], inputs[4], inputs[5], inputs[6], inputs[7])


def _fq_backward(ctx: Any, dy: Any) -> tuple[Any, ...]:
    x, scale, zero_point = ctx.saved_tensors
    scale_value, zero_point_value, scope, q_min, q_max = ctx.rest
    dx = fake_quantize_ste_backward_op(dy, x, scale, scale_value, zero_point, zero_point_value, scope, q_min, q_max)
    return dx, None, None, None, None, None, None, None


_fq_eager = _fq_operator(FakeQuantizeFunction.apply)

_register_autograd("fake_quantize", fake_quantize_op, _fq_impl, _fq_setup, _fq_backward, _fq_eager)


# -- learnable (LSQ) fake quantization --


def _lsq_forward_impl(
    x: Any, scale: Any, zero_point: Any, scope: list[int], q_min: int, q_max: int, grad_factor: float
) -> Any:
    return _learnable_forward(x, scale, zero_point, scope_of(scope), q_min, q_max)[0]


def _lsq_backward_impl(
    dy: Any, x: Any, scale: Any, zero_point: Any, scope: list[int], q_min: int, q_max: int, grad_factor: float
) -> tuple[Any, Any, Any]:
    sc = scope_of(scope)
    xc, kind, target = _input(x)
    static = _static(target, xc, kind, sc, _MODES[zero_point is not None], q_min, q_max)
    fdtype = _PARAM_DTYPES[kind]
    pshape = static.pshape
    s_t = _exact(_param(scale, "scale", pshape, fdtype, xc), pshape)
    z_t = None if zero_point is None else _exact(_param(zero_point, "zero_point", pshape, fdtype, xc), pshape)
    dx, ds, dz = _run_lsq(xc, dy, s_t, z_t, sc, q_min, q_max, grad_factor)

    def as_param(grad: Any, like: Any) -> Any:
        grad = shaped(grad, tuple(like.shape))
        return grad if grad.dtype is like.dtype else grad.to(like.dtype)

    ds = as_param(ds, scale)
    dz = scale.new_empty((0,)) if zero_point is None else as_param(dz, zero_point)
    return dx, ds, dz


def _lsq_backward_fake(dy: Any, x: Any, scale: Any, zero_point: Any, *rest: Any) -> tuple[Any, Any, Any]:
    dz = scale.new_empty((0,)) if zero_point is None else fresh_like(zero_point)
    return fresh_like(x), fresh_like(scale), dz


_LSQ_ARGS = "Tensor scale, Tensor? zero_point, int[] scope, int q_min, int q_max, float grad_factor"
fake_quantize_learnable_op = define(
    f"fake_quantize_learnable(Tensor x, {_LSQ_ARGS}) -> Tensor", _lsq_forward_impl, _fq_fake
)
fake_quantize_learnable_backward_op = define(
    f"fake_quantize_learnable_backward(Tensor grad_output, Tensor x, {_LSQ_ARGS}) -> (Tensor, Tensor, Tensor)",
    _lsq_backward_impl,
    _lsq_backward_fake,
)


def _lsq_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.save_for_backward(inputs[0], inputs[1], inputs[2])
    ctx.rest = tuple(inputs[3:])


def _lsq_backward(ctx: Any, dy: Any) -> tuple[Any, ...]:
    x, scale, zero_point = ctx.saved_tensors
    scope, q_min, q_max, grad_factor = ctx.rest
    if not (ctx.needs_input_grad[1] or ctx.needs_input_grad[2]):
        dx = fake_quantize_ste_backward_op(dy, x, scale, 0.0, zero_point, None, scope, q_min, q_max)
        return dx, None, None, None, None, None, None
    dx, ds, dz = fake_quantize_learnable_backward_op(dy, x, scale, zero_point, scope, q_min, q_max, grad_factor)
    return dx, ds, None if zero_point is None else dz, None, None, None, None


def _lsq_eager(
    x: Any, scale: Any, zero_point: Any, scope: list[int], q_min: int, q_max: int, grad_factor: float
) -> Any:
    return LearnableFakeQuantizeFunction.apply(x, scale, zero_point, scope_of(scope), q_min, q_max, grad_factor)


_register_autograd(
    "fake_quantize_learnable", fake_quantize_learnable_op, _lsq_forward_impl, _lsq_setup, _lsq_backward, _lsq_eager
)


# -- dynamic-range fake quantization (identity gradient) --


def _dynamic_operator(run: Callable[..., Any]) -> Callable[..., Any]:
    """An implementation of the ``dynamic_fake_quantize`` operator: its arguments as
    ``run(x, bits, mode, scope, rounding, seed, offset)`` takes them (as
    :class:`DynamicFakeQuantizeFunction`), seed and offset the tensor, else the number read as
    unsigned. One closure per use, so a call adds no frame."""

    def operator(
        x: Any,
        bits: int,
        asymmetric: bool,
        scope: list[int],
        stochastic: bool,
        rng_seed: Any,
        rng_offset: Any,
        rng_seed_value: int | None,
        rng_offset_value: int | None,
    ) -> Any:
        rounding = Rounding.STOCHASTIC if stochastic else Rounding.NEAREST_EVEN
        seed = unsigned_seed(rng_seed_value) if rng_seed is None else rng_seed
        offset = unsigned_seed(rng_offset_value) if rng_offset is None else rng_offset
        return run(x, bits, _MODES[asymmetric], scope_of(scope), rounding, seed, offset)

    return operator


_dynamic_impl = _dynamic_operator(_run_dynamic)


def _dynamic_fake(x: Any, *rest: Any) -> Any:
    _element(x)
    return fresh_like(x)


dynamic_fake_quantize_op = define(
    "dynamic_fake_quantize(Tensor x, int bits, bool asymmetric, int[] scope, bool stochastic, Tensor? rng_seed, "
    "Tensor? rng_offset, int? rng_seed_value, int? rng_offset_value) -> Tensor",
    _dynamic_impl,
    _dynamic_fake,
)


def _dynamic_backward(ctx: Any, dy: Any) -> tuple[Any, ...]:
    return (dy, *(None,) * 8)


def _dynamic_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    pass


_dynamic_eager = _dynamic_operator(DynamicFakeQuantizeFunction.apply)


_register_autograd(
    "dynamic_fake_quantize", dynamic_fake_quantize_op, _dynamic_impl, _dynamic_setup, _dynamic_backward, _dynamic_eager
)


# ---- modules -----------------------------------------------------------------------------------


def _scope_text(scope: Scope) -> str:
    if isinstance(scope, TensorScope):
        return "tensor"
    if isinstance(scope, ChannelScope):
        return f"channel(axis={scope.axis})"
    if isinstance(scope, GroupScope):
        return f"group(axis={scope.axis}, group_size={scope.group_size})"
    return "token"


class FakeQuantize(torch.nn.Module):
    """Static fake quantization: ``y = (clamp(rne(x * inv) + zp, q_min, q_max) - zp) * scale``,
    ``inv = rn(1 / scale)``, straight-through gradient for ``x``.

    ``scale`` / ``zero_point`` are buffers (moved by ``.to()``, saved in the ``state_dict``):
    ``scale`` float32 with one value per segment of ``scope`` (a Python float for TensorScope, or
    a tensor / sequence: ``(C,)`` for ``ChannelScope(axis)``); ``zero_point`` int32 of the same
    count, or None for symmetric quantization. Set new values in place (``fq.scale.copy_(s)``) or
    with :meth:`set_qparams`; ``enabled = False`` makes the module the identity.

    **When to use:** QAT with parameters chosen outside the model (calibration, an observer of
    your own, a checkpoint): weights per channel (``ChannelScope(0)``), activations per tensor.

    **Dtypes:** ``x`` float16 / bfloat16 / float32 / float64 (output the same); CUDA tensors on
    the GPU, CPU tensors on the reference backend.

    **Shape limits:** any rank and extents; ``GroupScope`` needs a group size that divides its
    axis. Non-contiguous inputs are copied to C-contiguous first; the output is C-contiguous.

    **Precision guarantee:** float32 arithmetic (float64 for float64 data), each operation rounded
    once; bit for bit the NumPy reference and ``torch.fake_quantize_per_tensor_affine`` /
    ``_per_channel_affine`` on float16 / bfloat16 / float32 (forward and gradient).

    **Versus torch.ao.quantization.FakeQuantize:** no observer (parameters are given, not
    measured), no ``fake_quant_enabled`` / ``observer_enabled`` buffers (``enabled`` instead),
    token and group scopes as well as tensor and channel, float64 computed in float64, and a float
    zero point is rounded half to even and clamped (PyTorch's per-channel op adds it unrounded).
    """

    scale: Any
    zero_point: Any

    def __init__(
        self,
        scale: float | Sequence[float] | Any,
        zero_point: int | Sequence[int] | Any | None = None,
        *,
        q_min: int = -128,
        q_max: int = 127,
        scope: Scope = _TENSOR,
        enabled: bool = True,
    ) -> None:
        super().__init__()
        self.q_min, self.q_max = _check_range(q_min, q_max)
        self.scope = scope
        self.enabled = enabled
        self.register_buffer("scale", torch.as_tensor(scale, dtype=torch.float32).detach().clone().reshape(-1))
        zp = None if zero_point is None else torch.as_tensor(zero_point).detach().clone().reshape(-1)
        if zp is not None and not zp.dtype.is_floating_point:
            zp = zp.to(torch.int32)
        self.register_buffer("zero_point", zp)

    def set_qparams(self, scale: Any, zero_point: Any = None) -> None:
        """Copy new values into ``scale`` (and ``zero_point``) in place (same element count)."""
        with torch.no_grad():
            self.scale.copy_(torch.as_tensor(scale).reshape(self.scale.shape))
            if zero_point is not None:
                if self.zero_point is None:
                    raise InvalidProblem("this FakeQuantize is symmetric (zero_point=None); it takes no zero point")
                self.zero_point.copy_(torch.as_tensor(zero_point).reshape(self.zero_point.shape))

    def forward(self, x: Any) -> Any:
        """``x`` fake-quantized (or ``x`` itself when ``enabled`` is False)."""
        if not self.enabled:
            return x
        # q_min / q_max were checked at construction: straight to the op.
        return _fake_quantize(x, self.scale, self.zero_point, self.scope, self.q_min, self.q_max)

    def extra_repr(self) -> str:
        mode = "symmetric" if self.zero_point is None else "asymmetric"
        return (
            f"scope={_scope_text(self.scope)}, {mode}, q_min={self.q_min}, q_max={self.q_max}, enabled={self.enabled}"
        )


class LearnableFakeQuantize(torch.nn.Module):
    """LSQ fake quantization with trained parameters: the forward of :class:`FakeQuantize`, and
    ``scale`` / ``zero_point`` ``nn.Parameter`` s that receive LSQ gradients.

    Gradients (``q = rne(x * inv) + zp``, ``gf`` the grad factor): ``dx = dy`` where
    ``q_min <= q <= q_max``, else 0; ``dscale`` sums ``((dy * (y - x)) * inv) * gf`` inside and
    ``(dy * (q_min - zp)) * gf`` / ``(dy * (q_max - zp)) * gf`` below / above; ``dzero_point`` sums
    ``(-dy * scale) * gf`` outside. ``grad_factor``: a number, or None for LSQ's
    ``1 / sqrt(x.numel() * q_max)`` per call.

    Parameters are float32, initialised from ``scale`` (a float for TensorScope, with
    ``num_channels`` for ChannelScope, or a tensor / sequence with one value per segment) and
    ``zero_point`` (None: symmetric, no zero-point parameter).

    **When to use:** QAT where the step size (and offset) should be learned (LSQ / LSQ+): weights
    per channel (``scope=ChannelScope(0)``), activations per tensor.

    **Dtypes:** ``x`` float16 / bfloat16 / float32 / float64; parameters float32 (computed in
    float64 for float64 data; gradients returned as float32).

    **Shape limits:** any rank; every scope. The backward sums contiguous segments; other layouts
    (e.g. per-channel along axis 1 of an activation) are moved to contiguous order for it, at the
    cost of one copy of ``x`` and ``dy``. Non-contiguous inputs are copied; outputs C-contiguous.

    **Precision guarantee:** forward and ``dx`` bit for bit the NumPy reference and PyTorch's
    learnable ops on float32; ``dscale`` / ``dzero_point`` are float64 sums in a fixed order,
    rounded once: deterministic (same bits every run), within float32 rounding of PyTorch's.

    **Versus torch.ao.quantization._LearnableFakeQuantize:** no observer and no enable flags; the
    zero point is rounded half to even and clamped the same way in forward and backward (PyTorch's
    per-tensor backward rounds it as ``trunc(zp + 0.5)``, so ties like 2.5 differ), and added after
    rounding in every scope; float16 / bfloat16 data are served (PyTorch's learnable backward takes
    float32 only); any scope, not only per tensor / per channel.
    """

    def __init__(
        self,
        scale: float | Sequence[float] | Any,
        zero_point: float | Sequence[float] | Any | None = None,
        *,
        q_min: int = -128,
        q_max: int = 127,
        scope: Scope = _TENSOR,
        num_channels: int | None = None,
        grad_factor: float | None = 1.0,
    ) -> None:
        super().__init__()
        self.q_min, self.q_max = _check_range(q_min, q_max)
        self.scope = scope
        self.grad_factor = grad_factor

        def init(value: Any, name: str) -> Any:
            t = torch.as_tensor(value, dtype=torch.float32).detach().clone().reshape(-1)
            if num_channels is not None and t.numel() == 1:
                t = t.expand(num_channels).clone()
            elif num_channels is not None and t.numel() != num_channels:
                raise InvalidProblem(f"{name} has {t.numel()} values but num_channels={num_channels}")
            return torch.nn.Parameter(t)

        self.scale = init(scale, "scale")
        self.zero_point = None if zero_point is None else init(zero_point, "zero_point")

    def forward(self, x: Any) -> Any:
        """``x`` fake-quantized with the current parameters (gradients flow to them)."""
        gf = self.grad_factor
        if gf is None:
            gf = 1.0 / math.sqrt(max(1, x.numel() * max(1, self.q_max)))
        return _fake_quantize_learnable(x, self.scale, self.zero_point, self.scope, self.q_min, self.q_max, float(gf))

    def extra_repr(self) -> str:
        mode = "symmetric" if self.zero_point is None else "asymmetric"
        return f"scope={_scope_text(self.scope)}, {mode}, q_min={self.q_min}, q_max={self.q_max}"


class DynamicFakeQuantize(torch.nn.Module):
    """Dynamic-range fake quantization (DeepSpeed MoQ): each call measures every segment's range,
    derives ``scale`` (and ``zero_point``) from it and fake-quantizes with them; identity gradient.

    ``bits``: SYMMETRIC 2 to 8 (codes ``[-2**(bits-1), 2**(bits-1) - 1]``,
    ``scale = max|x| / q_max``), ASYMMETRIC 1 to 8 (codes ``[0, 2**bits - 1]``,
    ``scale = (hi - lo) / (q_max - q_min)``, zero exactly representable); then
    ``y = (clamp(rne(x * inv) + zp, q_min, q_max) - zp) * scale`` with ``inv = rn(1 / scale)``
    (:func:`dynamic_fake_quantize` has the details). Segments: ``group_size=g`` (groups of ``g``
    along the last axis, MoQ's layout) or any ``scope`` (default: the whole tensor).
    ``rounding=Rounding.STOCHASTIC`` draws Philox4x32-10 numbers from ``(seed, offset)``: ``seed``
    fixed at construction (drawn from PyTorch's generator when None, so ``torch.manual_seed``
    makes it reproducible), ``offset`` a per-module counter that advances by ``x.numel()`` every
    call, so every call gets fresh and reproducible randomness. Both are in the ``state_dict``
    (extra state), so a resumed run continues the same stream. Like any module, it quantizes in
    ``eval()`` mode too.

    **When to use:** MoQ-style QAT of weights or activations with no parameters to keep or learn,
    and stochastic rounding to keep low-bit training unbiased.

    **Dtypes:** float16 / bfloat16 / float32 / float64; CUDA tensors on the GPU, CPU tensors on the
    reference backend (same bits, stochastic rounding included).

    **Shape limits:** any rank; group sizes must divide their axis. Non-contiguous inputs are
    copied; outputs are C-contiguous. Inside a captured CUDA graph the offset is the one of the
    capture (a Python int), so replays repeat the same random numbers.

    **Precision guarantee:** float32 arithmetic (float64 for float64 data), exact range
    reductions; bit for bit ``quantplan.reference.dynamic_fake_quantize`` on CPU and GPU, for both
    roundings; deterministic.

    **Versus torch.ao.quantization.FakeQuantize:** no running statistics (MinMax / moving-average
    observers keep them across batches; here each call uses its own range), the symmetric scale is
    ``amax / q_max`` (PyTorch's symmetric observers use ``amax / ((q_max - q_min) / 2)``), groups
    and stochastic rounding are available, and the gradient is the identity (no clamping mask).
    Versus DeepSpeed's fake quantizer: the symmetric scale divides by ``q_max`` so ``+-max|x|`` are
    both exact, and stochastic rounding applies to the asymmetric formula as well.
    """

    def __init__(
        self,
        bits: int = 8,
        mode: QuantMode = QuantMode.SYMMETRIC,
        *,
        group_size: int | None = None,
        scope: Scope | None = None,
        rounding: Rounding = Rounding.NEAREST_EVEN,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        if group_size is not None and scope is not None:
            raise InvalidProblem("pass group_size or scope, not both (group_size=g means GroupScope(axis=-1, g))")
        self.bits = _bits(bits, mode)
        dynamic_fake_quantize_range(mode, self.bits)  # InvalidProblem now rather than at the first call
        self.mode = mode
        self.scope: Scope = GroupScope(axis=-1, group_size=group_size) if group_size is not None else scope or _TENSOR
        self.rounding = rounding
        if seed is None:
            seed = int(torch.randint(0, 2**62, ()).item())
        self._philox = PhiloxCounter(seed)

    @property
    def rng_seed(self) -> int:
        """The Philox key of the stochastic rounding."""
        return self._philox.seed

    @rng_seed.setter
    def rng_seed(self, value: int) -> None:
        self._philox.seed = check_seed(value, "rng_seed")

    @property
    def rng_offset(self) -> int:
        """The Philox counter offset of the next call (advances by ``x.numel()`` per call)."""
        return self._philox.offset

    @rng_offset.setter
    def rng_offset(self, value: int) -> None:
        self._philox.offset = check_seed(value, "rng_offset")

    def forward(self, x: Any) -> Any:
        """``x`` fake-quantized with its own range (advances the offset when stochastic)."""
        if self.rounding is not Rounding.STOCHASTIC:
            return _dynamic_fake_quantize(x, self.bits, self.mode, self.scope, self.rounding, None, None)
        seed, offset = self._philox.take(x.numel())
        return _dynamic_fake_quantize(x, self.bits, self.mode, self.scope, self.rounding, seed, offset)

    def get_extra_state(self) -> dict[str, int]:
        """The Philox seed and offset (saved in the ``state_dict``)."""
        return {"rng_seed": self.rng_seed, "rng_offset": self.rng_offset}

    def set_extra_state(self, state: dict[str, int]) -> None:
        """Restore the Philox seed and offset from a ``state_dict``."""
        self._philox = PhiloxCounter(int(state["rng_seed"]), int(state["rng_offset"]))

    def extra_repr(self) -> str:
        return f"bits={self.bits}, {self.mode.value}, scope={_scope_text(self.scope)}, rounding={self.rounding.value}"


__all__ = [
    "PLAN_CACHE_SIZE",
    "DynamicFakeQuantize",
    "DynamicFakeQuantizeFunction",
    "FakeQuantize",
    "FakeQuantizeFunction",
    "LearnableFakeQuantize",
    "LearnableFakeQuantizeFunction",
    "clear_plan_cache",
    "cupy_stream",
    "dynamic_fake_quantize",
    "fake_quantize",
    "fake_quantize_learnable",
]
