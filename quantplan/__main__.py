"""Command line of quantplan.

``python -m quantplan info`` prints the version, the backend, the GPU, the CuPy / NVRTC / driver
versions and the kernel cache; ``python -m quantplan precompile [sm_90 ...]`` fills the kernel cache
ahead of use (no GPU needed), with progress; ``--check`` recompiles every unit (a full NVRTC check).

Exit status: 0 on success, 1 when a dependency is missing or a kernel does not compile (one line
on stderr naming the fix), 2 for bad arguments, 130 when interrupted (Ctrl-C stops ``precompile``
and its compiler processes at once; the units finished so far stay in the cache).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from quantplan.runtime import compiler
from quantplan.runtime._device import cuda_available, device_info
from quantplan.runtime._families import FAMILIES
from quantplan.runtime._precompile import INSTALL_HINT, check_nvrtc, precompile
from quantplan.vocabulary._version import __version__
from quantplan.vocabulary.errors import KernelCompileError, QuantPlanError
from quantplan.vocabulary.types import ArchSku


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m quantplan", description="quantplan: GPU quantization kernels behind a plan-based API."
    )
    parser.add_argument("--version", action="version", version=f"quantplan {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="{info,precompile}")
    commands.add_parser("info", help="version, backend, GPU, CuPy / NVRTC / driver versions and the kernel cache")
    pre = commands.add_parser(
        "precompile",
        help="compile every kernel unit for the given architectures into the cache (no GPU needed; "
        "tens of minutes per architecture on a 2-core machine)",
        description="Compile every kernel unit of every family into the on-disk cache, so no select() waits for "
        "NVRTC. Architectures as sm_80, sm_90 (or 90, 9.0); default: the visible GPU's, else sm_90. "
        "All families take tens of minutes per architecture on a 2-core machine (parallel: --jobs); "
        "Ctrl-C stops it at once, keeping the units already compiled. Needs CuPy and NVRTC "
        "(the cuda12 or cuda13 extra), no GPU.",
    )
    pre.add_argument("archs", nargs="*", metavar="ARCH", help="e.g. sm_80 sm_90")
    pre.add_argument("--family", action="append", choices=sorted(FAMILIES), help="only this family (repeatable)")
    pre.add_argument("--jobs", type=int, default=None, help="parallel compiler processes (default: one per CPU)")
    pre.add_argument("--check", action="store_true", help="recompile what the cache already holds (full NVRTC check)")
    return parser


def _fail(message: str, status: int = 2) -> int:
    print(f"python -m quantplan: error: {message}", file=sys.stderr)
    return status


class _ProgressLine:
    """Units done / total and elapsed time: a tqdm bar when tqdm is installed, else one updating line."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.start = time.perf_counter()
        self.bar: Any = None
        try:
            from tqdm import tqdm  # type: ignore[import-untyped]

            self.bar = tqdm(desc=label, unit="unit", file=sys.stderr)
        except ImportError:
            pass

    def __call__(self, done: int, total: int) -> None:
        if self.bar is not None:
            self.bar.total = total
            self.bar.update(done - self.bar.n)
            return
        elapsed = time.perf_counter() - self.start
        end = "\n" if done == total else ""
        print(f"\r{self.label}: {done}/{total} units, {elapsed:.0f} s", end=end, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _precompile(args: argparse.Namespace) -> int:
    try:
        archs = [ArchSku.parse(a) for a in args.archs]
    except QuantPlanError as exc:
        return _fail(str(exc))
    if not archs:
        archs = [device_info(0).arch] if cuda_available() else [ArchSku(9, 0)]
    if args.jobs is not None and args.jobs < 1:
        return _fail(f"--jobs {args.jobs}: give at least 1")
    try:
        check_nvrtc()  # before any progress line: no CuPy / NVRTC is one line naming the extra
    except QuantPlanError as exc:
        return _fail(str(exc), 1)
    for arch in archs:
        show = _ProgressLine(f"precompile {arch.nvrtc_arch}")
        start = time.perf_counter()
        try:
            count = precompile(arch, args.family, args.jobs, check=args.check, progress=show)
        except KeyboardInterrupt:
            show.close()
            print(
                f"\nprecompile {arch.nvrtc_arch}: interrupted after {time.perf_counter() - start:.0f} s; "
                f"compiler processes stopped, finished units kept in {compiler.cache_dir()}",
                file=sys.stderr,
            )
            return 130
        except KernelCompileError as exc:
            show.close()
            print(exc, file=sys.stderr)  # the NVRTC log: many lines, all of them needed
            return 1
        except QuantPlanError as exc:  # e.g. no CuPy / NVRTC: one line naming the extra to install
            show.close()
            return _fail(str(exc), 1)
        show.close()
        print(
            f"compiled {count} units for {arch.nvrtc_arch} in {time.perf_counter() - start:.0f} s "
            f"into {compiler.cache_dir()}"
        )
    return 0


def _info() -> int:
    print(f"quantplan {__version__}")
    try:
        import cupy

        print(f"cupy {cupy.__version__}")
    except ImportError:
        print(f"cupy: not installed (the reference backend runs; for the CUDA kernels: {INSTALL_HINT})")
    try:
        major, minor = compiler.nvrtc_version()
        print(f"nvrtc {major}.{minor}")
    except Exception as exc:  # NVRTC missing or unloadable: say why, do not fail
        print(f"nvrtc: not available ({type(exc).__name__}: {exc})")
    if cuda_available():
        from cupy.cuda import runtime

        driver = runtime.driverGetVersion()
        info = device_info(0)
        print(f"driver: CUDA {driver // 1000}.{driver % 1000 // 10}")
        print(f"backend: CUDA on device 0 ({info.arch.name}, {info.sm_count} SMs)")
    else:
        print("backend: REFERENCE (NumPy); no CUDA GPU visible")
    cache = compiler.cache_dir()
    files = [p for p in cache.glob("*") if p.is_file()] if cache.is_dir() else []
    size = sum(p.stat().st_size for p in files)
    print(f"kernel cache: {cache} ({len(files)} files, {size / 2**20:.1f} MiB)")
    return 0


def main(argv: list[str]) -> int:
    """Run the command line with ``argv`` (without the program name); returns the exit status."""
    args = _parser().parse_args(argv)
    if args.command == "precompile":
        return _precompile(args)
    return _info()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
