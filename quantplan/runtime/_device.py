"""GPU discovery and stream handling (no import of CuPy until a GPU is actually used)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from quantplan.runtime._cuda import cuda_available
from quantplan.vocabulary.types import ArchSku


@dataclass(frozen=True)
class DeviceInfo:
    """The facts about one GPU that plans need at ``select``."""

    device_id: int
    arch: ArchSku
    sm_count: int

    @property
    def busy_threads(self) -> int:
        """Threads that keep every multiprocessor busy (2048 resident per SM): sizes small-problem grids."""
        return self.sm_count * 2048


@cache
def device_info(device_id: int) -> DeviceInfo:
    """Compute capability and multiprocessor count of ``device_id``."""
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(device_id)
    return DeviceInfo(device_id, ArchSku(int(props["major"]), int(props["minor"])), int(props["multiProcessorCount"]))


def stream_device_id(stream: Any) -> int:
    """Device a stream belongs to (the current device when it cannot tell)."""
    import cupy

    device = getattr(stream, "device", None)
    if device is not None:
        index = getattr(device, "index", None)
        if index is not None:
            return int(index)
        dev_id = getattr(device, "id", None)
        if dev_id is not None:
            return int(dev_id)
    device_id = getattr(stream, "device_id", None)
    if isinstance(device_id, int) and device_id >= 0:
        return device_id
    return int(cupy.cuda.runtime.getDevice())


__all__ = ["DeviceInfo", "cuda_available", "device_info", "stream_device_id"]
