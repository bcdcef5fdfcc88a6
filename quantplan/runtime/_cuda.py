"""Whether CUDA is usable here: one cached probe, below the device facts (:mod:`quantplan.runtime._device`,
which re-exports it) so that the workspace reads it without the vocabulary's models."""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def cuda_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:  # no CuPy, no driver, no device: all mean "no GPU"
        return False


__all__ = ["cuda_available"]
