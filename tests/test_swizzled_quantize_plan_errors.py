"""CPU: SwizzledQuantizePlan descriptor and argument checks (nothing written on error), and what both qgZ plans share."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import REFERENCE
from test_dequant_reduce_plan_errors import dr_desc

import quantplan as qp
import quantplan.runtime._affine
from quantplan.vocabulary.types import ElementKind as EK

ASYM = qp.QuantMode.ASYMMETRIC


def sq_desc(**kw: object) -> qp.SwizzledQuantizeDescriptor:
    base: dict[str, object] = dict(
        shape=(4, 24), group_size=6, nodes=2, devices_per_node=2, input_element=EK.F32, output_element=EK.S8
    )
    base.update(kw)
    return qp.SwizzledQuantizeDescriptor(**base)  # type: ignore[arg-type]


# ---- descriptors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(group_size=5), "multiple of 20"),  # 96 elements, 4 slices of whole groups of 5
        (dict(group_size=7, nodes=1, devices_per_node=1), "pad the flattened tensor to 98"),
        (dict(pipeline=5), "multiple of 120"),
        (dict(group_size=0), "group_size"),
        (dict(nodes=0), "nodes"),
        (dict(devices_per_node=-1), "devices_per_node"),
        (dict(shape=(4, -24)), "negative"),
        (dict(output_element=EK.F16), "S8, U8, S4, U4"),
        (dict(input_element=EK.S8), "F16, BF16, F32"),
        (dict(q_min=-8, q_max=0), "q_max > 0"),
        (dict(mode=ASYM, output_element=EK.U8, q_min=5, q_max=5), "q_min < q_max"),
        (dict(q_min=-200), "outside"),
        (dict(error_element=EK.S8), "error_element"),
        (dict(shape=(3, 6), group_size=3, nodes=1, devices_per_node=2, output_element=EK.S4), "even"),
    ],
)
def test_swizzled_bad_descriptors_raise_invalid_problem(kw: dict[str, object], match: str) -> None:
    with pytest.raises(qp.InvalidProblem, match=match):
        qp.SwizzledQuantizePlan.select(None, sq_desc(**kw), REFERENCE)


@pytest.mark.parametrize("kw", [dict(input_element=EK.F64), dict(output_element=EK.FP8_E4M3)])
def test_swizzled_unserved_requests_raise_unsupported(kw: dict[str, object]) -> None:
    with pytest.raises(qp.Unsupported):
        qp.SwizzledQuantizePlan.select(None, sq_desc(**kw), REFERENCE)


def test_descriptors_are_frozen_hashable_and_forbid_extras() -> None:
    d = sq_desc()
    assert hash(d) == hash(sq_desc()) and d == sq_desc()
    with pytest.raises(ValueError):
        qp.SwizzledQuantizeDescriptor(**d.model_dump(), extra_field=1)
    with pytest.raises(ValueError):
        d.group_size = 3  # type: ignore[misc]
    assert d.output_shape == (1, 2, 48) and d.param_shape == (1, 2, 8) and d.groups == 16
    assert sq_desc(output_element=EK.U4, pipeline=2).output_shape == (2, 2, 12)
    r = dr_desc(output_element=EK.S4, input_element=EK.U4)
    assert r.input_shape == (2, 6) and r.input_param_shape == (2, 3) and r.output_shape == (6,)
    assert r.param_shape == (2,) and r.error_shape == (12,)


def test_reference_preference_is_honoured_on_a_gpu_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quantplan.runtime._plan, "cuda_available", lambda: True)
    assert qp.SwizzledQuantizePlan.select(None, sq_desc(), REFERENCE).backend is qp.BackendKind.REFERENCE
    assert qp.DequantReducePlan.select(None, dr_desc(), REFERENCE).backend is qp.BackendKind.REFERENCE


def test_default_preference_without_gpu_is_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quantplan.runtime._plan, "cuda_available", lambda: False)
    plan = qp.SwizzledQuantizePlan.select(None, sq_desc())
    assert plan.backend is qp.BackendKind.REFERENCE and plan.workspace_size() == 0
    sku = plan.sku()
    assert sku.variant == "numpy" and sku.op is qp.QuantizeKind.DYNAMIC_RANGE and sku.aux_element is EK.S8
    g = plan.precision_guarantee()
    assert g.math_precision is qp.MathPrecision.F32 and g.accumulator is EK.F32 and g.deterministic


# ---- arguments ---------------------------------------------------------------------------------


def test_swizzled_bad_arguments_raise_and_write_nothing(rng: np.random.Generator) -> None:
    d = sq_desc(mode=ASYM, output_element=EK.U8, error_element=EK.F16)
    plan = qp.SwizzledQuantizePlan.select(None, d, REFERENCE)
    x = rng.standard_normal((4, 24)).astype(np.float32)
    q = np.full(d.output_shape, 9, np.uint8)
    s = np.full(d.param_shape, 3.0, np.float32)
    z = np.full(d.param_shape, 4, np.int32)
    e = np.full((4, 24), 0.5, np.float16)
    A = qp.SwizzledQuantizeArgs
    bad = [
        A(x, q, s, None, e, 0.5),  # zero_point_out missing
        A(x, q, s, z, None, 0.5),  # error buffer missing
        A(x, q, s, z, e, None),  # beta missing
        A(x, q, s, z, e, 1.5),  # beta outside [0, 1]
        A(x, q, s, z, e, float("nan")),
        A(x, q, s, z, e, True),  # not a real number
        A(x, q, s, z, e.astype(np.float32), 0.5),  # error dtype
        A(x, q, s, z, e.reshape(-1), 0.5),  # error shape
        A(x.astype(np.float16), q, s, z, e, 0.5),  # input dtype
        A(x.reshape(-1), q, s, z, e, 0.5),  # input shape
        A(x, q.astype(np.int8), s, z, e, 0.5),  # output dtype
        A(x, q.reshape(-1), s, z, e, 0.5),  # output shape
        A(x, q, s.astype(np.float64), z, e, 0.5),  # scale dtype
        A(x, q, s.reshape(-1), z, e, 0.5),  # scale shape
        A(x, q, s, z.astype(np.int64), e, 0.5),  # zero point dtype
        A(x.T, q, s, z, e, 0.5),  # transposed: wrong shape
        A([1.0], q, s, z, e, 0.5),  # not an array
    ]
    for args in bad:
        with pytest.raises(qp.InvalidProblem):
            plan.run(None, None, args)
    assert (q == 9).all() and (s == 3.0).all() and (z == 4).all() and (e == 0.5).all()
    # a non-contiguous input is refused (the plan documents no stride support)
    with pytest.raises(qp.MisalignedOperand):
        plan.can_implement(A(np.asfortranarray(x), q, s, z, e, 0.5))
    assert plan.can_implement(A(x, q, s, z, e, 0.5))
    plan.run(None, None, A(x, q, s, z, e, 0.5))
    assert not (q == 9).all() and not (e == 0.5).all()


def test_swizzled_symmetric_refuses_zero_point_and_error_without_descriptor() -> None:
    d = sq_desc()
    plan = qp.SwizzledQuantizePlan.select(None, d, REFERENCE)
    x = np.ones((4, 24), np.float32)
    q = np.zeros(d.output_shape, np.int8)
    s = np.zeros(d.param_shape, np.float32)
    with pytest.raises(qp.InvalidProblem, match="zero_point_out must be None"):
        plan.run(None, None, qp.SwizzledQuantizeArgs(x, q, s, np.zeros(d.param_shape, np.int32)))
    with pytest.raises(qp.InvalidProblem, match="error_element"):
        plan.run(None, None, qp.SwizzledQuantizeArgs(x, q, s, None, np.zeros((4, 24), np.float32), 0.5))
    with pytest.raises(qp.InvalidProblem, match="error_element"):
        plan.run(None, None, qp.SwizzledQuantizeArgs(x, q, s, None, None, 0.5))
    assert not q.any() and not s.any()


def test_swizzled_accepts_bf16_as_raw_bits() -> None:
    import ml_dtypes

    d = sq_desc(input_element=EK.BF16, error_element=EK.BF16)
    plan = qp.SwizzledQuantizePlan.select(None, d, REFERENCE)
    x = np.linspace(-3, 3, 96, dtype=np.float32).reshape(4, 24).astype(ml_dtypes.bfloat16)
    e = np.full((4, 24), 0.01, ml_dtypes.bfloat16)
    e_bits = e.view(np.uint16).copy()
    q1, q2 = np.zeros(d.output_shape, np.int8), np.zeros(d.output_shape, np.int8)
    s1, s2 = np.zeros(d.param_shape, np.float32), np.zeros(d.param_shape, np.float32)
    plan.run(None, None, qp.SwizzledQuantizeArgs(x, q1, s1, None, e, 0.5))
    plan.run(None, None, qp.SwizzledQuantizeArgs(x.view(np.uint16), q2, s2, None, e_bits, 0.5))
    assert np.array_equal(q1, q2) and np.array_equal(s1, s2) and np.array_equal(e.view(np.uint16), e_bits)


def test_zero_size_runs_write_nothing() -> None:
    d = sq_desc(shape=(0, 24))
    plan = qp.SwizzledQuantizePlan.select(None, d, REFERENCE)
    assert d.output_shape == (1, 2, 0)
    plan.run(
        None,
        None,
        qp.SwizzledQuantizeArgs(
            np.zeros((0, 24), np.float32), np.zeros(d.output_shape, np.int8), np.zeros(d.param_shape, np.float32)
        ),
    )
    r = dr_desc(chunk_elements=0)
    y = np.zeros(r.output_shape, np.int8)
    qp.DequantReducePlan.select(None, r, REFERENCE).run(
        None,
        None,
        qp.DequantReduceArgs(
            np.zeros(r.input_shape, np.int8), np.zeros(r.input_param_shape, np.float32), y, np.zeros(0, np.float32)
        ),
    )
