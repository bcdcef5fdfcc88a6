"""The fused single pass's geometry: a team of threads holds one contiguous segment in registers
(:func:`fused_segment_geometry` picks the vector width and team; :class:`SegmentLayoutArgs` is the
kernels' by-value ``SegmentLayout``). Plain geometry over the row layout, below the range passes
(``_segments``) and the qgZ launcher (``_qgz_launch``), which both read it."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from quantplan.runtime._tuning import BLOCK_THREADS
from quantplan.vocabulary.types import ElementKind, QuantMode

#: Largest team of the fused pass (threads holding one segment; __launch_bounds__ of the kernels).
MAX_TEAM = 1024
#: Elements one thread of a qgZ fused pass holds (the scan element is float32 or 16-bit: 32).
QGZ_ELEMENTS_PER_THREAD = 32
#: The dense passes of the qgZ and DeepSpeed-format kernels index with 32-bit integers: they
#: serve fewer elements than this.
DENSE_MAX_ELEMENTS = 2**31


class SegmentLayoutArgs(ctypes.Structure):
    """``struct SegmentLayout`` of the segment kernels, field for field (passed by value)."""

    _fields_ = [
        ("segments", ctypes.c_int64),
        *((name, ctypes.c_int32) for name in ("S", "seg_log2", "q_min", "q_max", "mode", "pad")),
    ]


def segment_elements_per_thread(float_kind: ElementKind) -> int:
    """Elements one thread of the fused pass holds in registers (``segment_vectors`` in the kernel)."""
    return 16 if float_kind is ElementKind.F64 else 32


def mode_code(mode: QuantMode, own_range: bool = False) -> int:
    """``SegmentLayout.mode``: 0 SYMMETRIC (|x|max), 1 ASYMMETRIC with the range widened to hold
    zero (SPEC section 4), 2 ASYMMETRIC over the segment's own min / max (``own_range``: the
    DeepSpeed formats)."""
    return 0 if mode is QuantMode.SYMMETRIC else 2 if own_range else 1


@dataclass(frozen=True)
class SegmentGeometry:
    """Launch geometry of the fused single pass: ``segments`` contiguous segments of ``length``
    elements, each held by a team of ``team`` threads (vectors of ``vec`` elements)."""

    segments: int
    length: int
    vec: int
    vector_io: bool
    team: int
    block: int

    def args(self, q_min: int, q_max: int, mode: QuantMode, own_range: bool = False) -> SegmentLayoutArgs:
        """The kernel's by-value ``SegmentLayout`` argument."""
        return segment_layout(self.segments, self.length, self.team, q_min, q_max, mode, own_range)

    def blocks(self, max_blocks: int) -> int:
        """Grid size: one block per block-full of teams, at most ``max_blocks`` (grid-stride beyond)."""
        return max(1, min(max_blocks, -(-self.segments // (self.block // self.team))))

    def describe(self) -> str:
        """Short variant tag for KernelSku.variant."""
        per_thread = -(-self.length // (self.team * self.vec))
        io = "" if self.vector_io else ",scalar-io"
        return f"fused-single-pass[{self.team}t-per-segment,vec{self.vec}{io},{per_thread}vec-per-thread]"


def segment_layout(
    segments: int, length: int, team: int, q_min: int, q_max: int, mode: QuantMode, own_range: bool = False
) -> SegmentLayoutArgs:
    """The kernels' ``SegmentLayout``: ``segments`` segments of ``length``, teams of ``team`` threads."""
    return SegmentLayoutArgs(segments, length, team.bit_length() - 1, q_min, q_max, mode_code(mode, own_range), 0)


def fused_segment_geometry(
    segments: int, length: int, packed: bool, per_thread: int, vec_max: int, busy_threads: int
) -> SegmentGeometry | None:
    """The fused single pass over ``segments`` contiguous segments of ``length`` elements, or None
    where a team cannot hold one (more than ``MAX_TEAM * per_thread`` elements) or 4-bit codes
    would not start on whole bytes (an odd ``length``). See :func:`segment_geometry` for the
    choice of vector width and team.
    """
    if length == 0 or segments == 0 or (packed and length % 2) or length > MAX_TEAM * per_thread:
        return None
    vec = vec_max
    while length % vec:
        vec //= 2
    vector_io = True
    if packed and vec < 2:
        vec, vector_io = 2, False
    team = 1
    while team * per_thread < length:
        team *= 2
    # Widen small problems up to one block, not beyond: larger teams' extra warps would each hold
    # one vector and add barrier work.
    while team < BLOCK_THREADS and team * vec < length and segments * team < busy_threads:
        team *= 2
    return SegmentGeometry(segments, length, vec, vector_io, team, max(team, BLOCK_THREADS))


__all__ = [
    "DENSE_MAX_ELEMENTS",
    "MAX_TEAM",
    "QGZ_ELEMENTS_PER_THREAD",
    "SegmentGeometry",
    "SegmentLayoutArgs",
    "fused_segment_geometry",
    "mode_code",
    "segment_elements_per_thread",
    "segment_layout",
]
