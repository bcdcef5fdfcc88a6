"""Side-by-side peer benchmark: every plan against a copy, DeepSpeed, torch.compile and eager, in one run.

One table (SPEC section 6): for each workload, the plan's median kernel time (CUDA events, L2
flushed by size or rotated buffers, see :mod:`harness`), the same bytes moved by a
device-to-device copy (``% of copy``), the pure bandwidth floor of the plan's bytes read and
written (``floor µs``: ``harness.floor_time``, the fastest of a few one-pass load-one-vector /
store-one-vector kernels with no math; on an H200 it ties the copy), DeepSpeed's quantizer kernels built from source (``×
DeepSpeed`` = DeepSpeed's time / the plan's, > 1 means the plan is faster), ``torch.compile``
and PyTorch eager of the same math (``× torch.compile``), ``quantplan.compat.deepspeed`` on the
same input where it has the function (its time and × DeepSpeed), the kernel variant
(``plan.sku().variant``), the registers and occupancy of the kernels the plan launched (read
from the CUDA functions of its prepared launches).

Rows: the peer rows of the performance issue (8192x8192, fp16, and bf16 for the quantize rows):
dynamic per-token symmetric int8, dynamic group(128) asymmetric int4, dynamic group(128)
symmetric int8, dequantize per-token int8, MoQ dynamic fake quantization per row (nearest and
stochastic), swizzled quantization int4 in groups of 512 for 1 node x 8 devices (the 8192x8192
view and the flat 1-D bucket of the same 8192 * 8192 elements, as ZeRO++ hands it over), dequant-reduce
int4 of 8 peers (groups of 512); the 16x8192 row of every plan family (GPU µs against the copy,
plus host rows: ``plan.run`` with checks and with ``check=False`` where the plan has the
keyword, the compat call, DeepSpeed's binding, the ``torch.compile``d call and, when the package
has them, the cached functional ``qp.quantize`` and the ``torch.library`` operators in eager mode
(``quantplan.pytorch.fake_quantize`` and ``torch.ops.quantplan.fake_quantize`` on the per-channel
fake-quant row, ``torch.ops.quantplan.quantize_dynamic`` on the per-token row); 2000 calls each, wall clock, the device
synchronised only between batches of 100, outside the timed region; the median of 5 such rounds,
the rounds of a row's calls interleaved with each other and with an empty kernel's launch, whose
time goes in the row's notes;
DeepSpeed's and the compat layer's calls are timed alone, on arguments the bench made once); and
the headline shapes
of every plan family (static quantize / dequantize per-token int8 and group(128) int4, FP8
e4m3 per-tensor, dynamic FP8 per-token, per-channel and per-tensor, fake quantize per-channel
forward and backward, quantize / dequantize backward).

Block-scaled rows (their own table, ``--only-block``): MXFP8 e4m3 rceil / floor / 128x4 blocked
scales, MXFP6 e2m3, MXFP4, MXINT8, MXFP8 32x32 tiles, NVFP4 (given and computed tensor amax,
stochastic), FP8 1x128 (div; enc column-major; UE8M0 packed for DeepGEMM), FP8 128x128 (enc,
div), the fused rowwise + columnwise copies (MXFP8, FP8 1x128) and MXFP8 at 16x8192, bf16 and
fp16. Each: ours (``BlockScaledQuantizePlan.run``, or the kernel launcher of
``bench_block_scaled.py`` where the plan does not serve the problem on CUDA, with the plan's
reason in ``ran``), a copy of the same bytes, ``torch.compile`` of ``block_math.py`` (the same
format in plain PyTorch) where torchao lacks the format or layout (MXFP6, MXINT8, the blocked and
packed UE8M0 layouts, FP8 div), and torchao 0.18 on the same input (``torch.compile(to_mx)``,
``torch.compile(NVFP4Tensor.to_nvfp4)``, its Triton FP8 1x128 / transposed / 128x128 kernels;
installed next to the package, see ``../shared/peers/torchao/README.md``). Bits: ours against the
reference byte for byte; the peer against ours where the rule is the same (MX blocks where torchao
0.18's known rceil / byte-0 defects apply are counted apart), the share of differing bytes where
it is not (NVFP4 te vs torchao order, also checked against the reference's ``scale_mode="torchao"``;
FP8 div vs enc). A peer that fails leaves its error in the row.

Checks before timing: every plan's outputs are compared bit for bit with the reference backend
(``PlanPreference(backend=BackendKind.REFERENCE)``) on the same input (copied to NumPy), after
poisoning the outputs; every compat row is compared with DeepSpeed's output (fraction of codes
and of stored ``1 / scale`` values that differ: DeepSpeed builds with ``--use_fast_math``; a
difference is reported, never fatal). A plan that differs from the reference is flagged in the
table and makes the exit status 1. ``torch.compile``'s output is compared with the plan's too
(a note when it differs: the peer then computes something slightly different).

DeepSpeed: ``.peers/ds_build/deepspeed_quantizer_peer.so`` (found next to the repository or
above it; ``--ds-so``) is loaded with importlib after ``import torch``; without it, the sources
in ``.peers/deepspeed`` (or ``../shared/peers/deepspeed``; ``--ds-src``) are built (70-110 s).
DeepSpeed reads 16-bit input as fp16 only, so its bf16 cells are n/a.

Usage (on a GPU machine, from the repository root, with the package importable: ``pip install -e .``
or ``PYTHONPATH=.``; on a machine without network, pydantic from local wheels)::

    python3 benchmarks/bench_peers.py [--quick] [--out PATH] [--json PATH] [--commit SHA]
    python3 benchmarks/bench_peers.py --only-block [--dtype bf16|fp16] [--only TEXT]

About 4 minutes on an H200 (DeepSpeed loaded from its saved build; ``torch.compile``'s
compilations take most of it). The table goes to stdout and to ``benchmarks/results/<device>.md``
(e.g. ``h200.md``; ``--out PATH``) with the device and the commit measured (``git rev-parse HEAD``;
pass ``--commit`` where the tree has no ``.git``). ``--quick``: fewer repetitions, fp16 rows only
(a smoke run). ``--only TEXT``: rows whose label contains TEXT (``A|B``: either). ``--no-compile``,
``--no-deepspeed``: leave those peers out. ``--time-limit S``: past S seconds, later rows skip
``torch.compile`` (default 330); ``--stop-after S``: past S seconds, the rows left are listed
unrun (default 470, so one run stays under 8 minutes). ``--json PATH``: every figure as JSON.
``--only-block`` / ``--no-block``: only / none of the block-scaled rows (``--only-block`` writes
``benchmarks/results/<device>-block-peers.md`` by default); ``--no-torchao``: leave torchao out;
``--dtype``: the rows of one float dtype; ``--quick`` keeps the bf16 block rows (torchao's MX and
NVFP4 casts read bf16 and f32 only). ``--cpu-smoke``: no GPU: build every row on small shapes and
run it on the reference backend (checks the plumbing, times nothing). Exit status 1 when a plan differs from the reference or a
row fails, 2 without a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import inspect
import json
import math
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent
for _p in (str(_ROOT), str(_HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import harness  # noqa: E402

BIG = (8192, 8192)
SMALL = (16, 8192)
#: The BIG elements as one flat bucket (the swizzle row's 1-D view).
FLAT = (BIG[0] * BIG[1],)
GROUP = 128
SWIZZLE_GROUP = 512
PEERS = 8
SEED = 1234
DS_SO_NAME = "deepspeed_quantizer_peer"
#: Past this many elements per group DeepSpeed's quantize silently does nothing.
DS_MAX_GROUP = 16384
NA = "—"


# ---- the rows -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """One workload: op ``kind``, shape, float dtype and scheme."""

    label: str
    kind: str  # dynamic | quantize | dequantize | fake | fake_bwd | quant_bwd | dequant_bwd | moq | swizzle | reduce
    shape: tuple[int, ...]
    dtype: str  # fp16 | bf16 | "-" (codes only)
    code: str = "S8"  # ElementKind name of the codes
    scope: str = "token"  # token | group | channel0 | tensor
    group: int = GROUP
    asym: bool = False
    stochastic: bool = False
    host: bool = False  # also time the host side of one call

    @property
    def name(self) -> str:
        return f"{self.label} {'x'.join(map(str, self.shape))}"


def _both(spec: Spec) -> list[Spec]:
    return [spec, replace(spec, dtype="bf16")]


def specs() -> list[Spec]:
    """Every row, in table order: the issue's peer rows, the 16x8192 rows, the family headlines."""
    dyn = "dynamic"
    rows: list[Spec] = []
    rows += _both(Spec("dynamic per-token sym int8", dyn, BIG, "fp16"))
    rows += _both(Spec("dynamic group(128) asym int4", dyn, BIG, "fp16", code="U4", scope="group", asym=True))
    rows += _both(Spec("dynamic group(128) sym int8", dyn, BIG, "fp16", scope="group"))
    rows += _both(Spec("dequantize per-token int8", "dequantize", BIG, "fp16"))
    rows += _both(Spec("MoQ fake quant row nearest", "moq", BIG, "fp16"))
    rows += _both(Spec("MoQ fake quant row stochastic", "moq", BIG, "fp16", stochastic=True))
    rows += _both(Spec("swizzled quant int4 g512 1x8", "swizzle", BIG, "fp16", code="S4", group=SWIZZLE_GROUP))
    rows += _both(
        Spec("swizzled quant int4 g512 1x8 flat bucket", "swizzle", FLAT, "fp16", code="S4", group=SWIZZLE_GROUP)
    )
    rows.append(Spec("dequant-reduce int4 8 peers g512", "reduce", BIG, "-", code="S4", group=SWIZZLE_GROUP))
    # 16 x 8192: launch-bound; host time per call too.
    rows += _both(Spec("dynamic per-token sym int8", dyn, SMALL, "fp16", host=True))
    rows.append(
        Spec("dynamic group(128) asym int4", dyn, SMALL, "fp16", code="U4", scope="group", asym=True, host=True)
    )
    rows.append(Spec("static quantize per-token int8", "quantize", SMALL, "fp16", host=True))
    rows.append(Spec("dequantize per-token int8", "dequantize", SMALL, "fp16", host=True))
    rows.append(Spec("MoQ fake quant row nearest", "moq", SMALL, "fp16", host=True))
    rows.append(Spec("fake quant per-channel int8", "fake", SMALL, "fp16", scope="channel0", host=True))
    rows.append(Spec("fake quant per-channel bwd", "fake_bwd", SMALL, "fp16", scope="channel0", host=True))
    rows.append(Spec("quantize bwd per-token int8", "quant_bwd", SMALL, "fp16", host=True))
    rows.append(
        Spec("swizzled quant int4 g512 1x8", "swizzle", SMALL, "fp16", code="S4", group=SWIZZLE_GROUP, host=True)
    )
    rows.append(
        Spec("dequant-reduce int4 8 peers g512", "reduce", SMALL, "-", code="S4", group=SWIZZLE_GROUP, host=True)
    )
    # Family headlines, 8192 x 8192.
    rows += _both(Spec("static quantize per-token int8", "quantize", BIG, "fp16"))
    rows += _both(Spec("static quantize group(128) int4", "quantize", BIG, "fp16", code="S4", scope="group"))
    rows += _both(Spec("dequantize group(128) int4", "dequantize", BIG, "fp16", code="S4", scope="group"))
    rows += _both(Spec("static quantize fp8 e4m3 per-tensor", "quantize", BIG, "fp16", code="FP8_E4M3", scope="tensor"))
    rows += _both(Spec("dequantize fp8 e4m3 per-tensor", "dequantize", BIG, "fp16", code="FP8_E4M3", scope="tensor"))
    rows += _both(Spec("dynamic per-token fp8 e4m3", dyn, BIG, "fp16", code="FP8_E4M3"))
    rows += _both(Spec("dynamic per-channel(axis 0) int8", dyn, BIG, "fp16", scope="channel0"))
    rows.append(Spec("dynamic per-tensor fp8 e4m3", dyn, BIG, "fp16", code="FP8_E4M3", scope="tensor"))
    rows += _both(Spec("fake quant per-channel int8", "fake", BIG, "fp16", scope="channel0"))
    rows.append(Spec("fake quant per-channel bwd", "fake_bwd", BIG, "bf16", scope="channel0"))
    rows += _both(Spec("quantize bwd per-token int8", "quant_bwd", BIG, "fp16"))
    rows.append(Spec("dequantize bwd per-token int8", "dequant_bwd", BIG, "bf16"))
    return rows


# ---- dtypes and NumPy views ---------------------------------------------------------------------


def _float_dtype(name: str) -> Any:
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16, "-": torch.float16}[name]


def _float_kind(name: str) -> Any:
    import quantplan as qp

    return qp.ElementKind.BF16 if name == "bf16" else qp.ElementKind.F16


def _code_dtype(code: str) -> Any:
    import torch

    return {
        "S8": torch.int8,
        "U8": torch.uint8,
        "S4": torch.uint8,
        "U4": torch.uint8,
        "FP8_E4M3": torch.float8_e4m3fn,
    }[code]


def _q_range(code: str) -> tuple[int, int]:
    return {"S8": (-128, 127), "U8": (0, 255), "S4": (-8, 7), "U4": (0, 15)}.get(code, (0, 0))


def to_numpy(t: Any, bf16: str = "uint16") -> Any:
    """A NumPy copy (a view for CPU tensors) of tensor ``t`` in a dtype the reference backend reads:
    bf16 as uint16 bits (``bf16="bfloat16"``: as ml_dtypes' bfloat16), fp8 as uint8 bits."""
    import torch

    t = t.detach()
    if t.dtype == torch.bfloat16:
        bits = t.view(torch.int16).cpu().numpy()
        if bf16 == "bfloat16":
            import ml_dtypes

            return bits.view(ml_dtypes.bfloat16)
        return bits.view("uint16")
    if t.element_size() == 1 and t.dtype not in (torch.int8, torch.uint8):
        return t.view(torch.uint8).cpu().numpy()
    return t.cpu().numpy()


def count_diff(a: Any, b: Any) -> tuple[int, int]:
    """(elements whose bits differ, elements) of two equally sized arrays, NumPy or torch."""
    import numpy as np

    a = to_numpy(a) if not isinstance(a, np.ndarray) else a
    b = to_numpy(b) if not isinstance(b, np.ndarray) else b
    a, b = np.ascontiguousarray(a).reshape(-1), np.ascontiguousarray(b).reshape(-1)
    if a.nbytes != b.nbytes or a.size != b.size:
        return -1, a.size
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.itemsize]
    return int(np.count_nonzero(a.view(width) != b.view(width))), int(a.size)


def _as_int8(a: Any) -> Any:
    """Bytes of ``a`` (torch tensor or NumPy array) viewed as int8, DeepSpeed's code dtype."""
    import numpy as np

    if isinstance(a, np.ndarray):
        return a.view(np.int8)
    import torch

    return a.view(torch.int8)


def _nibbles(t: Any) -> Any:
    """The two nibbles of every byte of ``t`` as one flat uint8 array (NumPy)."""
    import numpy as np

    b = np.ascontiguousarray(to_numpy(t)).reshape(-1).view(np.uint8)
    return np.concatenate([b >> 4, b & 0xF])


# ---- one workload, built ------------------------------------------------------------------------

Arrays = Mapping[str, Any]


@dataclass
class Built:
    """Everything one row needs, independent of where it runs.

    ``inputs()`` draws a fresh buffer set (plan inputs, plus ``ds_*`` / ``peer_*`` tensors the
    peers use); ``outputs`` names the plan's outputs with their shape and dtype; ``args(arrays)``
    builds the plan's Args from named arrays (torch tensors or NumPy arrays).
    """

    plan_cls: Any
    desc: Any
    inputs: Callable[[], dict[str, Any]]
    outputs: dict[str, tuple[tuple[int, ...], Any]]
    args: Callable[[Arrays], Any]
    math: Callable[..., Any] | None = None
    math_in: tuple[str, ...] = ()
    eager: Callable[[Arrays], Any] | None = None  # default: ``math`` on ``math_in``
    ds: Callable[[Any, Arrays], Any] | None = None
    compat: Callable[[Any, Arrays], Any] | None = None
    compare: Callable[[Any, Any], str] | None = None
    #: Names of the plan's inputs (the rest of a buffer set feeds the peers only).
    plan_in: tuple[str, ...] = ()


def _param_count(shape: Sequence[int]) -> int:
    return int(math.prod(shape))


def _dyn_math(spec: Spec) -> Callable[..., Any] | None:
    """PyTorch doing the dynamic-range quantization (SPEC section 4), from bench_dynamic."""
    import bench_dynamic

    def case(scope: str, shape: tuple[int, int]) -> Any:
        return bench_dynamic.DynamicCase(spec.label, scope, spec.code, spec.asym, shape, spec.dtype)

    if spec.code not in ("S8", "FP8_E4M3", "U4"):
        return None
    if spec.asym:
        if spec.scope == "group" and spec.code == "U4" and spec.group == bench_dynamic.GROUP:
            return bench_dynamic.torch_math(case("group128", spec.shape))
        return None
    if spec.scope == "group":
        m, n = spec.shape
        rows = bench_dynamic.torch_math(case("token", (m * n // spec.group, spec.group)))

        def grouped(x: Any) -> tuple[Any, Any]:
            q, s = rows(x.reshape(-1, spec.group))
            return q.reshape(x.shape), s.reshape(m, n // spec.group)

        return grouped
    return bench_dynamic.torch_math(case(spec.scope, spec.shape))


def _quantize_case(spec: Spec, quantize: bool, backward: bool = False) -> Any:
    import bench_quantize

    q_min, q_max = _q_range(spec.code)
    scope = "token" if spec.scope in ("token", "tensor") else "group"
    return bench_quantize.Case(quantize, spec.label, spec.code, scope, q_min, q_max, spec.shape, spec.dtype, backward)


def _ds_type(ds: Any, asym: bool) -> Any:
    return ds.QuantizationType.Asymmetric if asym else ds.QuantizationType.Symmetric


def _compare_coded(bits: int, asym: bool) -> Callable[[Any, Any], str]:
    """Compat vs DeepSpeed on ``(codes, params)``: share of differing codes and stored 1/scale (offset)."""

    def compare(ds_out: Any, ours: Any) -> str:
        import numpy as np

        (dq, dp), (cq, cp) = ds_out, ours
        if bits == 4:
            a, b = _nibbles(dq), _nibbles(cq)
            codes = int(np.count_nonzero(a != b)), int(a.size)
        else:
            codes = count_diff(dq, cq)
        k = 2 if asym else 1
        dpn = np.ascontiguousarray(to_numpy(dp)).reshape(-1, k)
        cpn = np.ascontiguousarray(to_numpy(cp)).reshape(-1, k)
        text = f"codes {_frac(codes)}, 1/scale {_frac(count_diff(dpn[:, 0], cpn[:, 0]))}"
        if asym:
            text += f", offset {_frac(count_diff(dpn[:, 1], cpn[:, 1]))}"
        return text

    return compare


def _compare_values(ds_out: Any, ours: Any) -> str:
    return f"values {_frac(count_diff(ds_out, ours))}"


def _frac(d: tuple[int, int]) -> str:
    diff, total = d
    if diff < 0:
        return "size mismatch"
    if diff == 0:
        return "0"
    share = diff / max(1, total)
    return f"{share:.1e}" if share < 1e-3 else f"{100 * share:.2f}%"


def build(spec: Spec) -> Built:
    """The plan, operands and peers of ``spec``."""
    return {
        "dynamic": _build_dynamic,
        "quantize": _build_quantize,
        "dequantize": _build_dequantize,
        "fake": _build_fake,
        "fake_bwd": _build_fake,
        "quant_bwd": _build_quant_bwd,
        "dequant_bwd": _build_quant_bwd,
        "moq": _build_moq,
        "swizzle": _build_swizzle,
        "reduce": _build_reduce,
    }[spec.kind](spec)


def _scope(spec: Spec) -> Any:
    import quantplan as qp

    return {
        "token": qp.TokenScope(),
        "group": qp.GroupScope(axis=-1, group_size=spec.group),
        "channel0": qp.ChannelScope(axis=0),
        "tensor": qp.TensorScope(),
    }[spec.scope]


def _amax(x: Any, spec: Spec, param_shape: Sequence[int]) -> Any:
    """max |x| over each scale's elements, in the parameter shape."""
    m, n = spec.shape
    xf = x.float().abs()
    if spec.scope == "tensor":
        return xf.amax().reshape(param_shape)
    if spec.scope == "group":
        return xf.reshape(m, n // spec.group, spec.group).amax(dim=-1).reshape(param_shape)
    return xf.amax(dim=-1).reshape(param_shape)  # token, channel(axis 0): one per row


def _compat_groups(spec: Spec, params: int) -> int | None:
    """The group count of this scheme in DeepSpeed's vocabulary (token or last-axis groups of
    symmetric int8 / int4 or asymmetric int4), or None when it has no such function."""
    if spec.scope not in ("token", "group") or spec.code not in ("S8", "S4", "U4"):
        return None
    return None if spec.code == "U4" and not spec.asym else params


def _deepspeed_runs(spec: Spec, groups: int | None) -> bool:
    """DeepSpeed reads 16-bit input as fp16 only and does nothing past 16,384 elements per group."""
    return groups is not None and spec.dtype != "bf16" and _param_count(spec.shape) // groups <= DS_MAX_GROUP


def _build_dynamic(spec: Spec) -> Built:
    import torch

    import quantplan as qp
    from quantplan.compat import deepspeed as compat

    kind = qp.ElementKind[spec.code]
    desc = qp.DynamicRangeQuantizeDescriptor(
        shape=spec.shape,
        scope=_scope(spec),
        mode=qp.QuantMode.ASYMMETRIC if spec.asym else qp.QuantMode.SYMMETRIC,
        input_element=_float_kind(spec.dtype),
        output_element=kind,
    )
    outputs = {"q": (tuple(desc.output_shape), _code_dtype(spec.code)), "s": (tuple(desc.param_shape), torch.float32)}
    if spec.asym:
        outputs["z"] = (tuple(desc.param_shape), torch.int32)
    groups = _compat_groups(spec, _param_count(desc.param_shape))
    n_groups = groups or 1
    bits = 4 if spec.code in ("S4", "U4") else 8

    def ds(mod: Any, a: Arrays) -> Any:
        return mod.quantize(a["x"], n_groups, bits, _ds_type(mod, spec.asym))

    def ours(mod: Any, a: Arrays) -> Any:
        return compat.quantize(a["x"], n_groups, bits, compat.Asymmetric if spec.asym else compat.Symmetric)

    return Built(
        qp.DynamicRangeQuantizePlan,
        desc,
        lambda: {"x": torch.randn(spec.shape, device=_DEV, dtype=_float_dtype(spec.dtype))},
        outputs,
        lambda a: qp.DynamicRangeQuantizeArgs(input=a["x"], output=a["q"], scale_out=a["s"], zero_point_out=a.get("z")),
        math=_dyn_math(spec),
        math_in=("x",),
        ds=ds if _deepspeed_runs(spec, groups) else None,
        compat=ours if groups is not None else None,
        compare=_compare_coded(bits, spec.asym),
        plan_in=("x",),
    )


def _build_quantize(spec: Spec) -> Built:
    import torch

    import quantplan as qp

    q_min, q_max = _q_range(spec.code)
    desc = qp.QuantizeDescriptor(
        shape=spec.shape,
        scope=_scope(spec),
        input_element=_float_kind(spec.dtype),
        output_element=qp.ElementKind[spec.code],
    )
    limit = 448.0 if spec.code == "FP8_E4M3" else float(q_max)

    def inputs() -> dict[str, Any]:
        x = torch.randn(spec.shape, device=_DEV, dtype=_float_dtype(spec.dtype))
        s = (_amax(x, spec, desc.param_shape) / limit).clamp_min(1e-8).contiguous()
        return {"x": x, "scale": s}

    if spec.code == "FP8_E4M3":

        def fp8(x: Any, scale: Any) -> Any:
            return (x.float() / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)

        math_fn: Callable[..., Any] | None = fp8
    else:
        import bench_quantize

        math_fn = bench_quantize.torch_math(_quantize_case(spec, True)) if spec.group == GROUP else None
    return Built(
        qp.QuantizePlan,
        desc,
        inputs,
        {"q": (tuple(desc.output_shape), _code_dtype(spec.code))},
        lambda a: qp.QuantizeArgs(input=a["x"], output=a["q"], scale=a["scale"]),
        math=math_fn,
        math_in=("x", "scale"),
        plan_in=("x", "scale"),
    )


def _build_dequantize(spec: Spec) -> Built:
    import bench_quantize
    import torch

    import quantplan as qp
    from quantplan.compat import deepspeed as compat

    code = qp.ElementKind[spec.code]
    desc = qp.DequantizeDescriptor(
        shape=spec.shape, scope=_scope(spec), input_element=code, output_element=_float_kind(spec.dtype)
    )
    q_min, q_max = _q_range(spec.code)
    params = _param_count(desc.param_shape)

    def inputs() -> dict[str, Any]:
        if spec.code == "FP8_E4M3":
            q = (torch.randn(desc.input_shape, device=_DEV) * 64).to(torch.float8_e4m3fn)
        elif spec.code in ("S4", "U4"):
            q = torch.randint(0, 256, desc.input_shape, device=_DEV, dtype=torch.uint8)
        else:
            q = torch.randint(q_min, q_max + 1, desc.input_shape, device=_DEV, dtype=_code_dtype(spec.code))
        s = torch.rand(desc.param_shape, device=_DEV) * 1e-2 + 1e-3
        return {"q": q, "scale": s}

    # DeepSpeed's dequantize writes fp16 only: no bf16 row for it or for the compat layer.
    groups = _compat_groups(spec, params) if spec.dtype == "fp16" else None
    n_groups = groups or 1
    bits = 4 if spec.code in ("S4", "U4") else 8

    def ds(mod: Any, a: Arrays) -> Any:
        return mod.dequantize(_as_int8(a["q"]), a["scale"].reshape(n_groups, 1), n_groups, bits, _ds_type(mod, False))

    def ours(mod: Any, a: Arrays) -> Any:
        return compat.dequantize(_as_int8(a["q"]), a["scale"].reshape(n_groups, 1), n_groups, bits, compat.Symmetric)

    math_fn = None
    if spec.code == "FP8_E4M3" or spec.group == GROUP:
        math_fn = bench_quantize.torch_math(_quantize_case(spec, False))
    return Built(
        qp.DequantizePlan,
        desc,
        inputs,
        {"y": (tuple(desc.output_shape), _float_dtype(spec.dtype))},
        lambda a: qp.DequantizeArgs(input=a["q"], output=a["y"], scale=a["scale"]),
        math=math_fn,
        math_in=("q", "scale"),
        ds=ds if _deepspeed_runs(spec, groups) else None,
        compat=ours if groups is not None else None,
        compare=_compare_values,
        plan_in=("q", "scale"),
    )


def _build_fake(spec: Spec) -> Built:
    import torch

    import quantplan as qp

    q_min, q_max = _q_range(spec.code)
    backward = spec.kind == "fake_bwd"
    fields: dict[str, Any] = dict(
        shape=spec.shape,
        scope=_scope(spec),
        mode=qp.QuantMode.SYMMETRIC,
        element=_float_kind(spec.dtype),
        q_min=q_min,
        q_max=q_max,
    )
    desc: Any = qp.FakeQuantizeBackwardDescriptor(**fields) if backward else qp.FakeQuantizeDescriptor(**fields)
    dtype = _float_dtype(spec.dtype)
    axis = 0

    def inputs() -> dict[str, Any]:
        x = torch.randn(spec.shape, device=_DEV, dtype=dtype) * 2
        # Scales a little under amax / q_max, so some elements clip (and the STE mask is not all ones).
        s = (_amax(x, spec, desc.param_shape) / (q_max + 16)).clamp_min(1e-8).contiguous()
        d = {"x": x, "scale": s, "peer_zp": torch.zeros(s.numel(), device=_DEV, dtype=torch.int32)}
        if backward:
            d["dy"] = torch.randn(spec.shape, device=_DEV, dtype=dtype)
        return d

    def forward(x: Any, scale: Any) -> Any:
        inv = 1.0 / scale
        return (torch.round(x.float() * inv).clamp(q_min, q_max) * scale).to(x.dtype)

    def ste(x: Any, dy: Any, scale: Any) -> Any:
        q = torch.round(x.float() * (1.0 / scale))
        return dy * ((q >= q_min) & (q <= q_max))

    if backward:
        return Built(
            qp.FakeQuantizeBackwardPlan,
            desc,
            inputs,
            {"dx": (spec.shape, dtype)},
            lambda a: qp.FakeQuantizeBackwardArgs(
                input=a["x"], grad_output=a["dy"], grad_input=a["dx"], scale=a["scale"]
            ),
            math=ste,
            math_in=("x", "dy", "scale"),
            plan_in=("x", "dy", "scale"),
        )

    def native(a: Arrays) -> Any:
        return torch.fake_quantize_per_channel_affine(a["x"], a["scale"].reshape(-1), a["peer_zp"], axis, q_min, q_max)

    return Built(
        qp.FakeQuantizePlan,
        desc,
        inputs,
        {"y": (spec.shape, dtype)},
        lambda a: qp.FakeQuantizeArgs(input=a["x"], output=a["y"], scale=a["scale"]),
        math=forward,
        math_in=("x", "scale"),
        eager=native,
        plan_in=("x", "scale"),
    )


def _build_quant_bwd(spec: Spec) -> Built:
    import bench_quantize
    import torch

    import quantplan as qp

    _, q_max = _q_range(spec.code)
    quantize = spec.kind == "quant_bwd"
    dtype = _float_dtype(spec.dtype)
    fwd_desc = bench_quantize.make_descriptor(_quantize_case(spec, quantize))
    if quantize:
        plan_cls: Any = qp.QuantizeBackwardPlan
        desc: Any = qp.QuantizeBackwardDescriptor.from_forward(fwd_desc)
    else:
        plan_cls = qp.DequantizeBackwardPlan
        desc = qp.DequantizeBackwardDescriptor.from_forward(fwd_desc)

    def inputs() -> dict[str, Any]:
        x = torch.randn(spec.shape, device=_DEV, dtype=dtype)
        s = (_amax(x, spec, desc.param_shape) / (q_max + 8)).clamp_min(1e-8).contiguous()
        d = {"dy": torch.randn(spec.shape, device=_DEV, dtype=dtype), "scale": s}
        if quantize:
            d["x"] = x
        return d

    if quantize:

        def args(a: Arrays) -> Any:
            return qp.QuantizeBackwardArgs(input=a["x"], grad_output=a["dy"], grad_input=a["dx"], scale=a["scale"])

        math_in: tuple[str, ...] = ("x", "dy", "scale")
    else:

        def args(a: Arrays) -> Any:
            return qp.DequantizeBackwardArgs(grad_output=a["dy"], grad_input=a["dx"], scale=a["scale"])

        math_in = ("dy", "scale")
    return Built(
        plan_cls,
        desc,
        inputs,
        {"dx": (spec.shape, dtype)},
        args,
        math=bench_quantize.torch_backward_math(_quantize_case(spec, quantize, backward=True)),
        math_in=math_in,
        plan_in=math_in,
    )


def _build_moq(spec: Spec) -> Built:
    import torch

    import quantplan as qp
    from quantplan.compat import deepspeed as compat

    desc = qp.DynamicRangeFakeQuantizeDescriptor(
        shape=spec.shape,
        scope=_scope(spec),
        mode=qp.QuantMode.SYMMETRIC,
        element=_float_kind(spec.dtype),
        bits=8,
        rounding=qp.Rounding.STOCHASTIC if spec.stochastic else qp.Rounding.NEAREST_EVEN,
    )
    dtype = _float_dtype(spec.dtype)
    m, n = spec.shape
    groups = m  # one group per row
    rng = {"rng_seed": SEED, "rng_offset": 0} if spec.stochastic else {}

    def inputs() -> dict[str, Any]:
        x = torch.randn(spec.shape, device=_DEV, dtype=dtype)
        return {"x": x, "peer_x": x.clone()}  # the peers fake-quantize in place

    def math_fn(x: Any) -> Any:
        g = x.float().reshape(groups, -1)
        scale = g.abs().amax(dim=-1, keepdim=True) / 127.0
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        v = g * (1.0 / scale)
        q = torch.floor(v + torch.rand_like(v)) if spec.stochastic else torch.round(v)
        return (q.clamp(-128, 127) * scale).to(x.dtype).reshape(x.shape)

    def ds(mod: Any, a: Arrays) -> Any:
        fn = mod.ds_sr_quantize_fp16 if spec.stochastic else mod.ds_quantize_fp16
        return fn(a["peer_x"], groups, 8)

    def ours(mod: Any, a: Arrays) -> Any:
        if spec.stochastic:
            return compat.ds_sr_quantize_fp16(a["peer_x"], groups, 8, rng_seed=SEED, rng_offset=0)
        return compat.ds_quantize_fp16(a["peer_x"], groups, 8)

    def compare(ds_out: Any, theirs: Any) -> str:
        if spec.stochastic:
            return "n/a (different random streams: " + _compare_values(ds_out, theirs) + ")"
        return _compare_values(ds_out, theirs)

    return Built(
        qp.DynamicRangeFakeQuantizePlan,
        desc,
        inputs,
        {"y": (spec.shape, dtype)},
        lambda a: qp.DynamicRangeFakeQuantizeArgs(input=a["x"], output=a["y"], **rng),
        math=math_fn,
        math_in=("x",),
        ds=ds if spec.dtype == "fp16" else None,
        compat=ours,
        compare=compare,
        plan_in=("x",),
    )


def _swizzle(a: Any, nodes: int, devices: int) -> Any:
    """Partitions of flat ``a`` reordered [device][node] (one pipeline stage)."""
    return a.reshape(nodes, devices, -1).transpose(0, 1).reshape(-1)


def _build_swizzle(spec: Spec) -> Built:
    import torch
    from bench_zeropp import _quantize_groups

    import quantplan as qp
    from quantplan.compat import deepspeed as compat

    nodes, devices = 1, PEERS
    packed = spec.code == "S4"
    desc = qp.SwizzledQuantizeDescriptor(
        shape=spec.shape,
        group_size=spec.group,
        nodes=nodes,
        devices_per_node=devices,
        input_element=_float_kind(spec.dtype),
        output_element=qp.ElementKind[spec.code],
    )
    groups = _param_count(spec.shape) // spec.group
    bits = 4 if packed else 8

    def math_fn(x: Any) -> tuple[Any, Any]:
        q, s = _quantize_groups(x.float().reshape(groups, spec.group), 7.0 if packed else 127.0, packed)
        return _swizzle(q.reshape(-1), nodes, devices), _swizzle(s.reshape(-1), nodes, devices)

    def ds(mod: Any, a: Arrays) -> Any:
        return mod.swizzle_quant(a["x"], groups, bits, _ds_type(mod, False), 1, nodes, devices)

    def ours(mod: Any, a: Arrays) -> Any:
        return compat.swizzle_quant(a["x"], groups, bits, compat.Symmetric, 1, nodes, devices)

    return Built(
        qp.SwizzledQuantizePlan,
        desc,
        lambda: {"x": torch.randn(spec.shape, device=_DEV, dtype=_float_dtype(spec.dtype))},
        {"q": (tuple(desc.output_shape), _code_dtype(spec.code)), "s": (tuple(desc.param_shape), torch.float32)},
        lambda a: qp.SwizzledQuantizeArgs(input=a["x"], output=a["q"], scale_out=a["s"]),
        math=math_fn,
        math_in=("x",),
        ds=ds if spec.dtype == "fp16" else None,
        compat=ours,
        compare=_compare_coded(bits, False),
        plan_in=("x",),
    )


def _build_reduce(spec: Spec) -> Built:
    import torch
    from bench_zeropp import _quantize_groups, _unpack_s4

    import quantplan as qp
    from quantplan.compat import deepspeed as compat

    packed = spec.code == "S4"
    code = qp.ElementKind[spec.code]
    numel = _param_count(spec.shape)  # codes from all peers
    chunk = numel // PEERS
    desc = qp.DequantReduceDescriptor(
        peers=PEERS,
        chunk_elements=chunk,
        input_group_size=spec.group,
        output_group_size=spec.group,
        input_element=code,
        output_element=code,
    )
    in_groups, out_groups = numel // spec.group, chunk // spec.group
    bits = 4 if packed else 8
    q_max = 7.0 if packed else 127.0

    def inputs() -> dict[str, Any]:
        if packed:
            q = torch.randint(0, 256, desc.input_shape, device=_DEV, dtype=torch.uint8)
        else:
            q = torch.randint(-127, 128, desc.input_shape, device=_DEV, dtype=torch.int8)
        return {"q": q, "scale": torch.rand(desc.input_param_shape, device=_DEV) * 1e-3 + 1e-4}

    def math_fn(q: Any, s: Any) -> tuple[Any, Any]:
        codes = _unpack_s4(q) if packed else q
        y = codes.float().reshape(PEERS, chunk // spec.group, spec.group) * s.reshape(PEERS, -1, 1)
        total = y[0]
        for j in range(1, PEERS):
            total = total + y[j]
        out, scale = _quantize_groups(total, q_max, packed)
        return out.reshape(-1), scale.reshape(-1)

    def ds_args(a: Arrays) -> tuple[Any, Any]:
        return _as_int8(a["q"]).reshape(-1), a["scale"].reshape(in_groups, 1)

    def ds(mod: Any, a: Arrays) -> Any:
        return mod.quantized_reduction(*ds_args(a), in_groups, out_groups, bits, _ds_type(mod, False), PEERS)

    def ours(mod: Any, a: Arrays) -> Any:
        return compat.quantized_reduction(*ds_args(a), in_groups, out_groups, bits, compat.Symmetric, PEERS)

    return Built(
        qp.DequantReducePlan,
        desc,
        inputs,
        {"out": (tuple(desc.output_shape), _code_dtype(spec.code)), "s_out": (tuple(desc.param_shape), torch.float32)},
        lambda a: qp.DequantReduceArgs(input=a["q"], scale=a["scale"], output=a["out"], scale_out=a["s_out"]),
        math=math_fn,
        math_in=("q", "scale"),
        ds=ds,
        compat=ours,
        compare=lambda theirs, ours: _compare_coded(bits, False)(theirs, ours) + " (DeepSpeed sums in fp16)",
        plan_in=("q", "scale"),
    )


# ---- kernels the plan launched: registers and occupancy ---------------------------------------


def _children(obj: Any) -> list[Any]:
    if isinstance(obj, (list, tuple, set, frozenset)):
        return list(obj)
    if isinstance(obj, dict):
        return list(obj.values())
    if not (type(obj).__module__ or "").startswith("quantplan"):
        return []
    names = list(getattr(obj, "__dict__", {}))
    for cls in type(obj).__mro__:
        slots = getattr(cls, "__slots__", ())
        names += [slots] if isinstance(slots, str) else list(slots)
    out = []
    for name in names:
        with contextlib.suppress(AttributeError):
            out.append(getattr(obj, name))
    return out


def find_launches(plan: Any, max_depth: int = 6) -> list[Any]:
    """Prepared launches reachable from ``plan``: objects with ``function_ptr`` and ``_function``,
    searched from ``plan._prepared`` when the plan has it, else (or when that holds none) from
    the plan's own attributes and slots."""
    roots = [plan._prepared] if hasattr(plan, "_prepared") else []
    for root in (*roots, plan):
        found: list[Any] = []
        seen: set[int] = set()
        stack = [(root, 0)]
        while stack:
            obj, depth = stack.pop()
            if obj is None or id(obj) in seen or depth > max_depth:
                continue
            seen.add(id(obj))
            if hasattr(obj, "function_ptr") and hasattr(obj, "_function"):
                found.append(obj)
                continue
            stack.extend((child, depth + 1) for child in reversed(_children(obj)))
        if found:
            return found
    return []


@contextlib.contextmanager
def recording(launches: Sequence[Any]) -> Iterator[list[int]]:
    """Record the ``function_ptr`` of every launch that runs inside the block."""
    used: list[int] = []
    patched: list[tuple[Any, Any]] = []
    for cls in {type(launch) for launch in launches}:
        original = cls.__dict__.get("launch")
        if original is None:
            continue

        def wrapper(self: Any, *a: Any, _original: Any = original, **k: Any) -> Any:
            used.append(int(self.function_ptr))
            return _original(self, *a, **k)

        cls.launch = wrapper
        patched.append((cls, original))
    try:
        yield used
    finally:
        for cls, original in patched:
            cls.launch = original


@dataclass
class KernelInfo:
    regs: str = NA
    occupancy: str = NA


def kernel_info(launches: Sequence[Any], used: Sequence[int]) -> KernelInfo:
    """Registers per thread and theoretical occupancy of the launches used (all found if none recorded)."""
    from cupy.cuda import driver, runtime

    by_ptr = {int(launch.function_ptr): launch for launch in launches}
    order = list(dict.fromkeys(p for p in used if p in by_ptr))
    mark = ""
    if not order:
        order = list(by_ptr)
        mark = "?"
    if not order:
        return KernelInfo()
    props = runtime.getDeviceProperties(runtime.getDevice())
    max_threads = int(props.get("maxThreadsPerMultiProcessor", 2048))
    regs, occ = [], []
    for ptr in order:
        launch = by_ptr[ptr]
        fn = launch._function
        n_regs = getattr(fn, "num_regs", None)
        if n_regs is None:
            n_regs = driver.funcGetAttribute(getattr(driver, "CU_FUNC_ATTRIBUTE_NUM_REGS", 4), ptr)
        block = launch.block
        threads = int(math.prod(block)) if isinstance(block, (tuple, list)) else int(block)
        blocks = driver.occupancyMaxActiveBlocksPerMultiprocessor(ptr, threads, 0)
        regs.append(str(n_regs))
        occ.append(f"{blocks}×{threads} ({100 * blocks * threads / max_threads:.0f}%)")
    return KernelInfo(" + ".join(regs) + mark, " + ".join(occ) + mark)


# ---- DeepSpeed -------------------------------------------------------------------------------------


def _ancestors() -> list[Path]:
    out: list[Path] = []
    for start in (_ROOT, Path.cwd().resolve()):
        for d in (start, *start.parents):
            if d not in out:
                out.append(d)
    return out


def load_deepspeed(so: str | None, src: str | None) -> tuple[Any, str]:
    """DeepSpeed's quantizer module and how it was obtained (None and the reason on failure)."""
    import torch  # noqa: F401  (the extension links against torch's libraries)

    candidates = [Path(so)] if so else [d / ".peers" / "ds_build" / f"{DS_SO_NAME}.so" for d in _ancestors()]
    errors = []
    for path in candidates:
        if not path.is_file():
            continue
        try:
            spec = importlib.util.spec_from_file_location(DS_SO_NAME, path)
            assert spec is not None and spec.loader is not None
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            if hasattr(mod, "quantize"):
                return mod, f"loaded {path.name}"
        except Exception as exc:  # a stale build (other torch): build from source instead
            errors.append(f"{path}: {type(exc).__name__}: {exc}")
    sources = [Path(src)] if src else []
    for d in _ancestors():
        sources += [d / ".peers" / "deepspeed", d.parent / "shared" / "peers" / "deepspeed"]
    for path in sources:
        if not (path / "build.py").is_file():
            continue
        try:
            t0 = time.perf_counter()
            sys.path.insert(0, str(path))
            import build  # type: ignore[import-not-found]

            mod = build.load()
            return mod, f"built from source in {time.perf_counter() - t0:.0f} s"
        except Exception as exc:
            errors.append(f"{path}: {type(exc).__name__}: {exc}")
            break
    return None, "DeepSpeed unavailable: " + ("; ".join(errors) or "no .so and no sources found")


# ---- measuring one row --------------------------------------------------------------------------------

_DEV = "cuda"


@dataclass
class Result:
    """One table row (µs; None when not measured)."""

    workload: str
    dtype: str
    metric: str = "gpu"  # gpu | host
    plan_us: float | None = None
    nocheck_us: float | None = None
    copy_us: float | None = None
    floor_us: float | None = None
    ds_us: float | None = None
    compile_us: float | None = None
    eager_us: float | None = None
    compat_us: float | None = None
    functional_us: float | None = None
    nbytes: int = 0
    variant: str = NA
    regs: str = NA
    occupancy: str = NA
    reference: str = NA
    compat_vs_ds: str = NA
    notes: list[str] = field(default_factory=list)
    failed: bool = False
    #: Block-scaled rows (``metric="block"``): the torchao peer, its µs, its bytes against ours.
    peer: str = NA
    peer_us: float | None = None
    peer_vs_ours: str = NA


@dataclass
class Options:
    warmup: int
    reps: int
    host_calls: int
    compile: bool
    deepspeed: Any
    cpu: bool
    deadline: float


def _select(built: Built, reference: bool) -> Any:
    import quantplan as qp

    if reference:
        return built.plan_cls.select(None, built.desc, qp.PlanPreference(backend=qp.BackendKind.REFERENCE))
    import torch

    return built.plan_cls.select(torch.cuda.current_stream(), built.desc)


def _new_set(built: Built) -> dict[str, Any]:
    import torch

    s = built.inputs()
    for name, (shape, dtype) in built.outputs.items():
        s[name] = torch.empty(shape, device=_DEV, dtype=dtype)
    return s


def _plan_io_bytes(built: Built, s: Arrays) -> tuple[int, int]:
    """The plan's bytes read (its inputs) and bytes written (its outputs) in buffer set ``s``."""

    def nbytes(names: Sequence[str]) -> int:
        return sum(int(s[n].numel() * s[n].element_size()) for n in names)

    return nbytes(built.plan_in), nbytes(list(built.outputs))


def _plan_bytes(built: Built, s: Arrays) -> int:
    return sum(_plan_io_bytes(built, s))


#: Floors measured in this run, by (bytes read, bytes written).
_FLOORS: dict[tuple[int, int], float | None] = {}


def _floor(built: Built, s: Arrays, opt: Options) -> float | None:
    """The pure bandwidth floor for the plan's bytes read and written (``harness.floor_time``),
    measured once per byte split in a run."""
    read, written = key = _plan_io_bytes(built, s)
    if key not in _FLOORS:
        got = harness.floor_time(read, written, warmup=opt.warmup, reps=opt.reps)
        _FLOORS[key] = None if got is None else got[0]
    return _FLOORS[key]


def _reference_check(built: Built, s: Arrays) -> tuple[bool, str]:
    """Compare the plan's outputs in ``s`` with the reference backend's on the same inputs."""
    import numpy as np

    import quantplan as qp

    ref = _select(built, reference=True)
    arrays = {n: to_numpy(s[n]) for n in built.plan_in}
    outs = {n: np.zeros_like(to_numpy(s[n])) for n in built.outputs}
    ref.run(None, qp.Workspace.allocate(ref.workspace_size(), device=False), built.args({**arrays, **outs}))
    bad = []
    for n in built.outputs:
        diff, total = count_diff(s[n], outs[n])
        if diff:
            bad.append(f"{n}: {diff} of {total} differ" if diff > 0 else f"{n}: size differs")
    return (not bad), ("= reference" if not bad else "≠ reference (" + "; ".join(bad) + ")")


def _time(fns: Sequence[Callable[[], Any]], opt: Options) -> float:
    if opt.cpu:
        t0 = time.perf_counter()
        fns[0]()
        return (time.perf_counter() - t0) * 1e6
    return harness.time_gpu(list(fns), warmup=opt.warmup, reps=opt.reps)


def _host(fn: Callable[[], Any], opt: Options) -> float:
    if opt.cpu:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6
    return harness.host_overhead_us(fn, opt.host_calls)


def _call_named(fn: Any, names: Sequence[str], s: Arrays) -> Any:
    """``fn`` on the arrays of ``s`` named ``names``, in order."""
    return fn(*(s[n] for n in names))


def _outputs_of(result: Any) -> list[Any]:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def diff_vs_plan(got: Any, names: Sequence[str], s: Arrays) -> str:
    """ "" when the arrays ``got`` hold the bits of the plan's outputs ``names`` in ``s``, else
    which differ and in what share of their elements."""
    outs = _outputs_of(got)
    if len(outs) != len(names):
        return f"{len(outs)} outputs for the plan's {len(names)}"
    bad = []
    for a, n in zip(outs, names, strict=True):
        d = count_diff(a, s[n])
        if d[0]:
            bad.append(f"{n} {_frac(d)}")
    return ", ".join(bad)


def _functional(spec: Spec) -> Callable[[Arrays], Any] | None:
    """``qp.quantize(x, "int8", scope=...)`` when the package has the functional layer and the row fits."""
    import types

    import quantplan as qp

    fn = getattr(qp, "quantize", None)
    if fn is None or isinstance(fn, types.ModuleType) or spec.kind != "dynamic" or spec.scope != "token":
        return None
    if spec.code != "S8" or spec.asym:
        return None
    return lambda a: fn(a["x"], "int8", scope=qp.TokenScope())


def _custom_ops(spec: Spec) -> list[tuple[str, Callable[[Arrays], Any], tuple[str, ...]]]:
    """(label, call, the plan outputs it must equal) of the eager calls of quantplan's
    ``torch.library`` operators that back a row's plan: the public function (eager: no
    dispatcher, no gradient recorded) and the operator called through ``torch.ops`` (the
    dispatcher, the operator's Autograd kernel, then the same front-end). Static fake
    quantization per channel (``quantplan.pytorch.fake_quantize``) and dynamic per-token int8
    (``torch.ops.quantplan.quantize_dynamic``; the public function is the ``qp.quantize`` row)."""
    try:
        import quantplan.pytorch as qpt
        from quantplan import _torch_ops
    except Exception:  # a package without the operators
        return []
    import torch

    import quantplan as qp

    if spec.kind == "fake" and spec.scope == "channel0" and spec.code == "S8":
        q_min, q_max = _q_range(spec.code)
        scope = qp.ChannelScope(axis=0)
        op = torch.ops.quantplan.fake_quantize.default
        ints = _torch_ops.scope_ints(scope)
        return [
            (
                "quantplan.pytorch.fake_quantize (eager)",
                lambda a: qpt.fake_quantize(a["x"], a["scale"], None, q_min, q_max, scope=scope),
                ("y",),
            ),
            (
                "torch.ops.quantplan.fake_quantize (eager)",
                lambda a: op(a["x"], a["scale"], 0.0, None, None, ints, q_min, q_max),
                ("y",),
            ),
        ]
    if spec.kind == "dynamic" and spec.scope == "token" and spec.code == "S8" and not spec.asym:
        dyn = torch.ops.quantplan.quantize_dynamic.default
        code = _torch_ops._KIND_INDEX[qp.ElementKind.S8]
        token = _torch_ops.scope_ints(qp.TokenScope())
        return [
            (
                "torch.ops.quantplan.quantize_dynamic (eager)",
                lambda a: dyn(a["x"], code, token, False, None, None, 0, False, None, 0)[:2],
                ("q", "s"),
            )
        ]
    return []


def measure(spec: Spec, opt: Options) -> list[Result]:
    """The table rows of ``spec``: its GPU row, and its host rows when ``spec.host``."""
    import torch

    import quantplan as qp

    row = Result(spec.name, spec.dtype)
    built = build(spec)
    plan = _select(built, reference=opt.cpu)
    row.variant = str(plan.sku().variant)
    ws = qp.Workspace.allocate(plan.workspace_size(), device=None if not opt.cpu else False)
    first = _new_set(built)
    row.nbytes = _plan_bytes(built, first)
    sets = [first] + [_new_set(built) for _ in range(0 if opt.cpu else harness.rotation_sets(row.nbytes) - 1)]
    # Plans and the compat layer read NumPy arrays on the reference backend (--cpu-smoke).
    convert = partial(to_numpy, bf16="bfloat16") if opt.cpu else (lambda t: t)
    args = [built.args({k: convert(v) for k, v in s.items()}) for s in sets]
    stream = None if opt.cpu else torch.cuda.current_stream()

    # Correctness first: poisoned outputs, one run, compared with the reference backend.
    for n in built.outputs:
        first[n].view(torch.uint8).fill_(0xA5)
    launches = [] if opt.cpu else find_launches(plan)
    with recording(launches) as used:
        plan.run(stream, ws, args[0])
    if not opt.cpu:
        torch.cuda.synchronize()
        info = kernel_info(launches, used)
        row.regs, row.occupancy = info.regs, info.occupancy
    ok, row.reference = _reference_check(built, first)
    if not ok:
        row.failed = True
        print(f"WARNING: {spec.name} {spec.dtype}: plan {row.reference}", flush=True)

    plan_fns = [partial(plan.run, stream, ws, a) for a in args]
    row.plan_us = _time(plan_fns, opt)
    if not opt.cpu:
        row.copy_us, _ = harness.copy_time(
            row.nbytes // 2, row.nbytes - row.nbytes // 2, warmup=opt.warmup, reps=opt.reps
        )
        row.floor_us = _floor(built, first, opt)

    # DeepSpeed and the compat layer: compare their outputs on the same input, then time them.
    _peers(built, first, sets, opt, convert, row)

    # PyTorch: eager and torch.compile of the same math.
    compiled: Callable[..., Any] | None = None
    if built.math is not None or built.eager is not None:
        math_fn, names = built.math, built.math_in
        eager = built.eager or partial(_call_named, math_fn, names)
        try:
            row.eager_us = _time([partial(eager, s) for s in sets], opt)
        except Exception as exc:
            row.notes.append(f"eager failed: {_brief(exc)}")
        if math_fn is not None and opt.compile and time.perf_counter() < opt.deadline:
            try:
                import torch._dynamo

                torch._dynamo.reset()
                compiled = torch.compile(math_fn, dynamic=False)
                got = compiled(*(first[n] for n in names))
                if not opt.cpu:
                    torch.cuda.synchronize()
                differ = diff_vs_plan(got, list(built.outputs), first)
                if differ:
                    row.notes.append(f"torch.compile ≠ plan: {differ}")
                c = compiled
                row.compile_us = _time([partial(_call_named, c, names, s) for s in sets], opt)
            except Exception as exc:
                compiled = None
                row.notes.append(f"torch.compile failed: {_brief(exc)}")
        elif math_fn is not None and opt.compile:
            row.notes.append("torch.compile skipped (time limit)")
    results = [row]
    if spec.host:
        results += _host_rows(spec, built, plan, ws, sets[0], args[0], compiled, opt, convert)
    return results


def _fresh(s: Arrays) -> dict[str, Any]:
    """``s`` with its ``peer_*`` tensors cloned (peers that work in place get untouched input)."""
    return {k: (v.clone() if k.startswith("peer_") else v) for k, v in s.items()}


def _peers(built: Built, first: Arrays, sets: Sequence[Arrays], opt: Options, convert: Any, row: Result) -> None:
    """DeepSpeed and the compat layer on ``row``: outputs compared, then timed. Failures become notes."""
    import torch

    ds = opt.deepspeed
    ds_fn = built.ds if ds is not None else None
    if built.compat is None:
        row.compat_vs_ds = NA
    elif ds_fn is None:
        row.compat_vs_ds = "no DeepSpeed peer" if built.ds is None else "DeepSpeed not loaded"
    elif built.compare is not None:
        try:
            theirs = ds_fn(ds, _fresh(first))
            ours = built.compat(ds, _fresh(first))
            torch.cuda.synchronize()
            row.compat_vs_ds = built.compare(theirs, ours)
        except Exception as exc:
            row.compat_vs_ds = f"compare failed: {_brief(exc)}"
    if built.compat is not None:
        compat_fn = built.compat
        cargs = [{k: convert(v) for k, v in s.items()} for s in sets]
        try:
            row.compat_us = _time([partial(compat_fn, ds, s) for s in cargs], opt)
        except Exception as exc:
            row.notes.append(f"compat failed: {_brief(exc)}")
    if ds_fn is not None:
        call = ds_fn
        try:
            row.ds_us = _time([partial(call, ds, s) for s in sets], opt)
        except Exception as exc:
            row.notes.append(f"DeepSpeed failed: {_brief(exc)}")


def _brief(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160]}" if text else type(exc).__name__


def _host_rows(
    spec: Spec, built: Built, plan: Any, ws: Any, s: Arrays, a0: Any, compiled: Any, opt: Options, convert: Any
) -> list[Result]:
    """Host µs per call (``opt.host_calls`` calls, no sync inside) of the plan and its peers, and
    of the functional ``qp.quantize`` where the package has it. The plan's, the peers' and the
    functional calls and an empty kernel's launch (the floor, in the notes) are timed in
    interleaved rounds (``harness.host_overhead_interleaved``): a slow spell of the host falls on
    all of them; ``torch.compile``'s call is timed on its own afterwards."""
    import torch

    stream = None if opt.cpu else torch.cuda.current_stream()
    row = Result(f"host µs/call: {spec.name}", spec.dtype, metric="host")
    timed: dict[str, Callable[[], Any]] = {"plan_us": lambda: plan.run(stream, ws, a0)}
    if _takes_check(plan):
        timed["nocheck_us"] = lambda: plan.run(stream, ws, a0, check=False)
    else:
        row.notes.append("run has no check keyword")
    ds = opt.deepspeed
    peers: list[tuple[str, Callable[[], Any]]] = []
    if built.compat is not None:
        compat_fn, cs = built.compat, {k: convert(v) for k, v in s.items()}
        peers.append(("compat_us", lambda: compat_fn(ds, cs)))
    if built.ds is not None and ds is not None:
        ds_fn = built.ds
        peers.append(("ds_us", lambda: ds_fn(ds, s)))
    for attr, fn in peers:
        try:
            timed[attr] = _library_call(fn, [m for m in (ds, _compat_module()) if m is not None])
        except Exception as exc:
            row.notes.append(f"{attr[:-3]} failed: {_brief(exc)}")
    rows = [row]
    functional = _functional(spec)
    f_row: Result | None = None
    if functional is not None:
        # The functional layer (qp.quantize): its cached host path, beside plan.run and the peers.
        f_row = Result(f'host µs/call: qp.quantize(x, "int8", TokenScope()) {spec.name}', spec.dtype, metric="host")
        try:
            qt = functional(s)
            differ = diff_vs_plan((qt.codes, qt.scale), ("q", "s"), s)
            f_row.reference = "= plan bits" if not differ else f"≠ plan: {differ}"
            f_row.failed = bool(differ)
            timed["functional"] = lambda: functional(s)
        except Exception as exc:
            f_row.notes.append(f"qp.quantize failed: {_brief(exc)}")
        rows.append(f_row)
    op_rows: dict[str, Result] = {}
    for label, call, names in _custom_ops(spec):
        # The torch.library operators in eager mode: the public function and torch.ops, beside plan.run.
        op_row = Result(f"host µs/call: {label} {spec.name}", spec.dtype, metric="host")
        try:
            differ = diff_vs_plan(call(s), names, s)
            op_row.reference = "= plan bits" if not differ else f"≠ plan: {differ}"
            op_row.failed = bool(differ)
            timed[f"op:{label}"] = partial(call, s)
            op_rows[f"op:{label}"] = op_row
        except Exception as exc:
            op_row.notes.append(f"failed: {_brief(exc)}")
        rows.append(op_row)
    if not opt.cpu:
        timed["floor"] = _empty_launch()
    times = _host_many(timed, opt)
    for attr, us in times.items():
        if attr in op_rows:
            op_rows[attr].plan_us = us
            op_rows[attr].notes.append(f"plan.run {_us(row.plan_us)} µs")
        elif attr == "functional" and f_row is not None:
            f_row.plan_us = us
        elif attr == "floor":
            row.notes.append(f"empty-kernel launch in the same rounds: {_us(us)} µs")
        else:
            setattr(row, attr, us)
    if f_row is not None:
        f_row.ds_us, f_row.compat_us = row.ds_us, row.compat_us
        f_row.notes.append(f"plan.run {_us(row.plan_us)} µs")
    if compiled is not None:
        names = built.math_in
        try:
            row.compile_us = _host(lambda: compiled(*(s[n] for n in names)), opt)
        except Exception as exc:
            row.notes.append(f"compile failed: {_brief(exc)}")
    return rows


def _host_many(fns: dict[str, Callable[[], Any]], opt: Options) -> dict[str, float]:
    """:func:`_host` of each of ``fns``, in interleaved rounds on a GPU."""
    if opt.cpu:
        return {name: _host(fn, opt) for name, fn in fns.items()}
    return harness.host_overhead_interleaved(fns, opt.host_calls)


@lru_cache(maxsize=1)
def _empty_launch() -> Callable[[], Any]:
    """One ``cuLaunchKernel`` of an empty kernel through CuPy's ``driver.launchKernel`` on
    PyTorch's current stream: the driver call every plan makes, and nothing else."""
    import cupy
    import torch
    from cupy.cuda import driver

    kernel = cupy.RawKernel('extern "C" __global__ void qp_bench_empty() {}', "qp_bench_empty")
    kernel.compile()
    function = kernel.kernel.ptr
    stream = torch.cuda.current_stream().cuda_stream
    launch = driver.launchKernel
    return lambda: launch(function, 1, 1, 1, 32, 1, 1, 0, stream, 0, 0)


def host_floor_rows(opt: Options) -> list[Result]:
    """What any host row pays on this machine: one ``cuLaunchKernel`` of an empty kernel through
    CuPy's ``driver.launchKernel`` (the driver call every plan makes), and one ``torch.empty`` (a
    front-end allocates one per output). The host's speed moves every host row together (between
    machines and between runs on one machine, by up to ~1.5x); these rows and DeepSpeed's binding
    show it."""
    import torch

    device = torch.device("cuda", torch.cuda.current_device())
    rows = []
    for name, fn in (
        ("cuLaunchKernel of an empty kernel", _empty_launch()),
        ("torch.empty(16, 8192, dtype=int8)", lambda: torch.empty(16, 8192, dtype=torch.int8, device=device)),
    ):
        row = Result(f"host µs/call: floor: {name}", "-", metric="host")
        row.plan_us = _host(fn, opt)
        rows.append(row)
    return rows


def _compat_module() -> Any:
    from quantplan.compat import deepspeed as compat

    return compat


def _library_call(thunk: Callable[[], Any], modules: Sequence[Any]) -> Callable[[], Any]:
    """The one public function of ``modules`` that ``thunk`` calls, bound to the arguments that
    ``thunk`` made for it, as a thunk of its own: a host row times the library's call, not the
    bench's reshapes and views around it (DeepSpeed's and the compat layer's rows alike). ``thunk``
    itself where it makes no such call or more than one."""
    calls: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = []
    depth = [0]

    def recorder(f: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if depth[0] == 0:
                calls.append((f, args, kwargs))
            depth[0] += 1
            try:
                return f(*args, **kwargs)
            finally:
                depth[0] -= 1

        return call

    saved: list[tuple[Any, str, Any]] = []
    try:
        for module in modules:
            for name in dir(module):
                f = getattr(module, name)
                if not name.startswith("_") and inspect.isroutine(f):
                    saved.append((module, name, f))
                    setattr(module, name, recorder(f))
        thunk()
    finally:
        for module, name, f in saved:
            setattr(module, name, f)
    if len(calls) != 1:
        return thunk
    f, args, kwargs = calls[0]
    return partial(f, *args, **kwargs)


def _takes_check(plan: Any) -> bool:
    """Whether ``plan.run`` has the ``check`` keyword."""
    try:
        return "check" in inspect.signature(plan.run).parameters
    except (TypeError, ValueError):  # no signature to read: measure the default path only
        return False


# ---- block-scaled rows (MX, NVFP4, FP8 blocks) -------------------------------------------------------------

#: The calibrated NVFP4 tensor amax of the "given amax" rows (the bench's data: randn * 4 stays below it).
BLOCK_AMAX = 24.0


@dataclass(frozen=True)
class BlockSpec:
    """One block-scaled workload: a :data:`quantplan.vocabulary.formats.FORMATS` row and its options.

    ``fused``: rowwise and columnwise copies from one read (``block`` 32: MXFP8; 128: FP8 1x128);
    ``amax``: NVFP4's tensor amax, ``given`` (:data:`BLOCK_AMAX`) or ``computed``; ``peer``: the
    torchao producer timed on the same input (``to_mx``, ``to_mx_pair``, ``nvfp4``, ``nvfp4_amax``,
    ``fp8_lhs``, ``fp8_lhs_pair``, ``fp8_rhs``, ``fp8_rhs_t``); ``math``: the ``benchmarks/block_math.py``
    function timed under ``torch.compile`` (``mx`` or ``fp8``) where torchao lacks the format or layout.
    """

    label: str
    fmt: str
    shape: tuple[int, int]
    dtype: str
    block: tuple[int, int] | None = None
    mode: str | None = None
    layout: str = "compact"
    fused: bool = False
    amax: str = ""
    stochastic: bool = False
    peer: str = ""
    math: str = ""

    @property
    def name(self) -> str:
        return f"{self.label} {'x'.join(map(str, self.shape))}"

    @property
    def element(self) -> str:
        """The reference's element name (``e4m3``, ``e2m3``, ``e2m1``, ``int8``, ...)."""
        return {"mxfp8_e4m3": "e4m3", "mxfp6_e2m3": "e2m3", "mxfp4": "e2m1", "mxint8": "int8"}.get(self.fmt, "e4m3")

    @property
    def family(self) -> str:
        return "mx" if self.fmt.startswith("mx") else "nvfp4" if self.fmt == "nvfp4" else "fp8"


def block_specs() -> list[BlockSpec]:
    """The block-scaled rows, bf16 then fp16 (issue 25's bars: 8192 x 8192 and 16 x 8192)."""
    rows: list[BlockSpec] = []
    for dtype in ("bf16", "fp16"):
        b = partial(BlockSpec, shape=BIG, dtype=dtype)
        rows += [
            b("MXFP8 e4m3 rceil", "mxfp8_e4m3", mode="rceil", peer="to_mx"),
            b("MXFP8 e4m3 floor", "mxfp8_e4m3", mode="floor", peer="to_mx"),
            b(
                "MXFP8 e4m3 rceil, 128x4 blocked scales",
                "mxfp8_e4m3",
                mode="rceil",
                layout="blocked",
                peer="to_mx",
                math="mx",
            ),
            b("MXFP6 e2m3 rceil", "mxfp6_e2m3", mode="rceil", peer="to_mx", math="mx"),
            b("MXFP4 e2m1 rceil", "mxfp4", mode="rceil", peer="to_mx"),
            b("MXINT8 rceil", "mxint8", mode="rceil", math="mx"),
            b("MXFP8 e4m3 32x32 tiles rceil", "mxfp8_e4m3", block=(32, 32), mode="rceil"),
            b("NVFP4 te, given tensor amax", "nvfp4", amax="given", peer="nvfp4"),
            b("NVFP4 te, computed tensor amax", "nvfp4", amax="computed", peer="nvfp4_amax"),
            b("NVFP4 te stochastic, given tensor amax", "nvfp4", amax="given", stochastic=True),
            b("FP8 1x128 div f32", "fp8_block_e4m3", mode="div", math="fp8"),
            b("FP8 1x128 enc f32 column-major", "fp8_block_e4m3", mode="enc", layout="column_major", peer="fp8_lhs"),
            b("FP8 1x128 UE8M0 packed (DeepGEMM)", "fp8_block_e4m3_ue8m0", layout="packed_ue8m0", math="fp8"),
            b("FP8 128x128 enc f32", "fp8_block_e4m3", block=(128, 128), mode="enc", peer="fp8_rhs_t"),
            b("FP8 128x128 div f32", "fp8_block_e4m3", block=(128, 128), mode="div", peer="fp8_rhs_t"),
            b(
                "FP8 128x128 enc f32, against column-major codes",
                "fp8_block_e4m3",
                block=(128, 128),
                mode="enc",
                peer="fp8_rhs",
            ),
            b("MXFP8 e4m3 rceil rowwise + columnwise", "mxfp8_e4m3", mode="rceil", fused=True, peer="to_mx_pair"),
            b(
                "MXFP8 e4m3 rceil rowwise + columnwise, 128x4 blocked scales",
                "mxfp8_e4m3",
                mode="rceil",
                layout="blocked",
                fused=True,
                peer="to_mx_pair",
            ),
            b(
                "FP8 1x128 enc column-major rowwise + columnwise",
                "fp8_block_e4m3",
                mode="enc",
                layout="column_major",
                fused=True,
                peer="fp8_lhs_pair",
            ),
            b("FP8 1x128 enc rowwise + columnwise", "fp8_block_e4m3", mode="enc", fused=True, peer="fp8_lhs_pair"),
            BlockSpec("MXFP8 e4m3 rceil", "mxfp8_e4m3", SMALL, dtype, mode="rceil", peer="to_mx"),
        ]
    return rows


def _block_desc(spec: BlockSpec) -> Any:
    """The descriptor of ``spec`` (fused rows: ``columnwise="transposed"``, a field of the wired plans)."""
    import quantplan as qp

    fields: dict[str, Any] = dict(
        shape=spec.shape,
        format=spec.fmt,
        input_element=_float_kind(spec.dtype),
        block=spec.block,
        scale_mode=spec.mode,
        scale_layout=spec.layout,
        rounding=qp.Rounding.STOCHASTIC if spec.stochastic else qp.Rounding.NEAREST_EVEN,
    )
    if spec.fused:
        fields["columnwise"] = "transposed"
    return qp.BlockScaledQuantizeDescriptor(**fields)


def _kernel_kwargs(spec: BlockSpec) -> dict[str, Any]:
    """``bench_block_scaled._ours`` / ``_ours_tiles`` keywords of ``spec`` (the kernel launchers)."""
    rule = "ue8m0" if spec.fmt.endswith("ue8m0") else "te" if spec.family == "nvfp4" else str(spec.mode)
    if spec.fused:
        return {"block": 32 if spec.family == "mx" else 128, "rule": rule}
    if spec.block is not None and spec.block[0] > 1:
        return {"block": spec.block, "rule": rule, "element": spec.element, "layout": spec.layout}
    element = "nvfp4" if spec.family == "nvfp4" else spec.element
    block = {"mx": 32, "nvfp4": 16, "fp8": 128}[spec.family]
    kw: dict[str, Any] = {"element": element, "block": block, "rule": rule, "layout": spec.layout}
    if spec.family == "nvfp4":
        kw["tensor_amax"] = "given" if spec.amax == "given" else "compute"
    return kw


@dataclass
class _BlockOurs:
    """Our producer of one block-scaled row: one thunk per buffer set, the outputs of set 0
    (codes, scales[, tensor scale]; fused: rowwise then columnwise codes and scales) once called,
    and what ran (the plan, or the kernel launcher where the plan does not serve the problem yet)."""

    thunks: Sequence[Callable[[], Any]]
    outputs: Callable[[], list[Any]]
    how: str


def _first_outputs(fn: Callable[[], Any]) -> Callable[[], list[Any]]:
    """``fn``'s outputs as a list, from its first call (kept for the later ones)."""
    kept: list[Any] = []

    def outputs() -> list[Any]:
        if not kept:
            kept.extend(fn())
        return kept

    return outputs


def _block_ours(spec: BlockSpec, xs: Sequence[Any], opt: Options) -> _BlockOurs:
    """The plan on CUDA (on the reference backend with ``--cpu-smoke``; fused rows: the plan's
    ``columnwise="transposed"`` copy); where the plan refuses the problem or lacks the field (not
    wired on this tree), the kernel launcher of ``bench_block_scaled``, with the plan's reason."""
    import quantplan as qp

    if spec.fused and opt.cpu:  # --cpu-smoke: the reference's pair stands in for the kernel
        thunks = [partial(_block_reference, spec, _x_host(x)) for x in xs]
        return _BlockOurs(thunks, _first_outputs(thunks[0]), "reference (--cpu-smoke)")
    try:
        return _block_plan(spec, xs, opt)
    except (qp.QuantPlanError, TypeError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        if opt.cpu or spec.stochastic:  # the launchers round to nearest only
            raise
        import bench_block_scaled as bbs

        kw = _kernel_kwargs(spec)
        tiles = spec.fused or (spec.block is not None and spec.block[0] > 1)
        fns = [bbs._ours_tiles(x, spec.fused, **kw) if tiles else bbs._ours(x, **kw) for x in xs]
        reason = _brief(exc).split(":", 1)[-1].strip()[:80]
        return _BlockOurs(fns, _first_outputs(fns[0]), f"kernel launcher (plan: {reason})")


def _block_plan(spec: BlockSpec, xs: Sequence[Any], opt: Options) -> _BlockOurs:
    """``BlockScaledQuantizePlan.run`` on each buffer set of ``spec`` (raises where the plan does not serve it)."""
    import torch

    import quantplan as qp

    desc = _block_desc(spec)
    p = desc._problem()
    plan = _select_block(desc, opt)
    ws = qp.Workspace.allocate(plan.workspace_size(), device=None if not opt.cpu else False)
    scale_dtype = {qp.ElementKind.F32: torch.float32, qp.ElementKind.I32: torch.int32}.get(p.scale_kind, torch.uint8)
    code_dtype = torch.int8 if p.code_kind is qp.ElementKind.S8 else torch.uint8
    dev = "cpu" if opt.cpu else _DEV
    amax = torch.tensor([BLOCK_AMAX], dtype=torch.float32, device=dev) if spec.amax == "given" else None

    def host(a: Any) -> Any:  # --cpu-smoke: the reference backend reads NumPy
        return a if a is None or not opt.cpu else to_numpy(a, bf16="bfloat16")

    sets = []
    for x in xs:
        outs = [
            torch.empty(p.codes_shape, dtype=code_dtype, device=dev),
            torch.empty(p.scales_shape, dtype=scale_dtype, device=dev),
        ]
        if p.is_nvfp4:
            outs.append(torch.empty((1,), dtype=torch.float32, device=dev))
        fields: dict[str, Any] = {}
        if spec.fused:
            outs.append(torch.empty(desc.columnwise_codes_shape, dtype=code_dtype, device=dev))
            outs.append(torch.empty(desc.columnwise_scales_shape, dtype=scale_dtype, device=dev))
            fields = {"columnwise_codes": host(outs[-2]), "columnwise_scales": host(outs[-1])}
        outs = [host(o) for o in outs]
        args = qp.BlockScaledQuantizeArgs(
            input=host(x),
            codes=outs[0],
            scales=outs[1],
            tensor_scale=outs[2] if p.is_nvfp4 else None,
            global_amax=host(amax),
            rng_seed=SEED if spec.stochastic else None,
            rng_offset=0 if spec.stochastic else None,
            **fields,
        )
        sets.append((args, outs))
    stream = None if opt.cpu else torch.cuda.current_stream()
    thunks = [partial(plan.run, stream, ws, a) for a, _ in sets]
    return _BlockOurs(thunks, lambda: list(sets[0][1]), f"plan `{plan.sku().variant}`")


def _select_block(desc: Any, opt: Options) -> Any:
    import quantplan as qp

    if opt.cpu:
        return qp.BlockScaledQuantizePlan.select(None, desc, qp.PlanPreference(backend=qp.BackendKind.REFERENCE))
    import torch

    return qp.BlockScaledQuantizePlan.select(torch.cuda.current_stream(), desc)


def _host_bytes(a: Any) -> Any:
    """The bytes of ``a`` (torch tensor in its logical order, CuPy or NumPy array) as flat uint8 NumPy."""
    import numpy as np

    if hasattr(a, "detach"):
        return np.ascontiguousarray(to_numpy(a.contiguous())).reshape(-1).view(np.uint8)
    if hasattr(a, "get"):
        a = a.get()
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _byte_diff(got: Sequence[Any], want: Sequence[Any], names: Sequence[str]) -> str:
    """ "" when every array of ``got`` holds the bytes of its ``want``, else which differ and how many."""
    import numpy as np

    bad = []
    for g, w, n in zip(got, want, names, strict=False):
        gb, wb = _host_bytes(g), _host_bytes(w)
        if gb.size != wb.size:
            bad.append(f"{n}: {gb.size} bytes for {wb.size}")
        elif (d := int(np.count_nonzero(gb != wb))) != 0:
            bad.append(f"{n} {_frac((d, gb.size))} of bytes")
    return ", ".join(bad)


def _x_host(x: Any) -> Any:
    """x as the NumPy array the reference reads (bfloat16 through ml_dtypes)."""
    return to_numpy(x, bf16="bfloat16")


def _block_reference(spec: BlockSpec, xh: Any, mode: str | None = None) -> list[Any]:
    """The reference's outputs for ``spec`` (``mode``: another scale mode, e.g. NVFP4 ``torchao``):
    codes, the layout's scale buffer[, S_dec]; fused: rowwise then columnwise codes and scales."""
    import numpy as np

    from quantplan.ops.block_scaled import reference_columnwise, reference_quantize

    if spec.fused:  # the plan's own reference writers: each copy's scales in the row's layout
        p = _block_desc(spec)._problem()
        codes, scales, _ = reference_quantize(p, xh)
        return [codes, scales, *reference_columnwise(p, xh)]
    desc = _block_desc(spec if mode is None else replace(spec, mode=mode))
    amax = BLOCK_AMAX if spec.amax == "given" else None
    codes, scales, ts = reference_quantize(desc._problem(), xh, amax, SEED if spec.stochastic else 0, 0)
    return [codes, scales] + ([np.array([ts], np.float32)] if ts is not None else [])


def _mx_edge_blocks(xh: Any, element: str, rule: str) -> Any:
    """Blocks [rows, n / 32] where torchao 0.18's known defects apply (MICROSCALING.md §2.6):
    rceil with fl(amax / max) 1-2 ulps above a power of two or below 2^-126; any rule with scale byte 0."""
    import numpy as np

    import quantplan.reference.block_scaled as rb

    x = np.asarray(xh, np.float32).reshape(xh.shape[0], -1, 32)
    amax = np.where(np.isfinite(x), np.abs(x), 0).max(axis=-1).astype(np.float32)
    limit = np.float32(rb.element_format(element).max_finite)
    with np.errstate(divide="ignore", invalid="ignore"):
        bits = (amax / limit).astype(np.float32).view(np.uint32)
    edge = rb.e8m0_scale_byte(amax, element, rule) == 0
    if rule == "rceil":
        mant, exp = bits & 0x7FFFFF, (bits >> 23) & 0xFF
        edge |= ((mant == 1) | (mant == 2)) | (exp == 0)
    return edge


def _compare_mx_blocks(peer: Sequence[Any], ours: Sequence[Any], xh: Any, spec: BlockSpec) -> str:
    """torchao's MX (scales, codes) against ours (codes, compact scales), block by block, apart
    from the blocks where its 0.18 defects apply (counted separately)."""
    import numpy as np

    rows = xh.shape[0]
    ps, pc = (_host_bytes(a) for a in peer)
    oc, os_ = (_host_bytes(a) for a in ours)
    if ps.size != os_.size or pc.size != oc.size:
        return f"sizes differ (codes {pc.size} / {oc.size} bytes, scales {ps.size} / {os_.size})"
    nb = os_.size // rows
    differ = (ps.reshape(rows, nb) != os_.reshape(rows, nb)) | (
        pc.reshape(rows, nb, -1) != oc.reshape(rows, nb, -1)
    ).any(axis=-1)
    edge = _mx_edge_blocks(xh, spec.element, str(spec.mode))
    inner = int(np.count_nonzero(differ & ~edge))
    text = (
        f"= ours on all {int((~edge).sum())} blocks"
        if inner == 0
        else f"≠ ours on {inner} of {int((~edge).sum())} blocks"
    )
    if edge.any():
        text += f"; 0.18 edge blocks: {int(np.count_nonzero(differ & edge))} of {int(edge.sum())} differ"
    return text


def _block_peer(spec: BlockSpec, peers: Mapping[str, Any]) -> tuple[str, Callable[[Any], Any] | None, str]:
    """(name, f(x) -> outputs, why not) of the torchao producer of ``spec``."""
    import torch

    key = spec.peer
    if not key:
        return NA, None, ""

    def wrap(name: str) -> str:  # torchao's PyTorch casts run compiled unless --no-compile
        return f"torch.compile({name})" if peers.get("compiled", True) else f"{name} (eager: --no-compile)"

    if key in ("to_mx", "to_mx_pair", "nvfp4", "nvfp4_amax") and spec.dtype == "fp16":
        return NA, None, "torchao's to_mx / to_nvfp4 read bfloat16 and float32 only"
    if key == "fp8_lhs_pair":
        if "fp8_lhs" not in peers or "fp8_lhs_t" not in peers:
            return NA, None, "torchao's Triton kernels unavailable"
        lhs, lhs_t = peers["fp8_lhs"], peers["fp8_lhs_t"]
        return "torchao act_quant_lhs + act_quant_transposed_lhs", lambda x: (*lhs(x, 128), *lhs_t(x, 128)), ""
    if key not in peers:
        return NA, None, f"torchao {key} unavailable"
    f = peers[key]
    if key in ("to_mx", "to_mx_pair"):
        f, modes = f if key == "to_mx" else (f, peers["to_mx"][1])
        elem = {"e4m3": torch.float8_e4m3fn, "e2m3": "fp6_e2m3", "e2m1": torch.float4_e2m1fn_x2}[spec.element]
        sm = modes.RCEIL if spec.mode == "rceil" else modes.FLOOR
        swizzled = spec.layout == "blocked"
        if key == "to_mx_pair":
            return (
                f"{wrap('to_mx')} dim0 + dim1 {sm.name}" + (" swizzled" if swizzled else ""),
                lambda x: [t for pair in f(x, elem, sm, is_swizzled_scales=swizzled) for t in pair],
                "",
            )
        name = f"{wrap('to_mx')} {sm.name}" + (" swizzled" if swizzled else "")
        return name, lambda x: f(x, elem, 32, sm, is_swizzled_scales=swizzled), ""
    if key == "nvfp4":
        pts = torch.tensor(BLOCK_AMAX / 2688.0, dtype=torch.float32, device=_DEV)
        return wrap("NVFP4Tensor.to_nvfp4"), lambda x: f(x, pts.to(x.device)), ""
    if key == "nvfp4_amax":
        return wrap("to_nvfp4, amax of x"), f, ""
    name = {
        "fp8_lhs": "torchao triton act_quant_lhs",
        "fp8_rhs": "torchao triton weight_quant_rhs (column-major codes)",
        "fp8_rhs_t": "torchao triton weight_quant_transposed_rhs",
    }[key]
    return name, lambda x: f(x, 128), ""


def _peer_outputs(spec: BlockSpec, got: Any) -> list[Any]:
    """torchao's outputs as a flat list: MX (scales, codes) per cast; NVFP4 (codes, scales); FP8 (codes, scales)."""
    if spec.peer in ("nvfp4", "nvfp4_amax"):
        return [got.qdata, got.scale]
    return list(got)


def _compare_peer(spec: BlockSpec, got: list[Any], ours: list[Any], xh: Any, p: Any) -> str:
    """torchao's outputs against ours (bit for bit where the rule is the same; counts otherwise)."""
    from quantplan.ops.block_scaled import compact_scales

    if spec.peer == "to_mx":
        if spec.layout == "blocked":
            d = _byte_diff(got[::-1], ours, ("codes", "scales"))
            return "= ours" if not d else f"≠ ours: {d}"
        return _compare_mx_blocks(got, ours[:2], xh.reshape(-1, xh.shape[-1]), spec)
    if spec.peer == "to_mx_pair" and spec.layout == "blocked":  # torchao's (scales, codes) per cast
        d = _byte_diff([got[1], got[0], got[3], got[2]], ours, ("row codes", "row scales", "col codes", "col scales"))
        return "= ours" if not d else f"≠ ours: {d}"
    if spec.peer == "to_mx_pair":
        row = _compare_mx_blocks(got[:2], ours[:2], xh, spec)
        col = _compare_mx_blocks(got[2:], ours[2:], xh.T.copy(), spec)
        return f"rowwise {row}; columnwise {col}"
    if spec.peer in ("nvfp4", "nvfp4_amax"):
        d = _byte_diff(got, ours[:2], ("codes", "scales"))
        ref = _block_reference(spec, xh, mode="torchao")
        dr = _byte_diff(got, ref[:2], ("codes", "scales"))
        mine = "= ours" if not d else f"≠ ours (te order vs torchao's): {d}"
        return mine + ("; = reference scale_mode='torchao'" if not dr else f"; ≠ reference scale_mode='torchao': {dr}")
    if spec.peer == "fp8_lhs_pair":
        if spec.layout == "column_major":  # torchao's scales are column-major views: their storage order
            got = [got[0], got[1].t(), got[2], got[3].t()]
        d = _byte_diff(got, ours, ("row codes", "row scales", "col codes", "col scales"))
        return "= ours (enc; torchao floors amax at 1e-12)" if not d else f"≠ ours: {d}"
    import numpy as np

    import quantplan as qp

    if spec.peer == "fp8_rhs_t":  # x^T's codes and scales as column-major views: their storage is x's order
        got = [got[0].t(), got[1].t()]
    dtype = np.float32 if p.scale_kind is qp.ElementKind.F32 else np.uint8
    ours_scales = compact_scales(p, _host_bytes(ours[1]).view(dtype).reshape(p.scales_shape))
    d = _byte_diff(got, [ours[0], ours_scales], ("codes", "scales"))
    if spec.mode != "enc":
        return f"rules differ ({spec.mode} vs torchao's enc): " + (d or "same bytes")
    return "= ours (enc; torchao floors amax at 1e-12)" if not d else f"≠ ours: {d}"


def _block_math_fn(spec: BlockSpec) -> Callable[..., Any] | None:
    """``benchmarks/block_math.py`` doing ``spec``'s format and layout in plain PyTorch, or None."""
    import block_math

    if spec.math == "mx":

        def mx(x: Any, limit: Any) -> tuple[Any, Any]:
            codes, scales = block_math.mx_quantize(x, limit, spec.element, str(spec.mode))
            if spec.layout == "blocked":
                scales = block_math.to_blocked(scales.reshape(-1, scales.shape[-1]))
            return codes, scales

        return mx
    if spec.math == "fp8":
        ue8m0 = spec.fmt.endswith("ue8m0")

        def fp8(x: Any, limit: Any) -> tuple[Any, Any]:
            codes, scales = block_math.fp8_block_quantize(x, limit, "ue8m0" if ue8m0 else "f32")
            if spec.layout == "packed_ue8m0":
                scales = block_math.packed_ue8m0(scales)
            elif spec.layout == "column_major":
                scales = block_math.col_major_tma_aligned(scales)
            return codes, scales

        return fp8
    return None


def measure_block(spec: BlockSpec, opt: Options, peers: Mapping[str, Any]) -> Result:
    """One block-scaled row: ours (plan or launcher) timed against a copy of its bytes, checked
    against the reference; ``torch.compile`` of ``block_math`` and the torchao peer on the same
    input, timed, their bytes compared with ours."""
    import torch

    if opt.cpu:  # --cpu-smoke: small shapes, still multiples of torchao's blocks
        spec = replace(spec, shape=(min(spec.shape[0], 256), 1024))
    shape = spec.shape
    row = Result(spec.name, spec.dtype, metric="block")
    if not opt.cpu:
        torch._dynamo.reset()  # each row compiles its own graphs (a shared cache would hit the recompile limit)
    dev = "cpu" if opt.cpu else _DEV
    x = (torch.randn(shape, device=dev, dtype=torch.float32) * 4).to(_float_dtype(spec.dtype))
    n_in = x.numel() * x.element_size()
    xs = [x] + [x.clone() for _ in range(0 if opt.cpu else harness.rotation_sets(2 * n_in) - 1)]
    ours = _block_ours(spec, xs, opt)
    row.variant = ours.how
    ours.thunks[0]()
    if not opt.cpu:
        torch.cuda.synchronize()
    outs = ours.outputs()
    xh = _x_host(x)
    names = ("row codes", "row scales", "col codes", "col scales") if spec.fused else ("codes", "scales", "S_dec")
    d = _byte_diff(outs, _block_reference(spec, xh), names)
    row.reference = "= reference" if not d else f"≠ reference ({d})"
    row.failed = bool(d)
    row.nbytes = n_in + sum(int(a.nbytes) for a in outs)
    row.plan_us = _time(ours.thunks, opt)
    if not opt.cpu:
        read, written = n_in, row.nbytes - n_in
        row.copy_us, _ = harness.copy_time(read, written, warmup=opt.warmup, reps=opt.reps)
        if (read, written) not in _FLOORS:
            floor = harness.floor_time(read, written, warmup=opt.warmup, reps=opt.reps)
            _FLOORS[(read, written)] = None if floor is None else floor[0]
        row.floor_us = _FLOORS[(read, written)]
    p = _block_desc(spec)._problem() if not spec.fused else None
    # torch.compile of the same math, where torchao lacks the format or layout.
    math_fn = _block_math_fn(spec)
    if math_fn is not None and (opt.compile or opt.cpu) and time.perf_counter() < opt.deadline:
        import block_math

        limit = block_math.limit_tensor(spec.element, dev)
        try:
            fn = math_fn if opt.cpu else torch.compile(math_fn, dynamic=False)
            got = fn(x, limit)
            d = _byte_diff(got, outs[:2], ("codes", "scales"))
            row.notes.append("torch.compile = ours" if not d else f"torch.compile ≠ ours: {d}")
            if opt.cpu:
                row.notes.append("block_math ran eagerly (--cpu-smoke)")
            row.compile_us = _time([partial(fn, xi, limit) for xi in xs], opt)
        except Exception as exc:
            row.notes.append(f"torch.compile failed: {_brief(exc)}")
    # torchao on the same input.
    name, peer_fn, why = _block_peer(spec, peers)
    row.peer = name
    if why:
        row.notes.append(why)
    if peer_fn is not None:
        try:
            got = _peer_outputs(spec, peer_fn(x))
            if not opt.cpu:
                torch.cuda.synchronize()
            row.peer_vs_ours = _compare_peer(spec, got, outs, xh, p)
            row.peer_us = _time([partial(peer_fn, xi) for xi in xs], opt)
        except Exception as exc:
            row.peer = f"{name} failed: {_brief(exc)}"
    return row


def block_markdown(rows: Sequence[Result]) -> str:
    """The block-scaled table: ratios are the other's time over ours (> 1: ours is faster)."""
    cols = [
        "workload",
        "dtype",
        "ours µs",
        "copy µs",
        "% of copy",
        "floor µs",
        "torch.compile µs",
        "× torch.compile",
        "peer",
        "peer µs",
        "× peer",
        "ours vs reference",
        "peer vs ours",
        "ran",
        "notes",
    ]
    lines = [
        "| " + " | ".join(cols) + " |",
        "|" + "|".join(["---", "---"] + ["---:"] * 6 + ["---", "---:", "---:"] + ["---"] * 4) + "|",
    ]
    for r in rows:
        pct = NA if r.copy_us is None or not r.plan_us else f"{100 * r.copy_us / r.plan_us:.1f}%"
        cells = [
            r.workload,
            r.dtype,
            _us(r.plan_us),
            _us(r.copy_us),
            pct,
            _us(r.floor_us),
            _us(r.compile_us),
            _ratio(r.compile_us, r.plan_us),
            r.peer,
            _us(r.peer_us),
            _ratio(r.peer_us, r.plan_us),
            r.reference,
            r.peer_vs_ours,
            r.variant,
            "; ".join(r.notes),
        ]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


# ---- the table --------------------------------------------------------------------------------------------


def _us(x: float | None) -> str:
    return NA if x is None else (f"{x:.1f}" if x >= 100 else f"{x:.2f}")


def _ratio(peer: float | None, ours: float | None) -> str:
    return NA if peer is None or not ours else f"{peer / ours:.2f}×"


COLUMNS = [
    "workload",
    "dtype",
    "plan µs",
    "run(check=False) µs",
    "copy µs",
    "% of copy",
    "floor µs",
    "DeepSpeed µs",
    "× DeepSpeed",
    "torch.compile µs",
    "× torch.compile",
    "eager µs",
    "compat µs",
    "compat × DeepSpeed",
    "variant",
    "regs",
    "occupancy",
    "plan vs reference",
    "compat vs DeepSpeed",
    "notes",
]


def markdown(rows: Sequence[Result]) -> str:
    """The table: ratios are peer time / plan time (> 1: the plan is faster)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join(["---", "---"] + ["---:"] * 12 + ["---"] * 6) + "|"]
    for r in rows:
        pct = NA if r.copy_us is None or not r.plan_us else f"{100 * r.copy_us / r.plan_us:.1f}%"
        notes = list(r.notes)
        if r.functional_us is not None:
            notes.insert(0, f"qp.quantize {_us(r.functional_us)} µs")
        cells = [
            r.workload,
            r.dtype,
            _us(r.plan_us),
            _us(r.nocheck_us),
            _us(r.copy_us),
            pct,
            _us(r.floor_us),
            _us(r.ds_us),
            _ratio(r.ds_us, r.plan_us),
            _us(r.compile_us),
            _ratio(r.compile_us, r.plan_us),
            _us(r.eager_us),
            _us(r.compat_us),
            _ratio(r.ds_us, r.compat_us),
            f"`{r.variant}`" if r.variant != NA else NA,
            r.regs,
            r.occupancy,
            r.reference,
            r.compat_vs_ds,
            "; ".join(notes),
        ]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _torchao_version() -> str:
    try:
        import torchao

        return f"torchao {torchao.__version__}"
    except Exception as exc:  # reported in the header; the rows say the peer is unavailable
        return f"torchao not importable ({type(exc).__name__})"


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=_ROOT, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except Exception:
        return "unknown"
    if out.returncode != 0:
        return "unknown"
    return out.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")


def device_slug(name: str) -> str:
    """``NVIDIA H200`` -> ``h200``: the results file's stem."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower().replace("nvidia", "")).strip("-")
    return slug or "device"


def write_report(path: Path, rows: Sequence[Result], header: dict[str, Any], done: bool) -> None:
    """The markdown report: run facts, then the table."""
    lines = [f"# quantplan peer benchmark: {header.get('device', '?')}", ""]
    for key, value in header.items():
        lines.append(f"- {key}: {value}")
    lines += [
        "",
        "Command: `python3 benchmarks/bench_peers.py` (its docstring says what every column means).",
        "GPU rows: median kernel µs (CUDA events; L2 flushed by size or rotated buffer sets). Ratios are",
        "the peer's time over the plan's (> 1: the plan is faster); `% of copy` is a device copy's time over",
        "the plan's for the same bytes read plus written; `floor µs`: the fastest pure load/store kernel moving the",
        "plan's bytes read and bytes written (no math: no kernel with these bytes can beat it by much). Host rows: µs per call on the host (no sync inside",
        "the timed calls; median of 5 rounds of 2000 calls, the rounds of a row's calls and of an empty kernel's launch interleaved; a peer's call alone, on arguments made once). DeepSpeed and compat run DeepSpeed's formulas (stored 1/scale, symmetric",
        "`2**b / (2 * absmax)`, int4 high nibble first) on the same input: same bytes, other math.",
        "`plan vs reference`: the plan's outputs against the reference backend, bit for bit.",
        "",
    ]
    if not done:
        lines += ["**Partial: the run did not finish.**", ""]
    plain = [r for r in rows if r.metric != "block"]
    block = [r for r in rows if r.metric == "block"]
    text = "\n".join(lines) + (markdown(plain) if plain else "")
    if block:
        text += "\n" if plain else ""
        text += "\n".join(BLOCK_NOTES) + "\n\n" + block_markdown(block)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


#: What the block-scaled table's columns mean (the report's text above it).
BLOCK_NOTES = [
    "## Block-scaled formats",
    "",
    "`ours µs`: the plan's `run` (`ran`: the plan's variant, or the kernel launcher where the plan does not serve the",
    "problem on CUDA yet, with the plan's reason); `torch.compile µs`: `benchmarks/block_math.py` (the same format in",
    "plain PyTorch) compiled, where torchao lacks the format or layout; `peer`: torchao 0.18 on the same input",
    "(`torch.compile(to_mx)`, `torch.compile(NVFP4Tensor.to_nvfp4)`, its Triton FP8 block kernels). `ours vs reference`:",
    "codes and scales against `quantplan.reference.block_scaled`, byte for byte. `peer vs ours`: bit for bit where the",
    "rule is the same; MX blocks where torchao 0.18's known defects apply (rceil 1-2 ulps above a power of two, scale",
    "byte 0; MICROSCALING.md §2.6) are counted apart; where the rules differ (NVFP4 te vs torchao, FP8 div vs enc) the",
    "share of differing bytes, and NVFP4's peer against the reference's `scale_mode='torchao'`.",
]


# ---- main ---------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions, fp16 rows only (a smoke run)")
    p.add_argument(
        "--only", default="", metavar="TEXT", help="only the rows whose label contains TEXT (or one of A|B|...)"
    )
    p.add_argument("--out", metavar="PATH", help="markdown file (default benchmarks/results/<device>.md)")
    p.add_argument("--json", metavar="PATH", help="also write every figure as JSON")
    p.add_argument("--commit", help="the commit measured (default: git rev-parse HEAD)")
    p.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    p.add_argument("--no-deepspeed", action="store_true", help="leave DeepSpeed out")
    p.add_argument("--ds-so", metavar="PATH", help="DeepSpeed quantizer extension (.so) to load")
    p.add_argument("--ds-src", metavar="DIR", help="DeepSpeed quantizer sources with build.py")
    p.add_argument("--time-limit", type=float, default=330.0, metavar="S", help="past S seconds, skip torch.compile")
    p.add_argument(
        "--stop-after", type=float, default=470.0, metavar="S", help="past S seconds, list the rows left unrun"
    )
    p.add_argument(
        "--cpu-smoke", action="store_true", help="no GPU: run every row on the reference backend, small shapes"
    )
    block = p.add_mutually_exclusive_group()
    block.add_argument(
        "--only-block", action="store_true", help="only the block-scaled rows (MX, NVFP4, FP8 blocks; torchao peers)"
    )
    block.add_argument("--no-block", action="store_true", help="leave the block-scaled rows out")
    p.add_argument("--dtype", choices=("bf16", "fp16"), help="only the rows of this float dtype")
    p.add_argument("--no-torchao", action="store_true", help="leave torchao out of the block-scaled rows")
    return p.parse_args(argv)


def _smoke_shape(spec: Spec) -> tuple[int, ...]:
    """The small shape of a row in ``--cpu-smoke``: 8 rows (16 for reduce) of its last extent, or as many
    elements flat for a 1-D row."""
    rows = 16 if spec.kind == "reduce" else 8
    return (rows, spec.shape[1]) if len(spec.shape) == 2 else (rows * BIG[1],)


def main(argv: list[str] | None = None) -> int:
    """Run the rows, print the table, write the report. Exit 1 if a plan differed from the reference
    or a row failed, 2 without a GPU."""
    global _DEV
    args = parse_args(argv)
    t_start = time.perf_counter()
    import torch

    wanted = args.only.split("|")
    rows = [s for s in specs() if any(t in s.name for t in wanted) and not (args.quick and s.dtype == "bf16")]
    rows = [] if args.only_block else rows
    # Block-scaled rows: --quick keeps bf16 (the dtype torchao's MX and NVFP4 casts read).
    block_rows = [] if args.no_block else [b for b in block_specs() if any(t in b.name for t in wanted)]
    block_rows = [b for b in block_rows if not (args.quick and b.dtype == "fp16")]
    if args.dtype:
        rows = [r for r in rows if r.dtype == args.dtype]
        block_rows = [b for b in block_rows if b.dtype == args.dtype]
    if args.cpu_smoke:
        _DEV = "cpu"
        rows = [replace(s, shape=_smoke_shape(s)) for s in rows]
        header: dict[str, Any] = {"device": "cpu (reference backend, plumbing check)"}
        ds, ds_note = None, "not loaded"
    else:
        if not torch.cuda.is_available():
            print(
                "bench_peers: no CUDA device visible to PyTorch (use --cpu-smoke for a plumbing check)", file=sys.stderr
            )
            return 2
        torch.manual_seed(0)
        if args.no_deepspeed or not rows:  # DeepSpeed has no block-scaled op: not built for block rows alone
            ds, ds_note = (
                None,
                "left out (--no-deepspeed)" if args.no_deepspeed else "not needed (block-scaled rows only)",
            )
        else:
            ds, ds_note = load_deepspeed(args.ds_so, args.ds_src)
        header = harness.device_summary()
    header.update(commit=args.commit or _git_commit(), deepspeed=ds_note, quick=args.quick)
    use_compile = not (args.no_compile or args.cpu_smoke)
    if args.quick:
        opt = Options(3, 20, 300, use_compile, ds, args.cpu_smoke, t_start + args.time_limit)
    else:
        opt = Options(10, 100, 2000, use_compile, ds, args.cpu_smoke, t_start + args.time_limit)
    header.update(reps=opt.reps, host_calls=opt.host_calls)
    stem = device_slug(str(header["device"])) + ("-block-peers" if args.only_block else "")
    out = Path(args.out) if args.out else _HERE / "results" / f"{stem}.md"
    print("# bench_peers: " + ", ".join(f"{k}={v}" for k, v in header.items()), flush=True)

    results: list[Result] = []
    for spec in rows:
        t0 = time.perf_counter()
        if t0 - t_start > args.stop_after:
            results.append(Result(spec.name, spec.dtype, notes=[f"not run: past --stop-after {args.stop_after:.0f} s"]))
            continue
        try:
            got = measure(spec, opt)
        except Exception as exc:
            traceback.print_exc()
            got = [Result(spec.name, spec.dtype, notes=[f"error: {_brief(exc)}"], failed=True)]
        finally:
            if not args.cpu_smoke:
                torch.cuda.empty_cache()
        results += got
        r = got[0]
        print(
            f"[{time.perf_counter() - t_start:6.1f} s] {spec.name} {spec.dtype}: plan {_us(r.plan_us)} µs, copy {_us(r.copy_us)}, "
            f"DS {_us(r.ds_us)}, compile {_us(r.compile_us)}, compat {_us(r.compat_us)}; {r.reference} ({time.perf_counter() - t0:.1f} s)",
            flush=True,
        )
        write_report(out, results, header, done=False)
    if block_rows:
        peers: dict[str, Any] = {}
        if args.no_torchao:
            header["torchao"] = "left out (--no-torchao)"
        else:
            peers, missing = harness.load_torchao(compile=use_compile)
            peers["compiled"] = use_compile
            header["torchao"] = _torchao_version() + ("; unavailable: " + " / ".join(missing) if missing else "")
        for bspec in block_rows:
            t0 = time.perf_counter()
            if t0 - t_start > args.stop_after:
                results.append(
                    Result(
                        bspec.name,
                        bspec.dtype,
                        metric="block",
                        notes=[f"not run: past --stop-after {args.stop_after:.0f} s"],
                    )
                )
                continue
            try:
                b = measure_block(bspec, opt, peers)
            except Exception as exc:
                traceback.print_exc()
                b = Result(bspec.name, bspec.dtype, metric="block", notes=[f"error: {_brief(exc)}"], failed=True)
            finally:
                if not args.cpu_smoke:
                    torch.cuda.empty_cache()
            results.append(b)
            print(
                f"[{time.perf_counter() - t_start:6.1f} s] {bspec.name} {bspec.dtype}: ours {_us(b.plan_us)} µs, copy {_us(b.copy_us)}, "
                f"compile {_us(b.compile_us)}, {b.peer} {_us(b.peer_us)}; {b.reference}; peer {b.peer_vs_ours} ({time.perf_counter() - t0:.1f} s)",
                flush=True,
            )
            write_report(out, results, header, done=False)
    if not args.cpu_smoke and any(r.metric == "host" for r in results):
        results += host_floor_rows(opt)
    header["wall time"] = f"{time.perf_counter() - t_start:.0f} s"
    write_report(out, results, header, done=True)
    if args.json:
        payload = {"meta": header, "rows": [asdict(r) for r in results]}
        Path(args.json).write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print()
    plain = [r for r in results if r.metric != "block"]
    if plain:
        print(markdown(plain))
    if any(r.metric == "block" for r in results):
        print(block_markdown([r for r in results if r.metric == "block"]))
    print(f"written to {out}")
    return 1 if any(r.failed for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
