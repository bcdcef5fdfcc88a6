"""Layer 1, the vocabulary: enums, scopes, errors, the dtype and format tables, Philox.

This ``__init__`` imports nothing: import the modules themselves."""
