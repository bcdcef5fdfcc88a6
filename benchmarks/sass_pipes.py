"""Count a kernel's SASS instructions by issue pipe and weight them by the pipe's rate.

On sm_90 a warp instruction on a 32-lane pipe (f32 add / multiply / fma, f16x2 arithmetic) takes
one cycle of its SM sub-partition, one on a 16-lane pipe two: the integer logic unit (logic,
shifts, adds, compares, min / max, ``PRMT``, ``SEL``, ``FMNMX``) and the integer multiplier
(``IMAD``, ``IMAD.HI``, ``IMAD.WIDE``). The weighted count FULL + 2 * HALF (+ 4 * XU: conversions,
``MUFU``) per element is the issue time of a warp's 32 elements; the NVFP4 stochastic kernel's
time follows it (docs/performance.md: logic unit and multiplier add up, they do not overlap).

This script compiles instantiations of a kernel family with NVRTC for sm_90 (no GPU needed),
disassembles them (``$CUOBJDUMP`` / ``$NVDISASM`` or on ``PATH``, as ``sass_diff.py``), and
prints per kernel the count of each class and of each opcode, per element when ``--elements``
gives the elements one loop trip handles, and the weighted cycles::

    python benchmarks/sass_pipes.py block_scaled "block_scaled_quantize<...>" --elements 32 --loop --until STG.E.128

``--loop`` counts only the instructions between the first and the last backward branch target
of the function's largest loop (the grid-stride loop), so setup code does not dilute the count;
``--until OPCODE`` stops at the last instruction of that opcode (the code store: the scale
layouts' branches after it are cold); without them the whole function is counted. ``--dump
FILE`` writes the SASS.

Classes (sm_90; Nsight Compute's pipes ``fma``/``fmaheavy``, ``alu``, ``xu``, ``lsu``):
FULL: FADD FMUL FFMA HADD2 HMUL2 HFMA2 (and FMUL32I / FFMA32I / FADD32I); HALF_ALU: LOP3 SHF
IADD3 ISETP VIMNMX IMNMX PRMT SEL LEA FSEL FSETP FMNMX HMNMX2 VHMNMX FLO POPC BMSK LOP PLOP3
P2R R2P F2FP I2FP F2IP VIMNMX3 VIADD; HALF_MUL: IMAD (all forms); XU: F2I I2F F2F MUFU; MEM and the rest
(branches, moves, uniform-datapath U* instructions, S2R, shuffles) are listed but not weighted.
``MOV`` is counted apart (the compiler places it on either pipe).
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.sass_diff import sass_by_function  # noqa: E402
from quantplan.runtime import compiler  # noqa: E402
from quantplan.runtime._tuning import kernel_options  # noqa: E402

FULL = {"FADD", "FMUL", "FFMA", "HADD2", "HMUL2", "HFMA2", "FMUL32I", "FFMA32I", "FADD32I"}
HALF_ALU = {
    "LOP3", "SHF", "IADD3", "ISETP", "VIMNMX", "VIMNMX3", "IMNMX", "PRMT", "SEL", "LEA", "FSEL", "FSETP", "FMNMX",
    "HMNMX2", "VHMNMX", "FLO", "POPC", "BMSK", "LOP", "PLOP3", "P2R", "R2P", "F2FP", "I2FP", "F2IP", "IABS",
    "LEA.HI", "IADD", "VIADD", "VIADDMNMX",
}  # fmt: skip
HALF_MUL = {"IMAD", "IMUL", "IMUL32I", "IMAD32I"}
XU = {"F2I", "I2F", "F2F", "MUFU", "FRND"}
MEM = {"LDG", "STG", "LDS", "STS", "LD", "ST", "LDC", "ULDC", "ATOM", "RED", "LDGSTS", "SHFL"}

_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,6}\*/\s+(.*?);")
_PREDICATE = re.compile(r"^@!?U?P[T0-9]+\s+")
_TARGET = re.compile(r"BRA\s+(?:\S+\s+)?`?\(?\.L_x_(\d+)")
_LABEL = re.compile(r"^\.L_x_(\d+):")


def opcodes(sass: str, loop: bool, until: str = "") -> list[str]:
    """The opcodes (with modifiers) of ``sass`` in order; ``loop``: those of its largest loop;
    ``until``: up to the last instruction whose opcode starts with it (the codes' store)."""
    lines = sass.splitlines()
    instructions: list[tuple[int, str]] = []
    labels: dict[str, int] = {}
    branches: list[tuple[int, str]] = []
    for line in lines:
        label = _LABEL.match(line.strip())
        if label:
            labels[label.group(1)] = len(instructions)
            continue
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        text = _PREDICATE.sub("", match.group(1).strip())
        target = _TARGET.search(text)
        if target:
            branches.append((len(instructions), target.group(1)))
        instructions.append((len(instructions), text.split()[0]))
    if loop:
        spans = [(labels[t], at) for at, t in branches if t in labels and labels[t] <= at]
        if spans:
            first, last = max(spans, key=lambda s: s[1] - s[0])
            instructions = instructions[first : last + 1]
    if until:
        ends = [i for i, (_, op) in enumerate(instructions) if op.startswith(until)]
        if ends:
            instructions = instructions[: ends[-1] + 1]
    return [op for _, op in instructions]


def classify(op: str) -> str:
    base = op.split(".")[0]
    if base in FULL:
        return "full"
    if base == "IMAD" and ".WIDE" in op:
        return "imad_wide"
    if base == "IMAD" and ".HI" in op:
        return "imad_hi"
    if base in HALF_MUL:
        return "imad"
    if base in HALF_ALU:
        return "alu"
    if base in XU:
        return "xu"
    if base == "MOV":
        return "mov"
    if base in MEM:
        return "mem"
    return "other"


def report(name: str, ops: list[str], elements: int) -> dict[str, float]:
    classes = collections.Counter(classify(op) for op in ops)
    per = float(elements) if elements else 1.0
    half = classes["alu"] + classes["imad"] + classes["imad_hi"] + classes["imad_wide"]
    weighted = (classes["full"] + 2 * half + 4 * classes["xu"]) / per
    counts = {k: classes[k] / per for k in ("full", "alu", "imad", "imad_hi", "imad_wide", "xu", "mov", "mem", "other")}
    print(name)
    print(
        f"  {len(ops)} instructions"
        + (f", {len(ops) / per:.2f} per element" if elements else "")
        + ": "
        + "  ".join(f"{k} {v:.2f}" for k, v in counts.items())
    )
    names = {"imad_wide": "IMAD.WIDE", "imad_hi": "IMAD.HI"}
    by_op = collections.Counter(names.get(classify(op), op.split(".")[0]) for op in ops)
    print("  " + "  ".join(f"{op} {n / per:.2f}" for op, n in by_op.most_common(24)))
    alu_cycles = 2 * classes["alu"] / per
    mul_cycles = 2 * (classes["imad"] + classes["imad_hi"] + classes["imad_wide"]) / per
    print(
        f"  weighted cycles per element (FULL + 2 * HALF + 4 * XU): {weighted:.1f};"
        f" ALU pipe alone {alu_cycles:.1f}, multiplier alone {mul_cycles:.1f}"
    )
    return {"weighted": weighted, **counts}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("family")
    parser.add_argument("names", nargs="+", help="template name expressions")
    parser.add_argument("--elements", type=int, default=0, help="elements one loop trip handles")
    parser.add_argument("--loop", action="store_true", help="count the largest loop only")
    parser.add_argument("--until", default="", help="stop at the last instruction of this opcode (e.g. STG.E.128)")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--dump", type=Path)
    args = parser.parse_args()
    options = (*compiler.BASE_OPTIONS, *kernel_options(), f"-arch={args.arch}")
    lowered, image = compiler._nvrtc_compile(
        args.family, compiler.kernel_source(args.family), args.names, options, ptx=False
    )
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(compiler.complete_elf(image))
        functions = sass_by_function(cubin)
    for name in args.names:
        sass = functions[lowered[name]]
        if args.dump:
            args.dump.write_text(sass)
        report(name, opcodes(sass, args.loop, args.until), args.elements)
    return 0


if __name__ == "__main__":
    sys.exit(main())
