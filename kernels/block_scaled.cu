// block_scaled.cu: quantize to the block-scaled formats (MX, FP8 blocks along the contiguous axis).
//
// Schedule ("lanes"): a team of BLOCK / VEC threads covers one block of BLOCK consecutive elements,
// VEC per thread; the team's amax is a butterfly of integer maxima over |x|'s f32 bits (NaN and Inf
// order above every finite value, so amax >= 0x7F800000 flags a non-finite block); lane 0 stores
// the scale. Teams cover the tensor in a grid-stride loop, UNROLL independent slots per thread.
// Epilogue: the format's scale rule (qp_block_scaled.cuh) and its element encoder.
//
// CONTIGUOUS: cols % BLOCK == 0 and 16-byte aligned operands, so the tensor is one flat run of
// blocks (vector loads and stores, no row arithmetic before the loads). Otherwise every element is
// addressed as (row, col) with bounds: partial last blocks (amax over the valid elements, codes only
// for them), odd FP4 rows (a zero high nibble).
#include "qp_block_scaled.cuh"

namespace qp {

// A 16-byte vector of input elements as four words, and |x| keys that order like |x| (sign
// cleared; NaN and Inf above every finite value).
template <class In> struct BlockInput;

template <> struct BlockInput<bf16> {
  static const int vec = 8;
  static __device__ __forceinline__ u32 word_key(u32 w) {
    const u32 m = w & 0x7FFF7FFFu;
    return max(m & 0xFFFFu, m >> 16);
  }
  static __device__ __forceinline__ u32 key_bits(u32 key) { return key << 16; }  // the f32 bits of |x|
  static __device__ __forceinline__ float element(const u32 (&w)[4], int k) {
    return __uint_as_float(k & 1 ? (w[k / 2] & 0xFFFF0000u) : (w[k / 2] << 16));
  }
  static __device__ __forceinline__ void put(u32 (&w)[4], int k, const void* p) {
    const u32 h = *static_cast<const u16*>(p);
    w[k / 2] |= k & 1 ? h << 16 : h;
  }
  static const int bytes = 2;
};

template <> struct BlockInput<f16> {
  static const int vec = 8;
  static __device__ __forceinline__ u32 word_key(u32 w) {
    const u32 m = w & 0x7FFF7FFFu;
    return max(m & 0xFFFFu, m >> 16);
  }
  static __device__ __forceinline__ u32 key_bits(u32 key) {
    return __float_as_uint(FloatElement<f16>::to_acc((u16)key));
  }
  static __device__ __forceinline__ float element(const u32 (&w)[4], int k) {
    return FloatElement<f16>::to_acc((u16)(k & 1 ? w[k / 2] >> 16 : w[k / 2] & 0xFFFFu));
  }
  static __device__ __forceinline__ void put(u32 (&w)[4], int k, const void* p) {
    const u32 h = *static_cast<const u16*>(p);
    w[k / 2] |= k & 1 ? h << 16 : h;
  }
  static const int bytes = 2;
};

template <> struct BlockInput<f32> {
  static const int vec = 4;
  static __device__ __forceinline__ u32 word_key(u32 w) { return w & 0x7FFFFFFFu; }
  static __device__ __forceinline__ u32 key_bits(u32 key) { return key; }
  static __device__ __forceinline__ float element(const u32 (&w)[4], int k) { return __uint_as_float(w[k]); }
  static __device__ __forceinline__ void put(u32 (&w)[4], int k, const void* p) { w[k] = *static_cast<const u32*>(p); }
  static const int bytes = 4;
};

}  // namespace qp

template <class In, class Elem, int BLOCK, bool DIVIDE, bool CONTIGUOUS, int UNROLL>
__global__ void __launch_bounds__(256)
    block_scaled_quantize(const void* __restrict__ x_ptr, qp::u8* __restrict__ codes, void* __restrict__ scales,
                          qp::i64 rows, qp::i64 cols, qp::i64 blocks_per_row, int rule, int layout,
                          qp::i64 layout_dim, float amax_floor, float enc_overflow, qp::i64 pad_rows,
                          qp::i64 pad_cols) {
  using namespace qp;
  typedef BlockInput<In> In_;
  typedef BlockElement<Elem> E;
  constexpr int VEC = In_::vec;
  constexpr int TEAM = BLOCK / VEC;
  static_assert(TEAM >= 1 && TEAM <= 32 && (32 % TEAM) == 0, "a team lies within a warp");
  constexpr int CODE_BYTES = VEC / E::per_byte;
  const bool f32_scale = rule >= kBlockF32Div && rule <= kBlockF32Enc;

  const i64 teams = rows * blocks_per_row;
  const i64 slots = teams * TEAM;
  const i64 stride = (i64)gridDim.x * blockDim.x;
  const int lane = threadIdx.x % TEAM;
  const i64 warp_first = (i64)blockIdx.x * blockDim.x + (threadIdx.x & ~31u);

  for (i64 base = warp_first; base < slots; base += stride * UNROLL) {
    u32 raw[UNROLL][4];
    u32 amax[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const i64 slot = base + (threadIdx.x & 31u) + (i64)u * stride;
#pragma unroll
      for (int w = 0; w < 4; ++w) raw[u][w] = 0;
      if (CONTIGUOUS) {
        if (slot < slots) {
          const uint4 word = *reinterpret_cast<const uint4*>(static_cast<const u8*>(x_ptr) + slot * 16);
          raw[u][0] = word.x;
          raw[u][1] = word.y;
          raw[u][2] = word.z;
          raw[u][3] = word.w;
        }
      } else if (slot < slots) {
        const i64 team = slot / TEAM;
        const i64 r = team / blocks_per_row;
        const i64 c0 = (team - r * blocks_per_row) * BLOCK + (i64)lane * VEC;
        const u8* row = static_cast<const u8*>(x_ptr) + (r * cols + c0) * In_::bytes;
#pragma unroll
        for (int k = 0; k < VEC; ++k)
          if (c0 + k < cols) In_::put(raw[u], k, row + k * In_::bytes);
      }
      u32 key = In_::word_key(raw[u][0]);
#pragma unroll
      for (int w = 1; w < 4; ++w) key = max(key, In_::word_key(raw[u][w]));
      amax[u] = key;
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
      for (int o = TEAM / 2; o > 0; o /= 2) amax[u] = max(amax[u], __shfl_xor_sync(0xFFFFFFFFu, amax[u], o));
      amax[u] = In_::key_bits(amax[u]);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const i64 slot = base + (threadIdx.x & 31u) + (i64)u * stride;
      if (slot >= slots) continue;
      const i64 team = slot / TEAM;
      const bool finite = amax[u] < 0x7F800000u;
      BlockScale s;
      if (finite) {
        s = block_scale<E>(amax[u], rule, amax_floor, enc_overflow);
      } else {
        s.stored = nonfinite_scale(rule);
        s.factor = 0.0f;
      }
      u32 packed[CODE_BYTES / 4 > 0 ? CODE_BYTES / 4 : 1];
#pragma unroll
      for (int w = 0; w < (CODE_BYTES / 4 > 0 ? CODE_BYTES / 4 : 1); ++w) packed[w] = 0;
      if (finite) {
#pragma unroll
        for (int k = 0; k < VEC; k += 2) {
          float lo = In_::element(raw[u], k), hi = In_::element(raw[u], k + 1);
          if (DIVIDE) {
            lo = __fdiv_rn(lo, s.factor);
            hi = __fdiv_rn(hi, s.factor);
          } else {
            lo = __fmul_rn(lo, s.factor);
            hi = __fmul_rn(hi, s.factor);
          }
          const u32 pair = E::encode_pair(lo, hi);
          const int bit = (k / 2) * (16 / E::per_byte);  // bit position of this pair in the thread's codes
          packed[bit / 32] |= pair << (bit % 32);
        }
      }
      if (CONTIGUOUS) {
        u8* dst = codes + slot * CODE_BYTES;
        if constexpr (CODE_BYTES == 16) {
          *reinterpret_cast<uint4*>(dst) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
        } else if constexpr (CODE_BYTES == 8) {
          *reinterpret_cast<uint2*>(dst) = make_uint2(packed[0], packed[1]);
        } else if constexpr (CODE_BYTES == 4) {
          *reinterpret_cast<u32*>(dst) = packed[0];
        } else {
          *reinterpret_cast<u16*>(dst) = (u16)packed[0];
        }
      } else {
        const i64 r = team / blocks_per_row;
        const i64 c0 = (team - r * blocks_per_row) * BLOCK + (i64)lane * VEC;
        const i64 row_bytes = (cols + E::per_byte - 1) / E::per_byte;
        const i64 valid = cols - c0;
        const u8* bytes = reinterpret_cast<const u8*>(packed);
#pragma unroll
        for (int b = 0; b < CODE_BYTES; ++b)
          if ((i64)b * E::per_byte < valid) codes[r * row_bytes + c0 / E::per_byte + b] = bytes[b];
      }
      if (lane == 0) {
        i64 off = team;  // kCompact
        if (layout != kCompact) {
          const i64 r = team / blocks_per_row;
          off = scale_offset(layout, r, team - r * blocks_per_row, blocks_per_row, layout_dim);
        }
        if (f32_scale)
          static_cast<u32*>(scales)[off] = s.stored;
        else
          static_cast<u8*>(scales)[off] = (u8)s.stored;
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
