"""CPU: the row-layout coefficients the kernels use map every element to its parameter.

Emulates ``row_param_base(row) + (col / gc) * cs`` from ``kernels/qp_row_layout.cuh`` in NumPy and
compares with the parameter index NumPy broadcasting gives, for many scopes and ragged shapes.

Also: the dense row layout's selection and the kernels' division-free quotients.
"""

from __future__ import annotations

import numpy as np
import pytest

import quantplan as qp
from quantplan.runtime._layout import (
    DENSE_MAX_THREADS,
    DENSE_ROW_SHAPES,
    DENSE_SMALL_VEC,
    dense_row_layout,
    dense_row_shape,
    dense_row_threads,
    dense_row_widths,
    division_magic,
    expand_params,
    param_shape,
    row_layout,
)
from quantplan.vocabulary.types import ElementKind

# ---- row layouts -----------------------------------------------------------------------------------

CASES = [
    ((7, 13), qp.TensorScope()),
    ((3, 5, 11), qp.TokenScope()),
    ((600, 3), qp.TokenScope()),
    ((9, 4100), qp.TokenScope()),
    ((6, 10), qp.ChannelScope(axis=0)),
    ((6, 10), qp.ChannelScope(axis=-1)),
    ((2, 3, 4, 5), qp.ChannelScope(axis=1)),
    ((4, 21), qp.GroupScope(axis=-1, group_size=7)),
    ((2, 3, 30), qp.GroupScope(axis=-1, group_size=10)),
    ((12, 5), qp.GroupScope(axis=0, group_size=3)),
    ((2, 6, 3, 5), qp.GroupScope(axis=1, group_size=2)),
    ((5,), qp.TensorScope()),
    ((8,), qp.GroupScope(group_size=4)),
]


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("shape,scope", CASES)
def test_layout_param_index_matches_broadcasting(shape, scope, packed) -> None:  # noqa: ANN001
    pshape = param_shape(shape, scope)
    expected = np.broadcast_to(expand_params(np.arange(int(np.prod(pshape))).reshape(pshape), shape, scope), shape)
    lay = row_layout(shape, scope, 8, packed)
    assert lay.rows * lay.L == int(np.prod(shape))
    rows = np.arange(lay.rows)[:, None]
    cols = np.arange(lay.L)[None, :]
    t = rows // lay.M
    m = rows - t * lay.M
    o = t // lay.A
    a = t - o * lay.A
    base = o * lay.Co + (a // lay.g_rows) * lay.Ca + m * lay.Cm
    got = base + (cols // lay.gc) * lay.cs
    assert np.array_equal(got.reshape(-1), expected.reshape(-1))
    assert lay.L % lay.vec == 0 or not lay.vector_io
    assert lay.chunks_per_row * lay.chunk_cols >= lay.L


def test_short_rows_merge_and_long_rows_split() -> None:
    lay = row_layout((4096, 16), qp.TokenScope(), 8, False)
    assert lay.L >= 2048 and lay.gc == 16
    lay = row_layout((2, 100000), qp.TokenScope(), 8, False)
    assert lay.chunks_per_row > 1 and (1 << lay.seg_log2) == 256
    assert row_layout((3, 7), qp.TokenScope(), 8, True).vector_io is False


@pytest.mark.parametrize(("shape", "scope"), CASES)
def test_contiguous_segments_match_parameter_order(shape, scope) -> None:  # noqa: ANN001
    """Where contiguous_segment_length gives S, element i's parameter (by broadcasting) is i // S."""
    from quantplan.runtime._layout import contiguous_segment_length

    pshape = param_shape(shape, scope)
    index = np.arange(int(np.prod(pshape)), dtype=np.int64).reshape(pshape)
    expected = np.broadcast_to(expand_params(index, shape, scope), shape).reshape(-1)
    length = contiguous_segment_length(shape, scope)
    contiguous = bool(np.array_equal(expected, np.arange(expected.size) // (length or 1)))
    assert (length is not None) == contiguous, (shape, scope, length)


def test_fused_segment_geometry() -> None:
    """Teams: smallest power of two holding a segment, widened for small problems; None past the limit."""
    from dataclasses import replace

    from quantplan.runtime._affine import resolve_affine_problem
    from quantplan.runtime._selection import segment_geometry
    from quantplan.vocabulary.types import ElementKind as EK

    def geometry(shape, scope, code=EK.S8, float_kind=EK.BF16, vec_max=8):  # noqa: ANN001, ANN202
        problem = resolve_affine_problem(
            shape, scope, qp.QuantMode.SYMMETRIC, float_kind, code, None, None, qp.NibbleOrder.LOW_FIRST
        )
        return segment_geometry(replace(problem, layout_flags=1), 132 * 2048, vec_max)

    big = geometry((8192, 8192), qp.TokenScope())
    assert big is not None and (big.team, big.vec, big.block, big.segments) == (256, 8, 256, 8192)
    small = geometry((16, 4096), qp.TokenScope())  # widened up to one block: 16 segments keep few threads busy
    assert small is not None and (small.team, small.block) == (256, 256)
    long_rows = geometry((2, 32768), qp.TokenScope())  # a team as large as the segment needs
    assert long_rows is not None and (long_rows.team, long_rows.block) == (1024, 1024)
    groups = geometry((8192, 8192), qp.GroupScope(axis=-1, group_size=128))
    assert groups is not None and (groups.team, groups.vec, groups.block) == (4, 8, 256)
    odd = geometry((8192, 4100), qp.GroupScope(axis=-1, group_size=100))
    assert odd is not None and odd.vec == 4
    assert geometry((2, 32768), qp.TokenScope()) is not None
    assert geometry((2, 32769), qp.TokenScope()) is None  # past one team's registers
    assert geometry((2, 16385), qp.TokenScope(), float_kind=EK.F64, vec_max=4) is None
    assert geometry((4, 301), qp.TokenScope(), code=EK.S4) is None  # odd rows of nibbles
    assert geometry((8, 64), qp.ChannelScope(axis=-1)) is None  # strided segments
    fallback = geometry((4, 300), qp.TokenScope(), code=EK.U4, vec_max=1)
    assert fallback is not None and (fallback.vec, fallback.vector_io) == (2, False)


def test_flat_fake_quantize_geometry_fills_the_gpu() -> None:
    from quantplan.runtime._fake_rows import flat_geometry

    assert flat_geometry(8192 * 8192 // 8, 132) == (256, 4)  # large: 256 threads x 4 vectors
    for n_vectors in (1, 3, 1000, 16384, 70000, 10**6):
        block, per_thread = flat_geometry(n_vectors, 132)
        assert block in (64, 128, 256) and per_thread in (1, 2, 4)
        blocks = -(-n_vectors // (block * per_thread))
        # either two blocks per SM, or the smallest tile already
        assert blocks >= 264 or (block, per_thread) == (64, 1)


# ---- dense row layouts and division-free quotients (static and fake dense rows) --------------------


def test_division_magic_is_exact_below_2_to_the_31() -> None:
    rng = np.random.default_rng(0)
    divisors = [*range(2, 600), *(2**k + d for k in range(2, 31) for d in (-1, 0, 1)), 2**31 - 1]
    divisors += [int(d) for d in rng.integers(2, 2**31, size=2000)]
    for d in divisors:
        magic, shift = division_magic(d)
        assert 0 < magic < 2**32
        ns = [0, 1, d - 1, d, d + 1, 2**31 - 1, (2**31 - 1) // d * d - 1, *map(int, rng.integers(0, 2**31, size=64))]
        for n in ns:
            if 0 <= n < 2**31:
                assert ((n * magic) >> 32) >> shift == n // d, (n, d)
    assert division_magic(1) == (0, 0)


@pytest.mark.parametrize("kernel", sorted(DENSE_ROW_SHAPES))
def test_dense_layout_selection(kernel: str) -> None:
    packed = kernel in ("quantize_dense", "dequantize_dense")
    big = DENSE_ROW_SHAPES[kernel][0]

    def layout(shape: tuple[int, ...], scope: qp.Scope):  # noqa: ANN202
        return dense_row_layout(shape, scope, kernel, packed, 132)

    d = layout((8192, 8192), qp.TokenScope())
    assert d is not None and d.dense and d.vec == big and d.Co == 1 and d.cs == 0
    assert d.items == 8192 * d.chunks_per_row and d.chunk_cols * d.chunks_per_row >= 8192
    assert "dense" in d.describe()
    # one-shot grid: the kernel's threads per block and vectors per thread
    threads = dense_row_threads(kernel)
    assert 64 <= threads <= DENSE_MAX_THREADS
    assert d.threads == threads and d.chunk_cols == threads * big * DENSE_ROW_SHAPES[kernel][1]
    g = layout((4096, 8192), qp.GroupScope(axis=-1, group_size=128))
    assert g is not None and g.gc == 128 and g.cs == 1 and g.Co == 64
    c = layout((1024, 4096), qp.ChannelScope(axis=0))
    assert c is not None and c.Co == 1  # parameter index = row
    small = layout((16, 8192), qp.TokenScope())
    assert small is not None and small.vec == DENSE_SMALL_VEC[kernel] and 4 * small.items >= 132
    # small problems: fewer, wider blocks, down to a grid over a quarter of the SMs
    assert 64 <= small.threads <= threads, small.describe()
    # not dense: ragged rows, groups that split vectors, channel(-1), a group axis not last
    assert layout((64, 8190), qp.TokenScope()) is None
    assert layout((512, 4096), qp.GroupScope(axis=-1, group_size=2)) is None
    assert layout((512, 4096), qp.ChannelScope(axis=-1)) is None
    assert layout((512, 4096), qp.GroupScope(axis=0, group_size=4)) is None
    assert layout((3, 170, 4096), qp.ChannelScope(axis=1)) is None


def test_dense_row_threads() -> None:
    """Per-kernel block widths (DENSE_ROW_THREADS, empty by default: every kernel takes
    DENSE_MAX_THREADS); an entry narrows that kernel's blocks alone."""
    import quantplan.runtime._layout as lay

    assert all(dense_row_threads(k) == DENSE_MAX_THREADS for k in DENSE_ROW_SHAPES)
    lay.DENSE_ROW_THREADS["dequantize_dense"] = 128
    try:
        d = dense_row_layout((8192, 8192), qp.TokenScope(), "dequantize_dense", False, 132)
        assert d is not None and d.threads == 128 and d.chunk_cols == 128 * 8 * DENSE_ROW_SHAPES["dequantize_dense"][1]
        other = dense_row_layout((8192, 8192), qp.TokenScope(), "dequantize_backward_dense", False, 132)
        assert other is not None and other.threads == DENSE_MAX_THREADS
    finally:
        del lay.DENSE_ROW_THREADS["dequantize_dense"]


def test_dense_row_shape_per_float_kind() -> None:
    """The quantize backward takes vectors of 8 on fp16 and keeps 16 on bf16; the others one shape."""
    kernel = "quantize_backward_dense"
    assert dense_row_shape(kernel, ElementKind.F16) == DENSE_ROW_SHAPES[kernel] == (8, 1)
    assert dense_row_shape(kernel, ElementKind.BF16) == (16, 1)
    assert dense_row_widths(kernel, ElementKind.BF16) == (16, DENSE_SMALL_VEC[kernel])
    for float_kind, vec in ((ElementKind.F16, 8), (ElementKind.BF16, 16)):
        d = dense_row_layout((8192, 8192), qp.TokenScope(), kernel, False, 132, float_kind)
        assert d is not None and d.vec == vec and d.threads == DENSE_MAX_THREADS, d
    # rows of 16 k + 8 elements: dense on fp16 only (past the small problems' vectors of 4)
    assert dense_row_layout((140, 2056), qp.TokenScope(), kernel, False, 132, ElementKind.F16) is not None
    big_odd = dense_row_layout((300, 2056), qp.TokenScope(), kernel, False, 132, ElementKind.BF16)
    assert big_odd is None
    for other in ("quantize_dense", "dequantize_dense", "dequantize_backward_dense"):
        assert dense_row_shape(other, ElementKind.BF16) == dense_row_shape(other, ElementKind.F16)


def test_fake_dense_rows_shape_per_op() -> None:
    """Fake quantization's dense rows (16-bit data): the forwards take two 16-byte vectors per
    thread, the straight-through backward one vector of each input, in blocks of 256; small
    problems take fewer vectors per thread."""
    from quantplan.runtime._fake_rows import FakeOp, dense_block, dense_rows, dense_unroll
    from quantplan.runtime._layout import row_layout

    layout = row_layout((8192, 8192), qp.ChannelScope(axis=0), 8, False, 132 * 2048)
    expect = {FakeOp.NEAREST: (256, 2, 2), FakeOp.STE: (256, 1, 4), FakeOp.STOCHASTIC: (256, 2, 2)}
    for op, (block, unroll, chunks) in expect.items():
        d = dense_rows(layout, 8, dense_unroll(8, 2, op), 132, dense_block(op))
        assert d is not None and (d.block, d.unroll, d.chunks_per_row) == (block, unroll, chunks), (op, d)
    assert dense_unroll(8, 4, FakeOp.NEAREST) == 1 and dense_unroll(2, 8, FakeOp.STE) == 1
    assert dense_block(FakeOp.NEAREST, 4) == dense_block(FakeOp.STE) == 256
    small = dense_rows(row_layout((16, 8192), qp.TokenScope(), 8, False, 132 * 2048), 8, 2, 132, 256)
    assert small is not None and small.block == 256 and small.unroll == 1 and small.items == 64, small
