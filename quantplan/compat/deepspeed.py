"""DeepSpeed's quantizer functions on quantplan's plans: swap the import, keep the numbers.

``from quantplan.compat import deepspeed as quantizer`` stands in for the module DeepSpeed's
``QuantizerBuilder().load()`` returns (ZeRO++ qwZ / qgZ, LoCo, MoQ). Same function names,
argument order, parameter layouts and formulas (``DEEPSPEED_FORMAT.md``):

* groups: ``E = numel / groups`` contiguous elements of the flattened tensor;
* parameters: float32 ``[groups, 1]`` holding ``1 / scale`` (symmetric) or ``[groups, 2]``
  holding ``(1 / scale, offset)`` interleaved (asymmetric, ``offset`` the group's midpoint
  ``(max + min) / 2``, a float);
* symmetric ``scale = 2**b / (2 * absmax)`` (absmax 0 -> 1), ``q = clamp(rne(x * scale),
  -2**(b-1), 2**(b-1) - 1)``, so ``+absmax`` clips to ``2**(b-1) - 1``; asymmetric
  ``scale = 2**b / (max - min)`` (max = min -> 1), ``q = clamp(rne((x - offset) * scale), ...)``;
  dequantize ``x = q * (1/scale) (+ offset)``;
* int4: signed nibbles, element ``2i`` in the high nibble, element ``2i + 1`` in the low one;
  the output keeps the input's shape with the last dimension halved;
* swizzle: partitions ``z = node * devices_per_node + device`` reordered
  ``[pipeline][device][node]`` (2 nodes x 4 devices: ``0 4 1 5 2 6 3 7``);
* LoCo: ``v = x + e``; quantize ``v``; ``e <- beta * e + (1 - beta) * (v - dequant(quant(v)))``.

Functions: :func:`quantize`, :func:`dequantize`, :func:`dequantize_fp32`, :func:`swizzle_quant`,
:func:`quantized_reduction`, :func:`loco_swizzle_quant`, :func:`loco_quantized_reduction`, and
the MoQ fake quantizers ``ds_quantize_fp16`` / ``_fp32``, ``ds_sr_quantize_fp16`` / ``_fp32``,
``ds_quantize_asym_fp16`` / ``_fp32``, ``ds_sr_quantize_asym_fp16`` / ``_fp32``; the quantization
type as :class:`QuantizationType` (``Symmetric`` / ``Asymmetric``, also module attributes).
Each function builds a plan (:mod:`quantplan.ops.deepspeed_format`, or
:class:`~quantplan.DequantizePlan` for symmetric dequantization) and runs it where its arrays
live (:mod:`quantplan.compat._arrays`).

Deliberate differences from DeepSpeed (its defects and limits, fixed):

1. Dtypes are checked and read correctly: F16, BF16 and F32 inputs everywhere (DeepSpeed reads
   fp16 and casts other pointers unchecked: bf16 input gives garbage). The MoQ ``_fp16`` /
   ``_fp32`` suffixes no longer have to match the tensor: each variant fake-quantizes F16, BF16
   or F32 in its own dtype. LoCo error buffers may be F16, BF16 or F32, independent of the input.
2. Any group size: no multiple-of-8 rule, no silent no-op above 16,384 (quantize) / 40,960
   (swizzle) elements per group or ~1M elements (fake quant); 64-bit sizes. A request that
   cannot be served raises :class:`~quantplan.InvalidProblem` (a ValueError) naming the rule.
3. ``quantized_reduction`` dequantizes and sums in float32 (DeepSpeed sums in fp16), peer 0 first.
4. The stochastic asymmetric fake quantizers run the asymmetric formula (DeepSpeed's launcher
   runs the symmetric kernel), and the float32 symmetric fake quantizer returns ``q / scale``
   (DeepSpeed's rounds its output to the integer codes).
5. Asymmetric statistics cover the group's own elements only (DeepSpeed's include zero-filled
   padding lanes).
6. A group holding NaN or +-Inf (or whose range overflows float32) gets NaN parameters and codes
   0, so it dequantizes to NaN; MoQ returns the group as NaN. DeepSpeed's output is unspecified.
7. Arithmetic is float32 with every operation rounded once: asymmetric dequantize is
   ``(q * p0) + p1`` rounded twice (a compiler may fuse DeepSpeed's into one FMA: last-bit
   differences are possible there), MoQ's ``1e-5`` is the float32 constant, and the symmetric
   multiplier is computed as ``2**(b-1) / absmax`` — the same bits as ``2**b / (2 * absmax)``,
   without overflow of ``2 * absmax`` for huge float32 values.
8. Stochastic rounding draws SPEC section 4's Philox4x32-10 stream (``u`` for flat element
   ``i``); the key is this module's seed (:func:`manual_seed`, or ``rng_seed=`` per call) and
   each call advances the counter offset by one. DeepSpeed's curand stream differs: same
   distribution, different draws. The stochastic symmetric result is clamped to the code range.
9. 4-bit outputs of a tensor whose last dimension is odd (but whose size is even) come back
   flat, ``(numel / 2,)``; ``quantized_reduction`` returns a flat output when the last dimension
   does not split by ``devices_per_node``.
10. Arrays: PyTorch CUDA tensors and CuPy arrays run on the CUDA kernels
    (``kernels/deepspeed_format.cu``) on their library's current stream, outputs allocated on
    the same device; NumPy arrays and PyTorch CPU tensors run on the reference backend, with the
    same bits (outputs of a CPU tensor's call are PyTorch CPU tensors; in-place buffers are
    updated through zero-copy views). The arrays of one call come from one library and one device.
    Non-contiguous inputs are copied; LoCo error buffers must be contiguous (updated in place).
    Plans are selected once per problem and cached (:func:`clear_plan_cache`); groups above
    32768 elements take a two-pass kernel path with a small workspace allocated per call.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

from quantplan._frontend import (
    PhiloxCounter,
    Target,
    array_signature,
    check_seed,
    dtype_name,
    flat,
    remember_replay,
    replay,
    replayed,
    shaped,
)
from quantplan.compat._arrays import clear_plan_cache, target
from quantplan.ops.deepspeed_format import (
    DeepSpeedDequantizeArgs,
    DeepSpeedDequantizeDescriptor,
    DeepSpeedDequantizePlan,
    DeepSpeedQuantizeArgs,
    DeepSpeedQuantizeDescriptor,
    DeepSpeedQuantizePlan,
    DeepSpeedReduceArgs,
    DeepSpeedReduceDescriptor,
    DeepSpeedReducePlan,
    MoQFakeQuantizeArgs,
    MoQFakeQuantizeDescriptor,
    MoQFakeQuantizePlan,
)
from quantplan.ops.static_quantize import DequantizeArgs, DequantizeDescriptor, DequantizePlan
from quantplan.vocabulary.errors import InvalidProblem, MisalignedOperand, Unsupported
from quantplan.vocabulary.types import ElementKind, GroupScope, NibbleOrder, QuantMode, Rounding


class QuantizationType(enum.IntEnum):
    """DeepSpeed's ``QuantizationType`` (``quantize::Type``): ``Symmetric`` (0), ``Asymmetric`` (1)."""

    Symmetric = 0
    Asymmetric = 1


Symmetric = QuantizationType.Symmetric
Asymmetric = QuantizationType.Asymmetric

_FLOAT_DTYPES = {"float16": ElementKind.F16, "bfloat16": ElementKind.BF16, "float32": ElementKind.F32}
#: The stochastic fake quantizers' Philox key and counter (one offset per call).
_PHILOX = PhiloxCounter(int(np.random.default_rng().integers(0, 2**63)))


def manual_seed(seed: int) -> None:
    """Seed the stochastic fake quantizers (Philox key ``seed``) and reset their counter offset to 0."""
    _PHILOX.seed = check_seed(seed)
    _PHILOX.offset = 0


# ---- argument handling ---------------------------------------------------------------------------

#: quant_type values (QuantizationType members compare and hash as 0 / 1) -> mode.
_QUANT_TYPES: dict[Any, QuantMode] = {
    0: QuantMode.SYMMETRIC,
    1: QuantMode.ASYMMETRIC,
    QuantMode.SYMMETRIC: QuantMode.SYMMETRIC,
    QuantMode.ASYMMETRIC: QuantMode.ASYMMETRIC,
}


_QUANTIZE_NAMES = ("input_vals", "error_feedback")
_DEQUANTIZE_NAMES = ("quantized_data", "params")
_REDUCE_NAMES = ("input_vals", "input_scales", "error_feedback")
_MOQ_NAMES = ("vals",)


def _counts(**values: Any) -> None:
    """Raise InvalidProblem unless every value is an integer (group counts, bits, partitions):
    the slow path of a call whose counts are not all Python ints."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise InvalidProblem(f"{name}={value!r} must be an integer")


def _mode(quant_type: Any) -> QuantMode:
    mode = None if type(quant_type) is bool else _QUANT_TYPES.get(quant_type)
    if mode is None:
        raise InvalidProblem(
            f"quant_type={quant_type!r}: pass QuantizationType.Symmetric / Asymmetric (0 / 1) or a QuantMode"
        )
    return mode


def _params_per_group(mode: QuantMode) -> int:
    return 1 if mode is QuantMode.SYMMETRIC else 2


def _float_kind(x: Any, name: str) -> ElementKind:
    dtype = dtype_name(x)
    kind = _FLOAT_DTYPES.get(dtype)
    if kind is None:
        if dtype == "float64":
            raise Unsupported(f"{name} is float64; DeepSpeed's quantizer takes float16, bfloat16 or float32")
        raise InvalidProblem(f"{name} has dtype {dtype}; pass float16, bfloat16 or float32")
    return kind


def _codes_input(target: Target, q: Any, name: str) -> Any:
    dtype = dtype_name(q)
    if dtype != "int8" and dtype != "uint8":
        raise InvalidProblem(f"{name} has dtype {dtype}; DeepSpeed's codes are int8 (uint8 accepted)")
    return target.contiguous(q)


def _params_input(target: Target, params: Any, groups: int, mode: QuantMode, name: str) -> Any:
    """``params`` as a contiguous float32 ``[groups, 1|2]`` array (checked: dtype, value count)."""
    k = _params_per_group(mode)
    dtype = dtype_name(params)
    if dtype != "float32":
        raise InvalidProblem(f"{name} has dtype {dtype}; DeepSpeed's parameters are float32")
    size = target.numel(params)
    if size != groups * k:
        raise InvalidProblem(
            f"{name} has {size} values ({tuple(params.shape)}); {mode.value} parameters of {groups} groups are "
            f"[groups, {k}] = {groups * k} values"
        )
    return shaped(target.contiguous(params), (groups, k))


def _error_buffer(target: Target, error: Any, numel: int, source: Any, source_name: str) -> tuple[Any, ElementKind]:
    """The LoCo buffer, flat: ``numel`` elements, contiguous, writable, float16 / bfloat16 / float32,
    sharing no memory with ``source`` (host arrays; the plans check device operands)."""
    size = target.numel(error)
    if size != numel:
        raise InvalidProblem(f"error_feedback must be an array of {numel} elements, got {size}")
    if not target.is_contiguous(error):
        raise MisalignedOperand("error_feedback must be C-contiguous: it is updated in place")
    if not target.writable(error):
        raise InvalidProblem("error_feedback is read-only; it is updated in place: pass a writeable array")
    if not target.cuda and np.may_share_memory(target.arg(error), target.arg(source)):
        raise InvalidProblem(f"error_feedback overlaps {source_name}; pass a separate buffer")
    kind = _FLOAT_DTYPES.get(dtype_name(error))
    if kind is None:
        raise InvalidProblem(f"error_feedback has dtype {dtype_name(error)}; pass float16, bfloat16 or float32")
    return flat(error), kind


def _run_coded(
    target: Target,
    plan: Any,
    groups: int,
    mode: QuantMode,
    nbytes: int,
    numel: int,
    args: Callable[..., Any],
    learn: tuple[Hashable, int, Callable[..., Any], tuple[int, ...]] | None = None,
) -> tuple[Any, Any]:
    """Run a plan writing codes and parameter rows: allocates the flat int8 codes (``nbytes``)
    and the float32 ``[groups, 1|2]`` rows, ``args(codes, params)`` builds the plan's arguments;
    returns ``(codes, params)``. A problem of zero elements leaves the parameters of empty groups,
    ``1 / scale = 1`` and offset 0.

    Without LoCo every operand is one this call made or checked (dtype, element count,
    contiguity, library and device), so the plan runs unchecked; the LoCo buffer and ``err_beta``
    the plan checks (range, overlap with the input).
    """
    param_shape = (groups, _params_per_group(mode))
    (out, params), ws = target.empty_many([((nbytes,), "int8"), (param_shape, "float32")], plan.workspace_size())
    if numel == 0:
        params[...] = 0
        params[:, 0] = 1
    a = args(out, params)
    target.run(plan, a, ws, check=a.error_feedback is not None)
    if learn is not None and numel and a.error_feedback is None:  # replayed with the codes in their final shape
        key, inputs, finish, codes_shape = learn
        remember_replay(
            key,
            target,
            lambda: replay(target, plan, a, inputs, [(codes_shape, "int8"), (param_shape, "float32")], finish),
        )
    return out, params


def _last(*arrays: Any) -> Any:
    """A replayed call's result: its one output (the array after its inputs)."""
    return arrays[-1]


def _codes_and_params(*arrays: Any) -> tuple[Any, Any]:
    """A replayed quantize's result: its two outputs (the arrays after its inputs)."""
    return arrays[-2], arrays[-1]


def _packed_shape(shape: tuple[int, ...], bits: int, numel: int) -> tuple[int, ...]:
    """The input's shape with the last dimension halved for 4 bits (flat when it is odd)."""
    if bits == 8:
        return shape
    if shape and shape[-1] % 2 == 0:
        return (*shape[:-1], shape[-1] // 2)
    return (numel // 2,)


# ---- quantize / swizzle / LoCo ---------------------------------------------------------------------


def _quantize(
    input_vals: Any,
    groups: int,
    num_bits: int,
    quant_type: Any,
    nodes: int = 1,
    devices_per_node: int = 1,
    pipeline_size: int = 1,
    error_feedback: Any = None,
    err_beta: float | None = None,
    learn: tuple[Hashable, int, Callable[..., Any], tuple[int, ...]] | None = None,
) -> tuple[Any, Any]:
    target_ = target(input_vals, error_feedback, names=_QUANTIZE_NAMES)
    arg = target_.arg
    kind = _float_kind(input_vals, "input_vals")
    x = target_.contiguous(input_vals)
    mode = _mode(quant_type)
    if not (type(groups) is int and type(num_bits) is int and type(nodes) is int):
        _counts(groups=groups, num_bits=num_bits, nodes=nodes)
    if not (type(devices_per_node) is int and type(pipeline_size) is int):
        _counts(devices_per_node=devices_per_node, pipeline_size=pipeline_size)
    numel = target_.numel(x)
    error, error_kind = (
        (None, None) if error_feedback is None else _error_buffer(target_, error_feedback, numel, x, "input_vals")
    )
    plan = target_.plan(
        DeepSpeedQuantizePlan,
        (numel, groups, num_bits, mode, kind, nodes, devices_per_node, pipeline_size, error_kind),
        lambda: DeepSpeedQuantizeDescriptor(
            numel=numel,
            groups=groups,
            num_bits=num_bits,
            mode=mode,
            input_element=kind,
            nodes=nodes,
            devices_per_node=devices_per_node,
            pipeline=pipeline_size,
            error_element=error_kind,
        ),
    )
    return _run_coded(
        target_,
        plan,
        int(groups),
        mode,
        numel if num_bits == 8 else numel // 2,
        numel,
        lambda out, params: DeepSpeedQuantizeArgs(arg(flat(x)), arg(out), arg(params), arg(error), err_beta),
        learn,
    )


def quantize(input_vals: Any, groups: int, num_bits: int, quant_type: Any) -> tuple[Any, Any]:
    """DeepSpeed ``quantize(input_vals, groups, num_bits, quant_type) -> (q, params)``.

    Formula: per group, symmetric ``q = clamp(rne(x * 2**b / (2 * absmax)), -2**(b-1), 2**(b-1) - 1)``,
    ``params = [1 / scale]``; asymmetric ``q = clamp(rne((x - offset) * 2**b / (max - min)), ...)``,
    ``params = [1 / scale, offset]``, ``offset = (max + min) / 2``.

    **When to use:** qwZ weight quantization (int8 symmetric, ~8000 elements per group) or any
    DeepSpeed-format group quantization; pair with :func:`dequantize`.

    **Dtypes:** input float16 / bfloat16 / float32 (NumPy, CuPy or PyTorch CUDA); ``q`` int8 (4
    bits: two signed nibbles per byte, high first); ``params`` float32 ``[groups, 1|2]``; both
    of the input's library and device.

    **Shape limits:** ``groups`` divides ``numel`` (any group size); 4 bits: even ``numel``.
    ``q`` keeps the input's shape, last dimension halved for 4 bits (flat if that is odd).

    **Workspace:** none to pass; groups above 32768 elements use 8 bytes per group, allocated
    on the input's device.

    **Precision guarantee:** float32 arithmetic, deterministic, the same bits on every backend
    (see the module's differences).
    """
    signature = array_signature(input_vals)  # a call like an earlier one: replayed
    key = None if signature is None else (quantize, *signature, groups, num_bits, quant_type)
    result = replayed(key, input_vals)
    if result is not None:
        return result  # type: ignore[no-any-return]
    shape = tuple(getattr(input_vals, "shape", ()))
    packed = _packed_shape(shape, num_bits, math.prod(shape)) if type(num_bits) is int else shape

    learn = None if key is None else (key, 1, _codes_and_params, packed)
    q, params = _quantize(input_vals, groups, num_bits, quant_type, learn=learn)
    return shaped(q, packed), params


def swizzle_quant(
    input_vals: Any,
    groups: int,
    num_bits: int,
    quant_type: Any,
    pipeline_size: int,
    nodes: int,
    devices_per_node: int,
) -> tuple[Any, Any]:
    """DeepSpeed ``swizzle_quant(input_vals, groups, num_bits, quant_type, pipeline_size, nodes,
    devices_per_node) -> (q, params)`` (ZeRO++ qgZ, first step).

    Formula: :func:`quantize`'s, then codes and parameter rows in the order
    ``[pipeline][device][node][group][E]`` of the input viewed as ``[nodes * devices_per_node]
    [pipeline][groups / (P * pipeline)][E]`` (2 nodes x 4 devices: partitions ``0 4 1 5 2 6 3 7``).

    **When to use:** before the intra-node all-to-all of qgZ: chunk ``d`` of ``q`` (and of
    ``params``) goes to local device ``d``.

    **Dtypes:** as :func:`quantize`; ``q`` is flat int8 of ``numel * num_bits / 8`` bytes.

    **Shape limits:** ``groups`` divides ``numel`` and is a multiple of ``nodes *
    devices_per_node * pipeline_size``; any group size (DeepSpeed: at most 40,960); 4 bits: even slices.

    **Precision guarantee:** float32 arithmetic, deterministic.
    """
    signature = array_signature(input_vals)  # a call like an earlier one: replayed
    key = (
        None
        if signature is None
        else (swizzle_quant, *signature, groups, num_bits, quant_type, pipeline_size, nodes, devices_per_node)
    )
    result = replayed(key, input_vals)
    if result is not None:
        return result  # type: ignore[no-any-return]
    shape = tuple(getattr(input_vals, "shape", ()))
    numel = math.prod(shape)
    learn = None if key is None else (key, 1, _codes_and_params, (numel if num_bits == 8 else numel // 2,))
    return _quantize(input_vals, groups, num_bits, quant_type, nodes, devices_per_node, pipeline_size, learn=learn)


def loco_swizzle_quant(
    input_vals: Any,
    error_feedback: Any,
    err_beta: float,
    groups: int,
    num_bits: int,
    quant_type: Any,
    pipeline_size: int,
    nodes: int,
    devices_per_node: int,
) -> tuple[Any, Any]:
    """DeepSpeed ``loco_swizzle_quant(input_vals, error_feedback, err_beta, groups, num_bits,
    quant_type, pipeline_size, nodes, devices_per_node) -> (q, params)``.

    Formula: ``v = x + e`` (float32) is swizzle-quantized as :func:`swizzle_quant`; then
    ``e <- (b * e) + (c * (v - dequant(q)))`` with ``b = f32(err_beta)``, ``c = 1 - b``, every
    operation in float32 rounded once, rounded to the buffer's dtype. ``error_feedback`` (the
    input's element count, in the input's order, float16 / bfloat16 / float32, contiguous) is
    updated in place.

    **When to use:** qgZ with LoCo error compensation (4-bit gradients).

    **Dtypes / Shape limits:** as :func:`swizzle_quant`; ``err_beta`` in [0, 1].

    **Precision guarantee:** float32 arithmetic, deterministic.
    """
    return _quantize(
        input_vals, groups, num_bits, quant_type, nodes, devices_per_node, pipeline_size, error_feedback, err_beta
    )


# ---- dequantize --------------------------------------------------------------------------------------


def _dequantize(quantized_data: Any, params: Any, groups: int, num_bits: int, quant_type: Any, out: ElementKind) -> Any:
    signature = array_signature(quantized_data, params)  # a call like an earlier one: replayed
    key = None if signature is None else (_dequantize, *signature, groups, num_bits, quant_type, out)
    result = replayed(key, quantized_data, params)
    if result is not None:
        return result
    target_ = target(quantized_data, params, names=_DEQUANTIZE_NAMES)
    q = _codes_input(target_, quantized_data, "quantized_data")
    mode = _mode(quant_type)
    if not (type(groups) is int and type(num_bits) is int):
        _counts(groups=groups, num_bits=num_bits)
    p = _params_input(target_, params, groups, mode, "params")
    if num_bits != 4 and num_bits != 8:
        raise InvalidProblem(f"num_bits={num_bits!r}: dequantize takes 8 or 4 bits")
    qshape = tuple(q.shape)
    shape = qshape if num_bits == 8 else (*qshape[:-1], qshape[-1] * 2) if qshape else (2,)
    numel = target_.numel(q) * (8 // num_bits)
    y_dtype = "float16" if out is ElementKind.F16 else "float32"
    y = target_.empty(shape, y_dtype)  # contiguous: the plan writes it flat
    if numel == 0:
        return y
    if numel % groups:
        raise InvalidProblem(f"{numel} codes do not split into {groups} equal groups")
    # Every operand is checked above (dtypes, value counts, contiguity, library, device) or made
    # here: the plans run unchecked.
    if mode is QuantMode.SYMMETRIC:
        # x = q * (1/scale): DequantizePlan's (q - 0) * scale with the stored 1/scale as its scale.
        plan = target_.plan(
            DequantizePlan,
            ("deepspeed", numel, groups, num_bits, out),
            lambda: DequantizeDescriptor(
                shape=(numel,),
                scope=GroupScope(axis=-1, group_size=numel // groups),
                mode=QuantMode.SYMMETRIC,
                input_element=ElementKind.S4 if num_bits == 4 else ElementKind.S8,
                output_element=out,
                nibble_order=NibbleOrder.HIGH_FIRST,
            ),
        )
        storage = "uint8" if num_bits == 4 else "int8"
        codes = flat(q) if dtype_name(q) == storage else target_.view(flat(q), storage)
        args: Any = DequantizeArgs(target_.arg(codes), target_.arg(flat(y)), target_.arg(flat(p)))
        order = ("x0", "o0", "x1")
    else:
        plan = target_.plan(
            DeepSpeedDequantizePlan,
            (numel, groups, num_bits, mode, out),
            lambda: DeepSpeedDequantizeDescriptor(
                numel=numel, groups=groups, num_bits=num_bits, mode=mode, output_element=out
            ),
        )
        args = DeepSpeedDequantizeArgs(target_.arg(flat(q)), target_.arg(p), target_.arg(flat(y)))
        order = ("x0", "x1", "o0")
    target_.run_with_workspace(plan, args, check=False)
    if key is not None and q is quantized_data and p is params:  # replayed on the caller's arrays as they are
        outputs = [(shape, y_dtype)]  # allocated in the result's shape: no view per call
        remember_replay(key, target_, lambda: replay(target_, plan, args, 2, outputs, _last, order))
    return y


def dequantize(quantized_data: Any, params: Any, groups: int, num_bits: int, quant_type: Any) -> Any:
    """DeepSpeed ``dequantize(quantized_data, params, groups, num_bits, quant_type) -> float16``.

    Formula: ``x = q * p0`` (symmetric, run on :class:`~quantplan.DequantizePlan`) or
    ``x = (q * p0) + p1`` (asymmetric), float32, rounded once to float16; ``p0 = 1 / scale``,
    ``p1 = offset`` of the element's group.

    **When to use:** after the all-gather of qwZ, or the last step of qgZ.

    **Dtypes:** ``quantized_data`` int8 (4 bits: packed, high nibble first), ``params`` float32
    ``[groups, 1|2]`` (any shape with that many values); output float16 of the codes' shape,
    last dimension doubled for 4 bits.

    **Shape limits:** ``groups`` divides the element count; any group size.

    **Precision guarantee:** float32 arithmetic, one rounding to float16, deterministic.
    """
    return _dequantize(quantized_data, params, groups, num_bits, quant_type, ElementKind.F16)


def dequantize_fp32(quantized_data: Any, params: Any, groups: int, num_bits: int, quant_type: Any) -> Any:
    """DeepSpeed ``dequantize_fp32``: :func:`dequantize` with a float32 result (no final rounding).

    **Dtypes / Shape limits / Precision guarantee:** as :func:`dequantize`, output float32.
    """
    return _dequantize(quantized_data, params, groups, num_bits, quant_type, ElementKind.F32)


# ---- quantized reduction -------------------------------------------------------------------------------


def _reduce(
    input_vals: Any,
    input_scales: Any,
    in_groups: int,
    out_groups: int,
    num_bits: int,
    quant_type: Any,
    devices_per_node: int,
    error_feedback: Any = None,
    err_beta: float | None = None,
    key: tuple[Any, ...] | None = None,
) -> tuple[Any, Any]:
    target_ = target(input_vals, input_scales, error_feedback, names=_REDUCE_NAMES)
    q = _codes_input(target_, input_vals, "input_vals")
    mode = _mode(quant_type)
    if not (type(in_groups) is int and type(out_groups) is int and type(num_bits) is int):
        _counts(in_groups=in_groups, out_groups=out_groups, num_bits=num_bits)
    if type(devices_per_node) is not int:
        _counts(devices_per_node=devices_per_node)
    p = _params_input(target_, input_scales, in_groups, mode, "input_scales")
    if num_bits != 4 and num_bits != 8:
        raise InvalidProblem(f"num_bits={num_bits!r}: quantized_reduction takes 8 or 4 bits")
    numel = target_.numel(q) * (8 // num_bits)
    if isinstance(devices_per_node, int) and devices_per_node >= 1:
        chunk = numel // devices_per_node
    else:
        chunk = 0  # select reports the bad devices_per_node
    error, error_kind = (
        (None, None) if error_feedback is None else _error_buffer(target_, error_feedback, chunk, q, "input_vals")
    )
    plan = target_.plan(
        DeepSpeedReducePlan,
        (numel, in_groups, out_groups, num_bits, mode, devices_per_node, error_kind),
        lambda: DeepSpeedReduceDescriptor(
            numel=numel,
            in_groups=in_groups,
            out_groups=out_groups,
            num_bits=num_bits,
            mode=mode,
            devices_per_node=devices_per_node,
            error_element=error_kind,
        ),
    )
    nbytes = chunk if num_bits == 8 else chunk // 2
    shape = tuple(q.shape)
    out_shape = (*shape[:-1], shape[-1] // devices_per_node) if shape and shape[-1] % devices_per_node == 0 else None
    learn = None
    if key is not None and q is input_vals and p is input_scales:  # replayed on the caller's arrays as they are
        learn = (key, 2, _codes_and_params, out_shape or (nbytes,))
    out, params = _run_coded(
        target_,
        plan,
        int(out_groups),
        mode,
        nbytes,
        numel,
        lambda out, params: DeepSpeedReduceArgs(
            target_.arg(flat(q)), target_.arg(p), target_.arg(out), target_.arg(params), target_.arg(error), err_beta
        ),
        learn,
    )
    return (out, params) if out_shape is None else (shaped(out, out_shape), params)


def quantized_reduction(
    input_vals: Any,
    input_scales: Any,
    in_groups: int,
    out_groups: int,
    num_bits: int,
    quant_type: Any,
    devices_per_node: int,
) -> tuple[Any, Any]:
    """DeepSpeed ``quantized_reduction(input_vals, input_scales, in_groups, out_groups, num_bits,
    quant_type, devices_per_node) -> (q, params)`` (ZeRO++ qgZ, after the intra-node all-to-all).

    Formula: ``input_vals`` holds ``devices_per_node`` consecutive chunks, chunk ``j`` using
    parameter rows ``[j * in_groups / dpn, (j + 1) * in_groups / dpn)``; each chunk is
    dequantized (``q * p0 (+ p1)``, float32), the chunks are summed in float32 in peer order
    (not averaged; DeepSpeed sums in fp16), and the sum is re-quantized with :func:`quantize`'s
    formula in ``out_groups`` groups.

    **When to use:** the intra-node reduce step of qgZ.

    **Dtypes:** int8 codes (4 bits: packed), float32 ``[in_groups, 1|2]`` parameters in;
    int8 codes and float32 ``[out_groups, 1|2]`` out.

    **Shape limits:** ``in_groups`` a multiple of ``devices_per_node`` dividing the element
    count; ``out_groups`` divides the reduced element count; any group sizes. The output keeps
    the input's shape with the last dimension divided by ``devices_per_node`` (flat if it does
    not divide).

    **Precision guarantee:** float32 dequantization and summation in a fixed order; deterministic.
    """
    signature = array_signature(input_vals, input_scales)  # a call like an earlier one: replayed
    key = (
        None
        if signature is None
        else (quantized_reduction, *signature, in_groups, out_groups, num_bits, quant_type, devices_per_node)
    )
    result = replayed(key, input_vals, input_scales)
    if result is not None:
        return result  # type: ignore[no-any-return]
    return _reduce(input_vals, input_scales, in_groups, out_groups, num_bits, quant_type, devices_per_node, key=key)


def loco_quantized_reduction(
    input_vals: Any,
    input_scales: Any,
    error_feedback: Any,
    err_beta: float,
    in_groups: int,
    out_groups: int,
    num_bits: int,
    quant_type: Any,
    devices_per_node: int,
) -> tuple[Any, Any]:
    """DeepSpeed ``loco_quantized_reduction(input_vals, input_scales, error_feedback, err_beta,
    in_groups, out_groups, num_bits, quant_type, devices_per_node) -> (q, params)``.

    Formula: :func:`quantized_reduction`'s sum ``s``; ``v = s + e`` (float32) is re-quantized;
    ``e <- (b * e) + (c * (v - dequant(q)))``, ``b = f32(err_beta)``, ``c = 1 - b``, in float32,
    rounded to the buffer's dtype. ``error_feedback`` holds one value per reduced element
    (``numel / devices_per_node``; float16 / bfloat16 / float32; contiguous) and is updated in place.

    **When to use:** qgZ with LoCo error compensation.

    **Dtypes / Shape limits:** as :func:`quantized_reduction`; ``err_beta`` in [0, 1].

    **Precision guarantee:** float32 arithmetic, deterministic.
    """
    return _reduce(
        input_vals,
        input_scales,
        in_groups,
        out_groups,
        num_bits,
        quant_type,
        devices_per_node,
        error_feedback,
        err_beta,
    )


# ---- MoQ fake quantization ----------------------------------------------------------------------------


def _moq(
    vals: Any,
    groups: int,
    bits: int,
    mode: QuantMode,
    rounding: Rounding,
    rng_seed: int | None,
    rng_offset: int | None,
    key: tuple[Any, ...] | None = None,
) -> Any:
    target_ = target(vals, names=_MOQ_NAMES)
    kind = _FLOAT_DTYPES.get(dtype_name(vals))
    if kind is None:
        raise InvalidProblem(f"vals has dtype {dtype_name(vals)}; pass float16, bfloat16 or float32")
    if not (type(groups) is int and type(bits) is int):
        _counts(groups=groups, bits=bits)
    if not target_.writable(vals):
        raise InvalidProblem("vals is read-only; the MoQ quantizers update it in place: pass a writeable array")
    numel = target_.numel(vals)
    stochastic = rounding is Rounding.STOCHASTIC
    plan = target_.plan(
        MoQFakeQuantizePlan,
        (numel, groups, bits, mode, rounding, kind),
        lambda: MoQFakeQuantizeDescriptor(
            numel=numel, groups=groups, num_bits=bits, mode=mode, rounding=rounding, element=kind
        ),
    )
    seed: int | None = None
    offset: int | None = None
    if stochastic:
        if rng_seed is None:
            seed, offset = _PHILOX.take(1)
        else:
            seed, offset = check_seed(rng_seed, "rng_seed"), check_seed(rng_offset or 0, "rng_offset")
    # In place on a contiguous buffer of vals' own dtype and size, seeds checked: unchecked run.
    work = target_.contiguous(vals)
    buffer = flat(work)
    view = target_.arg(buffer)
    args = MoQFakeQuantizeArgs(view, view, seed, offset)
    target_.run_with_workspace(plan, args, check=False)
    if work is not vals and not target_.is_contiguous(vals):
        target_.copy_into(vals, work)
    elif key is not None and numel:  # nearest rounding: replayed in place on the caller's array
        remember_replay(key, target_, lambda: replay(target_, plan, args, 1, [], _first, ("x0", "x0")))
    return vals


def _first(vals: Any) -> Any:
    """A replayed in-place call's result: the array it updated."""
    return vals


_NEAREST, _STOCHASTIC = Rounding.NEAREST_EVEN, Rounding.STOCHASTIC
_MOQ_FORMULAS = {
    (QuantMode.SYMMETRIC, _NEAREST): "``scale = 2**b / ((2 * absmax) + 1e-5)``; "
    "``q = clamp(rne(x * scale), -2**(b-1), 2**(b-1) - 1)``; ``x <- q / scale``.",
    (
        QuantMode.SYMMETRIC,
        _STOCHASTIC,
    ): "``scale = 2**b / ((2 * absmax) + 1e-5)``; ``w = x * scale``, ``t = trunc(w)``; "
    "``q = clamp(t + sign(w) * (u < |w - t|), -2**(b-1), 2**(b-1) - 1)``; ``x <- q / scale``.",
    (QuantMode.ASYMMETRIC, _NEAREST): "``step = ((max - min) + 1e-5) / 2**b``; "
    "``q = round_half_away((x - min) / step)`` (no clamp: the group maximum may reach ``2**b``, as in "
    "DeepSpeed); ``x <- (q * step) + min``.",
    (QuantMode.ASYMMETRIC, _STOCHASTIC): "``step = ((max - min) + 1e-5) / 2**b``; ``w = (x - min) / step``; "
    "``q = floor(w) + (u < w - floor(w))`` (no clamp); ``x <- (q * step) + min``.",
}
_MOQ_UNIFORM = """``u``: SPEC section 4's Philox uniform of flat element ``i``, key = the module seed
    (:func:`manual_seed`) and counter offset advanced by one per call, or ``rng_seed`` /
    ``rng_offset`` when given (then the module state is left alone)."""


def _moq_function(name: str, mode: QuantMode, rounding: Rounding, fixed: str) -> Callable[..., Any]:
    """One of DeepSpeed's eight MoQ fake-quant entry points (``ds_[sr_]quantize[_asym]_fp16/32``):
    the same computation for the ``_fp16`` and ``_fp32`` names (the dtype comes from ``vals``)."""
    stochastic = rounding is Rounding.STOCHASTIC
    width = name.rsplit("_", 1)[1].replace("fp", "float")
    kind = f"{'stochastic' if stochastic else 'nearest'} {'symmetric' if mode is QuantMode.SYMMETRIC else 'asymmetric'}"
    sections = [
        f"DeepSpeed ``{name}(vals, groups, bits) -> vals``: MoQ fake quantization ({kind}), in place.",
        "Formula, per group of ``vals.size / groups`` contiguous elements (float32, each operation\n"
        "    rounded once, result rounded to ``vals``' dtype; a group holding NaN / +-Inf comes out NaN):\n    "
        + _MOQ_FORMULAS[mode, rounding],
        *([_MOQ_UNIFORM] if stochastic else []),
        *([f"Fixed: {fixed}"] if fixed else []),
        f"**When to use:** MoQ quantization-aware training ({width} weights in DeepSpeed; here any of\n"
        "    float16 / bfloat16 / float32, computed in ``vals``' own dtype).",
        "**Dtypes:** float16, bfloat16 or float32 NumPy ``vals``, updated in place and returned.",
        "**Shape limits:** ``groups`` divides ``vals.size``; any group size; ``bits`` 1 to 8.",
        "**Precision guarantee:** float32 arithmetic, deterministic"
        + (" for a given seed and offset." if stochastic else "."),
    ]

    def moq(vals: Any, groups: int, bits: int, *, rng_seed: int | None = None, rng_offset: int | None = None) -> Any:
        if not stochastic and (rng_seed is not None or rng_offset is not None):
            raise InvalidProblem(f"{name} rounds to nearest; rng_seed / rng_offset apply only to ds_sr_* functions")
        if stochastic:  # every call draws new Philox numbers: no replay
            return _moq(vals, groups, bits, mode, rounding, rng_seed, rng_offset)
        signature = array_signature(vals)  # a call like an earlier one: replayed
        key = None if signature is None else (moq, *signature, groups, bits)
        result = replayed(key, vals)
        if result is not None:
            return result
        return _moq(vals, groups, bits, mode, rounding, rng_seed, rng_offset, key)

    moq.__name__ = moq.__qualname__ = name
    moq.__doc__ = "\n\n    ".join(sections) + "\n    "
    return moq


_SR_ASYM_FIX = "DeepSpeed's launcher runs the symmetric kernel here; this runs the asymmetric formula."
ds_quantize_fp16 = _moq_function("ds_quantize_fp16", QuantMode.SYMMETRIC, _NEAREST, "")
ds_quantize_fp32 = _moq_function(
    "ds_quantize_fp32",
    QuantMode.SYMMETRIC,
    _NEAREST,
    "DeepSpeed's float32 variant returns the integer codes ``q``; this one returns ``q / scale``.",
)
ds_sr_quantize_fp16 = _moq_function("ds_sr_quantize_fp16", QuantMode.SYMMETRIC, _STOCHASTIC, "")
ds_sr_quantize_fp32 = _moq_function("ds_sr_quantize_fp32", QuantMode.SYMMETRIC, _STOCHASTIC, "")
ds_quantize_asym_fp16 = _moq_function("ds_quantize_asym_fp16", QuantMode.ASYMMETRIC, _NEAREST, "")
ds_quantize_asym_fp32 = _moq_function("ds_quantize_asym_fp32", QuantMode.ASYMMETRIC, _NEAREST, "")
ds_sr_quantize_asym_fp16 = _moq_function("ds_sr_quantize_asym_fp16", QuantMode.ASYMMETRIC, _STOCHASTIC, _SR_ASYM_FIX)
ds_sr_quantize_asym_fp32 = _moq_function("ds_sr_quantize_asym_fp32", QuantMode.ASYMMETRIC, _STOCHASTIC, _SR_ASYM_FIX)


__all__ = [
    "Asymmetric",
    "QuantizationType",
    "Symmetric",
    "clear_plan_cache",
    "dequantize",
    "dequantize_fp32",
    "ds_quantize_asym_fp16",
    "ds_quantize_asym_fp32",
    "ds_quantize_fp16",
    "ds_quantize_fp32",
    "ds_sr_quantize_asym_fp16",
    "ds_sr_quantize_asym_fp32",
    "ds_sr_quantize_fp16",
    "ds_sr_quantize_fp32",
    "loco_quantized_reduction",
    "loco_swizzle_quant",
    "manual_seed",
    "quantize",
    "quantized_reduction",
    "swizzle_quant",
]
