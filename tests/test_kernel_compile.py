"""CPU: NVRTC compiles the kernel instantiations for sm_80 and sm_90 (no GPU needed).

Runs through the same compile layer the plans use (``quantplan.compiler``), bypassing the disk
cache so the compiler really runs. In CI (``CI`` set) a missing CuPy / NVRTC is a failure, not a skip.

The default run compiles a *sample* of every family: the fewest instantiations that together use
every value of every template parameter of every kernel (a few seconds a family). The full sweep of
every instantiation (about 15 minutes on two cores) is marked ``nvrtc_sweep`` and runs with
``--nvrtc-sweep``; CI runs it as its own step.
"""

from __future__ import annotations

import os

import pytest

from quantplan import _families, compiler
from quantplan._precompile import precompile
from quantplan._tuning import kernel_options
from quantplan.types import ArchSku


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


@pytest.mark.nvrtc_sweep
@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.nvrtc_arch)
@pytest.mark.parametrize("family", ["quantize", "dequantize", "dynamic_range", "fake_quantize"])
def test_every_instantiation_compiles(family: str, arch: ArchSku, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    _nvrtc_or_skip()
    monkeypatch.setenv("QUANTPLAN_CACHE_DIR", str(tmp_path))
    names = _families.all_instantiations(family)
    assert len(names) == len(set(names)) >= {"dynamic_range": 16, "fake_quantize": 40}.get(family, 100)
    module = compiler.compile_instantiations(family, names, arch, kernel_options(), use_cache=False)
    assert set(module.lowered_names) == set(names)
    assert module.cubin_path.stat().st_size > 10_000
    print(f"{family} {arch.nvrtc_arch}: {len(names)} instantiations compiled")


@pytest.mark.nvrtc_sweep
@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.nvrtc_arch)
@pytest.mark.parametrize("family", ["swizzled_quantize", "dequant_reduce", "deepspeed_format"])
def test_every_qgz_unit_compiles(family: str, arch: ArchSku, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """The qgZ families (and the DeepSpeed-format kernels on the same loops), unit by unit as
    their plans compile them, on every core (their units cover every instantiation; one program
    of ~900 kernels would take one core a long time)."""
    _nvrtc_or_skip()
    monkeypatch.setenv("QUANTPLAN_CACHE_DIR", str(tmp_path))
    units = _families.compile_units(family)
    names = _families.all_instantiations(family)
    assert len(names) >= 250 and {n for u in units for n in u} == set(names)
    assert precompile(arch, [family]) == len(units)
    cubins = list(tmp_path.rglob("*.cubin"))
    assert len(cubins) >= len(units), f"{len(cubins)} cubins for {len(units)} units"
    print(f"{family} {arch.nvrtc_arch}: {len(names)} instantiations in {len(units)} units compiled")


def test_compile_errors_carry_the_nvrtc_log(monkeypatch, tmp_path) -> None:  # noqa: ANN001
    _nvrtc_or_skip()
    monkeypatch.setenv("QUANTPLAN_CACHE_DIR", str(tmp_path))
    from quantplan.errors import KernelCompileError

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
    from quantplan.elements import CODE_KINDS, FLOAT_KINDS

    units = _families.compile_units("quantize")
    # packed kinds: two nibble orders; every combination with and without stochastic rounding
    assert len(units) == len(FLOAT_KINDS) * (len(CODE_KINDS) + 2) * 2
    assert len(_families.compile_units("dequantize")) == len(FLOAT_KINDS) * (len(CODE_KINDS) + 2)
    # range passes per float kind; the fused pass per (float, code, nibble order, rounding)
    assert len(_families.compile_units("dynamic_range")) == len(FLOAT_KINDS) * (1 + (len(CODE_KINDS) + 2) * 2)
    # two units per float kind: the elementwise and learnable kernels; the dynamic-range fused pass
    assert len(_families.compile_units("fake_quantize")) == 2 * len(FLOAT_KINDS)
