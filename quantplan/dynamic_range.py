"""Compatibility alias of :mod:`quantplan.ops.dynamic_range` (the module moved to its layer's folder; see
ARCHITECTURE.md, "Folders"). New code imports ``quantplan.ops.dynamic_range``."""

# quantplan compatibility alias (tools/relayer.py)
import sys

from quantplan.ops.dynamic_range import *  # noqa: F403

sys.modules[__name__] = sys.modules["quantplan.ops.dynamic_range"]  # the same module object
