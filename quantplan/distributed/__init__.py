"""Quantized collectives for ZeRO++ over NCCL, one process per GPU: qgZ reduce-scatter, qwZ all-gather.

``import quantplan.distributed as qpd`` (it needs PyTorch; ``import quantplan`` does not import it).

* :func:`quantized_reduce_scatter` / :class:`QuantizedReduceScatter` -- ZeRO++ qgZ: every rank
  passes its full gradient bucket and receives its shard of the average (or sum) over ranks, with
  the bytes on the wire quantized to 4 or 8 bits per element (plus one float32 scale, and an int32
  zero point for ASYMMETRIC, per group). Hierarchical (``nodes > 1``): one intra-node all-to-all,
  a quantized reduction, one inter-node all-to-all of the already reduced data, a final reduction.
* :func:`quantized_all_gather` / :class:`QuantizedAllGather` -- ZeRO++ qwZ: each rank quantizes
  its weight shard, the codes and parameters are all-gathered, and every rank dequantizes the
  whole tensor.

Communicators (``group=``): a ``torch.distributed`` ProcessGroup (None: the default group) --
NCCL for CUDA tensors, gloo for CPU tensors, which run on the NumPy reference backend (same
results bit for bit, so the collectives run end to end on a laptop) -- or a
``cupy.cuda.nccl.NcclCommunicator`` (CUDA tensors; see :func:`nccl_communicator`). The layer is
small: one internal class per backend with ``all_to_all(send, recv)`` (equal row blocks, row
``j`` to/from peer ``j``), ``all_gather(send, recv)`` and the split into the intra-node and
inter-node communicators of the hierarchy, created once per (communicator, nodes) and cached.

Streams: CUDA work runs on PyTorch's current stream of the tensors' device -- the plans on its
raw handle, the element-wise steps as PyTorch ops, the CuPy NCCL calls on it; ``torch.distributed``
NCCL collectives are ordered with the current stream by PyTorch itself.

Layout: communicators in ``_comm``, the qgZ / qwZ steps (checks, staging buffers, swizzle and
dequantize-reduce, plans or composed) in ``_steps``, and here the collective classes and the
function wrappers with their per-process cache.

Implementations (``implementation=``): ``"plans"`` runs :class:`~quantplan.SwizzledQuantizePlan`
and :class:`~quantplan.DequantReducePlan`; ``"composed"`` runs the same math as
:class:`~quantplan.DynamicRangeQuantizePlan` (group scope over the flat tensor) plus a swizzle
copy, and :class:`~quantplan.DequantizePlan` plus float32 additions in peer order, an IEEE
division and a re-quantization (the exact formulas of the fused plans, so the results are bit for
bit the same); ``"auto"`` (default) uses the plans and falls back to the composition on CUDA
where a plan has no CUDA kernel (``select`` raises Unsupported). ``describe()`` says what was picked.

Objects keep their plans and staging buffers; the functions keep one object per problem in a
per-process cache of :data:`CACHE_SIZE` entries (:func:`clear_cache` frees them). Objects are not
safe to run from two host threads at once, nor on two streams at once (they reuse their buffers).
"""

from __future__ import annotations

import atexit
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised only without PyTorch
    raise ImportError("quantplan.distributed needs PyTorch: pip install torch") from exc

from typing import NamedTuple

import numpy as np
import torch

from quantplan._frontend import Target
from quantplan._torch_ops import dequantize_out_op, dynamic_quantize_out_op, kind_index, scope_ints
from quantplan.distributed import _comm, _steps
from quantplan.distributed._comm import _resolve_group, nccl_communicator
from quantplan.distributed._steps import Implementation, _check_pair, plan_label
from quantplan.ops.dequant_reduce import DequantReduceDescriptor
from quantplan.ops.dynamic_range import DynamicRangeQuantizeDescriptor, DynamicRangeQuantizePlan
from quantplan.ops.static_quantize import DequantizeDescriptor, DequantizePlan
from quantplan.ops.swizzled_quantize import SwizzledQuantizeDescriptor, SwizzledQuantizePlan
from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.errors import InvalidProblem, Unsupported
from quantplan.vocabulary.types import BackendKind, ElementKind, GroupScope, PlanPreference, QuantMode

# ---- qgZ: quantized reduce-scatter ----------------------------------------------------------------


class CommBytes(NamedTuple):
    """Bytes one rank sends per call: ``intra`` (to the other devices of its node), ``inter`` (to
    other nodes) and their ``total``. Blocks a rank keeps for itself are not counted. The flat
    all-gather counts everything as ``intra`` (``(world - 1)`` copies of its quantized shard, as a
    ring all-gather sends)."""

    intra: int
    inter: int

    @property
    def total(self) -> int:
        return self.intra + self.inter


class QuantizedReduceScatter:
    """ZeRO++ qgZ: quantized reduce-scatter of a flat float tensor over ``world`` ranks.

    ``QuantizedReduceScatter(numel, dtype, device, group=..., nodes=..., ...)`` validates the
    problem, selects the plans and allocates the staging buffers once; ``run(output, input)`` is
    the per-step call. Rank ``z = node * devices_per_node + device`` of ``group``
    (``devices_per_node = world / nodes``; the ranks of one node are consecutive) receives
    ``output = R[z * shard : (z + 1) * shard]``, ``shard = numel / world``, of the reduction
    ``R`` over ranks of every rank's ``input``.

    Formula (float32 arithmetic; each step bit for bit its plan, see :mod:`quantplan.reference`):

    1. ``SwizzledQuantizePlan`` quantizes ``input`` in groups of ``group_size`` (dynamic range,
       ``mode``, ``code``) and lays the codes and parameters out ``[device][node][group]``.
    2. Intra-node all-to-all: chunk ``d`` goes to local device ``d``; row ``j`` received is from
       local peer ``j``.
    3. ``nodes == 1``: ``DequantReducePlan(peers=dpn)`` dequantizes, sums in float32 in peer
       order, divides by ``dpn`` (``average``) and rounds once to ``output``'s dtype: one
       quantization in all. ``nodes > 1``: ``DequantReducePlan(peers=dpn)`` re-quantizes the
       (averaged) node sum in groups of ``group_size``, ordered ``[node][slice]``; an inter-node
       all-to-all (the ranks with the same local device) sends slice ``n`` to node ``n``; a final
       ``DequantReducePlan(peers=nodes)`` sums the nodes' slices (divides by ``nodes``) and writes
       ``output``. With ``average=True`` the result is ``(sum / dpn) / nodes`` in float32 (the
       mean, rounded twice); with ``average=False`` the plain sum.

    **When to use:** gradient reduce-scatter (ZeRO stage 2/3) where the link is the bottleneck,
    chiefly across nodes: the bytes on the wire are ``bits / 16`` of bf16's plus the parameters
    (``4 / group_size`` bytes per element, twice that ASYMMETRIC). Within one NVLink node the
    quantize/dequantize passes may cost more than the bytes they save; measure
    (``benchmarks/bench_collectives.py``).

    **Dtypes:** ``input`` / ``output`` float16, bfloat16 or float32 (the same dtype); codes
    ``S4`` (default), ``U4``, ``S8`` or ``U8``; ``SYMMETRIC`` or ``ASYMMETRIC`` (int32 zero points
    travel with the float32 scales). CUDA tensors over NCCL (a ProcessGroup or a CuPy NCCL
    communicator); CPU tensors over gloo on the reference backend.

    **Shape limits:** any shape, taken flat (C order); ``world % nodes == 0``; ``numel`` a
    multiple of ``world * group_size`` and, for 4-bit codes, even shards (InvalidProblem from
    ``SwizzledQuantizePlan.select`` names the next valid size: pad the bucket). ``output`` has
    ``numel / world`` elements. Every rank must pass the same problem (this is not checked across
    ranks: a mismatch hangs, as with any collective). Everything is checked before any
    communication.

    **Workspace:** staging buffers kept by the object: send and receive codes and parameters
    (``2 * numel * (bits / 8 + 4 / group_size)`` bytes, twice the parameter part ASYMMETRIC),
    plus for ``nodes > 1`` the re-quantized node chunk and its receive buffer
    (``2 * numel / dpn * (bits / 8 + ...)``); the composed implementation adds ``4 * numel /
    dpn * dpn = 4 * numel`` bytes of float32 dequantized peers (intra step) and a float32 chunk.
    Plan workspaces, where a plan needs one, come from PyTorch's caching allocator per call.

    **Precision guarantee:** bit for bit the composition of :func:`quantplan.reference.swizzled_quantize`
    and :func:`quantplan.reference.dequant_reduce` in the order above, on every backend and both
    implementations; deterministic (fixed peer order, no atomics; identical inputs give identical
    outputs on every run). Error against the exact mean (per element ``i``, ``s1_r`` the stage-1
    scale of rank ``r``'s group of ``i``, ``s2_n`` the re-quantization scale of node ``n``'s group):
    ``|output - mean| <= (1/nodes) * sum_n [(1/dpn) * sum_{r in n} s1_r / 2 + s2_n / 2]``
    (no ``s2`` term for one node; without ``average`` drop the ``1/nodes`` and ``1/dpn``) plus
    float32 rounding of the sums and the final rounding to ``output``'s dtype. Each quantization
    adds at most half a step: SYMMETRIC codes span ``[-max|x|, max|x|]`` exactly (``scale = max|x|
    / q_max``, nothing clips); ASYMMETRIC codes represent ``k * scale`` for ``k`` in ``[rne(lo /
    scale), rne(lo / scale) + q_max - q_min]``, which covers ``[lo, hi]`` to within half a step at
    both ends.
    """

    def __init__(
        self,
        numel: int,
        dtype: torch.dtype,
        device: torch.device | str,
        *,
        group: Any = None,
        nodes: int = 1,
        group_size: int = 2048,
        code: ElementKind = ElementKind.S4,
        mode: QuantMode = QuantMode.SYMMETRIC,
        average: bool = True,
        implementation: Implementation = "auto",
    ) -> None:
        if isinstance(numel, bool) or not isinstance(numel, (int, np.integer)) or numel < 0:
            raise InvalidProblem(f"numel={numel!r} must be an integer >= 0")
        if implementation not in ("auto", "plans", "composed"):
            raise InvalidProblem(f"implementation={implementation!r} must be 'auto', 'plans' or 'composed'")
        self.numel = int(numel)
        self.dtype = dtype
        self.float_kind = _steps._float_kind(dtype, "dtype")
        self.nodes = _steps._positive_int("nodes", nodes)
        self.group_size = _steps._positive_int("group_size", group_size)
        self.code = _steps._code_kind(code)
        self.mode = _steps._mode(mode, self.code)
        self.average = bool(average)
        self.device = _steps._device(device)
        target = self._target = Target.of_torch_device(self.device)
        comm = _comm._communicator(group, self.device)
        self.world = comm.size
        self.rank = comm.rank
        if self.world % self.nodes:
            raise InvalidProblem(
                f"world size {self.world} is not divisible by nodes={self.nodes}; every node must hold the same "
                f"number of devices (devices_per_node = world / nodes)"
            )
        dpn = self.devices_per_node = self.world // self.nodes
        self.node, self.local_device = divmod(self.rank, dpn)

        # Plans first (local checks only; InvalidProblem names the next valid size), then buffers,
        # then the subgroups (a collective every rank enters): nothing communicates before this point.
        sdesc = SwizzledQuantizeDescriptor(
            shape=(self.numel,),
            group_size=self.group_size,
            nodes=self.nodes,
            devices_per_node=dpn,
            pipeline=1,
            mode=self.mode,
            input_element=self.float_kind,
            output_element=self.code,
        )
        try:
            SwizzledQuantizePlan.select(
                None, sdesc, PlanPreference(backend=BackendKind.REFERENCE)
            )  # the size rules, on any machine
        except Unsupported:  # pragma: no cover - the reference backend serves every valid problem
            pass
        self.shard = self.numel // self.world
        self._swizzle: _steps._SwizzleStep = _steps._auto(
            implementation,
            target,
            lambda: _steps._SwizzlePlanStep(target, sdesc),
            lambda: _steps._SwizzleComposed(target, sdesc),
        )

        def reduce_desc(peers: int, chunk: int, out: ElementKind) -> DequantReduceDescriptor:
            is_float = ELEMENTS[out].is_float
            return DequantReduceDescriptor(
                peers=peers,
                chunk_elements=chunk,
                input_group_size=self.group_size,
                output_group_size=None if is_float else self.group_size,
                mode=self.mode,
                input_element=self.code,
                output_element=out,
                average=self.average,
            )

        def reduce_step(desc: DequantReduceDescriptor) -> _steps._ReduceStep:
            return _steps._auto(
                implementation,
                target,
                lambda: _steps._ReducePlanStep(target, desc),
                lambda: _steps._ReduceComposed(target, desc),
            )

        width = self.nodes * self.shard
        self._send = _steps._Buffers.empty(target, dpn, width, self.group_size, self.code, self.mode)
        self._recv = _steps._Buffers.empty(target, dpn, width, self.group_size, self.code, self.mode)
        self._mid: _steps._Buffers | None = None
        self._recv2: _steps._Buffers | None = None
        if self.nodes > 1:
            self._reduce_intra = reduce_step(reduce_desc(dpn, width, self.code))
            self._reduce_inter: _steps._ReduceStep | None = reduce_step(
                reduce_desc(self.nodes, self.shard, self.float_kind)
            )
            self._mid = _steps._Buffers.empty(target, self.nodes, self.shard, self.group_size, self.code, self.mode)
            self._recv2 = _steps._Buffers.empty(target, self.nodes, self.shard, self.group_size, self.code, self.mode)
        else:
            self._reduce_intra = reduce_step(reduce_desc(dpn, width, self.float_kind))
            self._reduce_inter = None
        self._intra, self._inter = _comm._hierarchy(comm, self.nodes) if self.numel else (comm, _comm._LocalComm())
        inter_bytes = 0 if self._mid is None else (self.nodes - 1) * self._mid.row_bytes()
        self.bytes_sent = CommBytes(intra=(dpn - 1) * self._send.row_bytes(), inter=inter_bytes)

    def describe(self) -> dict[str, str]:
        """The implementation of each step (plan and backend, or the composition), for logs and benchmarks."""
        out = {"swizzle": self._swizzle.label, "reduce_intra": self._reduce_intra.label}
        if self._reduce_inter is not None:
            out["reduce_inter"] = self._reduce_inter.label
        return out

    def _check(self, output: Any, input: Any) -> None:
        _check_pair(output, input)
        if input.device != self.device or input.dtype != self.dtype:
            raise InvalidProblem(
                f"input is {input.dtype} on {input.device}, but this reduce-scatter was built for {self.dtype} on "
                f"{self.device}"
            )
        if input.numel() != self.numel:
            raise InvalidProblem(
                f"input has {input.numel()} elements, but this reduce-scatter was built for {self.numel}"
            )
        if output.numel() != self.shard:
            raise InvalidProblem(
                f"output has {output.numel()} elements; each of the {self.world} ranks receives numel / world = "
                f"{self.shard} elements of the {self.numel}-element input"
            )

    def run(self, output: torch.Tensor, input: torch.Tensor) -> None:
        """Reduce-scatter ``input`` (every rank's full tensor) into ``output`` (this rank's shard).

        Checks the tensors (type, device, dtype, element counts, contiguity) before any work.
        Runs on PyTorch's current stream; returns when the work is enqueued (CUDA) or done (CPU).
        """
        self._check(output, input)
        if self.numel == 0:
            return
        x = input.detach().view(-1)
        y = output.detach().view(-1)
        self._swizzle.run(x, self._send)
        for s, r in zip(self._send.tensors(), self._recv.tensors(), strict=True):
            self._intra.all_to_all(s, r)
        if self._mid is None or self._recv2 is None or self._reduce_inter is None:
            self._reduce_intra.run(self._recv, y)
            return
        self._reduce_intra.run(self._recv, self._mid)
        for s, r in zip(self._mid.tensors(), self._recv2.tensors(), strict=True):
            self._inter.all_to_all(s, r)
        self._reduce_inter.run(self._recv2, y)


# ---- qwZ: quantized all-gather --------------------------------------------------------------------


class QuantizedAllGather:
    """ZeRO++ qwZ: quantize the local shard, all-gather codes and parameters, dequantize everything.

    ``QuantizedAllGather(shard_numel, dtype, device, group=..., ...)`` validates and selects once;
    ``run(output, input)`` gathers: ``input`` is this rank's shard (``shard_numel`` elements),
    ``output`` (``world * shard_numel`` elements) receives every rank's shard, rank order.

    Formula: :class:`~quantplan.DynamicRangeQuantizePlan` with ``GroupScope(group_size)`` over the
    flat shard (SYMMETRIC ``scale = max|x| / q_max``, ``q = clamp(rne(x / scale), q_min, q_max)``;
    ASYMMETRIC with an int32 zero point), an all-gather of codes, scales (and zero points), then
    one :class:`~quantplan.DequantizePlan` over the flat gathered tensor: ``y = (q - zp) * scale``
    in float32, rounded once to ``output``'s dtype.

    **When to use:** weight all-gather (ZeRO stage 3 forward/backward) on a slow link: 8-bit codes
    halve bf16's bytes, 4-bit quarter them.

    **Dtypes:** float16, bfloat16 or float32 (``output`` the same as ``input``); codes ``S8``
    (default), ``U8``, ``S4``, ``U4``; both modes.

    **Shape limits:** ``shard_numel`` a multiple of ``group_size`` (InvalidProblem names the rule
    and the next valid size) and, for 4-bit codes, even. Everything is checked before any
    communication.

    **Workspace:** staging buffers kept by the object: the local codes and parameters and the
    gathered ones (``(world + 1) * shard * (bits / 8 + 4 / group_size)`` bytes, twice the
    parameter part ASYMMETRIC).

    **Precision guarantee:** bit for bit :func:`quantplan.reference.dynamic_quantize` followed by
    :func:`quantplan.reference.dequantize` of each shard; deterministic. Per element ``|y - x| <=
    scale / 2`` (both modes, see QuantizedReduceScatter) plus the rounding of ``y`` to the output
    dtype.
    """

    def __init__(
        self,
        shard_numel: int,
        dtype: torch.dtype,
        device: torch.device | str,
        *,
        group: Any = None,
        group_size: int = 2048,
        code: ElementKind = ElementKind.S8,
        mode: QuantMode = QuantMode.SYMMETRIC,
    ) -> None:
        if isinstance(shard_numel, bool) or not isinstance(shard_numel, (int, np.integer)) or shard_numel < 0:
            raise InvalidProblem(f"shard_numel={shard_numel!r} must be an integer >= 0")
        self.shard = int(shard_numel)
        self.dtype = dtype
        self.float_kind = _steps._float_kind(dtype, "dtype")
        self.group_size = _steps._positive_int("group_size", group_size)
        self.code = _steps._code_kind(code)
        self.mode = _steps._mode(mode, self.code)
        self.device = _steps._device(device)
        target = self._target = Target.of_torch_device(self.device)
        if self.shard % self.group_size:
            valid = -(-self.shard // self.group_size) * self.group_size
            raise InvalidProblem(
                f"the local shard has {self.shard} elements, not a multiple of group_size={self.group_size}: "
                f"groups must not straddle ranks; pad every shard to {valid} elements (or pick a group_size "
                f"that divides the shard)"
            )
        if ELEMENTS[self.code].is_packed and self.shard % 2:
            raise InvalidProblem(
                f"{self.code.name} codes pack two per byte, so each shard must hold an even number of elements, "
                f"got {self.shard}; pad every shard to {self.shard + self.group_size} elements or use an even group_size"
            )
        comm = self._comm = _comm._communicator(group, self.device)
        self.world = comm.size
        self.rank = comm.rank
        scope = self._scope = GroupScope(axis=-1, group_size=self.group_size)
        self._quantize = target.select(
            DynamicRangeQuantizePlan,
            DynamicRangeQuantizeDescriptor(
                shape=(self.shard,),
                scope=scope,
                mode=self.mode,
                input_element=self.float_kind,
                output_element=self.code,
            ),
        )
        self._dequantize = target.select(
            DequantizePlan,
            DequantizeDescriptor(
                shape=(self.world * self.shard,),
                scope=scope,
                mode=self.mode,
                input_element=self.code,
                output_element=self.float_kind,
            ),
        )
        self._send = _steps._Buffers.empty(target, 1, self.shard, self.group_size, self.code, self.mode)
        self._recv = _steps._Buffers.empty(target, self.world, self.shard, self.group_size, self.code, self.mode)
        self.bytes_sent = CommBytes(intra=(self.world - 1) * self._send.row_bytes(), inter=0)

    def describe(self) -> dict[str, str]:
        """The plans of the two steps (backend and kernel variant)."""
        return {"quantize": plan_label(self._quantize), "dequantize": plan_label(self._dequantize)}

    def _check(self, output: Any, input: Any) -> None:
        _check_pair(output, input)
        if input.device != self.device or input.dtype != self.dtype:
            raise InvalidProblem(
                f"input is {input.dtype} on {input.device}, but this all-gather was built for {self.dtype} on "
                f"{self.device}"
            )
        if input.numel() != self.shard:
            raise InvalidProblem(f"input has {input.numel()} elements, but this all-gather was built for {self.shard}")
        if output.numel() != self.world * self.shard:
            raise InvalidProblem(
                f"output has {output.numel()} elements; it receives world * shard = {self.world} * {self.shard} = "
                f"{self.world * self.shard}"
            )

    def run(self, output: torch.Tensor, input: torch.Tensor) -> None:
        """Gather every rank's quantized ``input`` shard into ``output`` (rank order), dequantized.

        Checks the tensors before any work; runs on PyTorch's current stream.
        """
        self._check(output, input)
        if self.shard == 0:
            return
        send = self._send.flat()
        code, scope, asymmetric = kind_index(self.code), scope_ints(self._scope), self.mode is QuantMode.ASYMMETRIC
        dynamic_quantize_out_op(input.detach().view(-1), send.q, send.s, send.z, code, scope, asymmetric)
        for s, r in zip(self._send.tensors(), self._recv.tensors(), strict=True):
            self._comm.all_gather(s, r)
        recv = self._recv.flat()
        dequantize_out_op(recv.q, recv.s, recv.z, output.detach().view(-1), code, scope, 0)


#: Objects the function wrappers keep (least recently used dropped first; each holds its buffers).
CACHE_SIZE = 16


# ---- function wrappers over a per-process cache ------------------------------------------------


_CACHE: OrderedDict[Hashable, Any] = OrderedDict()
_CACHE_LOCK = threading.Lock()


def _cached(key: Hashable, build: Callable[[], Any]) -> Any:
    with _CACHE_LOCK:
        op = _CACHE.get(key)
        if op is not None:
            _CACHE.move_to_end(key)
            return op
    op = build()
    with _CACHE_LOCK:
        _CACHE[key] = op
        while len(_CACHE) > CACHE_SIZE:
            _CACHE.popitem(last=False)
    return op


def clear_cache() -> None:
    """Drop the cached collectives (and their staging buffers) and the cached subgroups.

    Call it before ``torch.distributed.destroy_process_group`` (the cache holds the subgroups it
    created; it also runs at interpreter exit), and in any case before initializing again.
    """
    with _CACHE_LOCK:
        _CACHE.clear()
    with _comm._HIERARCHY_LOCK:
        _comm._HIERARCHY.clear()


atexit.register(clear_cache)


def quantized_reduce_scatter(
    output: torch.Tensor,
    input: torch.Tensor,
    *,
    group: Any = None,
    nodes: int = 1,
    group_size: int = 2048,
    code: ElementKind = ElementKind.S4,
    mode: QuantMode = QuantMode.SYMMETRIC,
    average: bool = True,
) -> None:
    """ZeRO++ qgZ reduce-scatter: ``output`` = this rank's shard of the mean (``average``) or sum
    over ranks of ``input``, sent quantized (:class:`QuantizedReduceScatter` has the formula, the
    hierarchy, the limits and the error bound).

    Like ``torch.distributed.reduce_scatter_tensor(output, input)`` (op AVG / SUM) with
    ``output.numel() == input.numel() / world``; the object for this problem (plans and staging
    buffers) is built on first use and cached per process. Every rank calls it with the same
    arguments. Runs on PyTorch's current stream.
    """
    kind, device = _check_pair(output, input)
    key = ("reduce_scatter", _resolve_group(group), nodes, input.numel(), kind, device, group_size, code, mode, average)
    op = _cached(
        key,
        lambda: QuantizedReduceScatter(
            input.numel(),
            input.dtype,
            device,
            group=group,
            nodes=nodes,
            group_size=group_size,
            code=code,
            mode=mode,
            average=average,
        ),
    )
    op.run(output, input)


def quantized_all_gather(
    output: torch.Tensor,
    input: torch.Tensor,
    *,
    group: Any = None,
    group_size: int = 2048,
    code: ElementKind = ElementKind.S8,
    mode: QuantMode = QuantMode.SYMMETRIC,
) -> None:
    """ZeRO++ qwZ all-gather: ``output`` (``world * input.numel()`` elements) receives every rank's
    ``input`` shard, quantized for the wire and dequantized (:class:`QuantizedAllGather` has the
    formula, the limits and the error bound).

    Like ``torch.distributed.all_gather_into_tensor(output, input)``; cached per problem; every
    rank calls it with the same arguments; runs on PyTorch's current stream.
    """
    kind, device = _check_pair(output, input)
    key = ("all_gather", _resolve_group(group), input.numel(), kind, device, group_size, code, mode)
    op = _cached(
        key,
        lambda: QuantizedAllGather(
            input.numel(), input.dtype, device, group=group, group_size=group_size, code=code, mode=mode
        ),
    )
    op.run(output, input)


__all__ = [
    "CACHE_SIZE",
    "Implementation",
    "CommBytes",
    "QuantizedAllGather",
    "QuantizedReduceScatter",
    "clear_cache",
    "nccl_communicator",
    "quantized_all_gather",
    "quantized_reduce_scatter",
]
