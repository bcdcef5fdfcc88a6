"""Selection in one module changed no default choice (CPU, simulated A100 and H100).

``tests/data/selection_snapshot.json`` was recorded from the code before the affine plans'
schedule choice moved to :mod:`quantplan._selection` (``tests/selection_snapshot.py``): per
bucket of problems, a digest of each plan's variant, workspace, kernels (name expression, grid,
block, argument bytes at ``select``) and run-time alignments. The current code must select the
same, bucket for bucket.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("cupy")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import selection_snapshot  # noqa: E402


def test_default_selection_is_unchanged() -> None:
    """Every problem of the snapshot grid selects what it selected before, on both GPUs."""
    fixture = json.loads(selection_snapshot.FIXTURE.read_text())
    records = selection_snapshot.snapshot()
    assert len(records) == fixture["records"]
    now = selection_snapshot.digests(records)
    assert now.keys() == fixture["digests"].keys()
    changed = [b for b, digest in fixture["digests"].items() if now[b] != digest]
    assert not changed, f"{len(changed)} buckets select differently, e.g. {changed[:5]}"
