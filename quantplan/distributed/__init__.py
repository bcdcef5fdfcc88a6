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
dequantize-reduce, plans or composed) in ``_steps``, the collective classes in ``_collectives``,
and the function wrappers with their per-process cache here.

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

from ..types import ElementKind, QuantMode
from ._collectives import CommBytes, QuantizedAllGather, QuantizedReduceScatter
from ._comm import _HIERARCHY, _HIERARCHY_LOCK, _resolve_group, nccl_communicator
from ._steps import Implementation, _check_pair

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
    with _HIERARCHY_LOCK:
        _HIERARCHY.clear()


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
