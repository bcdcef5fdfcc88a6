"""CPU: the dense row layout's selection and the kernels' division-free quotients."""

from __future__ import annotations

import numpy as np
import pytest

import quantplan as qp
from quantplan._layout import (
    DENSE_MAX_THREADS,
    DENSE_ROW_SHAPES,
    DENSE_SMALL_VEC,
    dense_row_layout,
    dense_row_shape,
    dense_row_widths,
    division_magic,
)
from quantplan.types import ElementKind


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
    # one-shot grid: DENSE_MAX_THREADS threads per block, the kernel's vectors per thread
    assert d.threads == DENSE_MAX_THREADS and d.chunk_cols == DENSE_MAX_THREADS * big * DENSE_ROW_SHAPES[kernel][1]
    g = layout((4096, 8192), qp.GroupScope(axis=-1, group_size=128))
    assert g is not None and g.gc == 128 and g.cs == 1 and g.Co == 64
    c = layout((1024, 4096), qp.ChannelScope(axis=0))
    assert c is not None and c.Co == 1  # parameter index = row
    small = layout((16, 8192), qp.TokenScope())
    assert small is not None and small.vec == DENSE_SMALL_VEC[kernel] and 4 * small.items >= 132
    # small problems: fewer, wider blocks, down to a grid over a quarter of the SMs
    assert 64 <= small.threads <= DENSE_MAX_THREADS, small.describe()
    # not dense: ragged rows, groups that split vectors, channel(-1), a group axis not last
    assert layout((64, 8190), qp.TokenScope()) is None
    assert layout((512, 4096), qp.GroupScope(axis=-1, group_size=2)) is None
    assert layout((512, 4096), qp.ChannelScope(axis=-1)) is None
    assert layout((512, 4096), qp.GroupScope(axis=0, group_size=4)) is None
    assert layout((3, 170, 4096), qp.ChannelScope(axis=1)) is None


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
