"""What every affine plan selects by default, on simulated A100 and H100 GPUs (CPU).

:func:`snapshot` selects the plans whose kernel schedule ``quantplan.runtime._selection`` chooses
(dynamic-range quantize, dynamic-range fake quantize, static quantize / dequantize, fake
quantize, swizzled quantize, the DeepSpeed-format passes) over a grid of problems, element kinds
and scopes on simulated sm_80 / 108-SM and sm_90 / 132-SM GPUs (``benchmarks/host_sim.py``:
nothing compiles, each kernel is a stand-in named by its loader; the occupancy query answers
``2048 // block`` blocks per SM), and records per problem: the plan's variant and workspace, and
per prepared launch the kernel's name expression, grid, block and argument bytes at ``select``,
and the alignments that pick a launch at ``run``.

``tests/data/selection_snapshot.json`` holds the records of the code before selection moved to
one module, as one digest per bucket (GPU, plan, shape and scope or group sizes; the element
kinds, modes and roundings of a bucket share its digest), which ``python tests/selection_snapshot.py``
rewrites; ``tests/test_selection.py`` asserts that the current code selects the same, bucket for
bucket.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FIXTURE = HERE / "data" / "selection_snapshot.json"
sys.path.insert(0, str(HERE.parent / "benchmarks"))

import host_sim  # noqa: E402

import quantplan as qp  # noqa: E402
from quantplan.ops import deepspeed_format as ds  # noqa: E402
from quantplan.runtime import _device  # noqa: E402
from quantplan.runtime._launch import LaunchPair, PreparedLaunch  # noqa: E402
from quantplan.vocabulary.types import ElementKind as EK  # noqa: E402

#: (major, minor, multiprocessors): an A100 and an H100.
GPUS = ((8, 0, 108), (9, 0, 132))
SYM, ASYM = qp.QuantMode.SYMMETRIC, qp.QuantMode.ASYMMETRIC
NEAREST, STOCHASTIC = qp.Rounding.NEAREST_EVEN, qp.Rounding.STOCHASTIC

Select = tuple[str, type, Callable[[], Any]]


def _shapes_and_scopes() -> list[tuple[tuple[int, ...], Any]]:
    """Shapes reaching every schedule: the specialised segment lengths (128 .. 16384) with few and
    many segments, ragged and odd rows, segments longer than a team holds, 0-D."""
    shapes: list[tuple[int, ...]] = [(), (7,), (6,), (3, 10), (5, 8), (33, 64), (2, 3, 64)]
    shapes += [(16, n) for n in (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)]
    shapes += [(2, 8192), (4, 16384), (40, 4096), (100, 2048), (4096, 2048), (4096, 8192), (1 << 15, 128)]
    shapes += [(300, 16384), (3, 10004), (2, 40000)]
    # the size heuristics' edges on 108 and 132 SMs: row shares (segments x 4 <= SMs), clusters
    # (segments x 8 <= 2 x SMs), lanes (segments x 4 lanes >= busy threads)
    shapes += [(27, 8192), (28, 4096), (33, 16384), (34, 8192), (55296, 128), (55295, 128), (67584, 128)]
    out: list[tuple[tuple[int, ...], Any]] = []
    for shape in shapes:
        out.append((shape, qp.TensorScope()))
        if not shape:
            continue
        out += [(shape, qp.TokenScope()), (shape, qp.GroupScope(axis=-1, group_size=2))]
        if shape[-1] % 128 == 0:
            out.append((shape, qp.GroupScope(axis=-1, group_size=128)))
        if len(shape) > 1 and shape[0] * shape[-1] < 2**20:
            out.append((shape, qp.ChannelScope(axis=0)))
    return out


#: Descriptor fields that vary within one bucket of the fixture.
_IN_BUCKET = {
    "input_element", "output_element", "element", "error_element", "mode", "rounding", "nibble_order", "num_bits",
    "q_min", "q_max", "bits",
}  # fmt: skip


def _key(plan: type, desc: Any) -> str:
    return f"{plan.__name__}:{desc.model_dump_json()}"


def bucket(key: str) -> str:
    """The bucket of a record key: its GPU, plan and the descriptor fields outside :data:`_IN_BUCKET`."""
    gpu, plan, fields = key.split(":", 2)
    kept = {k: v for k, v in json.loads(fields).items() if k not in _IN_BUCKET}
    return f"{gpu}:{plan}:{json.dumps(kept, sort_keys=True, separators=(',', ':'))}"


def digests(records: dict[str, str]) -> dict[str, str]:
    """One digest per :func:`bucket` over its records (key and record, in key order)."""
    buckets: dict[str, list[str]] = {}
    for key in sorted(records):
        buckets.setdefault(bucket(key), []).append(f"{key}={records[key]}")
    return {b: hashlib.sha1("\n".join(rows).encode()).hexdigest()[:16] for b, rows in sorted(buckets.items())}


def grid() -> Iterator[Select]:
    """(key, plan class, descriptor factory) of every problem of the snapshot."""
    pairs = _shapes_and_scopes()
    floats, codes = (EK.F16, EK.BF16, EK.F32, EK.F64), (EK.S8, EK.U8, EK.S4, EK.FP8_E4M3)
    for f, c, mode, (shape, scope) in itertools.product(floats, codes, (SYM, ASYM), pairs):
        orders = (qp.NibbleOrder.LOW_FIRST, qp.NibbleOrder.HIGH_FIRST) if c is EK.S4 else (qp.NibbleOrder.LOW_FIRST,)
        for order, rounding in itertools.product(orders, (NEAREST, STOCHASTIC)):
            kw: dict[str, Any] = dict(shape=shape, scope=scope, mode=mode, nibble_order=order)
            q = dict(input_element=f, output_element=c, rounding=rounding, **kw)
            yield (
                "DynamicRangeQuantizePlan",
                qp.DynamicRangeQuantizePlan,
                lambda q=q: qp.DynamicRangeQuantizeDescriptor(**q),
            )
            yield "QuantizePlan", qp.QuantizePlan, lambda q=q: qp.QuantizeDescriptor(**q)
        d = dict(input_element=c, output_element=f, shape=shape, scope=scope, mode=mode)
        yield "DequantizePlan", qp.DequantizePlan, lambda d=d: qp.DequantizeDescriptor(**d)
    for f, mode, (shape, scope), rounding in itertools.product(floats, (SYM, ASYM), pairs, (NEAREST, STOCHASTIC)):
        r = dict(shape=shape, scope=scope, mode=mode, element=f, rounding=rounding, bits=4)
        yield (
            "DynamicRangeFakeQuantizePlan",
            qp.DynamicRangeFakeQuantizePlan,
            (lambda r=r: qp.DynamicRangeFakeQuantizeDescriptor(**r)),
        )
        if rounding is NEAREST:
            fq = dict(shape=shape, scope=scope, mode=mode, element=f, q_min=-8, q_max=7)
            yield "FakeQuantizePlan", qp.FakeQuantizePlan, lambda fq=fq: qp.FakeQuantizeDescriptor(**fq)
    groups = (
        (5, 2), (7, 6), (3, 64), (16, 128), (4096, 128), (8, 512), (100, 1000), (16, 1024), (4, 2048),
        (16, 4096), (2, 8192), (16, 8192), (16, 16384), (2, 40000), (1 << 14, 2048), (27, 2048), (28, 4096),
        (33, 16384), (34, 2048), (1 << 14, 128), (1 << 18, 128),
    )  # fmt: skip
    qf = (EK.F16, EK.BF16, EK.F32)
    for i, e, c, mode, (n, size) in itertools.product(qf, (None, EK.F32), (EK.S8, EK.U4), (SYM, ASYM), groups):
        for nodes, dev in ((1, 1), (2, 2)):
            s = dict(
                shape=(n * size * nodes * dev,), group_size=size, nodes=nodes, devices_per_node=dev, mode=mode,
                input_element=i, output_element=c, error_element=e,
            )  # fmt: skip
            yield "SwizzledQuantizePlan", qp.SwizzledQuantizePlan, lambda s=s: qp.SwizzledQuantizeDescriptor(**s)
    for i, e, bits, mode, (n, size) in itertools.product(qf, (None, EK.F32), (8, 4), (SYM, ASYM), groups):
        for nodes, dev, pipe in ((1, 1, 1), (2, 2, 1), (2, 1, 1)):
            slices = nodes * dev * pipe
            q = dict(
                numel=n * size * slices, groups=n * slices, num_bits=bits, mode=mode, input_element=i, nodes=nodes,
                devices_per_node=dev, pipeline=pipe, error_element=e,
            )  # fmt: skip
            yield "DeepSpeedQuantizePlan", ds.DeepSpeedQuantizePlan, lambda q=q: ds.DeepSpeedQuantizeDescriptor(**q)
        for dev in (1, 8):
            red = dict(
                numel=n * size * dev, in_groups=n * dev, out_groups=n, num_bits=bits, mode=mode,
                devices_per_node=dev, error_element=e,
            )  # fmt: skip
            yield "DeepSpeedReducePlan", ds.DeepSpeedReducePlan, lambda red=red: ds.DeepSpeedReduceDescriptor(**red)
    for f, mode, rounding, (n, size) in itertools.product(qf, (SYM, ASYM), (NEAREST, STOCHASTIC), groups):
        m = dict(numel=n * size, groups=n, num_bits=8, mode=mode, rounding=rounding, element=f)
        yield "MoQFakeQuantizePlan", ds.MoQFakeQuantizePlan, lambda m=m: ds.MoQFakeQuantizeDescriptor(**m)


def _record(plan: Any, names: dict[int, str]) -> str:
    """The plan's selection as one string: variant, workspace, launches, alignments."""
    parts = [plan.sku().variant, str(plan.workspace_size())]
    for launch in plan._prepared:
        assert isinstance(launch, PreparedLaunch)
        digest = hashlib.sha1(bytes(launch.params)).hexdigest()[:12]
        parts.append(f"{names[launch.function_ptr]}@{launch.grid}x{launch.block}#{digest}")
    for name, value in sorted(vars(plan).items()):
        if isinstance(value, LaunchPair):
            parts.append(f"{name}:align{value.align_in},{value.align_out}")
        elif hasattr(value, "alignments"):
            parts.append(f"{name}:align{value.alignments}")
    return "|".join(parts)


def snapshot(
    select: Callable[[type, Any], Any] | None = None, stride: int = 1, refusals: bool = False
) -> dict[str, str]:
    """``{gpu + problem key: record}`` of every problem of :func:`grid` (every ``stride``-th) on
    every GPU of :data:`GPUS`. ``select(plan class, descriptor)``: how a plan is selected (default
    ``cls.select(None, desc)``); ``refusals``: also record a valid descriptor that ``select``
    refuses, as the error's class name."""
    import pytest

    names: dict[int, str] = {}

    def load_kernels(family: str, units: Any, arch: Any, device_id: int, options: Any = ()) -> dict[str, Any]:
        out = {}
        for name in units:
            fn = host_sim._Function()
            names[fn.ptr] = name
            out[name] = fn
        return out

    props: dict[str, int] = {}
    monkeypatch = pytest.MonkeyPatch()
    for owner, attr, value in host_sim.gpu_patches(compile_kernels=False):
        if attr == "load_kernels":
            value = load_kernels
        elif attr == "getDeviceProperties":
            value = lambda device: dict(props)  # noqa: E731
        elif attr == "occupancyMaxActiveBlocksPerMultiprocessor":
            value = lambda fn, block, smem: max(1, 2048 // block)  # noqa: E731
        monkeypatch.setattr(owner, attr, value)
    records: dict[str, str] = {}
    try:
        for major, minor, sms in GPUS:
            props.update(major=major, minor=minor, multiProcessorCount=sms)
            _device.cuda_available.cache_clear()
            _device.device_info.cache_clear()
            for index, (_, plan_cls, make) in enumerate(grid()):
                if index % stride:
                    continue
                try:
                    desc = make()
                except (qp.QuantPlanError, ValueError):
                    continue
                try:
                    plan = plan_cls.select(None, desc) if select is None else select(plan_cls, desc)
                except (qp.QuantPlanError, ValueError) as exc:
                    if refusals:
                        records[f"sm{major}{minor}x{sms}:{_key(plan_cls, desc)}"] = type(exc).__name__
                    continue
                records[f"sm{major}{minor}x{sms}:{_key(plan_cls, desc)}"] = _record(plan, names)
    finally:
        monkeypatch.undo()
        _device.cuda_available.cache_clear()
        _device.device_info.cache_clear()
    return records


def main() -> None:
    records = snapshot()
    table = digests(records)
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text(json.dumps({"records": len(records), "digests": table}, indent=0, sort_keys=True) + "\n")
    print(f"{len(records)} records in {len(table)} buckets -> {FIXTURE}")


if __name__ == "__main__":
    main()
