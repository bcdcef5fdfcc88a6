"""Filling the kernel cache ahead of use: every compile unit of the families of :mod:`quantplan.runtime._families`.

``python -m quantplan precompile sm_90`` runs :func:`precompile`; no GPU is needed (NVRTC only).
:func:`sweep` compiles every instantiation once per architecture without the cache (the NVRTC
sweep of ``tests/test_kernel_compile.py``), at NVRTC's fast-compile level
(:func:`sweep_options`).
"""

from __future__ import annotations

import os
import resource
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from quantplan.runtime._families import FAMILIES, compile_units
from quantplan.runtime._tuning import kernel_options
from quantplan.runtime.compiler import check_instantiations, compile_instantiations, nvrtc_version
from quantplan.vocabulary.errors import Unsupported
from quantplan.vocabulary.types import ArchSku

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


#: Most distinct instantiations of one sweep program: consecutive units of a family are merged
#: up to this size (instantiations shared by units compile once, and a program's helper
#: templates are instantiated once for all its kernels), small enough that the last programs
#: leave no worker idle for long.
SWEEP_PROGRAM_NAMES = 32


@dataclass(frozen=True)
class SweepProgram:
    """One NVRTC program of the sweep: ``names`` of ``family`` for ``arch`` (``ptx``: to PTX only)."""

    family: str
    names: tuple[str, ...]
    arch: str
    ptx: bool


def sweep_programs(
    targets: Sequence[tuple[ArchSku, bool]], families: Sequence[str] | None = None
) -> list[SweepProgram]:
    """The programs compiling every instantiation of ``families`` (default: all) once per target
    ``(arch, ptx)``: each family's units in order, merged up to :data:`SWEEP_PROGRAM_NAMES`
    distinct names, largest programs first."""
    programs = []
    for family in families or sorted(FAMILIES):
        chunks: list[list[str]] = [[]]
        seen: set[str] = set()
        for unit in compile_units(family):
            fresh = [name for name in unit if name not in seen]
            if chunks[-1] and len(chunks[-1]) + len(fresh) > SWEEP_PROGRAM_NAMES:
                chunks.append([])
            chunks[-1] += fresh
            seen.update(fresh)
        for arch, ptx in targets:
            programs += [SweepProgram(family, tuple(c), arch.nvrtc_arch, ptx) for c in chunks if c]
    return sorted(programs, key=lambda p: -len(p.names))


#: NVRTC's fast-compile level (``-Ofc=max``): the sweep's programs run the whole pipeline (C++
#: front end, NVVM, ptxas) on every instantiation with the optimizers at their lowest level
#: (docs/performance.md, "NVRTC sweep"). The shipped options (full optimization) compile the
#: covering sample of every family to cubins for each architecture in the default test run.
SWEEP_FAST_COMPILE: tuple[str, ...] = ("-Ofc=max",)


def sweep_options(fast: bool = True) -> tuple[str, ...]:
    """The options of the sweep's programs: the kernels' defines (``_tuning.kernel_options``) and,
    with ``fast`` and an NVRTC that has it (13 or later), :data:`SWEEP_FAST_COMPILE`."""
    options = kernel_options()
    return (*options, *SWEEP_FAST_COMPILE) if fast and nvrtc_version() >= (13, 0) else options


def _sweep_job(job: tuple[SweepProgram, tuple[str, ...]]) -> tuple[SweepProgram, dict[str, str], float]:
    program, options = job
    before = resource.getrusage(resource.RUSAGE_SELF)
    lowered = check_instantiations(program.family, program.names, ArchSku.parse(program.arch), options, ptx=program.ptx)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return program, lowered, cpu


def sweep(
    programs: Sequence[SweepProgram],
    jobs: int | None = None,
    progress: Progress | None = None,
    *,
    fast: bool = True,
) -> list[tuple[SweepProgram, dict[str, str], float]]:
    """Compile ``programs`` with NVRTC (no cache) in ``jobs`` processes (default: one per CPU),
    with :func:`sweep_options` (``fast=False``: the shipped options, full optimization);
    returns each program with its lowered names and the CPU seconds its compile took (the
    worker's user + system time, which a shared machine does not inflate as it does wall time).
    Raises :class:`~quantplan.vocabulary.errors.KernelCompileError` on the first program that fails."""
    from concurrent.futures import ProcessPoolExecutor, as_completed

    options = sweep_options(fast)
    results = []
    with ProcessPoolExecutor(max_workers=jobs or os.cpu_count()) as pool:
        futures = [pool.submit(_sweep_job, (program, options)) for program in programs]
        for future in as_completed(futures):
            results.append(future.result())
            if progress is not None:
                progress(len(results), len(programs))
    return results


__all__ = [
    "INSTALL_HINT",
    "Progress",
    "SWEEP_FAST_COMPILE",
    "SWEEP_PROGRAM_NAMES",
    "SweepProgram",
    "check_nvrtc",
    "precompile",
    "sweep",
    "sweep_options",
    "sweep_programs",
]
