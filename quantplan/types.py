"""Compatibility alias of :mod:`quantplan.vocabulary.types` (the module moved to its layer's folder; see
ARCHITECTURE.md, "Folders"). New code imports ``quantplan.vocabulary.types``."""

# quantplan compatibility alias (tools/relayer.py)
import sys

from quantplan.vocabulary.types import *  # noqa: F403

sys.modules[__name__] = sys.modules["quantplan.vocabulary.types"]  # the same module object
