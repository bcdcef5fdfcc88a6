"""One launch of each named block-scaled workload inside an NVTX range, for Nsight Compute.

    ncu --nvtx --nvtx-include "bs/" --set full -o OUT python3 benchmarks/profile_block_scaled.py [LABEL ...]

Labels (8192 x 8192 bf16 unless the label says fp16): ``nvfp4``, ``nvfp4-fp16``, ``nvfp4-sr`` (stochastic), ``mxfp4``,
``fp8-128x128-div``, ``mxfp8-fused``, ``fp8-1x128-fused-div``, ``fp8-1x128-fused-enc``, ``mxfp8``.
Each workload is launched once untimed (compile, warm-up) and once inside the NVTX range ``bs``, in the order
named (the report lists them in that order).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
for _p in (str(_HERE), str(_HERE.parent)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from bench_block_scaled import _ours, _ours_tiles  # noqa: E402

WORKLOADS: dict[str, tuple[str, bool | None, dict[str, Any]]] = {
    # label: (dtype, fused (None: the 1-D kernel), kwargs)
    "nvfp4": ("bf16", None, {"element": "nvfp4", "block": 16, "rule": "te", "tensor_amax": "given"}),
    "nvfp4-fp16": ("fp16", None, {"element": "nvfp4", "block": 16, "rule": "te", "tensor_amax": "given"}),
    "nvfp4-sr": (
        "bf16",
        None,
        {
            "element": "nvfp4",
            "block": 16,
            "rule": "te",
            "tensor_amax": "given",
            "rounding": "stochastic",
            "seed": 7,
            "offset": 3,
        },
    ),
    "mxfp4": ("bf16", None, {"element": "e2m1", "block": 32, "rule": "rceil"}),
    "mxfp8": ("bf16", None, {"element": "e4m3", "block": 32, "rule": "rceil"}),
    "fp8-128x128-div": ("bf16", False, {"block": (128, 128), "rule": "div"}),
    "mxfp8-fused": ("bf16", True, {"block": 32, "rule": "rceil"}),
    "fp8-1x128-fused-div": ("bf16", True, {"block": 128, "rule": "div"}),
    "fp8-1x128-fused-enc": ("bf16", True, {"block": 128, "rule": "enc"}),
}


def main(labels: list[str]) -> None:
    import torch

    for label in labels or list(WORKLOADS):
        dname, fused, kw = WORKLOADS[label]
        dtype = torch.bfloat16 if dname == "bf16" else torch.float16
        x = torch.randn((8192, 8192), device="cuda", dtype=torch.float32).mul_(4).to(dtype)
        fn = _ours(x, **kw) if fused is None else _ours_tiles(x, fused, **kw)
        fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push("bs")
        fn()
        torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
        print(label, "done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
