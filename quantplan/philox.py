"""Compatibility alias of :mod:`quantplan.vocabulary.philox` (the module moved to its layer's folder; see
ARCHITECTURE.md, "Folders"). New code imports ``quantplan.vocabulary.philox``."""

# quantplan compatibility alias (tools/relayer.py)
import sys

from quantplan.vocabulary.philox import *  # noqa: F403

sys.modules[__name__] = sys.modules["quantplan.vocabulary.philox"]  # the same module object
