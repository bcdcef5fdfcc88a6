"""The block-scaled plans' CUDA selection, on a simulated GPU (CPU), and the fused columnwise copy on
the reference backend.

* ``select`` on CUDA resolves, for every kernel family a problem can reach (the 1-D lanes,
  NVFP4 with the tensor-amax kernel, the MX 32x32 / FP8 128x128 tiles, the fused transpose, the
  dequantize kernel), the instantiations it loads, the grid (2-D for the tile kernels, one launch
  per 65535 row tiles), the dynamic shared memory and the workspace; ``sku().variant`` names it;
* what no kernel serves raises Unsupported at ``select`` (nothing loaded or launched), and a bad
  ``columnwise`` raises InvalidProblem on every backend;
* NVFP4's ``run`` on CUDA enqueues, in order, the tensor amax (zeroed, then the amax kernel; or a
  number's f32 bytes memset into the workspace; or the caller's device array) and the quantize
  kernel reading it and writing S_dec into ``tensor_scale``: no host copy, no synchronization (an
  empty problem launches it with no block, for S_dec); stochastic NVFP4 selects the ``nv_e2m1_sr``
  twins and passes the seed and offset as values or device pointers;
* the columnwise copy of the reference backend equals ``reference_block_scaled.quantize_transpose``
  byte for byte (scales laid out as the rowwise ones), on fresh random ragged data.

``benchmarks/host_sim.py`` simulates the GPU: nothing compiles, each kernel is a stand-in, the
driver's launch and the runtime's copies are recorded.

Also: the block-scaled kernel's schedule table and launch geometry (quantplan.runtime._block_scaled_kernels).

The kernel's slot arithmetic (a team of threads per block, or whole blocks per thread) must match
what Python launches: too few threads would leave blocks unquantized, and a schedule holding two
blocks per thread needs an even block count. These tests recompute the geometry independently.
"""

from __future__ import annotations

import ctypes
import itertools
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import quantplan as qp
from quantplan.ops import block_scaled as bs
from quantplan.reference import block_scaled as rb
from quantplan.runtime import _block_scaled_kernels as bk
from quantplan.runtime import _block_scaled_tile_kernels as tk
from quantplan.runtime import _device, _launch
from quantplan.vocabulary.types import ElementKind as EK

# ---- plans -----------------------------------------------------------------------------------------

cupy = pytest.importorskip("cupy")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import host_sim  # noqa: E402

REF = qp.PlanPreference(backend=qp.BackendKind.REFERENCE)


class _Sim:
    """The simulated GPU's record: kernels loaded, launches, and the runtime's memsets and copies, in order."""

    def __init__(self) -> None:
        self.loaded: list[str] = []
        self.events: list[tuple[Any, ...]] = []


@pytest.fixture
def sim(monkeypatch: pytest.MonkeyPatch) -> _Sim:
    record = _Sim()

    def launch(fn: int, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, *rest: int) -> None:
        smem, stream, params, _ = rest
        record.events.append(("launch", fn, (gx, gy), bx, smem, params))

    def load_kernels(family: str, names: Any, arch: Any, device_id: int, options: Any = ()) -> dict[str, Any]:
        record.loaded += list(names)
        return {name: host_sim._Function() for name in names}

    def memset(ptr: int, value: int, size: int, stream: int) -> None:
        record.events.append(("memset", ptr, value, size))

    def memcpy(dst: int, src: int, size: int, kind: int, stream: int) -> None:
        runtime = cupy.cuda.runtime
        if kind == runtime.memcpyDeviceToHost:
            record.events.append(("d2h", src, size))
        else:
            record.events.append(("h2d", dst, ctypes.string_at(src, size)))

    for owner, name, value in host_sim.gpu_patches(launch, compile_kernels=False):
        if name == "load_kernels":
            value = load_kernels
        monkeypatch.setattr(owner, name, value)
    runtime = cupy.cuda.runtime
    monkeypatch.setattr(runtime, "memsetAsync", memset)
    monkeypatch.setattr(runtime, "memcpyAsync", memcpy)
    monkeypatch.setattr(runtime, "streamSynchronize", lambda stream: record.events.append(("sync",)))
    for module, name in ((_launch, "current_device"), (_launch, "_current_stream")):
        monkeypatch.setattr(module, name, getattr(module, name))  # bound on first use: restored afterwards
    _device.cuda_available.cache_clear()
    _device.device_info.cache_clear()
    yield record
    _device.cuda_available.cache_clear()
    _device.device_info.cache_clear()


def _quantize(**kw: Any) -> qp.BlockScaledQuantizeDescriptor:
    return qp.BlockScaledQuantizeDescriptor(**{"shape": (300, 257), "input_element": EK.BF16, **kw})


def _sched(dtype: str, block: int, contiguous: bool, teams: int) -> bk.Schedule:
    return bk.choose_schedule(dtype, block, contiguous, teams, 132)


# ---- what select resolves ------------------------------------------------------------------------


def test_nvfp4_selects_the_amax_and_quantize_kernels(sim: _Sim) -> None:
    plan = qp.BlockScaledQuantizePlan.select(None, _quantize(format="nvfp4", shape=(64, 256)))
    teams = 64 * 16
    want = [
        bk.kernel_name("bfloat16", "nvfp4", 16, False, False, _sched("bfloat16", 16, False, teams)),
        bk.kernel_name("bfloat16", "nvfp4", 16, False, True, _sched("bfloat16", 16, True, teams)),
        bk.amax_kernel_name("bfloat16"),
    ]
    assert sim.loaded == want
    assert plan.sku().variant == "tensor_amax+lanes[nvfp4,1x16,te,compact,contiguous|general]"
    assert plan.workspace_size() == 4 and plan.backend is qp.BackendKind.CUDA
    amax = plan._launches.amax
    assert amax is not None and amax.params.n == 64 * 256 and amax.block == bk.BLOCK_THREADS
    assert all(launch.params.rule == bk.NVFP4_RULES["te"] for launch in plan._launches.general)
    one_level = qp.BlockScaledQuantizePlan.select(None, _quantize(format="nvfp4", two_level=False))
    assert one_level.workspace_size() == 0 and one_level._launches.amax is None
    assert one_level.sku().variant.startswith("lanes[nvfp4,1x16,te,")


@pytest.mark.parametrize(
    "fmt,block,layout",
    [
        ("mxfp8_e4m3", (32, 32), "compact"),
        ("mxfp8_e5m2", (32, 32), "blocked"),
        ("fp8_block_e4m3", (128, 128), "compact"),
        ("fp8_block_e5m2", (128, 128), "column_major"),
        ("fp8_block_e4m3_ue8m0", (128, 128), "column_major"),
    ],
)
@pytest.mark.parametrize("shape", [(300, 257), (2, 64, 256)])
def test_tiles_select_the_tile_kernel(sim: _Sim, fmt: str, block: tuple[int, int], layout: str, shape: Any) -> None:
    plan = qp.BlockScaledQuantizePlan.select(None, _quantize(format=fmt, block=block, scale_layout=layout, shape=shape))
    sched = tk.TILE_SCHEDULES[block, "bfloat16"]
    element = fmt.split("_")[-1] if fmt.startswith("mx") else fmt.split("_")[2]
    divide = fmt in ("fp8_block_e4m3", "fp8_block_e5m2")  # the default rule: div
    aligned = (False, True) if shape[-1] % 16 == 0 else (False,)
    assert sim.loaded == [tk.tile_kernel_name("bfloat16", element, divide, a, sched) for a in aligned]
    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    for launch in plan._prepared:
        assert (launch.grid, launch.grid_y) == (-(-cols // sched.tile_cols), -(-rows // sched.tile_rows))
        assert launch.block == tk.THREADS and launch.params.row_tile_base == 0
        assert launch.params.scale_rows == (rows if fmt.startswith("mx") else -(-rows // 128))
    assert plan.sku().variant.startswith(f"tiles[{fmt},{block[0]}x{block[1]},")
    assert plan.workspace_size() == 0


def test_tall_tiles_launch_in_slices_of_65535_row_tiles(sim: _Sim) -> None:
    rows = (tk.MAX_GRID_Y + 2) * 128
    plan = qp.BlockScaledQuantizePlan.select(
        None, _quantize(format="fp8_block_e4m3", block=(128, 128), scale_layout="column_major", shape=(rows, 200))
    )
    first, second = plan._launches.general
    assert (first.grid_y, second.grid_y) == (tk.MAX_GRID_Y, 2)
    assert (first.params.row_tile_base, second.params.row_tile_base) == (0, tk.MAX_GRID_Y)
    scale_rows = rows // 128
    assert first.params.pad_rows == -(-scale_rows // 4) * 4  # the first slice zero-fills the padding
    assert (second.params.pad_rows, second.params.pad_cols) == (scale_rows, 2)


@pytest.mark.parametrize(
    "fmt,columnwise,layout,mode",
    [
        ("mxfp8_e4m3", "transposed", "compact", None),
        ("mxfp8_e5m2", "transposed", "blocked", "floor"),
        ("mxfp8_e4m3", "te_mxfp8", "compact", "even"),
        ("fp8_block_e4m3", "transposed", "column_major", None),
        ("fp8_block_e5m2", "transposed", "compact", "enc"),
        ("fp8_block_e4m3_ue8m0", "transposed", "packed_ue8m0", None),
    ],
)
def test_transpose_selects_the_fused_kernel(sim: _Sim, fmt: str, columnwise: str, layout: str, mode: Any) -> None:
    for shape, aligned in (((48, 64), (False, True)), ((300, 257), (False,)), ((40, 72), (False,))):
        sim.loaded.clear()
        d = _quantize(format=fmt, columnwise=columnwise, scale_layout=layout, scale_mode=mode, shape=shape)
        plan = qp.BlockScaledQuantizePlan.select(None, d)
        block = 32 if fmt.startswith("mx") else 128
        te = columnwise == "te_mxfp8"
        element = fmt.split("_")[1] if fmt.startswith("mx") else fmt.split("_")[2]
        divide = fmt in ("fp8_block_e4m3", "fp8_block_e5m2") and mode is None
        sched = tk.TRANSPOSE_SCHEDULES["bfloat16"]
        want = [tk.transpose_kernel_name("bfloat16", element, block, te, divide, a, sched) for a in aligned]
        assert sim.loaded == want, shape
        for launch in plan._prepared:
            assert launch.shared == tk.transpose_shared_bytes("bfloat16", block, te)
            assert (launch.grid, launch.grid_y) == (-(-shape[1] // 128), -(-shape[0] // 128))
        assert plan.sku().variant.startswith(f"transpose[{fmt},1x{block},")
        assert d.columnwise_codes_shape == ((shape[0], shape[1]) if te else (shape[1], shape[0]))


@pytest.mark.parametrize(
    "fmt,block,kind",
    [
        ("mxfp8_e4m3", None, 0),
        ("mxfp8_e4m3", (32, 32), 0),
        ("mxfp4", None, 0),
        ("mxint8", None, 0),
        ("nvfp4", None, 2),
        ("nvfp4", (16, 16), 2),
        ("fp8_block_e5m2", None, 1),
        ("fp8_block_e4m3_ue8m0", None, 0),
    ],
)
@pytest.mark.parametrize("out", [EK.F16, EK.BF16, EK.F32])
def test_dequantize_selects_the_dequantize_kernel(sim: _Sim, fmt: str, block: Any, kind: int, out: EK) -> None:
    d = qp.BlockScaledDequantizeDescriptor(shape=(3, 5, 100), format=fmt, block=block, output_element=out)
    plan = qp.BlockScaledDequantizePlan.select(None, d)
    p = d._problem()
    dtype = {EK.F16: "float16", EK.BF16: "bfloat16", EK.F32: "float32"}[out]
    element = "nvfp4" if fmt == "nvfp4" else p.element
    assert sim.loaded == [bk.dequantize_kernel_name(dtype, element, p.block[1])]
    (launch,) = plan._prepared
    assert (launch.params.scale_kind, launch.params.rows, launch.params.cols) == (kind, 15, 100)
    assert launch.params.blocks_per_row == -(-100 // p.block[1])
    assert plan.sku().variant == f"dequantize[{fmt},{p.block[0]}x{p.block[1]},{dtype}]"


# ---- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw,fragment",
    [
        (dict(format="nvfp4", scale_mode="torchao"), "te order"),
        (dict(format="nvfp4", block=(16, 16)), "16x16"),
        (dict(format="mxfp4", rounding=qp.Rounding.STOCHASTIC), "stochastic"),
        (dict(format="mxfp8_e4m3", rounding=qp.Rounding.STOCHASTIC, block=(32, 32)), "stochastic"),
        (dict(format="nvfp4", rounding=qp.Rounding.STOCHASTIC, block=(16, 16)), "16x16"),
        (dict(format="mxfp8_e4m3", axis=0), "axis 0"),
        (dict(format="mxfp8_e4m3", block=(32, 32), scale_layout="packed_ue8m0"), "packed_ue8m0"),
        (dict(format="fp8_block_e4m3_ue8m0", block=(128, 128), scale_layout="blocked"), "blocked"),
        (dict(format="mxfp4", columnwise="transposed"), "transpose"),
        (dict(format="nvfp4", columnwise="transposed"), "transpose"),
        (dict(format="mxfp8_e4m3", block=(32, 32), columnwise="transposed"), "transpose"),
        (dict(format="mxfp8_e4m3", columnwise="transposed", scale_layout="column_major"), "column_major"),
        (dict(format="fp8_block_e4m3_ue8m0", columnwise="transposed", scale_layout="blocked"), "blocked"),
    ],
)
def test_cuda_refuses_what_no_kernel_serves(sim: _Sim, kw: dict[str, Any], fragment: str) -> None:
    d = _quantize(**kw)
    with pytest.raises(qp.Unsupported, match=fragment) as info:
        qp.BlockScaledQuantizePlan.select(None, d)
    assert "REFERENCE" in str(info.value)
    assert not sim.loaded and not sim.events
    qp.BlockScaledQuantizePlan.select(None, d, REF)  # the reference backend serves it


@pytest.mark.parametrize(
    "kw,fragment",
    [
        (dict(format="fp8_block_e4m3", block=(128, 128)), "128x128"),
        (dict(format="mxfp8_e4m3", scale_layout="blocked"), "compact"),
        (dict(format="mxfp8_e4m3", axis=0), "axis 0"),
    ],
)
def test_cuda_dequantize_refuses_what_the_kernel_does_not_read(sim: _Sim, kw: dict[str, Any], fragment: str) -> None:
    d = qp.BlockScaledDequantizeDescriptor(shape=(300, 257), **kw)
    with pytest.raises(qp.Unsupported, match=fragment):
        qp.BlockScaledDequantizePlan.select(None, d)
    assert not sim.loaded
    qp.BlockScaledDequantizePlan.select(None, d, REF)


@pytest.mark.parametrize(
    "kw,fragment",
    [
        (dict(columnwise="columns"), "columnwise='columns'"),
        (dict(columnwise="transposed", shape=(257,)), "rank >= 2"),
        (dict(columnwise="transposed", format="mxfp6_e3m2", axis=0), "last axis"),
        (dict(columnwise="te_mxfp8", format="fp8_block_e4m3"), "te_mxfp8"),
        (dict(columnwise="te_mxfp8", format="mxfp4"), "te_mxfp8"),
        (dict(columnwise="te_mxfp8", scale_layout="blocked"), "compact"),
    ],
)
def test_bad_columnwise_is_invalid_on_every_backend(kw: dict[str, Any], fragment: str) -> None:
    d = _quantize(**{"format": "mxfp8_e4m3", **kw})
    for pref in (REF, None):
        with pytest.raises(qp.InvalidProblem, match=fragment):
            qp.BlockScaledQuantizePlan.select(None, d, pref)


# ---- NVFP4's run on the simulated GPU ----------------------------------------------------------

X_PTR, CODES_PTR, SCALES_PTR, TS_PTR, WS_PTR, AMAX_PTR = (1 << 32) * np.arange(2, 8)


def _nvfp4_args(d: Any, global_amax: Any = None) -> qp.BlockScaledQuantizeArgs:
    return qp.BlockScaledQuantizeArgs(
        host_sim.device_array(int(X_PTR), d.shape, "uint16"),
        host_sim.device_array(int(CODES_PTR), d.codes_shape, "uint8"),
        host_sim.device_array(int(SCALES_PTR), d.scales_shape, "uint8"),
        host_sim.device_array(int(TS_PTR), (1,), "float32"),
        global_amax,
    )


def _launched(plan: Any, event: tuple[Any, ...]) -> Any:
    """The prepared launch of a recorded launch event."""
    return next(launch for launch in plan._prepared if launch._kernel_params == event[-1])


def _memory(events: list[tuple[Any, ...]]) -> dict[int, int]:
    """The device bytes the recorded memsets leave, by address."""
    memory: dict[int, int] = {}
    for event in events:
        if event[0] == "memset":
            _, ptr, value, size = event
            memory.update((ptr + i, value) for i in range(size))
    return memory


def _f32_at(memory: dict[int, int], ptr: int) -> bytes:
    return bytes(memory[ptr + i] for i in range(4))


@pytest.mark.parametrize("stochastic", [False, True])
def test_nvfp4_run_computes_the_amax_and_the_kernel_writes_s_dec(sim: _Sim, stochastic: bool) -> None:
    rounding = qp.Rounding.STOCHASTIC if stochastic else qp.Rounding.NEAREST_EVEN
    d = _quantize(format="nvfp4", shape=(64, 256), rounding=rounding)
    plan = qp.BlockScaledQuantizePlan.select(None, d)
    ws = qp.Workspace(host_sim.device_array(int(WS_PTR), (4,), "uint8"), 4)
    rng = dict(rng_seed=2**63 + 5, rng_offset=7) if stochastic else {}
    for _ in range(3):  # the fast path's generic tail repeats the same sequence
        sim.events.clear()
        args = _nvfp4_args(d)
        args.rng_seed, args.rng_offset = rng.get("rng_seed"), rng.get("rng_offset")
        plan.run(None, ws, args)
        kinds = [e[0] for e in sim.events]
        assert kinds == ["memset", "launch", "launch"]  # no host copy, no synchronization
        assert sim.events[0][1:] == (int(WS_PTR), 0, 4)
        amax_launch, quantize = _launched(plan, sim.events[1]), _launched(plan, sim.events[2])
        assert amax_launch is plan._launches.amax and amax_launch.params.amax == int(WS_PTR)
        assert amax_launch.params.x == int(X_PTR) and amax_launch.params.vector_elements == 64 * 256
        assert quantize.params.tensor_amax == int(WS_PTR) and quantize.params.codes == int(CODES_PTR)
        assert quantize.params.s_dec_out == int(TS_PTR)  # the kernel writes S_dec
        assert quantize in plan._launches.aligned  # 16-byte aligned operands, 16 | K: the contiguous schedule
        want = (0, 0, 2**63 + 5, 7) if stochastic else (0, 0, 0, 0)
        got = (quantize.params.seed_ptr, quantize.params.offset_ptr, quantize.params.seed_value)
        assert (*got, quantize.params.offset_value) == want


@pytest.mark.parametrize("amax", [2.75, 0.0, float("inf"), 1e39, 1e-40, 448.0 * 6, 0.1])
def test_nvfp4_run_with_a_number_amax_memsets_its_f32_bits(sim: _Sim, amax: float) -> None:
    d = _quantize(format="nvfp4", shape=(5, 70))
    plan = qp.BlockScaledQuantizePlan.select(None, d)
    ws = qp.Workspace(host_sim.device_array(int(WS_PTR), (4,), "uint8"), 4)
    plan.run(None, ws, _nvfp4_args(d, amax))  # a number: stored into the workspace by memsets
    kinds = [e[0] for e in sim.events]
    assert set(kinds[:-1]) == {"memset"} and kinds[-1] == "launch"
    with np.errstate(over="ignore", under="ignore"):
        want = np.float32(amax).tobytes()  # the reference's rounding of the number
    assert _f32_at(_memory(sim.events), int(WS_PTR)) == want
    assert all(int(WS_PTR) <= e[1] and e[1] + e[3] <= int(WS_PTR) + 4 for e in sim.events[:-1])
    quantize = _launched(plan, sim.events[-1])
    assert quantize in plan._launches.general  # 70 % 16: the general schedule
    assert (quantize.params.tensor_amax, quantize.params.s_dec_out) == (int(WS_PTR), int(TS_PTR))


def test_f32_byte_runs_store_every_float(rng: np.random.Generator) -> None:
    bits = rng.integers(0, 2**32, 2000, dtype=np.uint64).astype(np.uint32)
    values = bits.view(np.float32)
    specials = np.array([0.0, -0.0, 1.0, 2.0**-149, 2.0**-126, 3.4028235e38, np.inf, 0x01010101], np.float32)
    for v in np.concatenate([specials, values[np.isfinite(values) & (values >= 0)], specials]):
        runs = bs._f32_byte_runs(float(v))
        memory = _memory([("memset", 100 + start, byte, count) for start, byte, count in runs])
        assert _f32_at(memory, 100) == v.tobytes() and len(memory) == 4
        assert all(a[1] != b[1] for a, b in itertools.pairwise(runs))  # one memset per run of equal bytes


def test_nvfp4_run_with_a_device_amax_only_launches(sim: _Sim) -> None:
    d = _quantize(format="nvfp4", shape=(5, 70))
    plan = qp.BlockScaledQuantizePlan.select(None, d)
    ws = qp.Workspace(host_sim.device_array(int(WS_PTR), (4,), "uint8"), 4)
    for i in range(4):  # the caller's device amax: read by the kernel, S_dec written by it; traced fast path
        sim.events.clear()
        amax_ptr = int(AMAX_PTR) + 256 * (i % 2)
        plan.run(None, ws, _nvfp4_args(d, host_sim.device_array(amax_ptr, (1,), "float32")))
        assert [e[0] for e in sim.events] == ["launch"]
        quantize = _launched(plan, sim.events[0])
        assert (quantize.params.tensor_amax, quantize.params.s_dec_out) == (amax_ptr, int(TS_PTR))
    assert any(f for mode in plan._fast for f in mode)


def test_nvfp4_stochastic_selects_the_stochastic_kernels(sim: _Sim) -> None:
    d = _quantize(format="nvfp4", shape=(64, 256), rounding=qp.Rounding.STOCHASTIC, scale_layout="blocked")
    plan = qp.BlockScaledQuantizePlan.select(None, d)
    teams = 64 * 16
    assert sim.loaded == [
        bk.kernel_name("bfloat16", "nvfp4_sr", 16, False, False, _sched("bfloat16", 16, False, teams)),
        bk.kernel_name("bfloat16", "nvfp4_sr", 16, False, True, _sched("bfloat16", 16, True, teams)),
        bk.amax_kernel_name("bfloat16"),
    ]
    assert plan.sku().variant == "tensor_amax+lanes[nvfp4,1x16,te,blocked,stochastic,contiguous|general]"
    ragged = qp.BlockScaledQuantizePlan.select(
        None, _quantize(format="nvfp4", shape=(5, 70), rounding=qp.Rounding.STOCHASTIC, two_level=False)
    )
    assert ragged.sku().variant == "lanes[nvfp4,1x16,te,compact,stochastic,general]"
    assert "nv_e2m1_sr" in sim.loaded[-1] and ragged.workspace_size() == 0
    seed_ptr, offset_ptr = int(AMAX_PTR), int(AMAX_PTR) + 4096
    for i, (seed, offset) in enumerate([(3, 4), (host_sim.device_array(seed_ptr, (1,), "int64"), 2**64 - 1),
                                        (0, host_sim.device_array(offset_ptr, (1,), "int64"))] * 2):  # fmt: skip
        sim.events.clear()
        args = _nvfp4_args(ragged.descriptor)
        args.rng_seed, args.rng_offset = seed, offset
        ragged.run(None, None, args, check=i < 3)
        assert [e[0] for e in sim.events] == ["launch"]
        q = _launched(ragged, sim.events[0]).params
        want_seed = (seed_ptr, 0) if not isinstance(seed, int) else (0, seed)
        want_offset = (offset_ptr, 0) if not isinstance(offset, int) else (0, offset)
        assert ((q.seed_ptr, q.seed_value), (q.offset_ptr, q.offset_value)) == (want_seed, want_offset)
        assert (q.tensor_amax, q.s_dec_out) == (0, int(TS_PTR))


def test_nvfp4_one_level_reads_no_amax(sim: _Sim) -> None:
    d = _quantize(format="nvfp4", shape=(5, 70), two_level=False)
    plan = qp.BlockScaledQuantizePlan.select(None, d)
    plan.run(None, None, _nvfp4_args(d))
    assert [e[0] for e in sim.events] == ["launch"]
    quantize = _launched(plan, sim.events[0])
    assert (quantize.params.tensor_amax, quantize.params.s_dec_out) == (0, int(TS_PTR))


def test_nvfp4_needs_its_workspace_before_any_launch(sim: _Sim) -> None:
    d = _quantize(format="nvfp4", shape=(5, 70))
    plan = qp.BlockScaledQuantizePlan.select(None, d)
    with pytest.raises(qp.WorkspaceTooSmall):
        plan.run(None, None, _nvfp4_args(d))
    assert not sim.events


# ---- the columnwise copy on the reference backend ------------------------------------------------

COLUMNWISE_CASES = [
    ("mxfp8_e4m3", "transposed", "compact", dict(scale_mode="floor")),
    ("mxfp8_e5m2", "transposed", "blocked", {}),
    ("mxfp8_e4m3", "te_mxfp8", "compact", dict(scale_mode="even")),
    ("mxfp4", "transposed", "packed_ue8m0", {}),
    ("mxfp6_e3m2", "transposed", "column_major", dict(rounding=qp.Rounding.STOCHASTIC)),
    ("mxfp8_e4m3", "transposed", "blocked", dict(block=(32, 32))),
    ("nvfp4", "transposed", "blocked", {}),
    ("nvfp4", "transposed", "compact", dict(block=(16, 16), scale_mode="torchao")),
    ("fp8_block_e4m3", "transposed", "column_major", dict(scale_mode="mul_rcp", amax_floor=1e-4)),
    ("fp8_block_e5m2", "transposed", "compact", dict(block=(128, 128))),
    ("fp8_block_e4m3_ue8m0", "transposed", "packed_ue8m0", {}),
]


@pytest.mark.parametrize("fmt,columnwise,layout,kw", COLUMNWISE_CASES)
def test_reference_columnwise_equals_quantize_transpose(
    rng: np.random.Generator, fmt: str, columnwise: str, layout: str, kw: dict[str, Any]
) -> None:
    for shape in [(37, 45), (2, 70, 33), (130, 257)]:
        x = (rng.standard_normal(shape) * np.exp2(rng.integers(-20, 20, size=shape))).astype(np.float32)
        x.reshape(-1)[3] = np.nan
        x.reshape(-1)[-2] = -np.inf
        d = qp.BlockScaledQuantizeDescriptor(
            shape=shape, format=fmt, input_element=EK.F32, columnwise=columnwise, scale_layout=layout, **kw
        )
        p = d._problem()
        stochastic = p.stochastic
        out = dict(
            codes=np.full(d.codes_shape, 0x4D, np.uint8),
            scales=np.full(d.scales_shape, 0x4D, d.scales_dtype),
            columnwise_codes=np.full(d.columnwise_codes_shape, 0x4D, np.uint8),
            columnwise_scales=np.full(d.columnwise_scales_shape, 0x4D, d.scales_dtype),
        )
        if p.is_nvfp4:
            out["tensor_scale"] = np.zeros(1, np.float32)
        args = qp.BlockScaledQuantizeArgs(
            x, **out, rng_seed=7 if stochastic else None, rng_offset=3 if stochastic else None
        )
        qp.BlockScaledQuantizePlan.select(None, d, REF).run(None, None, args)
        # the rowwise outputs are the plan's without columnwise
        alone = qp.BlockScaledQuantizeDescriptor(**{**d.model_dump(), "columnwise": None})
        ref = dict(codes=np.empty_like(out["codes"]), scales=np.empty_like(out["scales"]))
        if p.is_nvfp4:
            ref["tensor_scale"] = np.zeros(1, np.float32)
        qp.BlockScaledQuantizePlan.select(None, alone, REF).run(
            None, None,
            qp.BlockScaledQuantizeArgs(x, **ref, rng_seed=7 if stochastic else None, rng_offset=3 if stochastic else None),
        )  # fmt: skip
        for k in ref:
            np.testing.assert_array_equal(out[k].view(np.uint8), ref[k].view(np.uint8), err_msg=f"{k} {shape}")
        # the columnwise outputs are quantize_transpose's, scales laid out as the rowwise ones
        family = "mx" if fmt.startswith("mx") else ("nvfp4" if fmt == "nvfp4" else "fp8_block")
        opts: dict[str, Any]
        if family == "mx":
            opts = dict(
                element=p.element, scale_mode=p.mode, rounding=p.rounding, seed=7, offset=3, block_2d=p.block[0] > 1
            )
        elif family == "nvfp4":
            opts = dict(mode=p.mode, block_2d=p.block[0] > 1)
        else:
            ue8m0 = fmt.endswith("ue8m0")
            opts = dict(
                block=p.block, element=p.element, scale_format="ue8m0" if ue8m0 else "f32",
                elem_op="div" if ue8m0 else p.mode, amax_floor=p.amax_floor,
            )  # fmt: skip
        col = rb.quantize_transpose(x, family, columnwise, **opts).columnwise
        np.testing.assert_array_equal(out["columnwise_codes"], np.asarray(col.codes).view(np.uint8))
        scales = np.asarray(col.scales)
        if columnwise == "transposed" and layout != "compact":
            matrix = scales.reshape(p.columnwise_matrix)
            scales = {
                "blocked": rb.to_blocked,
                "column_major": rb.col_major_tma_aligned,
                "packed_ue8m0": rb.deepgemm_sf_layout,
            }[layout](matrix)
        np.testing.assert_array_equal(
            out["columnwise_scales"].view(np.uint8).reshape(-1), np.asarray(scales).view(np.uint8).reshape(-1)
        )


def test_columnwise_outputs_without_columnwise_are_refused(rng: np.random.Generator) -> None:
    d = _quantize(format="mxfp8_e4m3", input_element=EK.F32, shape=(4, 64))
    x = rng.standard_normal((4, 64)).astype(np.float32)
    codes, scales = np.zeros(d.codes_shape, np.uint8), np.zeros(d.scales_shape, np.uint8)
    extra = np.zeros((64, 4), np.uint8)
    with pytest.raises(qp.InvalidProblem, match="columnwise=None"):
        qp.BlockScaledQuantizePlan.select(None, d, REF).run(
            None, None, qp.BlockScaledQuantizeArgs(x, codes, scales, columnwise_codes=extra)
        )
    assert not codes.any()


@pytest.mark.parametrize(
    "kw",
    [
        dict(format="fp8_block_e4m3", block=(128, 128)),
        dict(format="mxfp8_e4m3", block=(32, 32)),
        dict(format="mxfp8_e4m3", columnwise="transposed"),
        dict(format="nvfp4", two_level=False),
    ],
)
@pytest.mark.parametrize("shape", [(0, 64), (5, 0), (3, 0, 7)])
def test_empty_problems_select_and_launch_only_for_s_dec(sim: _Sim, kw: dict[str, Any], shape: tuple[int, ...]) -> None:
    d = _quantize(shape=shape, **kw)
    plan = qp.BlockScaledQuantizePlan.select(None, d)
    args: dict[str, Any] = dict(
        input=host_sim.device_array(int(X_PTR), shape, "uint16"),
        codes=host_sim.device_array(int(CODES_PTR), d.codes_shape, "uint8"),
        scales=host_sim.device_array(int(SCALES_PTR), d.scales_shape, d.scales_dtype),
    )
    if d.columnwise:
        args["columnwise_codes"] = host_sim.device_array(int(AMAX_PTR), d.columnwise_codes_shape, "uint8")
        args["columnwise_scales"] = host_sim.device_array(int(WS_PTR), d.columnwise_scales_shape, d.scales_dtype)
    if d.tensor_scale_shape:
        args["tensor_scale"] = host_sim.device_array(int(TS_PTR), (1,), "float32")
    plan.run(None, None, qp.BlockScaledQuantizeArgs(**args))
    launches = [e for e in sim.events if e[0] == "launch"]
    assert not launches or d.tensor_scale_shape
    if d.tensor_scale_shape:  # NVFP4 still writes S_dec (1 for one level): one launch with no block
        (event,) = sim.events
        assert event[0] == "launch" and _launched(plan, event).params.s_dec_out == int(TS_PTR)
        assert _launched(plan, event).params.rows * _launched(plan, event).params.blocks_per_row == 0


def test_nvfp4_traced_and_generic_calls_interleave(sim: _Sim) -> None:
    """Calls of traced signatures (a device amax) and of the generic tail (a number or computed
    amax, whose memsets keep them untraced) in any order: each launch carries its own call's
    amax pointer, S_dec pointer, seed and offset."""
    d = _quantize(format="nvfp4", shape=(64, 256), rounding=qp.Rounding.STOCHASTIC)
    plan = qp.BlockScaledQuantizePlan.select(None, d)
    ws = qp.Workspace(host_sim.device_array(int(WS_PTR), (4,), "uint8"), 4)
    device_amax = host_sim.device_array(int(AMAX_PTR), (1,), "float32")
    calls = [(device_amax, 1, 2), (3.0, 5, 6), (None, 7, 8)] * 3 + [(device_amax, 1, 2), (None, 9, 10)] * 2
    for check in (True, False):
        for amax, seed, offset in calls:
            sim.events.clear()
            args = _nvfp4_args(d, amax)
            args.rng_seed, args.rng_offset = seed, offset
            plan.run(None, ws, args, check=check)
            q = _launched(plan, sim.events[-1]).params
            want_amax = int(AMAX_PTR) if amax is device_amax else int(WS_PTR)
            assert (q.tensor_amax, q.s_dec_out, q.seed_value, q.offset_value) == (want_amax, int(TS_PTR), seed, offset)
            assert (q.seed_ptr, q.offset_ptr) == (0, 0)


# ---- the block-scaled kernel's schedule table and launch geometry ----------------------------------

VEC = {"float16": 8, "bfloat16": 8, "float32": 4}


@pytest.mark.parametrize(("dtype", "block"), list(itertools.product(VEC, (16, 32, 128))))
def test_every_schedule_row_covers_its_blocks(dtype: str, block: int) -> None:
    for (contiguous, b, small), sched in bk.SCHEDULES.items():
        if b != block:
            continue
        elems = VEC[dtype] * sched.vecs  # elements one thread holds
        team = sched.team(dtype, block)
        per_thread = sched.blocks_per_thread(dtype, block)
        assert team * elems == block * per_thread, (contiguous, small, sched)
        assert 32 % team == 0 and team <= 32  # a team lies within a warp
        if per_thread > 1:
            assert contiguous, "whole blocks per thread serve the contiguous schedule only"
        for teams in (per_thread, 6 * per_thread, 1 << 20):
            assert sched.slots(dtype, block, teams) * per_thread == teams * team


def test_choose_schedule_by_size_and_parity() -> None:
    sms = 132
    # 16 x 8192 MXFP8 on bf16: 4096 blocks -> the small-problem row; 8192 x 8192 -> the large row.
    assert bk.choose_schedule("bfloat16", 32, True, 16 * 256, sms) is bk.SCHEDULES[True, 32, True]
    assert bk.choose_schedule("bfloat16", 32, True, 8192 * 256, sms) is bk.SCHEDULES[True, 32, False]
    # NVFP4's large row holds two blocks per thread: an odd block count takes the one-block row.
    large = bk.SCHEDULES[True, 16, False]
    assert large.blocks_per_thread("bfloat16", 16) == 2
    assert bk.choose_schedule("bfloat16", 16, True, 8192 * 512, sms) is large
    assert bk.choose_schedule("bfloat16", 16, True, 8192 * 512 + 1, sms) is bk.SCHEDULES[True, 16, True]
    # Ragged or misaligned problems take the general row at every size.
    assert bk.choose_schedule("float32", 128, False, 1 << 24, sms) is bk.SCHEDULES[False, 128, False]
    # FP8 1x128 on 16-bit inputs: the multiplying rules take their own large row, `div` the table's;
    # float32 and the small row are the table's for every rule.
    teams = 8192 * 64
    assert bk.choose_schedule("bfloat16", 128, True, teams, sms) is bk.MULTIPLY_SCHEDULES[True, 128, False]
    assert bk.choose_schedule("float16", 128, True, teams, sms, divide=True) is bk.SCHEDULES[True, 128, False]
    assert bk.choose_schedule("float32", 128, True, teams, sms) is bk.SCHEDULES[True, 128, False]
    assert bk.choose_schedule("bfloat16", 128, True, 16 * 64, sms) is bk.SCHEDULES[True, 128, True]


@pytest.mark.parametrize("slots", [1, 31, 64, 1000, 132 * 256 - 1, 132 * 256, 10**7])
@pytest.mark.parametrize("unroll", [1, 2])
@pytest.mark.parametrize("resident", [0, 4])
def test_launch_shape_covers_every_slot(slots: int, unroll: int, resident: int) -> None:
    threads, grid = bk.launch_shape(slots, 132, resident, unroll)
    assert threads in (64, 128, 256)
    if resident:  # persistent: the grid strides, so any grid of at least one block covers the slots
        assert 1 <= grid <= resident * 132 * (256 // threads)
    else:  # one pass: every slot has a thread (unroll slots per thread on large grids)
        assert grid * threads * unroll >= slots
    if -(-slots // 256) < 132:  # small problems: narrower blocks reach more multiprocessors
        assert threads < 256 or slots <= 64


def test_instantiations_are_unique_and_named_from_the_table() -> None:
    names = bk.instantiations()
    assert len(names) == len(set(names))
    for key, sched in bk.SCHEDULES.items():
        contiguous, block, _ = key
        element = {16: "nvfp4", 32: "e4m3", 128: "e5m2"}[block]
        multiplying = bk.MULTIPLY_SCHEDULES.get(key, sched)
        assert bk.kernel_name("float16", element, block, False, contiguous, multiplying) in names
        assert bk.kernel_name("float32", element, block, False, contiguous, sched) in names
        if block == 128:
            assert bk.kernel_name("float16", element, block, True, contiguous, sched) in names
