"""The fast path of ``Plan.run`` (``quantplan.runtime._fast_check``) never changes a verdict.

CPU only: CUDA plans are built without kernels (their launch captures the operand record), the
arrays are fakes that expose what CuPy arrays / PyTorch tensors expose (dtype, shape, contiguity,
device, pointer). Over many random mutations of a valid call (dtype, shape, contiguity, device,
alignment, overlap and identity, scalar values, workspace, stream), ``run`` through the signature
cache must raise exactly what the checks alone raise, and launch exactly the record they return.
"""

from __future__ import annotations

import random
import zlib
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import quantplan as qp
from quantplan.runtime import _fast_check, _plan, _readers
from quantplan.runtime._launch import stream_handle
from quantplan.runtime._operands import Operand
from quantplan.vocabulary.errors import QuantPlanError

F16, F32, I8, I32, I64, U8 = (np.dtype(n) for n in ("float16", "float32", "int8", "int32", "int64", "uint8"))


class _Mem:
    __slots__ = ("device_id", "ptr")

    def __init__(self, ptr: int, device_id: int) -> None:
        self.ptr, self.device_id = ptr, device_id


class FakeCupy:
    """What the checks read of a CuPy array."""

    def __init__(self, ptr: int, shape: tuple[int, ...], dtype: np.dtype, contiguous: bool = True, device: int = 0):
        self.data = _Mem(ptr, device)
        self.shape, self.dtype, self.itemsize, self._c_contiguous = shape, dtype, dtype.itemsize, contiguous
        self.device = SimpleNamespace(id=device)


class FakeTorch:
    """What the checks read of a PyTorch tensor."""

    def __init__(self, ptr: int, shape: tuple[int, ...], dtype: np.dtype, contiguous: bool = True, device: int = 0):
        self._ptr, self.shape, self.dtype, self._contiguous, self._device = ptr, shape, dtype, contiguous, device

    def data_ptr(self) -> int:
        return self._ptr

    def get_device(self) -> int:
        return self._device

    def element_size(self) -> int:
        return self.dtype.itemsize

    def is_contiguous(self) -> bool:
        return self._contiguous


@pytest.fixture(autouse=True)
def _fakes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(_readers._READERS, FakeCupy, _readers._cupy_operand_direct)
    monkeypatch.setitem(_readers._READERS, FakeTorch, _readers._torch_operand)
    monkeypatch.setitem(_readers._POINTERS, FakeCupy, _readers._cupy_pointer)
    monkeypatch.setitem(_readers._POINTERS, FakeTorch, _readers._torch_pointer)
    monkeypatch.setattr(_fast_check, "current_device", lambda: 0)
    monkeypatch.setattr(_plan, "device_info", lambda device_id: SimpleNamespace(arch=SimpleNamespace(name="sm_90")))


def _cuda_plan(cls: type, problem_args: tuple[Any, ...], **extra: Any) -> Any:
    """A CUDA plan on device 0 without kernels: its launch records what it was given."""
    plan = cls(*problem_args, device_id=0, variant="fake", **extra)
    plan.launched = []
    plan._launch = lambda handle, workspace, record: plan.launched.append((handle, _flat(record)))
    return plan


def _flat(record: Any) -> tuple[Any, ...]:
    return tuple(
        (v.ptr, tuple(v.shape), v.dtype_name, v.itemsize, v.contiguous, v.device_id) if type(v) is Operand else v
        for v in record
    )


def _outcome(call: Any) -> tuple[Any, ...]:
    try:
        return ("ok", call())
    except QuantPlanError as exc:
        return ("raised", type(exc).__name__, str(exc))


def _dynamic_plan(mode: qp.QuantMode, rounding: qp.Rounding = qp.Rounding.NEAREST_EVEN) -> Any:
    from quantplan.ops.dynamic_range import DynamicRangeQuantizePlan

    desc = qp.DynamicRangeQuantizeDescriptor(
        shape=(4, 64), scope=qp.TokenScope(), mode=mode, input_element=qp.ElementKind.F16,
        output_element=qp.ElementKind.S8, rounding=rounding,
    )  # fmt: skip
    ref = DynamicRangeQuantizePlan.select(None, desc, qp.PlanPreference(backend=qp.BackendKind.REFERENCE))
    return _cuda_plan(DynamicRangeQuantizePlan, (desc, ref.problem))


def _fake_plan() -> Any:
    from quantplan.ops.fake_quantize import FakeQuantizePlan

    desc = qp.FakeQuantizeDescriptor(
        shape=(4, 64),
        scope=qp.TensorScope(),
        mode=qp.QuantMode.ASYMMETRIC,
        element=qp.ElementKind.F16,
        q_min=-128,
        q_max=127,
    )
    ref = FakeQuantizePlan.select(None, desc, qp.PlanPreference(backend=qp.BackendKind.REFERENCE))
    plan = FakeQuantizePlan(ref.problem, 0, "fake", None)
    plan.launched = []
    plan._launch = lambda handle, workspace, record: plan.launched.append((handle, _flat(record)))
    return plan


_BASE = 1 << 20


def _mutate(
    rng: random.Random, what: str, ptr: int, shape: tuple[int, ...], dtype: np.dtype, shapes: list[tuple[int, ...]]
) -> tuple[int, tuple[int, ...], np.dtype, bool, int]:
    """(pointer, shape, dtype, contiguous, device) of an array with property ``what`` mutated."""
    contiguous, device = True, 0
    if what == "dtype":
        dtype = rng.choice([F16, F32, I8, I32, I64, U8])
    elif what == "shape":
        shape = rng.choice(shapes)
    elif what == "contiguous":
        contiguous = False
    elif what == "device":
        device = rng.choice([-1, 1])
    elif what == "align":
        ptr += rng.choice([1, 2, 4, 8, 16, 256, 512])
    return ptr, shape, dtype, contiguous, device


def _array(rng: random.Random, kind: type, ptr: int, shape: tuple[int, ...], dtype: np.dtype) -> Any:
    """A valid array, or (a third of the time) one with one property mutated."""
    if rng.random() >= 0.33:
        return kind(ptr, shape, dtype)
    what = rng.choice(["dtype", "shape", "contiguous", "device", "align", "kind", "none", "scalar"])
    if what == "none":
        return None
    if what == "scalar":
        return rng.choice([0, 1, -1, 0.5, -0.0, 0.0, 2**64, True, np.float32(1)])
    if what == "kind":
        kind = FakeTorch if kind is FakeCupy else FakeCupy
    return kind(*_mutate(rng, what, ptr, shape, dtype, [(4, 64), (4, 1), (1, 4), (256,), (4, 65), ()]))


def _pointers(rng: random.Random, n: int) -> list[int]:
    """Pointers of ``n`` arrays: mostly disjoint, sometimes one equal to or inside another."""
    ptrs = [_BASE + rng.choice([0, 1, 2, 3]) * 4096 * 16 + 4096 * 16 * 8 * i for i in range(n)]
    if rng.random() < 0.3:
        i, j = rng.sample(range(n), 2)
        ptrs[i] = ptrs[j] + rng.choice([0, 0, 2, 64, 512])
    return ptrs


def _dynamic_args(rng: random.Random, asymmetric: bool) -> Any:
    kind = rng.choice([FakeCupy, FakeTorch])
    ptrs = _pointers(rng, 4)
    x = _array(rng, kind, ptrs[0], (4, 64), F16)
    y = _array(rng, kind, ptrs[1], (4, 64), I8)
    scale = _array(rng, kind, ptrs[2], (4, 1), F32)
    zp = _array(rng, kind, ptrs[3], (4, 1), I32) if asymmetric or rng.random() < 0.1 else None
    if rng.random() < 0.1:
        y = x  # the same object twice
    seed = rng.choice([None] * 8 + [0, 5, 2**64 - 1, -1])
    return qp.DynamicRangeQuantizeArgs(x, y, scale, zp, seed, rng.choice([None] * 8 + [0, 1]))


def _fake_args(rng: random.Random) -> Any:
    kind = rng.choice([FakeCupy, FakeTorch])
    ptrs = _pointers(rng, 2)
    x = _array(rng, kind, ptrs[0], (4, 64), F16)
    y = x if rng.random() < 0.2 else _array(rng, kind, ptrs[1], (4, 64), F16)
    scale = rng.choice([0.5, 0.25, 1e-30, 0.0, -0.0, -1.0, float("nan"), float("inf"), 1, 3e38, 1e-40])
    zp = rng.choice([0, 3, -128, 127, 128, 1000, 0.5, 2.5, -0.0, None, True])
    return qp.FakeQuantizeArgs(x, y, scale, zp)


class FakeCupyStream:
    """A CuPy stream: its handle is ``.ptr`` (unless an instance was given a ``cuda_stream``)."""

    __module__ = "cupy.cuda.stream"

    def __init__(self, ptr: int, **extra: Any) -> None:
        self.ptr = ptr
        self.__dict__.update(extra)


class FakeTorchStream:
    """A PyTorch stream: its handle is ``.cuda_stream``."""

    __module__ = "torch.cuda.streams"

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    @property
    def cuda_stream(self) -> Any:
        return self._handle


def _stream(rng: random.Random) -> Any:
    return rng.choice(
        [7, 7, 7, 8, SimpleNamespace(ptr=7), SimpleNamespace(cuda_stream=9), "bad", True, 1.5,
         FakeCupyStream(7), FakeCupyStream(8), FakeCupyStream(7, cuda_stream=9), FakeTorchStream(7),
         FakeTorchStream(None), FakeTorchStream(9)]
    )  # fmt: skip


def _workspace(rng: random.Random) -> Any:
    """None, or a workspace of 64 / 32 bytes on the device or the host, or no workspace at all."""
    ptr = rng.choice([_BASE, 64 * _BASE, 64 * _BASE + 8])
    return rng.choice(
        [None, qp.Workspace(FakeCupy(ptr, (64,), U8), 64), qp.Workspace(FakeTorch(ptr, (64,), U8), 64),
         qp.Workspace(FakeCupy(ptr, (32,), U8), 32), qp.Workspace(np.empty(64, U8), 64), "workspace"]
    )  # fmt: skip


def _check_plan(plan: Any, make_args: Any, trials: int, seed: int, workspaces: bool = False) -> int:
    """Random calls through ``run`` (fast path) and through the checks alone: same verdicts, same
    records; unchecked calls launch what ``_extract`` gives. Returns how many checked calls that
    passed skipped ``_check_call``."""
    rng = random.Random(seed)
    slow_check, slow_extract = plan._check_call, plan._extract
    slow_calls = [0]

    def counted(*call: Any) -> Any:
        slow_calls[0] += 1
        return slow_check(*call)

    plan._check_call = counted
    hits = 0
    pool = [(make_args(rng), _workspace(rng) if workspaces else None) for _ in range(40)]  # calls repeat
    for _ in range(trials):
        args, ws = rng.choice(pool) if rng.random() < 0.6 else (make_args(rng), _workspace(rng) if workspaces else None)
        stream = _stream(rng) if rng.random() < 0.4 else 7
        check = rng.random() < 0.85
        if check:
            # run without a fast path: the checks, then the stream's handle for the launch
            expected = _outcome(lambda s=stream, w=ws, a=args: (_flat(slow_check(s, w, a)), stream_handle(s))[0])
        else:
            expected = _outcome(lambda a=args: _flat(slow_extract(a)))
        before, slow_before = len(plan.launched), slow_calls[0]
        got = _outcome(lambda s=stream, w=ws, a=args, c=check: plan.run(s, w, a, check=c))
        if got[0] == "ok":
            assert len(plan.launched) == before + 1
            got = ("ok", plan.launched[-1][1])
            hits += check and slow_calls[0] == slow_before
        if check or got[0] == "ok" and expected[0] == "ok":  # unchecked: a bad stream raises only in run
            assert got == expected, (args, ws, stream, check)
    return hits


@pytest.mark.parametrize("mode", [qp.QuantMode.SYMMETRIC, qp.QuantMode.ASYMMETRIC])
def test_dynamic_range_fast_path_keeps_every_verdict(mode: qp.QuantMode) -> None:
    plan = _dynamic_plan(mode)
    hits = _check_plan(plan, lambda rng: _dynamic_args(rng, mode is qp.QuantMode.ASYMMETRIC), 3000, 1)
    assert hits > 50  # the fast path was taken


def test_stochastic_fast_path_keeps_every_verdict() -> None:
    plan = _dynamic_plan(qp.QuantMode.SYMMETRIC, qp.Rounding.STOCHASTIC)
    hits = _check_plan(plan, lambda rng: _dynamic_args(rng, False), 3000, 2)
    assert hits > 10


def test_workspace_fast_path_keeps_every_verdict() -> None:
    plan = _dynamic_plan(qp.QuantMode.SYMMETRIC)
    plan._workspace_bytes = 64  # the checks of a plan with a workspace (the launch is captured)
    hits = _check_plan(plan, lambda rng: _dynamic_args(rng, False), 3000, 4, workspaces=True)
    assert hits > 30


def test_fake_quantize_fast_path_keeps_every_verdict() -> None:
    hits = _check_plan(_fake_plan(), _fake_args, 3000, 3)
    assert hits > 50


def test_fast_path_holds_no_caller_array() -> None:
    plan = _dynamic_plan(qp.QuantMode.SYMMETRIC)
    args = qp.DynamicRangeQuantizeArgs(
        FakeCupy(_BASE, (4, 64), F16), FakeCupy(2 * _BASE, (4, 64), I8), FakeCupy(3 * _BASE, (4, 1), F32)
    )
    plan.run(7, None, args)
    plan.run(7, None, args)
    plan.run(7, None, args, check=False)
    matchers = [*plan._calls.fast[False], *plan._calls.fast[True]]
    held = [v for m in matchers for v in m.__globals__.values()]
    records = [v for v in held if isinstance(v, tuple) and hasattr(v, "_fields")]
    assert len(records) == 2 and all(v.obj is None for r in records for v in r if type(v) is Operand)
    assert not any(isinstance(v, FakeCupy) for v in held)
    assert len(plan.launched) == 3


# ---- every plan configuration of the bad-input table -------------------------------------------


def _bases() -> dict[str, Any]:
    try:
        import test_bad_inputs
    except Exception:  # the table is not importable in this checkout: nothing to run over
        return {}
    # the reference-only configurations too: their checks are the CUDA plan's checks
    return {**test_bad_inputs.BASES, **getattr(test_bad_inputs, "REFERENCE_BASES", {})}


def _as_cuda(plan: Any) -> Any:
    """A plan selected on the reference backend, switched to CUDA device 0 with a captured launch."""
    plan.backend, plan._is_reference, plan.device_id, plan._empty = qp.BackendKind.CUDA, False, 0, False
    plan.launched = []
    plan._launch = lambda handle, workspace, record: plan.launched.append((handle, _flat(record)))
    return plan


def _mutant(rng: random.Random, host: dict[str, Any], ptrs: dict[str, int]) -> Any:
    """The valid fields as fake device arrays (fresh pointers), some of them mutated."""
    names = list(host)
    values: dict[str, Any] = {}
    for name in names:
        value = host[name]
        if isinstance(value, np.ndarray):
            kind = FakeCupy if rng.random() < 0.5 else FakeTorch
            values[name] = kind(ptrs[name], value.shape, value.dtype)
        else:
            values[name] = value
    for _ in range(rng.choice([0, 0, 1, 1, 2])):
        name = rng.choice(names)
        value = values[name]
        what = rng.choice(
            ["dtype", "shape", "contiguous", "device", "align", "overlap", "same", "none", "scalar", "move"]
        )
        if isinstance(value, (FakeCupy, FakeTorch)):
            kind = type(value)
            ptr = value.data.ptr if kind is FakeCupy else value.data_ptr()
            shapes = [(*value.shape, 1), value.shape[:-1], tuple(e + 1 for e in value.shape), (1,)]
            ptr, shape, dtype, contiguous, device = _mutate(rng, what, ptr, value.shape, value.dtype, shapes)
            if what == "move":  # another address order (below, between or above the others), or null
                ptr = rng.choice([0, _BASE, 2 * _BASE, 6 * _BASE, 10 * _BASE, 64 * _BASE, 64 * _BASE + 256])
            if what in ("overlap", "same"):
                other = rng.choice(names)
                if isinstance(values[other], (FakeCupy, FakeTorch)):
                    if what == "same":
                        values[name] = values[other]
                        continue
                    ptr = ptrs[other] + rng.choice([0, 2, 64])
            if what == "none":
                values[name] = None
            elif what == "scalar":
                values[name] = rng.choice([0.5, 1, -1, 0, 0.0, True, 2**64, 1e-40])
            else:
                values[name] = kind(ptr, shape, dtype, contiguous, device)
        else:
            values[name] = rng.choice([None, 0.5, 1, -1, 0, -0.0, 2**64, 1234, 5, value])
    return values


@pytest.mark.parametrize("base", sorted(_bases()) or ["(bad-input table not importable)"])
def test_every_plan_configuration_keeps_every_verdict(base: str) -> None:
    bases = _bases()
    if base not in bases:
        pytest.skip("the bad-input table is not importable")
    import test_bad_inputs

    setup = test_bad_inputs.make_setup(base, np.random.default_rng(0))
    ref = qp.PlanPreference(backend=qp.BackendKind.REFERENCE)
    plan = _as_cuda(setup.plan_cls.select(None, setup.desc, ref))
    host = dict(setup.host)
    ptrs = {name: _BASE * (4 + 4 * i) for i, name in enumerate(host)}

    def make_args(rng: random.Random) -> Any:
        return setup.args_cls(**_mutant(rng, host, ptrs))

    hits = _check_plan(plan, make_args, 800, zlib.crc32(base.encode()))
    assert hits > 5, base


def test_changing_scalars_stop_being_remembered() -> None:
    """A Philox offset counting up never repeats a signature: after REMEMBER_LIMIT signatures the
    calls take the checks alone (no code generation per call), and still launch what they check."""
    plan = _dynamic_plan(qp.QuantMode.SYMMETRIC, qp.Rounding.STOCHASTIC)
    x, y, scale = FakeCupy(_BASE, (4, 64), F16), FakeCupy(2 * _BASE, (4, 64), I8), FakeCupy(3 * _BASE, (4, 1), F32)
    for offset in range(3 * _fast_check.REMEMBER_LIMIT):
        args = qp.DynamicRangeQuantizeArgs(x, y, scale, None, 7, offset)
        plan.run(7, None, args)
        assert plan.launched[-1][1] == _flat(plan._check_call(7, None, args))
    assert plan._calls._count[True, qp.DynamicRangeQuantizeArgs] == _fast_check.REMEMBER_LIMIT
