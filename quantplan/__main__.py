"""Command line: ``python -m quantplan precompile [sm_90 ...]`` fills the kernel cache ahead of use;
``python -m quantplan info`` prints the version, backend and GPU."""

from __future__ import annotations

import sys

from . import __version__, compiler
from ._device import cuda_available, device_info
from ._precompile import precompile
from .types import ArchSku


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "info"
    if command == "precompile":
        archs = argv[1:] or ["sm_90"]
        for arch in archs:
            target = ArchSku.from_compute_capability(arch.removeprefix("sm_"))
            count = precompile(target)
            print(f"compiled {count} units for {target.nvrtc_arch} into {compiler.cache_dir()}")
        return 0
    if command == "info":
        print(f"quantplan {__version__}")
        if cuda_available():
            info = device_info(0)
            print(f"backend: CUDA on device 0 ({info.arch.name}, {info.sm_count} SMs)")
        else:
            print("backend: REFERENCE (NumPy); no CUDA GPU visible")
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
