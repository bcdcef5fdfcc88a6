"""CPU: which specialised fused kernel the dynamic-range plan's geometry picks (no GPU needed)."""

from __future__ import annotations

from dataclasses import replace

import pytest

import quantplan as qp
from quantplan.runtime._affine import quantize_problem
from quantplan.runtime._device import DeviceInfo
from quantplan.runtime._families import (
    CLUSTER_BLOCKS,
    LANES_SHAPES,
    SHARES_BLOCKS,
    dynamic_fake_quantize_unit,
    dynamic_segments_unit,
)
from quantplan.runtime._selection import cluster_geometry, fused_geometries, lanes_geometry, shares_geometry
from quantplan.vocabulary.types import ArchSku, Rounding
from quantplan.vocabulary.types import ElementKind as EK

H200 = DeviceInfo(0, ArchSku(9, 0), 132)
A100 = DeviceInfo(0, ArchSku(8, 0), 108)


def _problem(shape, scope, float_kind=EK.F16, code_kind=EK.S8, **kw):  # noqa: ANN001, ANN202
    desc = qp.DynamicRangeQuantizeDescriptor(
        shape=shape, scope=scope, input_element=float_kind, output_element=code_kind, **kw
    )
    problem = replace(quantize_problem(desc), layout_flags=1)
    geometries = fused_geometries(problem, H200.busy_threads)
    assert geometries is not None
    return problem, geometries[0]


GROUP = qp.GroupScope(axis=-1, group_size=128)


def test_large_groups_take_four_lanes() -> None:
    problem, g = _problem((8192, 8192), GROUP, code_kind=EK.U4, mode=qp.QuantMode.ASYMMETRIC)
    found = lanes_geometry(problem, g, H200)
    assert found is not None
    geometry, shape, grid = found
    assert shape == LANES_SHAPES[0] and geometry.team == 4 and geometry.block == 256
    assert grid * (256 // 4) * shape[2] >= 8192 * 64


def test_small_groups_take_sixteen_lanes() -> None:
    problem, g = _problem((16, 8192), GROUP, code_kind=EK.U4, mode=qp.QuantMode.ASYMMETRIC)
    found = lanes_geometry(problem, g, H200)
    assert found is not None
    geometry, shape, grid = found
    assert shape == LANES_SHAPES[-1] and geometry.team == 16
    assert geometry.block == 256 and grid == 1024 // (256 // 16)


@pytest.mark.parametrize(
    ("shape", "scope", "kwargs"),
    [
        ((64, 96), qp.GroupScope(axis=-1, group_size=32), {}),  # no lanes shape of 32 elements
        ((64, 1024), GROUP, {"float_kind": EK.F32}),
        ((64, 1024), GROUP, {"rounding": qp.Rounding.STOCHASTIC}),
    ],
)
def test_lanes_do_not_apply(shape, scope, kwargs) -> None:  # noqa: ANN001
    problem, g = _problem(shape, scope, **kwargs)
    assert lanes_geometry(problem, g, H200) is None


def test_lanes_index_vectors_in_32_bits() -> None:
    """The kernel indexes 16-byte vectors in 32 bits: 2^32 vectors or more take another kernel."""
    problem, g = _problem((2**24, 2048), GROUP)
    assert lanes_geometry(problem, g, H200) is None
    problem, g = _problem((2**24 - 1, 2048), GROUP)
    assert lanes_geometry(problem, g, H200) is not None


def test_few_long_rows_take_a_cluster_on_sm90_only() -> None:
    problem, g = _problem((16, 8192), qp.TokenScope())
    cluster = cluster_geometry(problem, g, H200)
    assert cluster is not None
    geometry, grid = cluster
    assert geometry.team == geometry.block == 8192 // (CLUSTER_BLOCKS * 8)
    assert grid == 16 * CLUSTER_BLOCKS  # a cluster of blocks per row
    assert cluster_geometry(problem, g, A100) is None
    many, g2 = _problem((64, 8192), qp.TokenScope())
    assert cluster_geometry(many, g2, H200) is None
    odd, g3 = _problem((4, 1000 * 8), qp.TokenScope())
    assert cluster_geometry(odd, g3, H200) is None


def test_units_hold_the_specialised_kernels() -> None:
    unit = dynamic_segments_unit(EK.BF16, EK.U4, True, Rounding.NEAREST_EVEN)
    assert sum("dynamic_quantize_lanes" in n for n in unit) == 2 * len(LANES_SHAPES)
    assert sum("dynamic_quantize_cluster" in n for n in unit) == 2
    fp8 = dynamic_segments_unit(EK.F16, EK.FP8_E4M3, False, Rounding.NEAREST_EVEN)
    assert sum("dynamic_quantize_lanes" in n for n in fp8) == len(LANES_SHAPES)
    assert not any("lanes" in n for n in dynamic_segments_unit(EK.F32, EK.S8, False, Rounding.NEAREST_EVEN))


@pytest.mark.parametrize(("length", "blocks"), [(4096, 2), (8192, 4), (16384, 8)])
@pytest.mark.parametrize("device", [H200, A100], ids=["H200", "A100"])
def test_few_rows_take_row_shares_on_every_arch(length, blocks, device) -> None:
    problem, g = _problem((16, length), qp.TokenScope())
    found = shares_geometry(problem, g, device)
    assert found is not None
    assert found.blocks == blocks and found.grid == 16 * blocks
    assert found.geometry.team == found.geometry.block == 256
    assert f"dense-row-shares,{blocks}x256t-per-segment" in found.describe()
    rows = device.sm_count // 4  # the most rows it takes
    most, g2 = _problem((rows, length), qp.TokenScope())
    assert shares_geometry(most, g2, device) is not None
    past, g3 = _problem((rows + 1, length), qp.TokenScope())
    assert shares_geometry(past, g3, device) is None


@pytest.mark.parametrize(
    ("shape", "kwargs"),
    [
        ((8192, 8192), {}),  # many rows: the rows kernel
        ((64, 8192), {}),
        ((16, 2048), {}),  # one share per row
        ((16, 6144), {}),  # three shares
        ((16, 32768), {}),  # sixteen shares
        ((16, 8192), {"rounding": Rounding.STOCHASTIC}),
        ((16, 8192), {"float_kind": EK.F32}),
    ],
)
def test_row_shares_do_not_apply(shape, kwargs) -> None:  # noqa: ANN001
    problem, g = _problem(shape, qp.TokenScope(), **kwargs)
    assert shares_geometry(problem, g, H200) is None


def test_units_hold_the_row_shares_kernels() -> None:
    unit = dynamic_segments_unit(EK.F16, EK.U4, False, Rounding.NEAREST_EVEN)
    assert sum("dynamic_quantize_row_shares" in n for n in unit) == 2 * len(SHARES_BLOCKS)
    fp8 = dynamic_segments_unit(EK.BF16, EK.FP8_E5M2, False, Rounding.NEAREST_EVEN)
    assert sum("dynamic_quantize_row_shares" in n for n in fp8) == len(SHARES_BLOCKS)
    assert not any("row_shares" in n for n in dynamic_segments_unit(EK.F16, EK.S8, False, Rounding.STOCHASTIC))
    fake = dynamic_fake_quantize_unit(EK.BF16)
    assert sum("dynamic_fake_quantize_row_shares" in n for n in fake) == 2 * len(SHARES_BLOCKS)
    assert not any("row_shares" in n for n in dynamic_fake_quantize_unit(EK.F32))
