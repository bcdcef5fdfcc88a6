"""Bad input, table-driven (SPEC section 7, README "Errors"): one table of mistakes over every plan and
public entry point, run with NumPy operands on the reference backend (CI) and, on a GPU machine, with
CuPy arrays and PyTorch CUDA tensors on the CUDA backend.

Each case starts from a valid call (random ragged data, every output filled with a sentinel), applies
ONE mistake and checks, for every entry point the mistake reaches (``can_implement`` and ``run`` for
argument mistakes, descriptor construction + ``select`` for descriptor mistakes, the function for
``quantplan.compat.deepspeed`` / ``quantplan.pytorch``):

* the exception is a ``qp.QuantPlanError`` of the documented class (InvalidProblem, MisalignedOperand,
  Unsupported, WorkspaceTooSmall; a subclass of the expected class is fine);
* its message contains a fragment naming the operand or the rule (``Case.fragment``, a regular
  expression; :func:`all_of` requires several words in any order);
* every watched operand (outputs, in-place buffers, whole buffers behind overlapping views) holds
  exactly the bytes it held before the call.

The valid baselines the cases start from are themselves checked to run and write (``test_baseline_runs``),
so every case is exactly one mistake away from a call that works.

A case is written once: operands are made by a per-backend factory (:class:`Ops`) from NumPy data.
Mistakes that a library cannot express are skipped on that backend with the reason (CuPy / PyTorch
have no read-only arrays; PyTorch has no negative strides nor misaligned element views).
"""

from __future__ import annotations

import importlib.util
import math
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from helpers import random_codes, random_floats, random_scale

import quantplan as qp
from quantplan.vocabulary.types import ElementKind as EK

ASYM = qp.QuantMode.ASYMMETRIC
STOCHASTIC = qp.Rounding.STOCHASTIC
IP = qp.InvalidProblem
IAT = qp.InvalidArgumentType
MO = qp.MisalignedOperand
UNS = qp.Unsupported
WTS = qp.WorkspaceTooSmall

#: Byte every output (and every buffer behind overlapping views) is filled with before a call.
SENTINEL_BYTE = 0x4D
SENTINEL = {np.dtype(np.int8): 77, np.dtype(np.uint8): 77, np.dtype(np.int32): 77}
HAS_TORCH = importlib.util.find_spec("torch") is not None
ALL = ("numpy", "cupy", "torch")


def all_of(*patterns: str) -> str:
    """A regular expression matching a message that contains every pattern, in any order."""
    return "".join(f"(?=.*(?:{p}))" for p in patterns)


def overlap_msg(a: str, b: str) -> str:
    return all_of(rf"\b{a}\b", rf"\b{b}\b", "overlap")


# =====================================================================================================
# Operands per backend
# =====================================================================================================


class Ops:
    """Makes operands of one backend from NumPy data: ``numpy`` (reference plans), ``cupy`` and
    ``torch`` (CUDA plans). ``pref`` is the PlanPreference that selects the backend."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.pref = qp.PlanPreference(backend=qp.BackendKind.REFERENCE if name == "numpy" else qp.BackendKind.CUDA)

    # ---- conversions --------------------------------------------------------------------------

    def asarray(self, a: np.ndarray) -> Any:
        a = np.ascontiguousarray(a)
        if self.name == "numpy":
            return a.copy()
        raw = _raw_view(a)
        if self.name == "cupy":
            import cupy

            return cupy.asarray(raw)
        import torch

        t = torch.from_numpy(raw.copy()).cuda()
        if a.dtype != raw.dtype:  # bfloat16 travels as int16 bits
            t = t.view(torch.bfloat16)
        return t

    def value(self, v: Any) -> Any:
        """A field value on this backend (arrays converted, anything else as is)."""
        return self.asarray(v) if isinstance(v, np.ndarray) else v

    def is_array(self, v: Any) -> bool:
        if isinstance(v, np.ndarray):
            return True
        module = type(v).__module__
        return module.startswith("cupy") or module.startswith("torch")

    def snapshot(self, a: Any) -> bytes:
        """The bytes of ``a`` (C order), to compare before and after a call."""
        if isinstance(a, np.ndarray):
            return np.ascontiguousarray(a).tobytes()
        module = type(a).__module__
        if module.startswith("cupy"):
            import cupy

            if a.flags.c_contiguous:  # as raw bytes: a misaligned element view faults in CuPy's own copy kernel
                return bytes(cupy.asnumpy(cupy.ndarray((a.nbytes,), cupy.uint8, a.data)).tobytes())
            return bytes(cupy.asnumpy(cupy.ascontiguousarray(a)).tobytes())
        import torch

        flat = a.detach().reshape(-1).contiguous().cpu()
        return bytes(flat.view(torch.uint8).numpy().tobytes())

    # ---- layouts ------------------------------------------------------------------------------

    def buffer(self, nbytes: int) -> Any:
        return self.asarray(np.full(nbytes, SENTINEL_BYTE, np.uint8))

    def carve(self, buf: Any, offset: int, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        """A view of ``shape`` / ``dtype`` on ``buf`` (uint8) starting ``offset`` bytes in."""
        dtype = np.dtype(dtype)
        n = math.prod(shape) * dtype.itemsize
        piece = buf[offset : offset + n]
        if self.name == "torch":
            import torch

            return piece.view(_TORCH_DTYPES[dtype.name](torch)).reshape(shape)
        if self.name == "cupy":
            return piece.view(_raw_view(np.zeros(0, dtype)).dtype).reshape(shape)
        return piece.view(dtype).reshape(shape)

    def write(self, view: Any, data: np.ndarray) -> None:
        """Copy NumPy ``data`` into a backend view (used to put valid data into carved views)."""
        if self.name == "numpy":
            view[...] = data
        elif self.name == "cupy":
            import cupy

            if view.flags.c_contiguous:  # byte for byte: CuPy's element copy faults on a misaligned view
                raw = cupy.ndarray((view.nbytes,), cupy.uint8, view.data)
                raw[...] = cupy.asarray(np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8))
            else:
                view[...] = cupy.asarray(_raw_view(np.ascontiguousarray(data)))
        else:
            view.copy_(self.asarray(data))

    def noncontiguous(self, data: np.ndarray) -> tuple[Any, Any]:
        """``data`` as every other element of a twice-as-wide array: (view, base)."""
        wide = np.zeros((*data.shape[:-1], 2 * data.shape[-1]), data.dtype)
        wide[..., ::2] = data
        base = self.asarray(wide)
        return base[..., ::2], base

    def reversed_last_axis(self, data: np.ndarray) -> tuple[Any, Any]:
        """``data`` held with a negative last stride: (view, base)."""
        if self.name == "torch":
            pytest.skip("PyTorch tensors cannot have negative strides")
        base = self.asarray(np.ascontiguousarray(data[..., ::-1]))
        return base[..., ::-1], base

    def misaligned(self, data: np.ndarray) -> tuple[Any, Any]:
        """``data`` in a view whose pointer is 1 byte off its element alignment: (view, base)."""
        if self.name == "torch":
            pytest.skip("PyTorch refuses element views at a misaligned storage offset")
        buf = self.buffer(data.nbytes + 16)
        try:
            view = self.carve(buf, 1, data.shape, data.dtype)
        except (TypeError, ValueError) as exc:  # a library may refuse the view itself
            pytest.skip(f"{self.name} refuses a misaligned element view: {exc}")
        self.write(view, data)
        return view, buf

    def readonly(self, data: np.ndarray) -> Any:
        if self.name != "numpy":
            pytest.skip(f"{self.name} arrays have no read-only flag")
        a = data.copy()
        a.setflags(write=False)
        return a

    def foreign(self, data: np.ndarray) -> Any:
        """``data`` in memory this backend's plans do not take: a PyTorch CPU tensor for the
        reference backend, a host (NumPy) array for the CUDA backend."""
        if self.name == "numpy":
            if not HAS_TORCH:
                pytest.skip("PyTorch is not installed")
            import torch

            return torch.from_numpy(data.copy())
        return data.copy()

    def workspace(self, nbytes: int, device: bool | None = None) -> qp.Workspace | None:
        on_device = self.name != "numpy" if device is None else device
        return qp.Workspace.allocate(nbytes, device=on_device)

    # ---- PyTorch front-end tensors ------------------------------------------------------------

    def tensor(self, data: np.ndarray) -> Any:
        """A PyTorch tensor for ``quantplan.pytorch``: CPU (numpy backend) or CUDA (torch backend)."""
        if self.name == "cupy":
            pytest.skip("quantplan.pytorch takes PyTorch tensors (covered by the torch backend)")
        if not HAS_TORCH:
            pytest.skip("PyTorch is not installed")
        import torch

        t = torch.from_numpy(np.ascontiguousarray(data).copy())
        return t if self.name == "numpy" else t.cuda()


_TORCH_DTYPES: dict[str, Callable[[Any], Any]] = {
    "float16": lambda t: t.float16,
    "float32": lambda t: t.float32,
    "float64": lambda t: t.float64,
    "int8": lambda t: t.int8,
    "uint8": lambda t: t.uint8,
    "int32": lambda t: t.int32,
    "int64": lambda t: t.int64,
}


def _raw_view(a: np.ndarray) -> np.ndarray:
    """bfloat16 / float8 arrays as their raw bits (CuPy has neither dtype)."""
    if a.dtype.itemsize == 2 and a.dtype.kind not in "fiu":
        return a.view(np.uint16)
    if a.dtype.itemsize == 1 and a.dtype.kind not in "iu":
        return a.view(np.uint8)
    return a


@dataclass
class Env:
    """What a case builder gets: the backend's operand factory and a seeded generator."""

    ops: Ops
    rng: np.random.Generator

    @property
    def pref(self) -> qp.PlanPreference:
        return self.ops.pref


# =====================================================================================================
# Valid baselines: one per plan configuration
# =====================================================================================================


@dataclass
class Setup:
    """A valid call: the plan class and descriptor, the Args class, the fields (NumPy data for arrays,
    plain values otherwise), which fields the plan writes, and an Args object of a different class."""

    plan_cls: Any
    desc: Any
    args_cls: Any
    host: dict[str, Any]
    outputs: tuple[str, ...]
    #: fields the plan reads and writes (LoCo error buffers): valid data, not a sentinel
    inouts: tuple[str, ...] = ()
    wrong_args: Callable[[dict[str, Any]], Any] | None = None

    def written(self) -> tuple[str, ...]:
        return self.outputs + self.inouts


def _floats(rng: np.random.Generator, shape: tuple[int, ...], kind: EK = EK.F32) -> np.ndarray:
    return random_floats(rng, shape, kind)


def _sentinel(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    dtype = np.dtype(dtype)
    return np.full(shape, SENTINEL.get(dtype, 77.0), dtype)


def _scale(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return random_scale(rng, shape, qp.MathPrecision.F32)


def _zp(rng: np.random.Generator, shape: tuple[int, ...], lo: int, hi: int) -> np.ndarray:
    return rng.integers(lo, hi + 1, size=shape).astype(np.int32)


def _code_dtype(kind: EK) -> Any:
    """Storage dtype of codes: int8 for S8, uint8 for U8 and the packed kinds."""
    return np.int8 if kind is EK.S8 else np.uint8


SHAPE = (5, 37)  # ragged: neither extent a multiple of 8


def _factory(cls: Any, **defaults: Any) -> Callable[..., Any]:
    """A descriptor maker: ``cls`` with ``defaults`` (a valid problem), each keyword replacing one."""

    def make(**kw: Any) -> Any:
        return cls(**{**defaults, **kw})

    make.__name__ = f"make_{cls.__name__}"
    return make


_AFFINE = dict(shape=SHAPE, scope=qp.TokenScope())
_FAKE = dict(shape=SHAPE, scope=qp.TokenScope(), element=EK.F32)
qd = _factory(qp.QuantizeDescriptor, **_AFFINE, input_element=EK.F32, output_element=EK.S8)
dd = _factory(qp.DequantizeDescriptor, **_AFFINE, input_element=EK.S8, output_element=EK.F32)
qbd = _factory(qp.QuantizeBackwardDescriptor, **_AFFINE, input_element=EK.F32, output_element=EK.S8)
dbd = _factory(qp.DequantizeBackwardDescriptor, **_AFFINE, input_element=EK.S8, output_element=EK.F32)
drd = _factory(qp.DynamicRangeQuantizeDescriptor, **_AFFINE, input_element=EK.F32, output_element=EK.S8)
fqd = _factory(qp.FakeQuantizeDescriptor, **_FAKE, q_min=-128, q_max=127)
fqbd = _factory(qp.FakeQuantizeBackwardDescriptor, **_FAKE, q_min=-128, q_max=127)
dfd = _factory(qp.DynamicRangeFakeQuantizeDescriptor, **_FAKE, bits=8)
# 120 elements = 2 nodes x 2 devices x 6 groups of 5 (odd group size, ragged rows)
sqd = _factory(
    qp.SwizzledQuantizeDescriptor,
    shape=(3, 40),
    group_size=5,
    nodes=2,
    devices_per_node=2,
    input_element=EK.F32,
    output_element=EK.S8,
)
# 3 peers x 30 elements, input groups of 5, output groups of 6
rdd = _factory(
    qp.DequantReduceDescriptor,
    peers=3,
    chunk_elements=30,
    input_group_size=5,
    output_group_size=6,
    input_element=EK.S8,
    output_element=EK.S8,
)
# block-scaled: MXFP8 e4m3 blocks of 32 along the last axis (37: a partial last block)
bsd = _factory(qp.BlockScaledQuantizeDescriptor, shape=SHAPE, format="mxfp8_e4m3", input_element=EK.F32)


def _static_params(rng: np.random.Generator, d: Any, host: dict[str, Any], zp_range: tuple[int, int]) -> None:
    """``scale`` (and ``zero_point`` for ASYMMETRIC) of a static plan: Python scalars for TensorScope."""
    scalar = isinstance(d.scope, qp.TensorScope)
    host["scale"] = 0.0371 if scalar else _scale(rng, d.param_shape)
    if getattr(d, "mode", None) is ASYM:
        host["zero_point"] = 3 if scalar else _zp(rng, d.param_shape, *zp_range)


def _computed_params(d: Any, host: dict[str, Any], outputs: tuple[str, ...]) -> tuple[str, ...]:
    """``scale_out`` (``zero_point_out`` for ASYMMETRIC) and the seeds of STOCHASTIC rounding of a
    dynamic-range plan; returns ``outputs`` with the parameter outputs added."""
    host["scale_out"] = _sentinel(d.param_shape, np.float32)
    outputs += ("scale_out",)
    if d.mode is ASYM:
        host["zero_point_out"] = _sentinel(d.param_shape, np.int32)
        outputs += ("zero_point_out",)
    if getattr(d, "rounding", None) is STOCHASTIC:
        host["rng_seed"], host["rng_offset"] = 1234, 5
    return outputs


def _loco(rng: np.random.Generator, d: Any, host: dict[str, Any], shape: tuple[int, ...]) -> tuple[str, ...]:
    """LoCo ``error_feedback`` (valid small errors, read and written) and ``error_beta`` when the descriptor has them."""
    if d.error_element is None:
        return ()
    host["error_feedback"] = (_floats(rng, shape) * np.float32(0.01)).astype(np.float32)
    host["error_beta"] = 0.5
    return ("error_feedback",)


def setup_quantize(rng: np.random.Generator, **kw: Any) -> Setup:
    d = qd(**kw)
    host: dict[str, Any] = dict(
        input=_floats(rng, d.shape), output=_sentinel(d.output_shape, _code_dtype(d.output_element))
    )
    _static_params(rng, d, host, (0, 20))
    if d.rounding is STOCHASTIC:
        host["rng_seed"], host["rng_offset"] = 1234, 5
    return Setup(
        qp.QuantizePlan,
        d,
        qp.QuantizeArgs,
        host,
        ("output",),
        wrong_args=lambda v: qp.DequantizeArgs(v["input"], v["output"], v["scale"], v.get("zero_point")),
    )


def setup_dequantize(rng: np.random.Generator, **kw: Any) -> Setup:
    d = dd(**kw)
    host: dict[str, Any] = dict(
        input=random_codes(rng, d.shape, d.input_element), output=_sentinel(d.output_shape, np.float32)
    )
    _static_params(rng, d, host, (-20, 20))
    return Setup(
        qp.DequantizePlan,
        d,
        qp.DequantizeArgs,
        host,
        ("output",),
        wrong_args=lambda v: qp.QuantizeArgs(v["input"], v["output"], v["scale"], v.get("zero_point")),
    )


def setup_quantize_backward(rng: np.random.Generator, **kw: Any) -> Setup:
    d = qbd(**kw)
    host: dict[str, Any] = dict(
        input=_floats(rng, d.shape), grad_output=_floats(rng, d.shape), grad_input=_sentinel(d.shape, np.float32)
    )
    _static_params(rng, d, host, (-20, 20))
    return Setup(
        qp.QuantizeBackwardPlan,
        d,
        qp.QuantizeBackwardArgs,
        host,
        ("grad_input",),
        wrong_args=lambda v: qp.FakeQuantizeBackwardArgs(v["input"], v["grad_output"], v["grad_input"], v["scale"]),
    )


def setup_dequantize_backward(rng: np.random.Generator, **kw: Any) -> Setup:
    d = dbd(**kw)
    host: dict[str, Any] = dict(grad_output=_floats(rng, d.shape), grad_input=_sentinel(d.shape, np.float32))
    host["scale"] = 0.0371 if isinstance(d.scope, qp.TensorScope) else _scale(rng, d.param_shape)
    return Setup(
        qp.DequantizeBackwardPlan,
        d,
        qp.DequantizeBackwardArgs,
        host,
        ("grad_input",),
        wrong_args=lambda v: qp.FakeQuantizeArgs(v["grad_output"], v["grad_input"], v["scale"]),
    )


def setup_dynamic_range(rng: np.random.Generator, **kw: Any) -> Setup:
    d = drd(**kw)
    host: dict[str, Any] = dict(
        input=_floats(rng, d.shape), output=_sentinel(d.output_shape, _code_dtype(d.output_element))
    )
    outputs = _computed_params(d, host, ("output",))
    return Setup(
        qp.DynamicRangeQuantizePlan,
        d,
        qp.DynamicRangeQuantizeArgs,
        host,
        outputs,
        wrong_args=lambda v: qp.DynamicRangeFakeQuantizeArgs(v["input"], v["output"], v["scale_out"]),
    )


def setup_fake_quantize(rng: np.random.Generator, **kw: Any) -> Setup:
    d = fqd(**kw)
    host: dict[str, Any] = dict(input=_floats(rng, d.shape), output=_sentinel(d.shape, np.float32))
    _static_params(rng, d, host, (d.q_min, d.q_max))
    return Setup(
        qp.FakeQuantizePlan,
        d,
        qp.FakeQuantizeArgs,
        host,
        ("output",),
        wrong_args=lambda v: qp.QuantizeArgs(v["input"], v["output"], v["scale"], v.get("zero_point")),
    )


def setup_fake_quantize_backward(rng: np.random.Generator, **kw: Any) -> Setup:
    d = fqbd(**{"learnable": True, **kw})
    host: dict[str, Any] = dict(
        input=_floats(rng, d.shape), grad_output=_floats(rng, d.shape), grad_input=_sentinel(d.shape, np.float32)
    )
    scalar = isinstance(d.scope, qp.TensorScope) and not d.learnable
    host["scale"] = 0.0371 if scalar else _scale(rng, d.param_shape)
    outputs: tuple[str, ...] = ("grad_input",)
    if d.learnable:
        host["grad_scale"] = _sentinel(d.param_shape, np.float32)
        outputs += ("grad_scale",)
    if d.mode is ASYM:  # learnable zero points are floats
        host["zero_point"] = rng.uniform(d.q_min, d.q_max, size=d.param_shape).astype(np.float32)
        if d.learnable:
            host["grad_zero_point"] = _sentinel(d.param_shape, np.float32)
            outputs += ("grad_zero_point",)
    return Setup(
        qp.FakeQuantizeBackwardPlan,
        d,
        qp.FakeQuantizeBackwardArgs,
        host,
        outputs,
        wrong_args=lambda v: qp.QuantizeBackwardArgs(v["input"], v["grad_output"], v["grad_input"], v["scale"]),
    )


def setup_dynamic_fake(rng: np.random.Generator, **kw: Any) -> Setup:
    d = dfd(**kw)
    host: dict[str, Any] = dict(input=_floats(rng, d.shape), output=_sentinel(d.shape, np.float32))
    outputs = _computed_params(d, host, ("output",))
    return Setup(
        qp.DynamicRangeFakeQuantizePlan,
        d,
        qp.DynamicRangeFakeQuantizeArgs,
        host,
        outputs,
        wrong_args=lambda v: qp.DynamicRangeQuantizeArgs(v["input"], v["output"], v["scale_out"]),
    )


def setup_swizzled(rng: np.random.Generator, **kw: Any) -> Setup:
    d = sqd(**kw)
    host: dict[str, Any] = dict(
        input=_floats(rng, d.shape), output=_sentinel(d.output_shape, _code_dtype(d.output_element))
    )
    outputs = _computed_params(d, host, ("output",))
    inouts = _loco(rng, d, host, d.shape)
    return Setup(
        qp.SwizzledQuantizePlan,
        d,
        qp.SwizzledQuantizeArgs,
        host,
        outputs,
        inouts,
        wrong_args=lambda v: qp.DynamicRangeQuantizeArgs(v["input"], v["output"], v["scale_out"]),
    )


def setup_dequant_reduce(rng: np.random.Generator, **kw: Any) -> Setup:
    d = rdd(**kw)
    host: dict[str, Any] = dict(
        input=random_codes(rng, d.input_shape, d.input_element).view(_code_dtype(d.input_element)),
        scale=_scale(rng, d.input_param_shape),
        output=_sentinel(d.output_shape, _code_dtype(d.output_element)),
    )
    if d.mode is ASYM:
        host["zero_point"] = _zp(rng, d.input_param_shape, 0, 20)
    outputs = _computed_params(d, host, ("output",))
    inouts = _loco(rng, d, host, d.error_shape)
    return Setup(
        qp.DequantReducePlan,
        d,
        qp.DequantReduceArgs,
        host,
        outputs,
        inouts,
        wrong_args=lambda v: qp.DequantizeArgs(v["input"], v["output"], v["scale"]),
    )


def setup_block_scaled(rng: np.random.Generator, **kw: Any) -> Setup:
    d = bsd(**kw)
    host: dict[str, Any] = dict(
        input=_floats(rng, d.shape, d.input_element),
        codes=_sentinel(d.codes_shape, np.uint8),
        scales=_sentinel(d.scales_shape, d.scales_dtype),
    )
    outputs: tuple[str, ...] = ("codes", "scales")
    if d.tensor_scale_shape is not None:
        host["tensor_scale"] = _sentinel(d.tensor_scale_shape, np.float32)
        outputs += ("tensor_scale",)
    if d.columnwise is not None:
        host["columnwise_codes"] = _sentinel(d.columnwise_codes_shape, np.uint8)
        host["columnwise_scales"] = _sentinel(d.columnwise_scales_shape, d.scales_dtype)
        outputs += ("columnwise_codes", "columnwise_scales")
    return Setup(
        qp.BlockScaledQuantizePlan,
        d,
        qp.BlockScaledQuantizeArgs,
        host,
        outputs,
        wrong_args=lambda v: qp.DynamicRangeQuantizeArgs(v["input"], v["codes"], v["scales"]),
    )


SetupFn = Callable[..., Setup]
BASES: dict[str, tuple[SetupFn, dict[str, Any]]] = {
    "quantize": (setup_quantize, {}),
    "quantize.tensor": (setup_quantize, dict(scope=qp.TensorScope())),
    "quantize.asym": (setup_quantize, dict(mode=ASYM, output_element=EK.U8)),
    "quantize.asym_tensor": (setup_quantize, dict(mode=ASYM, output_element=EK.U8, scope=qp.TensorScope())),
    "quantize.stochastic": (setup_quantize, dict(rounding=STOCHASTIC)),
    "dequantize": (setup_dequantize, {}),
    "dequantize.tensor": (setup_dequantize, dict(scope=qp.TensorScope())),
    "quantize_backward": (setup_quantize_backward, {}),
    "quantize_backward.tensor": (setup_quantize_backward, dict(scope=qp.TensorScope())),
    "dequantize_backward": (setup_dequantize_backward, {}),
    "dequantize_backward.tensor": (setup_dequantize_backward, dict(scope=qp.TensorScope())),
    "dynamic_range": (setup_dynamic_range, {}),
    "dynamic_range.asym": (setup_dynamic_range, dict(mode=ASYM, output_element=EK.U8)),
    "dynamic_range.stochastic": (setup_dynamic_range, dict(rounding=STOCHASTIC)),
    "dynamic_range.channel0": (setup_dynamic_range, dict(scope=qp.ChannelScope(axis=0), shape=(300, 37))),
    "fake_quantize": (setup_fake_quantize, {}),
    "fake_quantize.tensor": (setup_fake_quantize, dict(scope=qp.TensorScope())),
    "fake_quantize.asym_tensor": (setup_fake_quantize, dict(scope=qp.TensorScope(), mode=ASYM, q_min=0, q_max=255)),
    "fake_quantize_backward": (setup_fake_quantize_backward, {}),
    "fake_quantize_backward.asym": (setup_fake_quantize_backward, dict(mode=ASYM, q_min=0, q_max=255)),
    "fake_quantize_backward.ste_tensor": (setup_fake_quantize_backward, dict(learnable=False, scope=qp.TensorScope())),
    "dynamic_fake": (setup_dynamic_fake, {}),
    "dynamic_fake.asym": (setup_dynamic_fake, dict(mode=ASYM)),
    "dynamic_fake.stochastic": (setup_dynamic_fake, dict(rounding=STOCHASTIC)),
    "dynamic_fake.channel0": (setup_dynamic_fake, dict(scope=qp.ChannelScope(axis=0), shape=(300, 37))),
    "swizzled": (setup_swizzled, {}),
    "swizzled.loco": (setup_swizzled, dict(mode=ASYM, output_element=EK.U8, error_element=EK.F32)),
    "dequant_reduce": (setup_dequant_reduce, {}),
    "dequant_reduce.loco": (
        setup_dequant_reduce,
        dict(mode=ASYM, input_element=EK.U8, output_element=EK.U8, error_element=EK.F32),
    ),
    "block_scaled": (setup_block_scaled, {}),
    "block_scaled.mxfp4_blocked": (
        setup_block_scaled,
        dict(shape=(6, 64), format="mxfp4", input_element=EK.BF16, scale_layout="blocked"),
    ),
    "block_scaled.fp8_column_major": (
        setup_block_scaled,
        dict(
            shape=(3, 256),
            format="fp8_block_e4m3",
            input_element=EK.F16,
            scale_layout="column_major",
            scale_mode="mul_rcp",
            amax_floor=1e-4,
        ),
    ),
    "block_scaled.fp8_ue8m0_packed": (
        setup_block_scaled,
        dict(shape=(2, 3, 300), format="fp8_block_e4m3_ue8m0", scale_layout="packed_ue8m0"),
    ),
    "block_scaled.fp8_tile": (
        setup_block_scaled,
        dict(shape=(130, 300), format="fp8_block_e4m3", block=(128, 128), scale_layout="column_major"),
    ),
    "block_scaled.mxfp8_transpose": (
        setup_block_scaled,
        dict(shape=(48, 64), format="mxfp8_e4m3", input_element=EK.BF16, columnwise="transposed"),
    ),
    "block_scaled.nvfp4_one_level_stochastic": (
        setup_block_scaled,
        dict(format="nvfp4", shape=(4, 40), input_element=EK.BF16, two_level=False, rounding=STOCHASTIC),
    ),
}


#: Valid baselines of plan configurations whose cases run on NumPy only, and which the fast-path
#: tests (which select on a simulated GPU) leave out: what the CUDA backend does not serve, and
#: NVFP4 two-level, whose CUDA launch also memsets the tensor amax in the workspace.
REFERENCE_BASES: dict[str, tuple[SetupFn, dict[str, Any]]] = {
    "block_scaled.nvfp4": (setup_block_scaled, dict(format="nvfp4", shape=(4, 40), input_element=EK.BF16)),
    "block_scaled.nvfp4_stochastic": (
        setup_block_scaled,
        dict(format="nvfp4", shape=(4, 40), rounding=STOCHASTIC, block=(16, 16), scale_layout="blocked"),
    ),
    "block_scaled.mx_axis0": (setup_block_scaled, dict(format="mxfp6_e3m2", shape=(70, 3), axis=0)),
}


def make_setup(base: str, rng: np.random.Generator) -> Setup:
    fn, kw = BASES[base] if base in BASES else REFERENCE_BASES[base]
    setup = fn(rng, **kw)
    if getattr(setup.desc, "rounding", None) is STOCHASTIC and isinstance(setup.desc, qp.BlockScaledQuantizeDescriptor):
        setup.host["rng_seed"], setup.host["rng_offset"] = 1234, 5
    return setup


# =====================================================================================================
# The table
# =====================================================================================================

Built = tuple[list[Callable[[], object]], list[Any]]


@dataclass(frozen=True)
class Case:
    """One mistake: ``build(env)`` returns the calls that must each raise ``error`` with a message
    matching ``fragment``, and the operands whose bytes must not change."""

    name: str
    build: Callable[[Env], Built]
    error: type[qp.QuantPlanError]
    fragment: str
    backends: tuple[str, ...] = ALL


class Tx:
    """A one-field mistake applied to the field's valid NumPy data: returns (value, extra operands to watch)."""

    def __init__(self, fn: Callable[[Env, Any], tuple[Any, list[Any]]]) -> None:
        self.fn = fn


def noncontig() -> Tx:
    return Tx(lambda env, data: (lambda v: (v[0], [v[1]]))(env.ops.noncontiguous(data)))


def negative_stride() -> Tx:
    return Tx(lambda env, data: (lambda v: (v[0], [v[1]]))(env.ops.reversed_last_axis(data)))


def misaligned() -> Tx:
    return Tx(lambda env, data: (lambda v: (v[0], [v[1]]))(env.ops.misaligned(data)))


def readonly() -> Tx:
    return Tx(lambda env, data: (lambda v: (v, [v]))(env.ops.readonly(data)))


def foreign() -> Tx:
    return Tx(lambda env, data: (env.ops.foreign(data), []))


def astype(dtype: Any) -> Tx:
    return Tx(lambda env, data: (lambda v: (v, [v]))(env.ops.asarray(np.asarray(data).astype(dtype))))


def reshaped(fn: Callable[[np.ndarray], np.ndarray]) -> Tx:
    return Tx(lambda env, data: (lambda v: (v, [v]))(env.ops.asarray(np.ascontiguousarray(fn(np.asarray(data))))))


def tolist() -> Tx:
    return Tx(lambda env, data: (np.asarray(data).tolist(), []))


def host_value(v: Any) -> Tx:
    """A NumPy value converted to the backend (e.g. a seed array)."""
    return Tx(lambda env, data: (env.ops.value(v), []))


@dataclass(frozen=True)
class Overlap:
    """Fields ``a`` and ``b`` as views of one buffer, ``b`` starting ``shift`` bytes after ``a``
    (aligned for both, so only the overlap is wrong)."""

    a: str
    b: str
    shift: int = 16


def _apply_overlap(env: Env, setup: Setup, values: dict[str, Any], ov: Overlap) -> list[Any]:
    da, db = np.asarray(setup.host[ov.a]), np.asarray(setup.host[ov.b])
    buf = env.ops.buffer(max(da.nbytes, ov.shift + db.nbytes) + 64)
    va = env.ops.carve(buf, 0, da.shape, da.dtype)
    vb = env.ops.carve(buf, ov.shift, db.shape, db.dtype)
    # outputs keep the buffer's sentinel bytes; fields the plan reads get their valid data
    for name, view, data in ((ov.a, va, da), (ov.b, vb, db)):
        if name not in setup.outputs:
            env.ops.write(view, data)
    values[ov.a], values[ov.b] = va, vb
    return [buf]


NOTSET: Any = object()


def arg_case(
    name: str,
    base: str,
    error: type[qp.QuantPlanError],
    fragment: str,
    *,
    fields: dict[str, Any] | None = None,
    overlap: Overlap | None = None,
    args: Callable[[Setup, dict[str, Any]], Any] | None = None,
    workspace: Callable[[Env, Any], Any] = NOTSET,
    stream: Any = None,
    entries: tuple[str, ...] = ("can_implement", "run"),
    backends: tuple[str, ...] = ALL,
) -> Case:
    """A mistake in the arguments of a valid plan: ``fields`` replaces Args fields (a value, or a
    :class:`Tx` applied to the field's valid data), ``overlap`` lays two fields on one buffer,
    ``args`` replaces the Args object, ``workspace`` / ``stream`` replace run's other arguments."""
    fields = fields or {}
    if workspace is not NOTSET or stream is not None:
        entries = ("run",)

    def build(env: Env) -> Built:
        setup = make_setup(base, env.rng)
        plan = setup.plan_cls.select(None, setup.desc, env.pref)
        values = {k: env.ops.value(v) for k, v in setup.host.items()}
        watched_extra: list[Any] = []
        for key, v in fields.items():
            if isinstance(v, Tx):
                value, extra = v.fn(env, setup.host.get(key))
                values[key] = value
                watched_extra += extra
            else:
                values[key] = v
        if overlap is not None:
            watched_extra += _apply_overlap(env, setup, values, overlap)
        watched = [values[k] for k in setup.written() if k in values and env.ops.is_array(values[k])]
        watched += [w for w in watched_extra if env.ops.is_array(w)]
        a = setup.args_cls(**values) if args is None else args(setup, values)
        ws = None if workspace is NOTSET else workspace(env, plan)
        calls: list[Callable[[], object]] = []
        if "can_implement" in entries:
            calls.append(lambda: plan.can_implement(a))
        if "run" in entries:
            calls.append(lambda: plan.run(stream, ws, a))
        return calls, watched

    return Case(name, build, error, fragment, backends)


def select_case(
    name: str,
    plan_cls: Any,
    make_desc: Callable[[], Any],
    error: type[qp.QuantPlanError],
    fragment: str,
    *,
    stream: Any = None,
    pref: Any = NOTSET,
    backends: tuple[str, ...] = ALL,
) -> Case:
    """A mistake in the descriptor (constructed inside the call, so its validation counts) or in
    select's other arguments."""

    def build(env: Env) -> Built:
        p = env.pref if pref is NOTSET else pref
        return [lambda: plan_cls.select(stream, make_desc(), p)], []

    return Case(name, build, error, fragment, backends)


def call_case(
    name: str,
    build: Callable[[Env], Built],
    error: type[qp.QuantPlanError],
    fragment: str,
    backends: tuple[str, ...] = ALL,
) -> Case:
    return Case(name, build, error, fragment, backends)


# ---- mistakes every plan shares ---------------------------------------------------------------------

#: base, the main input, the main output, a field whose elements are wider than one byte
PLANS: list[tuple[str, str, str, str]] = [
    ("quantize", "input", "output", "input"),
    ("dequantize", "input", "output", "output"),
    ("quantize_backward", "grad_output", "grad_input", "grad_input"),
    ("dequantize_backward", "grad_output", "grad_input", "grad_input"),
    ("dynamic_range", "input", "output", "scale_out"),
    ("fake_quantize", "input", "output", "output"),
    ("fake_quantize_backward", "grad_output", "grad_input", "grad_input"),
    ("dynamic_fake", "input", "output", "output"),
    ("swizzled", "input", "output", "scale_out"),
    ("dequant_reduce", "input", "output", "scale_out"),
    ("block_scaled", "input", "codes", "input"),
]

ARGS_CLASS = {
    "quantize": "QuantizeArgs",
    "dequantize": "DequantizeArgs",
    "quantize_backward": "QuantizeBackwardArgs",
    "dequantize_backward": "DequantizeBackwardArgs",
    "dynamic_range": "DynamicRangeQuantizeArgs",
    "fake_quantize": "FakeQuantizeArgs",
    "fake_quantize_backward": "FakeQuantizeBackwardArgs",
    "dynamic_fake": "DynamicRangeFakeQuantizeArgs",
    "swizzled": "SwizzledQuantizeArgs",
    "dequant_reduce": "DequantReduceArgs",
    "block_scaled": "BlockScaledQuantizeArgs",
}


def _wrong_args(setup: Setup, values: dict[str, Any]) -> Any:
    assert setup.wrong_args is not None
    return setup.wrong_args(values)


def _grow_last(a: np.ndarray) -> np.ndarray:
    return np.concatenate([a, a[..., :1]], axis=-1)


def common_cases(base: str, inp: str, out: str, wide: str) -> list[Case]:
    cls = ARGS_CLASS[base]
    return [
        # the Args object itself
        arg_case(f"{base}.args.wrong_class", base, IP, cls, args=_wrong_args),
        arg_case(f"{base}.args.dict", base, IP, cls, args=lambda s, v: dict(v)),
        arg_case(f"{base}.args.none", base, IP, cls, args=lambda s, v: None),
        arg_case(f"{base}.args.tuple", base, IP, cls, args=lambda s, v: tuple(v.values())),
        # run's other arguments
        arg_case(f"{base}.workspace.garbage_string", base, IP, "workspace", workspace=lambda e, p: "garbage"),
        arg_case(f"{base}.workspace.int", base, IP, "workspace", workspace=lambda e, p: 4096),
        arg_case(
            f"{base}.workspace.raw_array",
            base,
            IP,
            "workspace",
            workspace=lambda e, p: e.ops.asarray(np.zeros(4096, np.uint8)),
        ),
        arg_case(f"{base}.stream.garbage_string", base, IP, "stream", stream="garbage"),
        arg_case(f"{base}.stream.float", base, IP, "stream", stream=1.5),
        # the main input and output
        arg_case(f"{base}.{inp}.list", base, IP, inp, fields={inp: tolist()}),
        arg_case(f"{base}.{inp}.dict", base, IP, inp, fields={inp: {"data": 1}}),
        arg_case(f"{base}.{inp}.none", base, IP, inp, fields={inp: None}),
        arg_case(f"{base}.{inp}.wrong_dtype", base, IP, all_of(inp, "dtype"), fields={inp: astype(np.float16)}),
        arg_case(f"{base}.{inp}.wrong_shape", base, IP, all_of(inp, "shape"), fields={inp: reshaped(_grow_last)}),
        arg_case(f"{base}.{inp}.noncontiguous", base, MO, all_of(inp, "contiguous"), fields={inp: noncontig()}),
        arg_case(f"{base}.{inp}.foreign_memory", base, IP, inp, fields={inp: foreign()}),
        arg_case(f"{base}.{out}.none", base, IP, out, fields={out: None}),
        arg_case(f"{base}.{out}.list", base, IP, out, fields={out: tolist()}),
        arg_case(f"{base}.{out}.wrong_dtype", base, IP, all_of(out, "dtype"), fields={out: astype(np.float64)}),
        arg_case(
            f"{base}.{out}.wrong_shape",
            base,
            IP,
            all_of(out, "shape"),
            fields={out: reshaped(lambda a: a[np.newaxis])},
        ),
        arg_case(f"{base}.{out}.noncontiguous", base, MO, all_of(out, "contiguous"), fields={out: noncontig()}),
        arg_case(f"{base}.{out}.negative_stride", base, MO, out, fields={out: negative_stride()}),
        arg_case(
            f"{base}.{out}.readonly",
            base,
            IP,
            all_of(out, "read-only|writeable|writable"),
            fields={out: readonly()},
        ),
        arg_case(f"{base}.{out}.foreign_memory", base, IP, out, fields={out: foreign()}),
        arg_case(f"{base}.{wide}.misaligned", base, MO, all_of(wide, "align"), fields={wide: misaligned()}),
    ]


CASES: list[Case] = []
for _base, _inp, _out, _wide in PLANS:
    CASES += common_cases(_base, _inp, _out, _wide)


# ---- descriptors and select --------------------------------------------------------------------------

HUGE = all_of(r"2\*\*6[34]|64-bit|int64")
Q, D = qp.QuantizePlan, qp.DequantizePlan
QB, DB = qp.QuantizeBackwardPlan, qp.DequantizeBackwardPlan
DR, FQ, FQB, DF = (
    qp.DynamicRangeQuantizePlan,
    qp.FakeQuantizePlan,
    qp.FakeQuantizeBackwardPlan,
    qp.DynamicRangeFakeQuantizePlan,
)
SQ, RD = qp.SwizzledQuantizePlan, qp.DequantReducePlan

CASES += [
    # ---- QuantizePlan: code range, elements, scopes, sizes
    select_case("quantize.select.q_min_above_q_max", Q, lambda: qd(q_min=5, q_max=4), IP, all_of("q_min=5", "q_max=4")),
    select_case("quantize.select.q_min_below_s8", Q, lambda: qd(q_min=-129), IP, all_of("q_min=-129", "S8")),
    select_case("quantize.select.q_max_above_u8", Q, lambda: qd(output_element=EK.U8, q_max=256), IP, "U8"),
    # the S4 range error must give an S4 hint, not the int8 one
    select_case(
        "quantize.select.s4_q_max_8_hint",
        Q,
        lambda: qd(output_element=EK.S4, q_max=8),
        IP,
        r"^(?!.*int8)(?=.*S4)(?=.*-8)",
    ),
    select_case("quantize.select.u4_q_min_negative", Q, lambda: qd(output_element=EK.U4, q_min=-1), IP, "U4"),
    select_case("quantize.select.q_min_float", Q, lambda: qd(q_min=-127.5), IP, "q_min"),
    select_case(
        "quantize.select.fp8_asymmetric", Q, lambda: qd(output_element=EK.FP8_E4M3, mode=ASYM), IP, "symmetric"
    ),
    select_case("quantize.select.fp8_q_min", Q, lambda: qd(output_element=EK.FP8_E5M2, q_min=-10), IP, "q_min"),
    select_case("quantize.select.float_output", Q, lambda: qd(output_element=EK.F16), IP, "F16"),
    select_case("quantize.select.code_input", Q, lambda: qd(input_element=EK.S8), IP, "S8"),
    select_case("quantize.select.i32_output", Q, lambda: qd(output_element=EK.I32), IP, "I32"),
    select_case("quantize.select.element_string", Q, lambda: qd(output_element="int3"), IP, "output_element"),
    select_case("quantize.select.negative_extent", Q, lambda: qd(shape=(5, -1)), IP, "negative"),
    select_case("quantize.select.float_extent", Q, lambda: qd(shape=(5, 37.5)), IP, "shape"),
    select_case("quantize.select.shape_none", Q, lambda: qd(shape=None), IP, "shape"),
    select_case("quantize.select.shape_string", Q, lambda: qd(shape="5x37"), IP, "shape"),
    select_case("quantize.select.huge_1d", Q, lambda: qd(shape=(2**70,), scope=qp.TensorScope()), IP, HUGE),
    select_case("quantize.select.huge_2d", Q, lambda: qd(shape=(2**40, 2**40)), IP, HUGE),
    select_case("quantize.select.extra_field", Q, lambda: qd(bogus=1), IP, "bogus"),
    select_case(
        "quantize.select.group_not_dividing",
        Q,
        lambda: qd(scope=qp.GroupScope(group_size=5)),
        IP,
        all_of("group_size", "37"),
    ),
    select_case("quantize.select.group_size_zero", Q, lambda: qd(scope=qp.GroupScope(group_size=0)), IP, "group_size"),
    select_case(
        "quantize.select.group_size_negative", Q, lambda: qd(scope=qp.GroupScope(group_size=-5)), IP, "group_size"
    ),
    select_case(
        "quantize.select.group_size_huge", Q, lambda: qd(scope=qp.GroupScope(group_size=2**70)), IP, "group_size"
    ),
    select_case(
        "quantize.select.group_size_float", Q, lambda: qd(scope=qp.GroupScope(group_size=7.5)), IP, "group_size"
    ),
    select_case("quantize.select.channel_axis_2", Q, lambda: qd(scope=qp.ChannelScope(axis=2)), IP, "axis 2"),
    select_case("quantize.select.channel_axis_minus_3", Q, lambda: qd(scope=qp.ChannelScope(axis=-3)), IP, "axis -3"),
    select_case("quantize.select.group_axis_5", Q, lambda: qd(scope=qp.GroupScope(axis=5, group_size=1)), IP, "axis 5"),
    select_case("quantize.select.scope_dict", Q, lambda: qd(scope={"kind": "group"}), IP, "scope|group_size"),
    select_case("quantize.select.rank0_token", Q, lambda: qd(shape=()), IP, "rank"),
    select_case("quantize.select.descriptor_of_dequantize", Q, lambda: dd(), IP, "QuantizeDescriptor"),
    select_case("quantize.select.descriptor_none", Q, lambda: None, IP, "QuantizeDescriptor"),
    select_case("quantize.select.descriptor_dict", Q, lambda: dict(shape=SHAPE), IP, "QuantizeDescriptor"),
    select_case("quantize.select.preference_string", Q, qd, IP, "PlanPreference", pref="fast"),
    select_case("quantize.select.stream_string", Q, qd, IP, "stream", stream="garbage"),
    select_case(
        "quantize.select.cuda_without_gpu",
        Q,
        qd,
        UNS,
        "GPU",
        pref=qp.PlanPreference(backend=qp.BackendKind.CUDA),
        backends=("numpy",),
    ),
    # ---- DequantizePlan
    select_case("dequantize.select.float_input", D, lambda: dd(input_element=EK.F32), IP, "F32"),
    select_case("dequantize.select.code_output", D, lambda: dd(output_element=EK.S8), IP, "S8"),
    select_case(
        "dequantize.select.fp8_asymmetric", D, lambda: dd(input_element=EK.FP8_E4M3, mode=ASYM), IP, "symmetric"
    ),
    select_case("dequantize.select.huge", D, lambda: dd(shape=(2**70,), scope=qp.TensorScope()), IP, HUGE),
    select_case("dequantize.select.descriptor_of_quantize", D, lambda: qd(), IP, "DequantizeDescriptor"),
    # ---- QuantizeBackwardPlan / DequantizeBackwardPlan
    select_case("quantize_backward.select.q_min_above_q_max", QB, lambda: qbd(q_min=3, q_max=2), IP, "q_min=3"),
    select_case("quantize_backward.select.stochastic", QB, lambda: qbd(rounding=STOCHASTIC), UNS, "NEAREST_EVEN"),
    select_case(
        "quantize_backward.select.group_not_dividing",
        QB,
        lambda: qbd(scope=qp.GroupScope(group_size=4)),
        IP,
        "group_size",
    ),
    select_case("quantize_backward.select.huge", QB, lambda: qbd(shape=(2**64, 2)), IP, HUGE),
    select_case("dequantize_backward.select.float_input", DB, lambda: dbd(input_element=EK.F16), IP, "F16"),
    select_case(
        "dequantize_backward.select.axis_out_of_range", DB, lambda: dbd(scope=qp.ChannelScope(axis=7)), IP, "axis 7"
    ),
    # ---- DynamicRangeQuantizePlan
    select_case(
        "dynamic_range.select.fp8_asymmetric", DR, lambda: drd(output_element=EK.FP8_E4M3, mode=ASYM), IP, "symmetric"
    ),
    select_case("dynamic_range.select.symmetric_q_max_0", DR, lambda: drd(q_min=-8, q_max=0), IP, "q_max"),
    select_case("dynamic_range.select.asymmetric_one_code", DR, lambda: drd(mode=ASYM, q_min=5, q_max=5), IP, "q_min"),
    select_case("dynamic_range.select.float_output", DR, lambda: drd(output_element=EK.BF16), IP, "BF16"),
    select_case("dynamic_range.select.huge", DR, lambda: drd(shape=(2**70,), scope=qp.TensorScope()), IP, HUGE),
    # ---- FakeQuantizePlan / FakeQuantizeBackwardPlan
    select_case("fake_quantize.select.q_min_above_q_max", FQ, lambda: fqd(q_min=1, q_max=0), IP, "q_min=1"),
    select_case("fake_quantize.select.q_max_beyond_2_24", FQ, lambda: fqd(q_max=2**24 + 1), IP, r"2\*\*24"),
    select_case("fake_quantize.select.q_min_huge", FQ, lambda: fqd(q_min=-(2**70)), IP, "q_min"),
    select_case("fake_quantize.select.code_element", FQ, lambda: fqd(element=EK.U8), IP, "U8"),
    select_case(
        "fake_quantize.select.missing_q_max",
        FQ,
        lambda: qp.FakeQuantizeDescriptor(shape=SHAPE, scope=qp.TokenScope(), element=EK.F32, q_min=0),
        IP,
        "q_max",
    ),
    select_case("fake_quantize.select.huge", FQ, lambda: fqd(shape=(2**64,), scope=qp.TensorScope()), IP, HUGE),
    select_case(
        "fake_quantize_backward.select.learnable_channel_not_contiguous",
        FQB,
        lambda: fqbd(scope=qp.ChannelScope(axis=-1), learnable=True),
        UNS,
        "contiguous",
    ),
    select_case(
        "fake_quantize_backward.select.learnable_string", FQB, lambda: fqbd(learnable="maybe"), IP, "learnable"
    ),
    # ---- DynamicRangeFakeQuantizePlan
    select_case("dynamic_fake.select.bits_0", DF, lambda: dfd(bits=0), IP, "bits"),
    select_case("dynamic_fake.select.bits_9", DF, lambda: dfd(bits=9), IP, "bits"),
    select_case("dynamic_fake.select.bits_negative", DF, lambda: dfd(bits=-1), IP, "bits"),
    select_case("dynamic_fake.select.bits_huge", DF, lambda: dfd(bits=2**70), IP, "bits"),
    select_case("dynamic_fake.select.bits_float", DF, lambda: dfd(bits=4.5), IP, "bits"),
    select_case("dynamic_fake.select.symmetric_1_bit", DF, lambda: dfd(bits=1), IP, "bits"),
    select_case("dynamic_fake.select.code_element", DF, lambda: dfd(element=EK.S4), IP, "S4"),
    select_case(
        "dynamic_fake.select.group_not_dividing", DF, lambda: dfd(scope=qp.GroupScope(group_size=2)), IP, "group_size"
    ),
    select_case("dynamic_fake.select.huge", DF, lambda: dfd(shape=(2**70,), scope=qp.TensorScope()), IP, HUGE),
    # ---- SwizzledQuantizePlan
    select_case("swizzled.select.group_size_0", SQ, lambda: sqd(group_size=0), IP, "group_size"),
    select_case("swizzled.select.nodes_0", SQ, lambda: sqd(nodes=0), IP, "nodes"),
    select_case("swizzled.select.devices_negative", SQ, lambda: sqd(devices_per_node=-2), IP, "devices_per_node"),
    select_case("swizzled.select.pipeline_float", SQ, lambda: sqd(pipeline=1.5), IP, "pipeline"),
    select_case("swizzled.select.not_whole_slices", SQ, lambda: sqd(group_size=7), IP, all_of("multiple of", "pad")),
    select_case("swizzled.select.q_min_outside", SQ, lambda: sqd(q_min=-200), IP, "q_min"),
    select_case("swizzled.select.f64_input", SQ, lambda: sqd(input_element=EK.F64), UNS, "F64"),
    select_case("swizzled.select.fp8_output", SQ, lambda: sqd(output_element=EK.FP8_E4M3), UNS, "FP8_E4M3"),
    select_case("swizzled.select.error_element_code", SQ, lambda: sqd(error_element=EK.S8), IP, "error_element"),
    select_case(
        "swizzled.select.huge", SQ, lambda: sqd(shape=(2**70,), group_size=1, nodes=1, devices_per_node=1), IP, HUGE
    ),
    # ---- DequantReducePlan
    select_case("dequant_reduce.select.peers_0", RD, lambda: rdd(peers=0), IP, "peers"),
    select_case("dequant_reduce.select.chunk_negative", RD, lambda: rdd(chunk_elements=-30), IP, "chunk_elements"),
    select_case(
        "dequant_reduce.select.input_group_not_dividing", RD, lambda: rdd(input_group_size=7), IP, "input_group_size=7"
    ),
    select_case("dequant_reduce.select.output_group_0", RD, lambda: rdd(output_group_size=0), IP, "output_group_size"),
    select_case("dequant_reduce.select.float_input", RD, lambda: rdd(input_element=EK.F32), IP, "input_element"),
    select_case("dequant_reduce.select.fp8_output", RD, lambda: rdd(output_element=EK.FP8_E5M2), UNS, "FP8_E5M2"),
    select_case("dequant_reduce.select.peers_huge", RD, lambda: rdd(peers=2**70), IP, HUGE),
    select_case(
        "dequant_reduce.select.chunk_huge",
        RD,
        lambda: rdd(chunk_elements=2**70, input_group_size=1, output_group_size=1),
        IP,
        HUGE,
    ),
    # ---- descriptor models shared by every plan
    select_case("scope.group_size_zero_model", Q, lambda: qd(scope=qp.GroupScope(group_size=0)), IP, "group_size"),
    select_case("scope.channel_axis_float", Q, lambda: qd(scope=qp.ChannelScope(axis=1.5)), IP, "axis"),
]

# ---- BlockScaledQuantizePlan / BlockScaledDequantizePlan ------------------------------------------

BS = qp.BlockScaledQuantizePlan
BSD = qp.BlockScaledDequantizePlan
bdd = _factory(qp.BlockScaledDequantizeDescriptor, shape=SHAPE, format="mxfp8_e4m3")
REF_ONLY = ("numpy",)

CASES += [
    select_case(
        "block_scaled.select.format_unknown", BS, lambda: bsd(format="mxfp9"), IP, all_of("mxfp9", "mxfp8_e4m3")
    ),
    select_case("block_scaled.select.format_affine", BS, lambda: bsd(format="int8"), IP, "format"),
    select_case("block_scaled.select.format_none", BS, lambda: bsd(format=None), IP, "format"),
    select_case("block_scaled.select.input_f64", BS, lambda: bsd(input_element=EK.F64), IP, "input_element"),
    select_case("block_scaled.select.input_code", BS, lambda: bsd(input_element=EK.S8), IP, "input_element"),
    select_case("block_scaled.select.rank0", BS, lambda: bsd(shape=()), IP, "dimension"),
    select_case("block_scaled.select.negative_extent", BS, lambda: bsd(shape=(5, -1)), IP, "negative"),
    select_case("block_scaled.select.huge", BS, lambda: bsd(shape=(2**70,)), IP, HUGE),
    select_case("block_scaled.select.block_16", BS, lambda: bsd(block=(1, 16)), IP, all_of("block", "32")),
    select_case("block_scaled.select.mxfp4_tile", BS, lambda: bsd(format="mxfp4", block=(32, 32)), IP, "block"),
    select_case("block_scaled.select.block_string", BS, lambda: bsd(block="1x32"), IP, "block"),
    select_case("block_scaled.select.axis_out_of_range", BS, lambda: bsd(axis=2), IP, "axis 2"),
    select_case("block_scaled.select.nvfp4_axis0", BS, lambda: bsd(format="nvfp4", axis=0), UNS, "last axis"),
    select_case("block_scaled.select.fp8_axis0", BS, lambda: bsd(format="fp8_block_e4m3", axis=0), UNS, "last axis"),
    select_case(
        "block_scaled.select.mx_mode_div", BS, lambda: bsd(scale_mode="div"), IP, all_of("scale_mode", "rceil")
    ),
    select_case(
        "block_scaled.select.fp8_mode_rceil", BS, lambda: bsd(format="fp8_block_e4m3", scale_mode="rceil"), IP, "div"
    ),
    select_case(
        "block_scaled.select.ue8m0_mode_div",
        BS,
        lambda: bsd(format="fp8_block_e4m3_ue8m0", scale_mode="div"),
        IP,
        "rceil",
    ),
    select_case("block_scaled.select.nvfp4_mode_floor", BS, lambda: bsd(format="nvfp4", scale_mode="floor"), IP, "te"),
    select_case("block_scaled.select.amax_floor_mx", BS, lambda: bsd(amax_floor=1e-4), IP, "amax_floor"),
    select_case(
        "block_scaled.select.amax_floor_negative",
        BS,
        lambda: bsd(format="fp8_block_e4m3", amax_floor=-1.0),
        IP,
        "amax_floor",
    ),
    select_case(
        "block_scaled.select.amax_floor_inf",
        BS,
        lambda: bsd(format="fp8_block_e4m3", amax_floor=float("inf")),
        IP,
        "amax_floor",
    ),
    select_case("block_scaled.select.two_level_mx", BS, lambda: bsd(two_level=False), IP, "two_level"),
    select_case(
        "block_scaled.select.stochastic_fp8",
        BS,
        lambda: bsd(format="fp8_block_e4m3", rounding=STOCHASTIC),
        UNS,
        "STOCHASTIC",
    ),
    select_case(
        "block_scaled.select.stochastic_mxint8", BS, lambda: bsd(format="mxint8", rounding=STOCHASTIC), UNS, "mxint8"
    ),
    select_case("block_scaled.select.layout_unknown", BS, lambda: bsd(scale_layout="swizzled"), IP, "scale_layout"),
    select_case(
        "block_scaled.select.blocked_f32",
        BS,
        lambda: bsd(format="fp8_block_e4m3", scale_layout="blocked"),
        IP,
        "byte scales",
    ),
    select_case(
        "block_scaled.select.packed_nvfp4", BS, lambda: bsd(format="nvfp4", scale_layout="packed_ue8m0"), IP, "E8M0"
    ),
    select_case("block_scaled.select.extra_field", BS, lambda: bsd(bogus=1), IP, "bogus"),
    select_case("block_scaled.select.descriptor_of_quantize", BS, lambda: qd(), IP, "BlockScaledQuantizeDescriptor"),
    select_case("block_scaled.select.preference_string", BS, bsd, IP, "PlanPreference", pref="fast"),
    select_case(
        "block_scaled.select.cuda_without_gpu",
        BS,
        bsd,
        UNS,
        "GPU",
        pref=qp.PlanPreference(backend=qp.BackendKind.CUDA),
        backends=REF_ONLY,
    ),
    # what no CUDA kernel serves (block_scaled.cuda_refusal / dequantize_refusal)
    select_case(
        "block_scaled.select.cuda_nvfp4_torchao",
        BS,
        lambda: bsd(format="nvfp4", scale_mode="torchao"),
        UNS,
        all_of("te order", "REFERENCE"),
        backends=("cupy", "torch"),
    ),
    select_case(
        "block_scaled.select.cuda_nvfp4_tile",
        BS,
        lambda: bsd(format="nvfp4", block=(16, 16)),
        UNS,
        all_of("16x16", "REFERENCE"),
        backends=("cupy", "torch"),
    ),
    select_case(
        "block_scaled.select.cuda_tile_layout",
        BS,
        lambda: bsd(block=(32, 32), scale_layout="column_major"),
        UNS,
        all_of("32x32", "column_major"),
        backends=("cupy", "torch"),
    ),
    select_case(
        "block_scaled.select.cuda_transpose_mxfp6",
        BS,
        lambda: bsd(format="mxfp6_e2m3", columnwise="transposed"),
        UNS,
        all_of("transpose", "mxfp6_e2m3"),
        backends=("cupy", "torch"),
    ),
    select_case(
        "block_scaled.select.columnwise_unknown", BS, lambda: bsd(columnwise="rows"), IP, all_of("columnwise", "rows")
    ),
    select_case(
        "block_scaled.select.columnwise_rank1", BS, lambda: bsd(shape=(64,), columnwise="transposed"), IP, "rank >= 2"
    ),
    select_case(
        "block_scaled.select.te_mxfp8_fp8_block",
        BS,
        lambda: bsd(format="fp8_block_e4m3", columnwise="te_mxfp8"),
        IP,
        "te_mxfp8",
    ),
    select_case("block_scaled.select.cuda_axis0", BS, lambda: bsd(axis=0), UNS, "axis 0", backends=("cupy", "torch")),
    select_case(
        "block_scaled.select.cuda_stochastic",
        BS,
        lambda: bsd(rounding=STOCHASTIC),
        UNS,
        "stochastic",
        backends=("cupy", "torch"),
    ),
    select_case(
        "block_scaled.select.cuda_dequantize_fp8_tile",
        BSD,
        lambda: bdd(format="fp8_block_e4m3", block=(128, 128)),
        UNS,
        all_of("128x128", "REFERENCE"),
        backends=("cupy", "torch"),
    ),
    select_case(
        "block_scaled.select.cuda_dequantize_blocked",
        BSD,
        lambda: bdd(scale_layout="blocked"),
        UNS,
        all_of("compact", "REFERENCE"),
        backends=("cupy", "torch"),
    ),
    select_case("block_scaled_dequantize.select.output_s8", BSD, lambda: bdd(output_element=EK.S8), IP, "F16"),
    select_case("block_scaled_dequantize.select.format_unknown", BSD, lambda: bdd(format="mx"), IP, "format"),
    # arguments beyond the common cases
    arg_case(
        "block_scaled.scales.wrong_dtype_f32",
        "block_scaled",
        IP,
        all_of("scales", "dtype"),
        fields={"scales": astype(np.float32)},
    ),
    arg_case("block_scaled.scales.none", "block_scaled", IP, "scales", fields={"scales": None}),
    arg_case(
        "block_scaled.scales.compact_for_blocked",
        "block_scaled.mxfp4_blocked",
        IP,
        all_of("scales", "shape"),
        fields={"scales": host_value(np.zeros((6, 2), np.uint8))},
    ),
    arg_case(
        "block_scaled.scales.uint8_for_packed",
        "block_scaled.fp8_ue8m0_packed",
        IP,
        all_of("scales", "dtype"),
        fields={"scales": astype(np.uint8)},
    ),
    arg_case(
        "block_scaled.codes.unpacked_fp4",
        "block_scaled.mxfp4_blocked",
        IP,
        all_of("codes", "shape"),
        fields={"codes": host_value(np.zeros((6, 64), np.uint8))},
    ),
    arg_case(
        "block_scaled.tensor_scale.not_nvfp4",
        "block_scaled",
        IP,
        "NVFP4",
        fields={"tensor_scale": host_value(np.zeros(1, np.float32))},
    ),
    arg_case("block_scaled.global_amax.not_nvfp4", "block_scaled", IP, "NVFP4", fields={"global_amax": 2.0}),
    arg_case("block_scaled.rng_seed.nearest", "block_scaled", IP, "rng_seed", fields={"rng_seed": 3}),
    arg_case(
        "block_scaled.codes_overlap_scales",
        "block_scaled",
        IP,
        overlap_msg("codes", "scales"),
        overlap=Overlap("codes", "scales"),
    ),
    arg_case(
        "block_scaled.codes_overlap_input",
        "block_scaled",
        IP,
        overlap_msg("codes", "input"),
        overlap=Overlap("input", "codes"),
    ),
    arg_case(
        "block_scaled.scales.misaligned_f32",
        "block_scaled.fp8_column_major",
        MO,
        all_of("scales", "align"),
        fields={"scales": misaligned()},
    ),
    arg_case(
        "block_scaled_nvfp4.tensor_scale.none",
        "block_scaled.nvfp4",
        IP,
        "tensor_scale",
        fields={"tensor_scale": None},
        backends=REF_ONLY,
    ),
    arg_case(
        "block_scaled_nvfp4.tensor_scale.float64",
        "block_scaled.nvfp4",
        IP,
        all_of("tensor_scale", "dtype"),
        fields={"tensor_scale": astype(np.float64)},
        backends=REF_ONLY,
    ),
    arg_case(
        "block_scaled_nvfp4.global_amax.negative",
        "block_scaled.nvfp4",
        IP,
        "global_amax",
        fields={"global_amax": -1.0},
        backends=REF_ONLY,
    ),
    arg_case(
        "block_scaled_nvfp4.global_amax.nan",
        "block_scaled.nvfp4",
        IP,
        "global_amax",
        fields={"global_amax": float("nan")},
        backends=REF_ONLY,
    ),
    arg_case(
        "block_scaled_nvfp4.global_amax.int_array",
        "block_scaled.nvfp4",
        IP,
        "global_amax",
        fields={"global_amax": host_value(np.ones(1, np.int32))},
        backends=REF_ONLY,
    ),
    arg_case(
        "block_scaled_nvfp4.global_amax.two_elements",
        "block_scaled.nvfp4",
        IP,
        "global_amax",
        fields={"global_amax": host_value(np.ones(2, np.float32))},
        backends=REF_ONLY,
    ),
    arg_case(
        "block_scaled_nvfp4.stochastic_without_seed",
        "block_scaled.nvfp4_stochastic",
        IP,
        "rng_seed",
        fields={"rng_seed": None},
        backends=REF_ONLY,
    ),
]


def _pref_backend_string() -> Built:
    return [lambda: qp.PlanPreference(backend="tpu")], []


CASES += [
    call_case("types.plan_preference_backend", lambda env: _pref_backend_string(), IP, "backend"),
    call_case("types.group_scope_zero", lambda env: ([lambda: qp.GroupScope(group_size=0)], []), IP, "group_size"),
    call_case("types.group_scope_none", lambda env: ([lambda: qp.GroupScope(group_size=None)], []), IP, "group_size"),
    call_case("types.channel_scope_missing_axis", lambda env: ([lambda: qp.ChannelScope()], []), IP, "axis"),
    call_case(
        "workspace.allocate_negative",
        lambda env: ([lambda: qp.Workspace.allocate(-1, device=False)], []),
        IP,
        "workspace|nbytes",
    ),
    call_case(
        "workspace.allocate_float",
        lambda env: ([lambda: qp.Workspace.allocate(16.5, device=False)], []),  # type: ignore[arg-type]
        IP,
        "workspace|nbytes",
    ),
]


# ---- argument mistakes per plan ----------------------------------------------------------------------

SCALAR_SCALES = [
    ("zero", 0.0),
    ("negative_zero", -0.0),
    ("negative", -1.0),
    ("nan", float("nan")),
    ("inf", float("inf")),
    ("underflows_f32", 1e-50),
    ("overflows_f32", 1e39),
    ("bool", True),
]

for _base in ("quantize.tensor", "dequantize.tensor", "quantize_backward.tensor"):
    for _label, _value in SCALAR_SCALES:
        CASES.append(arg_case(f"{_base}.scale.{_label}", _base, IP, "scale", fields={"scale": _value}))
for _base in ("dequantize_backward.tensor", "fake_quantize.tensor", "fake_quantize_backward.ste_tensor"):
    for _label, _value in (("zero", 0.0), ("nan", float("nan")), ("negative_inf", -float("inf"))):
        CASES.append(arg_case(f"{_base}.scale.{_label}", _base, IP, "scale", fields={"scale": _value}))

CASES += [
    # ---- QuantizePlan parameters
    arg_case(
        "quantize.scale.wrong_shape",
        "quantize",
        IP,
        all_of("scale", "shape"),
        fields={"scale": reshaped(lambda a: a[:4])},
    ),
    arg_case(
        "quantize.scale.wrong_dtype", "quantize", IP, all_of("scale", "dtype"), fields={"scale": astype(np.float64)}
    ),
    arg_case("quantize.scale.scalar_for_token_scope", "quantize", IP, "scale", fields={"scale": 0.5}),
    arg_case("quantize.scale.none", "quantize", IP, "scale", fields={"scale": None}),
    arg_case("quantize.scale.dict", "quantize", IP, "scale", fields={"scale": {"s": 1.0}}),
    arg_case("quantize.scale.list", "quantize", IP, "scale", fields={"scale": tolist()}),
    arg_case(
        "quantize.scale.noncontiguous", "quantize", MO, all_of("scale", "contiguous"), fields={"scale": noncontig()}
    ),
    arg_case("quantize.scale.foreign_memory", "quantize", IP, "scale", fields={"scale": foreign()}),
    arg_case(
        "quantize.zero_point.in_symmetric_mode",
        "quantize",
        IP,
        "zero_point",
        fields={"zero_point": np.zeros((5, 1), np.int32)},
    ),
    arg_case("quantize.zero_point.missing", "quantize.asym", IP, "zero_point", fields={"zero_point": None}),
    arg_case(
        "quantize.zero_point.int64",
        "quantize.asym",
        IP,
        all_of("zero_point", "int64"),
        fields={"zero_point": astype(np.int64)},
    ),
    arg_case("quantize.zero_point.scalar_for_token_scope", "quantize.asym", IP, "zero_point", fields={"zero_point": 3}),
    # a scalar zero point outside [q_min, q_max] (FakeQuantizePlan refuses the same)
    arg_case(
        "quantize.zero_point.scalar_1000",
        "quantize.asym_tensor",
        IP,
        all_of("zero_point", "1000"),
        fields={"zero_point": 1000},
    ),
    arg_case(
        "quantize.zero_point.scalar_minus_1",
        "quantize.asym_tensor",
        IP,
        all_of("zero_point", "-1"),
        fields={"zero_point": -1},
    ),
    arg_case("quantize.zero_point.scalar_2_31", "quantize.asym_tensor", IP, "zero_point", fields={"zero_point": 2**31}),
    arg_case(
        "quantize.zero_point.scalar_fraction", "quantize.asym_tensor", IP, "zero_point", fields={"zero_point": 2.5}
    ),
    arg_case(
        "quantize.zero_point.scalar_nan", "quantize.asym_tensor", IP, "zero_point", fields={"zero_point": float("nan")}
    ),
    arg_case(
        "quantize.output.overlaps_input",
        "quantize",
        IP,
        overlap_msg("output", "input"),
        overlap=Overlap("input", "output", 64),
    ),
    arg_case(
        "quantize.output.overlaps_scale",
        "quantize",
        IP,
        overlap_msg("output", "scale"),
        overlap=Overlap("output", "scale", 16),
    ),
    arg_case(
        "quantize.zero_size.wrong_output_shape",
        "quantize",
        IP,
        all_of("output", "shape"),
        fields={"output": Tx(lambda env, data: (env.ops.asarray(np.zeros((0, 37), np.int8)), []))},
    ),
    # ---- seeds
    arg_case("quantize.rng_seed.missing", "quantize.stochastic", IP, "rng_seed", fields={"rng_seed": None}),
    arg_case("quantize.rng_seed.negative", "quantize.stochastic", IP, "rng_seed", fields={"rng_seed": -1}),
    arg_case("quantize.rng_seed.2_64", "quantize.stochastic", IP, "rng_seed", fields={"rng_seed": 2**64}),
    arg_case("quantize.rng_seed.float", "quantize.stochastic", IP, "rng_seed", fields={"rng_seed": 1.5}),
    arg_case("quantize.rng_seed.string", "quantize.stochastic", IP, "rng_seed", fields={"rng_seed": "42"}),
    arg_case("quantize.rng_seed.bool", "quantize.stochastic", IP, "rng_seed", fields={"rng_seed": True}),
    arg_case(
        "quantize.rng_seed.int32_array",
        "quantize.stochastic",
        IP,
        "rng_seed",
        fields={"rng_seed": host_value(np.array([7], np.int32))},
    ),
    arg_case(
        "quantize.rng_seed.two_elements",
        "quantize.stochastic",
        IP,
        "rng_seed",
        fields={"rng_seed": host_value(np.array([7, 8], np.int64))},
    ),
    arg_case("quantize.rng_offset.negative", "quantize.stochastic", IP, "rng_offset", fields={"rng_offset": -5}),
    arg_case("quantize.rng_seed.on_nearest_plan", "quantize", IP, "rng_seed", fields={"rng_seed": 1, "rng_offset": 0}),
    # ---- DequantizePlan
    arg_case(
        "dequantize.output.overlaps_input",
        "dequantize",
        IP,
        overlap_msg("output", "input"),
        overlap=Overlap("output", "input", 16),
    ),
    arg_case(
        "dequantize.input.int16_codes", "dequantize", IP, all_of("input", "dtype"), fields={"input": astype(np.int16)}
    ),
    # ---- QuantizeBackwardPlan / DequantizeBackwardPlan
    arg_case(
        "quantize_backward.grad_input.overlaps_input",
        "quantize_backward",
        IP,
        overlap_msg("grad_input", "input"),
        overlap=Overlap("input", "grad_input", 32),
    ),
    arg_case(
        "quantize_backward.grad_input.partly_overlaps_grad_output",
        "quantize_backward",
        IP,
        overlap_msg("grad_input", "grad_output"),
        overlap=Overlap("grad_output", "grad_input", 32),
    ),
    arg_case(
        "dequantize_backward.grad_input.partly_overlaps_grad_output",
        "dequantize_backward",
        IP,
        overlap_msg("grad_input", "grad_output"),
        overlap=Overlap("grad_output", "grad_input", 32),
    ),
    arg_case(
        "dequantize_backward.grad_input.overlaps_scale",
        "dequantize_backward",
        IP,
        overlap_msg("grad_input", "scale"),
        overlap=Overlap("grad_input", "scale", 16),
    ),
    # ---- DynamicRangeQuantizePlan
    arg_case("dynamic_range.scale_out.none", "dynamic_range", IP, "scale_out", fields={"scale_out": None}),
    arg_case(
        "dynamic_range.scale_out.float64",
        "dynamic_range",
        IP,
        all_of("scale_out", "dtype"),
        fields={"scale_out": astype(np.float64)},
    ),
    arg_case(
        "dynamic_range.scale_out.noncontiguous",
        "dynamic_range",
        MO,
        all_of("scale_out", "contiguous"),
        fields={"scale_out": noncontig()},
    ),
    arg_case(
        "dynamic_range.scale_out.readonly",
        "dynamic_range",
        IP,
        all_of("scale_out", "read-only|writeable|writable"),
        fields={"scale_out": readonly()},
    ),
    arg_case(
        "dynamic_range.zero_point_out.missing",
        "dynamic_range.asym",
        IP,
        "zero_point_out",
        fields={"zero_point_out": None},
    ),
    arg_case(
        "dynamic_range.zero_point_out.in_symmetric_mode",
        "dynamic_range",
        IP,
        "zero_point_out",
        fields={"zero_point_out": np.zeros((5, 1), np.int32)},
    ),
    arg_case(
        "dynamic_range.scale_out.overlaps_output",
        "dynamic_range",
        IP,
        overlap_msg("scale_out", "output"),
        overlap=Overlap("output", "scale_out", 16),
    ),
    arg_case(
        "dynamic_range.output.overlaps_input",
        "dynamic_range",
        IP,
        overlap_msg("output", "input"),
        overlap=Overlap("input", "output", 64),
    ),
    arg_case(
        "dynamic_range.scale_out.overlaps_input",
        "dynamic_range",
        IP,
        overlap_msg("scale_out", "input"),
        overlap=Overlap("input", "scale_out", 32),
    ),
    arg_case(
        "dynamic_range.zero_point_out.overlaps_scale_out",
        "dynamic_range.asym",
        IP,
        overlap_msg("zero_point_out", "scale_out"),
        overlap=Overlap("scale_out", "zero_point_out", 8),
    ),
    arg_case(
        "dynamic_range.zero_point_out.overlaps_output",
        "dynamic_range.asym",
        IP,
        overlap_msg("zero_point_out", "output"),
        overlap=Overlap("output", "zero_point_out", 16),
    ),
    arg_case("dynamic_range.rng_seed.negative", "dynamic_range.stochastic", IP, "rng_seed", fields={"rng_seed": -1}),
    arg_case(
        "dynamic_range.rng_offset.missing", "dynamic_range.stochastic", IP, "rng_offset", fields={"rng_offset": None}
    ),
    arg_case(
        "dynamic_range.workspace.too_small",
        "dynamic_range.channel0",
        WTS,
        "workspace",
        workspace=lambda e, p: _short_workspace(e, p),
    ),
    arg_case(
        "dynamic_range.workspace.host_for_device_plan",
        "dynamic_range.channel0",
        IP,
        "workspace",
        workspace=lambda e, p: _host_workspace(e, p),
        backends=("cupy", "torch"),
    ),
    # ---- FakeQuantizePlan
    arg_case(
        "fake_quantize.output.partly_overlaps_input",
        "fake_quantize",
        IP,
        overlap_msg("output", "input"),
        overlap=Overlap("input", "output", 16),
    ),
    arg_case(
        "fake_quantize.output.overlaps_scale",
        "fake_quantize",
        IP,
        overlap_msg("output", "scale"),
        overlap=Overlap("output", "scale", 16),
    ),
    arg_case(
        "fake_quantize.zero_point.scalar_1000",
        "fake_quantize.asym_tensor",
        IP,
        all_of("zero_point", "1000"),
        fields={"zero_point": 1000},
    ),
    arg_case(
        "fake_quantize.zero_point.bool", "fake_quantize.asym_tensor", IP, "zero_point", fields={"zero_point": True}
    ),
    arg_case(
        "fake_quantize.zero_point.in_symmetric_mode",
        "fake_quantize",
        IP,
        "zero_point",
        fields={"zero_point": np.zeros((5, 1), np.int32)},
    ),
    # ---- FakeQuantizeBackwardPlan
    arg_case(
        "fake_quantize_backward.grad_scale.missing",
        "fake_quantize_backward",
        IP,
        "grad_scale",
        fields={"grad_scale": None},
    ),
    arg_case(
        "fake_quantize_backward.grad_scale.wrong_shape",
        "fake_quantize_backward",
        IP,
        all_of("grad_scale", "shape"),
        fields={"grad_scale": reshaped(lambda a: a.reshape(-1))},
    ),
    arg_case(
        "fake_quantize_backward.grad_scale.readonly",
        "fake_quantize_backward",
        IP,
        all_of("grad_scale", "read-only|writeable|writable"),
        fields={"grad_scale": readonly()},
    ),
    arg_case(
        "fake_quantize_backward.grad_factor.nan",
        "fake_quantize_backward",
        IP,
        "grad_factor",
        fields={"grad_factor": float("nan")},
    ),
    arg_case(
        "fake_quantize_backward.grad_factor.string",
        "fake_quantize_backward",
        IP,
        "grad_factor",
        fields={"grad_factor": "1"},
    ),
    arg_case(
        "fake_quantize_backward.grad_zero_point.missing",
        "fake_quantize_backward.asym",
        IP,
        "grad_zero_point",
        fields={"grad_zero_point": None},
    ),
    arg_case(
        "fake_quantize_backward.grad_input.partly_overlaps_input",
        "fake_quantize_backward",
        IP,
        overlap_msg("grad_input", "input"),
        overlap=Overlap("input", "grad_input", 32),
    ),
    arg_case(
        "fake_quantize_backward.grad_scale.overlaps_grad_input",
        "fake_quantize_backward",
        IP,
        overlap_msg("grad_scale", "grad_input"),
        overlap=Overlap("grad_input", "grad_scale", 16),
    ),
    arg_case(
        "fake_quantize_backward.grad_zero_point.overlaps_grad_scale",
        "fake_quantize_backward.asym",
        IP,
        overlap_msg("grad_zero_point", "grad_scale"),
        overlap=Overlap("grad_scale", "grad_zero_point", 8),
    ),
    # ---- DynamicRangeFakeQuantizePlan
    arg_case(
        "dynamic_fake.output.partly_overlaps_input",
        "dynamic_fake",
        IP,
        overlap_msg("output", "input"),
        overlap=Overlap("input", "output", 16),
    ),
    arg_case(
        "dynamic_fake.scale_out.overlaps_output",
        "dynamic_fake",
        IP,
        overlap_msg("scale_out", "output"),
        overlap=Overlap("output", "scale_out", 16),
    ),
    arg_case(
        "dynamic_fake.zero_point_out.overlaps_scale_out",
        "dynamic_fake.asym",
        IP,
        overlap_msg("zero_point_out", "scale_out"),
        overlap=Overlap("scale_out", "zero_point_out", 8),
    ),
    arg_case(
        "dynamic_fake.scale_out.wrong_dtype",
        "dynamic_fake",
        IP,
        all_of("scale_out", "dtype"),
        fields={"scale_out": astype(np.float16)},
    ),
    arg_case("dynamic_fake.rng_seed.2_64", "dynamic_fake.stochastic", IP, "rng_seed", fields={"rng_seed": 2**64}),
    arg_case(
        "dynamic_fake.rng_seed.on_nearest_plan", "dynamic_fake", IP, "rng_seed", fields={"rng_seed": 3, "rng_offset": 0}
    ),
    arg_case(
        "dynamic_fake.workspace.too_small",
        "dynamic_fake.channel0",
        WTS,
        "workspace",
        workspace=lambda e, p: _short_workspace(e, p),
    ),
    # ---- SwizzledQuantizePlan
    arg_case(
        "swizzled.scale_out.overlaps_output",
        "swizzled",
        IP,
        overlap_msg("scale_out", "output"),
        overlap=Overlap("output", "scale_out", 16),
    ),
    arg_case(
        "swizzled.output.overlaps_input",
        "swizzled",
        IP,
        overlap_msg("output", "input"),
        overlap=Overlap("input", "output", 64),
    ),
    arg_case(
        "swizzled.zero_point_out.overlaps_scale_out",
        "swizzled.loco",
        IP,
        overlap_msg("zero_point_out", "scale_out"),
        overlap=Overlap("scale_out", "zero_point_out", 8),
    ),
    arg_case(
        "swizzled.error_feedback.overlaps_output",
        "swizzled.loco",
        IP,
        overlap_msg("error_feedback", "output"),
        overlap=Overlap("error_feedback", "output", 64),
    ),
    arg_case(
        "swizzled.error_feedback.overlaps_input",
        "swizzled.loco",
        IP,
        overlap_msg("error_feedback", "input"),
        overlap=Overlap("input", "error_feedback", 64),
    ),
    arg_case("swizzled.error_beta.above_1", "swizzled.loco", IP, "error_beta", fields={"error_beta": 1.5}),
    arg_case("swizzled.error_beta.nan", "swizzled.loco", IP, "error_beta", fields={"error_beta": float("nan")}),
    arg_case("swizzled.error_beta.string", "swizzled.loco", IP, "error_beta", fields={"error_beta": "0.5"}),
    arg_case("swizzled.error_feedback.missing", "swizzled.loco", IP, "error_feedback", fields={"error_feedback": None}),
    arg_case(
        "swizzled.error_feedback.readonly",
        "swizzled.loco",
        IP,
        all_of("error_feedback", "read-only|writeable|writable"),
        fields={"error_feedback": readonly()},
    ),
    arg_case(
        "swizzled.error_feedback.noncontiguous",
        "swizzled.loco",
        MO,
        all_of("error_feedback", "contiguous"),
        fields={"error_feedback": noncontig()},
    ),
    arg_case("swizzled.zero_point_out.missing", "swizzled.loco", IP, "zero_point_out", fields={"zero_point_out": None}),
    # ---- DequantReducePlan
    arg_case(
        "dequant_reduce.scale_out.overlaps_output",
        "dequant_reduce",
        IP,
        overlap_msg("scale_out", "output"),
        overlap=Overlap("output", "scale_out", 8),
    ),
    arg_case(
        "dequant_reduce.output.overlaps_input",
        "dequant_reduce",
        IP,
        overlap_msg("output", "input"),
        overlap=Overlap("input", "output", 16),
    ),
    arg_case(
        "dequant_reduce.scale_out.overlaps_scale",
        "dequant_reduce",
        IP,
        overlap_msg("scale_out", "scale"),
        overlap=Overlap("scale", "scale_out", 16),
    ),
    arg_case(
        "dequant_reduce.output.overlaps_error_feedback",
        "dequant_reduce.loco",
        IP,
        overlap_msg("output", "error_feedback"),
        overlap=Overlap("error_feedback", "output", 16),
    ),
    arg_case(
        "dequant_reduce.zero_point_out.overlaps_scale_out",
        "dequant_reduce.loco",
        IP,
        overlap_msg("zero_point_out", "scale_out"),
        overlap=Overlap("scale_out", "zero_point_out", 8),
    ),
    arg_case(
        "dequant_reduce.scale.wrong_shape",
        "dequant_reduce",
        IP,
        all_of("scale", "shape"),
        fields={"scale": reshaped(lambda a: a[:, :2])},
    ),
    arg_case("dequant_reduce.scale.none", "dequant_reduce", IP, "scale", fields={"scale": None}),
    arg_case("dequant_reduce.zero_point.missing", "dequant_reduce.loco", IP, "zero_point", fields={"zero_point": None}),
    arg_case(
        "dequant_reduce.error_beta.negative", "dequant_reduce.loco", IP, "error_beta", fields={"error_beta": -0.1}
    ),
    arg_case(
        "dequant_reduce.error_feedback.wrong_shape",
        "dequant_reduce.loco",
        IP,
        all_of("error_feedback", "shape"),
        fields={"error_feedback": reshaped(lambda a: a[:6])},
    ),
    arg_case(
        "dequant_reduce.error_feedback.readonly",
        "dequant_reduce.loco",
        IP,
        all_of("error_feedback", "read-only|writeable|writable"),
        fields={"error_feedback": readonly()},
    ),
]


def _short_workspace(env: Env, plan: Any) -> Any:
    need = int(plan.workspace_size())
    if need == 0:
        pytest.skip("the plan needs no workspace on this backend (reference: always 0)")
    return env.ops.workspace(need - 1) if need > 1 else None


def _host_workspace(env: Env, plan: Any) -> Any:
    need = int(plan.workspace_size())
    if need == 0:
        pytest.skip("the plan needs no workspace on this backend")
    return env.ops.workspace(need, device=False)


# ---- quantplan.compat.deepspeed ---------------------------------------------------------------------


def _ds() -> Any:
    from quantplan.compat import deepspeed

    return deepspeed


def ds_case(
    name: str,
    call: Callable[[Any, Env], tuple[Callable[[], object], list[Any]]],
    error: type[qp.QuantPlanError],
    fragment: str,
    backends: tuple[str, ...] = ALL,
) -> Case:
    """A mistake in a DeepSpeed-compatible call; ``call(ds, env)`` returns (call, operands to watch)."""

    def build(env: Env) -> Built:
        fn, watched = call(_ds(), env)
        return [fn], watched

    return Case(name, build, error, fragment, backends)


def _x(env: Env, shape: tuple[int, ...] = (4, 24), dtype: Any = np.float32) -> Any:
    return env.ops.asarray(_floats(env.rng, shape).astype(dtype))


def _ds_quantize(**kw: Any) -> Callable[[Any, Env], tuple[Callable[[], object], list[Any]]]:
    """ds.quantize(x, groups=8, num_bits=8, Symmetric) with one argument replaced."""

    def call(ds: Any, env: Env) -> tuple[Callable[[], object], list[Any]]:
        a: dict[str, Any] = dict(input_vals=_x(env), groups=8, num_bits=8, quant_type=ds.Symmetric)
        a.update({k: v(env) if callable(v) else v for k, v in kw.items()})
        watched = [a["input_vals"]] if env.ops.is_array(a["input_vals"]) else []
        return (lambda: ds.quantize(**a)), watched

    return call


def _ds_loco(**kw: Any) -> Callable[[Any, Env], tuple[Callable[[], object], list[Any]]]:
    """ds.loco_swizzle_quant(x, e, 0.5, groups=8, 8 bits, Symmetric, pipeline 1, 2 nodes, 2 devices)."""

    def call(ds: Any, env: Env) -> tuple[Callable[[], object], list[Any]]:
        e = env.ops.asarray((_floats(env.rng, (4, 24)) * np.float32(0.01)).astype(np.float32))
        a: dict[str, Any] = dict(
            input_vals=_x(env),
            error_feedback=e,
            err_beta=0.5,
            groups=8,
            num_bits=8,
            quant_type=ds.Symmetric,
            pipeline_size=1,
            nodes=2,
            devices_per_node=2,
        )
        a.update({k: v(env, a) if callable(v) else v for k, v in kw.items()})
        watched = [v for k, v in a.items() if k in ("input_vals", "error_feedback") and env.ops.is_array(v)]
        return (lambda: ds.loco_swizzle_quant(**a)), watched

    return call


def _ds_dequantize(**kw: Any) -> Callable[[Any, Env], tuple[Callable[[], object], list[Any]]]:
    """ds.dequantize(q int8 (4, 24), params (8, 1), groups=8, 8 bits, Symmetric)."""

    def call(ds: Any, env: Env) -> tuple[Callable[[], object], list[Any]]:
        a: dict[str, Any] = dict(
            quantized_data=env.ops.asarray(random_codes(env.rng, (4, 24), EK.S8)),
            params=env.ops.asarray(_scale(env.rng, (8, 1))),
            groups=8,
            num_bits=8,
            quant_type=ds.Symmetric,
        )
        a.update({k: v(env) if callable(v) else v for k, v in kw.items()})
        return (lambda: ds.dequantize(**a)), [v for v in a.values() if env.ops.is_array(v)]

    return call


def _ds_reduce(**kw: Any) -> Callable[[Any, Env], tuple[Callable[[], object], list[Any]]]:
    """ds.quantized_reduction(q int8 (2, 48) = 2 chunks, scales (8, 1), in 8 / out 4 groups, 8 bits, Symmetric, 2)."""

    def call(ds: Any, env: Env) -> tuple[Callable[[], object], list[Any]]:
        a: dict[str, Any] = dict(
            input_vals=env.ops.asarray(random_codes(env.rng, (2, 48), EK.S8)),
            input_scales=env.ops.asarray(_scale(env.rng, (8, 1))),
            in_groups=8,
            out_groups=4,
            num_bits=8,
            quant_type=ds.Symmetric,
            devices_per_node=2,
        )
        a.update({k: v(env) if callable(v) else v for k, v in kw.items()})
        return (lambda: ds.quantized_reduction(**a)), [v for v in a.values() if env.ops.is_array(v)]

    return call


def _ds_loco_reduce(**kw: Any) -> Callable[[Any, Env], tuple[Callable[[], object], list[Any]]]:
    def call(ds: Any, env: Env) -> tuple[Callable[[], object], list[Any]]:
        a: dict[str, Any] = dict(
            input_vals=env.ops.asarray(random_codes(env.rng, (2, 48), EK.S8)),
            input_scales=env.ops.asarray(_scale(env.rng, (8, 1))),
            error_feedback=env.ops.asarray(np.zeros(48, np.float32)),
            err_beta=0.5,
            in_groups=8,
            out_groups=4,
            num_bits=8,
            quant_type=ds.Symmetric,
            devices_per_node=2,
        )
        a.update({k: v(env) if callable(v) else v for k, v in kw.items()})
        return (lambda: ds.loco_quantized_reduction(**a)), [v for v in a.values() if env.ops.is_array(v)]

    return call


def _ds_moq(
    fn: str, data: Callable[[Env], Any] | None = None, **kw: Any
) -> Callable[[Any, Env], tuple[Callable[[], object], list[Any]]]:
    """ds.<fn>(vals f16 (4, 24), groups=8, bits=8) in place, with one argument replaced."""

    def call(ds: Any, env: Env) -> tuple[Callable[[], object], list[Any]]:
        vals = data(env) if data is not None else _x(env, dtype=np.float16)
        a: dict[str, Any] = dict(groups=8, bits=8)
        a.update(kw)
        f = getattr(ds, fn)
        return (lambda: f(vals, **a)), [vals] if env.ops.is_array(vals) else []

    return call


def _mixed_libraries(env: Env) -> Any:
    """Params from another library than the codes (a PyTorch CPU tensor / a NumPy array)."""
    return env.ops.foreign(_scale(env.rng, (8, 1)))


def _torch_cpu_input(env: Env) -> Any:
    if not HAS_TORCH:
        pytest.skip("PyTorch is not installed")
    import torch

    return torch.from_numpy(_floats(env.rng, (4, 24)))


def _manual_seed(value: Any) -> Callable[[Any, Env], tuple[Callable[[], object], list[Any]]]:
    return lambda ds, env: ((lambda: ds.manual_seed(value)), [])


CASES += [
    ds_case("compat.quantize.groups_0", _ds_quantize(groups=0), IP, "groups"),
    ds_case("compat.quantize.groups_negative", _ds_quantize(groups=-8), IP, "groups"),
    ds_case("compat.quantize.groups_not_dividing", _ds_quantize(groups=7), IP, "groups|7"),
    ds_case("compat.quantize.groups_float", _ds_quantize(groups=8.0), IP, "groups"),
    ds_case("compat.quantize.groups_huge", _ds_quantize(groups=2**70), IP, "groups"),
    ds_case("compat.quantize.num_bits_3", _ds_quantize(num_bits=3), IP, "num_bits|bits"),
    ds_case("compat.quantize.num_bits_16", _ds_quantize(num_bits=16), IP, "num_bits|bits"),
    ds_case("compat.quantize.quant_type_string", _ds_quantize(quant_type="sym"), IP, "quant_type"),
    ds_case("compat.quantize.quant_type_2", _ds_quantize(quant_type=2), IP, "quant_type"),
    ds_case(
        "compat.quantize.int32_input", _ds_quantize(input_vals=lambda env: _x(env, dtype=np.int32)), IP, "input_vals"
    ),
    ds_case("compat.quantize.list_input", _ds_quantize(input_vals=[[1.0, 2.0]] * 4), IAT, "input_vals|list"),
    ds_case("compat.quantize.none_input", _ds_quantize(input_vals=None), IAT, "input_vals"),
    ds_case(
        "compat.quantize.int4_odd_numel",
        _ds_quantize(input_vals=lambda env: _x(env, (5, 7)), groups=5, num_bits=4),
        IP,
        "even",
    ),
    ds_case(  # a PyTorch CPU input with a NumPy error buffer: two libraries in one call
        "compat.loco.torch_cpu_input_numpy_error",
        _ds_loco(input_vals=lambda env, a: _torch_cpu_input(env)),
        IP,
        "one library",
        backends=("numpy",),
    ),
    ds_case(
        "compat.dequantize.params_wrong_count",
        _ds_dequantize(params=lambda env: env.ops.asarray(_scale(env.rng, (4, 1)))),
        IP,
        "params",
    ),
    ds_case(
        "compat.dequantize.float_codes",
        _ds_dequantize(quantized_data=lambda env: _x(env)),
        IP,
        "quantized_data",
    ),
    ds_case("compat.dequantize.num_bits_2", _ds_dequantize(num_bits=2), IP, "num_bits"),
    ds_case("compat.dequantize.groups_0", _ds_dequantize(groups=0), IP, "groups"),
    ds_case("compat.dequantize.mixed_libraries", _ds_dequantize(params=_mixed_libraries), IP, "library|device|params"),
    ds_case(
        "compat.swizzle_quant.nodes_0",
        lambda ds, env: (lambda x: ((lambda: ds.swizzle_quant(x, 8, 8, ds.Symmetric, 1, 0, 2)), [x]))(_x(env)),
        IP,
        "nodes",
    ),
    ds_case(
        "compat.swizzle_quant.groups_not_multiple_of_partitions",
        lambda ds, env: (lambda x: ((lambda: ds.swizzle_quant(x, 6, 8, ds.Symmetric, 1, 2, 2)), [x]))(_x(env)),
        IP,
        "groups|multiple",
    ),
    ds_case("compat.loco_swizzle_quant.err_beta_above_1", _ds_loco(err_beta=1.5), IP, "err_beta|error_beta"),
    ds_case("compat.loco_swizzle_quant.err_beta_nan", _ds_loco(err_beta=float("nan")), IP, "err_beta|error_beta"),
    ds_case(
        "compat.loco_swizzle_quant.error_feedback_wrong_size",
        _ds_loco(error_feedback=lambda env, a: env.ops.asarray(np.zeros(95, np.float32))),
        IP,
        "error_feedback",
    ),
    ds_case(
        "compat.loco_swizzle_quant.error_feedback_int32",
        _ds_loco(error_feedback=lambda env, a: env.ops.asarray(np.zeros((4, 24), np.int32))),
        IP,
        "error_feedback",
    ),
    ds_case(
        "compat.loco_swizzle_quant.error_feedback_readonly",
        _ds_loco(error_feedback=lambda env, a: env.ops.readonly(np.zeros((4, 24), np.float32))),
        IP,
        all_of("error_feedback", "read-only|writeable|writable"),
    ),
    ds_case(
        "compat.loco_swizzle_quant.error_feedback_noncontiguous",
        _ds_loco(error_feedback=lambda env, a: env.ops.noncontiguous(np.zeros((4, 24), np.float32))[0]),
        MO,
        all_of("error_feedback", "contiguous"),
    ),
    ds_case(
        "compat.loco_swizzle_quant.error_feedback_is_input",
        _ds_loco(error_feedback=lambda env, a: a["input_vals"]),
        IP,
        overlap_msg("error_feedback", "input_vals|input"),
    ),
    ds_case("compat.quantized_reduction.devices_per_node_0", _ds_reduce(devices_per_node=0), IP, "devices_per_node"),
    ds_case(
        "compat.quantized_reduction.in_groups_not_multiple",
        _ds_reduce(in_groups=3, input_scales=lambda env: env.ops.asarray(_scale(env.rng, (3, 1)))),
        IP,
        "in_groups",
    ),
    ds_case("compat.quantized_reduction.out_groups_0", _ds_reduce(out_groups=0), IP, "out_groups"),
    ds_case(
        "compat.quantized_reduction.input_scales_wrong_count",
        _ds_reduce(input_scales=lambda env: env.ops.asarray(_scale(env.rng, (5, 1)))),
        IP,
        "input_scales",
    ),
    ds_case(
        "compat.loco_quantized_reduction.err_beta_negative", _ds_loco_reduce(err_beta=-0.5), IP, "err_beta|error_beta"
    ),
    ds_case(
        "compat.loco_quantized_reduction.error_feedback_wrong_size",
        _ds_loco_reduce(error_feedback=lambda env: env.ops.asarray(np.zeros(96, np.float32))),
        IP,
        "error_feedback",
    ),
    ds_case("compat.ds_quantize_fp16.groups_0", _ds_moq("ds_quantize_fp16", groups=0), IP, "groups"),
    ds_case("compat.ds_quantize_fp16.bits_0", _ds_moq("ds_quantize_fp16", bits=0), IP, "bits"),
    ds_case("compat.ds_quantize_fp16.bits_9", _ds_moq("ds_quantize_fp16", bits=9), IP, "bits"),
    ds_case(
        "compat.ds_quantize_fp16.int8_vals",
        _ds_moq("ds_quantize_fp16", data=lambda env: env.ops.asarray(np.ones((4, 24), np.int8))),
        IP,
        "vals",
    ),
    ds_case(
        "compat.ds_quantize_fp16.readonly_vals",
        _ds_moq("ds_quantize_fp16", data=lambda env: env.ops.readonly(_floats(env.rng, (4, 24), EK.F16))),
        IP,
        all_of("vals", "read-only|writeable|writable"),
    ),
    ds_case("compat.ds_quantize_fp16.rng_seed_on_nearest", _ds_moq("ds_quantize_fp16", rng_seed=1), IP, "rng_seed"),
    ds_case(
        "compat.ds_sr_quantize_fp16.rng_seed_negative", _ds_moq("ds_sr_quantize_fp16", rng_seed=-1), IP, "rng_seed"
    ),
    ds_case(
        "compat.ds_sr_quantize_asym_fp32.rng_offset_2_64",
        _ds_moq("ds_sr_quantize_asym_fp32", rng_seed=1, rng_offset=2**64),
        IP,
        "rng_offset",
    ),
    ds_case("compat.manual_seed.negative", _manual_seed(-1), IP, "seed"),
    ds_case("compat.manual_seed.2_64", _manual_seed(2**64), IP, "seed"),
    ds_case("compat.manual_seed.string", _manual_seed("7"), IP, "seed"),
]


# ---- quantplan.pytorch ------------------------------------------------------------------------------


def torch_case(
    name: str,
    call: Callable[[Any, Env], tuple[Callable[[], object], list[Any]]],
    error: type[qp.QuantPlanError],
    fragment: str,
) -> Case:
    """A mistake in a ``quantplan.pytorch`` call: CPU tensors on the numpy backend, CUDA tensors on torch."""

    def build(env: Env) -> Built:
        if env.ops.name == "cupy":
            pytest.skip("quantplan.pytorch takes PyTorch tensors (covered by the torch backend)")
        if not HAS_TORCH:
            pytest.skip("PyTorch is not installed")
        import quantplan.pytorch as qpt

        fn, watched = call(qpt, env)
        return [fn], watched

    return Case(name, build, error, fragment, ("numpy", "torch"))


def _fq(**kw: Any) -> Callable[[Any, Env], tuple[Callable[[], object], list[Any]]]:
    """qpt.fake_quantize(x (5, 37) f32, scale 0.05) with one argument replaced."""

    def call(qpt: Any, env: Env) -> tuple[Callable[[], object], list[Any]]:
        a: dict[str, Any] = dict(x=env.ops.tensor(_floats(env.rng, SHAPE)), scale=0.05)
        a.update({k: v(env) if callable(v) else v for k, v in kw.items()})
        return (lambda: qpt.fake_quantize(**a)), [v for v in a.values() if type(v).__module__.startswith("torch")]

    return call


def _dfq(**kw: Any) -> Callable[[Any, Env], tuple[Callable[[], object], list[Any]]]:
    def call(qpt: Any, env: Env) -> tuple[Callable[[], object], list[Any]]:
        a: dict[str, Any] = dict(x=env.ops.tensor(_floats(env.rng, SHAPE)), bits=8)
        a.update({k: v(env) if callable(v) else v for k, v in kw.items()})
        return (lambda: qpt.dynamic_fake_quantize(**a)), [a["x"]] if type(a["x"]).__module__.startswith("torch") else []

    return call


def _lsq(**kw: Any) -> Callable[[Any, Env], tuple[Callable[[], object], list[Any]]]:
    """qpt.fake_quantize_learnable(x, scale tensor (1,)) forward and backward."""

    def call(qpt: Any, env: Env) -> tuple[Callable[[], object], list[Any]]:
        import torch

        x = env.ops.tensor(_floats(env.rng, SHAPE)).requires_grad_(True)
        a: dict[str, Any] = dict(scale=env.ops.tensor(np.full((1,), 0.05, np.float32)).requires_grad_(True))
        a.update({k: v(env) if callable(v) else v for k, v in kw.items()})

        def run() -> None:
            y = qpt.fake_quantize_learnable(x, **a)
            y.backward(torch.ones_like(y))

        return run, [x.detach()]

    return call


CASES += [
    torch_case("pytorch.fake_quantize.scale_zero", _fq(scale=0.0), IP, "scale"),
    torch_case("pytorch.fake_quantize.scale_nan", _fq(scale=float("nan")), IP, "scale"),
    torch_case("pytorch.fake_quantize.scale_negative", _fq(scale=-0.5), IP, "scale"),
    torch_case("pytorch.fake_quantize.q_min_above_q_max", _fq(q_min=10, q_max=-10), IP, "q_min"),
    torch_case("pytorch.fake_quantize.q_min_float", _fq(q_min=-127.5), IP, "q_min"),
    torch_case("pytorch.fake_quantize.zero_point_1000", _fq(zero_point=1000), IP, "zero_point"),
    torch_case(
        "pytorch.fake_quantize.int_input", _fq(x=lambda env: env.ops.tensor(np.ones(SHAPE, np.int32))), IP, "dtype"
    ),
    torch_case("pytorch.fake_quantize.numpy_input", _fq(x=lambda env: _floats(env.rng, SHAPE)), IP, "x|input|tensor"),
    torch_case("pytorch.fake_quantize.list_input", _fq(x=[[1.0, 2.0]]), IP, "x|input|tensor"),
    torch_case(
        "pytorch.fake_quantize.scale_wrong_count",
        _fq(scale=lambda env: env.ops.tensor(np.full((4,), 0.05, np.float32)), scope=qp.TokenScope()),
        IP,
        "scale",
    ),
    torch_case(
        "pytorch.fake_quantize.channel_axis_out_of_range",
        _fq(scale=lambda env: env.ops.tensor(np.full((5,), 0.05, np.float32)), scope=qp.ChannelScope(axis=2)),
        IP,
        "axis",
    ),
    torch_case(
        "pytorch.fake_quantize.group_not_dividing",
        _fq(scale=lambda env: env.ops.tensor(np.full((5,), 0.05, np.float32)), scope=qp.GroupScope(group_size=5)),
        IP,
        "group_size",
    ),
    torch_case("pytorch.fake_quantize.scope_string", _fq(scope="tensor"), IP, "scope"),
    torch_case("pytorch.dynamic_fake_quantize.bits_0", _dfq(bits=0), IP, "bits"),
    torch_case("pytorch.dynamic_fake_quantize.bits_9", _dfq(bits=9), IP, "bits"),
    torch_case("pytorch.dynamic_fake_quantize.bits_float", _dfq(bits=4.5), IP, "bits"),
    torch_case("pytorch.dynamic_fake_quantize.bits_string", _dfq(bits="8"), IP, "bits"),
    torch_case("pytorch.dynamic_fake_quantize.stochastic_without_seed", _dfq(rounding=STOCHASTIC), IP, "rng_seed"),
    torch_case(
        "pytorch.dynamic_fake_quantize.rng_seed_negative",
        _dfq(rounding=STOCHASTIC, rng_seed=-1, rng_offset=0),
        IP,
        "rng_seed",
    ),
    torch_case("pytorch.dynamic_fake_quantize.rng_seed_on_nearest", _dfq(rng_seed=1, rng_offset=0), IP, "rng_seed"),
    torch_case("pytorch.dynamic_fake_quantize.mode_string", _dfq(mode="sym"), IP, "mode"),
    torch_case("pytorch.fake_quantize_learnable.grad_factor_nan", _lsq(grad_factor=float("nan")), IP, "grad_factor"),
]


# =====================================================================================================
# Tests
# =====================================================================================================

BACKENDS = [
    pytest.param("numpy", id="numpy"),
    pytest.param("cupy", id="cupy", marks=pytest.mark.gpu),
    pytest.param("torch", id="torch", marks=pytest.mark.gpu),
]


def _ops(backend: str) -> Ops:
    if backend == "torch" and not HAS_TORCH:
        pytest.skip("PyTorch is not installed")
    if backend != "numpy" and not qp.cuda_available():
        pytest.skip("no CUDA GPU visible")
    return Ops(backend)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}: {str(exc).splitlines()[0] if str(exc) else ''}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case: Case, backend: str, rng: np.random.Generator) -> None:
    if backend not in case.backends:
        pytest.skip(f"{case.name} does not apply to the {backend} backend")
    if case.name.endswith("cuda_without_gpu") and qp.cuda_available():
        pytest.skip("a GPU is visible: PlanPreference(backend=CUDA) is then a valid request")
    ops = _ops(backend)
    calls, watched = case.build(Env(ops, rng))
    before = [ops.snapshot(w) for w in watched]
    problems: list[str] = []
    for i, call in enumerate(calls):
        err: BaseException | None = None
        try:
            call()
        except Exception as exc:  # any escape is recorded, not just QuantPlanError
            err = exc
        where = f"call {i + 1}/{len(calls)}"
        if err is None:
            problems.append(f"{where}: no exception (expected {case.error.__name__})")
        elif not isinstance(err, case.error):
            problems.append(f"{where}: raised {_describe(err)} (expected {case.error.__name__})")
        elif not re.search(case.fragment, str(err), re.S):
            problems.append(f"{where}: message {str(err)!r} does not match {case.fragment!r}")
        changed = [j for j, (w, b) in enumerate(zip(watched, before, strict=True)) if ops.snapshot(w) != b]
        if changed:
            problems.append(f"{where}: wrote into watched operand(s) {changed}")
            break
    assert not problems, "; ".join(problems)


def test_table_is_large_and_names_are_unique() -> None:
    names = [c.name for c in CASES]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
    assert len(CASES) >= 150


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("base", [*BASES, *REFERENCE_BASES])
def test_baseline_runs(base: str, backend: str, rng: np.random.Generator) -> None:
    """Every case is one mistake away from this call, which must run and write its outputs."""
    if base in REFERENCE_BASES and backend != "numpy":
        pytest.skip(f"{base} runs on the REFERENCE backend only (no CUDA kernel yet)")
    ops = _ops(backend)
    setup = make_setup(base, rng)
    plan = setup.plan_cls.select(None, setup.desc, ops.pref)
    values = {k: ops.value(v) for k, v in setup.host.items()}
    args = setup.args_cls(**values)
    assert plan.can_implement(args)
    before = {k: ops.snapshot(values[k]) for k in setup.written()}
    ws = ops.workspace(plan.workspace_size())
    plan.run(None, ws, args)
    if backend != "numpy":
        import cupy

        cupy.cuda.Device().synchronize()
    for k in setup.written():
        assert ops.snapshot(values[k]) != before[k], f"{base}: {k} was not written"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["quantize", "loco_swizzle_quant", "dequantize", "quantized_reduction", "moq"])
def test_compat_baseline_runs(name: str, backend: str, rng: np.random.Generator) -> None:
    ops = _ops(backend)
    env = Env(ops, rng)
    ds = _ds()
    builder = {
        "quantize": _ds_quantize(),
        "loco_swizzle_quant": _ds_loco(),
        "dequantize": _ds_dequantize(),
        "quantized_reduction": _ds_reduce(),
        "moq": _ds_moq("ds_quantize_fp16"),
    }[name]
    call, _ = builder(ds, env)
    call()


def _run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "quantplan", *argv], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize("arch", ["sm90", "sm_900", "sm_abc", "sm_7", ""])
def test_precompile_rejects_a_bad_arch_in_one_line(arch: str) -> None:
    """``python -m quantplan precompile <bad arch>`` exits non-zero with one clear line, no traceback."""
    proc = _run_cli("precompile", arch)
    output = (proc.stdout + proc.stderr).strip()
    assert proc.returncode != 0, f"exit status 0 for {arch!r}: {output[-500:]!r}"
    assert "Traceback" not in output, f"traceback for {arch!r}: {output.splitlines()[-1]!r}"
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, f"{len(lines)} lines for {arch!r}: {output[-500:]!r}"
    if arch:
        assert arch in lines[0], f"the message does not name {arch!r}: {lines[0]!r}"
    assert re.search(r"sm_\d{2,3}", lines[0]), f"the message does not show a valid form (e.g. sm_90): {lines[0]!r}"
