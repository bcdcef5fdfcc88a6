"""Compatibility alias of :mod:`quantplan.ops.dequant_reduce` (the module moved to its layer's folder; see
ARCHITECTURE.md, "Folders"). New code imports ``quantplan.ops.dequant_reduce``."""

# quantplan compatibility alias (tools/relayer.py)
import sys

from quantplan.ops.dequant_reduce import *  # noqa: F403

sys.modules[__name__] = sys.modules["quantplan.ops.dequant_reduce"]  # the same module object
