"""Latency floors of the 16 x 8192 fp16 rows: what a kernel with the same bytes and the same
dependent chain costs at a size where launch and latency, not bandwidth, set the time.

Times, in one process with :func:`harness.time_gpu` (hot L2, as ``bench_peers.py`` times its small
rows), 5 interleaved rounds of 200 calls, the median: a device copy of the per-token row's bytes;
a pure pattern kernel (one 16-byte load and one 8-byte store per thread, no math); a minimal
per-token int8 kernel (one 1024-thread block per 8192-element row, one vector per thread: absmax
by packed-half max, warp shuffles and one shared-memory stage, then the scale, the codes and the
store; no exactness care, no rare path); the same per-token kernel where each of a row's 4 / 8 / 16
blocks loads the whole row (L2 serves the repeats), reduces it alone and quantizes its own share (no
exchange between blocks), and the MoQ row (fp16 out) in that layout with 4 blocks per row; a
minimal group(128) int8 kernel (16 threads per group, four shuffles); and the plans' 16 x 8192 rows
of the same shapes (and the MoQ fake-quantize row, beside a copy of its own bytes). Each is printed
as µs and as a multiple of the per-token copy's time.

Usage (on a GPU machine, from the repository root)::

    python3 benchmarks/bench_small_floors.py
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
for _p in (str(_HERE), str(_HERE.parent)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

SOURCE = r"""
#include <cuda_fp16.h>
extern "C" __global__ void pattern(const uint4* __restrict__ x, uint2* __restrict__ y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  uint4 v = x[i];
  y[i] = make_uint2(__byte_perm(v.x, v.y, 0x7531), __byte_perm(v.z, v.w, 0x7531));
}
__device__ __forceinline__ unsigned habs2max(unsigned a, unsigned b) {
  __half2 r = __hmax2(__habs2(*reinterpret_cast<__half2*>(&a)), __habs2(*reinterpret_cast<__half2*>(&b)));
  return *reinterpret_cast<unsigned*>(&r);
}
__device__ __forceinline__ void quant8(uint4 v, float inv, uint2* out) {
  const __half2* h = reinterpret_cast<const __half2*>(&v);
  unsigned w[2];
  #pragma unroll
  for (int k = 0; k < 2; ++k) {
    float2 a = __half22float2(h[2 * k]), b = __half22float2(h[2 * k + 1]);
    int q0 = __float2int_rn(a.x * inv), q1 = __float2int_rn(a.y * inv), q2 = __float2int_rn(b.x * inv), q3 = __float2int_rn(b.y * inv);
    w[k] = (q0 & 0xFF) | ((q1 & 0xFF) << 8) | ((q2 & 0xFF) << 16) | ((unsigned)q3 << 24);
  }
  *out = make_uint2(w[0], w[1]);
}
// per-token: one block of 1024 threads per 8192-element row, one vector per thread
extern "C" __global__ void __launch_bounds__(1024) token_rows(const uint4* __restrict__ x, uint2* __restrict__ y, float* __restrict__ s) {
  __shared__ unsigned red[32];
  __shared__ float share;
  int i = blockIdx.x * 1024 + threadIdx.x;
  uint4 v = x[i];
  unsigned m = habs2max(habs2max(v.x, v.y), habs2max(v.z, v.w));
  #pragma unroll
  for (int o = 16; o; o >>= 1) m = habs2max(m, __shfl_xor_sync(~0u, m, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x < 32) {
    m = red[threadIdx.x];
    #pragma unroll
    for (int o = 16; o; o >>= 1) m = habs2max(m, __shfl_xor_sync(~0u, m, o));
    if (threadIdx.x == 0) { __half2 h = *reinterpret_cast<__half2*>(&m); float a = fmaxf(__low2float(h), __high2float(h)); share = a; s[blockIdx.x] = a / 127.f; }
  }
  __syncthreads();
  quant8(v, 127.f / share, y + i);
}
// per-token, every block of a row loads the whole row (L2 serves the repeats) and reduces it alone
// (no cluster or grid exchange), then quantizes its own share: VPT = 1024 / blockDim vectors per
// thread, VPT blocks per row, block b's share = vectors [b * blockDim, (b + 1) * blockDim) of the row
template <int VPT>
__device__ __forceinline__ void token_redundant(const uint4* __restrict__ x, uint2* __restrict__ y, float* __restrict__ s) {
  __shared__ unsigned red[32];
  const int threads = 1024 / VPT, row = blockIdx.x / VPT, part = blockIdx.x % VPT;
  const uint4* xr = x + row * 1024 + threadIdx.x;
  const uint4 own = xr[part * threads];
  unsigned m = habs2max(habs2max(own.x, own.y), habs2max(own.z, own.w));
  #pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const uint4 v = xr[j * threads];
    m = habs2max(m, habs2max(habs2max(v.x, v.y), habs2max(v.z, v.w)));
  }
  #pragma unroll
  for (int o = 16; o; o >>= 1) m = habs2max(m, __shfl_xor_sync(~0u, m, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
  __syncthreads();
  m = red[0];
  for (int w = 1; w < threads / 32; ++w) m = habs2max(m, red[w]);
  __half2 h = *reinterpret_cast<__half2*>(&m);
  const float a = fmaxf(__low2float(h), __high2float(h));
  if (part == 0 && threadIdx.x == 0) s[row] = a / 127.f;
  quant8(own, 127.f / a, y + row * 1024 + part * threads + threadIdx.x);
}
// the MoQ row (fake quantization, fp16 out) in the same layout: 4 blocks x 256 per row
__device__ __forceinline__ uint4 fake8(uint4 v, float inv, float scale) {
  __half2* h = reinterpret_cast<__half2*>(&v);
  #pragma unroll
  for (int k = 0; k < 4; ++k) {
    float2 f = __half22float2(h[k]);
    h[k] = __floats2half2_rn(rintf(f.x * inv) * scale, rintf(f.y * inv) * scale);
  }
  return v;
}
extern "C" __global__ void __launch_bounds__(256) moq_redundant4(const uint4* __restrict__ x, uint4* __restrict__ y) {
  __shared__ unsigned red[32];
  const int row = blockIdx.x / 4, part = blockIdx.x % 4;
  const uint4* xr = x + row * 1024 + threadIdx.x;
  uint4 v[4];
  #pragma unroll
  for (int j = 0; j < 4; ++j) v[j] = xr[j * 256];
  unsigned m = 0;
  #pragma unroll
  for (int j = 0; j < 4; ++j) m = habs2max(m, habs2max(habs2max(v[j].x, v[j].y), habs2max(v[j].z, v[j].w)));
  #pragma unroll
  for (int o = 16; o; o >>= 1) m = habs2max(m, __shfl_xor_sync(~0u, m, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
  __syncthreads();
  m = red[0];
  for (int w = 1; w < 8; ++w) m = habs2max(m, red[w]);
  __half2 h = *reinterpret_cast<__half2*>(&m);
  const float a = fmaxf(__low2float(h), __high2float(h));
  const uint4 own = part == 0 ? v[0] : part == 1 ? v[1] : part == 2 ? v[2] : v[3];
  y[row * 1024 + part * 256 + threadIdx.x] = fake8(own, 127.f / a, a / 127.f);
}
extern "C" __global__ void __launch_bounds__(256) token_redundant4(const uint4* __restrict__ x, uint2* __restrict__ y, float* __restrict__ s) { token_redundant<4>(x, y, s); }
extern "C" __global__ void __launch_bounds__(128) token_redundant8(const uint4* __restrict__ x, uint2* __restrict__ y, float* __restrict__ s) { token_redundant<8>(x, y, s); }
extern "C" __global__ void __launch_bounds__(64) token_redundant16(const uint4* __restrict__ x, uint2* __restrict__ y, float* __restrict__ s) { token_redundant<16>(x, y, s); }
// group(128) symmetric int8: 16 threads per group, shuffles only
extern "C" __global__ void group_sym(const uint4* __restrict__ x, uint2* __restrict__ y, float* __restrict__ s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  uint4 v = x[i];
  unsigned m = habs2max(habs2max(v.x, v.y), habs2max(v.z, v.w));
  #pragma unroll
  for (int o = 8; o; o >>= 1) m = habs2max(m, __shfl_xor_sync(~0u, m, o));
  __half2 h = *reinterpret_cast<__half2*>(&m); float a = fmaxf(__low2float(h), __high2float(h));
  if ((threadIdx.x & 15) == 0) s[i >> 4] = a / 127.f;
  quant8(v, 127.f / a, y + i);
}
"""

ROWS, COLS = 16, 8192
#: The plans' rows timed beside the minimal kernels (bench_peers labels, fp16).
PLAN_ROWS = (
    "dynamic per-token sym int8 16x8192",
    "dynamic group(128) asym int4 16x8192",
    "static quantize per-token int8 16x8192",
    "dequantize per-token int8 16x8192",
    "MoQ fake quant row nearest 16x8192",
)


def thunks() -> dict[str, Callable[[], Any]]:
    """Name -> one call of each timed kernel on PyTorch's current stream."""
    import bench_peers as bp
    import cupy
    import numpy as np
    import torch

    import quantplan as qp

    module = cupy.RawModule(code=SOURCE, options=("-std=c++17",))

    def raw(name: str, grid: int, block: int, args: tuple[Any, ...]) -> Callable[[], Any]:
        kernel = module.get_function(name)

        def call() -> None:
            with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
                kernel((grid,), (block,), args)

        return call

    x = torch.randn(ROWS, COLS, device="cuda", dtype=torch.float16)
    y = torch.empty(ROWS, COLS, device="cuda", dtype=torch.int8)
    y16 = torch.empty_like(x)
    s = torch.empty(ROWS * COLS // 128, device="cuda", dtype=torch.float32)
    n = ROWS * COLS // 8

    def ptr(t: Any) -> Any:
        return np.uint64(t.data_ptr())

    half = (x.numel() * 2 + y.numel() + ROWS * 4 + 1) // 2  # the per-token row's bytes, half each way
    src = torch.empty(half, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    moq_src = torch.empty(x.numel() * 2, dtype=torch.uint8, device="cuda")  # the MoQ row: fp16 in, fp16 out
    moq_dst = torch.empty_like(moq_src)
    fns: dict[str, Callable[[], Any]] = {
        "copy_ of the per-token row's bytes": lambda: dst.copy_(src),
        "copy_ of the MoQ row's bytes": lambda: moq_dst.copy_(moq_src),
        "pattern 16 B in / 8 B out, 128 blocks x 128": raw("pattern", n // 128, 128, (ptr(x), ptr(y), np.int32(n))),
        "pattern 16 B in / 8 B out, 64 blocks x 256": raw("pattern", n // 256, 256, (ptr(x), ptr(y), np.int32(n))),
        "minimal per-token int8, 16 blocks x 1024": raw("token_rows", ROWS, 1024, (ptr(x), ptr(y), ptr(s))),
        "per-token, whole row per block, 64 blocks x 256": raw(
            "token_redundant4", ROWS * 4, 256, (ptr(x), ptr(y), ptr(s))
        ),
        "per-token, whole row per block, 128 blocks x 128": raw(
            "token_redundant8", ROWS * 8, 128, (ptr(x), ptr(y), ptr(s))
        ),
        "per-token, whole row per block, 256 blocks x 64": raw(
            "token_redundant16", ROWS * 16, 64, (ptr(x), ptr(y), ptr(s))
        ),
        "minimal MoQ row (fp16 out), whole row per block, 64 blocks x 256": raw(
            "moq_redundant4", ROWS * 4, 256, (ptr(x), ptr(y16))
        ),
        "minimal group(128) int8, 128 blocks x 128": raw(
            "group_sym", n // 128, 128, (ptr(x), ptr(y), ptr(s), np.int32(n))
        ),
        "minimal group(128) int8, 64 blocks x 256": raw(
            "group_sym", n // 256, 256, (ptr(x), ptr(y), ptr(s), np.int32(n))
        ),
    }
    stream = torch.cuda.current_stream()
    for spec in bp.specs():
        if spec.name in PLAN_ROWS and spec.dtype == "fp16":
            built = bp.build(spec)
            args = built.args(bp._new_set(built))
            plan = built.plan_cls.select(None, built.desc)
            ws = qp.Workspace.allocate(plan.workspace_size()) if plan.workspace_size() else None
            fns[f"plan: {spec.name}"] = lambda p=plan, w=ws, a=args: p.run(stream, w, a)
    return fns


def main() -> int:
    import statistics

    import harness
    import torch

    if not torch.cuda.is_available():
        print("bench_small_floors: no CUDA device", file=sys.stderr)
        return 2
    fns = thunks()
    rounds: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(5):
        for name, fn in fns.items():
            rounds[name].append(harness.time_gpu([fn], warmup=20, reps=200))
    copy = statistics.median(rounds["copy_ of the per-token row's bytes"])
    print("| kernel (16 x 8192 fp16) | µs | × copy |\n|---|---:|---:|")
    for name, times in rounds.items():
        us = statistics.median(times)
        print(f"| {name} | {us:.2f} | {us / copy:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
