"""Filling the kernel cache ahead of use: every compile unit of the families of :mod:`quantplan._families`.

``python -m quantplan precompile sm_90`` runs :func:`precompile`; no GPU is needed (NVRTC only).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ._families import FAMILIES, compile_units
from .compiler import compile_instantiations, compile_options
from .types import ArchSku


def _compile_unit_job(job: tuple[str, list[str], str, tuple[str, ...]]) -> str:
    family, names, arch, options = job
    compile_instantiations(family, names, ArchSku.from_compute_capability(arch.removeprefix("sm_")), options)
    return family


def precompile(arch: ArchSku, families: Sequence[str] | None = None, jobs: int | None = None) -> int:
    """Fill the on-disk cache with every compile unit of ``families`` (default: all) for ``arch``.

    **When to use:** before a first run on a fresh machine (a container image, a CI cache), so no
    ``select`` waits for NVRTC. Units compile in parallel processes (``jobs``, default one per
    CPU). Returns the number of units compiled.
    """
    from concurrent.futures import ProcessPoolExecutor

    chosen = list(families) if families else sorted(FAMILIES)
    work = [(f, unit, arch.nvrtc_arch, compile_options()) for f in chosen for unit in compile_units(f)]
    with ProcessPoolExecutor(max_workers=jobs or os.cpu_count()) as pool:
        return len(list(pool.map(_compile_unit_job, work)))


__all__ = ["precompile"]
