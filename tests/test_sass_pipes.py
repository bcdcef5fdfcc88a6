"""CPU: ``benchmarks/sass_pipes.py`` parses disassembly into opcodes (the largest loop, up to the
last store) and weights them by issue pipe (one cycle for f32 arithmetic, two for the integer
logic unit and the multiplier)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import sass_pipes  # noqa: E402

SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_TID.X ;
.L_x_3:
        /*0020*/                   LDG.E.128.CONSTANT R4, desc[UR4][R2.64] ;
        /*0030*/                   IMAD.WIDE.U32 R8, R4, -0x326172a9, RZ ;
        /*0040*/                   LOP3.LUT R9, R9, R5, R6, 0x96, !PT ;
        /*0050*/                   IMAD.HI.U32 R10, R9, 0x1000000, RZ ;
        /*0060*/                   FFMA.RM R11, R10, R12, R13 ;
        /*0070*/                   FMUL.RZ R11, R11, 0.25 ;
        /*0080*/                   IMAD R11, R11, 0x40, R14 ;
        /*0090*/               @P0 SHF.L.W.U32.HI R15, R11, 0x4, R15 ;
        /*00a0*/                   STG.E.128 desc[UR4][R16.64], R12 ;
        /*00b0*/                   ISETP.GE.AND P1, PT, R2, R3, PT ;
        /*00c0*/              @!P1 BRA `(.L_x_3) ;
        /*00d0*/                   EXIT ;
"""


def test_opcodes_of_the_loop_up_to_the_store() -> None:
    every = sass_pipes.opcodes(SASS, loop=False)
    assert every[:2] == ["MOV", "S2R"] and every[-1] == "EXIT" and len(every) == 14
    loop = sass_pipes.opcodes(SASS, loop=True)
    assert loop[0].startswith("LDG") and loop[-1] == "BRA" and len(loop) == 11
    hot = sass_pipes.opcodes(SASS, loop=True, until="STG")
    assert hot == [
        "LDG.E.128.CONSTANT",
        "IMAD.WIDE.U32",
        "LOP3.LUT",
        "IMAD.HI.U32",
        "FFMA.RM",
        "FMUL.RZ",
        "IMAD",
        "SHF.L.W.U32.HI",
        "STG.E.128",
    ]


@pytest.mark.parametrize(
    ("op", "kind"),
    [
        ("FFMA.RM", "full"),
        ("HADD2.F32", "full"),
        ("LOP3.LUT", "alu"),
        ("FMNMX", "alu"),
        ("VIMNMX3.U16x2", "alu"),
        ("IMAD.WIDE.U32", "imad_wide"),
        ("IMAD.HI.U32", "imad_hi"),
        ("IMAD.SHL.U32", "imad"),
        ("I2F.U32", "xu"),
        ("LDG.E.128", "mem"),
        ("MOV", "mov"),
        ("BRA", "other"),
    ],
)
def test_classify(op: str, kind: str) -> None:
    assert sass_pipes.classify(op) == kind


def test_weighted_cycles() -> None:
    hot = sass_pipes.opcodes(SASS, loop=True, until="STG")
    counts = sass_pipes.report("synthetic", hot, elements=2)
    # FFMA + FMUL full rate; LOP3, SHF, IMAD, IMAD.HI, IMAD.WIDE at two cycles; per element of two.
    assert counts["weighted"] == pytest.approx((2 + 2 * 5) / 2)
    assert counts["alu"] == pytest.approx(1.0) and counts["imad_wide"] == pytest.approx(0.5)
