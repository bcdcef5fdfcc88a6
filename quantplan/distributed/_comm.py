"""Communicators of the quantized collectives: ``all_to_all`` / ``all_gather`` of byte blocks over
a ``torch.distributed`` ProcessGroup or a CuPy NCCL communicator, and the intra-node / inter-node
split of the hierarchy (created once per (communicator, nodes) and cached)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from quantplan._frontend import Target
from quantplan.vocabulary.errors import InvalidProblem, Unsupported


class _Comm:
    """A communicator: ``size`` ranks, this one ``rank``; byte-for-byte all-to-all and all-gather."""

    size: int
    rank: int

    def all_to_all(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        """Row block ``j`` of ``send`` goes to rank ``j``; row block ``j`` of ``recv`` comes from rank ``j``."""
        raise NotImplementedError

    def all_gather(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        """``recv`` (``size`` times ``send``'s elements) holds every rank's ``send``, rank order."""
        raise NotImplementedError

    def split(self, nodes: int) -> tuple[_Comm, _Comm]:
        """The (intra-node, inter-node) communicators of ``nodes`` blocks of consecutive ranks."""
        raise NotImplementedError

    def key(self) -> Hashable:
        raise NotImplementedError


class _LocalComm(_Comm):
    """A communicator of one rank: the collectives are copies."""

    def __init__(self) -> None:
        self.size = 1
        self.rank = 0

    def all_to_all(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        recv.copy_(send)

    def all_gather(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        recv.view(-1).copy_(send.view(-1))

    def split(self, nodes: int) -> tuple[_Comm, _Comm]:
        return self, self

    def key(self) -> Hashable:
        return "local"


_all_gather_single: Callable[..., Any] = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class _TorchComm(_Comm):
    """A ``torch.distributed`` ProcessGroup (NCCL for CUDA tensors, gloo for CPU tensors)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.size = int(dist.get_world_size(group))
        self.rank = int(dist.get_rank(group))

    def all_to_all(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        dist.all_to_all_single(recv, send, group=self.group)

    def all_gather(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        _all_gather_single(recv.view(-1), send.view(-1), group=self.group)

    def key(self) -> Hashable:
        return ("torch", self.group)

    def split(self, nodes: int) -> tuple[_Comm, _Comm]:
        # Every member of ``group`` creates every subgroup, in the same order (intra-node groups by
        # node, then inter-node groups by local device), as torch.distributed requires. Subgroups of
        # the default group synchronize globally; those of a user subgroup locally (members only).
        dpn = self.size // nodes
        ranks = [int(dist.get_global_rank(self.group, i)) for i in range(self.size)]
        local = self.group is not dist.group.WORLD
        kwargs: dict[str, Any] = {"use_local_synchronization": True} if local else {}

        def make(members: list[int]) -> Any:
            if sorted(members) != members:
                raise Unsupported(
                    "the group's ranks are not in increasing global order, so its subgroups would number "
                    "their members differently; create the group with sorted ranks"
                )
            return dist.new_group(members, **kwargs)

        node, device = divmod(self.rank, dpn)
        intra: _Comm = _LocalComm()
        inter: _Comm = _LocalComm()
        if dpn > 1:
            for n in range(nodes):
                pg = make([ranks[n * dpn + d] for d in range(dpn)])
                if n == node:
                    intra = _TorchComm(pg)
        if nodes > 1:
            for d in range(dpn):
                pg = make([ranks[n * dpn + d] for n in range(nodes)])
                if d == device:
                    inter = _TorchComm(pg)
        assert intra.rank == (device if dpn > 1 else 0) and inter.rank == (node if nodes > 1 else 0)
        return intra, inter


def _nccl_module() -> Any:
    try:
        from cupy.cuda import nccl
    except ImportError as exc:
        raise Unsupported(
            'the CuPy NCCL path needs CuPy: python -m pip install -e ".[cuda12]" (or ".[cuda13]") in the quantplan checkout'
        ) from exc
    if not getattr(nccl, "available", False) or not hasattr(nccl, "NcclCommunicator"):
        raise Unsupported(
            "CuPy's NCCL binding is not available (libnccl could not be loaded): install NCCL for CuPy "
            "(e.g. pip install nvidia-nccl-cu12) or pass a torch.distributed NCCL process group instead"
        )
    return nccl


class _CupyComm(_Comm):
    """A ``cupy.cuda.nccl.NcclCommunicator``: all-to-all as grouped send / recv pairs, ``allGather``.

    Buffers travel as bytes (``NCCL_UINT8``) on PyTorch's current stream of the communicator's device.
    """

    def __init__(self, comm: Any) -> None:
        self.nccl = _nccl_module()
        self.comm = comm
        self.size = int(comm.size())
        self.rank = int(comm.rank_id())
        self.device = torch.device("cuda", int(comm.device_id()))

    def _stream(self) -> int:
        """The raw handle of PyTorch's current stream of the communicator's device."""
        return int(Target.of_torch_device(self.device).handle)  # type: ignore[arg-type]

    def all_to_all(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        nbytes = send.numel() * send.element_size()
        chunk = nbytes // self.size
        stream = self._stream()
        nccl = self.nccl
        src, dst = send.data_ptr(), recv.data_ptr()
        nccl.groupStart()
        try:
            for peer in range(self.size):
                self.comm.send(src + peer * chunk, chunk, nccl.NCCL_UINT8, peer, stream)
                self.comm.recv(dst + peer * chunk, chunk, nccl.NCCL_UINT8, peer, stream)
        finally:
            nccl.groupEnd()

    def all_gather(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        nbytes = send.numel() * send.element_size()
        self.comm.allGather(send.data_ptr(), recv.data_ptr(), nbytes, self.nccl.NCCL_UINT8, self._stream())

    def key(self) -> Hashable:
        return ("cupy", self.comm)

    def split(self, nodes: int) -> tuple[_Comm, _Comm]:
        # Each rank draws two NCCL unique ids (one for an intra-node, one for an inter-node
        # communicator), all ranks all-gather them over this communicator, and each subgroup uses
        # the ids of its first member. Every rank then initializes its intra-node communicator and
        # then its inter-node one (ncclCommInitRank blocks until the group's members join; this
        # order cannot deadlock).
        import cupy

        nccl = self.nccl
        dpn = self.size // nodes
        node, device = divmod(self.rank, dpn)
        first, second = nccl.get_unique_id(), nccl.get_unique_id()
        as_bytes = isinstance(first, (bytes, bytearray))  # CuPy 14: bytes; older: a tuple of ints
        ids = list(first) + list(second)
        signed = any(v < 0 for v in ids)
        send = torch.tensor([v & 0xFF for v in ids], dtype=torch.uint8, device=self.device)
        recv = torch.empty(self.size * send.numel(), dtype=torch.uint8, device=self.device)
        self.all_gather(send, recv)
        table = recv.cpu().numpy().reshape(self.size, 2, -1)  # .cpu() waits for the current stream

        def unique_id(rank: int, which: int) -> bytes | tuple[int, ...]:
            row = table[rank, which]
            if as_bytes:
                return row.tobytes()
            return tuple(int(v) for v in (row.view(np.int8) if signed else row))

        intra: _Comm = _LocalComm()
        inter: _Comm = _LocalComm()
        with cupy.cuda.Device(self.device.index):
            if dpn > 1:
                intra = _CupyComm(nccl.NcclCommunicator(dpn, unique_id(node * dpn, 0), device))
            if nodes > 1:
                inter = _CupyComm(nccl.NcclCommunicator(nodes, unique_id(device, 1), node))
        return intra, inter


def _is_cupy_comm(group: Any) -> bool:
    return type(group).__module__.startswith("cupy") and hasattr(group, "rank_id") and hasattr(group, "allGather")


def _resolve_group(group: Any) -> Hashable:
    """``group`` as a cache key: None becomes the current default ProcessGroup."""
    if group is None and dist.is_available() and dist.is_initialized():
        return dist.group.WORLD
    return group


def _communicator(group: Any, device: torch.device) -> _Comm:
    """The communicator for ``group`` and tensors on ``device`` (InvalidProblem when they do not fit)."""
    if group is None or isinstance(group, dist.ProcessGroup):
        if not (dist.is_available() and dist.is_initialized()):
            raise InvalidProblem(
                "torch.distributed is not initialized: call torch.distributed.init_process_group first "
                "(backend 'nccl' for CUDA tensors, 'gloo' for CPU tensors), e.g. under torchrun"
            )
        pg: Any = group if group is not None else dist.group.WORLD
        if dist.get_rank(pg) < 0:
            raise InvalidProblem("this process is not a member of the process group it was given")
        backend = str(dist.get_backend(pg))
        if device.type == "cpu" and backend == "nccl":
            raise InvalidProblem(
                "CPU tensors cannot travel over an NCCL process group; use a gloo group "
                "(or 'cpu:gloo,cuda:nccl') for CPU tensors, or move them to the GPU"
            )
        return _TorchComm(pg)
    if _is_cupy_comm(group):
        comm = _CupyComm(group)
        if device != comm.device:
            raise InvalidProblem(
                f"tensors live on {device}, but the CuPy NCCL communicator drives {comm.device}; "
                f"CuPy NCCL communicators take CUDA tensors of their own device"
            )
        return comm
    raise InvalidProblem(
        f"group is a {type(group).__name__}; pass None, a torch.distributed ProcessGroup or a "
        f"cupy.cuda.nccl.NcclCommunicator"
    )


_HIERARCHY: dict[tuple[Hashable, int], tuple[_Comm, _Comm]] = {}
_HIERARCHY_LOCK = threading.Lock()


def _hierarchy(comm: _Comm, nodes: int) -> tuple[_Comm, _Comm]:
    """(intra-node, inter-node) communicators, created once per (communicator, nodes)."""
    dpn = comm.size // nodes
    if nodes == 1:
        return comm, _LocalComm()
    if dpn == 1:
        return _LocalComm(), comm
    key = (comm.key(), nodes)
    with _HIERARCHY_LOCK:
        found = _HIERARCHY.get(key)
        if found is None:
            found = _HIERARCHY[key] = comm.split(nodes)
    return found


def nccl_communicator(group: Any = None) -> Any:
    """A ``cupy.cuda.nccl.NcclCommunicator`` over the ranks of a ``torch.distributed`` group.

    Rank 0 of ``group`` draws the NCCL unique id and ``torch.distributed.broadcast_object_list``
    hands it to the others; each process then joins with its group rank on PyTorch's current CUDA
    device. Collective: every member calls it. Pass the result as ``group=`` to the collectives of
    this module to drive NCCL through CuPy instead of ``torch.distributed``.

    Raises Unsupported when CuPy or its NCCL binding (``cupy.cuda.nccl.available``) is missing.
    """
    nccl = _nccl_module()
    import cupy

    if not (dist.is_available() and dist.is_initialized()):
        raise InvalidProblem("torch.distributed is not initialized: call torch.distributed.init_process_group first")
    pg: Any = group if group is not None else dist.group.WORLD
    rank = dist.get_rank(pg)
    box: list[Any] = [nccl.get_unique_id() if rank == 0 else None]
    dist.broadcast_object_list(box, src=int(dist.get_global_rank(pg, 0)), group=pg)
    with cupy.cuda.Device(torch.cuda.current_device()):
        uid = box[0]  # bytes in CuPy 14, a tuple of ints in older releases
        uid = bytes(uid) if isinstance(uid, (bytes, bytearray)) else tuple(uid)
        return nccl.NcclCommunicator(int(dist.get_world_size(pg)), uid, int(rank))
