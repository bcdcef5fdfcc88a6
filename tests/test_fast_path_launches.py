"""The fast path launches exactly what ``_launch`` launches, byte for byte (CPU, simulated GPU).

Every plan configuration of the bad-input table is selected on a simulated GPU
(``benchmarks/host_sim.py``: CuPy's runtime answers one sm_90 device, kernels are stand-ins, the
driver's launch is recorded). Two plans of the same descriptor see the same random sequence of
valid calls: new and repeated pointers, misaligned ones (the element-I/O twins), in-place calls,
scalars that change, checked and unchecked, several streams. One plan runs them through ``run``
(its generated functions, after the first call of each signature); the other through the checks
and ``_launch`` alone. Each call must launch the same kernels (by their position in the plan's
prepared launches), with the same grid, block and stream, and argument blocks equal byte for byte
at the moment of each launch.
"""

from __future__ import annotations

import ctypes
import random
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import quantplan as qp
from quantplan.runtime import _device, _fast_check, _launch

pytest.importorskip("cupy")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import host_sim  # noqa: E402

Event = tuple[int, tuple[int, ...], bytes]


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """Every driver launch of the simulated GPU, as (function, grid, block, smem, stream, params)."""
    calls: list[tuple[int, ...]] = []

    def launch(fn: int, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, *rest: int) -> None:
        smem, stream, params, _ = rest
        calls.append((fn, gx, gy, gz, bx, by, bz, smem, stream, params))

    for owner, name, value in host_sim.gpu_patches(launch, compile_kernels=False):
        monkeypatch.setattr(owner, name, value)
    for module, name in ((_launch, "current_device"), (_launch, "_current_stream"), (_fast_check, "current_device")):
        monkeypatch.setattr(module, name, getattr(module, name))  # bound on first use: restored afterwards
    _device.cuda_available.cache_clear()
    _device.device_info.cache_clear()
    yield calls
    _device.cuda_available.cache_clear()
    _device.device_info.cache_clear()


def _bases() -> dict[str, Any]:
    try:
        import test_bad_inputs
    except Exception:  # the table is not importable in this checkout
        return {}
    return dict(test_bad_inputs.BASES)


class _Calls:
    """A plan's launches of one call: (position in its prepared launches, launch config, block bytes)."""

    def __init__(self, plan: Any, recorded: list[tuple[int, ...]]) -> None:
        self.plan, self.recorded = plan, recorded
        self.index = {launch._kernel_params: n for n, launch in enumerate(plan._prepared)}
        self.launches = {launch._kernel_params: launch for launch in plan._prepared}

    def events(self, start: int) -> list[Event]:
        out = []
        for call in self.recorded[start:]:
            params = call[-1]
            if params not in self.index:
                continue
            launch = self.launches[params]
            blob = ctypes.string_at(ctypes.addressof(launch.params), ctypes.sizeof(launch.params))
            out.append((self.index[params], (call[1], call[4], call[7], call[8]), blob))
        return out


def _device_args(
    rng: random.Random, setup: Any, host: dict[str, Any], slots: dict[str, int], repeat: dict[str, Any]
) -> dict[str, Any]:
    """The valid fields as arrays of the simulated GPU: the same pointers as last time, new ones,
    or misaligned ones; an output in place of an input of the same size now and then."""
    fields: dict[str, Any] = {}
    for name, value in host.items():
        if not isinstance(value, np.ndarray):
            fields[name] = value
            continue
        if name in repeat and rng.random() < 0.6:
            fields[name] = repeat[name]
            continue
        ptr = slots[name] + rng.choice([0, 0, 0, 256, 4096]) + (rng.choice([2, 4, 8]) if rng.random() < 0.15 else 0)
        if ptr % value.dtype.itemsize:
            ptr -= ptr % value.dtype.itemsize
        fields[name] = host_sim.device_array(ptr, value.shape, value.dtype)
    return fields


@pytest.mark.parametrize("base", sorted(_bases()) or ["(bad-input table not importable)"])
def test_fast_path_launches_what_launch_launches(base: str, recorder: list[tuple[int, ...]]) -> None:
    bases = _bases()
    if base not in bases:
        pytest.skip("the bad-input table is not importable")
    import test_bad_inputs

    setup = test_bad_inputs.make_setup(base, np.random.default_rng(0))
    fast = setup.plan_cls.select(None, setup.desc)
    slow = setup.plan_cls.select(None, setup.desc)
    public = setup.plan_cls.select(None, setup.desc)  # through run: the dispatcher made for its newest signatures
    assert fast.backend is qp.BackendKind.CUDA and fast._prepared
    host = dict(setup.host)
    for name in setup.outputs:  # outputs of the same size as an input may take its place (in place)
        host.setdefault(name, None)
    slots = {name: (1 << 32) * (2 + i) for i, name in enumerate(host)}
    nbytes = fast.workspace_size()
    workspaces = [None] if not nbytes else [
        qp.Workspace(host_sim.device_array((1 << 32) * 60 + k * 4096, (nbytes,), "uint8"), nbytes) for k in range(2)
    ]  # fmt: skip
    rng = random.Random(zlib.crc32(base.encode()))
    fast_calls, slow_calls, public_calls = _Calls(fast, recorder), _Calls(slow, recorder), _Calls(public, recorder)
    repeat: dict[str, Any] = {}
    traced = 0
    for _ in range(150):
        fields = _device_args(rng, setup, host, slots, repeat)
        repeat = {k: v for k, v in fields.items() if v is not None and not isinstance(v, (int, float))}
        args = setup.args_cls(**fields)
        stream = rng.choice([None, 0, 7, 7, 7])
        workspace = rng.choice(workspaces)
        check = rng.random() < 0.7
        start = len(recorder)
        slow_record = slow._check_call(stream, workspace, args) if check else slow._extract(args)
        slow._launch(_launch.stream_handle(stream), workspace, slow_record)
        expected = slow_calls.events(start)
        start = len(recorder)
        took_fast = any(f(args, workspace, stream) for f in fast._fast[check])
        if not took_fast:
            fast._run_slow(stream, workspace, args, check)
        traced += took_fast
        got = fast_calls.events(start)
        assert got == expected, (base, check, stream)
        start = len(recorder)
        public.run(stream, workspace, args, check=check)
        assert public_calls.events(start) == expected, (base, check, stream)
    assert traced > 25, traced
    assert "run" in public.__dict__, "no dispatcher was made"
    assert any(f.traced for mode in fast._fast for f in mode), "no traced tail was generated"


# ---- front-end replays -------------------------------------------------------------------------------


@pytest.fixture
def byte_recorder(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Every driver launch of the simulated GPU with its argument block's bytes at that moment,
    and ``reset()``: allocations after it get the addresses of the allocations after the last
    reset, in order (a call and its replay get the same pointers)."""
    from cupy.cuda import memory

    from quantplan import _frontend

    launches: dict[int, Any] = {}
    original_init = _launch.PreparedLaunch.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        launches[self._kernel_params] = self

    events: list[tuple[tuple[int, ...], bytes]] = []

    def launch(fn: int, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, *rest: int) -> None:
        smem, stream, params, _ = rest
        block = launches[params].params
        events.append(((gx, bx, smem, stream), ctypes.string_at(ctypes.addressof(block), ctypes.sizeof(block))))

    monkeypatch.setattr(_launch.PreparedLaunch, "__init__", init)
    for owner, name, value in host_sim.gpu_patches(launch, compile_kernels=False):
        monkeypatch.setattr(owner, name, value)
    for module, name in ((_launch, "current_device"), (_launch, "_current_stream"), (_fast_check, "current_device")):
        monkeypatch.setattr(module, name, getattr(module, name))
    made = [0]

    def alloc(size: int) -> Any:
        ptr = (1 << 40) + (1 << 24) * made[0]
        made[0] += 1
        return memory.MemoryPointer(memory.UnownedMemory(ptr, max(size, 1), None, device_id=0), 0)

    def reset() -> None:
        made[0] = 0

    import cupy

    _device.cuda_available.cache_clear()
    _device.device_info.cache_clear()
    _frontend.clear_plan_cache()
    with cupy.cuda.using_allocator(alloc):
        yield events, reset
    _frontend.clear_plan_cache()
    _device.cuda_available.cache_clear()
    _device.device_info.cache_clear()


def test_front_end_replays_launch_what_the_full_path_launches(
    byte_recorder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second call of a seen signature through ``qp.quantize`` or the compat functions is a
    replay (no target resolution, no checks) and launches the same kernels with the same
    argument bytes as the first call's full path."""
    from quantplan import _frontend
    from quantplan.compat import deepspeed as ds

    full_paths = [0]
    original_of = _frontend.Target.of

    def counted_of(*arrays: Any, **kwargs: Any) -> Any:
        full_paths[0] += 1
        return original_of(*arrays, **kwargs)

    monkeypatch.setattr(_frontend.Target, "of", staticmethod(counted_of))
    dev = host_sim.device_array
    x = dev(1 << 36, (16, 1000), "float16")
    x8 = dev(2 << 36, (8, 1024), "float16")
    q8, p8 = dev(3 << 36, (16, 1000), "int8"), dev(4 << 36, (16, 1), "float32")
    q4, p4 = dev(5 << 36, (8, 256), "int8"), dev(6 << 36, (32, 1), "float32")
    v = dev(7 << 36, (12, 500), "float16")
    big = dev(10 << 36, (4, 40000), "float16")
    fs, fz, cs = dev(11 << 36, (16, 1), "float32"), dev(12 << 36, (16, 1), "int32"), dev(13 << 36, (1, 500), "float32")
    calls: list[tuple[str, Any]] = [
        ("quantize 8 bits", lambda: ds.quantize(x, 16, 8, ds.Symmetric)),
        ("quantize 4 bits asymmetric", lambda: ds.quantize(x, 16, 4, ds.Asymmetric)),
        ("dequantize", lambda: ds.dequantize(q8, p8, 16, 8, ds.Symmetric)),
        ("swizzle_quant", lambda: ds.swizzle_quant(x8, 32, 4, ds.Symmetric, 1, 1, 4)),
        ("quantized_reduction", lambda: ds.quantized_reduction(q4, p4, 32, 8, 4, ds.Symmetric, 4)),
        ("ds_quantize_fp16", lambda: ds.ds_quantize_fp16(v, 12, 8)),
        ("qp.quantize", lambda: qp.quantize(x, "int8", scope=qp.TokenScope())),
        ("qp.quantize groups asymmetric", lambda: qp.quantize(x, "uint4", group_size=100, asymmetric=True)),
        ("qp.quantize mxfp8", lambda: qp.quantize(x, "mxfp8")),
        ("qp.quantize mxfp4 axis -1", lambda: qp.quantize(x8, "mxfp4", axis=-1)),
        ("qp.quantize fp8_block", lambda: qp.quantize(x8, "fp8_block")),
        ("qp.quantize per tensor (a workspace)", lambda: qp.quantize(x, "int8")),
        ("qp.quantize per tensor asymmetric (a workspace)", lambda: qp.quantize(v, "uint8", asymmetric=True)),
        ("compat quantize, groups above 32768 (a workspace)", lambda: ds.quantize(big, 2, 8, ds.Symmetric)),
        ("qp.fake_quantize", lambda: qp.fake_quantize(x, 0.05)),
        ("qp.fake_quantize per token", lambda: qp.fake_quantize(x, fs, fz, scope=qp.TokenScope(), q_min=0, q_max=255)),
        ("qp.fake_quantize per channel", lambda: qp.fake_quantize(v, cs, axis=1)),
        ("qp.fake_quantize, int zero point", lambda: qp.fake_quantize(v, 0.5, 3)),
    ]

    def at(base: int, qt: Any) -> Any:  # qt's arrays moved where the allocations of the calls below cannot be
        arrays = (qt.codes, qt.scale, qt.zero_point)
        parts = [None if a is None else dev(base + (n << 32), a.shape, a.dtype) for n, a in enumerate(arrays)]
        return QuantizedTensor(*parts, qt.descriptor)

    from quantplan.functional import QuantizedTensor

    token = at(8 << 36, qp.quantize(x, "int8", scope=qp.TokenScope()))
    groups = at(9 << 36, qp.quantize(x, "uint4", group_size=100, asymmetric=True))
    calls += [
        ("qp.dequantize", lambda: qp.dequantize(token)),
        ("qp.dequantize groups asymmetric to float32", lambda: groups.dequantize("float32")),
    ]
    events, reset = byte_recorder
    for name, call in calls:
        reset()
        start = len(events)
        call()
        first = events[start:]
        reset()
        before, start = full_paths[0], len(events)
        call()
        assert full_paths[0] == before, f"{name}: the second call took the full path"
        assert events[start:] == first and first, name


def test_front_end_replays_key_python_scalars_by_type_and_value(byte_recorder: Any) -> None:
    """A replay holds the Python scalars of its first call (they are in the launch's arguments): a
    call with another scalar, or an equal one of another type, launches what a fresh full path
    launches for it, whatever calls came before."""
    from quantplan import _frontend

    x = host_sim.device_array(1 << 36, (16, 1000), "float16")
    events, reset = byte_recorder
    scales = [0.05, 0.05, 0.07, 0.05, 1, 1.0, 1, 2.0]
    cached = []
    for scale in scales:
        reset()
        start = len(events)
        qp.fake_quantize(x, scale)
        cached.append(events[start:])
    for scale, got in zip(scales, cached, strict=True):
        _frontend.clear_plan_cache()
        reset()
        start = len(events)
        qp.fake_quantize(x, scale)
        assert events[start:] == got and got, scale


def test_block_scaled_options_are_not_replays_of_the_plain_call(byte_recorder: Any) -> None:
    """``qp.quantize(x, "mxfp8")`` is remembered as a replay keyed on x's signature and the name;
    a later call of the same x and name with block-scaled options (``block``, ``layout``, ...) is
    another problem: it must take its own full path (its descriptor, its launches), not replay the
    plain call (the 1x32 compact codes returned for a 32x32 blocked request)."""
    from quantplan import _frontend

    x = host_sim.device_array(1 << 36, (37, 1000), "uint16")  # CuPy bfloat16 bits
    events, reset = byte_recorder
    variants: list[dict[str, Any]] = [
        dict(block=(32, 32), layout="blocked"),
        dict(block=(32, 32)),
        dict(layout="blocked"),
        dict(scale_mode="floor"),
    ]
    fresh = []
    for opts in variants:  # each problem's launches from an empty plan cache
        _frontend.clear_plan_cache()
        reset()
        start = len(events)
        qt = qp.quantize(x, "mxfp8", **opts)
        fresh.append((qt.block, qt.layout, tuple(qt.scales.shape), events[start:]))
    _frontend.clear_plan_cache()
    for _ in range(2):
        qp.quantize(x, "mxfp8")  # the plain call, remembered as a replay
    for opts, (block, layout, scales_shape, launched) in zip(variants, fresh, strict=True):
        reset()
        start = len(events)
        qt = qp.quantize(x, "mxfp8", **opts)
        assert (qt.block, qt.layout, tuple(qt.scales.shape)) == (block, layout, scales_shape), opts
        assert events[start:] == launched and launched, opts


# ---- untraceable signatures: the generic tail hands the argument blocks back ---------------------------


def test_generic_tail_makes_traced_functions_store_their_constants_again(
    recorder: list[tuple[int, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan whose ``_launch`` is untraceable in one signature (it enqueues a memset) and writes
    there a field that another, traced signature stores only when another call wrote the blocks
    since (``Plan._tail_owner``): the generic tail of the first must hand the blocks back, so the
    traced function of the second stores its constants again. Each call launches the argument
    bytes the checks and ``_launch`` alone launch."""
    from cupy.cuda import runtime

    from quantplan.ops.fake_quantize import FakeQuantizePlan

    memsets: list[tuple[int, ...]] = []
    monkeypatch.setattr(runtime, "memsetAsync", lambda *args: memsets.append(args))

    class InPlaceMemset(FakeQuantizePlan):
        """In place: a memset first, and the zero point as the number 3 (a store of ``zp_value``)."""

        def _launch(self, handle: int, workspace: Any, a: Any) -> None:
            if a.x.ptr == a.dx.ptr:
                runtime.memsetAsync(a.dx.ptr, 0, 0, handle)
                a = a._replace(zp=3)
            super()._launch(handle, workspace, a)

    desc = qp.FakeQuantizeDescriptor(
        shape=(16, 1000), scope=qp.TensorScope(), mode=qp.QuantMode.ASYMMETRIC, element=qp.ElementKind.F16,
        q_min=-128, q_max=127,
    )  # fmt: skip
    fast, slow = InPlaceMemset.select(None, desc), InPlaceMemset.select(None, desc)
    dev = host_sim.device_array
    x, y = dev(1 << 40, (16, 1000), "float16"), dev(2 << 40, (16, 1000), "float16")
    scale, zp = dev(3 << 40, (1,), "float32"), dev(4 << 40, (1,), "int32")
    out_of_place, in_place = qp.FakeQuantizeArgs(x, y, scale, zp), qp.FakeQuantizeArgs(x, x, scale, zp)
    fast_calls, slow_calls = _Calls(fast, recorder), _Calls(slow, recorder)
    for args in (out_of_place, out_of_place, in_place, out_of_place, in_place, in_place, out_of_place, out_of_place):
        start = len(recorder)
        slow._launch(0, None, slow._check_call(None, None, args))
        expected = slow_calls.events(start)
        start = len(recorder)
        fast.run(None, None, args)
        assert fast_calls.events(start) == expected, args is in_place
    assert fast._fast[True][0].traced is False and fast._fast[True][1].traced is True
    assert len(memsets) == 6


# ---- repeated pointers: stores skipped only while the argument blocks hold them ------------------------


@pytest.mark.parametrize("base", sorted(_bases()) or ["(bad-input table not importable)"])
def test_pointer_stores_skipped_only_while_the_blocks_hold_them(base: str, recorder: list[tuple[int, ...]]) -> None:
    """A generated function skips its pointer stores when the call's pointers are those it stored
    last and no other writer came since. Calls alternate between two buffer sets (and two
    workspaces), between the fast path and the slow path (``_run_slow``: the checks and ``_launch``),
    between checked and unchecked, and between two streams (two checked signatures sharing the
    argument blocks), with runs of repeated calls between: every call launches the bytes the checks
    and ``_launch`` alone launch."""
    bases = _bases()
    if base not in bases:
        pytest.skip("the bad-input table is not importable")
    import test_bad_inputs

    setup = test_bad_inputs.make_setup(base, np.random.default_rng(0))
    plan = setup.plan_cls.select(None, setup.desc)
    slow = setup.plan_cls.select(None, setup.desc)
    nbytes = plan.workspace_size()
    sets = []
    for n in range(2):
        fields = {
            name: host_sim.device_array((1 << 32) * (2 + 2 * i + n), value.shape, value.dtype)
            if isinstance(value, np.ndarray)
            else value
            for i, (name, value) in enumerate(setup.host.items())
        }
        workspace = qp.Workspace(host_sim.device_array((1 << 32) * 90 + n * 4096, (nbytes,), "uint8"), nbytes)
        sets.append((setup.args_cls(**fields), workspace if nbytes else None))
    plan_calls, slow_calls = _Calls(plan, recorder), _Calls(slow, recorder)
    rng = random.Random(zlib.crc32(base.encode()) + 1)
    schedule = [(n % 2, "run", True, None) for n in range(6)] + [(0, "run", True, None)] * 3
    schedule += [(n % 2, "run", False, None) for n in range(4)] + [(1, "run", False, None)] * 3
    for _ in range(60):
        schedule.append(
            (rng.randrange(2), rng.choice(["run", "run", "slow"]), rng.random() < 0.6, rng.choice([None, 7]))
        )
        schedule += [schedule[-1]] * rng.choice([0, 0, 1, 2])
    for which, path, check, stream in schedule:
        args, workspace = sets[which]
        start = len(recorder)
        slow._launch(_launch.stream_handle(stream), workspace, slow._check_call(stream, workspace, args))
        expected = slow_calls.events(start)
        start = len(recorder)
        if path == "run":
            plan.run(stream, workspace, args, check=check)
        else:
            plan._run_slow(stream, workspace, args, check)
        assert plan_calls.events(start) == expected, (base, which, path, check, stream)
    assert "run" in plan.__dict__, "no dispatcher was made"


@pytest.mark.parametrize(
    "kwargs",
    [{"scope": qp.TokenScope()}, {"group_size": 100, "asymmetric": True}, {}],
    ids=["per token", "groups asymmetric", "per tensor (a workspace)"],
)
def test_dequantize_of_a_replayed_quantize_launches_what_the_full_path_launches(
    byte_recorder: Any, kwargs: dict[str, Any]
) -> None:
    """``qp.dequantize`` of a replayed CuPy quantize's result reads the pointers of its regions from
    its one allocation (none of its arrays is made) and launches what the full path launches for
    a QuantizedTensor of the same arrays, byte for byte."""
    import cupy

    from quantplan import _frontend
    from quantplan.functional import QuantizedTensor

    dtype = "uint4" if kwargs.get("asymmetric") else "int8"
    x = host_sim.device_array(1 << 36, (16, 1000), "float16")
    events, reset = byte_recorder
    for _ in range(2):
        for _ in range(2):  # the full paths, then a replayed quantize's dequantize (its full path)
            qp.dequantize(qp.quantize(x, dtype, **kwargs), "float32")
        reset()
        qt = qp.quantize(x, dtype, **kwargs)
        assert isinstance(qt, QuantizedTensor) and not {"codes", "scale", "zero_point"} & set(vars(qt))
        start = len(events)
        y = qp.dequantize(qt, "float32")
        replayed = events[start:]
        assert replayed and not {"codes", "scale", "zero_point"} & set(vars(qt)), "the replay made no array"
        assert y.shape == (16, 1000) and y.dtype == np.float32
        eager = QuantizedTensor(qt.codes, qt.scale, qt.zero_point, qt.descriptor)
        _frontend.clear_plan_cache()
        reset()
        taken = cupy.empty(1, "uint8")  # qt's allocation's place: the output lands where the replay's did
        start = len(events)
        qp.dequantize(eager, "float32")
        assert events[start:] == replayed and taken is not None
