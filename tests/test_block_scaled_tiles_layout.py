"""CPU: the index math of ``kernels/block_scaled_tiles.cu``, emulated thread by thread in NumPy.

For each CTA of the launch the tuning table gives, the emulation follows the kernel's mapping:
which thread reads which elements, the warp butterfly's offsets and the leaders' shared maxima
(2-D tiles), the rowwise teams and the columnwise tasks with their row quarters (fused
transpose), where codes and scales are stored and which positions the padding loop zeroes. It
checks that every element gets the amax of its reference tile or block, that every code and
every scale position (padding included) is written exactly once, and that the shared-memory
accesses of the transpose are free of bank conflicts. The plan's own launches of the tile kernel
(``BlockScaledQuantizePlan`` selected on a simulated GPU: its grids, row-tile slices, scale
geometry and padding arguments) are emulated too: every global write of every launch lands
inside the buffer the descriptor sizes (codes_shape, scales_shape), each exactly once.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from quantplan.runtime._block_scaled_kernels import VECTOR_ELEMENTS, ScaleGeometry, scale_geometry
from quantplan.runtime._block_scaled_tile_kernels import (
    MAX_GRID_Y,
    THREADS,
    TILE_SCHEDULES,
    TRANSPOSE_TILE,
    instantiations,
    row_tile_slices,
    transpose_shared_bytes,
)

SHAPES = [(1, 1), (3, 130), (129, 257), (160, 48), (300, 520), (37, 1000)]
BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def _offset(layout: int, r: int, c: int, cols: int, dim: int) -> int:
    """scale_offset of qp_block_scaled.cuh."""
    if layout == 0:
        return r * cols + c
    if layout == 1:
        return ((r >> 7) * dim + (c >> 2)) * 512 + (r & 31) * 16 + ((r & 127) >> 5) * 4 + (c & 3)
    if layout == 2:
        return c * dim + r
    return ((c >> 2) * dim + r) * 4 + (c & 3)


def _padding(writes: np.ndarray, layout: int, rows: int, cols: int, geo: ScaleGeometry) -> None:
    """zero_scale_padding: one write per padded position."""
    pad_rows, pad_cols, dim = geo.pad_rows, geo.pad_cols, geo.dim
    extra = (pad_rows - rows) * pad_cols
    for p in range(extra + rows * (pad_cols - cols)):
        if p < extra:
            r = rows + p // pad_cols
            c = p - (r - rows) * pad_cols
        else:
            q, width = p - extra, pad_cols - cols
            r, c = q // width, cols + q % width
        writes[_offset(layout, r, c, cols, dim)] += 1


def _keys(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """|x| stand-ins: distinct magnitudes, so a wrong reduction group shows."""
    return rng.permutation(shape[0] * shape[1]).reshape(shape).astype(np.float64) + 1.0


def _block_max(keys: np.ndarray, br: int, bc: int) -> np.ndarray:
    """Each element's reference block maximum (blocks br x bc, partial at the edges)."""
    rows, cols = keys.shape
    pr, pc = -(-rows // br) * br, -(-cols // bc) * bc
    padded = np.zeros((pr, pc))
    padded[:rows, :cols] = keys
    m = padded.reshape(pr // br, br, pc // bc, bc).max(axis=(1, 3))
    return np.repeat(np.repeat(m, br, axis=0), bc, axis=1)[:rows, :cols]


@pytest.mark.parametrize("block,dtype", list(TILE_SCHEDULES))
@pytest.mark.parametrize("layout", ["compact", "other"])
def test_tile_mapping(rng: np.random.Generator, block: tuple[int, int], dtype: str, layout: str) -> None:
    s = TILE_SCHEDULES[block, dtype]
    vec = VECTOR_ELEMENTS[dtype]
    ch = vec * s.vecs
    cpr, rpp = s.tile_cols // ch, THREADS // (s.tile_cols // ch)
    passes, team = s.tile_rows // rpp, s.block_cols // ch
    assert passes * rpp == s.tile_rows and team * ch == s.block_cols
    mx = block == (32, 32)
    lay = {"compact": "compact", "other": "blocked" if mx else "column_major"}[layout]
    for rows, cols in SHAPES:
        keys = _keys(rng, (rows, cols))
        want = _block_max(keys, *block)
        srows, scols = (rows if mx else -(-rows // 128)), -(-cols // block[1])
        geo = scale_geometry(lay, srows, scols, not mx)
        got = np.full((rows, cols), -1.0)
        code_writes = np.zeros((rows, cols), int)
        scale_writes = np.zeros(geo.size, int)
        t = np.arange(THREADS)
        ci, rp, lane = t % cpr, t // cpr, t % 32
        for by in range(-(-rows // s.tile_rows)):
            for bx in range(-(-cols // s.tile_cols)):
                r0, c = by * s.tile_rows, bx * s.tile_cols + ci * ch
                key = np.zeros(THREADS)
                for p in range(passes):
                    r = r0 + rp + p * rpp
                    for k in range(ch):
                        ok = (r < rows) & (c + k < cols)
                        key = np.maximum(
                            key, np.where(ok, keys[np.minimum(r, rows - 1), np.minimum(c + k, cols - 1)], 0)
                        )
                for o in (1, 2, 4, 8, 16):
                    if o < team or o >= cpr:
                        key = np.maximum(key, key[(t & ~31) | (lane ^ o)])
                s_amax = np.zeros(s.tile_cols // s.block_cols)
                for i in np.nonzero((lane % team == 0) & (lane < cpr))[0]:
                    s_amax[ci[i] // team] = max(s_amax[ci[i] // team], key[i])
                amax = s_amax[ci // team]
                for p in range(passes):
                    r = r0 + rp + p * rpp
                    for i in range(THREADS):
                        if r[i] >= rows or c[i] >= cols:
                            continue
                        span = slice(c[i], min(c[i] + ch, cols))
                        got[r[i], span] = amax[i]
                        code_writes[r[i], span] += 1
                        if ci[i] % team == 0 and (mx or (rp[i] == 0 and p == 0)):
                            sr = r[i] if mx else r0 // s.tile_rows
                            scale_writes[_offset(geo.layout, sr, c[i] // s.block_cols, scols, geo.dim)] += 1
        _padding(scale_writes, geo.layout, srows, scols, geo)
        np.testing.assert_array_equal(got, want, err_msg=f"tile amax {rows}x{cols}")
        assert (code_writes == 1).all(), f"codes written once {rows}x{cols}"
        assert (scale_writes == 1).all(), f"scales and padding written once {rows}x{cols}"


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("block", [32, 128])
@pytest.mark.parametrize("layout", ["compact", "other"])
def test_transpose_mapping(rng: np.random.Generator, dtype: str, block: int, layout: str) -> None:
    tile, vec, nbytes = TRANSPOSE_TILE, VECTOR_ELEMENTS[dtype], BYTES[dtype]
    cpr = tile // vec
    rpp, team = THREADS // cpr, block // vec
    passes, sw, cpw = tile // rpp, tile * nbytes // 4, 4 // nbytes
    lay = {"compact": "compact", "other": "blocked" if block == 32 else "column_major"}[layout]
    assert transpose_shared_bytes(dtype, block) >= tile * sw * 4
    for rows, cols in SHAPES:
        keys = _keys(rng, (rows, cols))
        want_r, want_c = _block_max(keys, 1, block), _block_max(keys, block, 1)
        geo_r = scale_geometry(lay, rows, -(-cols // block), block == 128)
        geo_c = scale_geometry(lay, cols, -(-rows // block), block == 128)
        got_r, got_c = np.full((rows, cols), -1.0), np.full((rows, cols), -1.0)
        writes_r, writes_c = np.zeros((rows, cols), int), np.zeros((rows, cols), int)
        sw_r, sw_c = np.zeros(geo_r.size, int), np.zeros(geo_c.size, int)
        t = np.arange(THREADS)
        ci, rp, lane = t % cpr, t // cpr, t % 32
        for by in range(-(-rows // tile)):
            for bx in range(-(-cols // tile)):
                r0, c0 = by * tile, bx * tile
                c = c0 + ci * vec
                shared = np.zeros((tile, tile))
                view = keys[r0 : r0 + tile, c0 : c0 + tile]
                shared[: view.shape[0], : view.shape[1]] = view
                # Phase A: rowwise teams of `team` consecutive lanes.
                for p in range(passes):
                    r = r0 + rp + p * rpp
                    key = np.array(
                        [shared[rp[i] + p * rpp, ci[i] * vec : ci[i] * vec + vec].max() for i in range(THREADS)]
                    )
                    for o in (1, 2, 4, 8, 16):
                        if o < team:
                            key = np.maximum(key, key[(t & ~31) | (lane ^ o)])
                    for i in range(THREADS):
                        if r[i] < rows and c[i] < cols:
                            span = slice(c[i], min(c[i] + vec, cols))
                            got_r[r[i], span] = key[i]
                            writes_r[r[i], span] += 1
                            if ci[i] % team == 0:
                                sw_r[_offset(geo_r.layout, r[i], c[i] // block, -(-cols // block), geo_r.dim)] += 1
                # Phase B: tasks g (row quarter g % 4, word column g // 4), a lane pair each (the
                # two halves of the quarter); the eight lanes of a word column read its rows in
                # eight 16-row groups, in eight banks through tile_word's swizzle.
                tasks = np.arange(sw * 4)
                wc, mp = tasks // 4, tasks % 4
                lanes = np.arange(32)
                for g0 in range(0, len(tasks), 16):
                    g, half = g0 + lanes // 2, lanes % 2
                    for jj in range(16):
                        row = mp[g] * 32 + half * 16 + jj
                        words = row * sw + (wc[g] ^ ((row >> 2) & 28))
                        assert len(np.unique(words % 32)) == 32, "phase B reads without bank conflicts"
                        assert (words // sw == row).all(), "the swizzle stays inside the row"
                colkey = np.stack([shared[q * 32 : q * 32 + 32].max(axis=0) for q in range(4)])
                for q in tasks:
                    for h in range(cpw):
                        col = wc[q] * cpw + h
                        k, m0 = c0 + col, r0 + mp[q] * 32
                        if k >= cols or m0 >= rows:
                            continue
                        key = colkey[:, col].max() if block == 128 else colkey[mp[q], col]
                        span = slice(m0, min(m0 + 32, rows))
                        got_c[span, k] = key
                        writes_c[span, k] += 1
                        if block == 32 or mp[q] == 0:
                            sw_c[_offset(geo_c.layout, k, m0 // block, -(-rows // block), geo_c.dim)] += 1
        _padding(sw_r, geo_r.layout, rows, -(-cols // block), geo_r)
        _padding(sw_c, geo_c.layout, cols, -(-rows // block), geo_c)
        np.testing.assert_array_equal(got_r, want_r, err_msg=f"rowwise amax {rows}x{cols}")
        np.testing.assert_array_equal(got_c, want_c, err_msg=f"columnwise amax {rows}x{cols}")
        assert (writes_r == 1).all() and (writes_c == 1).all(), f"codes written once {rows}x{cols}"
        assert (sw_r == 1).all() and (sw_c == 1).all(), f"scales and padding written once {rows}x{cols}"


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_transpose_phase_a_stores_without_bank_conflicts(dtype: str) -> None:
    """Each quarter-warp's 16-byte shared stores cover the 32 banks once."""
    vec, nbytes = VECTOR_ELEMENTS[dtype], BYTES[dtype]
    cpr, sw = TRANSPOSE_TILE // vec, TRANSPOSE_TILE * nbytes // 4
    t = np.arange(THREADS)
    row = t // cpr
    first_word = row * sw + ((t % cpr) * 4 ^ ((row >> 2) & 28))
    for q in range(0, THREADS, 8):
        banks = (first_word[q : q + 8, None] + np.arange(4)).ravel() % 32
        assert len(np.unique(banks)) == 32


def test_row_tile_slices_and_names() -> None:
    assert row_tile_slices(1) == [(0, 1)]
    slices = row_tile_slices(2 * MAX_GRID_Y + 5)
    assert slices == [(0, MAX_GRID_Y), (MAX_GRID_Y, MAX_GRID_Y), (2 * MAX_GRID_Y, 5)]
    names = instantiations()
    assert len(names) == len(set(names))
    assert all(n.startswith(("block_scaled_tiles<", "block_scaled_transpose<")) for n in names)


# ---- the plan's own launches of block_scaled_tiles ----------------------------------------------

#: Ragged tile problems: partial row tiles (5 rows of the second), partial column tiles and MX
#: blocks (1000 = 3 * 256 + 232, the last block 8 wide), cols % 16 != 0 (the general
#: instantiation only) and == 0 (both), N-D inputs, more than 128 scale rows (blocked row tiles).
PLAN_SHAPES = [(37, 1000), (33, 100), (2, 40, 48), (1, 31), (130, 288), (97, 33), (300, 1040), (5, 3, 1000)]


@pytest.fixture
def simulated_gpu(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The simulated GPU of ``benchmarks/host_sim.py`` (no kernel compiled or launched)."""
    pytest.importorskip("cupy")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import host_sim

    from quantplan.runtime import _device

    for owner, name, value in host_sim.gpu_patches(compile_kernels=False):
        monkeypatch.setattr(owner, name, value)
    _device.cuda_available.cache_clear()
    _device.device_info.cache_clear()
    yield
    _device.cuda_available.cache_clear()
    _device.device_info.cache_clear()


def _emulate_tile_launch(
    launch: Any, block: tuple[int, int], dtype: str, per_byte: int, aligned: bool, codes: np.ndarray, scales: np.ndarray
) -> None:
    """Add one write per code byte and scale element that ``launch`` (a prepared block_scaled_tiles
    launch: its grid and argument block) stores into ``codes`` / ``scales`` (write counts); an
    address outside either buffer fails."""
    a = launch.params
    s = TILE_SCHEDULES[block, dtype]
    vec = VECTOR_ELEMENTS[dtype]
    ch = vec * s.vecs
    cpr = s.tile_cols // ch
    rpp, team = THREADS // cpr, s.block_cols // ch
    rows, cols, layout, dim = a.rows, a.cols, a.layout, a.layout_dim
    row_bytes = -(-cols // per_byte)
    t = np.arange(THREADS)
    ci, rp = t % cpr, t // cpr
    for by in range(launch.grid_y):
        r0 = (a.row_tile_base + by) * s.tile_rows
        for bx in range(launch.grid):
            c = bx * s.tile_cols + ci * ch
            full = aligned and r0 + s.tile_rows <= rows and (bx + 1) * s.tile_cols <= cols
            for p in range(s.tile_rows // rpp):
                r = r0 + rp + p * rpp
                for i in range(THREADS):
                    dst = r[i] * row_bytes + c[i] // per_byte
                    if full:
                        n = ch // per_byte
                    elif r[i] < rows and c[i] < cols:
                        if aligned:  # whole vectors in bounds
                            n = sum(vec // per_byte for j in range(s.vecs) if c[i] + j * vec < cols)
                        else:
                            n = min(ch // per_byte, -(-(cols - c[i]) // per_byte))
                    else:
                        n = 0
                    if n:
                        assert 0 <= dst and dst + n <= codes.size, f"code bytes [{dst}, {dst + n}) of {codes.size}"
                        codes[dst : dst + n] += 1
                    mx = s.repeat
                    if ci[i] % team == 0 and r[i] < rows and c[i] < cols and (mx or (rp[i] == 0 and p == 0)):
                        sr = r[i] if mx else r0 // s.tile_rows
                        off = _offset(layout, sr, c[i] // s.block_cols, a.scale_cols, dim)
                        assert 0 <= off < scales.size, f"scale {off} of {scales.size} (row {sr})"
                        scales[off] += 1
    geo = ScaleGeometry(layout, dim, a.pad_rows, a.pad_cols, scales.size)
    before = scales.copy()
    _padding(scales, layout, a.scale_rows, a.scale_cols, geo)
    assert scales.sum() - before.sum() == (a.pad_rows - a.scale_rows) * a.pad_cols + a.scale_rows * (
        a.pad_cols - a.scale_cols
    )


@pytest.mark.parametrize(
    "fmt,block,layouts",
    [
        ("mxfp8_e4m3", (32, 32), ("compact", "blocked")),
        ("fp8_block_e4m3", (128, 128), ("compact", "column_major")),
        ("fp8_block_e4m3_ue8m0", (128, 128), ("compact", "column_major")),
    ],
)
@pytest.mark.parametrize("kind", ["BF16", "F32"])
def test_plan_tile_launches_write_inside_their_buffers(
    simulated_gpu: Any, fmt: str, block: tuple[int, int], layouts: tuple[str, ...], kind: str
) -> None:
    import quantplan as qp
    from quantplan.vocabulary.types import ElementKind

    dtype = {"BF16": "bfloat16", "F32": "float32"}[kind]
    cuda = qp.PlanPreference(backend=qp.BackendKind.CUDA)
    for shape in PLAN_SHAPES:
        for layout in layouts:
            d = qp.BlockScaledQuantizeDescriptor(
                shape=shape, format=fmt, input_element=ElementKind[kind], block=block, scale_layout=layout
            )
            plan = qp.BlockScaledQuantizePlan.select(None, d, cuda)
            k = plan._launches
            assert k is not None and k.general and plan.sku().variant.startswith("tiles[")
            per_byte = 2 if d.codes_shape[-1] != shape[-1] else 1
            for aligned, launches in ((False, k.general), (True, k.aligned)):
                if not launches:
                    assert shape[-1] % 16, f"{shape}: the aligned instantiation is prepared where cols % 16 == 0"
                    continue
                codes = np.zeros(int(np.prod(d.codes_shape)), int)
                scales = np.zeros(int(np.prod(d.scales_shape)), int)
                for launch in launches:
                    _emulate_tile_launch(launch, block, dtype, per_byte, aligned, codes, scales)
                what = f"{fmt} {shape} {layout} {'aligned' if aligned else 'general'}"
                assert (codes == 1).all(), f"every code byte written once: {what}"
                assert (scales == 1).all(), f"every scale element (padding included) written once: {what}"
