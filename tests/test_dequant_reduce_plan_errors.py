"""CPU: DequantReducePlan descriptor and argument checks (nothing written on error)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import REFERENCE

import quantplan as qp
from quantplan.vocabulary.types import ElementKind as EK

ASYM = qp.QuantMode.ASYMMETRIC


def dr_desc(**kw: object) -> qp.DequantReduceDescriptor:
    base: dict[str, object] = dict(
        peers=2, chunk_elements=12, input_group_size=4, output_group_size=6, input_element=EK.S8, output_element=EK.S8
    )
    base.update(kw)
    return qp.DequantReduceDescriptor(**base)  # type: ignore[arg-type]


# ---- descriptors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(peers=0), "peers"),
        (dict(chunk_elements=-4), "chunk_elements"),
        (dict(input_group_size=5), "input_group_size=5 does not divide"),
        (dict(output_group_size=8), "output_group_size=8 does not divide"),
        (dict(output_group_size=0), "output_group_size"),
        (dict(input_element=EK.F32), "S8, U8, S4, U4"),
        (dict(output_element=EK.S4, chunk_elements=9, input_group_size=3, output_group_size=3), "even"),
        (dict(mode=ASYM, output_element=EK.U4, q_min=3, q_max=2), "q_min < q_max"),
        (dict(error_element=EK.F64), "error_element"),
    ],
)
def test_dequant_reduce_bad_descriptors_raise_invalid_problem(kw: dict[str, object], match: str) -> None:
    with pytest.raises(qp.InvalidProblem, match=match):
        qp.DequantReducePlan.select(None, dr_desc(**kw), REFERENCE)


def test_dequant_reduce_fp8_is_unsupported() -> None:
    with pytest.raises(qp.Unsupported):
        qp.DequantReducePlan.select(None, dr_desc(output_element=EK.FP8_E5M2), REFERENCE)


# ---- arguments ---------------------------------------------------------------------------------


def test_dequant_reduce_bad_arguments_raise_and_write_nothing() -> None:
    d = dr_desc(mode=ASYM, input_element=EK.U8, output_element=EK.U4, error_element=EK.F32)
    plan = qp.DequantReducePlan.select(None, d, REFERENCE)
    q = np.ones(d.input_shape, np.uint8)
    s = np.ones(d.input_param_shape, np.float32)
    z = np.zeros(d.input_param_shape, np.int32)
    y = np.full(d.output_shape, 7, np.uint8)
    s_out = np.full(d.param_shape, 3.0, np.float32)
    z_out = np.full(d.param_shape, 4, np.int32)
    e = np.full(d.error_shape, 0.5, np.float32)
    A = qp.DequantReduceArgs
    bad = [
        A(q, s, y, s_out, None, z_out, e, 0.5),  # input zero point missing
        A(q, s, y, s_out, z, None, e, 0.5),  # output zero point missing
        A(q.astype(np.int8), s, y, s_out, z, z_out, e, 0.5),  # input dtype
        A(q[:1], s, y, s_out, z, z_out, e, 0.5),  # peers
        A(q, s[:, :2], y, s_out, z, z_out, e, 0.5),  # input params shape
        A(q, s, np.zeros(12, np.uint8), s_out, z, z_out, e, 0.5),  # output shape (4-bit: 6 bytes)
        A(q, s, y, s_out, z, z_out, e[:6], 0.5),  # error shape
        A(q, s, y, s_out, z, z_out, e, -0.1),  # beta
        A(q, s, y, s_out, z, z_out, None, 0.5),  # error missing
    ]
    for args in bad:
        with pytest.raises(qp.InvalidProblem):
            plan.run(None, None, args)
    assert (y == 7).all() and (s_out == 3.0).all() and (z_out == 4).all() and (e == 0.5).all()
    plan.run(None, None, A(q, s, y, s_out, z, z_out, e, 0.5))
    assert not (y == 7).all() and not (e == 0.5).all()
