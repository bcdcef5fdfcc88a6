"""Filling the kernel cache ahead of use: every compile unit of the families of :mod:`quantplan._families`.

``python -m quantplan precompile sm_90`` runs :func:`precompile`; no GPU is needed (NVRTC only).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence

from ._families import FAMILIES, compile_units
from ._tuning import kernel_options
from .compiler import compile_instantiations, nvrtc_version
from .errors import Unsupported
from .types import ArchSku

#: ``progress(done, total)`` after each compile unit.
Progress = Callable[[int, int], None]

#: What to install when NVRTC cannot be loaded (the extras of a checkout; quantplan is not on PyPI).
INSTALL_HINT = (
    'in the quantplan checkout, python -m pip install -e ".[cuda13]" (CUDA 13 driver) or -e ".[cuda12]" (CUDA 12); '
    'from a wheel, python -m pip install "quantplan-<version>-py3-none-any.whl[cuda13]"'
)


def _compile_unit_job(job: tuple[str, list[str], str, tuple[str, ...], bool]) -> str:
    family, names, arch, options, use_cache = job
    compile_instantiations(family, names, ArchSku.parse(arch), options, use_cache=use_cache)
    return family


def _worker_ignores_interrupt() -> None:
    """Pool initializer: Ctrl-C reaches the whole process group; only the parent handles it
    (by terminating the workers), so a worker never turns it into a half-reported job error."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def check_nvrtc() -> None:
    """Unsupported, naming the extra to install, unless CuPy and its NVRTC library load."""
    try:
        nvrtc_version()
    except ImportError:
        raise Unsupported(
            f"precompile compiles with NVRTC through CuPy, which is not installed: {INSTALL_HINT}"
        ) from None
    except Exception as exc:  # CuPy present, the NVRTC library missing or unloadable
        raise Unsupported(
            f"NVRTC could not be loaded ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
            f"install the NVRTC of your CUDA version: {INSTALL_HINT}"
        ) from None


def precompile(
    arch: ArchSku,
    families: Sequence[str] | None = None,
    jobs: int | None = None,
    *,
    check: bool = False,
    progress: Progress | None = None,
) -> int:
    """Fill the on-disk cache with every compile unit of ``families`` (default: all) for ``arch``.

    **When to use:** before a first run on a fresh machine (a container image, a CI cache), so no
    ``select`` waits for NVRTC. Units compile in parallel processes (``jobs``, default one per
    CPU): all families for one architecture take tens of minutes on a 2-core machine.
    ``check=True`` compiles every unit even when the cache holds it (a full NVRTC check of every
    instantiation). ``progress(done, total)`` is called after each unit. Returns the number of
    units compiled.

    Raises :class:`~quantplan.Unsupported` (naming the extra to install) before starting any
    process when CuPy or its NVRTC cannot be loaded. On any exception in the parent, a
    ``KeyboardInterrupt`` (Ctrl-C) included, the worker processes are terminated at once and the
    exception propagates; units finished before it stay in the cache.
    """
    from multiprocessing import Pool

    check_nvrtc()
    chosen = list(families) if families else sorted(FAMILIES)
    work = [(f, unit, arch.nvrtc_arch, kernel_options(), not check) for f in chosen for unit in compile_units(f)]
    done = 0
    pool = Pool(processes=jobs or os.cpu_count(), initializer=_worker_ignores_interrupt)
    try:
        for _ in pool.imap_unordered(_compile_unit_job, work):
            done += 1
            if progress is not None:
                progress(done, len(work))
        pool.close()
    except BaseException:
        pool.terminate()  # SIGTERM to every worker: NVRTC calls in flight stop now
        raise
    finally:
        pool.join()
    return done


__all__ = ["INSTALL_HINT", "Progress", "check_nvrtc", "precompile"]
