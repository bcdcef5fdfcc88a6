"""The kernel instantiation list is what the plans can select, no more and no less (CPU, simulated GPU).

Every plan's ``select`` runs over a grid of descriptors (every element kind, mode, nibble order and
rounding a plan takes, with shapes and scopes that reach each geometry: ragged, odd, tiny, the
specialised segment lengths, few and many segments, multi-pass sizes) on simulated sm_80 and
sm_90 GPUs of several multiprocessor counts (``benchmarks/host_sim.py``: nothing compiles, each
kernel is a stand-in). The kernel loader records the unit each plan loads and every name it looks
up in it. Then:

* every unit a plan loads is one of ``_families.compile_units(family)``, exactly (so the NVRTC
  sweep of ``tests/test_kernel_compile.py`` compiles what a plan compiles at its first ``select``);
* every instantiation listed in ``_families`` is looked up by some plan (none is dead weight in
  the sweep or in a plan's first compile), and every listed unit is loaded by some plan.

A name a plan asks for outside its unit fails at ``select`` itself (KeyError), so it fails here too.
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import quantplan as qp
from quantplan.ops import deepspeed_format as ds
from quantplan.runtime import _device, _families
from quantplan.vocabulary.types import ElementKind as EK

pytest.importorskip("cupy")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import host_sim  # noqa: E402

SYM, ASYM = qp.QuantMode.SYMMETRIC, qp.QuantMode.ASYMMETRIC
NEAREST, STOCHASTIC = qp.Rounding.NEAREST_EVEN, qp.Rounding.STOCHASTIC
LOW, HIGH = qp.NibbleOrder.LOW_FIRST, qp.NibbleOrder.HIGH_FIRST
FLOATS = (EK.F16, EK.BF16, EK.F32, EK.F64)
CODES = (EK.S8, EK.U8, EK.S4, EK.U4, EK.FP8_E4M3, EK.FP8_E5M2)
QGZ_FLOATS = (EK.F16, EK.BF16, EK.F32)
QGZ_CODES = (EK.S8, EK.U8, EK.S4, EK.U4)
PACKED = (EK.S4, EK.U4)
#: (major, minor, multiprocessors) of the simulated GPUs: an A100 and an H100.
GPUS = ((8, 0, 108), (9, 0, 132))

Select = tuple[type, Callable[[], Any]]


def _shapes_and_scopes() -> list[tuple[tuple[int, ...], Any]]:
    """Shapes and scopes reaching every row and segment geometry: each vector width (rows of odd,
    2 mod 4, 4 mod 8 and 0 mod 8 elements), the dense row layouts (large and small), the fused
    segment lengths of the specialised kernels (8 .. 16384 elements, 128 for the lanes), few and
    many segments, and the multi-pass sizes (segments longer than a team holds, 0-D)."""
    shapes = [(), (1,), (7,), (6,), (12,), (2, 5), (3, 10), (4, 12), (5, 8), (33, 64), (2, 3, 64)]
    shapes += [(16, n) for n in (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)]
    shapes += [(4096, n) for n in (2048, 4096, 8192)] + [(1 << 17, 128), (300, 16384), (8192, 8192)]
    shapes += [(1 << 16, 1 << 16), (3, 10004), (2, 40000), (2, 40002), (3, 40004), (1, 65536)]
    out: list[tuple[tuple[int, ...], Any]] = []
    for shape in shapes:
        out.append((shape, qp.TensorScope()))
        if not shape:
            continue
        out += [(shape, qp.TokenScope()), (shape, qp.ChannelScope(axis=-1))]
        out += [(shape, qp.GroupScope(axis=-1, group_size=g)) for g in (2, 32) if shape[-1] % g == 0]
        if len(shape) > 1 and math.prod(shape) < 2**20:  # a scope across rows: the general row layout
            out += [(shape, qp.ChannelScope(axis=0))]
            out += [(shape, qp.GroupScope(axis=0, group_size=g)) for g in (2,) if shape[0] % g == 0]
    return out


def _affine() -> Iterator[Select]:
    pairs = _shapes_and_scopes()
    for f, c, mode in itertools.product(FLOATS, CODES, (SYM, ASYM)):
        for order, (shape, scope) in itertools.product((LOW, HIGH) if c in PACKED else (LOW,), pairs):
            kw: dict[str, Any] = dict(shape=shape, scope=scope, mode=mode, nibble_order=order)
            for rounding in (NEAREST, STOCHASTIC):
                q = dict(input_element=f, output_element=c, rounding=rounding, **kw)
                yield qp.QuantizePlan, lambda q=q: qp.QuantizeDescriptor(**q)
                yield qp.DynamicRangeQuantizePlan, lambda q=q: qp.DynamicRangeQuantizeDescriptor(**q)
            d = dict(input_element=c, output_element=f, **kw)
            yield qp.DequantizePlan, lambda d=d: qp.DequantizeDescriptor(**d)
            yield qp.DequantizeBackwardPlan, lambda d=d: qp.DequantizeBackwardDescriptor(**d)
            b = dict(input_element=f, output_element=c, **kw)
            yield qp.QuantizeBackwardPlan, lambda b=b: qp.QuantizeBackwardDescriptor(**b)


def _fake() -> Iterator[Select]:
    for f, mode, (shape, scope) in itertools.product(FLOATS, (SYM, ASYM), _shapes_and_scopes()):
        q_min, q_max = (-128, 127) if mode is SYM else (0, 255)
        kw: dict[str, Any] = dict(shape=shape, scope=scope, mode=mode, element=f)
        for rounding in (NEAREST, STOCHASTIC):
            r = dict(rounding=rounding, **kw)
            yield qp.DynamicRangeFakeQuantizePlan, lambda r=r: qp.DynamicRangeFakeQuantizeDescriptor(**r)
        fq = dict(q_min=q_min, q_max=q_max, **kw)
        yield qp.FakeQuantizePlan, lambda fq=fq: qp.FakeQuantizeDescriptor(**fq)
        for learnable in (False, True):
            b = dict(q_min=q_min, q_max=q_max, learnable=learnable, **kw)
            yield qp.FakeQuantizeBackwardPlan, lambda b=b: qp.FakeQuantizeBackwardDescriptor(**b)


#: (groups, group size) of the qgZ and DeepSpeed-format grids: each vector width (sizes 1, 2 mod 4,
#: 4 mod 8, 0 mod 8, odd), the dense team x 8 x nv sizes (128 .. 8192), few and many groups, and
#: groups longer than a team holds (the two-pass kernels).
GROUPS = (
    (1, 1), (5, 2), (3, 4), (7, 6), (1, 7), (2, 8), (5, 12), (3, 20), (3, 64), (16, 128), (4096, 128),
    (1, 256), (8, 512), (100, 1000), (16, 1024), (4, 2048), (1 << 16, 2048), (16, 4096), (1 << 20, 4096),
    (16, 8192), (16, 16384), (2, 40000),
)  # fmt: skip


def _qgz() -> Iterator[Select]:
    slicings = ((1, 1, 1), (2, 2, 1), (1, 2, 2))
    for i, e, c, mode in itertools.product(QGZ_FLOATS, (None, *QGZ_FLOATS), QGZ_CODES, (SYM, ASYM)):
        for order, (groups, size), (nodes, dev, pipe) in itertools.product(
            (LOW, HIGH) if c in PACKED else (LOW,), GROUPS, slicings
        ):
            s = dict(
                shape=(groups * size * nodes * dev * pipe,), group_size=size, nodes=nodes, devices_per_node=dev,
                pipeline=pipe, mode=mode, input_element=i, output_element=c, nibble_order=order, error_element=e,
            )  # fmt: skip
            yield qp.SwizzledQuantizePlan, lambda s=s: qp.SwizzledQuantizeDescriptor(**s)
    for i, o, e, mode in itertools.product(QGZ_CODES, QGZ_CODES + QGZ_FLOATS, (None, *QGZ_FLOATS), (SYM, ASYM)):
        packed = i in PACKED or o in PACKED
        for order, (groups, size) in itertools.product((LOW, HIGH) if packed else (LOW,), GROUPS):
            chunk = groups * size
            # input groups: the output group, and sizes giving each vector width of the codes (8, 4, 2, 1)
            for in_group in sorted(d for d in {size, 1, 2, 4, 8} if chunk % d == 0):
                for peers in (2, 3, 4, 8, 16) if e is None and mode is SYM and o not in QGZ_FLOATS else (3,):
                    r = dict(
                        peers=peers, chunk_elements=chunk, input_group_size=in_group,
                        output_group_size=None if o in QGZ_FLOATS else size, mode=mode, input_element=i,
                        output_element=o, nibble_order=order, error_element=e,
                    )  # fmt: skip
                    yield qp.DequantReducePlan, lambda r=r: qp.DequantReduceDescriptor(**r)


def _deepspeed() -> Iterator[Select]:
    for i, e, bits, mode in itertools.product(QGZ_FLOATS, (None, *QGZ_FLOATS), (8, 4), (SYM, ASYM)):
        for groups, size in GROUPS:
            for nodes, dev, pipe in ((1, 1, 1), (2, 2, 1), (1, 2, 2), (2, 1, 1)):
                slices = nodes * dev * pipe
                q = dict(
                    numel=groups * size * slices, groups=groups * slices, num_bits=bits, mode=mode, input_element=i,
                    nodes=nodes, devices_per_node=dev, pipeline=pipe, error_element=e,
                )  # fmt: skip
                yield ds.DeepSpeedQuantizePlan, lambda q=q: ds.DeepSpeedQuantizeDescriptor(**q)
            for dev, out_groups in itertools.product((1, 2, 8), {groups, max(1, groups // 2)}):
                r = dict(
                    numel=groups * size * dev, in_groups=groups * dev, out_groups=out_groups, num_bits=bits,
                    mode=mode, devices_per_node=dev, error_element=e,
                )  # fmt: skip
                yield ds.DeepSpeedReducePlan, lambda r=r: ds.DeepSpeedReduceDescriptor(**r)
    for bits, o, mode, (groups, size) in itertools.product((8, 4), QGZ_FLOATS, (SYM, ASYM), GROUPS):
        d = dict(numel=groups * size, groups=groups, num_bits=bits, mode=mode, output_element=o)
        yield ds.DeepSpeedDequantizePlan, lambda d=d: ds.DeepSpeedDequantizeDescriptor(**d)
    for f, mode, rounding, (groups, size) in itertools.product(QGZ_FLOATS, (SYM, ASYM), (NEAREST, STOCHASTIC), GROUPS):
        m = dict(numel=groups * size, groups=groups, num_bits=8, mode=mode, rounding=rounding, element=f)
        yield ds.MoQFakeQuantizePlan, lambda m=m: ds.MoQFakeQuantizeDescriptor(**m)


def _block_scaled() -> Iterator[Select]:
    from quantplan.ops.block_scaled import (
        BLOCK_FORMATS,
        COLUMNWISE,
        BlockScaledDequantizeDescriptor,
        BlockScaledDequantizePlan,
        BlockScaledQuantizeDescriptor,
        BlockScaledQuantizePlan,
    )

    shapes = [(1,), (7,), (3, 32), (3, 100), (2, 5, 128), (16, 8192), (8192, 8192), (300, 257), (1 << 16, 4096)]
    layouts = ("compact", "blocked", "column_major", "packed_ue8m0")
    modes = {"mx": (None, "floor", "ceil", "even"), "fp8": (None, "mul_rcp", "enc")}
    for fmt, f, shape, layout in itertools.product(BLOCK_FORMATS, (EK.F16, EK.BF16, EK.F32), shapes, layouts):
        for mode in modes["mx" if fmt.startswith("mx") else "fp8"]:
            d = dict(shape=shape, format=fmt, input_element=f, scale_layout=layout, scale_mode=mode)
            yield BlockScaledQuantizePlan, lambda d=d: BlockScaledQuantizeDescriptor(**d)
        if fmt == "nvfp4":  # stochastic rounding: the nv_e2m1_sr twins
            s = dict(shape=shape, format=fmt, input_element=f, scale_layout=layout, rounding=STOCHASTIC)
            yield BlockScaledQuantizePlan, lambda s=s: BlockScaledQuantizeDescriptor(**s)
    # 2-D tiles and the fused transpose (aligned: 16 | rows and cols; general otherwise), dequantize
    small = [(3, 100), (32, 256), (2, 64, 128), (300, 257)]
    for fmt, f, shape, layout in itertools.product(BLOCK_FORMATS, (EK.F16, EK.BF16, EK.F32), small, layouts):
        for mode in (None, "floor") if fmt.startswith("mx") else (None, "enc"):
            common = dict(shape=shape, format=fmt, input_element=f, scale_layout=layout, scale_mode=mode)
            for extra in [dict(block=(32, 32)), dict(block=(128, 128)), *(dict(columnwise=c) for c in COLUMNWISE)]:
                t = {**common, **extra}
                yield BlockScaledQuantizePlan, lambda t=t: BlockScaledQuantizeDescriptor(**t)
        for block in (None, (32, 32), (16, 16)):
            q = dict(shape=shape, format=fmt, output_element=f, scale_layout=layout, block=block)
            yield BlockScaledDequantizePlan, lambda q=q: BlockScaledDequantizeDescriptor(**q)


def block_scaled_launcher_names() -> set[str]:
    """The names only the block-scaled launcher functions (not a plan) select: the MX 32x32 tiles
    of the elements whose formats have no 2-D geometry (MXFP6, MXFP4, MXINT8;
    ``quantize_block_scaled_2d`` serves any MX element). (NVFP4 with stochastic rounding is the
    plans' now: the grid selects its twins.)"""
    from quantplan.runtime import _block_scaled_tile_kernels as tk

    names = set()
    for (block, dtype), sched in tk.TILE_SCHEDULES.items():
        if block == (32, 32):
            for element in ("e2m3", "e3m2", "e2m1", "int8"):
                names |= {tk.tile_kernel_name(dtype, element, False, aligned, sched) for aligned in (True, False)}
    return names


def test_block_scaled_plans_select_every_stochastic_nvfp4_twin(selections: _Recorder) -> None:
    """The stochastic NVFP4 instantiations (every input dtype and schedule row of blocks of 16) are
    selected by the plans themselves, not only by the launcher."""
    from quantplan.runtime import _block_scaled_kernels as bk

    twins = {name for name in bk.instantiations() if "nv_e2m1_sr" in name}
    assert len(twins) == len(bk.INPUT_TAGS) * sum(block == 16 for _, block, _ in bk.SCHEDULES)
    assert twins <= selections.used["block_scaled"]
    assert not twins & block_scaled_launcher_names()


GRIDS: dict[str, Callable[[], Iterator[Select]]] = {
    "block_scaled": _block_scaled,
    "affine": _affine,
    "fake": _fake,
    "qgz": _qgz,
    "deepspeed": _deepspeed,
}


class _Recorder:
    """The simulated kernel loader: the units loaded and the names looked up, per family."""

    def __init__(self) -> None:
        self.units: dict[str, set[tuple[str, ...]]] = {}
        self.used: dict[str, set[str]] = {}

    def load_kernels(self, family: str, names: Any, arch: Any, device_id: int, options: Any = ()) -> dict[str, Any]:
        self.units.setdefault(family, set()).add(tuple(names))
        used = self.used.setdefault(family, set())

        class Functions(dict):  # type: ignore[type-arg]
            def __getitem__(self, name: str) -> Any:
                used.add(name)
                return super().__getitem__(name)

        return Functions((name, host_sim._Function()) for name in names)


@pytest.fixture(scope="module")
def selections() -> _Recorder:
    """Every grid selected on every simulated GPU of :data:`GPUS`."""
    recorder = _Recorder()
    props: dict[str, int] = {}
    monkeypatch = pytest.MonkeyPatch()
    for owner, name, value in host_sim.gpu_patches(compile_kernels=False):
        if name == "load_kernels":
            value = recorder.load_kernels
        elif name == "getDeviceProperties":
            value = lambda device: dict(props)  # noqa: E731
        monkeypatch.setattr(owner, name, value)
    try:
        for major, minor, sms in GPUS:
            props.update(major=major, minor=minor, multiProcessorCount=sms)
            _device.cuda_available.cache_clear()
            _device.device_info.cache_clear()
            for grid in GRIDS.values():
                selected = 0
                for plan_cls, make in grid():
                    try:
                        plan_cls.select(None, make())
                    except (qp.QuantPlanError, ValueError):  # combinations a descriptor refuses
                        continue
                    selected += 1
                assert selected > 100, grid
    finally:
        monkeypatch.undo()
        _device.cuda_available.cache_clear()
        _device.device_info.cache_clear()
    return recorder


@pytest.mark.parametrize("family", sorted(_families.FAMILIES))
def test_plans_load_exactly_the_listed_units(family: str, selections: _Recorder) -> None:
    """Each unit a plan loads is a listed compile unit, and each listed unit is loaded by some plan."""
    listed = {tuple(unit) for unit in _families.compile_units(family)}
    loaded = selections.units.get(family, set())
    if family == "block_scaled_tiles":  # launcher-only names: one kernel per load
        loaded = loaded | {(name,) for name in block_scaled_launcher_names()}
    assert not loaded - listed, sorted(loaded - listed)[:3]
    assert not listed - loaded, sorted(listed - loaded)[:3]


@pytest.mark.parametrize("family", sorted(_families.FAMILIES))
def test_every_listed_instantiation_is_selectable(family: str, selections: _Recorder) -> None:
    """Every instantiation the sweep compiles is looked up by some plan (none is dead weight), and
    every instantiation a plan looks up is listed."""
    listed = set(_families.all_instantiations(family))
    used = selections.used.get(family, set())
    if family == "block_scaled_tiles":  # the launcher function selects these without a plan
        used = used | block_scaled_launcher_names()
    assert not used - listed, sorted(used - listed)[:5]
    assert not listed - used, sorted(listed - used)[:10]
