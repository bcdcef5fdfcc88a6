"""The kernel side of block-scaled quantization (``kernels/block_scaled.cu``): MX (e4m3, e5m2,
e2m3, e3m2, e2m1, int8) and FP8 blocks of 1x128 along the contiguous axis.

Machinery: the instantiation names, the scale-rule and scale-layout codes the kernel reads, the
launch geometry, and :func:`quantize_block_scaled`, which quantizes a CuPy array in one pass and
writes the scales in the requested layout (the block-scaled plans build on it). The semantics are
:mod:`quantplan.reference.block_scaled` (MICROSCALING.md), bit for bit.

Formula (per block of ``block`` consecutive elements along the last axis, amax over the valid
elements of the block):

* MX (``block=32``, E8M0 byte s from the scale rule ``rceil`` / ``floor`` / ``ceil`` / ``even``):
  ``code = enc(x * 2**(127 - s))``;
* FP8 blocks (``block=128``, e4m3 / e5m2): ``div`` ``code = enc(x / s)``, ``mul_rcp``
  ``enc(x * fl(1 / s))``, ``enc`` ``enc(x * e)``, or a UE8M0 byte; ``a = max(amax, amax_floor)``;
* a block holding NaN or +-Inf stores the NaN scale and zero codes.

**When to use:** producing MX / FP8-block GEMM operands from a 16-bit or f32 activation or weight
on a GPU; the scales land in the layout the GEMM reads (compact, cuBLAS 128x4 blocked, DeepGEMM
column-major TMA-aligned, UE8M0 packed in int32) without a second pass.

**Dtypes:** x float16, bfloat16 or float32; codes uint8 (e2m1 two per byte, element 2i low);
scales uint8 (E8M0 / UE8M0) or float32.

**Shape limits:** x of any rank, blocks along the last axis; any extent (a partial last block);
more than 2**31 elements (64-bit indexing).

**Workspace:** none.

**Precision guarantee:** bit-exact to the reference; IEEE f32 arithmetic, no FMA contraction.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

from quantplan.runtime._block_scaled_codes import (
    ELEMENT_TAGS,
    FP8_RULES,
    INPUT_TAGS,
    MX_RULES,
    NVFP4_RULES,
    quantize_arguments,
    scale_geometry,
)
from quantplan.runtime._block_scaled_codes import (
    LAYOUTS as LAYOUTS,  # re-exported: the scale layouts beside the launcher
)
from quantplan.runtime._block_scaled_codes import (
    ScaleGeometry as ScaleGeometry,  # re-exported
)
from quantplan.runtime._tuning import kernel_options
from quantplan.runtime.compiler import load_kernels, template_name
from quantplan.vocabulary.errors import InvalidProblem, Unsupported

#: The element of each block size's format family.
MX_ELEMENTS = ("e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "int8")
FP8_ELEMENTS = ("e4m3", "e5m2")
#: NVFP4's element tags: round to nearest even, stochastic rounding.
NVFP4_ELEMENTS = ("nvfp4", "nvfp4_sr")
#: Threads per block (at most; small problems launch smaller blocks to reach more multiprocessors).
BLOCK_THREADS = 256


@dataclass(frozen=True)
class Schedule:
    """The tuning of one instantiation: ``vecs`` consecutive 16-byte vectors of one block per
    thread (a team of block / (elements per vector * vecs) threads per block), ``unroll``
    independent slots in flight per thread, ``min_blocks`` resident blocks of 256 threads per
    multiprocessor (``__launch_bounds__``); ``persistent``: a grid of the resident blocks that
    strides over the tensor, else one pass of ``unroll`` slots per thread over a full grid."""

    vecs: int
    unroll: int
    min_blocks: int
    persistent: bool = False

    def team(self, input_dtype: str, block: int) -> int:
        """Threads per block of ``block`` elements (1 when a thread holds whole blocks)."""
        return max(1, block // (VECTOR_ELEMENTS[input_dtype] * self.vecs))

    def blocks_per_thread(self, input_dtype: str, block: int) -> int:
        """Whole blocks one thread holds (1 when a team shares a block)."""
        return max(1, VECTOR_ELEMENTS[input_dtype] * self.vecs // block)

    def slots(self, input_dtype: str, block: int, teams: int) -> int:
        """Thread slots covering ``teams`` blocks."""
        return teams * self.team(input_dtype, block) // self.blocks_per_thread(input_dtype, block)


#: The tuning table: (contiguous, block elements, small) -> Schedule. ``small``: the large
#: schedule's grid would give fewer than :data:`SMALL_BLOCKS_PER_SM` blocks per multiprocessor;
#: such problems are latency-bound and take more, narrower threads. The general (ragged or
#: misaligned) schedule keeps one vector per thread at every size.
SCHEDULES: dict[tuple[bool, int, bool], Schedule] = {
    (True, 16, False): Schedule(vecs=4, unroll=2, min_blocks=4),
    (True, 16, True): Schedule(vecs=1, unroll=1, min_blocks=1),
    (False, 16, False): Schedule(vecs=1, unroll=1, min_blocks=1),
    (True, 32, False): Schedule(vecs=4, unroll=1, min_blocks=4),
    (True, 128, False): Schedule(vecs=4, unroll=1, min_blocks=4),
    (True, 32, True): Schedule(vecs=2, unroll=1, min_blocks=1),
    (True, 128, True): Schedule(vecs=1, unroll=1, min_blocks=1),
    (False, 32, False): Schedule(vecs=1, unroll=1, min_blocks=1),
    (False, 128, False): Schedule(vecs=1, unroll=1, min_blocks=1),
}
#: The schedules NVFP4 with stochastic rounding takes instead: four vectors per thread at four
#: resident blocks (its Philox words need registers that a second slot in flight would spill) on a
#: persistent grid (the resident blocks stride over the tensor; the fastest of the schedules timed,
#: docs/performance.md).
STOCHASTIC_SCHEDULES: dict[tuple[bool, int, bool], Schedule] = {
    (True, 16, False): Schedule(vecs=4, unroll=1, min_blocks=4, persistent=True),
}
#: Schedules of the stochastic kernel that ``benchmarks/probe_block_scaled.py --stochastic`` times
#: side by side with a copy: the default above, and eight vectors per thread (four blocks, 16
#: Philox draws per slot; 80 registers at 3 resident blocks, no spill on sm_90) on a persistent
#: grid, the fewest instructions per element. Every one is bit-exact
#: (``tests/test_block_scaled_stochastic_gpu.py``).
STOCHASTIC_CANDIDATES: tuple[Schedule, ...] = (
    Schedule(vecs=4, unroll=1, min_blocks=4, persistent=True),
    Schedule(vecs=8, unroll=1, min_blocks=3, persistent=True),
)
#: FP8 blocks of 128 whose rule multiplies (``enc``, ``mul_rcp``, ``ue8m0``) on 16-bit inputs take
#: these instead: two vectors per thread (a team of eight a block). ``div`` keeps four: its
#: per-element division runs faster with longer runs per thread (two vectors: 96% of a copy
#: against 99%), while ``enc`` with column-major scales ran at 98.3% with four and 99.4% with two
#: (``benchmarks/probe_block_scaled.py``, docs/performance.md).
MULTIPLY_SCHEDULES: dict[tuple[bool, int, bool], Schedule] = {
    (True, 128, False): Schedule(vecs=2, unroll=1, min_blocks=4),
}
SMALL_BLOCKS_PER_SM = 4
#: Elements of one 16-byte vector, by input dtype.
VECTOR_ELEMENTS = {"float16": 8, "bfloat16": 8, "float32": 4}


def _schedule(key: tuple[bool, int, bool], input_dtype: str, stochastic: bool, divide: bool = False) -> Schedule:
    """The row of ``key``: :data:`STOCHASTIC_SCHEDULES` for stochastic rounding, else
    :data:`MULTIPLY_SCHEDULES` for a rule that does not divide on a 16-bit input, where they have
    one; :data:`SCHEDULES` otherwise."""
    if stochastic:
        return STOCHASTIC_SCHEDULES.get(key, SCHEDULES[key])
    if not divide and VECTOR_ELEMENTS[input_dtype] == 8:
        return MULTIPLY_SCHEDULES.get(key, SCHEDULES[key])
    return SCHEDULES[key]


def choose_schedule(
    input_dtype: str,
    block: int,
    contiguous: bool,
    teams: int,
    sm_count: int,
    stochastic: bool = False,
    divide: bool = False,
) -> Schedule:
    """The table's schedule for ``teams`` blocks of ``block`` elements on ``sm_count``
    multiprocessors (``stochastic``: NVFP4 with stochastic rounding, from
    :data:`STOCHASTIC_SCHEDULES` where it has a row; ``divide``: the FP8 ``div`` rule, else a 16-bit
    input takes :data:`MULTIPLY_SCHEDULES` where it has a row)."""
    if not contiguous:
        return _schedule((False, block, False), input_dtype, stochastic, divide)
    large = _schedule((True, block, False), input_dtype, stochastic, divide)
    small = -(-large.slots(input_dtype, block, teams) // BLOCK_THREADS) < SMALL_BLOCKS_PER_SM * sm_count
    if not small and teams % large.blocks_per_thread(input_dtype, block):
        small = True  # whole blocks per thread need a whole number of slots: the one-block schedule
    return _schedule((True, block, small), input_dtype, stochastic, divide)


def kernel_name(input_dtype: str, element: str, block: int, divide: bool, contiguous: bool, schedule: Schedule) -> str:
    """The instantiation of ``block_scaled_quantize`` for one problem under ``schedule``."""
    sched = schedule
    return template_name(
        "block_scaled_quantize",
        INPUT_TAGS[input_dtype],
        ELEMENT_TAGS[element],
        block,
        divide,
        contiguous,
        sched.vecs,
        sched.unroll,
        sched.min_blocks,
    )


def instantiations() -> list[str]:
    """Every instantiation :func:`quantize_block_scaled` can select (the NVRTC sweep's list)."""
    names = []
    for key, sched in SCHEDULES.items():
        contiguous, block, _ = key
        for dtype in INPUT_TAGS:
            if block == 16:
                names += [
                    kernel_name(dtype, element, 16, False, contiguous, _schedule(key, dtype, element == "nvfp4_sr"))
                    for element in NVFP4_ELEMENTS
                ]
            elif block == 32:
                names += [kernel_name(dtype, element, 32, False, contiguous, sched) for element in MX_ELEMENTS]
            else:
                names += [
                    kernel_name(dtype, element, 128, divide, contiguous, _schedule(key, dtype, False, divide))
                    for element in FP8_ELEMENTS
                    for divide in (False, True)
                ]
    names += [amax_kernel_name(dtype) for dtype in INPUT_TAGS]
    names += [
        dequantize_kernel_name(dtype, element, block)
        for dtype in INPUT_TAGS
        for element, block in DEQUANTIZE_ELEMENT_BLOCKS
    ]
    return names


#: (element, block) pairs the dequantize kernel serves: MX 1x32, FP8 1x128, NVFP4 1x16.
DEQUANTIZE_ELEMENT_BLOCKS = (
    *((element, 32) for element in MX_ELEMENTS),
    *((element, 128) for element in FP8_ELEMENTS),
    ("nvfp4", 16),
)


def dequantize_kernel_name(output_dtype: str, element: str, block: int) -> str:
    """The dequantize kernel for ``element`` codes in blocks of ``block`` to ``output_dtype``."""
    return template_name("block_scaled_dequantize", INPUT_TAGS[output_dtype], ELEMENT_TAGS[element], block)


def amax_kernel_name(input_dtype: str) -> str:
    """The tensor-amax kernel (NVFP4's computed tensor scale) for ``input_dtype``."""
    return template_name("block_scaled_tensor_amax", INPUT_TAGS[input_dtype])


def quantize_block_scaled(
    x: Any,
    *,
    element: str = "e4m3",
    block: int = 32,
    rule: str = "rceil",
    layout: str = "compact",
    amax_floor: float = 0.0,
    tensor_amax: Any = "compute",
    input_dtype: str | None = None,
    stream: Any = None,
    schedule: Schedule | None = None,
    rounding: str = "nearest_even",
    seed: Any = 0,
    offset: Any = 0,
    s_dec_out: Any = None,
) -> tuple[Any, Any]:
    """Quantize CuPy array ``x`` along its last axis; returns ``(codes, scales)`` (CuPy arrays).

    ``block=32`` takes an MX ``rule``; ``block=128`` an FP8 ``rule`` (``div``, ``mul_rcp``,
    ``enc``, ``ue8m0``) with ``element`` e4m3 or e5m2. ``scales`` is the layout's buffer (flat
    for ``blocked``; [cols, dim] for ``column_major``; int32 words for ``packed_ue8m0``).
    ``element="nvfp4"`` takes ``block=16`` and ``rule="te"``; its ``tensor_amax`` is a one-element
    float32 CuPy array (a calibrated amax), ``"compute"`` (a first pass over x computes max |x|
    over the finite elements), or None (one level: S_enc = 1).
    ``input_dtype``: ``"bfloat16"`` for a uint16 array holding bfloat16 bits (CuPy has no
    bfloat16); otherwise x's own dtype.
    ``rounding="stochastic"`` (NVFP4 only): §1.6 with the Philox words of x's row-major flat
    indices; ``seed`` and ``offset`` are integers in [0, 2**64) or one-element int64 CuPy arrays
    (read on the device at launch, so a captured graph replays with a new offset).
    ``s_dec_out`` (NVFP4): None, or a one-element float32 CuPy array into which the kernel writes
    S_dec = fl(1 / S_enc) of the tensor amax it reads (1 for one level), on the device: no host
    round trip, so the call stays capturable in a CUDA graph.
    """
    import cupy
    import numpy as np

    from quantplan.runtime._device import device_info

    dtype = input_dtype or str(x.dtype)
    if dtype == "bfloat16" and x.dtype.itemsize != 2:
        raise InvalidProblem(f"bfloat16 input travels as uint16 bits in CuPy; got an array of {x.dtype}")
    if dtype not in INPUT_TAGS:
        raise InvalidProblem(f"x has dtype {dtype}; block-scaled quantization reads float16, bfloat16 or float32")
    if element not in ELEMENT_TAGS or element == "nvfp4_sr":
        raise InvalidProblem(f"element {element!r} is not one of {sorted(set(ELEMENT_TAGS) - {'nvfp4_sr'})}")
    if rounding not in ("nearest_even", "stochastic"):
        raise InvalidProblem(f"rounding must be 'nearest_even' or 'stochastic', got {rounding!r}")
    stochastic = rounding == "stochastic"
    if stochastic and element != "nvfp4":
        raise Unsupported(f"stochastic rounding has a kernel for NVFP4 only, not {element!r}")
    rng = rng_arguments(seed, offset) if stochastic else (0, 0, 0, 0)
    s_dec_ptr = 0
    if s_dec_out is not None:
        if element != "nvfp4":
            raise InvalidProblem(f"s_dec_out is NVFP4's tensor scale; element {element!r} has none")
        if str(s_dec_out.dtype) != "float32" or s_dec_out.size != 1:
            raise InvalidProblem("s_dec_out must be a one-element float32 device array")
        s_dec_ptr = int(s_dec_out.data.ptr)
    if block == 32:
        if rule not in MX_RULES or element not in MX_ELEMENTS:
            raise InvalidProblem(f"MX scale rule {rule!r} is not one of {sorted(MX_RULES)}")
        rule_code = MX_RULES[rule]
    elif block == 16:
        if element != "nvfp4" or rule not in NVFP4_RULES:
            raise InvalidProblem(f"blocks of 16 are NVFP4 (element 'nvfp4', rule of {sorted(NVFP4_RULES)})")
        rule_code = NVFP4_RULES[rule]
    elif block == 128:
        if rule not in FP8_RULES or element not in ("e4m3", "e5m2"):
            raise InvalidProblem(f"FP8 blocks take e4m3 / e5m2 and a rule of {sorted(FP8_RULES)}")
        rule_code = FP8_RULES[rule]
    else:
        raise Unsupported(f"blocks of {block} elements: 16 (NVFP4), 32 (MX) and 128 (FP8) are served")
    if x.ndim < 1 or not x.flags.c_contiguous:
        raise InvalidProblem("x must be a C-contiguous array of rank >= 1")
    cols = int(x.shape[-1])
    rows = int(math.prod(x.shape[:-1]))
    blocks_per_row = -(-cols // block)
    per_byte = 2 if element in ("e2m1", "nvfp4") else 1
    f32_scales = rule in ("div", "mul_rcp", "enc")
    geo = scale_geometry(layout, rows, blocks_per_row, f32_scales)
    codes = cupy.empty((*x.shape[:-1], -(-cols // per_byte)), cupy.uint8)
    scales = cupy.empty(geo.size, cupy.float32 if f32_scales else cupy.uint8)
    if rows * cols == 0 and not s_dec_ptr:
        return codes, scales  # an empty NVFP4 problem with s_dec_out still launches: the kernel writes S_dec
    contiguous = cols % block == 0 and x.data.ptr % 16 == 0 and codes.data.ptr % 16 == 0
    divide = rule == "div"
    info = device_info(x.device.id)
    teams = rows * blocks_per_row
    sched = schedule or choose_schedule(dtype, block, contiguous, teams, info.sm_count, stochastic, divide)
    name = kernel_name(dtype, "nvfp4_sr" if stochastic else element, block, divide, contiguous, sched)
    fn = load_kernels("block_scaled", [name], info.arch, x.device.id, kernel_options())[name]
    slots = sched.slots(dtype, block, teams)
    threads, grid = launch_shape(slots, info.sm_count, _resident(fn) if sched.persistent else 0, sched.unroll)
    args = (
        *quantize_arguments(x, codes, scales, rows, cols, blocks_per_row, rule_code, geo, amax_floor, dtype),
        np.int64(geo.pad_rows),
        np.int64(geo.pad_cols),
    )
    stream = stream if stream is not None else cupy.cuda.get_current_stream()
    amax_ptr = 0
    if element == "nvfp4" and tensor_amax is not None:
        if isinstance(tensor_amax, str):
            if tensor_amax != "compute":
                raise InvalidProblem(
                    f"tensor_amax must be a float32 device array, 'compute' or None, got {tensor_amax!r}"
                )
            tensor_amax = tensor_amax_of(x, dtype, stream)
        if tensor_amax.dtype != cupy.float32 or tensor_amax.size != 1:
            raise InvalidProblem("tensor_amax must be a one-element float32 array")
        amax_ptr = tensor_amax.data.ptr
    rng_args = (np.uint64(v) for v in rng)
    fn((grid,), (threads,), (*args, np.uint64(amax_ptr), *rng_args, np.uint64(s_dec_ptr)), stream=stream)
    return codes, scales


def rng_arguments(seed: Any, offset: Any) -> tuple[int, int, int, int]:
    """The kernel's ``(seed_ptr, offset_ptr, seed_value, offset_value)``: each of ``seed`` and
    ``offset`` is an integer in [0, 2**64) (pointer 0) or a one-element int64 CuPy array (its
    pointer; the kernel reads it at launch)."""
    ptrs, values = [0, 0], [0, 0]
    for i, (name, v) in enumerate((("seed", seed), ("offset", offset))):
        if hasattr(getattr(v, "data", None), "ptr"):  # a device array
            if str(v.dtype) != "int64" or v.size != 1:
                raise InvalidProblem(f"{name} must be a one-element int64 device array, got {v.dtype} of size {v.size}")
            ptrs[i] = int(v.data.ptr)
        elif isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 0 <= int(v) < 2**64:
            raise InvalidProblem(f"{name} must be an integer in [0, 2**64) or a one-element int64 array, got {v!r}")
        else:
            values[i] = int(v)
    return ptrs[0], ptrs[1], values[0], values[1]


def tensor_amax_of(x: Any, dtype: str, stream: Any) -> Any:
    """max |x| over the finite elements of CuPy array ``x`` (a one-element float32 array), on ``stream``."""
    import cupy
    import numpy as np

    from quantplan.runtime._device import device_info

    info = device_info(x.device.id)
    out = cupy.zeros(1, cupy.float32)
    n = int(x.size)
    vec = VECTOR_ELEMENTS[dtype]
    vector_elements = n // vec * vec if x.data.ptr % 16 == 0 else 0
    name = amax_kernel_name(dtype)
    fn = load_kernels("block_scaled", [name], info.arch, x.device.id, kernel_options())[name]
    grid = max(1, min(-(-max(n // vec, 1) // BLOCK_THREADS), 4 * info.sm_count))
    fn((grid,), (BLOCK_THREADS,), (x, np.int64(n), np.int64(vector_elements), out), stream=stream)
    return out


def _resident(fn: Any) -> int:
    import cupy

    return max(1, cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.ptr, BLOCK_THREADS, 0))


def launch_shape(slots: int, sm_count: int, resident_blocks: int, unroll: int) -> tuple[int, int]:
    """(threads per block, blocks) for ``slots`` thread slots, ``unroll`` per thread: blocks of 64
    or 128 threads when 256 would leave multiprocessors idle; ``resident_blocks`` (> 0, a
    persistent schedule) caps the grid at the resident blocks, which then stride over the slots."""
    threads = BLOCK_THREADS
    while threads > 64 and -(-slots // threads) < sm_count:
        threads //= 2
    grid = -(-slots // (threads * unroll)) if -(-slots // threads) >= sm_count else -(-slots // threads)
    if resident_blocks:
        grid = min(grid, resident_blocks * sm_count * (BLOCK_THREADS // threads))
    return threads, max(1, grid)


def dequantize_block_scaled(
    codes: Any,
    scales: Any,
    shape: tuple[int, ...],
    *,
    element: str,
    block: int,
    scale_kind: str,
    out_dtype: str = "float32",
    tensor_scale: Any = None,
    stream: Any = None,
) -> Any:
    """Dequantize block-scaled ``codes`` with compact ``scales`` (CuPy arrays) to a new array of ``shape``.

    ``scale_kind``: ``"e8m0"`` (MX, FP8 UE8M0), ``"f32"`` (FP8 f32 scales) or ``"e4m3"`` (NVFP4,
    with ``tensor_scale`` the one-element S_dec array; None: one level). ``out_dtype`` float32,
    float16 or bfloat16 (returned as uint16 bits). Formula: y = fl(dec(code) * scale) in f32
    (NVFP4: fl(fl(dec(code) * f32(s)) * S_dec)), rounded once to the output dtype.
    """
    import cupy
    import numpy as np

    from quantplan.runtime._device import device_info

    if (element, block) not in DEQUANTIZE_ELEMENT_BLOCKS:
        raise Unsupported(f"dequantize of {element} in blocks of {block}: one of {DEQUANTIZE_ELEMENT_BLOCKS}")
    kinds = {"e8m0": 0, "f32": 1, "e4m3": 2}
    if scale_kind not in kinds:
        raise InvalidProblem(f"scale_kind {scale_kind!r} is not one of {sorted(kinds)}")
    cols = int(shape[-1])
    rows = int(math.prod(shape[:-1]))
    out = cupy.empty(
        shape, cupy.float32 if out_dtype == "float32" else (cupy.float16 if out_dtype == "float16" else cupy.uint16)
    )
    if rows * cols == 0:
        return out
    info = device_info(codes.device.id)
    name = dequantize_kernel_name(out_dtype, element, block)
    fn = load_kernels("block_scaled", [name], info.arch, codes.device.id, kernel_options())[name]
    total = rows * -(-cols // 8)
    grid = max(1, min(-(-total // BLOCK_THREADS), 32 * info.sm_count))
    ts = 0 if tensor_scale is None else tensor_scale.data.ptr
    stream = stream if stream is not None else cupy.cuda.get_current_stream()
    fn(
        (grid,),
        (BLOCK_THREADS,),
        (
            codes,
            scales,
            np.int32(kinds[scale_kind]),
            np.uint64(ts),
            np.int64(rows),
            np.int64(cols),
            np.int64(-(-cols // block)),
            out,
        ),
        stream=stream,
    )
    return out
