"""Compatibility alias of :mod:`quantplan.ops.block_scaled` (the module moved to its layer's folder; see
ARCHITECTURE.md, "Folders"). New code imports ``quantplan.ops.block_scaled``."""

# quantplan compatibility alias (tools/relayer.py)
import sys

from quantplan.ops.block_scaled import *  # noqa: F403

sys.modules[__name__] = sys.modules["quantplan.ops.block_scaled"]  # the same module object
