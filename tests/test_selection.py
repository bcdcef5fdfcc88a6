"""Selection in one module changed no default choice (CPU, simulated A100 and H100).

``tests/data/selection_snapshot.json`` was recorded from the code before the affine plans'
schedule choice moved to :mod:`quantplan.runtime._selection` (``tests/selection_snapshot.py``): per
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


#: The name of each plan's op in ``quantplan.runtime._selection.SCHEDULES``.
OPS = {
    "DynamicRangeQuantizePlan": "dynamic_quantize",
    "DynamicRangeFakeQuantizePlan": "dynamic_fake_quantize",
    "QuantizePlan": "quantize",
    "DequantizePlan": "dequantize",
    "FakeQuantizePlan": "fake_quantize",
    "SwizzledQuantizePlan": "swizzled_quantize",
    "DeepSpeedQuantizePlan": "deepspeed_quantize",
    "MoQFakeQuantizePlan": "moq_fake_quantize",
    "DeepSpeedReducePlan": "deepspeed_reduce",
}


def test_forcing_a_schedule_selects_it_and_the_default_is_one_of_them() -> None:
    """On a sample of the grid, on both simulated GPUs: forcing each of a plan's schedules either
    refuses (Unsupported, at ``select``) or selects, and only kernels of the plan's listed units
    (the simulated loader has no other name); every schedule is selected on some problem (the
    cluster schedules on sm_90 only); and forcing some schedule reproduces the default
    selection record for record (kernels, grids, argument bytes, alignments)."""
    import quantplan as qp
    from quantplan.runtime._selection import SCHEDULES

    stride = 17
    default = selection_snapshot.snapshot(stride=stride)
    forced: dict[str, dict[str, str]] = {}
    for schedule in dict.fromkeys(s for names in SCHEDULES.values() for s in names):

        def select(cls: type, desc: object, schedule: str = schedule) -> object:
            if schedule not in SCHEDULES[OPS[cls.__name__]]:
                raise qp.Unsupported("not a schedule of this plan")
            return cls.select(None, desc, qp.PlanPreference(schedule=schedule))  # type: ignore[attr-defined]

        forced[schedule] = selection_snapshot.snapshot(select, stride, refusals=True)
    for key, record in default.items():
        assert any(f.get(key) == record for f in forced.values()), key
    for op, schedules in SCHEDULES.items():
        plan = next(p for p, o in OPS.items() if o == op)
        for schedule in schedules:
            for gpu in ("sm80x108", "sm90x132"):
                served = [k for k, v in forced[schedule].items() if k.startswith(f"{gpu}:{plan}:") and "|" in v]
                if schedule == "cluster" and gpu == "sm80x108":
                    assert not served, (plan, schedule, served[:2])
                else:
                    assert served, (plan, schedule, gpu)
