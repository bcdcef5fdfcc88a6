"""Record and compare the SASS of a representative set of kernel instantiations.

A refactor of ``kernels/`` that must not change the compiled code (tuning values moved into a
table, duplicated device code merged into a helper) is proven by hashing the disassembly of every
kernel before and after::

    python benchmarks/sass_diff.py record before.json      # at the base commit
    python benchmarks/sass_diff.py record after.json       # with the change
    python benchmarks/sass_diff.py compare before.json after.json

The set: per family of :data:`quantplan.runtime._families.FAMILIES`, a greedy cover of its compile units
such that every kernel template appears with every element tag and every template argument value
it takes in the table (so every template, every element kind and every tuning shape is compiled
at least once). Units are compiled with NVRTC exactly as the plans compile them (the same options,
including the tuning defines) for one architecture (default sm_90), disassembled with
``cuobjdump -sass`` (``$CUOBJDUMP`` or on ``PATH``; the ``nvidia-cuda-cuobjdump`` wheel has one)
or, where there is none, with ``nvdisasm -c -hex`` (``$NVDISASM`` or on ``PATH``; the
``nvidia-cuda-nvdisasm`` wheel has one). Each function's SASS, instruction encodings included, is
hashed with its own name removed (so a renamed template hashes the same) and its branch labels
numbered from zero (they count across the whole module), keyed by its name expression. A
recording names its disassembler; compare two recordings made with the same one. No GPU is needed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from quantplan.runtime import compiler  # noqa: E402
from quantplan.runtime._families import FAMILIES  # noqa: E402
from quantplan.vocabulary.types import ArchSku  # noqa: E402


def _kernel_options() -> tuple[str, ...]:
    """The options plans compile with (the tuning defines when the project has a tuning table)."""
    try:
        from quantplan.runtime import _tuning
    except ImportError:
        return compiler.compile_options()
    return tuple(_tuning.kernel_options())


def _features(name: str) -> set[tuple[str, int, str]]:
    """(template, argument position, argument) of every template argument of ``name``."""
    base, _, args = name.partition("<")
    parts = [a.strip() for a in args.rstrip(">").split(",")]
    return {(base, i, a) for i, a in enumerate(parts)}


def representative_units(family: str) -> list[list[str]]:
    """A greedy cover of ``family``'s units over :func:`_features` of their names."""
    units = FAMILIES[family]()
    wanted: set[tuple[str, int, str]] = set()
    for unit in units:
        for name in unit:
            wanted |= _features(name)
    chosen: list[list[str]] = []
    while wanted:
        best = max(units, key=lambda u: (len(wanted & set().union(*map(_features, u))), -len(u)))
        gain = wanted & set().union(*map(_features, best))
        if not gain:
            break
        chosen.append(best)
        wanted -= gain
    return chosen


_FUNCTION = re.compile(r"^\s*Function : (\S+)\s*$", re.MULTILINE)
# nvdisasm heads each code section with a line ``//---- .text.<mangled> ----``.
_SECTION = re.compile(r"^//-+ \.text\.(\S+) -+$", re.MULTILINE)
_LABEL = re.compile(r"\.L_x_\d+")


def disassembler() -> tuple[str, str]:
    """("cuobjdump" or "nvdisasm", its path): ``$CUOBJDUMP`` or ``cuobjdump``, else ``$NVDISASM`` or ``nvdisasm``."""
    for kind, variable in (("cuobjdump", "CUOBJDUMP"), ("nvdisasm", "NVDISASM")):
        tool = os.environ.get(variable) or shutil.which(kind)
        if tool:
            return kind, tool
    raise SystemExit(
        "no disassembler: set $CUOBJDUMP or $NVDISASM, or install the nvidia-cuda-cuobjdump"
        " or nvidia-cuda-nvdisasm wheel"
    )


def sass_by_function(cubin: Path) -> dict[str, str]:
    """The SASS of ``cubin`` split per function (mangled name -> its SASS lines)."""
    kind, tool = disassembler()
    command = [tool, "-sass", str(cubin)] if kind == "cuobjdump" else [tool, "-c", "-hex", str(cubin)]
    text = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    pieces = (_FUNCTION if kind == "cuobjdump" else _SECTION).split(text)
    return {pieces[i]: pieces[i + 1] for i in range(1, len(pieces) - 1, 2)}


def normalize(sass: str, mangled: str) -> str:
    """The function's SASS with its own (mangled) name blanked, labels renumbered, runs of white
    space collapsed to one blank (nvdisasm pads its columns to the longest name, so a renamed
    template would change every line), blank lines dropped. Recordings made before this collapsing
    do not compare with later ones."""
    labels: dict[str, str] = {}

    def local(match: re.Match[str]) -> str:
        return labels.setdefault(match.group(0), f".L_x_{len(labels)}")

    lines = (" ".join(_LABEL.sub(local, line.replace(mangled, "<self>")).split()) for line in sass.splitlines())
    return "\n".join(line for line in lines if line.strip())


def record(out: Path, arch: ArchSku, families: list[str]) -> None:
    options = _kernel_options()
    tool = disassembler()[0]
    result: dict[str, dict[str, str]] = {}
    start = time.time()
    for family in families:
        hashes: dict[str, str] = {}
        for unit in representative_units(family):
            module = compiler.compile_instantiations(family, unit, arch, options, use_cache=False)
            functions = sass_by_function(module.cubin_path)
            for name, mangled in module.lowered_names.items():
                body = normalize(functions[mangled], mangled)
                hashes[name] = hashlib.sha256(body.encode()).hexdigest()[:20]
        result[family] = dict(sorted(hashes.items()))
        print(f"{family}: {len(hashes)} kernels ({time.time() - start:.0f} s)", flush=True)
        # Written after every family, so an interrupted run keeps what it compiled.
        out.write_text(
            json.dumps({"arch": arch.name, "disassembler": tool, "options": list(options), "kernels": result}, indent=1)
            + "\n"
        )


def compare(before: Path, after: Path) -> int:
    ra, rb = json.loads(before.read_text()), json.loads(after.read_text())
    tools = (ra.get("disassembler", "cuobjdump"), rb.get("disassembler", "cuobjdump"))
    if tools[0] != tools[1]:
        raise SystemExit(f"recorded with different disassemblers ({tools[0]}, {tools[1]}): record both with one")
    a, b = ra["kernels"], rb["kernels"]
    total = same = 0
    for family in sorted(set(a) | set(b)):
        ka, kb = a.get(family, {}), b.get(family, {})
        for name in sorted(set(ka) | set(kb)):
            total += 1
            if ka.get(name) == kb.get(name):
                same += 1
            else:
                print(f"DIFFERS {family}: {name} ({ka.get(name)} -> {kb.get(name)})")
    print(f"{same} of {total} kernels identical")
    return 0 if same == total else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="compile, disassemble and hash; write JSON")
    rec.add_argument("out", type=Path)
    rec.add_argument("--arch", default="sm_90")
    rec.add_argument("--family", action="append", choices=sorted(FAMILIES), help="default: every family")
    cmp_ = sub.add_parser("compare", help="compare two recordings")
    cmp_.add_argument("before", type=Path)
    cmp_.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "record":
        record(args.out, ArchSku.parse(args.arch), args.family or list(FAMILIES))
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    raise SystemExit(main())
