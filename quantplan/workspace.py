"""Compatibility alias of :mod:`quantplan.runtime.workspace` (the module moved to its layer's folder; see
ARCHITECTURE.md, "Folders"). New code imports ``quantplan.runtime.workspace``."""

# quantplan compatibility alias (tools/relayer.py)
import sys

from quantplan.runtime.workspace import *  # noqa: F403

sys.modules[__name__] = sys.modules["quantplan.runtime.workspace"]  # the same module object
