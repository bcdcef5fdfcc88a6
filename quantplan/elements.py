"""Compatibility alias of :mod:`quantplan.vocabulary.elements` (the module moved to its layer's folder; see
ARCHITECTURE.md, "Folders"). New code imports ``quantplan.vocabulary.elements``."""

# quantplan compatibility alias (tools/relayer.py)
import sys

from quantplan.vocabulary.elements import *  # noqa: F403

sys.modules[__name__] = sys.modules["quantplan.vocabulary.elements"]  # the same module object
