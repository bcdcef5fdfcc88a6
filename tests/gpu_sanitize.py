"""Every plan family once per configuration, on ragged and kernel-path shapes, for compute-sanitizer.

Usage (on a GPU machine, from the repository root)::

    compute-sanitizer --tool memcheck --error-exitcode 1 python3 tests/gpu_sanitize.py
    compute-sanitizer --tool racecheck --error-exitcode 1 python3 tests/gpu_sanitize.py

Each configuration of the bad-input table (``tests/test_bad_inputs.py``: every plan, scope, mode,
rounding and LoCo variant) runs on PyTorch CUDA operands at its own small shape and at the extra shapes
below (the dense / vector kernels of larger rows, ragged rows and groups), twice: operands at
aligned addresses, and carved one element into a buffer (the element-I/O twins). Each output is
compared bit for bit with the reference backend's, so a kernel that reads or writes out of bounds
without faulting still fails here. Prints one line per run and exits 1 on any difference.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_bad_inputs as table  # noqa: E402

import quantplan as qp  # noqa: E402
from quantplan.vocabulary.errors import QuantPlanError  # noqa: E402

F16, BF16 = qp.ElementKind.F16, qp.ElementKind.BF16
G128 = qp.GroupScope(axis=-1, group_size=128)
G100 = qp.GroupScope(axis=-1, group_size=100)
#: Extra descriptor fields per configuration family, each tried where the configuration takes it:
#: the 16-bit vector / dense kernels of long rows and groups, and ragged rows and groups.
EXTRA: dict[str, list[dict[str, Any]]] = {
    "quantize": [
        dict(shape=(37, 4103), input_element=F16),
        dict(shape=(16, 8192), input_element=BF16),
        dict(shape=(24, 1024), input_element=F16, scope=G128, output_element=qp.ElementKind.S4),
        dict(shape=(5, 1000), input_element=F16, scope=G100),
    ],
    "dequantize": [
        dict(shape=(37, 4103), output_element=F16),
        dict(shape=(24, 1024), output_element=F16, scope=G128, input_element=qp.ElementKind.S4),
    ],
    "dynamic_range": [
        dict(shape=(33, 4096), input_element=F16),
        dict(shape=(16, 8192), input_element=BF16),
        dict(shape=(24, 1024), input_element=F16, scope=G128),
        dict(shape=(7, 1000), input_element=F16, scope=G100),
        dict(shape=(7, 1000), input_element=F16),
    ],
    "fake_quantize": [dict(shape=(37, 4103), element=F16), dict(shape=(16, 8192), element=BF16)],
    "dynamic_fake": [dict(shape=(33, 4096), element=F16), dict(shape=(16, 8192), element=BF16)],
    "quantize_backward": [dict(shape=(37, 4103), input_element=F16)],
    "dequantize_backward": [dict(shape=(37, 4103), output_element=F16)],
    "swizzled": [
        dict(shape=(8, 4096), group_size=512, nodes=1, devices_per_node=8, input_element=F16),
        dict(shape=(3, 1000), group_size=100, nodes=2, devices_per_node=2, input_element=F16),
    ],
    "dequant_reduce": [
        dict(peers=8, chunk_elements=8192, input_group_size=512, output_group_size=512),
        dict(peers=3, chunk_elements=1000, input_group_size=100, output_group_size=125),
    ],
}


def _variants(base: str) -> list[dict[str, Any]]:
    """Keyword sets for ``make_setup``'s function: the configuration itself and its extras."""
    _, kw = table.BASES[base]
    return [dict(kw)] + [{**kw, **extra} for extra in EXTRA.get(base.split(".")[0], [])]


def _run(setup: Any, ops: Any, offset_elements: int) -> tuple[dict[str, Any], Any]:
    """Run the plan of ``setup`` on ``ops``'s backend; arrays carved ``offset_elements`` in."""
    plan = setup.plan_cls.select(None, setup.desc, ops.pref)
    fields: dict[str, Any] = {}
    keep = []
    for name, value in setup.host.items():
        if isinstance(value, np.ndarray):
            if offset_elements and ops.name != "numpy":
                offset = offset_elements * value.dtype.itemsize
                buf = ops.buffer(value.nbytes + offset)
                view = _carve(ops, buf, offset, value)
                view[...] = ops.asarray(value).reshape(view.shape) if value.size else view
                keep.append(buf)
                fields[name] = view
            else:
                fields[name] = ops.asarray(value)
        else:
            fields[name] = value
    nbytes = plan.workspace_size()
    ws = qp.Workspace.allocate(nbytes, device=ops.name != "numpy") if nbytes else None
    plan.run(None, ws, setup.args_cls(**fields))
    return fields, keep


def main() -> int:
    """Run every configuration; ``--dry``: both sides on the reference backend (no GPU: checks the script)."""
    dry = "--dry" in sys.argv
    gpu, ref = table.Ops("numpy" if dry else "torch"), table.Ops("numpy")  # PyTorch: bfloat16 too
    sync = (lambda: None) if dry else _sync
    failures = runs = 0
    for base in sorted(table.BASES):
        fn, _ = table.BASES[base]
        for kw in _variants(base):
            try:
                setup = _retyped(fn(np.random.default_rng(runs), **kw))
                want, _ = _run(setup, ref, 0)
            except QuantPlanError:
                continue  # a variant this configuration's setup does not make
            for offset in (0, 1):
                try:
                    got, _keep = _run(setup, gpu, offset)
                except QuantPlanError as exc:  # e.g. a misaligned parameter array the plan refuses
                    print(f"skip {base} {kw.get('shape', '')} offset {offset}: {type(exc).__name__}")
                    continue
                except Exception as exc:  # the script's own trouble: reported, the other runs go on
                    print(f"ERROR {base} {kw.get('shape', '')} offset {offset}: {type(exc).__name__}: {exc}")
                    failures += 1
                    continue
                sync()
                runs += 1
                bad = [
                    name
                    for name in setup.outputs
                    if gpu.snapshot(got[name]) != ref.snapshot(want[name]) and not _nan_equal(got[name], want[name])
                ]
                status = "ok" if not bad else f"DIFFERS in {bad}"
                failures += bool(bad)
                shape = getattr(setup.desc, "shape", getattr(setup.desc, "numel", ""))
                print(f"{base} {shape} {kw.get('scope', '')} offset {offset}: {status}", flush=True)
    compat_runs, compat_failures = _compat(dry)
    runs, failures = runs + compat_runs, failures + compat_failures
    print(f"{runs} runs, {failures} differing")
    return 1 if failures else 0


def _carve(ops: Any, buf: Any, offset: int, value: np.ndarray) -> Any:
    """A view like ``value`` carved ``offset`` bytes into ``buf`` (bfloat16 through its int16 bits)."""
    if ops.name == "torch" and value.dtype.name == "bfloat16":
        import torch

        piece = buf[offset : offset + value.nbytes]
        return piece.view(torch.int16).view(torch.bfloat16).reshape(value.shape)
    return ops.carve(buf, offset, value.shape, value.dtype)


def _compat(dry: bool) -> tuple[int, int]:
    """``quantplan.compat.deepspeed``'s functions (their own kernels) on ragged shapes against
    their NumPy backend: quantize / dequantize (8 and 4 bits, both modes), swizzle, quantized
    reduction, the MoQ fake quantization (nearest; stochastic with a fixed seed)."""
    from quantplan.compat import deepspeed as ds

    rng = np.random.default_rng(7)
    to_dev: Any = (lambda a: a) if dry else _to_cupy
    runs = failures = 0

    def compare(name: str, got: Any, want: Any) -> None:
        nonlocal runs, failures
        got_t = got if isinstance(got, tuple) else (got,)
        want_t = want if isinstance(want, tuple) else (want,)
        same = all(_host(g).tobytes() == np.asarray(w).tobytes() for g, w in zip(got_t, want_t, strict=True))
        runs += 1
        failures += not same
        print(f"compat {name}: {'ok' if same else 'DIFFERS'}", flush=True)

    for shape, groups in (((3, 1000), 24), ((16, 8192), 16), ((6, 77), 3)):
        for bits in (8, 4):
            for qt in (ds.Symmetric, ds.Asymmetric):
                if bits == 8 and qt is ds.Asymmetric or shape == (6, 77) and bits == 8:
                    continue
                x = rng.standard_normal(shape).astype(np.float16)
                want = ds.quantize(x, groups, bits, qt)
                compare(f"quantize {shape} {bits}b {qt}", ds.quantize(to_dev(x), groups, bits, qt), want)
                q, p = want
                back = ds.dequantize(q, p, groups, bits, qt)
                compare(f"dequantize {shape} {bits}b", ds.dequantize(to_dev(q), to_dev(p), groups, bits, qt), back)
    x = rng.standard_normal((8, 4096)).astype(np.float16)
    for bits in (8, 4):
        want = ds.swizzle_quant(x, 64, bits, ds.Symmetric, 1, 1, 8)
        compare(f"swizzle_quant {bits}b", ds.swizzle_quant(to_dev(x), 64, bits, ds.Symmetric, 1, 1, 8), want)
        q, p = want
        red = ds.quantized_reduction(q, p, 64, 8, bits, ds.Symmetric, 8)
        compare(
            f"quantized_reduction {bits}b",
            ds.quantized_reduction(to_dev(q), to_dev(p), 64, 8, bits, ds.Symmetric, 8),
            red,
        )
    for fn in (ds.ds_quantize_fp16, ds.ds_quantize_asym_fp16):
        v = rng.standard_normal((12, 1000)).astype(np.float16)
        dev = to_dev(v.copy())
        fn(dev, 12, 8)
        compare(f"{fn.__name__}", dev, fn(v.copy(), 12, 8))
    return runs, failures


def _to_cupy(a: np.ndarray) -> Any:
    import cupy

    return cupy.asarray(a)


def _host(a: Any) -> np.ndarray:
    if isinstance(a, np.ndarray):
        return a
    import cupy

    return cupy.asnumpy(a)


def _retyped(setup: Any) -> Any:
    """``setup`` with its float32 data arrays (the problem's shape) in the descriptor's float
    element (the table's setups make float32 data; the extras ask for 16-bit kinds)."""
    from quantplan.vocabulary.elements import ELEMENTS

    d = setup.desc
    kinds = [getattr(d, name, None) for name in ("element", "input_element", "output_element", "error_element")]
    floats = [k for k in kinds if k is not None and ELEMENTS[k].is_float and k is not qp.ElementKind.F32]
    shape = getattr(d, "shape", None)
    if not floats or shape is None:
        return setup
    dtype = ELEMENTS[floats[0]].numpy_dtype
    for name, value in setup.host.items():
        if isinstance(value, np.ndarray) and value.dtype == np.float32 and value.shape == tuple(shape):
            setup.host[name] = value.astype(dtype)
    return setup


def _sync() -> None:
    import torch

    torch.cuda.synchronize()


def _nan_equal(got: Any, want: np.ndarray) -> bool:
    """Float outputs equal up to NaN payloads."""
    if isinstance(got, np.ndarray):
        g = got
    else:
        g = np.frombuffer(table.Ops("torch").snapshot(got), want.dtype).reshape(want.shape)
    if want.dtype.kind != "f" or g.dtype != want.dtype:
        return False
    nan = np.isnan(want)
    return bool(np.array_equal(np.isnan(g), nan) and np.array_equal(g[~nan], want[~nan]))


if __name__ == "__main__":
    sys.exit(main())
