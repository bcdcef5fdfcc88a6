"""Drop-in replacements for other libraries' quantization entry points, running on quantplan's plans.

* :mod:`quantplan.compat.deepspeed`: DeepSpeed's quantizer functions (``quantize``,
  ``dequantize``, ``swizzle_quant``, ``quantized_reduction``, the LoCo variants and the MoQ fake
  quantizers) with DeepSpeed's signatures, parameter layouts and formulas, without its size
  limits and defects (each difference is listed in that module's docstring).
"""

from __future__ import annotations

from quantplan.compat import deepspeed

__all__ = ["deepspeed"]
