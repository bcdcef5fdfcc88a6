// quantize.cu: quantization with given parameters (QuantizePlan, and the last step of
// DynamicRangeQuantizePlan's multi-pass path).
//
//   q = clamp(rne(x / scale) + zp, q_min, q_max)      integer outputs (S8, U8, S4, U4 packed)
//   q = fp8_rne_saturate(x / scale)                   FP8 outputs
// STOCHASTIC replaces rne by the Philox stochastic rounding of SPEC section 4 (qp_philox.cuh).
// Parameters come from a device array (scale_ptr / zp_ptr) or, when the pointer is null, from
// the scalar arguments; likewise the seed and offset. RowLayout.flags bit 0 (dynamic range):
// a NaN scale marks a non-finite segment, whose FP8 codes are 0 (the zero point) instead of NaN.
// Template arguments: In (f16, bf16, f32, f64), Out (s8, u8q, s4, u4, e4m3, e5m2), VEC elements
// per thread-vector, VECTOR_IO (aligned vector loads/stores or a bounded element loop),
// HIGH_FIRST nibble order for packed outputs, STOCHASTIC rounding.
//
// quantize_backward_rows (QuantizeBackwardPlan): the straight-through gradient of quantize_rows,
//   dx = dq / scale  (IEEE division in the accumulator type, rounded once to In)
//        where the forward's pre-clamp value is inside the range, else +0:
//   integer codes: q_min <= rne(x / scale) + zp <= q_max     FP8: |x / scale| <= max finite
// (NaN and +-Inf x outside). The mask comes from VectorQuantizer::inside_mask, the forward's own
// quotient and rounding, so it agrees with quantize_rows's codes bit for bit. Template
// arguments: In (f16, bf16, f32, f64: x, dq and dx), Code (the forward's code kind: the integer
// kinds share one mask, whose range is RowLayout's q_min / q_max), VEC. dq and dx may be the
// same array (each element is read before it is written, by the thread that writes it).
#include "qp_elements.cuh"
#include "qp_quantize_vector.cuh"
#include "qp_row_layout.cuh"

// quantize_rows: QP_QUANTIZE_MIN_BLOCKS resident blocks per SM asked of the register allocator
// (4: 64 registers); the spills it causes sit on the rare exact-division path.

namespace qp {

static const int kQuantizeUnroll = QP_ROW_UNROLL;

template <class In, class Out, int VEC, bool VECTOR_IO, bool HIGH_FIRST, bool STOCHASTIC>
struct QuantizeBody {
  typedef VectorQuantizer<In, Out, VEC, HIGH_FIRST> VQ;
  typedef typename VQ::FE FE;
  typedef typename VQ::in_t in_t;
  typedef typename VQ::acc_t acc_t;

  const in_t* __restrict__ x;
  u8* __restrict__ q;
  AffineParamSource<IntQuantParam<acc_t>, acc_t> params;
  const RowLayout& lay;
  u64 seed, offset;
  IntQuantParam<acc_t> row_param;
  ElementVector<in_t, VEC> xv[kQuantizeUnroll];

  __device__ __forceinline__ QuantizeBody(const in_t* x_, u8* q_, const acc_t* sp, const int* zp, acc_t sv, int zv,
                                          const RowLayout& l, u64 seed_, u64 offset_)
      : x(x_), q(q_), params{sp, zp, sv, zv}, lay(l), seed(seed_), offset(offset_) {}

  __device__ __forceinline__ IntQuantParam<acc_t> param(i64 index) const { return params(index); }

  __device__ __forceinline__ void begin_item(i64, i64 pbase) {
    if (lay.cs == 0) row_param = param(pbase);
  }

  __device__ __forceinline__ void load(int u, i64 row, i64, int col, int valid) {
    xv[u].template load<VECTOR_IO>(x + row * lay.L + col, valid);
  }

  // A NaN scale of a non-finite dynamic-range segment gives FP8 code 0 (flags bit 0).
  __device__ __forceinline__ bool zero_fp8(const IntQuantParam<acc_t>& p) const {
    return (lay.flags & 1) && p.scale != p.scale;
  }

  __device__ __forceinline__ void finish(int u, i64 row, i64 pbase, int col, int valid) {
    int codes[VEC];
    if constexpr (STOCHASTIC) {
      const u64 i0 = (u64)row * (u64)lay.L + (u64)col;
      if (lay.cs == 0) {
        VQ::stochastic_codes(xv[u], row_param, lay.q_min, lay.q_max, zero_fp8(row_param), i0, seed, offset, codes);
      } else {
        float uni[VEC];
        philox_uniforms<VEC>(i0, seed, offset, uni);
        for_each_column_param<VEC, IntQuantParam<acc_t>>(
            lay, pbase, col, valid, column_group(lay, col), param(pbase + (i64)column_group(lay, col) * lay.cs),
            [&](i64 index) { return param(index); },
            [&](int k, const IntQuantParam<acc_t>& p) {
              codes[k] = VQ::stochastic_code(FE::to_acc(xv[u].v[k]), p, lay.q_min, lay.q_max, zero_fp8(p), uni[k]);
            });
      }
    } else if (lay.cs == 0) {
      VQ::codes(xv[u], row_param, lay.q_min, lay.q_max, zero_fp8(row_param), codes);
    } else if ((lay.gc & (VEC - 1)) == 0) {  // groups are whole vectors: one parameter per vector
      const IntQuantParam<acc_t> p = param(pbase + (i64)column_group(lay, col) * lay.cs);
      VQ::codes(xv[u], p, lay.q_min, lay.q_max, zero_fp8(p), codes);
    } else {
      for_each_column_param<VEC, IntQuantParam<acc_t>>(
          lay, pbase, col, valid, column_group(lay, col), param(pbase + (i64)column_group(lay, col) * lay.cs),
          [&](i64 index) { return param(index); },
          [&](int k, const IntQuantParam<acc_t>& p) {
            codes[k] = VQ::code(FE::to_acc(xv[u].v[k]), p, lay.q_min, lay.q_max, zero_fp8(p));
          });
    }
    if constexpr (VQ::packed) {
      VQ::template store<VECTOR_IO>(q + row * ((lay.L + 1) / 2) + col / 2, valid, codes);
    } else {
      VQ::template store<VECTOR_IO>(q + row * lay.L + col, valid, codes);
    }
  }
};

// Quantize backward: reads x and dq, writes dx (vector I/O; misaligned operands take VEC = 1).
template <class In, class Code, int VEC>
struct QuantizeBackwardBody {
  typedef VectorQuantizer<In, Code, VEC, false> VQ;
  typedef typename VQ::FE FE;
  typedef typename VQ::in_t in_t;
  typedef typename VQ::acc_t acc_t;

  const in_t* x;
  const in_t* dq;
  in_t* dx;
  const acc_t* __restrict__ scale_ptr;
  const int* __restrict__ zp_ptr;
  acc_t scale_value;
  int zp_value;
  const RowLayout& lay;
  IntQuantParam<acc_t> row_param;
  ElementVector<in_t, VEC> xv[kQuantizeUnroll];
  ElementVector<in_t, VEC> gv[kQuantizeUnroll];

  __device__ __forceinline__ IntQuantParam<acc_t> param(i64 index) const {
    IntQuantParam<acc_t> p;
    p.set(scale_ptr ? scale_ptr[index] : scale_value, zp_ptr ? zp_ptr[index] : zp_value);
    return p;
  }

  __device__ __forceinline__ void begin_item(i64, i64 pbase) {
    if (lay.cs == 0) row_param = param(pbase);
  }

  __device__ __forceinline__ void load(int u, i64 row, i64, int col, int valid) {
    const i64 at = row * lay.L + col;
    xv[u].template load<true>(x + at, valid);
    gv[u].template load<true>(dq + at, valid);
  }

  // dq / scale inside the mask, +0 outside.
  static __device__ __forceinline__ acc_t gradient(bool inside, acc_t g, acc_t scale) {
    return inside ? acc_div(g, scale) : (acc_t)0;
  }

  __device__ __forceinline__ void finish(int u, i64 row, i64 pbase, int col, int valid) {
    acc_t vals[VEC];
    if (lay.cs == 0 || (lay.gc & (VEC - 1)) == 0) {  // one parameter for the whole vector
      const IntQuantParam<acc_t> p = lay.cs == 0 ? row_param : param(pbase + (i64)column_group(lay, col) * lay.cs);
      bool mask[VEC];
      VQ::inside_mask(xv[u], p, lay.q_min, lay.q_max, mask);
#pragma unroll
      for (int k = 0; k < VEC; ++k) vals[k] = gradient(mask[k], FE::to_acc(gv[u].v[k]), p.scale);
    } else {
      for_each_column_param<VEC, IntQuantParam<acc_t>>(
          lay, pbase, col, valid, column_group(lay, col), param(pbase + (i64)column_group(lay, col) * lay.cs),
          [&](i64 index) { return param(index); },
          [&](int k, const IntQuantParam<acc_t>& p) {
            const bool inside = VQ::inside(FE::to_acc(xv[u].v[k]), p, lay.q_min, lay.q_max);
            vals[k] = gradient(inside, FE::to_acc(gv[u].v[k]), p.scale);
          });
    }
    vector_from_acc<In, VEC>(vals).template store<true>(dx + row * lay.L + col, valid);
  }
};

}  // namespace qp

template <class In, class Out, int VEC, bool VECTOR_IO, bool HIGH_FIRST, bool STOCHASTIC>
__global__ void __launch_bounds__(256, QP_QUANTIZE_MIN_BLOCKS)
quantize_rows(const typename qp::FloatElement<In>::storage* __restrict__ x, qp::u8* __restrict__ q,
              const typename qp::FloatElement<In>::acc* __restrict__ scale_ptr, const int* __restrict__ zp_ptr,
              typename qp::FloatElement<In>::acc scale_value, int zp_value, const qp::RowLayout lay,
              const qp::i64* __restrict__ seed_ptr, const qp::i64* __restrict__ offset_ptr, qp::u64 seed_value,
              qp::u64 offset_value) {
  qp::u64 seed = 0, offset = 0;
  if constexpr (STOCHASTIC) {
    seed = seed_ptr ? (qp::u64)*seed_ptr : seed_value;
    offset = offset_ptr ? (qp::u64)*offset_ptr : offset_value;
  }
  qp::QuantizeBody<In, Out, VEC, VECTOR_IO, HIGH_FIRST, STOCHASTIC> body(x, q, scale_ptr, zp_ptr, scale_value, zp_value,
                                                                         lay, seed, offset);
  qp::for_each_row_vector<VEC, qp::kQuantizeUnroll>(lay, body);
}

template <class In, class Code, int VEC>
__global__ void __launch_bounds__(256)
quantize_backward_rows(const typename qp::FloatElement<In>::storage* x, const typename qp::FloatElement<In>::storage* dq,
                       typename qp::FloatElement<In>::storage* dx,
                       const typename qp::FloatElement<In>::acc* __restrict__ scale_ptr, const int* __restrict__ zp_ptr,
                       typename qp::FloatElement<In>::acc scale_value, int zp_value, const qp::RowLayout lay) {
  qp::QuantizeBackwardBody<In, Code, VEC> body{x, dq, dx, scale_ptr, zp_ptr, scale_value, zp_value, lay};
  qp::for_each_row_vector<VEC, qp::kQuantizeUnroll>(lay, body);
}

// ---- the hot layouts, specialised ----
// quantize_dense: quantize_rows's codes (nearest rounding, 16-bit floats) on a dense row layout
// (qp_row_layout.cuh, dense_item): one (row, chunk) item per block, VEC-element vectors (16:
// two 16-byte loads of floats, a 16-byte store of 8-bit codes or an 8-byte store of 4-bit codes,
// small problems too: quantplan/runtime/_layout.py DENSE_SMALL_VEC), kDenseQuantizeUnroll per thread. The parameter of every vector is loaded
// beside its data (the latencies overlap) and prepared once per vector (dense_param: the
// reciprocal without its out-of-line slow path); the division-free codes of the whole vector are
// checked once; a vector they do not cover (a quotient of 2^21 or more, NaN, Inf, a scale outside
// [2^-60, 2^100], a NaN scale with flags bit 0) is redone out of line, element by element, by
// VectorQuantizer::code, the generic kernel's own path. Same parameters as quantize_rows (the
// seed and offset are not read). 256-thread blocks at most, 32 registers, no stack.
//
// quantize_backward_dense: quantize_backward_rows on a dense layout (VEC 8: one 16-byte vector of
// each input per thread; 4 on small problems; bf16 16: quantplan/runtime/_layout.py). The mask and
// the gradient take the division-free quotient of qp_rounding.cuh (exact: Markstein's
// correction, inv = rn(1 / scale), scale in [2^-60, 2^100], |x| and |quotient| >= 2^-100 or
// x = 0, quotient below 2^21):
//   integer codes: q_min <= rne(q) + zp <= q_max  <=>  lo <= q <= hi with the float bounds
//     lo = (q_min - zp) - 1/2, hi = (q_max - zp) + 1/2, each moved one float inwards when its
//     integer is odd (a tie rounds to the even neighbour, outside the range); exact for
//     |q_min - zp|, |q_max - zp| < 2^22;
//   FP8 codes: -max <= q <= max;
//   dx = rn(dq / scale) where inside, else +0: the quotient's conditions hold for every 16-bit
//     dq when scale <= 2^75 and |dq| >= 2^-25 or dq = 0 (always, for f16).
// A vector outside those conditions is redone out of line, element by element, by the generic
// kernel's mask and IEEE division.

namespace qp {

// Vectors per thread of quantize_dense / quantize_backward_dense (quantplan/runtime/_layout.py
// DENSE_ROW_SHAPES mirrors them).
static const int kDenseQuantizeUnroll = QP_DENSE_QUANTIZE_UNROLL;
static const int kDenseQuantizeBackwardUnroll = QP_DENSE_QUANTIZE_BACKWARD_UNROLL;

template <class T> struct IsHalf { static const bool value = false; };
template <> struct IsHalf<f16> { static const bool value = true; };

// IntQuantParam<float>::set without the reciprocal's out-of-line slow path: for a scale in the
// `fast` range the correctly rounded reciprocal is exactly this sequence (the compiler's own
// fast path of __frcp_rn: MUFU.RCP and one Newton step); outside it `inv` is never used.
__device__ __forceinline__ IntQuantParam<float> dense_param(float s, int z) {
  IntQuantParam<float> p;
  p.scale = s;
  p.zp = z;
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(s));
  p.inv = __fmaf_rn(r, -__fmaf_rn(r, s, -1.0f), r);
  p.fast = s >= 8.673617379884035e-19f && s <= 1.2676506002282294e+30f && z >= -(1 << 30) && z <= (1 << 30);
  return p;
}

// The float bounds of the straight-through mask (above); `ok` false where they are not exact.
struct DenseMaskBounds {
  float lo, hi;
  bool ok;
};

__device__ __forceinline__ float half_integer_inwards(float v, bool up) {
  // v = k + 1/2 (or k - 1/2), never 0: the next float towards +Inf (up) or -Inf.
  return __int_as_float(__float_as_int(v) + (((v > 0.0f) == up) ? 1 : -1));
}

template <class Code>
__device__ __forceinline__ DenseMaskBounds dense_mask_bounds(int q_min, int q_max, int zp) {
  DenseMaskBounds b;
  if constexpr (QuantElement<Code>::kind == 2) {
    b.hi = (float)Fp8Format<Code>::max;
    b.lo = -b.hi;
    b.ok = true;
  } else {
    const i64 lo = (i64)q_min - zp, hi = (i64)q_max - zp;
    b.ok = lo > -(1 << 22) && lo < (1 << 22) && hi > -(1 << 22) && hi < (1 << 22);
    b.lo = (float)(int)lo - 0.5f;
    b.hi = (float)(int)hi + 0.5f;
    if (lo & 1) b.lo = half_integer_inwards(b.lo, true);
    if (hi & 1) b.hi = half_integer_inwards(b.hi, false);
  }
  return b;
}

// The exact path of one vector, out of line and element by element (VectorQuantizer::code: the
// division-free quotient where it holds, the division elsewhere), reading the vector again: no
// array lives on its stack and nothing of the caller's fast path stays live across the call.
template <class In, class Out, int VEC, bool HIGH_FIRST>
__device__ __noinline__ void quantize_vector_exact(const typename FloatElement<In>::storage* xs, u8* qs, float scale,
                                                   int zp, int q_min, int q_max, bool zero_fp8) {
  typedef VectorQuantizer<In, Out, 2, HIGH_FIRST> VQ;
  IntQuantParam<float> p;
  p.set(scale, zp);
#pragma unroll 1
  for (int k = 0; k < VEC; k += 2) {
    const int c0 = VQ::code(VQ::FE::to_acc(xs[k]), p, q_min, q_max, zero_fp8);
    const int c1 = VQ::code(VQ::FE::to_acc(xs[k + 1]), p, q_min, q_max, zero_fp8);
    if constexpr (VQ::packed) {
      qs[k / 2] = pack_nibbles<HIGH_FIRST>(c0, c1);
    } else {
      qs[k] = (u8)c0;
      qs[k + 1] = (u8)c1;
    }
  }
}

// The gradient quotient's lower bound on 16-bit brain floats (above): every element of the vector
// is 0 or at least 2^-25 in magnitude. By pairs: the least magnitude of the vector (sign bits
// cleared, an unsigned 16-bit minimum per half: the order of non-negative bf16 bit patterns,
// 2^-25 = 0x3300; three-input VIMNMX3.U16x2 on sm_90), and only a vector holding a zero or a
// smaller magnitude tests its elements one by one (the per-element test: 0 passes).
// A NaN passes here and fails quotient_fast's test.
// QP_DENSE_QBWD_BF16_MIN_BLOCKS: resident blocks of 256 threads per SM that
// quantize_backward_dense's registers allow on bf16 data (fp16: QP_DENSE_ROWS_MIN_BLOCKS). At 8
// (32 registers) the 16-element bf16 kernel with the pair test spills; at 6 it holds 40
// registers, no spill.
template <int VEC>
__device__ __forceinline__ bool bf16_gradient_in_range(const ElementVector<FloatElement<bf16>::storage, VEC>& g) {
  u32 least = 0x7FFF7FFFu;
#pragma unroll
  for (int k = 0; k < VEC / 2; ++k) least = __vminu2(least, g.words[k] & 0x7FFF7FFFu);
  if ((least & 0xFFFFu) >= 0x3300u && (least >> 16) >= 0x3300u) return true;
  bool ok = true;
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    const float v = FloatElement<bf16>::to_acc(g.v[k]);
    ok = ok & ((fabsf(v) >= 2.9802322387695312e-08f) | (v == 0.0f));  // 2^-25
  }
  return ok;
}

// The exact path of one vector of the quantize backward (VectorQuantizer::inside, then the IEEE
// division: quantize_backward_rows's arithmetic), as above; each element is read before it is
// written (dq may be dx).
template <class In, class Code, int VEC>
__device__ __noinline__ void quantize_backward_vector_exact(const typename FloatElement<In>::storage* xs,
                                                            const typename FloatElement<In>::storage* gs,
                                                            typename FloatElement<In>::storage* ds, float scale,
                                                            int zp, int q_min, int q_max) {
  typedef VectorQuantizer<In, Code, 1, false> VQ;
  IntQuantParam<float> p;
  p.set(scale, zp);
#pragma unroll 1
  for (int k = 0; k < VEC; ++k) {
    const bool inside = VQ::inside(VQ::FE::to_acc(xs[k]), p, q_min, q_max);
    const float g = VQ::FE::to_acc(gs[k]);
    ds[k] = VQ::FE::from_acc(inside ? acc_div(g, scale) : 0.0f);
  }
}

}  // namespace qp

template <class In, class Out, bool HIGH_FIRST, int VEC>
__global__ void __launch_bounds__(QP_DENSE_ROWS_BLOCK, QP_DENSE_ROWS_MIN_BLOCKS)
quantize_dense(const typename qp::FloatElement<In>::storage* __restrict__ x, qp::u8* __restrict__ q,
               const float* __restrict__ scale_ptr, const int* __restrict__ zp_ptr, float scale_value, int zp_value,
               const qp::RowLayout lay, const qp::i64*, const qp::i64*, qp::u64, qp::u64) {
  constexpr int U = qp::kDenseQuantizeUnroll;
  typedef qp::VectorQuantizer<In, Out, VEC, HIGH_FIRST> VQ;
  typedef typename VQ::in_t in_t;
  const qp::DenseItem item = qp::dense_item<In, VEC>(lay);
  const in_t* xr = x + item.row * lay.L;
  qp::u8* qr = q + item.row * (VQ::packed ? lay.L / 2 : lay.L);
  typename VQ::vector_t xv[U];
  float s[U];
  int z[U];
  item.vectors<U>(
      [&](int u, int col) {
        xv[u].load_dense(xr + col);
        qp::dense_affine_param(scale_ptr, zp_ptr, scale_value, zp_value, qp::dense_param_index(lay, item.pbase, col),
                               s[u], z[u]);
      },
      [&](int u, int col) {
        const qp::IntQuantParam<float> p = qp::dense_param(s[u], z[u]);
        int codes[VEC];
        qp::u8* qs = qr + (VQ::packed ? col / 2 : col);
        if (VQ::fast_codes(xv[u], p, lay.q_min, lay.q_max, codes)) {
          VQ::template store<true>(qs, VEC, codes);
        } else {
          const bool zero_fp8 = (lay.flags & 1) && s[u] != s[u];
          qp::quantize_vector_exact<In, Out, VEC, HIGH_FIRST>(xr + col, qs, s[u], z[u], lay.q_min, lay.q_max,
                                                              zero_fp8);
        }
      });
}

template <class In, class Code, int VEC>
__global__ void __launch_bounds__(QP_DENSE_ROWS_BLOCK, qp::IsHalf<In>::value ? QP_DENSE_ROWS_MIN_BLOCKS : QP_DENSE_QBWD_BF16_MIN_BLOCKS)
quantize_backward_dense(const typename qp::FloatElement<In>::storage* x, const typename qp::FloatElement<In>::storage* dq,
                        typename qp::FloatElement<In>::storage* dx, const float* __restrict__ scale_ptr,
                        const int* __restrict__ zp_ptr, float scale_value, int zp_value, const qp::RowLayout lay) {
  constexpr int U = qp::kDenseQuantizeBackwardUnroll;
  typedef qp::FloatElement<In> FE;
  typedef typename FE::storage in_t;
  const qp::DenseItem item = qp::dense_item<In, VEC>(lay);
  const qp::i64 base = item.row * lay.L;
  qp::ElementVector<in_t, VEC> xv[U], gv[U];
  float s[U];
  int z[U];
  item.vectors<U>(
      [&](int u, int col) {
        xv[u].load_dense(x + base + col);
        gv[u].load_dense(dq + base + col);
        qp::dense_affine_param(scale_ptr, zp_ptr, scale_value, zp_value, qp::dense_param_index(lay, item.pbase, col),
                               s[u], z[u]);
      },
      [&](int u, int col) {
        const qp::IntQuantParam<float> p = qp::dense_param(s[u], z[u]);
        const qp::DenseMaskBounds b = qp::dense_mask_bounds<Code>(lay.q_min, lay.q_max, z[u]);
        bool ok = p.fast && b.ok && s[u] <= 3.777893186295716e+22f;  // 2^75
        if constexpr (!qp::IsHalf<In>::value) ok = ok & qp::bf16_gradient_in_range<VEC>(gv[u]);
        float vals[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float qx = qp::quotient_fast(FE::to_acc(xv[u].v[k]), p, ok);
          const float g = FE::to_acc(gv[u].v[k]);
          const float d = qp::quotient_fast(g, p, ok);
          vals[k] = (qx >= b.lo && qx <= b.hi) ? d : 0.0f;
        }
        if (ok) {
          qp::vector_from_acc<In, VEC>(vals).store_dense(dx + base + col);
        } else {
          qp::quantize_backward_vector_exact<In, Code, VEC>(x + base + col, dq + base + col, dx + base + col, s[u],
                                                            z[u], lay.q_min, lay.q_max);
        }
      });
}
