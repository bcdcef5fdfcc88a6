"""Multi-GPU tests of ``quantplan.distributed`` over NCCL, one process per GPU.

Each test launches ``tests/_distributed_worker.py`` under ``python -m torch.distributed.run``
(2 GPUs flat; 4 GPUs as 2 "nodes" x 2 devices, the hierarchical path) and asserts on the exit
code and the JSON report every rank writes: quantized reduce-scatter and all-gather against
NCCL's full-precision ``reduce_scatter_tensor`` / ``all_gather_into_tensor`` on the same data
(within the documented bound), bit for bit against the CPU reference composition, two runs
bitwise identical, the plans and the composed implementation identical, and (when CuPy's NCCL
binding is available) the CuPy NCCL communicator identical to the torch.distributed path.

Skipped unless PyTorch is installed and sees enough CUDA devices.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "_distributed_worker.py"


@pytest.mark.parametrize(("nproc", "nodes"), [(2, 1), (4, 2)], ids=["2gpu-flat", "4gpu-2nodes-x-2"])
def test_quantized_collectives_on_gpus(nproc: int, nodes: int, tmp_path: Path) -> None:
    if not torch.cuda.is_available() or torch.cuda.device_count() < nproc:
        pytest.skip(f"needs {nproc} CUDA devices visible to PyTorch")
    if not torch.distributed.is_available() or not torch.distributed.is_nccl_available():
        pytest.skip("PyTorch was built without NCCL")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        str(WORKER),
        "--nodes",
        str(nodes),
        "--out",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    log = f"--- stdout ---\n{proc.stdout[-6000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"
    reports = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(tmp_path.glob("rank*.json"))]
    assert len(reports) == nproc, f"{len(reports)} of {nproc} ranks wrote a report (exit {proc.returncode})\n{log}"
    failures = [f"rank {r['rank']} (seed {r['seed']}): {f}" for r in reports for f in r["failures"]]
    assert not failures, "\n".join(failures)
    assert proc.returncode == 0, log
    for r in reports:
        assert r["world"] == nproc and r["nodes"] == nodes
        names = [c["name"] for c in r["cases"]]
        assert any(n.startswith("rs/") and n.endswith("/auto") for n in names)
        assert any(n.startswith("ag/") for n in names)
        if nodes > 1:
            assert all(
                "reduce_inter" in c["describe"] for c in r["cases"] if c["name"].endswith(("/auto", "/composed"))
            )
