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
// each stores its 16 code bytes of a transposed row. Four neighbouring pairs take the four row
// quarters of one word column, so a warp's stores are whole 128-byte lines of the transposed
// rows. Each 16-row group of the tile sits in shared memory with its word indices xor-ed by the
// group number (tile_word), so the eight lanes reading one word column fall in different banks.
// Byte scales of whole tiles are staged and stored four to a word. BLOCK = 128 (FP8 1x128 / 128x1)
// completes the column amax across the tile's four row quarters through shared memory.
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

// Word `wc` of tile row `row` in shared memory (SW words a row): bits 2-4 of the word index xor-ed
// with the row's 16-row group (16-byte vectors stay whole), so eight lanes that read one word
// column in eight different 16-row groups fall in different banks.
template <int SW> __device__ __forceinline__ int tile_word(int row, int wc) { return row * SW + (wc ^ ((row >> 2) & 28)); }

// Word column wc of the 16 rows from row0 (a multiple of 16: one 16-row group, so one xor for all
// of them): rows row0 + j are at the returned pointer + j * SW, constant offsets.
template <int SW> __device__ __forceinline__ const u32* tile_column(const u32* tile, int row0, int wc) {
  return tile + tile_word<SW>(row0, wc);
}

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

namespace qp {

// Prefetch into L2 the 128 x 128 tile `ahead` CTAs after this one in launch order (blockIdx.x
// fastest), when it is a whole tile (r0: this CTA's first row): thread t takes 128-byte lines t, t + 256, ... of its rows. The
// CTA that takes over a slot later finds its tile in L2, and DRAM keeps reading while the resident
// CTAs compute.
template <class In>
__device__ __forceinline__ void prefetch_tile(const void* x_ptr, i64 rows, i64 cols, i64 r0, u32 ahead) {
  constexpr int LINES = 128 * InputWords<In>::bytes / 128;  // 128-byte lines of one tile row
  const u32 n = blockIdx.y * gridDim.x + blockIdx.x + ahead;
  if (n >= gridDim.x * gridDim.y) return;
  const i64 r = r0 + ((i64)(n / gridDim.x) - blockIdx.y) * 128, c = (i64)(n % gridDim.x) * 128;
  if (r + 128 > rows || c + 128 > cols) return;
#pragma unroll
  for (int k = 0; k < LINES / 2; ++k) {
    const int i = threadIdx.x + 256 * k;
    const u8* line = static_cast<const u8*>(x_ptr) + ((r + i / LINES) * cols + c) * InputWords<In>::bytes + (i % LINES) * 128;
    asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
  }
}

// One 128 x 128 tile of the fused transpose (block_scaled_transpose), the rule fixed (RULE >= 0)
// or read at run time (RULE < 0); SHORT: divide_rn1 for the `div` rule; PREFETCH: after
// its own loads, the CTA prefetches the tile `ahead` CTAs ahead (prefetch_tile).
template <class In, class Elem, int BLOCK, bool TE, bool DIVIDE, bool ALIGNED, int RULE, bool SHORT, bool PREFETCH>
__device__ __forceinline__ void transpose_tile(const void* x_ptr, u8* codes_r, void* scales_r, u8* codes_c,
                                               void* scales_c, i64 rows, i64 cols, i64 r0, int rule,
                                               float amax_floor, float enc_overflow, int layout, i64 dim_r,
                                               i64 dim_c, u32* tile, u32* colkey, u32 ahead) {
  typedef InputWords<In> W;
  typedef BlockElement<Elem> E;
  constexpr int T = 128;                 // tile edge
  constexpr int VEC = W::vec;
  constexpr int CPR = T / VEC;           // threads per tile row in phase A
  constexpr int RPP = 256 / CPR;         // rows per pass
  constexpr int PASSES = T / RPP;
  constexpr int TEAM = BLOCK / VEC;      // lanes of one rowwise block
  constexpr int KP = PASSES >= TEAM ? PASSES / TEAM : 1;   // passes whose scale a lane computes
  constexpr int DUP = TEAM > PASSES ? TEAM / PASSES : 1;   // lanes computing the same pass's scale
  constexpr int SW = T * W::bytes / 4;   // words per shared row
  constexpr int CPW = 4 / W::bytes;      // columns per word
  constexpr int R = 32;                  // rows of one column block of phase B (a row quarter)
  constexpr int H = R / 2;               // rows of one phase-B task (half a quarter)
  static_assert(H == 16, "a phase-B task reads one 16-row group of the swizzled tile (tile_column)");
  constexpr int TASKS = SW * (T / R) * 2 / 256;  // phase-B tasks per thread
  constexpr bool KEEP = BLOCK == 128 && TASKS <= 2;  // phase-B words stay in registers across the key barrier
  static_assert(E::per_byte == 1, "one code per byte");
  static_assert((BLOCK == 32 || BLOCK == 128) && TEAM <= 32 && SW % 32 == 0 && 128 % SW == 0, "tile geometry");
  static_assert(!TE || (BLOCK == 32 && !DIVIDE), "the TE layout is MXFP8's");

  const int t = threadIdx.x, lane = t & 31, ci = t % CPR, rp = t / CPR;
  const i64 c0 = (i64)blockIdx.x * T;
  const int rule_ = RULE >= 0 ? RULE : rule;
  const bool f32_scale = is_f32_rule(rule_);
  const int rows_left = (int)min(rows - r0, (i64)T), cols_left = (int)min(cols - c0, (i64)T);
  const bool full = ALIGNED && rows_left == T && cols_left == T;
  const bool col_in = ci * VEC < cols_left;
  const i64 row_blocks = (cols + BLOCK - 1) / BLOCK;  // rowwise scale columns
  const i64 col_blocks = (rows + BLOCK - 1) / BLOCK;  // columnwise scale columns
  // Byte scales of a whole tile in the compact (with a multiple of 4 scale columns) or the 128x4
  // blocked layout: a column's four scales of this tile are one aligned word. Phase B stages them
  // in shared memory and 128 threads store one word each, instead of 512 single-byte stores.
  const bool stage_c = BLOCK == 32 && !TE && !f32_scale && full && ((reinterpret_cast<unsigned long long>(scales_c) & 3) == 0) &&
                       (layout == kBlocked128x4 || (layout == kCompact && (col_blocks & 3) == 0));

  // Phase A: rows to registers and shared memory; the rowwise copy from registers.
  u32 raw[PASSES][4];
  {
    const u8* src = static_cast<const u8*>(x_ptr) + ((r0 + rp) * cols + c0 + ci * VEC) * W::bytes;
    const i64 step = (i64)RPP * cols * W::bytes;
#pragma unroll
    for (int p = 0; p < PASSES; ++p) {
      const bool row_in = rp + p * RPP < rows_left;
      const u8* s = src + p * step;
      raw[p][0] = raw[p][1] = raw[p][2] = raw[p][3] = 0;
      if (full || (ALIGNED && row_in && col_in)) {
        const uint4 v = *reinterpret_cast<const uint4*>(s);
        raw[p][0] = v.x, raw[p][1] = v.y, raw[p][2] = v.z, raw[p][3] = v.w;
      } else if (!ALIGNED && row_in) {
#pragma unroll
        for (int k = 0; k < VEC; ++k)
          if (ci * VEC + k < cols_left) W::put(raw[p], k, s + k * W::bytes);
      }
    }
  }
  if constexpr (PREFETCH) prefetch_tile<In>(x_ptr, rows, cols, r0, ahead);
#pragma unroll
  for (int p = 0; p < PASSES; ++p)
    *reinterpret_cast<uint4*>(tile + tile_word<SW>(rp + p * RPP, ci * 4)) = make_uint4(raw[p][0], raw[p][1], raw[p][2], raw[p][3]);

  // The block keys of every pass, exchanged so that each lane holds whole maxima of KP passes; it
  // computes and stores their scales, and the factors of every pass come back by shuffles.
  u32 key[PASSES];
#pragma unroll
  for (int p = 0; p < PASSES; ++p) {
    if constexpr (W::bytes == 2) {  // both lanes at once, then the larger lane
      const u32 m = __vmaxu2(__vmaxu2(lane_keys(raw[p][0]), lane_keys(raw[p][1])), __vmaxu2(lane_keys(raw[p][2]), lane_keys(raw[p][3])));
      key[p] = max(m & 0xFFFFu, m >> 16);
    } else {
      key[p] = max(max(W::word_key(raw[p][0]), W::word_key(raw[p][1])), max(W::word_key(raw[p][2]), W::word_key(raw[p][3])));
    }
  }
  exchange_keys<PASSES, TEAM>(key, lane);
  const int j = lane % TEAM;                       // this lane's place in its team
  const int team_ci = ci - j;                      // the team's first thread of the row
  const i64 cb_r = (c0 + team_ci * VEC) / BLOCK;   // the team's block column
  EncodeFactor mine[KP];
#pragma unroll
  for (int i = 0; i < KP; ++i) {
    const int tr = rp + ((j / DUP) * KP + i) * RPP;  // the tile row of this lane's i-th pass
    const BlockScale s = transpose_block_scale<E, RULE, DIVIDE, SHORT>(W::key_bits(key[i]), rule_, amax_floor, enc_overflow, mine[i]);
    if (j % DUP == 0 && tr < rows_left && team_ci * VEC < cols_left) {
      const i64 r = r0 + tr;
      const i64 off = layout == kCompact ? r * row_blocks + cb_r : scale_offset(layout, r, cb_r, row_blocks, dim_r);
      store_scale(scales_r, f32_scale, off, s.stored);
    }
  }
  {
    u8* dst = codes_r + (r0 + rp) * cols + c0 + ci * VEC;
    const i64 step = (i64)RPP * cols;
#pragma unroll
    for (int p = 0; p < PASSES; ++p) {
      const int owner = (lane - j) + (p / KP) * DUP;
      EncodeFactor ef;
      ef.f = __shfl_sync(0xFFFFFFFFu, mine[p % KP].f, owner);
      ef.y = DIVIDE ? __shfl_sync(0xFFFFFFFFu, mine[p % KP].y, owner) : 0.0f;
      u32 packed[VEC / 4];
      encode_with_factor<E, DIVIDE, SHORT, VEC>([&](int k) { return W::element(raw[p], k); }, ef, packed);
      const bool row_in = rp + p * RPP < rows_left;
      if (full || (ALIGNED && row_in && col_in))
        store_code_run<VEC>(dst + p * step, packed);
      else if (!ALIGNED && row_in && col_in)
        store_code_prefix<VEC>(dst + p * step, packed, cols_left - ci * VEC);
    }
  }
  __syncthreads();

  // Phase B: the columnwise copy. Task g = t / 2 + 128 i: word column wc of row quarter mp, rows
  // half * H .. + H of it; each lane of the pair computes the scale of one of the word's columns
  // (h = half) and takes the other's factor from its partner. The transposed layouts give the four
  // quarters of a word column to neighbouring pairs (mp = g % 4), so a column's eight 16-byte
  // stores are one whole 128-byte line; TE's stores no codes here, its scales stay row-contiguous
  // (mp = g / SW).
  const int half = t & 1;
  const int h_own = CPW == 2 ? half : 0;
  u32 w[KEEP ? TASKS : 1][H];
  if constexpr (BLOCK == 128) {
    // The quarter keys of every column: the pair's maxima over its 32 rows, in colkey[mp][col].
#pragma unroll
    for (int i = 0; i < TASKS; ++i) {
      const int g = (t >> 1) + 128 * i;
      const int mp = TE ? g / SW : g & 3, wc = TE ? g % SW : g >> 2;
      const int col_own = wc * CPW + h_own;
      u32* wi = w[KEEP ? i : 0];
      const u32* column = tile_column<SW>(tile, mp * R + half * H, wc);
#pragma unroll
      for (int jj = 0; jj < H; ++jj) wi[jj] = column[jj * SW];
      u32 k = 0;
#pragma unroll
      for (int jj = 0; jj < H; ++jj) k = W::bytes == 2 ? __vmaxu2(k, lane_keys(wi[jj])) : max(k, W::half_key(wi[jj], 0));
      const u32 other = __shfl_xor_sync(0xFFFFFFFFu, k, 1);
      k = W::bytes == 2 ? __vmaxu2(k, other) : max(k, other);
      colkey[mp * T + col_own] = W::bytes == 2 ? (h_own ? k >> 16 : k & 0xFFFFu) : k;
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < TASKS; ++i) {
    const int g = (t >> 1) + 128 * i;
    const int mp = TE ? g / SW : g & 3, wc = TE ? g % SW : g >> 2;
    const int col_own = wc * CPW + h_own;
    u8* const cdst = codes_c + (c0 + wc * CPW) * rows + r0 + half * H;
    u32* wi = w[KEEP ? i : 0];
    if (!KEEP) {
      const u32* column = tile_column<SW>(tile, mp * R + half * H, wc);
#pragma unroll
      for (int jj = 0; jj < H; ++jj) wi[jj] = column[jj * SW];
    }
    u32 key_own;
    if constexpr (BLOCK == 128) {
      key_own = max(max(colkey[col_own], colkey[T + col_own]), max(colkey[2 * T + col_own], colkey[3 * T + col_own]));
    } else {
      u32 k = 0;
#pragma unroll
      for (int jj = 0; jj < H; ++jj) k = W::bytes == 2 ? __vmaxu2(k, lane_keys(wi[jj])) : max(k, W::half_key(wi[jj], 0));
      const u32 other = __shfl_xor_sync(0xFFFFFFFFu, k, 1);
      k = W::bytes == 2 ? __vmaxu2(k, other) : max(k, other);
      key_own = W::bytes == 2 ? (h_own ? k >> 16 : k & 0xFFFFu) : k;
    }
    EncodeFactor ef_own;
    const BlockScale s = transpose_block_scale<E, RULE, DIVIDE, SHORT>(W::key_bits(key_own), rule_, amax_floor, enc_overflow, ef_own);
    const int m_loc = mp * R;  // the column block's first tile row
    const i64 k_own = c0 + col_own;
    if constexpr (TE) {  // the factor for phase C; the scale at [m0 / 32, k] of [ceil(rows / 32), cols]
      if (CPW == 2 || half == 0) {
        colkey[mp * T + col_own] = ef_own.f >= 0.0f ? __float_as_uint(ef_own.f) : 0xFFFFFFFFu;
        if (col_own < cols_left && m_loc < rows_left) static_cast<u8*>(scales_c)[((r0 + m_loc) / BLOCK) * cols + k_own] = (u8)s.stored;
      }
      continue;
    }
    if ((CPW == 2 || half == 0) && col_own < cols_left && m_loc < rows_left && (BLOCK == 32 || mp == 0)) {
      if (BLOCK == 32 && stage_c) {
        reinterpret_cast<u8*>(colkey)[col_own * 4 + mp] = (u8)s.stored;
      } else {
        const i64 cb = (r0 + m_loc) / BLOCK;
        const i64 off = layout == kCompact ? k_own * col_blocks + cb : scale_offset(layout, k_own, cb, col_blocks, dim_c);
        store_scale(scales_c, f32_scale, off, s.stored);
      }
    }
    EncodeFactor ef_other = ef_own;
    if constexpr (CPW == 2) {
      ef_other.f = __shfl_xor_sync(0xFFFFFFFFu, ef_own.f, 1);
      if (DIVIDE) ef_other.y = __shfl_xor_sync(0xFFFFFFFFu, ef_own.y, 1);
    }
#pragma unroll
    for (int h = 0; h < CPW; ++h) {
      EncodeFactor ef;
      ef.f = h == h_own ? ef_own.f : ef_other.f;
      ef.y = h == h_own ? ef_own.y : ef_other.y;
      u32 packed[H / 4];
      encode_with_factor<E, DIVIDE, SHORT, H>([&](int jj) { return column_element<In>(wi, jj, h); }, ef, packed);
      const int row0 = m_loc + half * H;
      if (wc * CPW + h < cols_left && row0 < rows_left) {
        u8* dst = cdst + h * rows + m_loc;
        if (ALIGNED)  // rows % 16 == 0: the lane's 16 bytes are wholly in or out
          store_code_run<H>(dst, packed);
        else
          store_code_prefix<H>(dst, packed, rows_left - row0);
      }
    }
  }

  if constexpr (BLOCK == 32 && !TE) {
    // The staged columnwise scales: each column's four bytes (its blocks in this tile) as one word.
    if (stage_c) {
      __syncthreads();
      if (t < T) {
        const i64 off = scale_offset(layout, c0 + t, r0 / BLOCK, col_blocks, dim_c);
        *reinterpret_cast<u32*>(static_cast<u8*>(scales_c) + off) = colkey[t];
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
      const u32 wv[4] = {v.x, v.y, v.z, v.w};
      const u32* f = colkey + (tr / R) * T + ci * VEC;
      u32 packed[VEC / 4];
#pragma unroll
      for (int i = 0; i < VEC / 4; ++i) packed[i] = 0;
#pragma unroll
      for (int k = 0; k < VEC; k += 2) {
        const float lo = __fmul_rn(W::element(wv, k), __uint_as_float(f[k]));
        const float hi = __fmul_rn(W::element(wv, k + 1), __uint_as_float(f[k + 1]));
        const u32 keep = (f[k] == 0xFFFFFFFFu ? 0u : 0xFFu) | (f[k + 1] == 0xFFFFFFFFu ? 0u : 0xFF00u);
        packed[k / 4] |= (E::encode_pair(lo, hi) & keep) << (8 * (k % 4));
      }
      u8* dst = codes_c + r * cols + c0 + ci * VEC;
      const bool row_in = tr < rows_left;
      if (full || (ALIGNED && row_in && col_in))
        store_code_run<VEC>(dst, packed);
      else if (!ALIGNED && row_in && col_in)
        store_code_prefix<VEC>(dst, packed, cols_left - ci * VEC);
    }
  }
}

}  // namespace qp

// The default rules (MX rceil, FP8 enc; FP8 div is DIVIDE's) run tile code with the rule fixed at
// compile time, the others read it at run time; the `div` rule of 16-bit inputs divides with
// divide_rn1. PREFETCH > 0 (aligned launches): each CTA prefetches into L2 the tile PREFETCH / 4
// waves ahead (a wave: MIN_BLOCKS CTAs per multiprocessor; prefetch_tile).
template <class In, class Elem, int BLOCK, bool TE, bool DIVIDE, bool ALIGNED, int MIN_BLOCKS, int PREFETCH = 0>
__global__ void __launch_bounds__(256, MIN_BLOCKS)
    block_scaled_transpose(const void* __restrict__ x_ptr, qp::u8* __restrict__ codes_r, void* __restrict__ scales_r,
                           qp::u8* __restrict__ codes_c, void* __restrict__ scales_c, qp::i64 rows, qp::i64 cols,
                           qp::i64 row_tile_base, int rule, float amax_floor, float enc_overflow, int layout,
                           qp::i64 dim_r, qp::i64 pad_rows_r, qp::i64 pad_cols_r, qp::i64 dim_c, qp::i64 pad_rows_c,
                           qp::i64 pad_cols_c) {
  using namespace qp;
  constexpr bool SHORT = DIVIDE && InputWords<In>::bytes == 2;
  extern __shared__ uint4 smem_vectors[];
  u32* tile = reinterpret_cast<u32*>(smem_vectors);  // [128][words per row]
  // [4][128] column keys of each quarter (BLOCK = 128), the column factors of each quarter (TE;
  // all ones for a non-finite block), or the staged columnwise scales (BLOCK = 32: 4 bytes a column).
  u32* colkey = tile + 128 * (128 * InputWords<In>::bytes / 4);
  const i64 r0 = (row_tile_base + blockIdx.y) * 128;
  constexpr bool PF = PREFETCH > 0 && ALIGNED;
  u32 ahead = 0;
  if constexpr (PF) {
    asm("mov.u32 %0, %%nsmid;" : "=r"(ahead));
    ahead = PREFETCH * MIN_BLOCKS * ahead / 4;
  }
#define QP_TRANSPOSE_TILE(RULE_)                                                                                   \
  transpose_tile<In, Elem, BLOCK, TE, DIVIDE, ALIGNED, RULE_, SHORT, PF>(                                        \
      x_ptr, codes_r, scales_r, codes_c, scales_c, rows, cols, r0, rule, amax_floor, enc_overflow, layout, dim_r, dim_c, \
      tile, colkey, ahead)
  if constexpr (DIVIDE) {
    QP_TRANSPOSE_TILE((int)kBlockF32Div);
  } else {
    constexpr int DEFAULT_RULE = BLOCK == 32 ? (int)kMxRceil : (int)kBlockF32Enc;
    if (rule == DEFAULT_RULE)
      QP_TRANSPOSE_TILE(DEFAULT_RULE);
    else
      QP_TRANSPOSE_TILE(-1);
  }
#undef QP_TRANSPOSE_TILE

  // Only launches whose scale grids have padding (the host passes the grids' own extents
  // otherwise) index it: one uniform test instead of every thread's offsets.
  const i64 row_blocks = (cols + BLOCK - 1) / BLOCK, col_blocks = (rows + BLOCK - 1) / BLOCK;
  if (pad_rows_r > rows || pad_cols_r > row_blocks || pad_rows_c > cols || pad_cols_c > col_blocks) {
    const bool f32_scale = is_f32_rule(rule);
    const i64 stride = (i64)gridDim.x * gridDim.y * 256;
    const i64 first = ((i64)blockIdx.y * gridDim.x + blockIdx.x) * 256 + threadIdx.x;
    zero_scale_padding(scales_r, f32_scale, layout, rows, row_blocks, dim_r, pad_rows_r, pad_cols_r, first, stride);
    zero_scale_padding(scales_c, f32_scale, layout, cols, col_blocks, dim_c, pad_rows_c, pad_cols_c, first, stride);
  }
}
