"""Compatibility alias of :mod:`quantplan.ops.swizzled_quantize` (the module moved to its layer's folder; see
ARCHITECTURE.md, "Folders"). New code imports ``quantplan.ops.swizzled_quantize``."""

# quantplan compatibility alias (tools/relayer.py)
import sys

from quantplan.ops.swizzled_quantize import *  # noqa: F403

sys.modules[__name__] = sys.modules["quantplan.ops.swizzled_quantize"]  # the same module object
