"""The NVRTC options the environment adds (``QUANTPLAN_FP8_SOFTWARE``, ``QUANTPLAN_NVRTC_OPTIONS``).

Vocabulary, not machinery: both the compile layer (the cache key) and the tuning table (its
``-DQP_*`` overrides) read these options, so they sit below both and neither imports the other.
"""

from __future__ import annotations

import os
import shlex


def compile_options() -> tuple[str, ...]:
    """Extra options from the environment.

    ``QUANTPLAN_FP8_SOFTWARE=1`` forces the portable (sm_80) FP8 conversion on every arch, which
    lets a Hopper GPU test that path. ``QUANTPLAN_NVRTC_OPTIONS`` (shell-quoted) appends NVRTC
    options; both are part of the cache key. The kernels' tuning defines are not made here: the
    callers pass them (``quantplan.runtime._tuning.kernel_options``, which also reads overrides such as
    ``-DQP_QUANTIZE_MIN_BLOCKS=4`` from ``QUANTPLAN_NVRTC_OPTIONS`` into its table).
    """
    options = ["-DQP_FP8_SOFTWARE"] if os.environ.get("QUANTPLAN_FP8_SOFTWARE") == "1" else []
    options += shlex.split(os.environ.get("QUANTPLAN_NVRTC_OPTIONS", ""))
    return tuple(options)


__all__ = ["compile_options"]
