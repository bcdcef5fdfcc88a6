"""DequantReducePlan: dequantize N peers' chunks, sum in float32, re-quantize (ZeRO++ qgZ).

The receiving side of :class:`~quantplan.SwizzledQuantizePlan`: after the intra-node all-to-all,
local device ``d`` holds chunk ``output[p, d]`` (and ``scale_out[p, d]``) from each of its N
peers. This plan dequantizes each chunk with its own parameters, sums them in float32 in peer
order (optionally averages), and re-quantizes the sum with fresh dynamic-range parameters per
output group, whose size is independent of the input groups. Optional LoCo error feedback.

Kernels: ``kernels/dequant_reduce.cu`` (shared device code in ``kernels/qp_qgz.cuh``);
reference: :func:`quantplan.reference.dequant_reduce`; tests:
``tests/test_reference_dequant_reduce.py``, ``tests/test_dequant_reduce_plan_errors.py``,
``tests/test_dequant_reduce_gpu.py``; benchmark: ``benchmarks/bench_zeropp.py``.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import ConfigDict

from quantplan import reference
from quantplan.runtime import _qgz_launch
from quantplan.runtime._affine import ResolvedCodeRange
from quantplan.runtime._device import device_info, stream_device_id
from quantplan.runtime._kernel_names import (
    DENSE_REDUCE_EPT,
    DENSE_REDUCE_PEERS,
    QGZ_WIDTHS,
    dequant_reduce_dense_name,
    dequant_reduce_unit,
    error_tag,
)
from quantplan.runtime._launch import launch_on, params_struct
from quantplan.runtime._operands import (
    Operand,
    check_disjoint,
    check_param_values,
    check_positive,
    check_writeable,
    host_view,
)
from quantplan.runtime._plan import Plan, check_descriptor, choose_backend, preferred, snapshot
from quantplan.runtime._qgz_launch import QgzOperands, beta_pair, set_output_args
from quantplan.runtime._segments import SegmentLayoutArgs, range_divisor_of
from quantplan.runtime._tuning import TUNING, kernel_options
from quantplan.runtime.compiler import load_kernels, template_name
from quantplan.runtime.workspace import Workspace
from quantplan.vocabulary import types
from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.errors import InvalidProblem
from quantplan.vocabulary.types import HOST_ARCH, ElementKind, NibbleOrder, QuantMode, check_element_count

_FROZEN = ConfigDict(frozen=True, extra="forbid")
_F32, _I32 = ELEMENTS[ElementKind.F32], ELEMENTS[ElementKind.I32]


def _storage(elements: int, kind: ElementKind) -> int:
    return elements // 2 if ELEMENTS[kind].is_packed else elements


class DequantReduceDescriptor(ResolvedCodeRange):
    """A dequantize-reduce-requantize problem (see :class:`DequantReducePlan`).

    Fields: ``peers`` (N >= 1 chunks to reduce); ``chunk_elements`` (elements per chunk, and of
    the output); ``input_group_size`` (groups of the incoming chunks; divides ``chunk_elements``);
    ``output_group_size`` (groups of the re-quantized output; divides ``chunk_elements``,
    independent of ``input_group_size``; required for code outputs, ignored for float outputs);
    ``mode`` SYMMETRIC or ASYMMETRIC (both sides); ``input_element`` S8, U8, S4 or U4;
    ``output_element`` S8, U8, S4 or U4 (re-quantized), or F16, BF16, F32 (the float sum itself,
    rounded once: the last hop of a quantized reduce-scatter); ``q_min`` / ``q_max`` narrow the
    output code range; ``nibble_order`` of 4-bit codes (both sides); ``average`` divides the sum
    by N; ``error_element`` None or the element of the LoCo error buffer (F16, BF16, F32; code
    outputs only).

    4-bit sides need an even ``chunk_elements`` (each chunk starts on a byte).
    """

    model_config = _FROZEN
    peers: int
    chunk_elements: int
    input_group_size: int
    output_group_size: int | None = None
    mode: QuantMode = QuantMode.SYMMETRIC
    input_element: ElementKind
    output_element: ElementKind
    q_min: int | None = None
    q_max: int | None = None
    nibble_order: NibbleOrder = NibbleOrder.LOW_FIRST
    average: bool = False
    error_element: ElementKind | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        """``(peers, chunk_elements)`` codes; 4-bit: ``(peers, chunk_elements / 2)`` bytes."""
        return (self.peers, _storage(self.chunk_elements, self.input_element))

    @property
    def input_param_shape(self) -> tuple[int, ...]:
        """``(peers, chunk_elements / input_group_size)``: shape of ``scale`` / ``zero_point``."""
        return (self.peers, self.chunk_elements // max(1, self.input_group_size))

    @property
    def float_output(self) -> bool:
        """True when the output is the float sum (F16 / BF16 / F32), not re-quantized codes."""
        return ELEMENTS[self.output_element].is_float

    @property
    def output_shape(self) -> tuple[int, ...]:
        """``(chunk_elements,)`` codes or floats; 4-bit: ``(chunk_elements / 2,)`` bytes."""
        return (_storage(self.chunk_elements, self.output_element),)

    @property
    def param_shape(self) -> tuple[int, ...]:
        """``(chunk_elements / output_group_size,)``: shape of ``scale_out`` / ``zero_point_out`` (code outputs)."""
        return (self.chunk_elements // max(1, self.output_group_size or self.chunk_elements or 1),)

    @property
    def error_shape(self) -> tuple[int, ...]:
        """``(chunk_elements,)``: shape of the LoCo error buffer (one value per output element)."""
        return (self.chunk_elements,)


@dataclass(slots=True)
class DequantReduceArgs:
    """Arguments of :class:`DequantReducePlan`.

    ``input`` (``input_shape``: row ``j`` is peer ``j``'s chunk; int8 for S8, uint8 for U8 and
    packed S4 / U4); ``scale`` (float32, ``input_param_shape``) and ``zero_point`` (int32,
    ``input_param_shape``; ASYMMETRIC only) of the incoming chunks; ``output``
    (``output_shape``); ``scale_out`` (float32, ``param_shape``) and ``zero_point_out`` (int32,
    ASYMMETRIC only). LoCo (descriptor ``error_element`` set): ``error_feedback``
    (``error_shape``, read and updated in place) and ``error_beta`` (a real number in [0, 1]).
    """

    input: Any
    scale: Any
    output: Any
    scale_out: Any
    zero_point: Any = None
    zero_point_out: Any = None
    error_feedback: Any = None
    error_beta: Any = None


_FAMILY = "dequant_reduce"
_REDUCE_PARAMS = params_struct(
    "DequantReduceParams",
    [
        ("input", _qgz_launch.PeerSumArgs),
        ("out", _qgz_launch.QgzOutputArgs),
        ("layout", SegmentLayoutArgs),
        ("divisor", ctypes.c_float),
    ],
)
_FLOATS_PARAMS = params_struct(
    "DequantReduceFloatsParams", [("input", _qgz_launch.PeerSumArgs), ("y", ctypes.c_uint64), ("n", ctypes.c_int64)]
)


def prepare_dequant_reduce(
    desc: DequantReduceDescriptor, q_min: int, q_max: int, device_id: int
) -> _qgz_launch.QgzLaunches:
    """Compile (first use) and prepare the launches of ``desc`` on ``device_id``."""
    info = device_info(device_id)
    code, out = ELEMENTS[desc.input_element], ELEMENTS[desc.output_element]
    high_first = (code.is_packed or out.is_packed) and desc.nibble_order is NibbleOrder.HIGH_FIRST
    unit = dequant_reduce_unit(desc.input_element, desc.error_element, desc.output_element, high_first)
    functions = load_kernels(_FAMILY, unit, info.arch, device_id, kernel_options())
    chunk = desc.chunk_elements
    peer_input = _qgz_launch.PeerSumArgs(
        peer_bytes=_storage(chunk, desc.input_element),
        peer_params=chunk // desc.input_group_size,
        in_group=desc.input_group_size,
        peers=desc.peers,
        average=int(desc.average),
        peers_f=float(np.float32(desc.peers)),
        in_group_shift=_qgz_launch.log2_or_minus_one(desc.input_group_size),
    )
    # A vector of codes never crosses an input group: its width divides the input group size.
    vec_in = _qgz_launch.widest_dividing(desc.input_group_size, QGZ_WIDTHS[0])
    if out.is_float:
        tags: tuple[str, ...] = (code.cpp_tag, out.cpp_tag)
        return _qgz_launch.prepare_float_values(
            lambda v, vector_io: functions[template_name("dequant_reduce_floats", *tags, v, vector_io, high_first)],
            _FLOATS_PARAMS,
            peer_input,
            chunk,
            vec_in,
            desc.input_element,
            desc.output_element,
            info,
        )
    tags = (code.cpp_tag, error_tag(desc.error_element), out.cpp_tag)
    size = desc.output_group_size
    assert size is not None
    groups = chunk // size
    fixed = dict(input=peer_input, divisor=range_divisor_of(desc.mode, q_min, q_max))
    packed = code.is_packed or out.is_packed
    kernels = _qgz_launch.QgzKernels(
        lambda vec, vector_io: functions[template_name("dequant_reduce_segments", *tags, vec, vector_io, high_first)],
        functions[template_name("dequant_reduce_group_params", tags[0], tags[1], high_first)],
        functions[template_name("dequant_reduce_elements", *tags, high_first)],
        _REDUCE_PARAMS,
        fixed,
    )
    # Peer codes (base and peer stride), output codes, and the error buffer.
    bits = [code.storage_bits, code.storage_bits, out.storage_bits]
    if desc.error_element is not None:
        bits.append(ELEMENTS[desc.error_element].storage_bits)
    geometry = None if packed and vec_in < 2 else _qgz_launch.qgz_geometry(groups, size, packed, vec_in, info)
    dense = None
    shape = dense_reduce_geometry(desc, info.sm_count)
    if shape is not None and geometry is not None:
        ept, team, block, peers = shape
        fn = functions[dequant_reduce_dense_name(desc.input_element, desc.output_element, high_first, ept, peers)]
        unrolled = f"{peers}-peers-unrolled" if peers else "peer-loop"
        describe = f"dense[{team}t-per-group,{ept}-per-thread,{unrolled},{block}t]"
        # Teams of up to a warp: every warp its own unit of work, interleaved over the blocks (the
        # kernel's DenseSchedule), so every resident block launches; wider teams: the fewest
        # blocks that take the same number of passes.
        dense = _qgz_launch.DenseLaunch(fn, team, ept, describe, block, even_passes=team > 32)
    return _qgz_launch.prepare_qgz_launches(
        kernels,
        geometry,
        groups,
        size,
        chunk // (2 if out.is_packed else 1),
        q_min,
        q_max,
        desc.mode,
        bits,
        info,
        dense=dense,
    )


#: Threads per block of ``dequant_reduce_dense`` (at least the team).
DENSE_REDUCE_BLOCK = TUNING.reduce_dense_block


def dense_reduce_geometry(desc: DequantReduceDescriptor, sm_count: int) -> tuple[int, int, int, int] | None:
    """``(elements per thread, team, block, unrolled peers or 0)`` of ``dequant_reduce_dense`` for
    ``desc``, or None where it does not apply: it serves SYMMETRIC code outputs without LoCo,
    chunks of fewer than ``DENSE_MAX_ELEMENTS`` elements, input groups holding whole threads
    (``ept`` divides them), output groups of exactly ``team * ept`` elements (team a power of two
    up to one block of ``DENSE_BLOCK``). ``ept`` is the largest of ``DENSE_REDUCE_EPT`` (16) that
    gives the SMs ``DENSE_BLOCK`` threads each, else the smallest that fits (a small chunk: its
    time is one thread's dependent chain, so more threads with fewer elements each). Blocks of
    ``DENSE_REDUCE_BLOCK`` threads (at least the team), shrinking to a warp while the chunk would
    leave most SMs without a block."""
    size = desc.output_group_size
    if (
        desc.mode is not QuantMode.SYMMETRIC
        or desc.error_element is not None
        or desc.float_output
        or size is None
        or desc.chunk_elements >= _qgz_launch.DENSE_MAX_ELEMENTS
    ):
        return None
    fitting = []
    for ept in DENSE_REDUCE_EPT:
        team, rem = divmod(size, ept)
        if not (rem or desc.input_group_size % ept or team > _qgz_launch.DENSE_BLOCK or team & (team - 1)):
            fitting.append((ept, team))
    if not fitting:
        return None
    ept, team = fitting[0]
    if desc.chunk_elements // ept < _qgz_launch.DENSE_BLOCK * sm_count:
        ept, team = fitting[-1]  # a small chunk: more threads, each with less work
    threads = desc.chunk_elements // ept
    block = max(DENSE_REDUCE_BLOCK, team)
    while block > max(32, team) and threads < block * sm_count:
        block //= 2
    peers = desc.peers if desc.peers in DENSE_REDUCE_PEERS else 0
    return ept, team, block, peers


class DequantReducePlan(_qgz_launch.QgzChecks, Plan[DequantReduceArgs, QgzOperands]):
    """Dequantize N peers' chunks, sum them in float32, re-quantize with fresh per-group parameters.

    Formulas (SPEC section 4, float32; rne = round half to even):

    * per peer ``j``: ``y_j = (q_j - zp_j) * scale_j`` in float32 (kept in float32, not rounded
      to a narrower type), each input group with its own parameters;
    * ``s = ((y_0 + y_1) + y_2) + ...``: float32 additions in peer order, peer 0 first, each
      rounded once (deterministic, independent of the launch);
    * ``average``: ``s = s / float32(N)`` (IEEE float32 division, not a product with ``1 / N``);
    * LoCo (``error_element`` set): ``v = s + e`` in float32; otherwise ``v = s``;
    * re-quantization of ``v`` per output group of ``output_group_size`` elements, dynamic range
      exactly as :class:`~quantplan.DynamicRangeQuantizePlan` (SYMMETRIC ``scale = max|v| /
      q_max``; ASYMMETRIC ``scale = (hi - lo) / (q_max - q_min)``, ``zp = clamp(q_min - rne(lo /
      scale), q_min, q_max)``; ``scale == 0`` -> 1; a non-finite group -> ``scale = NaN``, ``zp = 0``,
      codes 0). A NaN scale on the input side makes its elements NaN, so the output group turns
      non-finite too: nothing is silently dropped;
    * LoCo update: ``e <- (b * e) + (c * (v - dequant(q_out)))``, ``b = f32(error_beta)``,
      ``c = 1 - b`` in float32, every operation rounded once in float32 (no FMA), the result
      rounded once to the buffer's element.

    **When to use:** the reduce step of ZeRO++ qgZ (after the intra-node all-to-all of
    :class:`~quantplan.SwizzledQuantizePlan`'s output), or any reduction of quantized shards
    that must stay quantized for the next hop. ``average=True`` gives a mean instead of a sum.

    **Dtypes:** input codes S8 / U8 / S4 / U4 (FP8: Unsupported) with float32 scales and int32
    zero points; output codes S8 / U8 / S4 / U4 (4-bit packed along the chunk, either nibble
    order, the same order on both sides) or floats F16 / BF16 / F32; error buffer F16 / BF16 /
    F32 (code outputs).

    **Shape limits:** any N >= 1, any chunk size; both group sizes divide ``chunk_elements``;
    4-bit sides need an even chunk. Zero-size chunks are a no-op.

    **Kernel variants:** ``fused-single-pass[...]`` (output groups of at most 32768 elements;
    4-bit sides: even input groups): a team of threads sums and holds each output group in
    registers, one read of the peers' codes; an element-I/O twin for misaligned operands.
    ``dense[...]`` replaces it for aligned operands in the hot layout (SYMMETRIC, no LoCo, output
    groups of ``team * 16`` (or ``team * 8``) elements with team a power of two up to 256, input
    groups a multiple of 16 (8)): each thread sums 16 elements (8 in small chunks) with one load
    per peer and no integer conversions, the peer loop unrolled for 2, 4, 8 and 16 peers.
    ``two-pass[...]`` (any other group size): the sums are computed twice (parameters, then
    codes), so the peers' codes are read twice. ``float-sum[...]``: float outputs, one read.
    ``numpy`` on the reference backend.

    **Workspace:** none.

    **Precision guarantee:** float32 dequantization, summation and re-quantization in a fixed
    order; bit-exact to :func:`quantplan.reference.dequant_reduce`; deterministic. The sum itself
    carries float32 rounding (relative 2**-24 per addition) on top of the quantization error.
    """

    _args_type = DequantReduceArgs
    _category = types.OpCategory.COLLECTIVE
    _op = types.QuantizeKind.DYNAMIC_RANGE

    def __init__(
        self,
        desc: DequantReduceDescriptor,
        q_min: int,
        q_max: int,
        backend: types.BackendKind,
        device_id: int | None = None,
        launches: _qgz_launch.QgzLaunches | None = None,
    ) -> None:
        kinds, empty = (desc.input_element, desc.output_element), desc.chunk_elements == 0
        if launches is None:  # the reference backend, or an empty chunk on the GPU
            super().__init__(desc, device_id, *kinds, backend=backend, arch=HOST_ARCH.name, empty=empty)
        else:
            super().__init__(desc, device_id, *kinds, launches.describe, prepared=launches.launches, empty=empty)
        self.descriptor = desc
        self._d = snapshot(
            desc, "input_shape", "input_param_shape", "output_shape", "param_shape", "error_shape", "float_output"
        )
        self.q_min = q_min
        self.q_max = q_max
        self._launches = launches
        self._input_info, self._output_info = ELEMENTS[desc.input_element], ELEMENTS[desc.output_element]
        self._peer_bytes = _storage(desc.chunk_elements, desc.input_element)

    @classmethod
    def select(
        cls, stream: Any, desc: DequantReduceDescriptor, pref: types.PlanPreference | None = None
    ) -> DequantReducePlan:
        """Validate ``desc``, pick the backend, and compile and prepare the kernels (CUDA, first use).

        Raises InvalidProblem for a malformed descriptor (N < 1, negative chunk, group sizes
        < 1 or not dividing the chunk, odd 4-bit chunks, bad code range, LoCo or q_min / q_max
        with a float output) and Unsupported for FP8 codes.
        """
        check_descriptor(desc, DequantReduceDescriptor)
        check_positive("peers", desc.peers)
        if isinstance(desc.chunk_elements, bool) or desc.chunk_elements < 0:
            raise InvalidProblem(f"chunk_elements={desc.chunk_elements!r} must be >= 0")
        check_element_count(desc.peers * desc.chunk_elements, f"input of {desc.peers} x {desc.chunk_elements}")
        _qgz_launch.check_code_kind(desc.input_element, "input_element")
        if ELEMENTS[desc.output_element].is_float:
            _qgz_launch.check_float_kind(desc.output_element, "output_element")
            if desc.error_element is not None:
                raise InvalidProblem(
                    "error_element applies to code outputs only: a float output is not re-quantized, so there is "
                    "no quantization error to feed back"
                )
            if desc.q_min is not None or desc.q_max is not None:
                raise InvalidProblem("q_min / q_max apply to code outputs only; leave them None for a float output")
            sizes: tuple[str, ...] = ("input_group_size",)
            q_min, q_max = 0, 0
        else:
            _qgz_launch.check_code_kind(desc.output_element, "output_element")
            if desc.output_group_size is None:
                raise InvalidProblem("output_group_size is required for a code output (the re-quantization groups)")
            _qgz_launch.check_error_kind(desc.error_element)
            q_min, q_max = _qgz_launch.dynamic_code_range(desc.mode, desc.output_element, desc.q_min, desc.q_max)
            sizes = ("input_group_size", "output_group_size")
        for name in sizes:
            size = getattr(desc, name)
            check_positive(name, size)
            if desc.chunk_elements % size:
                raise InvalidProblem(
                    f"{name}={size} does not divide chunk_elements={desc.chunk_elements}; every chunk must hold "
                    f"whole groups (pad the chunk to {-(-desc.chunk_elements // size) * size} elements)"
                )
        for name, kind in (("input_element", desc.input_element), ("output_element", desc.output_element)):
            if ELEMENTS[kind].is_packed and desc.chunk_elements % 2:
                raise InvalidProblem(
                    f"{name}={kind.name} packs two codes per byte, so chunk_elements must be even, got "
                    f"{desc.chunk_elements}"
                )
        backend = choose_backend(pref, stream)
        if backend is types.BackendKind.REFERENCE:
            return preferred(cls(desc, q_min, q_max, backend), pref)
        device_id = stream_device_id(stream)
        if desc.chunk_elements == 0:
            return preferred(cls(desc, q_min, q_max, backend, device_id), pref)
        return preferred(
            cls(desc, q_min, q_max, backend, device_id, prepare_dequant_reduce(desc, q_min, q_max, device_id)), pref
        )

    def _check_values(self, checked: QgzOperands) -> None:
        lo, hi = ELEMENTS[self._d.input_element].code_range or (0, 0)
        check_param_values(checked.params, checked.zp, lo, hi)

    def _check(self, args: DequantReduceArgs) -> QgzOperands:
        d = self._d
        q = self._required(args.input, "input", d.input_shape, self._input_info)
        scale = self._required(args.scale, "scale", d.input_param_shape, _F32)
        y = self._required(args.output, "output", d.output_shape, self._output_info)
        zp_out: Operand | None = None
        scale_out: Operand | None = None
        asym = d.mode is QuantMode.ASYMMETRIC
        zp = self._zero_point(args.zero_point, "zero_point", d.input_param_shape, asym)
        if d.float_output:
            if args.scale_out is not None or args.zero_point_out is not None:
                raise InvalidProblem(
                    "scale_out / zero_point_out must be None for a float output (nothing is re-quantized)"
                )
        else:
            scale_out = self._required(args.scale_out, "scale_out", d.param_shape, _F32)
            zp_out = self._zero_point(args.zero_point_out, "zero_point_out", d.param_shape, asym)
        err, beta = self._loco(args.error_feedback, args.error_beta, d.error_shape, d.error_element)
        check_writeable(("output", y), ("scale_out", scale_out), ("zero_point_out", zp_out), ("error_feedback", err))
        check_disjoint(
            ("input", q),
            ("scale", scale),
            ("zero_point", zp),
            ("output", y),
            ("scale_out", scale_out),
            ("zero_point_out", zp_out),
            ("error_feedback", err),
        )
        return QgzOperands(q, scale, zp, y, scale_out, zp_out, err, *beta_pair(beta))

    # ---- execution ------------------------------------------------------------------------

    def _launch(self, handle: int, workspace: Workspace | None, a: QgzOperands) -> None:
        assert self._launches is not None and self.device_id is not None
        q_ptr, y_ptr = a.x.ptr, a.y.ptr
        pointers = (q_ptr, q_ptr + self._peer_bytes, y_ptr) + (() if a.err is None else (a.err.ptr,))
        launches = self._launches.chosen(pointers)
        float_output = self._d.float_output
        for launch in launches:
            params = launch.params
            params.input.q = q_ptr
            params.input.scale = a.params.ptr  # type: ignore[union-attr]
            params.input.zp = 0 if a.zp is None else a.zp.ptr
            if float_output:
                params.y = y_ptr
            else:
                set_output_args(params.out, a.y, a.params_out, a.zp_out, a.err, a.beta, a.one_minus_beta)
        launch_on(self.device_id, handle, *launches)

    def _run_reference(self, a: QgzOperands) -> None:
        d = self._d
        if d.chunk_elements == 0:
            return
        q_new, s_new, z_new, new_err = reference.dequant_reduce(
            host_view(a.x, self._input_info),
            host_view(a.params, _F32),  # type: ignore[arg-type]
            None if a.zp is None else host_view(a.zp, _I32),
            d.input_element,
            d.input_group_size,
            d.output_element,
            d.output_group_size,
            d.mode,
            self.q_min,
            self.q_max,
            d.nibble_order,
            d.average,
            _qgz_launch.error_view(a.err, d.error_element),
            a.beta if a.err is not None else 0.0,
        )
        _qgz_launch.write_reference_outputs(a, self._output_info, q_new, s_new, z_new, new_err, d.error_element)


__all__ = ["DequantReduceArgs", "DequantReduceDescriptor", "DequantReducePlan"]
