"""quantplan: GPU quantization kernels behind a plan-based, typed API.

Describe a problem with a descriptor, ``select`` a plan for it, ``run`` it on a stream::

    import quantplan as qp
    desc = qp.QuantizeDescriptor(shape=(16, 4096), scope=qp.TokenScope(),
                                 input_element=qp.ElementKind.F32, output_element=qp.ElementKind.S8)
    plan = qp.QuantizePlan.select(None, desc)
    plan.run(None, None, qp.QuantizeArgs(input=x, output=q, scale=s))

Or, in one line (the functional layer, :mod:`quantplan.functional`)::

    qt = qp.quantize(x, "int8", scope=qp.TokenScope())   # codes, scale; qt.dequantize()

Plans run the CUDA kernels of ``kernels/`` when a GPU is present and the NumPy reference backend
(:mod:`quantplan.reference`) otherwise, with the same results bit for bit.
"""

from __future__ import annotations

# The functional layer last: it builds on the plans above (qp.quantize is the function, not a module).
from quantplan._frontend import clear_plan_cache  # noqa: E402
from quantplan.functional import BlockQuantizedTensor, QuantizedTensor, dequantize, fake_quantize, quantize  # noqa: E402
from quantplan.ops import dequant_reduce as _dequant_reduce
from quantplan.ops import dynamic_fake_quantize as _dynamic_fake_quantize
from quantplan.ops import dynamic_range as _dynamic_range
from quantplan.ops import fake_quantize as _fake_quantize
from quantplan.ops import quantize_backward as _quantize_backward
from quantplan.ops import static_quantize as _static_quantize
from quantplan.ops import swizzled_quantize as _swizzled_quantize
from quantplan.ops.block_scaled import (
    BlockScaledDequantizeArgs,
    BlockScaledDequantizeDescriptor,
    BlockScaledDequantizePlan,
    BlockScaledQuantizeArgs,
    BlockScaledQuantizeDescriptor,
    BlockScaledQuantizePlan,
)
from quantplan.ops.dequant_reduce import *  # noqa: F403
from quantplan.ops.dynamic_fake_quantize import *  # noqa: F403
from quantplan.ops.dynamic_range import *  # noqa: F403
from quantplan.ops.fake_quantize import *  # noqa: F403
from quantplan.ops.quantize_backward import *  # noqa: F403
from quantplan.ops.static_quantize import *  # noqa: F403
from quantplan.ops.swizzled_quantize import *  # noqa: F403
from quantplan.runtime._device import cuda_available
from quantplan.runtime.workspace import Workspace
from quantplan.vocabulary._version import __version__
from quantplan.vocabulary.errors import (
    InvalidArgumentType,
    InvalidProblem,
    KernelCompileError,
    MisalignedOperand,
    QuantPlanError,
    Unsupported,
    WorkspaceTooSmall,
)
from quantplan.vocabulary.types import (
    HOST_ARCH,
    ArchSku,
    BackendKind,
    ChannelScope,
    ElementKind,
    GroupScope,
    KernelSku,
    MathPrecision,
    NibbleOrder,
    OpCategory,
    PlanPreference,
    PrecisionGuarantee,
    QuantizeKind,
    QuantMode,
    Rounding,
    Scope,
    TensorScope,
    TokenScope,
)

#: The public modules that moved into a layer folder, by their old top-level name (ARCHITECTURE.md,
#: "Public import paths"). They are registered here, at import: ``import quantplan.types`` then
#: finds the moved module loaded, so the import system binds no package attribute over a public
#: function of the same name (``quantplan.fake_quantize`` stays the one-liner), and
#: ``quantplan.types`` answers as it did before the move. The alias files at the old paths serve
#: static tools (mypy, IDEs).
_MOVED_PUBLIC = {
    "types": "vocabulary.types",
    "errors": "vocabulary.errors",
    "elements": "vocabulary.elements",
    "formats": "vocabulary.formats",
    "philox": "vocabulary.philox",
    "workspace": "runtime.workspace",
    "compiler": "runtime.compiler",
    "reference_block_scaled": "reference.block_scaled",
    "static_quantize": "ops.static_quantize",
    "quantize_backward": "ops.quantize_backward",
    "dynamic_range": "ops.dynamic_range",
    "fake_quantize": "ops.fake_quantize",
    "dynamic_fake_quantize": "ops.dynamic_fake_quantize",
    "swizzled_quantize": "ops.swizzled_quantize",
    "dequant_reduce": "ops.dequant_reduce",
    "block_scaled": "ops.block_scaled",
}


def _register_moved_public() -> None:
    import importlib
    import sys

    names = globals()
    for old, new in _MOVED_PUBLIC.items():
        module = importlib.import_module(f"quantplan.{new}")
        sys.modules.setdefault(f"quantplan.{old}", module)
        names.setdefault(old, module)  # a public function of that name keeps it


_register_moved_public()

__all__ = [
    "HOST_ARCH",
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
    "ElementKind",
    "GroupScope",
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
    "QuantizeKind",
    "QuantizedTensor",
    "Rounding",
    "Scope",
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
]
# Each op module's ``__all__`` is exactly the names quantplan re-exports from it.
__all__ += _dequant_reduce.__all__
__all__ += _dynamic_fake_quantize.__all__
__all__ += _dynamic_range.__all__
__all__ += _fake_quantize.__all__
__all__ += _quantize_backward.__all__
__all__ += _static_quantize.__all__
__all__ += _swizzled_quantize.__all__
