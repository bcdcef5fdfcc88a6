"""GPU discovery and stream handling (no import of CuPy until a GPU is actually used)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

from .errors import InvalidProblem
from .types import ArchSku


@lru_cache(maxsize=1)
def cuda_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:  # no CuPy, no driver, no device: all mean "no GPU"
        return False


@dataclass(frozen=True)
class DeviceInfo:
    """The facts about one GPU that plans need at ``select``."""

    device_id: int
    arch: ArchSku
    sm_count: int


@cache
def device_info(device_id: int) -> DeviceInfo:
    """Compute capability and multiprocessor count of ``device_id``."""
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(device_id)
    return DeviceInfo(device_id, ArchSku(int(props["major"]), int(props["minor"])), int(props["multiProcessorCount"]))


_external_streams: dict[tuple[int, int], Any] = {}


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


def as_cupy_stream(stream: Any) -> Any:
    """A CuPy stream object for ``stream``.

    Accepts a CuPy ``Stream`` / ``ExternalStream``, a PyTorch ``torch.cuda.Stream`` (through its
    ``cuda_stream`` handle), a raw ``cudaStream_t`` handle as int, or None (CuPy's current stream).
    Wrappers for foreign handles are made once and reused, so this is cheap in ``run``.
    """
    import cupy

    if stream is None:
        return cupy.cuda.get_current_stream()
    if isinstance(stream, cupy.cuda.Stream) or type(stream).__name__ == "ExternalStream":
        return stream
    handle = getattr(stream, "cuda_stream", None)
    if handle is None:
        if isinstance(stream, int):
            handle = stream
        else:
            raise InvalidProblem(
                f"stream of type {type(stream).__name__} is not a CUDA stream; pass a cupy.cuda.Stream, "
                "a torch.cuda.Stream, a raw cudaStream_t int, or None for the current CuPy stream"
            )
    key = (int(handle), stream_device_id(stream) if not isinstance(stream, int) else -1)
    wrapped = _external_streams.get(key)
    if wrapped is None:
        if key[1] >= 0:
            wrapped = cupy.cuda.ExternalStream(int(handle), key[1])
        else:
            wrapped = cupy.cuda.ExternalStream(int(handle))
        _external_streams[key] = wrapped
    return wrapped


__all__ = ["DeviceInfo", "as_cupy_stream", "cuda_available", "device_info", "stream_device_id"]
