"""Layer 2, the machinery two op modules share: devices, operands, layouts, kernel names and
tuning, the compile layer, launches, the fast path and the ``Plan`` base.

This ``__init__`` imports nothing: import the modules themselves."""
