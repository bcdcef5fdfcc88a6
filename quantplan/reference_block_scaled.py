"""Compatibility alias of :mod:`quantplan.reference.block_scaled` (the module moved to its layer's folder; see
ARCHITECTURE.md, "Folders"). New code imports ``quantplan.reference.block_scaled``."""

# quantplan compatibility alias (tools/relayer.py)
import sys

from quantplan.reference.block_scaled import *  # noqa: F403

sys.modules[__name__] = sys.modules["quantplan.reference.block_scaled"]  # the same module object
