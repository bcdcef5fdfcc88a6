"""CPU: the row-layout coefficients the kernels use map every element to its parameter.

Emulates ``row_param_base(row) + (col / gc) * cs`` from ``kernels/qp_row_layout.cuh`` in NumPy and
compares with the parameter index NumPy broadcasting gives, for many scopes and ragged shapes.
"""

from __future__ import annotations

import numpy as np
import pytest

import quantplan as qp
from quantplan._layout import expand_params, param_shape, row_layout

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
    from quantplan._layout import contiguous_segment_length

    pshape = param_shape(shape, scope)
    index = np.arange(int(np.prod(pshape)), dtype=np.int64).reshape(pshape)
    expected = np.broadcast_to(expand_params(index, shape, scope), shape).reshape(-1)
    length = contiguous_segment_length(shape, scope)
    contiguous = bool(np.array_equal(expected, np.arange(expected.size) // (length or 1)))
    assert (length is not None) == contiguous, (shape, scope, length)


def test_fused_segment_geometry() -> None:
    """Teams: smallest power of two holding a segment, widened for small problems; None past the limit."""
    from dataclasses import replace

    from quantplan._affine import resolve_affine_problem
    from quantplan._segments import segment_geometry
    from quantplan.types import ElementKind as EK

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
    from quantplan._fake_rows import flat_geometry

    assert flat_geometry(8192 * 8192 // 8, 132) == (256, 4)  # large: 256 threads x 4 vectors
    for n_vectors in (1, 3, 1000, 16384, 70000, 10**6):
        block, per_thread = flat_geometry(n_vectors, 132)
        assert block in (64, 128, 256) and per_thread in (1, 2, 4)
        blocks = -(-n_vectors // (block * per_thread))
        # either two blocks per SM, or the smallest tile already
        assert blocks >= 264 or (block, per_thread) == (64, 1)
