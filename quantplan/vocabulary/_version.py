"""The package version, apart from ``__init__`` so that the command line reads it without the API."""

from __future__ import annotations

__version__ = "0.1.0"
