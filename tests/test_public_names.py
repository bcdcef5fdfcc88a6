"""quantplan's public names, pinned: ``quantplan/__init__.py`` gathers the op modules' names from
their ``__all__``, so an op module's ``__all__`` that grows or shrinks would change what
``import quantplan`` exports. These tests hold ``qp.__all__`` and the public attributes of a fresh
``import quantplan`` to the set below."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import quantplan as qp

ROOT = Path(__file__).resolve().parents[1]

PUBLIC = frozenset(
    {
        "ArchSku",
        "BackendKind",
        "BlockQuantizedTensor",
        "BlockScaledDequantizeArgs",
        "BlockScaledDequantizeDescriptor",
        "BlockScaledDequantizePlan",
        "BlockScaledQuantizeArgs",
        "BlockScaledQuantizeDescriptor",
        "BlockScaledQuantizePlan",
        "ChannelScope",
        "DequantReduceArgs",
        "DequantReduceDescriptor",
        "DequantReducePlan",
        "DequantizeArgs",
        "DequantizeBackwardArgs",
        "DequantizeBackwardDescriptor",
        "DequantizeBackwardPlan",
        "DequantizeDescriptor",
        "DequantizePlan",
        "DynamicRangeFakeQuantizeArgs",
        "DynamicRangeFakeQuantizeDescriptor",
        "DynamicRangeFakeQuantizePlan",
        "DynamicRangeQuantizeArgs",
        "DynamicRangeQuantizeDescriptor",
        "DynamicRangeQuantizePlan",
        "ElementKind",
        "FakeQuantizeArgs",
        "FakeQuantizeBackwardArgs",
        "FakeQuantizeBackwardDescriptor",
        "FakeQuantizeBackwardPlan",
        "FakeQuantizeDescriptor",
        "FakeQuantizePlan",
        "GroupScope",
        "HOST_ARCH",
        "InvalidArgumentType",
        "InvalidProblem",
        "KernelCompileError",
        "KernelSku",
        "MathPrecision",
        "MisalignedOperand",
        "NibbleOrder",
        "OpCategory",
        "PlanPreference",
        "PrecisionGuarantee",
        "QuantMode",
        "QuantPlanError",
        "QuantizeArgs",
        "QuantizeBackwardArgs",
        "QuantizeBackwardDescriptor",
        "QuantizeBackwardPlan",
        "QuantizeDescriptor",
        "QuantizeKind",
        "QuantizePlan",
        "QuantizedTensor",
        "Rounding",
        "Scope",
        "SwizzledQuantizeArgs",
        "SwizzledQuantizeDescriptor",
        "SwizzledQuantizePlan",
        "TensorScope",
        "TokenScope",
        "Unsupported",
        "Workspace",
        "WorkspaceTooSmall",
        "__version__",
        "clear_plan_cache",
        "cuda_available",
        "dequantize",
        "fake_quantize",
        "quantize",
    }
)
#: The other public attributes of a fresh ``import quantplan``: the ``__future__`` import and the
#: subpackages its imports load.
#: The layer packages, the functional module, and the moved public modules under their old names
#: (``quantplan._MOVED_PUBLIC``: ``quantplan.types`` and so on answer as before the move; the name
#: ``fake_quantize`` stays the one-liner).
OTHER_ATTRIBUTES = frozenset({"annotations", "functional", "ops", "reference", "runtime", "vocabulary"}) | frozenset(
    qp._MOVED_PUBLIC
)
OP_MODULES = (
    "dequant_reduce",
    "dynamic_fake_quantize",
    "dynamic_range",
    "fake_quantize",
    "quantize_backward",
    "static_quantize",
    "swizzled_quantize",
)


def test_all_is_the_pinned_set() -> None:
    assert len(qp.__all__) == len(set(qp.__all__)), "a name listed twice"
    assert set(qp.__all__) == PUBLIC


def test_fresh_import_exports_the_pinned_names() -> None:
    """In a fresh interpreter (other tests import submodules and compatibility aliases, which add
    attributes): the public attributes are the pinned set, and the one-liners are functions."""
    code = (
        "import json, quantplan as qp; "
        "print(json.dumps([sorted(n for n in dir(qp) if not n.startswith('_')), "
        "[callable(qp.quantize), callable(qp.dequantize), callable(qp.fake_quantize)]]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    public, callables = json.loads(out.stdout)
    assert set(public) == (PUBLIC - {"__version__"}) | OTHER_ATTRIBUTES
    assert callables == [True, True, True]


def test_op_names_are_the_op_modules_objects() -> None:
    """Each op module's ``__all__`` names only what quantplan exports, and quantplan exports the
    module's own objects under those names."""
    for name in OP_MODULES:
        module = importlib.import_module(f"quantplan.ops.{name}")
        assert set(module.__all__) <= PUBLIC, (name, set(module.__all__) - PUBLIC)
        for attribute in module.__all__:
            assert getattr(qp, attribute) is getattr(module, attribute), (name, attribute)
