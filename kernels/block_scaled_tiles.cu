// block_scaled_tiles.cu: block-scaled quantization with 2-D tiles, and the fused quantize + transpose.
//
// block_scaled_tiles: one scale per TILE_R x BLOCK_C tile of x [rows, cols] (FP8 128x128 weight
// tiles; MX 32x32 tiles whose byte is repeated over the tile's rows, REPEAT). A CTA of 256 threads
// covers TILE_R rows x TILE_C columns (TILE_C / BLOCK_C tiles side by side): each thread reads
// VECS consecutive 16-byte vectors of a row per pass (coalesced along cols), PASSES rows apart;
// the tile amax is a butterfly of integer maxima of |x| keys inside the warp, then one shared
// atomicMax per warp and tile; every thread then encodes its registers and stores its codes.
//
// block_scaled_transpose: from one read of a 128 x 128 tile, the rowwise copy (blocks of BLOCK
// along cols, stored like the 1-D kernel) and the columnwise copy (blocks of BLOCK along rows,
// stored transposed: codes [cols, rows], scales [cols, ceil(rows / BLOCK)]). Phase A: the rows are
// read into registers and shared memory, the rowwise blocks encoded and stored from registers.
// Phase B: two lanes take one 32-bit word column (two 16-bit columns, or one f32 column) of 32
// consecutive rows from shared memory, 16 rows each; the column amax is their two maxima, and
// each stores its 16 code bytes of a transposed row, the pair one whole 32-byte sector. Rows
// 16-31 of every 32 sit in shared memory with their word index's bit 4 flipped (tile_word), so the
// pair's reads fall in different banks. BLOCK = 128 (FP8 1x128 / 128x1) completes the column amax
// across the tile's four row quarters through shared memory.
//
// TE: TE's MXFP8 layout of the columnwise copy (codes untransposed [rows, cols], scales
// [ceil(rows / 32), cols]): phase B leaves each column block's factor in shared memory, phase C
// encodes the tile rows with them and stores them like the rowwise copy.
//
// ALIGNED: cols % 16 == 0 (and rows % 16 == 0 for the transpose) and 16-byte aligned operands:
// vector loads and stores, whole vectors in or out of bounds at the edges. Otherwise every
// element is addressed with bounds. Edge tiles read zeros outside x (the amax of a partial block
// is over its valid elements) and store only valid codes.
//
// Scales: the scale rules of qp_block_scaled.cuh; the layouts of scale_offset, padding
// zero-filled by the same launch.
#include "qp_block_scaled.cuh"

namespace qp {

template <bool DIVIDE> __device__ __forceinline__ float scaled_value(float x, float factor) {
  return DIVIDE ? __fdiv_rn(x, factor) : __fmul_rn(x, factor);
}

// N consecutive elements (N even) to their codes, packed little-endian into ceil(N / per_byte / 4)
// words; all zero for a non-finite block. Element k is at(k): a float, the input element.
// DIVIDE with FAST: x / s by divide_rn over one reciprocal (the same bits as __fdiv_rn) where s
// allows it.
template <class E, bool DIVIDE, bool FAST, int N, class At>
__device__ __forceinline__ void encode_elements(At at, float factor, bool finite, u32* out) {
  constexpr int OUT_WORDS = (N / E::per_byte + 3) / 4;
#pragma unroll
  for (int i = 0; i < OUT_WORDS; ++i) out[i] = 0;
  if (!finite) return;
  if (DIVIDE && FAST && factor >= kDivideFastMin) {
    const float y = __frcp_rn(factor);
#pragma unroll
    for (int k = 0; k < N; k += 2) {
      const int bit = (k / 2) * (16 / E::per_byte);
      out[bit / 32] |= E::encode_pair(divide_rn(at(k), factor, y), divide_rn(at(k + 1), factor, y)) << (bit % 32);
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < N; k += 2) {
    const float lo = scaled_value<DIVIDE>(at(k), factor);
    const float hi = scaled_value<DIVIDE>(at(k + 1), factor);
    const int bit = (k / 2) * (16 / E::per_byte);  // bit position of this pair's codes
    out[bit / 32] |= E::encode_pair(lo, hi) << (bit % 32);
  }
}

// N consecutive elements held in words `w` (InputWords order).
template <class In, class E, bool DIVIDE, int N, bool FAST = false>
__device__ __forceinline__ void encode_run(const u32* w, float factor, bool finite, u32* out) {
  encode_elements<E, DIVIDE, FAST, N>([&](int k) { return InputWords<In>::element(w, k); }, factor, finite, out);
}

// Element j of column h of words `w` of consecutive rows (h: the low or high 16-bit element of
// each word; f32: the words themselves).
template <class In> __device__ __forceinline__ float column_element(const u32* w, int j, int h) {
  if constexpr (InputWords<In>::bytes == 4) {
    return __uint_as_float(w[j]);
  } else {
    const u32 half = h ? w[j] >> 16 : w[j] & 0xFFFFu;
    u32 pair[1] = {half};
    return InputWords<In>::element(pair, 0);
  }
}

// The first `valid` of N code bytes, one byte at a time.
template <int N> __device__ __forceinline__ void store_code_prefix(u8* dst, const u32* w, i64 valid) {
  const u8* bytes = reinterpret_cast<const u8*>(w);
#pragma unroll
  for (int b = 0; b < N; ++b)
    if (b < valid) dst[b] = bytes[b];
}

__device__ __forceinline__ void store_scale(void* scales, bool f32_scale, i64 off, u32 stored) {
  if (f32_scale)
    static_cast<u32*>(scales)[off] = stored;
  else
    static_cast<u8*>(scales)[off] = (u8)stored;
}

__device__ __forceinline__ bool is_f32_rule(int rule) { return rule >= kBlockF32Div && rule <= kBlockF32Enc; }

// Word `wc` of tile row `row` in shared memory (SW words a row): rows 16-31 of every 32 hold their
// words with bit 4 of the index flipped (16-byte vectors stay whole), so the two lanes that read
// one word column 16 rows apart fall in different banks.
template <int SW> __device__ __forceinline__ int tile_word(int row, int wc) { return row * SW + (wc ^ (row & 16)); }

}  // namespace qp

template <class In, class Elem, int TILE_R, int TILE_C, int BLOCK_C, bool REPEAT, int VECS, bool DIVIDE, bool ALIGNED,
          int MIN_BLOCKS>
__global__ void __launch_bounds__(256, MIN_BLOCKS)
    block_scaled_tiles(const void* __restrict__ x_ptr, qp::u8* __restrict__ codes, void* __restrict__ scales,
                       qp::i64 rows, qp::i64 cols, qp::i64 row_tile_base, int rule, int layout, qp::i64 layout_dim,
                       float amax_floor, float enc_overflow, qp::i64 scale_rows, qp::i64 scale_cols,
                       qp::i64 pad_rows, qp::i64 pad_cols) {
  using namespace qp;
  typedef InputWords<In> W;
  typedef BlockElement<Elem> E;
  constexpr int VEC = W::vec;
  constexpr int CH = VEC * VECS;         // elements of one thread per pass
  constexpr int CPR = TILE_C / CH;       // threads per tile row
  constexpr int RPP = 256 / CPR;         // rows per pass
  constexpr int PASSES = TILE_R / RPP;
  constexpr int TEAM = BLOCK_C / CH;     // threads of one tile in one row
  constexpr int NB = TILE_C / BLOCK_C;   // tiles side by side
  constexpr int CODE_BYTES = CH / E::per_byte;
  constexpr int CODE_WORDS = (CODE_BYTES + 3) / 4;
  static_assert(CPR * CH == TILE_C && (CPR & (CPR - 1)) == 0 && CPR <= 256, "a power-of-two number of threads per row");
  static_assert(RPP * PASSES == TILE_R && TEAM * CH == BLOCK_C && (TEAM & (TEAM - 1)) == 0, "tiles cover the CTA");
  static_assert(TEAM <= CPR && NB * BLOCK_C == TILE_C, "whole tiles per CTA");

  __shared__ u32 s_amax[NB];
  const int t = threadIdx.x, lane = t & 31, ci = t % CPR, rp = t / CPR;
  const i64 r0 = (row_tile_base + blockIdx.y) * TILE_R;
  const i64 c = (i64)blockIdx.x * TILE_C + ci * CH;  // first column of this thread's run
  const bool f32_scale = is_f32_rule(rule);
  const bool full = ALIGNED && r0 + TILE_R <= rows && (i64)(blockIdx.x + 1) * TILE_C <= cols;

  u32 raw[PASSES][VECS * 4];
#pragma unroll
  for (int p = 0; p < PASSES; ++p) {
    const i64 r = r0 + rp + p * RPP;
    const u8* src = static_cast<const u8*>(x_ptr) + (r * cols + c) * W::bytes;
#pragma unroll
    for (int w = 0; w < VECS * 4; ++w) raw[p][w] = 0;
    if (full) {
#pragma unroll
      for (int j = 0; j < VECS; ++j) {
        const uint4 v = reinterpret_cast<const uint4*>(src)[j];
        raw[p][4 * j] = v.x, raw[p][4 * j + 1] = v.y, raw[p][4 * j + 2] = v.z, raw[p][4 * j + 3] = v.w;
      }
    } else if (r < rows) {
      if (ALIGNED) {
#pragma unroll
        for (int j = 0; j < VECS; ++j)
          if (c + j * VEC < cols) {
            const uint4 v = reinterpret_cast<const uint4*>(src)[j];
            raw[p][4 * j] = v.x, raw[p][4 * j + 1] = v.y, raw[p][4 * j + 2] = v.z, raw[p][4 * j + 3] = v.w;
          }
      } else {
#pragma unroll
        for (int k = 0; k < CH; ++k)
          if (c + k < cols) W::put(raw[p], k, src + k * W::bytes);
      }
    }
  }
  if (t < NB) s_amax[t] = 0;
  __syncthreads();

  // The tile amax: this thread's maximum, then the lanes of the same tile in the warp (same run
  // of another row: offsets >= CPR; another run of the same tile in the row: offsets < TEAM),
  // then one atomicMax per warp and tile.
  u32 key = 0;
#pragma unroll
  for (int p = 0; p < PASSES; ++p)
#pragma unroll
    for (int w = 0; w < VECS * 4; ++w) key = max(key, W::word_key(raw[p][w]));
#pragma unroll
  for (int o = 1; o < 32; o *= 2)
    if (o < TEAM || o >= CPR) key = max(key, __shfl_xor_sync(0xFFFFFFFFu, key, o));
  if (lane % TEAM == 0 && lane < CPR) atomicMax(&s_amax[ci / TEAM], key);
  __syncthreads();

  const u32 amax_bits = W::key_bits(s_amax[ci / TEAM]);
  const bool finite = amax_bits < 0x7F800000u;
  const BlockScale s = block_scale_or_nan<E>(amax_bits, rule, amax_floor, enc_overflow);
  const i64 row_bytes = (cols + E::per_byte - 1) / E::per_byte;
  const i64 tile_col = c / BLOCK_C;
#pragma unroll
  for (int p = 0; p < PASSES; ++p) {
    const i64 r = r0 + rp + p * RPP;
    u32 packed[CODE_WORDS];
    encode_run<In, E, DIVIDE, CH, true>(raw[p], s.factor, finite, packed);
    u8* dst = codes + r * row_bytes + c / E::per_byte;
    if (full) {
      store_code_run<CODE_BYTES>(dst, packed);
    } else if (r < rows && c < cols) {
      if (ALIGNED) {
        constexpr int VB = VEC / E::per_byte;  // code bytes of one vector
#pragma unroll
        for (int j = 0; j < VECS; ++j)
          if (c + j * VEC < cols) {
            if constexpr (VB >= 4)
              store_code_run<VB>(dst + j * VB, packed + j * VB / 4);
            else  // two FP4 bytes of one f32 vector
              *reinterpret_cast<u16*>(dst + j * VB) = (u16)(packed[j * VB / 4] >> (8 * (j * VB % 4)));
          }
      } else {
        store_code_prefix<CODE_BYTES>(dst, packed, (cols - c + E::per_byte - 1) / E::per_byte);
      }
    }
    // The scale: the first run of each tile in each row (REPEAT) or in the tile's first row.
    if (ci % TEAM == 0 && r < rows && c < cols && (REPEAT || (rp == 0 && p == 0))) {
      const i64 sr = REPEAT ? r : r0 / TILE_R;
      const i64 off = layout == kCompact ? sr * scale_cols + tile_col : scale_offset(layout, sr, tile_col, scale_cols, layout_dim);
      store_scale(scales, f32_scale, off, s.stored);
    }
  }

  const i64 stride = (i64)gridDim.x * gridDim.y * 256;
  const i64 first = ((i64)blockIdx.y * gridDim.x + blockIdx.x) * 256 + t;
  zero_scale_padding(scales, f32_scale, layout, scale_rows, scale_cols, layout_dim, pad_rows, pad_cols, first, stride);
}

template <class In, class Elem, int BLOCK, bool TE, bool DIVIDE, bool ALIGNED, int MIN_BLOCKS>
__global__ void __launch_bounds__(256, MIN_BLOCKS)
    block_scaled_transpose(const void* __restrict__ x_ptr, qp::u8* __restrict__ codes_r, void* __restrict__ scales_r,
                           qp::u8* __restrict__ codes_c, void* __restrict__ scales_c, qp::i64 rows, qp::i64 cols,
                           qp::i64 row_tile_base, int rule, float amax_floor, float enc_overflow, int layout,
                           qp::i64 dim_r, qp::i64 pad_rows_r, qp::i64 pad_cols_r, qp::i64 dim_c, qp::i64 pad_rows_c,
                           qp::i64 pad_cols_c) {
  using namespace qp;
  typedef InputWords<In> W;
  typedef BlockElement<Elem> E;
  constexpr int T = 128;                 // tile edge
  constexpr int VEC = W::vec;
  constexpr int CPR = T / VEC;           // threads per tile row in phase A
  constexpr int RPP = 256 / CPR;         // rows per pass
  constexpr int PASSES = T / RPP;
  constexpr int TEAM = BLOCK / VEC;      // threads of one rowwise block
  constexpr int SW = T * W::bytes / 4;   // words per shared row
  constexpr int CPW = 4 / W::bytes;      // columns per word
  constexpr int R = 32;                  // rows of one column block of phase B (a row quarter)
  constexpr int H = R / 2;               // rows of one phase-B task (half a quarter)
  constexpr int MP = T / R;              // row quarters
  constexpr int TASKS = SW * MP * 2 / 256;  // phase-B tasks per thread
  static_assert(E::per_byte == 1, "one code per byte");
  static_assert((BLOCK == 32 || BLOCK == 128) && TEAM <= 32 && TASKS * 256 == SW * MP * 2 && SW % 32 == 0, "tile geometry");
  static_assert(!TE || (BLOCK == 32 && !DIVIDE), "the TE layout is MXFP8's");
  extern __shared__ uint4 smem_vectors[];
  u32* tile = reinterpret_cast<u32*>(smem_vectors);  // [T][SW]
  // [MP][T] column keys of each quarter (BLOCK = 128), or the column factors of each quarter (TE;
  // all ones for a non-finite block).
  u32* colkey = tile + T * SW;

  const int t = threadIdx.x, ci = t % CPR, rp = t / CPR;
  const i64 r0 = (row_tile_base + blockIdx.y) * T;
  const i64 c0 = (i64)blockIdx.x * T;
  const i64 c = c0 + ci * VEC;
  const bool f32_scale = is_f32_rule(rule);
  const bool full = ALIGNED && r0 + T <= rows && c0 + T <= cols;
  const i64 row_blocks = (cols + BLOCK - 1) / BLOCK;  // rowwise scale columns
  const i64 col_blocks = (rows + BLOCK - 1) / BLOCK;  // columnwise scale columns

  // Phase A: rows to registers and shared memory; the rowwise copy from registers.
  u32 raw[PASSES][4];
#pragma unroll
  for (int p = 0; p < PASSES; ++p) {
    const i64 r = r0 + rp + p * RPP;
    const u8* src = static_cast<const u8*>(x_ptr) + (r * cols + c) * W::bytes;
    raw[p][0] = raw[p][1] = raw[p][2] = raw[p][3] = 0;
    if (full || (ALIGNED && r < rows && c < cols)) {
      const uint4 v = *reinterpret_cast<const uint4*>(src);
      raw[p][0] = v.x, raw[p][1] = v.y, raw[p][2] = v.z, raw[p][3] = v.w;
    } else if (!ALIGNED && r < rows) {
#pragma unroll
      for (int k = 0; k < VEC; ++k)
        if (c + k < cols) W::put(raw[p], k, src + k * W::bytes);
    }
  }
#pragma unroll
  for (int p = 0; p < PASSES; ++p)
    *reinterpret_cast<uint4*>(tile + tile_word<SW>(rp + p * RPP, ci * 4)) = make_uint4(raw[p][0], raw[p][1], raw[p][2], raw[p][3]);
#pragma unroll
  for (int p = 0; p < PASSES; ++p) {
    const i64 r = r0 + rp + p * RPP;
    u32 key;
    if constexpr (W::bytes == 2) {  // both lanes at once, then the larger lane
      const u32 m = __vmaxu2(__vmaxu2(lane_keys(raw[p][0]), lane_keys(raw[p][1])), __vmaxu2(lane_keys(raw[p][2]), lane_keys(raw[p][3])));
      key = max(m & 0xFFFFu, m >> 16);
    } else {
      key = max(max(W::word_key(raw[p][0]), W::word_key(raw[p][1])), max(W::word_key(raw[p][2]), W::word_key(raw[p][3])));
    }
#pragma unroll
    for (int o = TEAM / 2; o > 0; o /= 2) key = max(key, __shfl_xor_sync(0xFFFFFFFFu, key, o));
    const u32 bits = W::key_bits(key);
    const BlockScale s = block_scale_or_nan<E>(bits, rule, amax_floor, enc_overflow);
    u32 packed[VEC / 4];
    encode_run<In, E, DIVIDE, VEC, true>(raw[p], s.factor, bits < 0x7F800000u, packed);
    u8* dst = codes_r + r * cols + c;
    if (full || (ALIGNED && r < rows && c < cols))
      store_code_run<VEC>(dst, packed);
    else if (!ALIGNED && r < rows && c < cols)
      store_code_prefix<VEC>(dst, packed, cols - c);
    if (ci % TEAM == 0 && r < rows && c < cols) {
      const i64 off = layout == kCompact ? r * row_blocks + c / BLOCK : scale_offset(layout, r, c / BLOCK, row_blocks, dim_r);
      store_scale(scales_r, f32_scale, off, s.stored);
    }
  }
  __syncthreads();

  // Phase B: the columnwise copy. Task q: word column q % SW of row quarter q / SW.
  if constexpr (BLOCK == 128) {
#pragma unroll
    for (int i = 0; i < TASKS / 2; ++i) {
      const int q = t + i * 256, wc = q % SW, mp = q / SW;
      u32 k0 = 0, k1 = 0;
#pragma unroll
      for (int j = 0; j < R; ++j) {
        const u32 w = tile[tile_word<SW>(mp * R + j, wc)];
        if constexpr (W::bytes == 2) {
          k0 = __vmaxu2(k0, lane_keys(w));  // both columns' keys in the lanes of k0
        } else {
          k0 = max(k0, W::half_key(w, 0));
        }
      }
      if constexpr (W::bytes == 2) {
        k1 = k0 >> 16;
        k0 &= 0xFFFFu;
      }
      colkey[mp * T + wc * CPW] = k0;
      if (CPW == 2) colkey[mp * T + wc * CPW + 1] = k1;
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < TASKS; ++i) {
    const int q = t + i * 256, half = q & 1, wc = (q >> 1) % SW, mp = (q >> 1) / SW;
    const i64 m0 = r0 + mp * R;  // the column block's first row
    const i64 mh = m0 + half * H;  // this lane's first row
    u32 w[H];
#pragma unroll
    for (int j = 0; j < H; ++j) w[j] = tile[tile_word<SW>(mp * R + half * H + j, wc)];
    u32 keys = 0;  // BLOCK = 32: the column block's keys (both columns in lanes for 16-bit input)
    if constexpr (BLOCK != 128) {
#pragma unroll
      for (int j = 0; j < H; ++j) keys = W::bytes == 2 ? __vmaxu2(keys, lane_keys(w[j])) : max(keys, W::half_key(w[j], 0));
      const u32 other = __shfl_xor_sync(0xFFFFFFFFu, keys, 1);
      keys = W::bytes == 2 ? __vmaxu2(keys, other) : max(keys, other);
    }
#pragma unroll
    for (int h = 0; h < CPW; ++h) {
      const int col = wc * CPW + h;
      const i64 k = c0 + col;
      u32 key;
      if constexpr (BLOCK == 128) {
        key = max(max(colkey[col], colkey[T + col]), max(colkey[2 * T + col], colkey[3 * T + col]));
      } else {
        key = W::bytes == 2 ? (h ? keys >> 16 : keys & 0xFFFFu) : keys;
      }
      const u32 bits = W::key_bits(key);
      const BlockScale s = block_scale_or_nan<E>(bits, rule, amax_floor, enc_overflow);
      if constexpr (TE) {  // the factor for phase C; the scale at [m0 / 32, k] of [ceil(rows / 32), cols]
        if (half == 0) {
          colkey[mp * T + col] = bits < 0x7F800000u ? __float_as_uint(s.factor) : 0xFFFFFFFFu;
          if (k < cols && m0 < rows) static_cast<u8*>(scales_c)[(m0 / BLOCK) * cols + k] = (u8)s.stored;
        }
        continue;
      }
      u32 packed[H / 4];
      encode_elements<E, DIVIDE, true, H>([&](int j) { return column_element<In>(w, j, h); }, s.factor,
                                          bits < 0x7F800000u, packed);
      if (k < cols && mh < rows) {
        u8* dst = codes_c + k * rows + mh;
        if (ALIGNED)  // rows % 16 == 0: the lane's 16 bytes are wholly in or out
          store_code_run<H>(dst, packed);
        else
          store_code_prefix<H>(dst, packed, rows - mh);
        if ((BLOCK == 32 || mp == 0) && half == 0) {
          const i64 cb = m0 / BLOCK;
          const i64 off = layout == kCompact ? k * col_blocks + cb : scale_offset(layout, k, cb, col_blocks, dim_c);
          store_scale(scales_c, f32_scale, off, s.stored);
        }
      }
    }
  }

  if constexpr (TE) {
    // Phase C (TE's MXFP8 layout): the columnwise codes untransposed, [rows, cols] like x, each
    // element times the factor of its column block.
    __syncthreads();
#pragma unroll
    for (int p = 0; p < PASSES; ++p) {
      const int tr = rp + p * RPP;
      const i64 r = r0 + tr;
      const uint4 v = *reinterpret_cast<const uint4*>(tile + tile_word<SW>(tr, ci * 4));
      const u32 w[4] = {v.x, v.y, v.z, v.w};
      const u32* f = colkey + (tr / R) * T + ci * VEC;
      u32 packed[VEC / 4];
#pragma unroll
      for (int i = 0; i < VEC / 4; ++i) packed[i] = 0;
#pragma unroll
      for (int k = 0; k < VEC; k += 2) {
        const float lo = __fmul_rn(W::element(w, k), __uint_as_float(f[k]));
        const float hi = __fmul_rn(W::element(w, k + 1), __uint_as_float(f[k + 1]));
        const u32 keep = (f[k] == 0xFFFFFFFFu ? 0u : 0xFFu) | (f[k + 1] == 0xFFFFFFFFu ? 0u : 0xFF00u);
        packed[k / 4] |= (E::encode_pair(lo, hi) & keep) << (8 * (k % 4));
      }
      u8* dst = codes_c + r * cols + c;
      if (full || (ALIGNED && r < rows && c < cols))
        store_code_run<VEC>(dst, packed);
      else if (!ALIGNED && r < rows && c < cols)
        store_code_prefix<VEC>(dst, packed, cols - c);
    }
  }

  const i64 stride = (i64)gridDim.x * gridDim.y * 256;
  const i64 first = ((i64)blockIdx.y * gridDim.x + blockIdx.x) * 256 + t;
  zero_scale_padding(scales_r, f32_scale, layout, rows, row_blocks, dim_r, pad_rows_r, pad_cols_r, first, stride);
  zero_scale_padding(scales_c, f32_scale, layout, cols, col_blocks, dim_c, pad_rows_c, pad_cols_c, first, stride);
}
