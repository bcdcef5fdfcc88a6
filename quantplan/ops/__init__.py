"""Layer 4, the op modules: the descriptor, Args and plan of one op family each.

This ``__init__`` imports nothing: import the modules themselves."""
