"""CPU: the tuning table (``quantplan.runtime._tuning``) is the one source of the kernels' tuning values.

The kernels take every value as a define the table generates, with no default of their own
(``kernels/qp_tuning.cuh`` stops a compile without them); Python's launch geometry reads the same
table; an override through ``QUANTPLAN_NVRTC_OPTIONS`` moves both; and kernel comments hold no
timings (those live in ``docs/performance.md``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_kernel_compile import _nvrtc_or_skip

from quantplan.runtime import _tuning, compiler
from quantplan.vocabulary.errors import KernelCompileError, Unsupported
from quantplan.vocabulary.types import ArchSku

KERNELS = Path(compiler.kernel_dir())
ROOT = Path(__file__).resolve().parent.parent
TABLE = {_tuning.macro(f.name) for f in dataclasses.fields(_tuning.Tuning)}


def _kernel_texts() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(KERNELS.glob("*.cu*"))}


def test_the_guard_header_lists_exactly_the_table() -> None:
    header = (KERNELS / "qp_tuning.cuh").read_text()
    guarded = re.findall(r"^#ifndef (QP_\w+)\n#error ", header, re.MULTILINE)
    assert sorted(guarded) == sorted(TABLE)
    assert "#define" not in header


def test_kernels_define_no_tuning_default_and_use_every_value() -> None:
    texts = _kernel_texts()
    for name, text in texts.items():
        if name == "qp_tuning.cuh":
            continue
        assert not re.search(r"^\s*#\s*ifndef\s+QP_", text, re.MULTILINE), name
        defined = set(re.findall(r"^\s*#\s*define\s+(QP_\w+)", text, re.MULTILINE))
        assert not defined & TABLE, (name, defined & TABLE)
    used = " ".join(t for n, t in texts.items() if n != "qp_tuning.cuh")
    assert [m for m in sorted(TABLE) if not re.search(rf"\b{m}\b", used)] == []


def test_overrides_replace_table_values_and_keep_other_options() -> None:
    overrides, rest = _tuning._split_overrides(
        ("-DQP_ROWS_MIN_BLOCKS=6", "-D", "QP_SHARES_BLOCK=128", "-DQP_FP8_SOFTWARE", "-DQP_OTHER=3", "-lineinfo")
    )
    assert overrides == {"rows_min_blocks": 6, "shares_block": 128}
    assert rest == ("-DQP_FP8_SOFTWARE", "-DQP_OTHER=3", "-lineinfo")
    with pytest.raises(Unsupported, match="integer"):
        _tuning._split_overrides(("-DQP_ROWS_BLOCK=wide",))


def test_kernel_options_carry_every_define_once() -> None:
    options = _tuning.kernel_options()
    defines = [o for o in options if o.startswith("-DQP_")]
    names = [d[2:].partition("=")[0] for d in defines]
    assert sorted(names) == sorted(TABLE)
    assert f"-DQP_ROWS_BLOCK={_tuning.TUNING.rows_block}" in options


def test_an_environment_override_moves_kernels_and_python_together() -> None:
    code = (
        "import json; from quantplan.runtime import _families, _layout, _tuning; "
        "print(json.dumps([_tuning.TUNING.rows_block, _families.ROWS_BLOCK, "
        "_layout.DENSE_ROW_SHAPES['dequantize_dense'][1], list(_tuning.kernel_options())]))"
    )
    env = {**os.environ, "QUANTPLAN_NVRTC_OPTIONS": "-DQP_ROWS_BLOCK=128 -DQP_DENSE_DEQUANTIZE_UNROLL=1 -lineinfo"}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    table_block, families_block, unroll, options = json.loads(out.stdout)
    assert (table_block, families_block, unroll) == (128, 128, 1)
    assert "-DQP_ROWS_BLOCK=128" in options and "-DQP_ROWS_BLOCK=256" not in options
    assert "-DQP_DENSE_DEQUANTIZE_UNROLL=1" in options and options[-1] == "-lineinfo"


def test_a_late_override_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    other = _tuning.TUNING.rows_min_blocks + 1
    monkeypatch.setenv("QUANTPLAN_NVRTC_OPTIONS", f"-DQP_ROWS_MIN_BLOCKS={other}")
    with pytest.raises(Unsupported, match="after quantplan was imported"):
        _tuning.kernel_options()
    monkeypatch.setenv("QUANTPLAN_NVRTC_OPTIONS", f"-DQP_ROWS_MIN_BLOCKS={_tuning.TUNING.rows_min_blocks}")
    assert _tuning.kernel_options()[: len(_tuning.TUNING.defines())] == _tuning.TUNING.defines()


def test_a_compile_without_the_table_stops(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _nvrtc_or_skip()
    monkeypatch.setenv("QUANTPLAN_CACHE_DIR", str(tmp_path))
    with pytest.raises(KernelCompileError) as info:
        compiler.compile_instantiations("swizzled_quantize", [], ArchSku(9, 0), use_cache=False)
    assert "is not defined: compile with quantplan.runtime._tuning.kernel_options()" in info.value.log


#: A comment line stating a timing: a number with a time or bandwidth unit, a share of a copy,
#: or a measurement.
_TIMING = re.compile(r"\d\s*(us|µs|ms)\b|GB/s|% of (a )?copy|\bmeasured\b|\bfaster\b|\bslower\b", re.IGNORECASE)


def test_kernel_comments_state_no_timing() -> None:
    found = []
    for name, text in _kernel_texts().items():
        for number, line in enumerate(text.splitlines(), 1):
            comment = line.partition("//")[2]
            if comment and _TIMING.search(comment):
                found.append(f"{name}:{number}: {line.strip()}")
    assert found == []
