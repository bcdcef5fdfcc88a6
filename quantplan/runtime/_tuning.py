"""The tuning table: block sizes, vectors per thread and occupancy targets of the kernels.

One table, two readers. The kernels receive every value as a preprocessor define
(``QP_<NAME>``, e.g. ``QP_ROWS_BLOCK=256`` for the field ``rows_block``) that
:func:`kernel_options` builds for the compile layer (``kernels/`` has no default for them: a
missing define stops the compile with ``#error``); the launch geometry in Python reads the same
fields (``TUNING.rows_block``), so a kernel and its grid cannot disagree.

An experiment overrides a value through ``QUANTPLAN_NVRTC_OPTIONS`` (``-DQP_ROWS_MIN_BLOCKS=6``,
read once, when this module is first imported): the override replaces the table's value for the
kernels and for Python alike. Every value is part of the compile cache key (it is an NVRTC option).

Field groups, by kernel file:

* ``quantize.cu`` / ``dequantize.cu``: ``quantize_min_blocks`` (``quantize_rows``),
  ``dense_rows_block`` / ``dense_rows_min_blocks`` and the ``dense_*_unroll`` vectors per thread
  of the dense row kernels (:data:`quantplan.runtime._layout.DENSE_ROW_SHAPES` reads them),
  ``dense_qbwd_bf16_min_blocks`` (``quantize_backward_dense`` on bf16);
* ``dynamic_range.cu``: ``dense_block`` / ``dense_min_blocks`` (``dynamic_quantize_dense``, and
  ``dense_block`` for ``dynamic_fake_quantize_dense``), ``lanes_min_blocks``, ``rows_block`` /
  ``rows_min_blocks``, ``shares_block``, ``cluster_blocks`` (the dynamic-range kernels of both
  ``dynamic_range.cu`` and ``fake_quantize.cu``);
* ``fake_quantize.cu``: ``fake_*``;
* ``qp_qgz.cuh`` (swizzled quantize, dequant-reduce): ``qgz_*``, ``reduce_dense_*``;
* ``qp_deepspeed_format.cuh``: ``ds_*``.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from functools import cache

from quantplan.vocabulary._nvrtc_env import compile_options
from quantplan.vocabulary.elements import ElementKind
from quantplan.vocabulary.errors import Unsupported


@dataclass(frozen=True)
class Tuning:
    """Every tuning value of ``kernels/``; the define of field ``f`` is ``QP_<F upper-cased>``."""

    # ---- quantize.cu / dequantize.cu: static row kernels -----------------------------------
    #: Vectors each thread of a row kernel handles per (row, chunk) item (``quantize_rows``,
    #: ``dequantize_rows``; :data:`quantplan.runtime._layout.UNROLL`).
    row_unroll: int = 4
    #: Resident 256-thread blocks per SM asked of the register allocator for ``quantize_rows``.
    quantize_min_blocks: int = 4
    #: Most threads of a dense row block (``quantize_dense`` and friends; ``__launch_bounds__``).
    dense_rows_block: int = 256
    #: Resident blocks per SM of the dense row kernels (fp16 ``quantize_backward_dense`` too).
    dense_rows_min_blocks: int = 8
    #: Vectors per thread of ``quantize_dense`` / ``quantize_backward_dense`` /
    #: ``dequantize_dense`` / ``dequantize_backward_dense``.
    dense_quantize_unroll: int = 1
    dense_quantize_backward_unroll: int = 1
    dense_dequantize_unroll: int = 2
    dense_dequantize_backward_unroll: int = 1
    #: Resident blocks per SM of ``quantize_backward_dense`` on bf16 (40 registers, no spill).
    dense_qbwd_bf16_min_blocks: int = 6

    # ---- dynamic_range.cu (and the dynamic fake-quantize kernels of fake_quantize.cu) -------
    #: Threads of a ``dynamic_quantize_dense`` / ``dynamic_fake_quantize_dense`` block.
    dense_block: int = 256
    #: Resident blocks per SM of ``dynamic_quantize_dense``.
    dense_min_blocks: int = 8
    #: Resident 256-thread blocks per SM of ``dynamic_quantize_lanes``.
    lanes_min_blocks: int = 8
    #: Threads of a ``dynamic_quantize_rows`` / ``dynamic_fake_quantize_rows`` block.
    rows_block: int = 256
    #: Resident blocks per SM of ``dynamic_quantize_rows``.
    rows_min_blocks: int = 8
    #: Threads of a ``dynamic_quantize_row_shares`` / ``dynamic_fake_quantize_row_shares`` block.
    shares_block: int = 256
    #: Blocks of the thread-block cluster of ``dynamic_quantize_cluster`` /
    #: ``dynamic_fake_quantize_cluster`` (one segment per cluster).
    cluster_blocks: int = 8

    # ---- fake_quantize.cu ------------------------------------------------------------------
    #: Resident 256-thread blocks per SM of the generic row kernels.
    fake_min_blocks: int = 1
    #: Vectors one thread of ``fake_quantize_flat`` takes per tile.
    fake_flat_unroll: int = 4
    #: Most threads of a dense-rows block (``fake_quantize_dense_rows`` and friends).
    fake_dense_rows_block: int = 256
    #: Resident blocks per SM of the dense-rows forwards on 16-bit data, on 32- / 64-bit data,
    #: and of the straight-through backward.
    fake_dense_rows_min_blocks: int = 6
    fake_dense_rows_wide_min_blocks: int = 6
    fake_dense_ste_min_blocks: int = 8
    #: Bytes of each input one dense-rows thread takes per item: nearest forward, stochastic
    #: forward, straight-through backward (two inputs).
    fake_dense_thread_bytes: int = 32
    fake_dense_stochastic_thread_bytes: int = 32
    fake_dense_ste_thread_bytes: int = 16
    #: Resident blocks per SM of ``dynamic_fake_quantize_dense`` (two staging buffers each).
    fake_dense_min_blocks: int = 6
    #: Resident blocks per SM of ``dynamic_fake_quantize_rows``.
    fake_rows_min_blocks: int = 8

    # ---- qp_qgz.cuh: swizzled quantize, dequant-reduce ---------------------------------------
    #: Threads a qgZ fused-pass kernel is compiled for (``__launch_bounds__``; its register budget).
    qgz_segment_bound: int = 1024
    #: Threads of a block of the dense passes, and their resident blocks per SM.
    qgz_dense_block: int = 256
    qgz_dense_quantize_min_blocks: int = 8
    #: Threads of a ``dequant_reduce_dense`` block (at least the team) and its resident blocks.
    reduce_dense_block: int = 256
    reduce_dense_min_blocks: int = 4
    #: Most bytes of codes per thread ``dequant_reduce_dense`` loads before it sums them.
    reduce_dense_batch_bytes: int = 64
    #: Fewest elements per thread at which 4-bit codes under small scales take one FMA per code.
    reduce_dense_fma_min_ept: int = 4

    # ---- qp_deepspeed_format.cuh -------------------------------------------------------------
    #: Threads of a DeepSpeed-format dense block, its resident blocks (quantize, reduce).
    ds_dense_block: int = 256
    ds_dense_min_blocks: int = 8
    ds_reduce_min_blocks: int = 6
    #: Blocks of the thread-block cluster of the DeepSpeed-format cluster passes.
    ds_cluster_blocks: int = 8

    def defines(self) -> tuple[str, ...]:
        """``-DQP_<NAME>=<value>`` for every field, in field order."""
        return tuple(f"-D{macro(f.name)}={getattr(self, f.name)}" for f in dataclasses.fields(self))


def macro(field: str) -> str:
    """The define of a :class:`Tuning` field (``rows_block`` -> ``QP_ROWS_BLOCK``)."""
    return f"QP_{field.upper()}"


_DEFINE = re.compile(r"^QP_([A-Z0-9_]+)=(-?[0-9]+)$")


def _split_overrides(options: tuple[str, ...]) -> tuple[dict[str, int], tuple[str, ...]]:
    """The table's fields that ``options`` define (``-DQP_NAME=v`` or ``-D QP_NAME=v``), and the
    other options. A define of a field without an integer value is refused."""
    names = {f.name for f in dataclasses.fields(Tuning)}
    overrides: dict[str, int] = {}
    rest: list[str] = []
    i = 0
    while i < len(options):
        opt = options[i]
        text, step = (opt[2:], 1) if opt.startswith("-D") and len(opt) > 2 else (None, 1)
        if opt == "-D" and i + 1 < len(options):
            text, step = options[i + 1], 2
        if text is not None and text.partition("=")[0].startswith("QP_"):
            field = text.partition("=")[0][3:].lower()
            if field in names:
                match = _DEFINE.match(text)
                if match is None:
                    raise Unsupported(f"QUANTPLAN_NVRTC_OPTIONS: {text!r} needs an integer value (-D{macro(field)}=N)")
                overrides[field] = int(match.group(2))
                i += step
                continue
        rest.extend(options[i : i + step])
        i += step
    return overrides, tuple(rest)


def _table() -> Tuning:
    overrides, _ = _split_overrides(compile_options())
    return dataclasses.replace(Tuning(), **overrides)


#: The table in force: the defaults, with the overrides ``QUANTPLAN_NVRTC_OPTIONS`` held at import.
TUNING: Tuning = _table()


# ---- block shapes of the row kernels (the launch layout and the kernel names both read them) -----

#: Threads per block of the row kernels; must match __launch_bounds__ in the .cu files.
BLOCK_THREADS = 256

#: (elements per vector, vectors per thread) of each dense row kernel; the vectors per thread are
#: the tuning table's (the kernels' kDense*Unroll).
DENSE_ROW_SHAPES: dict[str, tuple[int, int]] = {
    "quantize_dense": (16, TUNING.dense_quantize_unroll),
    "quantize_backward_dense": (8, TUNING.dense_quantize_backward_unroll),
    "dequantize_dense": (8, TUNING.dense_dequantize_unroll),
    "dequantize_backward_dense": (8, TUNING.dense_dequantize_backward_unroll),
}
#: Exceptions to DENSE_ROW_SHAPES for one float kind: the bf16 quantize backward keeps vectors of
#: 16 (docs/performance.md, "What was tried").
DENSE_ROW_SHAPES_BY_FLOAT: dict[tuple[str, ElementKind], tuple[int, int]] = {
    ("quantize_backward_dense", ElementKind.BF16): (16, 1),
}
#: Elements per vector of each dense kernel on small problems (fewer elements than one 256-thread
#: block of full vectors per SM; launch- and latency-bound): quantize and dequantize keep their full
#: vectors, the gradients, which read two operands, take 4.
DENSE_SMALL_VEC: dict[str, int] = {
    "quantize_dense": 16,
    "quantize_backward_dense": 4,
    "dequantize_dense": 8,
    "dequantize_backward_dense": 4,
}
#: Most threads of a dense block (``__launch_bounds__`` of the dense kernels: the tuning table's).
DENSE_MAX_THREADS = TUNING.dense_rows_block
#: Kernels whose blocks hold fewer threads than DENSE_MAX_THREADS on large problems (none by
#: default; an experiment sets one here, e.g. ``benchmarks/probe_l2_state.py``).
DENSE_ROW_THREADS: dict[str, int] = {}


def dense_row_shape(kernel: str, float_kind: ElementKind | None = None) -> tuple[int, int]:
    """``(elements per vector, vectors per thread)`` of ``kernel`` on ``float_kind`` data."""
    if float_kind is None:
        return DENSE_ROW_SHAPES[kernel]
    return DENSE_ROW_SHAPES_BY_FLOAT.get((kernel, float_kind), DENSE_ROW_SHAPES[kernel])


def dense_row_threads(kernel: str) -> int:
    """Most threads of a block of ``kernel`` (DENSE_ROW_THREADS, else DENSE_MAX_THREADS)."""
    return DENSE_ROW_THREADS.get(kernel, DENSE_MAX_THREADS)


def dense_row_widths(kernel: str, float_kind: ElementKind | None = None) -> tuple[int, ...]:
    """The vector widths ``kernel`` is instantiated at for ``float_kind``: its own, and the small
    problems' one."""
    return tuple(dict.fromkeys((dense_row_shape(kernel, float_kind)[0], DENSE_SMALL_VEC[kernel])))


@cache
def _defines(table: Tuning) -> tuple[str, ...]:
    return table.defines()


def kernel_options() -> tuple[str, ...]:
    """The NVRTC options every kernel is compiled with beyond the compile layer's base ones:
    :data:`TUNING`'s defines, then the environment's other options
    (:func:`quantplan.vocabulary._nvrtc_env.compile_options`, re-exported by the compile layer). Raises :class:`Unsupported` when the
    environment now overrides a tuning value differently from the table in force (the grids were
    computed from the table)."""
    overrides, rest = _split_overrides(compile_options())
    stale = {k: v for k, v in overrides.items() if getattr(TUNING, k) != v}
    if stale:
        raise Unsupported(
            f"QUANTPLAN_NVRTC_OPTIONS overrides tuning values {stale} after quantplan was imported; "
            "set it before the first import"
        )
    return (*_defines(TUNING), *rest)


__all__ = [
    "BLOCK_THREADS",
    "DENSE_MAX_THREADS",
    "DENSE_ROW_SHAPES",
    "DENSE_ROW_SHAPES_BY_FLOAT",
    "DENSE_ROW_THREADS",
    "DENSE_SMALL_VEC",
    "TUNING",
    "Tuning",
    "dense_row_shape",
    "dense_row_threads",
    "dense_row_widths",
    "kernel_options",
    "macro",
]
