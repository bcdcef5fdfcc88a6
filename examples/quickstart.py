"""quantplan quickstart: quantize per token to int8 and per group to int4, dequantize, check.

Runs on the GPU (CUDA kernels) when CuPy sees one, else on the NumPy reference backend. On a GPU
it also runs the reference and reports whether the two agree bit for bit; without one, the
reference backend is what ran, so there is nothing to compare and it says so.

    python examples/quickstart.py
"""

from __future__ import annotations

import numpy as np

import quantplan as qp

EK = qp.ElementKind
REFERENCE = qp.PlanPreference(backend=qp.BackendKind.REFERENCE)


def run_case(title: str, x: np.ndarray, scope: qp.Scope, code: qp.ElementKind, q_max: int, on_gpu: bool) -> None:
    qdesc = qp.QuantizeDescriptor(shape=x.shape, scope=scope, input_element=EK.F32, output_element=code)
    ddesc = qp.DequantizeDescriptor(shape=x.shape, scope=scope, input_element=code, output_element=EK.F32)
    # Scales from the data: absmax of each segment / q_max (what the dynamic-range plan fuses).
    groups = qdesc.param_shape
    seg = x.reshape(*groups[:-1], groups[-1], -1) if isinstance(scope, qp.GroupScope) else x
    amax = np.abs(seg).max(axis=-1).reshape(groups)
    scale = np.where(amax > 0, amax / q_max, 1.0).astype(np.float32)

    q_ref = np.zeros(qdesc.output_shape, np.int8 if code is EK.S8 else np.uint8)
    y_ref = np.zeros(x.shape, np.float32)
    qp.QuantizePlan.select(None, qdesc, REFERENCE).run(None, None, qp.QuantizeArgs(x, q_ref, scale))
    qp.DequantizePlan.select(None, ddesc, REFERENCE).run(None, None, qp.DequantizeArgs(q_ref, y_ref, scale))

    if on_gpu:
        import cupy as cp

        stream = cp.cuda.Stream(non_blocking=True)
        qplan = qp.QuantizePlan.select(stream, qdesc)
        dplan = qp.DequantizePlan.select(stream, ddesc)
        xd, sd = cp.asarray(x), cp.asarray(scale)
        qd = cp.zeros(qdesc.output_shape, q_ref.dtype)
        yd = cp.zeros(x.shape, cp.float32)
        qplan.run(stream, None, qp.QuantizeArgs(xd, qd, sd))
        dplan.run(stream, None, qp.DequantizeArgs(qd, yd, sd))
        stream.synchronize()
        q, y = qd.get(), yd.get()
        same = np.array_equal(q, q_ref) and np.array_equal(y, y_ref)
        backend = f"CUDA ({qplan.sku().arch}, variant {qplan.sku().variant})"
        check = f"equals reference:  {'yes, bit for bit' if same else 'NO: the CUDA kernels and the reference differ'}"
    else:
        q, y, backend = q_ref, y_ref, "REFERENCE (NumPy)"
        check = "reference check:   not run (this was the reference backend; on a GPU the kernels are compared to it)"

    err = np.abs(y - x)
    rel = np.linalg.norm(y - x) / np.linalg.norm(x)
    print(f"{title}")
    print(f"  backend:           {backend}")
    print(f"  codes:             {q.dtype} {q.shape}, scales {scale.shape}")
    print(f"  max |y - x|:       {err.max():.4g} (half a step is at most {0.5 * scale.max():.4g})")
    print(f"  relative L2 error: {rel:.3e}")
    print(f"  {check}")


def main() -> None:
    on_gpu = qp.cuda_available()
    print(f"quantplan {qp.__version__}: {'GPU found' if on_gpu else 'no GPU, using the reference backend'}\n")
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((64, 1000)) * np.exp(rng.uniform(-2, 2, (64, 1)))).astype(np.float32)
    run_case("per-token symmetric int8 (W8A8 activations)", x, qp.TokenScope(), EK.S8, 127, on_gpu)
    run_case(
        "per-group(100) symmetric int4, packed (W4A16 weights)", x, qp.GroupScope(group_size=100), EK.S4, 7, on_gpu
    )


if __name__ == "__main__":
    main()
