"""CPU tests of ``quantplan.distributed``: quantized reduce-scatter (qgZ) and all-gather (qwZ) over gloo.

Each world size (2 and 4 processes) is one ``torch.multiprocessing`` launch that runs every case
of this module in order (``tests/_distributed_worker.py::cpu_worker``, reference backend); the
tests then check each rank's results against NumPy models composed from
:mod:`quantplan.reference` (bit for bit) and against the exact full-precision result (within
the bound the bit width implies). Fresh random data every session (the seed is printed).

Skipped when PyTorch (or ``torch.distributed``) is not installed.
"""

from __future__ import annotations

import pickle
import secrets
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():  # pragma: no cover - builds without distributed support
    pytest.skip("torch.distributed is not available in this PyTorch build", allow_module_level=True)

import _distributed_worker as worker  # noqa: E402  (tests/ is on sys.path under pytest)

import quantplan.distributed as qpd  # noqa: E402
import quantplan.distributed._comm as qpd_comm  # noqa: E402
from quantplan.vocabulary.elements import ELEMENTS  # noqa: E402
from quantplan.vocabulary.errors import InvalidProblem, Unsupported  # noqa: E402
from quantplan.vocabulary.types import ElementKind, QuantMode  # noqa: E402

S4, U4, S8, U8 = ElementKind.S4, ElementKind.U4, ElementKind.S8, ElementKind.U8
SYM, ASYM = QuantMode.SYMMETRIC, QuantMode.ASYMMETRIC
F16, BF16, F32 = ElementKind.F16, ElementKind.BF16, ElementKind.F32

# (name, nodes, code, mode, dtype, average, implementation or None for the function, extra)
RS_CASES: dict[int, list[tuple[Any, ...]]] = {
    2: [
        ("rs-s4-sym-bf16", 1, S4, SYM, BF16, True, None, {}),
        ("rs-s8-sym-f32-sum", 1, S8, SYM, F32, False, None, {}),
        ("rs-s4-asym-f16", 1, S4, ASYM, F16, True, None, {}),
        ("rs-s8-asym-bf16", 1, S8, ASYM, BF16, True, "plans", {}),
        ("rs-u4-asym-f32-composed", 1, U4, ASYM, F32, True, "composed", {}),
        ("rs-u8-asym-f16-sum-composed", 1, U8, ASYM, F16, False, "composed", {}),
        ("rs-s8-sym-f32-nodes2", 2, S8, SYM, F32, True, None, {}),
        ("rs-s4-asym-bf16-nodes2-composed", 2, S4, ASYM, BF16, True, "composed", {}),
    ],
    4: [
        ("rs-s4-sym-bf16-nodes2", 2, S4, SYM, BF16, True, None, {}),
        ("rs-s8-sym-f32-nodes2-sum", 2, S8, SYM, F32, False, None, {}),
        ("rs-s4-asym-f16-nodes2", 2, S4, ASYM, F16, True, "plans", {}),
        ("rs-s8-asym-bf16-nodes2-composed", 2, S8, ASYM, BF16, True, "composed", {}),
        ("rs-u4-asym-f32-nodes2-composed-sum", 2, U4, ASYM, F32, False, "composed", {}),
        ("rs-s4-sym-f32-nodes2-group", 2, S4, SYM, F32, True, "auto", {"explicit_group": True}),
        ("rs-s8-asym-f32-nodes1", 1, S8, ASYM, F32, True, None, {}),
        ("rs-s4-sym-bf16-nodes4", 4, S4, SYM, BF16, True, None, {}),
    ],
    # Three peers: the average divides by 3 (IEEE division, not a product with 1/3).
    3: [
        ("rs3-s8-sym-f32", 1, S8, SYM, F32, True, "plans", {}),
        ("rs3-s4-asym-f32-composed", 1, S4, ASYM, F32, True, "composed", {}),
        ("rs3-s8-asym-f16-nodes3", 3, S8, ASYM, F16, True, None, {}),
        ("rs3-s4-sym-f32-nodes3-composed", 3, S4, SYM, F32, True, "composed", {}),
    ],
}
# (name, code, mode, dtype)
AG_CASES: dict[int, list[tuple[Any, ...]]] = {
    2: [("ag-s8-sym-bf16", S8, SYM, BF16), ("ag-s4-asym-f32", S4, ASYM, F32), ("ag-u8-asym-f16", U8, ASYM, F16)],
    4: [("ag-s8-sym-f32", S8, SYM, F32), ("ag-u4-asym-bf16", U4, ASYM, BF16)],
    3: [("ag3-s4-sym-f16", S4, SYM, F16)],
}
# (bad kind, words the message must contain)
BAD_CASES: dict[str, tuple[str, ...]] = {
    "nodes": ("not divisible by nodes=3",),
    "numel": ("pad the flattened tensor to",),
    "dtype": ("dtype", "must match"),
    "int_dtype": ("int32",),
    "out_size": ("numel / world",),
    "noncontiguous_input": ("input is not contiguous",),
    "noncontiguous_output": ("output is not contiguous",),
    "devices": ("same device",),
    "code": ("S8, U8, S4 or U4",),
    "unsigned_sym": ("clip every negative value",),
    "odd4bit": ("even",),
    "ag_group": ("multiple of group_size=8", "pad every shard to 16"),
    "ag_size": ("world * shard",),
    "ag_odd4bit": ("even",),
}
WORLD_BAD = {2: list(BAD_CASES), 3: ["numel"], 4: ["nodes", "numel", "dtype", "ag_group"]}
WORLDS = sorted(RS_CASES)
GROUP_SIZES = [5, 6, 7, 10, 13, 16, 33, 64, 100, 2048]


def _sizes(rng: np.random.Generator, code: ElementKind) -> tuple[int, int]:
    """A ragged group size and a shard of 1 to 4 whole groups (even for 4-bit codes)."""
    g = int(rng.choice(GROUP_SIZES))
    groups = int(rng.integers(1, 5)) if g < 2048 else 1
    if ELEMENTS[code].is_packed and (g * groups) % 2:
        groups *= 2
    return g, g * groups


def _cases(world: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = [{"name": f"bad-{b}", "op": "bad", "bad": b} for b in WORLD_BAD[world]]
    for name, nodes, code, mode, dtype, average, impl, extra in RS_CASES[world]:
        g, shard = _sizes(rng, code)
        inputs = [worker.random_input(rng, world * shard, dtype) for _ in range(world)]
        cases.append(
            dict(
                name=name,
                op="rs",
                nodes=nodes,
                code=code,
                mode=mode,
                dtype=dtype,
                average=average,
                implementation=impl,
                group_size=g,
                inputs=inputs,
                **extra,
            )
        )
    for name, code, mode, dtype in AG_CASES[world]:
        g, shard = _sizes(rng, code)
        inputs = [worker.random_input(rng, shard, dtype) for _ in range(world)]
        cases.append(dict(name=name, op="ag", code=code, mode=mode, dtype=dtype, group_size=g, inputs=inputs))
    return cases


def _launch(world: int, cases: list[dict[str, Any]], tmp: Path, timeout: float = 240.0) -> list[list[dict[str, Any]]]:
    """Run ``cases`` on ``world`` gloo processes; each rank's list of results."""
    import torch.multiprocessing as mp

    case_file = tmp / "cases.pkl"
    case_file.write_bytes(pickle.dumps(cases))
    ctx = mp.start_processes(
        worker.cpu_worker,
        args=(world, str(tmp / "store"), str(case_file), str(tmp)),
        nprocs=world,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
            pytest.fail(f"{world} gloo processes did not finish in {timeout} s (a collective hung?)")
    return [pickle.loads((tmp / f"rank{r}.pkl").read_bytes()) for r in range(world)]


class _Run:
    def __init__(self, world: int, seed: int, cases: list[dict[str, Any]], results: list[list[dict[str, Any]]]):
        self.world = world
        self.seed = seed
        self.cases = {c["name"]: c for c in cases}
        self.results = {c["name"]: [results[r][i] for r in range(world)] for i, c in enumerate(cases)}


class _Runs:
    """One launch per world size, on first use, shared by every test of this module."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self.tmp_path_factory = tmp_path_factory
        self.done: dict[int, _Run] = {}

    def get(self, world: int) -> _Run:
        if world not in self.done:
            seed = secrets.randbits(63)
            print(f"random seed (world {world}): {seed}")
            cases = _cases(world, np.random.default_rng(seed))
            results = _launch(world, cases, self.tmp_path_factory.mktemp(f"world{world}"))
            self.done[world] = _Run(world, seed, cases, results)
        return self.done[world]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> _Runs:
    return _Runs(tmp_path_factory)


@pytest.fixture
def run(runs: _Runs, world: int) -> _Run:
    return runs.get(world)


def _results(run: _Run, name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    per_rank = run.results[name]
    for r, res in enumerate(per_rank):
        assert "crash" not in res, f"rank {r} (seed {run.seed}):\n{res['crash']}"
    return run.cases[name], per_rank


def _params(table: dict[int, list[Any]]) -> list[Any]:
    return [pytest.param(w, name, id=f"world{w}-{name}") for w in WORLDS for name in table[w]]


RS = _params({w: [c[0] for c in RS_CASES[w]] for w in WORLDS})
AG = _params({w: [c[0] for c in AG_CASES[w]] for w in WORLDS})
RS_OBJECT = _params({w: [c[0] for c in RS_CASES[w] if c[6] is not None] for w in WORLDS})
BAD = _params({w: [f"bad-{b}" for b in WORLD_BAD[w]] for w in WORLDS})


@pytest.mark.parametrize(("world", "name"), RS)
def test_reduce_scatter_matches_reference_composition(run: _Run, name: str) -> None:
    """Every rank's shard equals, bit for bit, reference.swizzled_quantize on every rank followed by
    reference.dequant_reduce over the node's peers (and for nodes > 1 over the nodes), and two
    runs give the same bits."""
    case, per_rank = _results(run, name)
    model, _ = worker.reduce_scatter_model(
        case["inputs"], case["nodes"], case["group_size"], case["code"], case["mode"], case["average"], case["dtype"]
    )
    for r, res in enumerate(per_rank):
        expected = model[r].astype(np.float32)
        assert worker.bits_equal(res["output"], expected), f"rank {r} (seed {run.seed}): differs from the model"
        assert worker.bits_equal(res["output"], res["output2"]), f"rank {r}: two runs differ"
        assert not np.isnan(res["output"]).any()


@pytest.mark.parametrize(("world", "name"), RS)
def test_reduce_scatter_error_within_bound(run: _Run, name: str) -> None:
    """|result - exact mean| stays within the bound the bit width implies.

    Derivation: dynamic-range quantization with round to nearest moves each element by at most
    half a step, ``scale / 2`` of its group: SYMMETRIC codes cover ``[-max|x|, max|x|]`` exactly
    (``scale = max|x| / q_max``), ASYMMETRIC codes represent ``k * scale`` for ``k`` from
    ``rne(lo / scale)`` to that plus ``q_max - q_min``, which covers ``[lo, hi]`` to within half a
    step at both ends. Stage 1 quantizes every rank's input (scales ``s1_r``); the intra-node mean
    of the dequantized values is off by at most ``(1/dpn) * sum_r s1_r / 2``; for nodes > 1 it is
    re-quantized (scale ``s2_n``, another ``s2_n / 2``) and the nodes are averaged, so
    ``|y - mean| <= (1/nodes) * sum_n [(1/dpn) * sum_{r in n} s1_r / 2 + s2_n / 2]`` (sums
    without the ``1/...`` factors when not averaging). On top: float32 rounding of the
    dequantizations, additions and divisions (relative ``2**-24`` of the magnitudes each) and the
    final rounding to the output dtype (half an ulp). The scales come from the reference model.
    """
    case, per_rank = _results(run, name)
    _, bounds = worker.reduce_scatter_model(
        case["inputs"], case["nodes"], case["group_size"], case["code"], case["mode"], case["average"], case["dtype"]
    )
    exact, mags = worker.exact_reduce_scatter(case["inputs"], case["average"])
    for r, res in enumerate(per_rank):
        tol = worker.tolerance(bounds[r], exact[r], mags[r], case["dtype"], run.world)
        err = np.abs(res["output"].astype(np.float64) - exact[r])
        worst = int(np.argmax(err - tol))
        assert np.all(err <= tol), (
            f"rank {r} (seed {run.seed}): |error| {err[worst]:.4g} > bound {tol[worst]:.4g} at element {worst}"
        )


@pytest.mark.parametrize(("world", "name"), RS_OBJECT)
def test_reduce_scatter_implementation_and_bytes(run: _Run, name: str) -> None:
    """The object reports which implementation ran each step and the bytes it sends."""
    case, per_rank = _results(run, name)
    impl = case["implementation"]
    world, nodes = run.world, case["nodes"]
    dpn = world // nodes
    for res in per_rank:
        labels = res["describe"]
        assert set(labels) == ({"swizzle", "reduce_intra"} | ({"reduce_inter"} if nodes > 1 else set()))
        if impl == "composed":
            assert all(v.startswith("composed[") for v in labels.values())
        else:  # CPU: the plans on the reference backend
            assert labels["swizzle"].startswith("SwizzledQuantizePlan[reference")
            assert labels["reduce_intra"].startswith("DequantReducePlan[reference")
        numel = case["inputs"][0].size
        bits = ELEMENTS[case["code"]].storage_bits
        params = (8 if case["mode"] is ASYM else 4) * numel // case["group_size"]
        intra = (dpn - 1) * (numel * bits // 8 + params) // dpn
        inter = (nodes - 1) * (numel * bits // 8 + params) // world if nodes > 1 else 0
        assert tuple(res["bytes"]) == (intra, inter)


@pytest.mark.parametrize(("world", "name"), AG)
def test_all_gather(run: _Run, name: str) -> None:
    """qwZ: bit for bit reference.dynamic_quantize + reference.dequantize of every shard, twice the
    same bits, and within ``scale / 2`` (plus the output rounding) of the exact gathered tensor."""
    case, per_rank = _results(run, name)
    model, bound = worker.all_gather_model(
        case["inputs"], case["group_size"], case["code"], case["mode"], case["dtype"]
    )
    full = np.concatenate(case["inputs"]).astype(np.float64)
    tol = bound + worker.OUT_EPS[case["dtype"]] * (np.abs(full) + bound) + 8 * 2.0**-24 * (np.abs(full) + bound)
    for r, res in enumerate(per_rank):
        assert worker.bits_equal(res["output"], model.astype(np.float32)), f"rank {r} (seed {run.seed})"
        assert worker.bits_equal(res["output"], res["output2"])
        assert np.all(np.abs(res["output"] - full) <= tol)


@pytest.mark.parametrize(("world", "name"), BAD)
def test_bad_input_raises_before_communicating(run: _Run, name: str) -> None:
    """Every rank raises InvalidProblem with a message naming the rule, leaves the output untouched,
    and no rank entered a collective (all ranks went on to the later cases and the final barrier)."""
    _, per_rank = _results(run, name)
    bad = name.removeprefix("bad-")
    for r, res in enumerate(per_rank):
        assert res["error"] is not None, f"rank {r}: no error raised"
        kind, message = res["error"]
        assert kind == "InvalidProblem", f"rank {r}: {kind}: {message}"
        for word in BAD_CASES[bad]:
            assert word in message, f"rank {r}: {word!r} not in {message!r}"
        assert res["untouched"], f"rank {r}: output was written"


# ---- single-process checks ------------------------------------------------------------------------


def test_needs_initialized_process_group() -> None:
    if dist.is_initialized():  # pragma: no cover - another test left a group behind
        pytest.skip("a process group is initialized in this process")
    x = torch.zeros(16)
    with pytest.raises(InvalidProblem, match="init_process_group"):
        qpd.quantized_reduce_scatter(torch.zeros(8), x, group_size=8)
    with pytest.raises(InvalidProblem, match="init_process_group"):
        qpd.QuantizedAllGather(8, torch.float32, "cpu", group_size=8)


def test_rejects_unknown_group_and_options() -> None:
    with pytest.raises(InvalidProblem, match="ProcessGroup"):
        qpd.QuantizedReduceScatter(16, torch.float32, "cpu", group=object(), group_size=8)
    with pytest.raises(InvalidProblem, match="implementation"):
        qpd.QuantizedReduceScatter(16, torch.float32, "cpu", group_size=8, implementation="fast")  # type: ignore[arg-type]
    with pytest.raises(InvalidProblem, match="float16, bfloat16 or float32"):
        qpd.QuantizedReduceScatter(16, torch.float64, "cpu", group_size=8)
    with pytest.raises(InvalidProblem, match="nodes"):
        qpd.QuantizedReduceScatter(16, torch.float32, "cpu", nodes=0)


def test_nccl_communicator_unsupported_without_cupy_nccl() -> None:
    try:
        from cupy.cuda import nccl

        if getattr(nccl, "available", False):
            pytest.skip("CuPy's NCCL binding is available here")
    except ImportError:
        pass
    with pytest.raises(Unsupported, match="NCCL"):
        qpd.nccl_communicator()


class _FakeNccl:
    NCCL_UINT8 = 7

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def groupStart(self) -> None:  # noqa: N802 - CuPy's names
        self.calls.append(("start",))

    def groupEnd(self) -> None:  # noqa: N802
        self.calls.append(("end",))


class _FakeComm:
    def __init__(self, nccl: _FakeNccl, size: int, rank: int) -> None:
        self.nccl, self._size, self._rank = nccl, size, rank

    def size(self) -> int:
        return self._size

    def rank_id(self) -> int:
        return self._rank

    def device_id(self) -> int:
        return 0

    def send(self, ptr: int, count: int, dtype: int, peer: int, stream: int) -> None:
        self.nccl.calls.append(("send", ptr, count, dtype, peer, stream))

    def recv(self, ptr: int, count: int, dtype: int, peer: int, stream: int) -> None:
        self.nccl.calls.append(("recv", ptr, count, dtype, peer, stream))

    def allGather(self, src: int, dst: int, count: int, dtype: int, stream: int) -> None:  # noqa: N802
        self.nccl.calls.append(("allGather", src, dst, count, dtype, stream))


def test_cupy_all_to_all_is_grouped_send_recv_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CuPy path: one groupStart/groupEnd around a send and a recv of each peer's byte block."""
    fake = _FakeNccl()
    monkeypatch.setattr(qpd_comm, "_nccl_module", lambda: fake)
    monkeypatch.setattr(qpd_comm._CupyComm, "_stream", lambda self: 1234)
    comm = qpd_comm._CupyComm(_FakeComm(fake, 4, 1))
    send = torch.zeros((4, 6), dtype=torch.int32)
    recv = torch.zeros((4, 6), dtype=torch.int32)
    comm.all_to_all(send, recv)
    assert fake.calls[0] == ("start",) and fake.calls[-1] == ("end",)
    pairs = fake.calls[1:-1]
    assert len(pairs) == 8
    for peer in range(4):
        assert pairs[2 * peer] == ("send", send.data_ptr() + peer * 24, 24, 7, peer, 1234)
        assert pairs[2 * peer + 1] == ("recv", recv.data_ptr() + peer * 24, 24, 7, peer, 1234)
    fake.calls.clear()
    comm.all_gather(send[0], recv)
    assert fake.calls == [("allGather", send.data_ptr(), recv.data_ptr(), 24, 7, 1234)]


@pytest.fixture
def gloo_single(tmp_path: Path) -> Any:
    """A one-process gloo group in this process (destroyed afterwards)."""
    if dist.is_initialized():  # pragma: no cover - another test left a group behind
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        qpd.clear_cache()
        dist.destroy_process_group()


def test_single_rank_cache_and_zero_size(gloo_single: Any, rng: np.random.Generator) -> None:
    """One rank: the function wrappers match the model, reuse one cached object per problem, give
    the same bits twice, and a zero-size problem is a no-op."""
    g = 6
    x_np = worker.random_input(rng, 4 * g, BF16)
    x = torch.from_numpy(x_np).to(torch.bfloat16)
    model, _ = worker.reduce_scatter_model([x_np], 1, g, S4, ASYM, True, BF16)
    outs = []
    for _ in range(2):
        y = torch.empty(4 * g, dtype=torch.bfloat16)
        qpd.quantized_reduce_scatter(y, x, group_size=g, mode=ASYM)
        outs.append(y.float().numpy())
    assert len(qpd._CACHE) == 1
    assert worker.bits_equal(outs[0], model[0].astype(np.float32))
    assert worker.bits_equal(outs[0], outs[1])
    y = torch.empty(4 * g, dtype=torch.bfloat16)
    qpd.quantized_all_gather(y, x, group_size=g)
    expected, _ = worker.all_gather_model([x_np], g, S8, SYM, BF16)
    assert worker.bits_equal(y.float().numpy(), expected.astype(np.float32))
    assert len(qpd._CACHE) == 2
    empty = torch.empty(0)
    qpd.quantized_reduce_scatter(empty, empty, group_size=g)
    qpd.quantized_all_gather(empty, empty, group_size=g)
    op = qpd.QuantizedReduceScatter(4 * g, torch.float32, "cpu", group_size=g, code=S8)
    assert op.bytes_sent == qpd.CommBytes(0, 0) and op.bytes_sent.total == 0
    with pytest.raises(InvalidProblem, match="built for 24"):
        op.run(torch.empty(8), torch.empty(8))
