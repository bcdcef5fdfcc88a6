"""Compatibility alias of :mod:`quantplan.runtime.compiler` (the module moved to its layer's folder; see
ARCHITECTURE.md, "Folders"). New code imports ``quantplan.runtime.compiler``."""

# quantplan compatibility alias (tools/relayer.py)
import sys

from quantplan.runtime.compiler import *  # noqa: F403

sys.modules[__name__] = sys.modules["quantplan.runtime.compiler"]  # the same module object
