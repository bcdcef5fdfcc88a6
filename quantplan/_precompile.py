"""Filling the kernel cache ahead of use: every compile unit of the families of :mod:`quantplan._families`.

``python -m quantplan precompile sm_90`` runs :func:`precompile`; no GPU is needed (NVRTC only).
:func:`sweep` compiles every instantiation once per architecture without the cache (the NVRTC
sweep of ``tests/test_kernel_compile.py``).
"""

from __future__ import annotations

import os
import resource
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ._families import FAMILIES, compile_units
from .compiler import check_instantiations, compile_instantiations, compile_options
from .types import ArchSku

#: ``progress(done, total)`` after each compile unit.
Progress = Callable[[int, int], None]


def _compile_unit_job(job: tuple[str, list[str], str, tuple[str, ...], bool]) -> str:
    family, names, arch, options, use_cache = job
    compile_instantiations(family, names, ArchSku.parse(arch), options, use_cache=use_cache)
    return family


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
    CPU). ``check=True`` compiles every unit even when the cache holds it (a full NVRTC check of
    every instantiation). ``progress(done, total)`` is called after each unit. Returns the number
    of units compiled.
    """
    from concurrent.futures import ProcessPoolExecutor, as_completed

    chosen = list(families) if families else sorted(FAMILIES)
    work = [(f, unit, arch.nvrtc_arch, compile_options(), not check) for f in chosen for unit in compile_units(f)]
    done = 0
    with ProcessPoolExecutor(max_workers=jobs or os.cpu_count()) as pool:
        for future in as_completed([pool.submit(_compile_unit_job, job) for job in work]):
            future.result()
            done += 1
            if progress is not None:
                progress(done, len(work))
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


def _sweep_job(job: tuple[SweepProgram, tuple[str, ...]]) -> tuple[SweepProgram, dict[str, str], float]:
    program, options = job
    before = resource.getrusage(resource.RUSAGE_SELF)
    lowered = check_instantiations(program.family, program.names, ArchSku.parse(program.arch), options, ptx=program.ptx)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return program, lowered, cpu


def sweep(
    programs: Sequence[SweepProgram], jobs: int | None = None, progress: Progress | None = None
) -> list[tuple[SweepProgram, dict[str, str], float]]:
    """Compile ``programs`` with NVRTC (no cache) in ``jobs`` processes (default: one per CPU);
    returns each program with its lowered names and the CPU seconds its compile took (the
    worker's user + system time, which a shared machine does not inflate as it does wall time).
    Raises :class:`~quantplan.errors.KernelCompileError` on the first program that fails."""
    from concurrent.futures import ProcessPoolExecutor, as_completed

    options = compile_options()
    results = []
    with ProcessPoolExecutor(max_workers=jobs or os.cpu_count()) as pool:
        futures = [pool.submit(_sweep_job, (program, options)) for program in programs]
        for future in as_completed(futures):
            results.append(future.result())
            if progress is not None:
                progress(len(results), len(programs))
    return results


__all__ = ["Progress", "SWEEP_PROGRAM_NAMES", "SweepProgram", "precompile", "sweep", "sweep_programs"]
