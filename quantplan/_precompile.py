"""Filling the kernel cache ahead of use: every compile unit of the families of :mod:`quantplan._families`.

``python -m quantplan precompile sm_90`` runs :func:`precompile`; no GPU is needed (NVRTC only).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from ._families import FAMILIES, compile_units
from ._tuning import kernel_options
from .compiler import compile_instantiations
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
    work = [(f, unit, arch.nvrtc_arch, kernel_options(), not check) for f in chosen for unit in compile_units(f)]
    done = 0
    with ProcessPoolExecutor(max_workers=jobs or os.cpu_count()) as pool:
        for future in as_completed([pool.submit(_compile_unit_job, job) for job in work]):
            future.result()
            done += 1
            if progress is not None:
                progress(done, len(work))
    return done


__all__ = ["Progress", "precompile"]
