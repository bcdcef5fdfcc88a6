"""SwizzledQuantizePlan: the view of the input and the schedule (CPU; a simulated GPU for the launches).

The swizzle's groups are runs of ``group_size`` consecutive elements of the flat input and its
slices runs of ``slice_elements``, so a flat 1-D bucket and any other view of the same bytes are
one problem. ``select`` resolves the view (``flat_view``) and chooses the schedule there; these
tests check that every view of random ragged problems gets the same kernels, grids, blocks and
argument bytes (at ``select`` and after ``run`` wrote the pointers), on simulated GPUs of several
sizes, by default and under every forced schedule; that the reference gives every view the same
bits; and how ``PlanPreference.schedule`` is accepted and refused.
"""

from __future__ import annotations

import math
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import REFERENCE, random_floats

import quantplan as qp
from quantplan.ops import swizzled_quantize as sq
from quantplan.runtime import _device
from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.types import ElementKind as EK

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

SYM, ASYM = qp.QuantMode.SYMMETRIC, qp.QuantMode.ASYMMETRIC
#: (major, minor, multiprocessors) of the simulated GPUs: an A100, an H100 and a small part.
GPUS = ((8, 0, 108), (9, 0, 132), (9, 0, 16))


def desc_of(
    shape: tuple[int, ...], group: int, split: tuple[int, int, int], **kw: Any
) -> qp.SwizzledQuantizeDescriptor:
    nodes, dpn, pipeline = split
    return qp.SwizzledQuantizeDescriptor(
        shape=shape, group_size=group, nodes=nodes, devices_per_node=dpn, pipeline=pipeline, **kw
    )


def views(numel: int, group: int, slice_elements: int, rng: np.random.Generator) -> list[tuple[int, ...]]:
    """The flat bucket, rows of one group, rows of one slice, and a random 3-D split of ``numel``."""
    out = [(numel,), (numel // group, group), (numel // slice_elements, slice_elements)]
    divisors = [d for d in range(1, min(numel, 4096) + 1) if numel % d == 0]
    a = int(rng.choice(divisors))
    rest = numel // a
    b = int(rng.choice([d for d in divisors if rest % d == 0]))
    out.append((a, b, rest // b))
    return out


def problems(rng: np.random.Generator) -> Iterator[tuple[int, int, tuple[int, int, int], dict[str, Any]]]:
    """(numel, group size, split, descriptor fields) over every schedule's reach: dense group sizes
    (team * 8 * nv), ragged and odd groups (fused), groups above 32768 elements and odd 4-bit
    groups (two-pass), F32 input and LoCo buffers; 0-size too."""
    groups_sizes = [(3, 512), (37, 128), (5, 2048), (2, 8192), (9, 110), (4, 6), (7, 7), (3, 1000), (2, 40000)]
    splits = [(1, 1, 1), (2, 4, 1), (1, 8, 1), (2, 2, 2), (1, 3, 2)]
    for groups, size in groups_sizes:
        for split in splits:
            slices = math.prod(split)
            numel = groups * size * slices
            i = int(rng.integers(0, 3))
            fields: dict[str, Any] = dict(
                input_element=(EK.F16, EK.BF16, EK.F32)[i],
                output_element=(EK.S8, EK.U8, EK.S4, EK.U4)[int(rng.integers(0, 4))],
                mode=(SYM, ASYM)[int(rng.integers(0, 2))],
                error_element=(None, None, EK.BF16)[int(rng.integers(0, 3))],
            )
            if ELEMENTS[fields["output_element"]].is_packed and (numel // slices) % 2:
                fields["output_element"] = EK.S8
            yield numel, size, split, fields
    yield 0, 128, (1, 1, 1), dict(input_element=EK.F16, output_element=EK.S4)


class _Named:
    """A loaded kernel's stand-in that keeps its name (the pointer is derived from it)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.ptr = 0x1000 + 16 * zlib.crc32(name.encode())


@pytest.fixture
def simulated() -> Iterator[dict[str, int]]:
    """A simulated GPU whose properties the test sets (``major``, ``minor``, ``multiProcessorCount``)."""
    pytest.importorskip("cupy")
    import host_sim

    props = {"major": 9, "minor": 0, "multiProcessorCount": 132}
    monkeypatch = pytest.MonkeyPatch()
    for owner, name, value in host_sim.gpu_patches(compile_kernels=False):
        if name == "load_kernels":
            value = lambda family, names, arch, device_id, options=(): {n: _Named(n) for n in names}  # noqa: E731
        elif name == "getDeviceProperties":
            value = lambda device: dict(props)  # noqa: E731
        monkeypatch.setattr(owner, name, value)
    _device.cuda_available.cache_clear()
    _device.device_info.cache_clear()
    try:
        yield props
    finally:
        monkeypatch.undo()
        _device.cuda_available.cache_clear()
        _device.device_info.cache_clear()


def _gpu(props: dict[str, int], gpu: tuple[int, int, int]) -> None:
    props.update(major=gpu[0], minor=gpu[1], multiProcessorCount=gpu[2])
    _device.device_info.cache_clear()


def launch_record(plan: qp.SwizzledQuantizePlan) -> tuple[Any, ...]:
    """Everything a launch of ``plan`` is made of: variant, alignments, and per prepared launch the
    kernel's name, grid, block and argument bytes."""
    launches = plan._launches
    assert launches is not None
    prepared = tuple((p._function.name, p.grid, p.block, bytes(p.params)) for p in launches.launches)
    return plan.sku().variant, launches.alignments, prepared


def test_flat_view_keeps_everything_but_the_rank() -> None:
    d = desc_of((6, 5, 8), 4, (1, 3, 2), input_element=EK.BF16, output_element=EK.U4, mode=ASYM, q_min=1)
    flat = sq.flat_view(d)
    assert flat.shape == (240,)
    assert flat.model_dump(exclude={"shape"}) == d.model_dump(exclude={"shape"})
    assert (flat.groups, flat.slice_groups, flat.output_shape, flat.param_shape) == (
        d.groups,
        d.slice_groups,
        d.output_shape,
        d.param_shape,
    )
    one = desc_of((240,), 4, (1, 3, 2), input_element=EK.F16, output_element=EK.S8)
    assert sq.flat_view(one) is one


@pytest.mark.parametrize("gpu", GPUS)
def test_every_view_selects_the_same_launches(simulated: dict[str, int], gpu: tuple[int, int, int]) -> None:
    _gpu(simulated, gpu)
    rng = np.random.default_rng(24 + gpu[2])
    checked = 0
    for numel, size, split, fields in problems(rng):
        slice_elements = max(numel // math.prod(split), size)
        for schedule in (None, *sq.SCHEDULES):
            pref = qp.PlanPreference(schedule=schedule)
            records = set()
            for shape in views(max(numel, 1), size, slice_elements, rng) if numel else [(0,), (0, size), (size, 0)]:
                d = desc_of(shape, size, split, **fields)
                try:
                    plan = qp.SwizzledQuantizePlan.select(None, d, pref)
                except qp.Unsupported:
                    records.add("unsupported")
                    continue
                assert plan.backend is qp.BackendKind.CUDA
                records.add(launch_record(plan))
                checked += 1
            assert len(records) == 1, (numel, size, split, fields, schedule, records)
    assert checked > 300


@pytest.mark.parametrize("gpu", GPUS[1:2])
def test_run_writes_the_same_argument_bytes_for_every_view(
    simulated: dict[str, int], gpu: tuple[int, int, int]
) -> None:
    import host_sim

    _gpu(simulated, gpu)
    cases = [
        ((2 * 8 * 512,), 512, (1, 8, 1), EK.F16, EK.S4, None),
        ((2 * 8 * 110,), 110, (2, 4, 1), EK.BF16, EK.S8, EK.F32),
        ((3 * 2 * 40000,), 40000, (1, 2, 1), EK.F32, EK.U4, None),
    ]
    for shape, size, split, fin, fout, err in cases:
        numel = shape[0]
        got = set()
        for view in ((numel,), (numel // size, size), (2, numel // (2 * size), size)):
            for schedule in (None, *sq.SCHEDULES):
                d = desc_of(view, size, split, input_element=fin, output_element=fout, error_element=err)
                try:
                    plan = qp.SwizzledQuantizePlan.select(None, d, qp.PlanPreference(schedule=schedule))
                except qp.Unsupported:
                    continue
                base = 1 << 36
                qdtype = ELEMENTS[fout].numpy_dtype
                args = qp.SwizzledQuantizeArgs(
                    input=host_sim.device_array(base, view, ELEMENTS[fin].numpy_dtype),
                    output=host_sim.device_array(base + (1 << 32), d.output_shape, qdtype),
                    scale_out=host_sim.device_array(base + (2 << 32), d.param_shape, np.float32),
                    error_feedback=None if err is None else host_sim.device_array(base + (3 << 32), view, np.float32),
                    error_beta=None if err is None else 0.25,
                )
                plan.run(None, None, args)
                assert plan._launches is not None
                chosen = plan._launches.chosen((base, base + (1 << 32), base + (3 << 32))[: 2 if err is None else 3])
                got.add((schedule, tuple((c._function.name, c.grid, c.block, bytes(c.params)) for c in chosen)))
        schedules = {g[0] for g in got}
        assert len(got) == len(schedules), f"{shape}: a view changed the launch bytes"


def test_default_schedule_order() -> None:
    def chosen(**kw: Any) -> str:
        return sq.choose_schedule(sq.flat_view(desc_of(**kw)))

    base: dict[str, Any] = dict(split=(1, 8, 1), input_element=EK.F16, output_element=EK.S4)
    assert chosen(shape=(8 * 3 * 512,), group=512, **base) == "dense"
    assert chosen(shape=(8 * 3 * 110,), group=110, **base) == "fused"
    assert chosen(shape=(8 * 2 * 40000,), group=40000, **base) == "two-pass"
    assert chosen(shape=(0,), group=512, **base) == "two-pass"
    f32 = {**base, "input_element": EK.F32}
    assert chosen(shape=(8 * 3 * 512,), group=512, **f32) == "fused"
    loco = {**base, "error_element": EK.F16}
    assert chosen(shape=(8 * 3 * 512,), group=512, **loco) == "fused"
    odd4 = dict(split=(1, 2, 1), input_element=EK.F16, output_element=EK.U4)
    assert chosen(shape=(2 * 2 * 7,), group=7, **odd4) == "two-pass"


@pytest.mark.parametrize(
    "shape,group,fields,refused",
    [
        ((8 * 3 * 110,), 110, {}, {"dense"}),  # not team * 8 * nv
        ((8 * 3 * 512,), 512, {"input_element": EK.F32}, {"dense"}),
        ((8 * 3 * 512,), 512, {"error_element": EK.BF16}, {"dense"}),
        ((8 * 2 * 40000,), 40000, {}, {"dense", "fused", "fused-element-io"}),  # above 32768
        ((8 * 2 * 7,), 7, {"output_element": EK.S8}, {"dense"}),
        ((8 * 4 * 512,), 512, {}, set()),
    ],
)
def test_forced_schedule_is_refused_where_it_cannot_serve(
    shape: tuple[int, ...], group: int, fields: dict[str, Any], refused: set[str]
) -> None:
    kw: dict[str, Any] = dict(input_element=EK.F16, output_element=EK.S4) | fields
    d = desc_of(shape, group, (1, 8, 1), **kw)
    for schedule in sq.SCHEDULES:
        pref = qp.PlanPreference(backend=qp.BackendKind.REFERENCE, schedule=schedule)
        if schedule in refused:
            with pytest.raises(qp.Unsupported, match=schedule):
                qp.SwizzledQuantizePlan.select(None, d, pref)
        else:
            assert qp.SwizzledQuantizePlan.select(None, d, pref).backend is qp.BackendKind.REFERENCE


def test_unknown_schedule_and_plans_without_schedules_refuse() -> None:
    d = desc_of((8 * 512,), 512, (1, 8, 1), input_element=EK.F16, output_element=EK.S4)
    with pytest.raises(qp.Unsupported, match="dense, fused, fused-element-io, two-pass"):
        qp.SwizzledQuantizePlan.select(None, d, qp.PlanPreference(backend=qp.BackendKind.REFERENCE, schedule="rows"))
    pref = qp.PlanPreference(backend=qp.BackendKind.REFERENCE, schedule="fused")
    quantize = qp.DynamicRangeQuantizeDescriptor(
        shape=(4, 64), scope=qp.TokenScope(), input_element=EK.F16, output_element=EK.S8
    )
    with pytest.raises(qp.Unsupported, match="row-shares, cluster, lanes, rows, dense, fused"):
        qp.DynamicRangeQuantizePlan.select(None, quantize, pref.model_copy(update={"schedule": "two-pass"}))
    reduce = qp.DequantReduceDescriptor(
        peers=2,
        chunk_elements=256,
        input_group_size=128,
        output_group_size=128,
        input_element=EK.S8,
        output_element=EK.S8,
    )
    with pytest.raises(qp.Unsupported, match="takes no forced schedule"):
        qp.DequantReducePlan.select(None, reduce, pref)


@pytest.mark.parametrize("seed", range(6))
def test_reference_gives_every_view_the_same_bits(seed: int) -> None:
    rng = np.random.default_rng(seed)
    split = ((1, 1, 1), (2, 4, 1), (1, 3, 2), (2, 2, 2))[seed % 4]
    group = int(rng.choice([1, 5, 7, 64, 110, 512]))
    slices = math.prod(split)
    numel = group * slices * int(rng.integers(1, 6)) * 2  # even slices: 4-bit codes allowed
    fields: dict[str, Any] = dict(
        input_element=(EK.F16, EK.BF16, EK.F32)[seed % 3],
        output_element=(EK.S4, EK.U8, EK.U4, EK.S8)[seed % 4],
        mode=(SYM, ASYM)[seed % 2],
        error_element=(None, EK.F32, EK.BF16)[seed % 3],
    )
    flat = random_floats(rng, (numel,), fields["input_element"])
    error = None
    if fields["error_element"] is not None:
        error_dtype = ELEMENTS[fields["error_element"]].numpy_dtype
        error = (random_floats(rng, (numel,), fields["error_element"]).astype(np.float32) * 0.01).astype(error_dtype)
    outputs = []
    for shape in views(numel, group, numel // slices, rng):
        d = desc_of(shape, group, split, **fields)
        q = np.zeros(d.output_shape, ELEMENTS[d.output_element].numpy_dtype)
        s = np.zeros(d.param_shape, np.float32)
        z = np.zeros(d.param_shape, np.int32) if d.mode is ASYM else None
        e = None if error is None else error.reshape(shape).copy()
        args = qp.SwizzledQuantizeArgs(flat.reshape(shape), q, s, z, e, None if e is None else 0.375)
        qp.SwizzledQuantizePlan.select(None, d, REFERENCE).run(None, None, args)
        outputs.append(
            (q.view(np.uint8).tobytes(), s.view(np.uint32).tobytes(), None if z is None else z.tobytes())
            + (None if e is None else e.reshape(-1).tobytes(),)
        )
    assert all(o == outputs[0] for o in outputs[1:])
