"""CPU: Philox4x32-10 known answers and the per-element uniform stream of stochastic rounding (SPEC section 4)."""

from __future__ import annotations

import numpy as np
import pytest

from quantplan.vocabulary import philox
from quantplan.vocabulary.philox import philox4x32_10, uniform_for_elements

# Random123 tests/kat_vectors (D. E. Shaw Research; as copied into Random123-Boost
# libs/random/test/test_philox.cpp): counter[4] key[2] -> output[4], hex uint32 words.
KAT_10 = [
    (
        (0x00000000, 0x00000000, 0x00000000, 0x00000000),
        (0x00000000, 0x00000000),
        (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8),
    ),
    (
        (0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF),
        (0xFFFFFFFF, 0xFFFFFFFF),
        (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD),
    ),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]
# The same file's philox4x32 7-round lines: a second check of the round function and key schedule.
KAT_7 = [
    (
        (0x00000000, 0x00000000, 0x00000000, 0x00000000),
        (0x00000000, 0x00000000),
        (0x5F6FB709, 0x0D893F64, 0x4F121F81, 0x4F730A48),
    ),
    (
        (0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF),
        (0xFFFFFFFF, 0xFFFFFFFF),
        (0x5207DDC2, 0x45165E59, 0x4D8EE751, 0x8C52F662),
    ),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0x4DFCCABA, 0x190A87F0, 0xC47362BA, 0xB6B5242A),
    ),
]


def u32(values: object) -> np.ndarray:
    return np.array(values, dtype=np.uint32)


@pytest.mark.parametrize(("ctr", "key", "expected"), KAT_10)
def test_philox4x32_10_known_answers(ctr: tuple[int, ...], key: tuple[int, ...], expected: tuple[int, ...]) -> None:
    out = philox4x32_10(u32([ctr]), u32(key))
    assert out.dtype == np.uint32 and out.shape == (1, 4)
    assert out[0].tolist() == list(expected)


@pytest.mark.parametrize(("ctr", "key", "expected"), KAT_7)
def test_philox4x32_7_known_answers(ctr: tuple[int, ...], key: tuple[int, ...], expected: tuple[int, ...]) -> None:
    assert philox._philox4x32(u32([ctr]), u32(key), 7)[0].tolist() == list(expected)


def test_vectorised_over_counters_and_per_row_keys() -> None:
    ctrs = u32([c for c, _, _ in KAT_10])
    keys = u32([k for _, k, _ in KAT_10])
    assert philox4x32_10(ctrs, keys).tolist() == [list(e) for _, _, e in KAT_10]
    # one shared key for every counter
    shared = philox4x32_10(ctrs, keys[2])
    assert shared[2].tolist() == list(KAT_10[2][2])
    assert shared[0].tolist() == philox4x32_10(ctrs[:1], keys[2])[0].tolist()


def test_rejects_bad_shapes_and_dtypes() -> None:
    with pytest.raises(ValueError, match="shape"):
        philox4x32_10(u32([0, 0, 0, 0]), u32([0, 0]))
    with pytest.raises(ValueError, match="key"):
        philox4x32_10(u32([[0, 0, 0, 0]] * 2), u32([[0, 0]] * 3))
    with pytest.raises(ValueError, match="uint32"):
        philox4x32_10(np.zeros((1, 4), np.int64), u32([0, 0]))


def expected_uniform(i: int, seed: int, offset: int) -> float:
    """The SPEC section 4 mapping for one element, written with scalar Python ints."""
    j = i // 4
    ctr = u32([[j & 0xFFFFFFFF, j >> 32, offset & 0xFFFFFFFF, offset >> 32]])
    key = u32([seed & 0xFFFFFFFF, seed >> 32])
    word = int(philox4x32_10(ctr, key)[0, i % 4])
    return (word >> 8) * 2.0**-24


def test_uniform_matches_the_counter_mapping(rng: np.random.Generator) -> None:
    seed = int(rng.integers(0, 2**63)) * 2 + 1
    offset = int(rng.integers(0, 2**63)) * 2
    u = uniform_for_elements(11, seed, offset)
    assert u.dtype == np.float64 and u.shape == (11,)
    assert u.tolist() == [expected_uniform(i, seed, offset) for i in range(11)]
    # element indices beyond 2**32: the high counter word is j >> 32
    big = 5 * 2**34 + 3
    assert uniform_for_elements(3, seed, offset, start=big).tolist() == [
        expected_uniform(i, seed, offset) for i in range(big, big + 3)
    ]


def test_word_selection_four_elements_per_counter() -> None:
    # seed 0, offset 0: elements 0..3 are the words of the all-zero KAT (counter 0, key 0)
    words = KAT_10[0][2]
    assert uniform_for_elements(4, 0, 0).tolist() == [(w >> 8) * 2.0**-24 for w in words]
    # element i = 4j + w takes word w of counter j: the last four 64-bit element indices use
    # j = 2**62 - 1, i.e. counter words (0xFFFFFFFF, 0x3FFFFFFF, offset lo, offset hi)
    last = 2**64 - 4
    ones = uniform_for_elements(4, 2**64 - 1, 2**64 - 1, start=last)
    word = philox4x32_10(u32([[0xFFFFFFFF, 0x3FFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF]]), u32([0xFFFFFFFF, 0xFFFFFFFF]))[0]
    assert ones.tolist() == [(int(w) >> 8) * 2.0**-24 for w in word]
    # a stream starting mid-counter takes the later words of that counter first
    assert uniform_for_elements(2, 0, 0, start=2).tolist() == [(w >> 8) * 2.0**-24 for w in words[2:]]
    assert uniform_for_elements(1, 0, 0, start=4).tolist() == [expected_uniform(4, 0, 0)]


def test_start_offset_consistency(rng: np.random.Generator) -> None:
    seed, offset = int(rng.integers(0, 2**62)), int(rng.integers(0, 2**62))
    full = uniform_for_elements(103, seed, offset)
    for start in (0, 1, 2, 3, 4, 5, 50, 99):
        for count in (0, 1, 3, 4):
            assert (
                uniform_for_elements(count, seed, offset, start=start).tolist() == full[start : start + count].tolist()
            )


def test_values_are_24_bit_uniforms_in_unit_interval(rng: np.random.Generator) -> None:
    u = uniform_for_elements(200_000, int(rng.integers(0, 2**62)), 0)
    assert u.min() >= 0.0 and u.max() < 1.0
    assert np.array_equal(u * 2**24, np.floor(u * 2**24))  # multiples of 2**-24
    assert np.array_equal(u.astype(np.float32).astype(np.float64), u)  # exact in float32
    assert abs(u.mean() - 0.5) < 5 * np.sqrt(1 / 12 / u.size)
    assert abs((u < 0.25).mean() - 0.25) < 0.01


def test_seed_and_offset_high_bits_matter() -> None:
    base = uniform_for_elements(8, 7, 9)
    assert uniform_for_elements(8, 7, 9).tolist() == base.tolist()  # reproducible
    assert not np.array_equal(uniform_for_elements(8, 7 + 2**32, 9), base)  # key word 1
    assert not np.array_equal(uniform_for_elements(8, 7, 9 + 2**32), base)  # counter word 3
    assert not np.array_equal(uniform_for_elements(8, 8, 9), base)
    assert not np.array_equal(uniform_for_elements(8, 7, 10), base)
    # the high words land in the right slots
    seed, offset = 3 + (5 << 32), 11 + (13 << 32)
    ctr = u32([[0, 0, 11, 13]])
    word = philox4x32_10(ctr, u32([3, 5]))[0]
    assert uniform_for_elements(4, seed, offset).tolist() == [(int(w) >> 8) * 2.0**-24 for w in word]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"seed": -1}, "seed"),
        ({"seed": 2**64}, "seed"),
        ({"offset": -1}, "offset"),
        ({"offset": 2**64}, "offset"),
        ({"seed": 1.5}, "seed"),
        ({"seed": True}, "seed"),
        ({"count": -1}, "count"),
        ({"start": 2**64 - 2, "count": 3}, "2\\*\\*64"),
    ],
)
def test_rejects_out_of_range_arguments(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"count": 4, "seed": 0, "offset": 0}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        uniform_for_elements(**args)  # type: ignore[arg-type]


def test_accepts_numpy_integers() -> None:
    assert (
        uniform_for_elements(np.int64(4), np.uint64(2**64 - 1), np.int32(3)).tolist()
        == uniform_for_elements(4, 2**64 - 1, 3).tolist()
    )
