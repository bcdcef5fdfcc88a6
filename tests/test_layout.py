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
