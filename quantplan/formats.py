"""Compatibility alias of :mod:`quantplan.vocabulary.formats` (the module moved to its layer's folder; see
ARCHITECTURE.md, "Folders"). New code imports ``quantplan.vocabulary.formats``."""

# quantplan compatibility alias (tools/relayer.py)
import sys

from quantplan.vocabulary.formats import *  # noqa: F403

sys.modules[__name__] = sys.modules["quantplan.vocabulary.formats"]  # the same module object
