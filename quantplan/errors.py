"""Compatibility alias of :mod:`quantplan.vocabulary.errors` (the module moved to its layer's folder; see
ARCHITECTURE.md, "Folders"). New code imports ``quantplan.vocabulary.errors``."""

# quantplan compatibility alias (tools/relayer.py)
import sys

from quantplan.vocabulary.errors import *  # noqa: F403

sys.modules[__name__] = sys.modules["quantplan.vocabulary.errors"]  # the same module object
