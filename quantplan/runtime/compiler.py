"""The kernel compile layer: ``kernels/<family>.cu`` -> NVRTC -> cubin -> CuPy module.

One path serves the GPU and the GPU-less check:

* :func:`kernel_source` reads a family's ``.cu`` and inlines its ``#include "*.cuh"`` headers
  (so the cache key covers every byte compiled and NVRTC needs no include path or CUDA headers);
* :func:`compile_instantiations` compiles a list of template name expressions for an explicit
  architecture through ``cupy.cuda.nvrtc`` (no GPU needed) and caches the cubin on disk;
* :func:`load_kernels` (GPU only) loads that cubin with ``cupy.RawModule`` and returns the
  launchable functions; modules are cached per (family, arch, options, names).

Plans call :func:`load_kernels` from ``select``; ``run`` never compiles. The compile layer is a
leaf over the vocabulary: its callers pass the tuning defines (:mod:`quantplan.runtime._tuning`), which
instantiations each family has is the declarative table of :mod:`quantplan.runtime._families`, and :mod:`quantplan.runtime._precompile` fills the cache ahead from it
(``python -m quantplan precompile sm_90``); a CPU test compiles every unit for sm_80 and sm_90.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Protocol

from quantplan.vocabulary._nvrtc_env import compile_options
from quantplan.vocabulary.errors import KernelCompileError, Unsupported


class Arch(Protocol):
    """What the compile layer reads of an architecture (:class:`~quantplan.ArchSku`): the compile
    layer is a leaf over the vocabulary's lowest modules, so it takes any object with these."""

    @property
    def major(self) -> int: ...

    @property
    def minor(self) -> int: ...

    @property
    def name(self) -> str: ...

    @property
    def nvrtc_arch(self) -> str: ...


#: ``logging.getLogger("quantplan")``: one INFO line per NVRTC compile (family, arch, kernels, where
#: it is cached), so a first ``select`` that waits for the compiler says so
#: (``logging.basicConfig(level=logging.INFO)`` shows it).
log = logging.getLogger("quantplan")

#: Options every kernel is compiled with. No fast math; no FMA contraction, so float results
#: equal the NumPy reference's separately rounded multiply and add.
BASE_OPTIONS: tuple[str, ...] = ("-std=c++17", "--fmad=false", "--prec-div=true", "--prec-sqrt=true", "--ftz=false")

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.MULTILINE)


def kernel_dir() -> Path:
    """Folder holding ``*.cu`` / ``*.cuh``: inside the installed package, else the repository's."""
    package = Path(__file__).resolve().parent.parent  # quantplan/ (this module is quantplan/runtime/compiler.py)
    packaged = package / "kernels"
    if packaged.is_dir():
        return packaged
    return package.parent / "kernels"


@cache
def kernel_source(family: str) -> str:
    """Source of ``kernels/<family>.cu`` with its quoted includes inlined once each."""
    root = kernel_dir()
    seen: set[str] = set()

    def expand(name: str) -> str:
        path = root / name
        if not path.is_file():
            raise Unsupported(f"kernel source {name!r} not found under the kernels folder; reinstall quantplan")
        text = path.read_text()

        def include(match: re.Match[str]) -> str:
            header = match.group(1)
            if header in seen:
                return ""
            seen.add(header)
            return f"// ---- begin {header} ----\n{expand(header)}\n// ---- end {header} ----"

        return _INCLUDE.sub(include, text)

    return expand(f"{family}.cu")


def nvrtc_version() -> tuple[int, int]:
    """Version of the NVRTC library CuPy loads."""
    from cupy.cuda import nvrtc

    major, minor = nvrtc.getVersion()
    return int(major), int(minor)


def cache_dir() -> Path:
    """On-disk cubin cache: ``$QUANTPLAN_CACHE_DIR`` or ``~/.cache/quantplan``."""
    env = os.environ.get("QUANTPLAN_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "quantplan"


@dataclass(frozen=True)
class CompiledModule:
    """A compiled cubin and the mangled (lowered) name of each requested name expression."""

    cubin_path: Path
    lowered_names: dict[str, str]


def compile_instantiations(
    family: str, names: Sequence[str], arch: Arch, options: Sequence[str] = (), use_cache: bool = True
) -> CompiledModule:
    """Compile ``names`` of ``family`` for ``arch`` with NVRTC; no GPU needed.

    Raises :class:`KernelCompileError` with the NVRTC log when compilation fails.
    """
    source = kernel_source(family)
    all_options = (*BASE_OPTIONS, *options, f"-arch={arch.nvrtc_arch}")
    key_text = json.dumps([source, all_options, list(names), nvrtc_version()])
    key = hashlib.sha256(key_text.encode()).hexdigest()[:32]
    directory = cache_dir()
    cubin_path = directory / f"{family}-{arch.name}-{key}.cubin"
    names_path = cubin_path.with_suffix(".json")
    if use_cache and cubin_path.is_file() and names_path.is_file():
        return CompiledModule(cubin_path, json.loads(names_path.read_text()))

    log.info(
        "compiling kernels/%s.cu for %s (%d kernels) with NVRTC; cached in %s for later runs",
        family,
        arch.nvrtc_arch,
        len(names),
        directory,
    )
    lowered, image = _nvrtc_compile(family, source, names, all_options, ptx=False)
    cubin = complete_elf(image)

    directory.mkdir(parents=True, exist_ok=True)
    tmp = cubin_path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(cubin)
    os.replace(tmp, cubin_path)
    tmp_names = names_path.with_suffix(f".tmp{os.getpid()}")
    tmp_names.write_text(json.dumps(lowered))
    os.replace(tmp_names, names_path)
    return CompiledModule(cubin_path, lowered)


def _nvrtc_compile(
    family: str, source: str, names: Sequence[str], options: Sequence[str], ptx: bool
) -> tuple[dict[str, str], bytes]:
    """One NVRTC program of ``names``: (name expression -> lowered name, the cubin or PTX)."""
    from cupy.cuda import nvrtc

    prog = nvrtc.createProgram(source, f"{family}.cu", [], [])
    try:
        for name in names:
            nvrtc.addNameExpression(prog, name)
        try:
            nvrtc.compileProgram(prog, list(options))
        except nvrtc.NVRTCError as exc:
            target = options[-1].removeprefix("-arch=")
            raise KernelCompileError(
                f"NVRTC failed to compile kernels/{family}.cu for {target} ({len(names)} instantiations): {exc}",
                nvrtc.getProgramLog(prog),
            ) from None
        lowered = {name: nvrtc.getLoweredName(prog, name) for name in names}
        image = nvrtc.getPTX(prog) if ptx else nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)
    return lowered, image if isinstance(image, bytes) else str(image).encode()


def check_instantiations(
    family: str, names: Sequence[str], arch: Arch, options: Sequence[str] = (), *, ptx: bool = False
) -> dict[str, str]:
    """Compile ``names`` of ``family`` for ``arch`` with NVRTC, without the cache, and return each
    name expression's lowered name (the NVRTC sweep). ``ptx``: compile for the virtual architecture
    (``compute_90`` for sm_90) and stop at PTX: the C++ front end and the optimizer see every
    ``__CUDA_ARCH__`` branch of ``arch``, ptxas does not run.

    Raises :class:`KernelCompileError` with the NVRTC log when compilation fails.
    """
    target = f"compute_{arch.major}{arch.minor}" if ptx else arch.nvrtc_arch
    all_options = (*BASE_OPTIONS, *options, f"-arch={target}")
    return _nvrtc_compile(family, kernel_source(family), names, all_options, ptx)[0]


def complete_elf(image: bytes) -> bytes:
    """``image`` zero-padded to the extent its ELF64 header declares.

    CuPy's ``nvrtc.getCUBIN`` drops the image's last byte (it strips a terminator as for PTX);
    that byte is the top byte of the last program header's alignment, always zero. The driver
    tolerates the short image, but disassemblers and strict loaders do not, so restore it.
    """
    if len(image) < 64 or image[:4] != b"\x7fELF" or image[4] != 2:
        return image
    ph_off, sh_off = struct.unpack_from("<QQ", image, 0x20)
    ph_size, ph_num, sh_size, sh_num = struct.unpack_from("<HHHH", image, 0x36)
    extent = max(ph_off + ph_size * ph_num, sh_off + sh_size * sh_num)
    return image + bytes(extent - len(image)) if 0 < extent - len(image) <= 8 else image


_modules: dict[tuple[str, str, tuple[str, ...], tuple[str, ...], int], dict[str, Any]] = {}
_modules_lock = threading.Lock()


def load_kernels(
    family: str, names: Sequence[str], arch: Arch, device_id: int, options: Sequence[str] = ()
) -> dict[str, Any]:
    """Compile (or fetch from cache) and load ``names``; returns name expression -> ``cupy`` Function.

    The returned functions launch with ``fn(grid, block, args, shared_mem, stream)``.
    """
    key = (family, arch.name, tuple(options), tuple(names), device_id)
    with _modules_lock:
        cached = _modules.get(key)
        if cached is not None:
            return cached
        import cupy

        compiled = compile_instantiations(family, names, arch, options)
        with cupy.cuda.Device(device_id):
            module = cupy.RawModule(path=str(compiled.cubin_path))
            functions = {name: module.get_function(compiled.lowered_names[name]).kernel for name in names}
        _modules[key] = functions
        return functions


def template_name(kernel: str, *args: object) -> str:
    """``template_name("quantize_rows", "qp::f16", "qp::s8", 8, True)`` -> C++ name expression."""

    def render(a: object) -> str:
        if isinstance(a, bool):
            return "true" if a else "false"
        return str(a)

    return f"{kernel}<{', '.join(render(a) for a in args)}>"


__all__ = [
    "BASE_OPTIONS",
    "CompiledModule",
    "cache_dir",
    "check_instantiations",
    "compile_instantiations",
    "compile_options",
    "kernel_dir",
    "kernel_source",
    "load_kernels",
    "nvrtc_version",
    "template_name",
]
