"""How fast can pure data movement go on this GPU? Load/store kernels with no math, side by side
with the harness's floor and a copy, at the read:write ratios of the block-scaled rows.

    python3 benchmarks/probe_ceiling.py [--mib 128]

Ratios: 2:1 (16-bit input to 8-bit codes: FP8 and MXFP8 rows) and 1:1 (the fused rowwise +
columnwise copies). Designs, each a one-pass grid unless named persistent:

- ``v1``: one 16-byte load and one store per thread (the harness floor's kernel);
- ``v4c``: four consecutive 16-byte vectors per thread (the 1-D block-scaled kernel's access);
- ``v4s``: four 16-byte vectors per thread, a block's width apart (each instruction coalesced);
- ``*_256``: the same loads with the ``L2::256B`` prefetch-size hint (``ld.global.nc``);
- ``transpose`` (1:1 only): the fused transpose's bytes with no math (128 x 128 tiles of a
  square 16-bit x, one byte per element stored row-major and one transposed), each lane storing
  32 bytes of one transposed row; ``transpose_lines``: the same with the quantizer's phase B (a
  warp's stores whole 128-byte lines, a swizzled shared tile);
- ``bulk``: persistent CTAs of one warp whose lane 0 streams chunks through shared memory with
  ``cp.async.bulk`` loads (mbarrier-completed) and bulk stores, ``STAGES`` stages deep.

Each row: median µs (harness.time_gpu) and the effective bandwidth (bytes read + written).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
for _p in (str(_HERE), str(_HERE.parent)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import harness  # noqa: E402

SOURCE = r"""
typedef unsigned int u32;
typedef unsigned long long u64;

template <bool HINT> __device__ __forceinline__ uint4 load16(const uint4* p) {
  uint4 v;
  if (HINT)
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  else
    v = __ldg(p);
  return v;
}

// W = 8: half the bytes written (2:1); W = 16: as many (1:1).
template <int W> __device__ __forceinline__ void store_from(unsigned char* y, long long i, uint4 v) {
  if (W == 8)
    reinterpret_cast<uint2*>(y)[i] = make_uint2(v.x ^ v.y, v.z ^ v.w);
  else
    reinterpret_cast<uint4*>(y)[i] = v;
}

template <int W, bool HINT> __global__ void __launch_bounds__(256) move_v1(const uint4* x, unsigned char* y, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  store_from<W>(y, i, load16<HINT>(x + i));
}

// Four consecutive vectors per thread.
template <int W, bool HINT> __global__ void __launch_bounds__(256, 4) move_v4c(const uint4* x, unsigned char* y, long long n) {
  long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 4;
  if (i >= n) return;
  uint4 v[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) v[k] = load16<HINT>(x + i + k);
#pragma unroll
  for (int k = 0; k < 4; ++k) store_from<W>(y, i + k, v[k]);
}

// Four vectors per thread, blockDim apart.
template <int W, bool HINT> __global__ void __launch_bounds__(256, 4) move_v4s(const uint4* x, unsigned char* y, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x * 4 + threadIdx.x;
  if (i + 3 * blockDim.x >= n) return;
  uint4 v[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) v[k] = load16<HINT>(x + i + k * blockDim.x);
#pragma unroll
  for (int k = 0; k < 4; ++k) store_from<W>(y, i + k * blockDim.x, v[k]);
}

__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// Persistent: chunks of CHUNK bytes of x, each stored as its first CHUNK * W / 16 bytes.
template <int W, int CHUNK, int STAGES>
__global__ void __launch_bounds__(32) move_bulk(const unsigned char* x, unsigned char* y, long long chunks) {
  extern __shared__ __align__(128) unsigned char stage[];
  __shared__ __align__(8) u64 bar[STAGES];
  if (threadIdx.x != 0) return;
  constexpr int OUT = CHUNK * W / 16;
  for (int s = 0; s < STAGES; ++s)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&bar[s])));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  auto issue = [&](long long c, int s) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(&bar[s])), "r"(CHUNK) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem_addr(stage + s * CHUNK)), "l"(x + c * CHUNK), "r"(CHUNK), "r"(smem_addr(&bar[s]))
                 : "memory");
  };
  long long first = blockIdx.x;
  for (int s = 0; s < STAGES; ++s) {
    long long c = first + (long long)s * gridDim.x;
    if (c < chunks) issue(c, s);
  }
  for (long long it = 0;; ++it) {
    long long c = first + it * gridDim.x;
    if (c >= chunks) break;
    int s = (int)(it % STAGES);
    u32 parity = (u32)((it / STAGES) & 1);
    u32 done = 0;
    while (!done)
      asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                   : "=r"(done) : "r"(smem_addr(&bar[s])), "r"(parity) : "memory");
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                 ::"l"(y + c * OUT), "r"(smem_addr(stage + s * CHUNK)), "r"(OUT) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    // The previous chunk's store has read its stage: refill that stage.
    asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
    if (it > 0) {
      long long nc = first + (it - 1 + STAGES) * gridDim.x;
      if (nc < chunks) issue(nc, (int)((it - 1) % STAGES));
    }
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// Phase A of both transpose kernels: this CTA's 128 x 128 tile of 16-bit x into v (thread t: the 8
// elements at column 8 (t % 16) of rows t / 16 + 16 p); PF: then the L2 prefetch of the tile half a
// wave (MIN_BLOCKS CTAs a multiprocessor) ahead in launch order, one 128-byte line per thread, as
// the quantizer does; then each element's high byte stored row-major into y_r (the rowwise copy)
// and each vector handed to to_shared(tile row, 16-byte column, vector); then the CTA's barrier.
template <int MIN_BLOCKS, bool PF, class ToShared>
__device__ __forceinline__ void tile_phase_a(const unsigned short* x, unsigned char* y_r, long long cols,
                                             ToShared to_shared) {
  const int t = threadIdx.x, ci = t % 16, rp = t / 16;
  uint4 v[8];
  const long long r0 = (long long)blockIdx.y * 128, c0 = (long long)blockIdx.x * 128;
#pragma unroll
  for (int p = 0; p < 8; ++p)
    v[p] = *reinterpret_cast<const uint4*>(x + (r0 + rp + 16 * p) * cols + c0 + ci * 8);
  if (PF) {
    u32 sms;
    asm("mov.u32 %0, %%nsmid;" : "=r"(sms));
    const u32 n = blockIdx.y * gridDim.x + blockIdx.x + MIN_BLOCKS * sms / 2;
    if (n < gridDim.x * gridDim.y) {
      const long long pr = (long long)(n / gridDim.x) * 128, pc = (long long)(n % gridDim.x) * 128;
      asm volatile("prefetch.global.L2 [%0];" ::"l"(x + (pr + t / 2) * cols + pc + (t % 2) * 64));
    }
  }
#pragma unroll
  for (int p = 0; p < 8; ++p) {
    const u32 lo = __byte_perm(v[p].x, v[p].y, 0x7531), hi = __byte_perm(v[p].z, v[p].w, 0x7531);
    *reinterpret_cast<uint2*>(y_r + (r0 + rp + 16 * p) * cols + c0 + ci * 8) = make_uint2(lo, hi);
    to_shared(rp + 16 * p, ci, v[p]);
  }
  __syncthreads();
}

// The fused transpose's bytes with no math: a CTA of 256 threads reads a 128 x 128 tile of 16-bit
// x (rows of cols elements), stores one byte per element row-major (y_r [rows, cols]) and one byte
// per element transposed (y_c [cols, rows]). Shared rows padded by one word (column reads of 32
// consecutive rows fall in 32 banks). PF: load_tile's prefetch.
template <int MIN_BLOCKS, bool PF>
__global__ void __launch_bounds__(256, MIN_BLOCKS)
    move_transpose(const unsigned short* __restrict__ x, unsigned char* __restrict__ y_r,
                   unsigned char* __restrict__ y_c, long long rows, long long cols) {
  constexpr int SW = 65;  // words per shared row: 64 + 1
  __shared__ u32 tile[128 * SW];
  const int t = threadIdx.x;
  const long long r0 = (long long)blockIdx.y * 128, c0 = (long long)blockIdx.x * 128;
  tile_phase_a<MIN_BLOCKS, PF>(x, y_r, cols, [&](int r, int ci, uint4 v) {
    u32* row = tile + r * SW + ci * 4;
    row[0] = v.x, row[1] = v.y, row[2] = v.z, row[3] = v.w;
  });
  // Phase B: thread t takes word column wc (columns 2wc, 2wc + 1) of rows rg * 32 ... + 31.
  const int wc = t % 64, rg = t / 64;
  u32 a[8], b[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const u32 w0 = tile[(rg * 32 + 4 * k) * SW + wc], w1 = tile[(rg * 32 + 4 * k + 1) * SW + wc];
    const u32 w2 = tile[(rg * 32 + 4 * k + 2) * SW + wc], w3 = tile[(rg * 32 + 4 * k + 3) * SW + wc];
    a[k] = __byte_perm(__byte_perm(w0, w1, 0x0051), __byte_perm(w2, w3, 0x0051), 0x5410);  // high bytes of low halves
    b[k] = __byte_perm(__byte_perm(w0, w1, 0x0073), __byte_perm(w2, w3, 0x0073), 0x5410);  // of high halves
  }
  unsigned char* ca = y_c + (c0 + 2 * wc) * rows + r0 + rg * 32;
  unsigned char* cb = ca + rows;
  reinterpret_cast<uint4*>(ca)[0] = make_uint4(a[0], a[1], a[2], a[3]);
  reinterpret_cast<uint4*>(ca)[1] = make_uint4(a[4], a[5], a[6], a[7]);
  reinterpret_cast<uint4*>(cb)[0] = make_uint4(b[0], b[1], b[2], b[3]);
  reinterpret_cast<uint4*>(cb)[1] = make_uint4(b[4], b[5], b[6], b[7]);
}

// As move_transpose, phase B the quantizer's way: eight lanes write one transposed row's 128 bytes
// (each lane the 16 bytes of a 16-row group, for two columns), so a warp stores whole 128-byte
// lines; the shared tile is unpadded with word indices xor-ed by 4 x the 16-row group (the eight
// lanes reading one word column fall in eight banks; 16-byte vectors stay whole).
template <int MIN_BLOCKS, bool PF>
__global__ void __launch_bounds__(256, MIN_BLOCKS)
    move_transpose_lines(const unsigned short* __restrict__ x, unsigned char* __restrict__ y_r,
                         unsigned char* __restrict__ y_c, long long rows, long long cols) {
  __shared__ __align__(16) u32 tile[128 * 64];
  const int t = threadIdx.x;
  const long long r0 = (long long)blockIdx.y * 128, c0 = (long long)blockIdx.x * 128;
  tile_phase_a<MIN_BLOCKS, PF>(x, y_r, cols, [&](int r, int ci, uint4 v) {
    *reinterpret_cast<uint4*>(tile + r * 64 + ((ci * 4) ^ (4 * (r >> 4)))) = v;
  });
#pragma unroll
  for (int task = 0; task < 2; ++task) {
    const int g = t + 256 * task, q = g % 8, wc = g / 8;  // 16-row group q of word column wc
    const u32* col = tile + (q * 16) * 64 + (wc ^ (4 * q));
    u32 a[4], b[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const u32 w0 = col[(4 * k) * 64], w1 = col[(4 * k + 1) * 64], w2 = col[(4 * k + 2) * 64], w3 = col[(4 * k + 3) * 64];
      a[k] = __byte_perm(__byte_perm(w0, w1, 0x0051), __byte_perm(w2, w3, 0x0051), 0x5410);
      b[k] = __byte_perm(__byte_perm(w0, w1, 0x0073), __byte_perm(w2, w3, 0x0073), 0x5410);
    }
    unsigned char* ca = y_c + (c0 + 2 * wc) * rows + r0 + q * 16;
    *reinterpret_cast<uint4*>(ca) = make_uint4(a[0], a[1], a[2], a[3]);
    *reinterpret_cast<uint4*>(ca + rows) = make_uint4(b[0], b[1], b[2], b[3]);
  }
}
"""

TRANSPOSE = [(4, "false"), (4, "true"), (3, "true"), (5, "true")]  # (resident CTAs, L2 prefetch)

BULK = [(8192, 4), (16384, 4), (16384, 3)]  # (chunk bytes, stages)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=128, help="bytes read per call, MiB (128: 8192 x 8192 16-bit)")
    p.add_argument("--transpose", action="store_true", help="1:1 only: the copy, the floor, v1 and the transpose tiles")
    args = p.parse_args()
    import cupy
    import torch

    names = [f"move_{k}<{w}, {h}>" for w in (8, 16) for k in ("v1", "v4c", "v4s") for h in ("false", "true")] + [
        f"move_bulk<{w}, {c}, {s}>" for w in (8, 16) for c, s in BULK
    ]
    names += [f"move_{k}<{m}, {pf}>" for k in ("transpose", "transpose_lines") for m, pf in TRANSPOSE]
    mod = cupy.RawModule(code=SOURCE, options=("-std=c++17", "-arch=sm_90"), name_expressions=names)
    nbytes = args.mib << 20
    n16 = nbytes // 16
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for w in (16,) if args.transpose else (8, 16):
        written = nbytes * w // 16
        x = cupy.asarray(torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda"))
        y = cupy.empty(written, dtype=cupy.uint8)
        copy_us, _ = harness.copy_time(nbytes, written)
        floor = harness.floor_time(nbytes, written)
        rows: list[tuple[str, float]] = [("torch copy", copy_us)]
        if floor:
            rows.append((f"harness floor ({floor[1]})", floor[0]))
        for k, per in (("v1", 1),) if args.transpose else (("v1", 1), ("v4c", 4), ("v4s", 4)):
            for h in ("false", "true"):
                f = mod.get_function(f"move_{k}<{w}, {h}>")
                grid = (n16 // per + 255) // 256

                def fn(f: Any = f, grid: int = grid, a: tuple[Any, ...] = (x, y, cupy.int64(n16))) -> None:
                    with stream:
                        f((grid,), (256,), a)

                rows.append((f"{k}{'_256' if h == 'true' else ''}", harness.time_gpu(fn)))
        for c, s in [] if args.transpose else BULK:
            f = mod.get_function(f"move_bulk<{w}, {c}, {s}>")
            smem = c * s
            f.max_dynamic_shared_size_bytes = smem
            per_sm = max(1, min(32, (227 * 1024) // (smem + 1024)))
            for mult in sorted({per_sm, max(1, per_sm // 2)}):
                grid = sms * mult

                def bulk_fn(
                    f: Any = f, grid: int = grid, smem: int = smem, a: tuple[Any, ...] = (x, y, cupy.int64(nbytes // c))
                ) -> None:
                    with stream:
                        f((grid,), (32,), a, shared_mem=smem)

                rows.append((f"bulk chunk {c} x {s} stages, {mult}/SM", harness.time_gpu(bulk_fn)))
        if w == 16:  # the fused transpose's bytes: x as a square 16-bit matrix, two byte copies
            side = int(math.isqrt(nbytes // 2))
            y_c = cupy.empty(written // 2, dtype=cupy.uint8)
            for k, m, pf in [(k, m, pf) for k in ("transpose", "transpose_lines") for m, pf in TRANSPOSE]:
                f = mod.get_function(f"move_{k}<{m}, {pf}>")

                def tr_fn(
                    f: Any = f,
                    a: tuple[Any, ...] = (x, y, y_c, cupy.int64(side), cupy.int64(side)),
                    g: int = side // 128,
                ) -> None:
                    with stream:
                        f((g, g), (256,), a)

                rows.append((f"{k}, {m}/SM{', L2 prefetch' if pf == 'true' else ''}", harness.time_gpu(tr_fn)))
        print(f"-- read {nbytes >> 20} MiB, write {written >> 20} MiB ({16 // w}:1)")
        for label, us in rows:
            print(
                f"{label:40s} {us:8.2f} us  {(nbytes + written) / us / 1e6:6.3f} TB/s  {100 * rows[0][1] / us:5.1f}% of copy"
            )


if __name__ == "__main__":
    main()
