"""CPU: NVRTC compiles the kernel instantiations for sm_80 and sm_90 (no GPU needed).

Runs through the same compile layer the plans use (``quantplan.runtime.compiler``), bypassing the disk
cache so the compiler really runs. In CI (``CI`` set) a missing CuPy / NVRTC is a failure, not a skip.

The default run compiles a *sample* of every family to cubins for sm_80 and sm_90: the fewest
instantiations that together use every value of every template parameter of every kernel (a few
seconds a family). The full sweep of every instantiation (:data:`SWEEP_TARGETS`: cubins for both,
at NVRTC's fast-compile level) is marked ``nvrtc_sweep`` and runs with ``--nvrtc-sweep``; CI runs
it as its own step, beside the other tests.
"""

from __future__ import annotations

import os

import pytest

from quantplan.runtime import _families, compiler
from quantplan.runtime._precompile import SWEEP_FAST_COMPILE, sweep, sweep_options, sweep_programs
from quantplan.runtime._tuning import kernel_options
from quantplan.vocabulary.types import ArchSku


def _nvrtc_or_skip() -> None:
    try:
        compiler.nvrtc_version()
    except Exception as exc:  # pragma: no cover - depends on the machine
        if os.environ.get("CI"):
            raise
        pytest.skip(f"NVRTC not available: {exc}")


ARCHS = [ArchSku(8, 0), ArchSku(9, 0)]


def covering_sample(names: list[str]) -> list[str]:
    """The fewest names (greedily) such that every (kernel, parameter position, value) of ``names``
    appears in one of them: one instantiation per template parameter value."""

    def facets(name: str) -> set[tuple[str, int, str]]:
        kernel, _, rest = name.partition("<")
        values = [v.strip() for v in rest.rstrip(">").split(",")] if rest else []
        return {(kernel, -1, "")} | {(kernel, i, v) for i, v in enumerate(values)}

    wanted = {name: facets(name) for name in names}
    missing = set().union(*wanted.values()) if wanted else set()
    chosen: list[str] = []
    while missing:
        best = max(wanted, key=lambda n: len(wanted[n] & missing))
        chosen.append(best)
        missing -= wanted.pop(best)
    return chosen


def test_the_sample_covers_every_parameter_value() -> None:
    names = _families.all_instantiations("quantize")
    sample = covering_sample(names)
    assert len(sample) < len(names) / 4
    for name in names:
        kernel, _, rest = name.partition("<")
        for i, value in enumerate(v.strip() for v in rest.rstrip(">").split(",")):
            assert any(
                s.startswith(kernel + "<") and s.partition("<")[2].rstrip(">").split(",")[i].strip() == value
                for s in sample
            ), (name, i, value)


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.nvrtc_arch)
@pytest.mark.parametrize("family", sorted(_families.FAMILIES))
def test_a_sample_of_every_family_compiles(family: str, arch: ArchSku, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    _nvrtc_or_skip()
    monkeypatch.setenv("QUANTPLAN_CACHE_DIR", str(tmp_path))
    sample = covering_sample(_families.all_instantiations(family))
    module = compiler.compile_instantiations(family, sample, arch, kernel_options(), use_cache=False)
    assert set(module.lowered_names) == set(sample)
    assert module.cubin_path.stat().st_size > 10_000
    print(f"{family} {arch.nvrtc_arch}: {len(sample)} sampled instantiations compiled")


#: The sweep's targets: every instantiation to a cubin for sm_90 and for sm_80 (the C++ front end,
#: NVVM and ptxas, so every ``__CUDA_ARCH__`` branch and its inline PTX is assembled for each
#: architecture), at NVRTC's fast-compile level (``_precompile.sweep_options``). The shipped
#: options, with full optimization, compile the covering sample of every family for both
#: architectures (``test_a_sample_of_every_family_compiles``: every value of every template
#: parameter of every kernel). This keeps the sweep within CI's budget (docs/performance.md,
#: "NVRTC sweep").
SWEEP_TARGETS = [(ArchSku(9, 0), False), (ArchSku(8, 0), False)]


@pytest.mark.nvrtc_sweep
def test_every_instantiation_compiles(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """Every instantiation of every family (``_families``: what the plans can select, checked by
    ``tests/test_instantiations.py``) compiles once per target of :data:`SWEEP_TARGETS`, in
    programs of consecutive units (:func:`quantplan.runtime._precompile.sweep_programs`), on every core,
    with :func:`quantplan.runtime._precompile.sweep_options`."""
    _nvrtc_or_skip()
    monkeypatch.setenv("QUANTPLAN_CACHE_DIR", str(tmp_path))
    programs = sweep_programs(SWEEP_TARGETS)
    for family in _families.FAMILIES:
        names = _families.all_instantiations(family)
        for arch, ptx in SWEEP_TARGETS:
            swept = [
                n for p in programs if (p.family, p.arch, p.ptx) == (family, arch.nvrtc_arch, ptx) for n in p.names
            ]
            assert sorted(swept) == sorted(names), (family, arch)
    results = sweep(programs)
    assert len(results) == len(programs)
    cpu: dict[tuple[str, str], float] = {}
    for program, lowered, seconds in results:
        assert set(lowered) == set(program.names) and all(lowered.values())
        key = (program.family, program.arch + ("-ptx" if program.ptx else ""))
        cpu[key] = cpu.get(key, 0.0) + seconds
    for (family, target), seconds in sorted(cpu.items()):
        print(f"{family} {target}: {seconds:.0f} s CPU")
    print(f"NVRTC sweep: {len(programs)} programs, {sum(cpu.values()):.0f} s CPU")


def test_the_sweep_options_compile_a_program_for_both_architectures() -> None:
    """The sweep's options (fast-compile level on NVRTC 13 or later) are accepted, and a merged
    program of two kernels of different templates compiles to a cubin for each architecture."""
    _nvrtc_or_skip()
    fast = sweep_options()
    assert sweep_options(fast=False) == kernel_options()
    if compiler.nvrtc_version() >= (13, 0):
        assert fast == (*kernel_options(), *SWEEP_FAST_COMPILE)
    names = [_families.compile_units("quantize")[0][0], _families.compile_units("quantize")[0][-1]]
    for arch in ARCHS:
        lowered = compiler.check_instantiations("quantize", names, arch, fast)
        assert set(lowered) == set(names) and all(v.startswith("_Z") for v in lowered.values())


def test_compile_errors_carry_the_nvrtc_log(monkeypatch, tmp_path) -> None:  # noqa: ANN001
    _nvrtc_or_skip()
    monkeypatch.setenv("QUANTPLAN_CACHE_DIR", str(tmp_path))
    from quantplan.vocabulary.errors import KernelCompileError

    with pytest.raises(KernelCompileError) as info:
        compiler.compile_instantiations(
            "quantize", ["quantize_rows<qp::f16, qp::f16, 8, true, false>"], ArchSku(9, 0), kernel_options()
        )
    assert "error" in info.value.log


def test_kernel_source_inlines_headers_once() -> None:
    src = compiler.kernel_source("quantize")
    assert '#include "' not in src
    assert src.count("---- begin qp_elements.cuh ----") == 1


def test_compile_units_cover_the_dtype_table() -> None:
    from quantplan.vocabulary.elements import CODE_KINDS, FLOAT_KINDS

    units = _families.compile_units("quantize")
    # packed kinds: two nibble orders; every combination with and without stochastic rounding
    assert len(units) == len(FLOAT_KINDS) * (len(CODE_KINDS) + 2) * 2
    assert len(_families.compile_units("dequantize")) == len(FLOAT_KINDS) * (len(CODE_KINDS) + 2)
    # range passes per float kind; the fused pass per (float, code, nibble order, rounding)
    assert len(_families.compile_units("dynamic_range")) == len(FLOAT_KINDS) * (1 + (len(CODE_KINDS) + 2) * 2)
    # two units per float kind: the elementwise and learnable kernels; the dynamic-range fused pass
    assert len(_families.compile_units("fake_quantize")) == 2 * len(FLOAT_KINDS)
