"""Compatibility alias of :mod:`quantplan.ops.quantize_backward` (the module moved to its layer's folder; see
ARCHITECTURE.md, "Folders"). New code imports ``quantplan.ops.quantize_backward``."""

# quantplan compatibility alias (tools/relayer.py)
import sys

from quantplan.ops.quantize_backward import *  # noqa: F403

sys.modules[__name__] = sys.modules["quantplan.ops.quantize_backward"]  # the same module object
