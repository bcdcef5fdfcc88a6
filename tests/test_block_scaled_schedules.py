"""CPU: the block-scaled kernel's schedule table and launch geometry (quantplan._block_scaled_kernels).

The kernel's slot arithmetic (a team of threads per block, or whole blocks per thread) must match
what Python launches: too few threads would leave blocks unquantized, and a schedule holding two
blocks per thread needs an even block count. These tests recompute the geometry independently.
"""

from __future__ import annotations

import itertools

import pytest

from quantplan import _block_scaled_kernels as bk

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
    for (contiguous, block, _), sched in bk.SCHEDULES.items():
        element = {16: "nvfp4", 32: "e4m3", 128: "e5m2"}[block]
        assert bk.kernel_name("float16", element, block, False, contiguous, sched) in names
