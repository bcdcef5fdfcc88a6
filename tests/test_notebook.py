"""CPU: the tour notebook (examples/tour.ipynb) executes top to bottom on the reference backend.

Needs nbclient, nbformat, ipykernel and matplotlib (the ``notebook`` extra); without them the test
skips, except in CI (``CI`` set), where a missing package is a failure.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parent.parent / "examples" / "tour.ipynb"


def _import_or_skip(name: str):  # noqa: ANN202
    try:
        return __import__(name)
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"{name} is not installed (pip install -e '.[notebook]')")


def test_the_tour_notebook_runs_and_draws_its_figures() -> None:
    nbformat = _import_or_skip("nbformat")
    nbclient = _import_or_skip("nbclient")
    _import_or_skip("matplotlib")
    _import_or_skip("ipykernel")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not cell.get("outputs") for cell in nb.cells if cell.cell_type == "code"), (
        "commit it with outputs cleared"
    )
    nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    ).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "QuantizedTensor(" in text and "relative RMSE" in text
    # The error-against-bits figure carries the block-scaled formats (one printed line each).
    for name in ("MXFP8", "MXFP6", "MXFP4", "MXINT8", "NVFP4", "FP8 1x128", "FP8 128x128"):
        assert f"{name}" in text and "bits/element" in text, name
    figures = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(figures) >= 3, f"{len(figures)} figures drawn"
