// block_scaled.cu: quantize to the block-scaled formats (MX, FP8 blocks along the contiguous axis).
//
// Schedule ("lanes"): a thread holds VECS consecutive 16-byte vectors of one block, a team of
// BLOCK / (VEC * VECS) threads covers the block; the team's amax is a butterfly of integer maxima
// over |x| keys (NaN and Inf order above every finite value, so a key at or above Inf's flags a
// non-finite block); the team's first thread stores the scale. Teams cover the tensor in a
// grid-stride loop, UNROLL independent slots per thread; blocks of at most 256 threads, MIN_BLOCKS
// of them resident per multiprocessor (the tuning table, quantplan.runtime._block_scaled_kernels).
// Epilogue: the format's scale rule and element encoder (qp_block_scaled.cuh). NVFP4 reads its
// tensor amax from device memory (tensor_amax; null for one level), so a captured graph replays
// with a new amax and no host sync is needed.
// NVFP4 with stochastic rounding (element nv_e2m1_sr) rounds each element with the Philox word of
// its row-major flat index in x (shared/SPEC.md section 4; seed and offset are values, or
// one-element device int64 arrays read at launch).
//
// CONTIGUOUS: cols % BLOCK == 0 and 16-byte aligned operands, so the tensor is one flat run of
// blocks (vector loads and stores, no row arithmetic before the loads). Otherwise every element is
// addressed as (row, col) with bounds: partial last blocks (amax over the valid elements, codes only
// for them), odd FP4 rows (a zero high nibble).
#include "qp_block_scaled.cuh"

namespace qp {

// The 16-bit-lane FP4 encoders (sm_90 and later, fp4_lane_codes): MX bfloat16 input from its own
// words times the power-of-two factor in bfloat16 lanes (kBf16Words); MX float16 input from its
// scaled values, exact in float16 where it matters (kF16Values); NVFP4 from its f32 products
// rounded to odd at three mantissa bits, exact in float16 from 2^-14 up (kRoundOddValues).
enum LaneFp4Path { kNoLanes = 0, kBf16Words = 1, kF16Values = 2, kRoundOddValues = 3 };
template <class In, class Elem, bool DIVIDE> struct LaneFp4 {
  static const int path = kNoLanes;
};
template <> struct LaneFp4<bf16, mx_e2m1, false> {
  static const int path = kFp4Lanes ? kBf16Words : kNoLanes;
};
template <> struct LaneFp4<f16, mx_e2m1, false> {
  static const int path = kFp4Lanes ? kF16Values : kNoLanes;
};
template <class In> struct LaneFp4<In, nv_e2m1, false> {
  static const int path = kFp4Lanes ? kRoundOddValues : kNoLanes;
};

}  // namespace qp

template <class In, class Elem, int BLOCK, bool DIVIDE, bool CONTIGUOUS, int VECS, int UNROLL, int MIN_BLOCKS>
__global__ void __launch_bounds__(256, MIN_BLOCKS)
    block_scaled_quantize(const void* __restrict__ x_ptr, qp::u8* __restrict__ codes, void* __restrict__ scales,
                          qp::i64 rows, qp::i64 cols, qp::i64 blocks_per_row, int rule, int layout,
                          qp::i64 layout_dim, float amax_floor, float enc_overflow, qp::i64 pad_rows,
                          qp::i64 pad_cols, const float* __restrict__ tensor_amax,
                          const qp::i64* __restrict__ seed_ptr, const qp::i64* __restrict__ offset_ptr,
                          qp::u64 seed_value, qp::u64 offset_value, float* __restrict__ s_dec_out) {
  using namespace qp;
  typedef InputWords<In> In_;
  typedef BlockElement<Elem> E;
  constexpr int VEC = In_::vec;
  constexpr int ELEMS = VEC * VECS;                      // elements of one thread
  constexpr int SUB = ELEMS > BLOCK ? ELEMS / BLOCK : 1;  // whole blocks of one thread (then no team)
  constexpr int TEAM = ELEMS > BLOCK ? 1 : BLOCK / ELEMS;
  constexpr int SUB_WORDS = VECS * 4 / SUB;               // input words of one of them
  static_assert(TEAM <= 32 && (32 % TEAM) == 0 && TEAM * ELEMS == BLOCK * SUB, "a team lies within a warp");
  static_assert(SUB == 1 || CONTIGUOUS, "several blocks per thread: the contiguous schedule only");
  constexpr int CODE_BYTES = ELEMS / E::per_byte;
  constexpr int CODE_WORDS = CODE_BYTES / 4 > 0 ? CODE_BYTES / 4 : 1;
  const bool f32_scale = rule >= kBlockF32Div && rule <= kBlockF32Enc;
  Nvfp4Tensor nv = Nvfp4Tensor();
  if (rule == kNvfp4Te) nv = nvfp4_tensor(tensor_amax);  // NVFP4: the tensor amax (null: one level)
  if (s_dec_out != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *s_dec_out = nv.s_dec;  // NVFP4's S_dec
  constexpr bool STOCHASTIC = StochasticElement<Elem>::value;  // §1.6 rounding from (seed, offset)
  if constexpr (STOCHASTIC) nvfp4_sr_fill_factors(nv);         // its block factors by scale byte
  const NvSrPhilox rng(STOCHASTIC ? block_rng_word(seed_ptr, seed_value) : 0,
                       STOCHASTIC ? block_rng_word(offset_ptr, offset_value) : 0);

  const i64 teams = rows * blocks_per_row;
  const i64 slots = teams * TEAM / SUB;  // SUB > 1: the caller guarantees SUB divides teams
  const i64 stride = (i64)gridDim.x * blockDim.x;
  const int lane = threadIdx.x % TEAM;
  const i64 warp_first = (i64)blockIdx.x * blockDim.x + (threadIdx.x & ~31u);

  for (i64 base = warp_first; base < slots; base += stride * UNROLL) {
    u32 raw[UNROLL][VECS * 4];
    u32 amax[UNROLL][SUB];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const i64 slot = base + (threadIdx.x & 31u) + (i64)u * stride;
#pragma unroll
      for (int w = 0; w < VECS * 4; ++w) raw[u][w] = 0;
      if (CONTIGUOUS) {
        if (slot < slots) {
          const uint4* src = reinterpret_cast<const uint4*>(static_cast<const u8*>(x_ptr) + slot * (16 * VECS));
#pragma unroll
          for (int j = 0; j < VECS; ++j) {
            const uint4 word = src[j];
            raw[u][4 * j] = word.x;
            raw[u][4 * j + 1] = word.y;
            raw[u][4 * j + 2] = word.z;
            raw[u][4 * j + 3] = word.w;
          }
        }
      } else if (slot < slots) {
        const i64 team = slot / TEAM;
        const i64 r = team / blocks_per_row;
        const i64 c0 = (team - r * blocks_per_row) * BLOCK + (i64)lane * ELEMS;
        const u8* row = static_cast<const u8*>(x_ptr) + (r * cols + c0) * In_::bytes;
#pragma unroll
        for (int k = 0; k < ELEMS; ++k)
          if (c0 + k < cols) In_::put(raw[u] + (k / VEC) * 4, k % VEC, row + k * In_::bytes);
      }
#pragma unroll
      for (int j = 0; j < SUB; ++j) {
        if constexpr (STOCHASTIC) {
          amax[u][j] = run_key<In_, SUB_WORDS>(raw[u] + j * SUB_WORDS);  // 16-bit keys in lanes
          continue;
        }
        u32 key = In_::word_key(raw[u][j * SUB_WORDS]);
#pragma unroll
        for (int w = 1; w < SUB_WORDS; ++w) key = max(key, In_::word_key(raw[u][j * SUB_WORDS + w]));
        amax[u][j] = key;
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
      for (int j = 0; j < SUB; ++j) {
#pragma unroll
        for (int o = TEAM / 2; o > 0; o /= 2)
          amax[u][j] = max(amax[u][j], __shfl_xor_sync(0xFFFFFFFFu, amax[u][j], o));
        amax[u][j] = In_::key_bits(amax[u][j]);
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const i64 slot = base + (threadIdx.x & 31u) + (i64)u * stride;
      if (slot >= slots) continue;
      const i64 team = slot * SUB / TEAM;  // the first block of the slot
      bool finite[SUB];
      BlockScale s[SUB];
#pragma unroll
      for (int j = 0; j < SUB; ++j) {
        finite[j] = amax[u][j] < 0x7F800000u;
        if (finite[j]) {
          s[j] = block_scale<E>(amax[u][j], rule, amax_floor, enc_overflow, nv);
        } else {
          s[j].stored = nonfinite_scale(rule);
          s[j].factor = 0.0f;
        }
      }
      u32 packed[CODE_WORDS];
#pragma unroll
      for (int w = 0; w < CODE_WORDS; ++w) packed[w] = 0;
      constexpr int LANES = LaneFp4<In, Elem, DIVIDE>::path;
      if constexpr (STOCHASTIC) {
        // Words by the element's row-major flat index in x.
        const i64 r = CONTIGUOUS ? 0 : team / blocks_per_row;
        const i64 first = CONTIGUOUS ? slot * ELEMS : r * cols + (team - r * blocks_per_row) * BLOCK + (i64)lane * ELEMS;
        nvfp4_stochastic_codes<In_, ELEMS, BLOCK, SUB, CONTIGUOUS>(raw[u], s, finite, (u64)first, rng, packed);
      } else if constexpr (LANES != kNoLanes) {
        // FP4 in 16-bit lanes, four elements (16 bits of codes) at a time.
#pragma unroll
        for (int k = 0; k < ELEMS; k += 4) {
          const float factor = s[k / BLOCK % SUB].factor;
          u32 lanes[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int e = k + 2 * h;  // the pair's first element
            if constexpr (LANES == kBf16Words) {
              u32 v;
              asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(v) : "r"(raw[u][e / 2]), "r"((__float_as_uint(factor) >> 16) * 0x10001u));
              lanes[h] = fp4_lane_codes<true>(v);
            } else {
              float lo = __fmul_rn(In_::element(raw[u] + (e / VEC) * 4, e % VEC), factor);
              float hi = __fmul_rn(In_::element(raw[u] + (e / VEC) * 4, e % VEC + 1), factor);
              if constexpr (LANES == kRoundOddValues) {
                lo = round_odd_m3(lo);
                hi = round_odd_m3(hi);
              }
              u32 v;
              asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(v) : "f"(hi), "f"(lo));
              lanes[h] = fp4_lane_codes<false>(v);
            }
          }
          packed[k / 8] |= fp4_join(lanes[0], lanes[1]) << (k % 8 * 4);
        }
      } else {
#pragma unroll
        for (int k = 0; k < ELEMS; k += 2) {
          const float factor = s[k / BLOCK % SUB].factor;
          float lo = In_::element(raw[u] + (k / VEC) * 4, k % VEC);
          float hi = In_::element(raw[u] + (k / VEC) * 4, k % VEC + 1);
          if (DIVIDE) {
            lo = __fdiv_rn(lo, factor);
            hi = __fdiv_rn(hi, factor);
          } else {
            lo = __fmul_rn(lo, factor);
            hi = __fmul_rn(hi, factor);
          }
          const int bit = (k / 2) * (16 / E::per_byte);  // bit position of this pair in the thread's codes
          packed[bit / 32] |= E::encode_pair(lo, hi) << (bit % 32);
        }
      }
      // A block holding NaN or +-Inf stores zero codes (its encoders ran on non-finite values).
#pragma unroll
      for (int w = 0; w < CODE_WORDS; ++w)
        if (!finite[w * 4 * E::per_byte / BLOCK % SUB]) packed[w] = 0;
      if (CONTIGUOUS) {
        store_code_run<CODE_BYTES>(codes + slot * CODE_BYTES, packed);
      } else {
        const i64 r = team / blocks_per_row;
        const i64 c0 = (team - r * blocks_per_row) * BLOCK + (i64)lane * ELEMS;
        const i64 row_bytes = (cols + E::per_byte - 1) / E::per_byte;
        const i64 valid = cols - c0;
        const u8* bytes = reinterpret_cast<const u8*>(packed);
#pragma unroll
        for (int b = 0; b < CODE_BYTES; ++b)
          if ((i64)b * E::per_byte < valid) codes[r * row_bytes + c0 / E::per_byte + b] = bytes[b];
      }
      if (lane == 0) {
#pragma unroll
        for (int j = 0; j < SUB; ++j) {
          i64 off = team + j;  // kCompact
          if (layout != kCompact) {
            const i64 r = (team + j) / blocks_per_row;
            off = scale_offset(layout, r, team + j - r * blocks_per_row, blocks_per_row, layout_dim);
          }
          if (f32_scale)
            static_cast<u32*>(scales)[off] = s[j].stored;
          else
            static_cast<u8*>(scales)[off] = (u8)s[j].stored;
        }
      }
    }
  }

  // Padding of a padded layout: zeros at every position of the [pad_rows, pad_cols] scale grid
  // outside [rows, blocks_per_row].
  const i64 extra_rows = (pad_rows - rows) * pad_cols;
  const i64 pads = extra_rows + rows * (pad_cols - blocks_per_row);
  for (i64 p = (i64)blockIdx.x * blockDim.x + threadIdx.x; p < pads; p += stride) {
    i64 r, c;
    if (p < extra_rows) {
      r = rows + p / pad_cols;
      c = p - (r - rows) * pad_cols;
    } else {
      const i64 q = p - extra_rows, width = pad_cols - blocks_per_row;
      r = q / width;
      c = blocks_per_row + (q - r * width);
    }
    const i64 off = scale_offset(layout, r, c, blocks_per_row, layout_dim);
    if (f32_scale)
      static_cast<u32*>(scales)[off] = 0u;
    else
      static_cast<u8*>(scales)[off] = 0;
  }
}

// max |x| over the finite elements of x (n elements), into *amax as f32 bits by an atomic
// maximum (the caller zeroes it): the first vector_elements (a multiple of VEC, 16-byte aligned)
// as vectors, the rest element by element.
template <class In>
__global__ void __launch_bounds__(256) block_scaled_tensor_amax(const void* __restrict__ x_ptr, qp::i64 n,
                                                                qp::i64 vector_elements, unsigned int* __restrict__ amax) {
  using namespace qp;
  typedef InputWords<In> In_;
  constexpr int VEC = In_::vec;
  const i64 vectors = vector_elements / VEC;
  const i64 stride = (i64)gridDim.x * blockDim.x;
  u32 best = 0;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < vectors; i += stride) {
    const uint4 word = reinterpret_cast<const uint4*>(x_ptr)[i];
    const u32 w[4] = {word.x, word.y, word.z, word.w};
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const u32 bits = __float_as_uint(In_::element(w, k)) & 0x7FFFFFFFu;
      if (bits < 0x7F800000u) best = max(best, bits);
    }
  }
  for (i64 i = vectors * VEC + (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    u32 w[4] = {0, 0, 0, 0};
    In_::put(w, 0, static_cast<const u8*>(x_ptr) + i * In_::bytes);
    const u32 bits = __float_as_uint(In_::element(w, 0)) & 0x7FFFFFFFu;
    if (bits < 0x7F800000u) best = max(best, bits);
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) best = max(best, __shfl_xor_sync(0xFFFFFFFFu, best, o));
  if ((threadIdx.x & 31u) == 0 && best != 0) atomicMax(amax, best);
}

// Dequantize along the contiguous axis from compact scales: y = fl(dec(code) * scale) in f32
// (NVFP4: fl(fl(dec(code) * f32(s)) * S_dec)), rounded once to Out. Each thread writes 8
// consecutive outputs of one row (a partial tail with bounds); rows of codes are
// ceil(cols / per_byte) bytes.
template <class Out, class Elem, int BLOCK>
__global__ void __launch_bounds__(256)
    block_scaled_dequantize(const qp::u8* __restrict__ codes, const void* __restrict__ scales, int scale_kind,
                            const float* __restrict__ tensor_scale, qp::i64 rows, qp::i64 cols,
                            qp::i64 blocks_per_row, void* __restrict__ out) {
  using namespace qp;
  typedef FloatElement<Out> FO;
  typedef typename FO::storage storage;
  typedef BlockElement<Elem> E;
  constexpr int N = 8;
  const i64 per_row = (cols + N - 1) / N;
  const i64 total = rows * per_row;
  const i64 row_bytes = (cols + E::per_byte - 1) / E::per_byte;
  const float s_dec = tensor_scale != nullptr ? *tensor_scale : 1.0f;
  for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (i64)gridDim.x * blockDim.x) {
    const i64 r = t / per_row;
    const i64 c0 = (t - r * per_row) * N;
    const i64 b = c0 / BLOCK;  // N divides BLOCK: one block per thread
    float scale;
    if (scale_kind == kScaleF32)
      scale = static_cast<const float*>(scales)[r * blocks_per_row + b];
    else if (scale_kind == kScaleE4m3)
      scale = Fp8Element<e4m3>::to_f32(static_cast<const u8*>(scales)[r * blocks_per_row + b]);
    else
      scale = e8m0_value(static_cast<const u8*>(scales)[r * blocks_per_row + b]);
    const u8* src = codes + r * row_bytes + c0 / E::per_byte;
    float y[N];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      if (c0 + k < cols) {
        const u32 byte = src[k / E::per_byte];
        const u32 code = E::per_byte == 2 ? ((k & 1) ? byte >> 4 : byte & 0xFu) : byte;
        y[k] = __fmul_rn(BlockDecode<Elem>::value(code), scale);
        if (scale_kind == kScaleE4m3) y[k] = __fmul_rn(y[k], s_dec);
      } else {
        y[k] = 0.0f;
      }
    }
    storage* dst = static_cast<storage*>(out) + r * cols + c0;
#pragma unroll
    for (int k = 0; k < N; ++k)
      if (c0 + k < cols) dst[k] = y[k] != y[k] ? quiet_nan_storage<Out>() : FO::from_acc(y[k]);
  }
}
