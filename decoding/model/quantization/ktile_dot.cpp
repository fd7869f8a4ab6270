/* GGUF's K-quant super-blocks (Q4_K, Q6_K) times int8 activations, 8 weight rows a tile.

   Why a second kernel beside block_dot.cpp: that one keeps a float scale (and minimum) per 32 or 16
   columns, so Q4_K's d * sc products (17 significant bits, not a float16) cost 8 bytes a block: 6 bits
   a weight where the file has 4.5, and Q6_K 8.5 where it has 6.6 (with AVX-512 VNNI; without it Q6_K
   fell back to PyTorch's int4 kernel at 8 bits a weight and bfloat16 arithmetic, 8x slower at one
   token). At one token a step only streams weights, so the bytes a weight is the speed. Here the file's
   own factors are kept: Q4_K 4.625 bits a weight (the codes, one byte each for the eight 6-bit scales
   and minimums a 256-column super-block, fp16 d and dmin), Q6_K exactly the file's 6.5625.

   Layout: rows are interleaved 8 to a tile so one 32-byte load holds 4 consecutive codes of each of
   8 weight rows, multiplied by 4 activation bytes broadcast to every lane (AVX2's vpmaddubsw, or a
   256-bit vpdpbusd where the CPU has AVX-512 VNNI or AVX-VNNI): the 8 lanes are 8 outputs, so the
   float work (a scale per 32 or 16 columns) is one multiply-add per lane for all 8 rows, and one
   unpacked weight tile serves up to 4 activation rows. Per tile and super-block:
   - codes, per 32-column block b: four 32-byte vectors t = 0..3, lane r's bytes i = 0..3 holding
     column 4t + i of row r in the low nibble and column 16 + 4t + i in the high nibble (Q4_K: 1,024
     bytes); Q6_K adds the high two bits, per block two 32-byte vectors h = 0, 1 whose bits 2j, 2j + 1
     of byte (4r + i) are those of code vector 4h + j (vector 2t is t's low nibbles, 2t + 1 its high
     ones): 1,536 bytes;
   - meta: Q4_K d[8] and dmin[8] (fp16, a lane each), then sc[8 blocks][8 lanes] and m[8][8] (uint8):
     160 bytes; Q6_K d[8] (fp16), then sc[16 halves][8 lanes] (int8): 144 bytes.
   A tile past the last row is padded with zero codes and scales.

   Activations are quantized per 32-column block to int8 exactly as block_dot.cpp does (scale
   max|x| / 127, round to nearest even), so the two kernels share one stated error: each output is the
   product of those rounded activations and the exact weights, to float32 rounding. Q4_K's minimum
   term uses the block's rounded activations (dx * sum of codes), Q6_K's zero (32) is subtracted from
   the integer dot product as 32 * the activation codes' sum of its 16 columns.

   Work is split over PyTorch's threads by tiles; a row's outputs do not depend on the other rows of
   the call. Many rows (a prompt) are taken 64 at a time, so their codes stay in L2 while every weight
   tile passes. */
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define KTILE_AVX2 1
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define KTILE_VNNI 1  // vpdpbusd on 256-bit vectors (AVX-512 VNNI + VL)
#elif defined(__AVXVNNI__)
#define KTILE_VNNI 2  // the same instruction, VEX-encoded (AVX-VNNI)
#endif
#endif

namespace {

using torch::stable::Tensor;
using torch::headeronly::ScalarType;

constexpr int64_t LANES = 8;        // weight rows a tile
constexpr int64_t SUPER = 256;      // columns a super-block
constexpr int64_t BLOCK = 32;       // columns an activation scale covers
constexpr int64_t ROW_TILE = 4;     // activation rows sharing one unpacked weight block
constexpr int64_t ROW_CHUNK = 64;   // activation rows kept in cache while every weight tile passes
constexpr int64_t Q4K = 4, Q6K = 6;  // the kinds: code bits
#ifndef KTILE_PREFETCH
#define KTILE_PREFETCH 2048
#endif
constexpr int64_t PREFETCH_BYTES = KTILE_PREFETCH;  // how far ahead the weights are asked for
constexpr int64_t Q4K_RAW = 144, Q6K_RAW = 210;  // ggml's block bytes

inline int64_t code_bytes(int64_t kind) { return kind == Q4K ? 1024 : 1536; }  // a tile's super-block
inline int64_t meta_bytes(int64_t kind) { return kind == Q4K ? 160 : 144; }
inline int64_t raw_bytes(int64_t kind) { return kind == Q4K ? Q4K_RAW : Q6K_RAW; }

Tensor empty_rows(const Tensor& like, int64_t rows, int64_t cols, int32_t dtype) {
    const int64_t sizes[2] = {rows, cols}, strides[2] = {cols, 1};
    AtenTensorHandle handle = nullptr;
    STABLE_TORCH_ERROR_CODE_CHECK(
        aoti_torch_empty_strided(2, sizes, strides, dtype, aoti_torch_device_type_cpu(), 0, &handle));
    return Tensor(handle);
}

int32_t dtype_of(const Tensor& t) {
    int32_t dtype = 0;
    STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_dtype(t.get(), &dtype));
    return dtype;
}

inline float half_to_float(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
    uint32_t exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF, bits;
    if (exponent == 0) {
        if (mantissa == 0) {
            bits = sign;
        } else {  // subnormal: normalize
            exponent = 127 - 15 + 1;
            while (!(mantissa & 0x400)) {
                mantissa <<= 1;
                exponent--;
            }
            bits = sign | (exponent << 23) | ((mantissa & 0x3FF) << 13);
        }
    } else if (exponent == 31) {
        bits = sign | 0x7F800000 | (mantissa << 13);
    } else {
        bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
    }
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
}

/* ---- packing: the file's blocks into tiles ------------------------------------------------------ */

/* One super-block of one row, decoded: codes (0..15 or 0..63), and its factors. */
struct Decoded {
    uint8_t q[SUPER];
    uint8_t sc[16], m[8];  // Q4_K: 8 scales and 8 minimums (6-bit); Q6_K: 16 int8 scales (as bytes)
    uint16_t d, dmin;      // fp16 bits
};

void decode_q4k(const uint8_t* b, Decoded& out) {
    std::memcpy(&out.d, b, 2);
    std::memcpy(&out.dmin, b + 2, 2);
    const uint8_t* s = b + 4;
    for (int j = 0; j < 8; j++) {  // ggml's get_scale_min_k4
        if (j < 4) {
            out.sc[j] = s[j] & 63;
            out.m[j] = s[j + 4] & 63;
        } else {
            out.sc[j] = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
            out.m[j] = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        }
    }
    const uint8_t* qs = b + 16;  // four 64-column chunks: 32 bytes, low nibbles then high nibbles
    for (int c = 0; c < 4; c++)
        for (int i = 0; i < 32; i++) {
            out.q[64 * c + i] = qs[32 * c + i] & 0x0F;
            out.q[64 * c + 32 + i] = qs[32 * c + i] >> 4;
        }
}

void decode_q6k(const uint8_t* b, Decoded& out) {
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    std::memcpy(out.sc, b + 192, 16);
    std::memcpy(&out.d, b + 208, 2);
    out.dmin = 0;
    for (int n = 0; n < 2; n++)
        for (int l = 0; l < 32; l++) {
            const uint8_t* lo = ql + 64 * n;
            const uint8_t h = qh[32 * n + l];
            uint8_t* q = out.q + 128 * n;
            q[l] = (lo[l] & 0x0F) | ((h & 3) << 4);
            q[32 + l] = (lo[32 + l] & 0x0F) | (((h >> 2) & 3) << 4);
            q[64 + l] = (lo[l] >> 4) | (((h >> 4) & 3) << 4);
            q[96 + l] = (lo[32 + l] >> 4) | (((h >> 6) & 3) << 4);
        }
}

/* Lane r of a tile's super-block from a decoded one (codes and meta at the super-block's start). */
void place(const Decoded& s, int64_t kind, int64_t r, uint8_t* codes, uint8_t* meta) {
    for (int b = 0; b < 8; b++) {
        const uint8_t* q = s.q + 32 * b;
        for (int t = 0; t < 4; t++)
            for (int i = 0; i < 4; i++) {
                const uint8_t low = q[4 * t + i], high = q[16 + 4 * t + i];
                codes[128 * b + 32 * t + 4 * r + i] = (low & 0x0F) | ((high & 0x0F) << 4);
                if (kind == Q6K) {
                    uint8_t* planes = codes + 1024 + 64 * b;
                    const uint8_t codes2[2] = {static_cast<uint8_t>(low >> 4), static_cast<uint8_t>(high >> 4)};
                    for (int side = 0; side < 2; side++) {
                        const int v = 2 * t + side, h = v / 4, j = v % 4;
                        planes[32 * h + 4 * r + i] |= static_cast<uint8_t>(codes2[side] << (2 * j));
                    }
                }
            }
    }
    std::memcpy(meta + 2 * r, &s.d, 2);
    if (kind == Q4K) {
        std::memcpy(meta + 16 + 2 * r, &s.dmin, 2);
        for (int b = 0; b < 8; b++) {
            meta[32 + 8 * b + r] = s.sc[b];
            meta[96 + 8 * b + r] = s.m[b];
        }
    } else {
        for (int j = 0; j < 16; j++) meta[16 + 8 * j + r] = s.sc[j];
    }
}

/* raw [rows, supers * raw_bytes] (the file's rows) -> codes [tiles, supers * code_bytes], meta
   [tiles, supers * meta_bytes]; lanes past the last row stay zero. */
void pack(const Tensor& raw, Tensor& codes, Tensor& meta, int64_t kind) {
    STD_TORCH_CHECK(kind == Q4K || kind == Q6K, "ktile pack: kind is 4 (Q4_K) or 6 (Q6_K)");
    STD_TORCH_CHECK(raw.scalar_type() == ScalarType::Byte && raw.dim() == 2 && raw.is_contiguous() &&
                        raw.size(1) % raw_bytes(kind) == 0,
                    "ktile pack: raw must be contiguous uint8 [rows, whole super-blocks]");
    const int64_t rows = raw.size(0), supers = raw.size(1) / raw_bytes(kind), tiles = (rows + LANES - 1) / LANES;
    STD_TORCH_CHECK(codes.scalar_type() == ScalarType::Byte && codes.is_contiguous() && codes.dim() == 2 &&
                        codes.size(0) == tiles && codes.size(1) == supers * code_bytes(kind),
                    "ktile pack: codes must be uint8 [tiles, supers * code bytes]");
    STD_TORCH_CHECK(meta.scalar_type() == ScalarType::Byte && meta.is_contiguous() && meta.dim() == 2 &&
                        meta.size(0) == tiles && meta.size(1) == supers * meta_bytes(kind),
                    "ktile pack: meta must be uint8 [tiles, supers * meta bytes]");
    const uint8_t* in = static_cast<const uint8_t*>(raw.data_ptr());
    uint8_t* out_codes = static_cast<uint8_t*>(codes.data_ptr());
    uint8_t* out_meta = static_cast<uint8_t*>(meta.data_ptr());
    const int64_t cb = code_bytes(kind), mb = meta_bytes(kind), rb = raw_bytes(kind);
    torch::stable::parallel_for(0, tiles, 16, [&](int64_t begin, int64_t end) {
        Decoded s;
        for (int64_t tile = begin; tile < end; tile++) {
            uint8_t* tile_codes = out_codes + tile * supers * cb;
            uint8_t* tile_meta = out_meta + tile * supers * mb;
            std::memset(tile_codes, 0, supers * cb);
            std::memset(tile_meta, 0, supers * mb);
            for (int64_t r = 0; r < LANES && tile * LANES + r < rows; r++) {
                const uint8_t* row = in + (tile * LANES + r) * supers * rb;
                for (int64_t sb = 0; sb < supers; sb++) {
                    if (kind == Q4K) decode_q4k(row + sb * rb, s);
                    else decode_q6k(row + sb * rb, s);
                    place(s, kind, r, tile_codes + sb * cb, tile_meta + sb * mb);
                }
            }
        }
    });
}

/* Rows `ids` as float32 [n, K], exactly as AffineCodes.dequantize computes them: Q4_K
   (d * sc) * q + -(dmin * m); Q6_K (d * sc) * q + -(32 * (d * sc)). */
Tensor rows_of(const Tensor& codes, const Tensor& meta, const Tensor& ids, int64_t kind) {
    STD_TORCH_CHECK(ids.scalar_type() == ScalarType::Long && ids.dim() == 1 && ids.is_contiguous(),
                    "ktile rows: ids must be a contiguous int64 vector");
    const int64_t supers = codes.size(1) / code_bytes(kind), k = supers * SUPER, n = ids.size(0);
    Tensor out = empty_rows(codes, n, k, aoti_torch_dtype_float32());
    float* o = static_cast<float*>(out.data_ptr());
    const int64_t* id = static_cast<const int64_t*>(ids.data_ptr());
    const uint8_t* c = static_cast<const uint8_t*>(codes.data_ptr());
    const uint8_t* m = static_cast<const uint8_t*>(meta.data_ptr());
    const int64_t cb = code_bytes(kind), mb = meta_bytes(kind), tiles = codes.size(0);
    for (int64_t i = 0; i < n; i++)
        STD_TORCH_CHECK(id[i] >= 0 && id[i] < tiles * LANES, "ktile rows: id ", id[i], " out of range");
    torch::stable::parallel_for(0, n, 8, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; i++) {
            const int64_t tile = id[i] / LANES, r = id[i] % LANES;
            for (int64_t sb = 0; sb < supers; sb++) {
                const uint8_t* sc_ = c + (tile * supers + sb) * cb;
                const uint8_t* me = m + (tile * supers + sb) * mb;
                uint16_t dh, mh = 0;
                std::memcpy(&dh, me + 2 * r, 2);
                if (kind == Q4K) std::memcpy(&mh, me + 16 + 2 * r, 2);
                const float d = half_to_float(dh), dmin = half_to_float(mh);
                float* row = o + i * k + sb * SUPER;
                for (int b = 0; b < 8; b++)
                    for (int t = 0; t < 4; t++)
                        for (int side = 0; side < 2; side++)
                            for (int e = 0; e < 4; e++) {
                                const int col = 32 * b + 16 * side + 4 * t + e;
                                const uint8_t byte = sc_[128 * b + 32 * t + 4 * r + e];
                                int q = side ? byte >> 4 : byte & 0x0F;
                                if (kind == Q4K) {
                                    const float scale = d * static_cast<float>(me[32 + 8 * b + r]);
                                    const float offset = -(dmin * static_cast<float>(me[96 + 8 * b + r]));
                                    row[col] = scale * static_cast<float>(q) + offset;
                                } else {
                                    const int v = 2 * t + side, h = v / 4, j = v % 4;
                                    q |= ((sc_[1024 + 64 * b + 32 * h + 4 * r + e] >> (2 * j)) & 3) << 4;
                                    const int8_t s8 = static_cast<int8_t>(me[16 + 8 * (col / 16) + r]);
                                    const float scale = d * static_cast<float>(s8);
                                    row[col] = scale * static_cast<float>(q) + -(32.0f * scale);
                                }
                            }
            }
        }
    });
    return out;
}

/* ---- the product ---------------------------------------------------------------------------------- */

/* One call's activations: int8 codes in column order, a scale per 32 columns, Q4_K's rounded block
   sums (dx * sum of codes) and Q6_K's 32 * sum of codes per 16 columns. */
/* Laid out per group of ROW_TILE rows (the last padded with zeros) so that a tile's every read of a
   group is one pointer plus a constant: codes [groups, blocks, 8 slots, 4 rows, 4 bytes], slot 2t holding
   columns 4t..4t+3 of the block and slot 2t + 1 columns 16 + 4t.., as the weights' code vectors; the
   rest [groups, blocks, 4 rows] (zeros: [groups, blocks, 2 halves, 4 rows]). */
struct Activations {
    int64_t rows = 0, k = 0, blocks = 0, groups = 0;
    std::vector<int8_t> codes;
    std::vector<float> scale;    // dx
    std::vector<float> sums;     // dx * sum of the block's codes
    std::vector<int32_t> zeros;  // 32 * sum of each 16 columns' codes

    Activations(int64_t rows_, int64_t k_)
        : rows(rows_), k(k_), blocks(k_ / BLOCK), groups((rows_ + ROW_TILE - 1) / ROW_TILE),
          codes(groups * blocks * 128, 0), scale(groups * blocks * ROW_TILE, 0.0f), sums(groups * blocks * ROW_TILE, 0.0f),
          zeros(groups * blocks * 2 * ROW_TILE, 0) {}
};

#if defined(KTILE_AVX2)
inline int32_t hsum8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* One 32-value block: codes (round to nearest even, as block_dot.cpp), scale, rounded sum, halves' sums. */
inline void quantize_block(const float* v, int8_t* codes, float& scale, float& sum, int32_t& low, int32_t& high) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 parts[4], top = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        parts[i] = _mm256_loadu_ps(v + 8 * i);
        top = _mm256_max_ps(top, _mm256_andnot_ps(sign, parts[i]));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    const float amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
    scale = amax / 127.0f;
    const __m256 inverse = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    __m256i q[4];
    for (int i = 0; i < 4; i++) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(parts[i], inverse));
    low = hsum8(_mm256_add_epi32(q[0], q[1]));
    high = hsum8(_mm256_add_epi32(q[2], q[3]));
    sum = scale * static_cast<float>(low + high);
    const __m256i words = _mm256_packs_epi32(q[0], q[1]);  // lanes interleaved by 128 bits
    const __m256i words2 = _mm256_packs_epi32(q[2], q[3]);
    const __m256i bytes = _mm256_packs_epi16(words, words2);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes), _mm256_permutevar8x32_epi32(bytes, order));
}
#endif

template <typename T>
void quantize_rows(const T* x, Activations& a) {
    torch::stable::parallel_for(0, a.rows, 4, [&](int64_t begin, int64_t end) {
        float widened[BLOCK];
        for (int64_t r = begin; r < end; r++)
            for (int64_t b = 0; b < a.blocks; b++) {
                const T* v = x + r * a.k + b * BLOCK;
                const float* values;
                if constexpr (std::is_same_v<T, float>) {
                    values = v;
                } else {
                    for (int64_t i = 0; i < BLOCK; i++) widened[i] = static_cast<float>(v[i]);
                    values = widened;
                }
                int32_t low = 0, high = 0;
                const int64_t at = (r / ROW_TILE) * a.blocks + b, lane = r % ROW_TILE;
#if defined(KTILE_AVX2)
                alignas(32) int8_t codes[BLOCK];
                quantize_block(values, codes, a.scale[at * ROW_TILE + lane], a.sums[at * ROW_TILE + lane], low, high);
                int8_t* slots = a.codes.data() + at * 128 + 4 * lane;
                for (int t = 0; t < 4; t++) {
                    std::memcpy(slots + 16 * (2 * t), codes + 4 * t, 4);
                    std::memcpy(slots + 16 * (2 * t + 1), codes + 16 + 4 * t, 4);
                }
#endif
                a.zeros[at * 2 * ROW_TILE + lane] = 32 * low;
                a.zeros[at * 2 * ROW_TILE + ROW_TILE + lane] = 32 * high;
            }
    });
}

#if defined(KTILE_AVX2)
inline __m256i broadcast4(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Integer dot products of 4 unsigned weight bytes and 4 signed activation bytes per 32-bit lane. With
   VNNI, vpdpbusd adds them straight into int32 lanes. AVX2's vpmaddubsw sums pairs of byte products into
   int16 lanes; those are added in int16 while exact (4-bit codes x |127| pair to at most 3,810, so a
   32-column block's 8 products fit; 6-bit ones to 16,002, so 2 fit), then widened (vpmaddwd by ones). */
#if defined(KTILE_VNNI)
using Partial = __m256i;  // int32 lanes
inline __m256i pair_dot(__m256i acc, __m256i w, __m256i x) {
#if KTILE_VNNI == 1
    return _mm256_dpbusd_epi32(acc, w, x);
#else
    return _mm256_dpbusd_avx_epi32(acc, w, x);
#endif
}
inline __m256i widen(__m256i partial) { return partial; }
#else
using Partial = __m256i;  // int16 lanes
inline __m256i pair_dot(__m256i acc, __m256i w, __m256i x) {
    // a saturating add, which the bounds above never reach: integer adds are associative, and GCC
    // regrouped a group's 4 rows of sums into trees whose partial results spilled to the stack (283
    // spilled vectors in the product; 73 with this add, which it may not regroup)
    return _mm256_adds_epi16(acc, _mm256_maddubs_epi16(w, x));
}
inline __m256i widen(__m256i partial) { return _mm256_madd_epi16(partial, _mm256_set1_epi16(1)); }
#endif

inline __m256 widen_u8(const uint8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

inline __m256 widen_i8(const uint8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

inline __m256 halves(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

/* One tile (8 weight rows, all super-blocks) against R activation rows r0..: acc[r] lane l = output
   (row r0 + r, weight row l). Per 32-column block, each 32-byte code vector is unpacked once and meets
   the R rows' broadcast activations; the R rows' integer sums stay in registers until the block's
   float step. */
template <int KIND, int R, bool PREFETCH>
inline void tile_dot(const uint8_t* codes, const uint8_t* meta, int64_t supers, const Activations& a, int64_t group,
                     __m256* out) {
    __m256 acc[R];  // local: the results would otherwise be stored at every step (bytes alias everything)
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    const int8_t* x = a.codes.data() + group * a.blocks * 128;  // [blocks, 8 slots, 4 rows, 4 bytes]
    const float* dx = a.scale.data() + group * a.blocks * ROW_TILE;
    const float* sx = a.sums.data() + group * a.blocks * ROW_TILE;
    const int32_t* zeros = a.zeros.data() + group * a.blocks * 2 * ROW_TILE;
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < supers; sb++) {
        const uint8_t* c = codes + sb * (KIND == Q4K ? 1024 : 1536);
        const uint8_t* me = meta + sb * (KIND == Q4K ? 160 : 144);
        for (int b = 0; b < 8; b++) {
            if (PREFETCH) {  // the first row group streams the weights: ask for the bytes ahead
                const char* ahead = reinterpret_cast<const char*>(c) + PREFETCH_BYTES;
                _mm_prefetch(ahead + 128 * b, _MM_HINT_T0);
                _mm_prefetch(ahead + 128 * b + 64, _MM_HINT_T0);
                if constexpr (KIND == Q6K) _mm_prefetch(ahead + 1024 + 64 * b, _MM_HINT_T0);
            }
            const uint8_t* cb = c + 128 * b;
            const int8_t* xb = x + (sb * 8 + b) * 128;
            const float* dxb = dx + (sb * 8 + b) * ROW_TILE;
            const __m256 d = halves(me);
            if constexpr (KIND == Q4K) {
                Partial sum[R];
                for (int r = 0; r < R; r++) sum[r] = _mm256_setzero_si256();
                for (int t = 0; t < 4; t++) {  // columns 4t.. in the low nibbles (slot 2t), 16 + 4t.. in the high
                    const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cb + 32 * t));
                    const __m256i low = _mm256_and_si256(packed, nibble);
                    const __m256i high = _mm256_and_si256(_mm256_srli_epi16(packed, 4), nibble);
                    for (int r = 0; r < R; r++) {
                        sum[r] = pair_dot(sum[r], low, broadcast4(xb + 32 * t + 4 * r));
                        sum[r] = pair_dot(sum[r], high, broadcast4(xb + 32 * t + 16 + 4 * r));
                    }
                }
                const __m256 dsc = _mm256_mul_ps(d, widen_u8(me + 32 + 8 * b));
                const __m256 dm = _mm256_mul_ps(halves(me + 16), widen_u8(me + 96 + 8 * b));
                const float* sxb = sx + (sb * 8 + b) * ROW_TILE;
                for (int r = 0; r < R; r++) {
                    const __m256 coefficient = _mm256_mul_ps(dsc, _mm256_set1_ps(dxb[r]));
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(widen(sum[r])), coefficient, acc[r]);
                    acc[r] = _mm256_fnmadd_ps(dm, _mm256_set1_ps(sxb[r]), acc[r]);
                }
            } else {
                __m256i low_sum[R], high_sum[R];  // int32: columns 0..15 and 16..31 of the block
                for (int r = 0; r < R; r++) low_sum[r] = high_sum[r] = _mm256_setzero_si256();
                const __m256i bits = _mm256_set1_epi8(0x30);
                for (int h = 0; h < 2; h++) {  // t = 2h, 2h + 1: their four vectors' high bits in plane h
                    const __m256i planes =
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 1024 + 64 * b + 32 * h));
                    const __m256i p0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cb + 64 * h));
                    const __m256i p1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cb + 64 * h + 32));
                    const __m256i low0 = _mm256_or_si256(_mm256_and_si256(p0, nibble),
                                                         _mm256_and_si256(_mm256_slli_epi16(planes, 4), bits));
                    const __m256i high0 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(p0, 4), nibble),
                                                          _mm256_and_si256(_mm256_slli_epi16(planes, 2), bits));
                    const __m256i low1 = _mm256_or_si256(_mm256_and_si256(p1, nibble), _mm256_and_si256(planes, bits));
                    const __m256i high1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(p1, 4), nibble),
                                                          _mm256_and_si256(_mm256_srli_epi16(planes, 2), bits));
                    const int8_t* xs = xb + 64 * h;  // slots 4h .. 4h + 3
                    for (int r = 0; r < R; r++) {
                        Partial lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
                        lo = pair_dot(lo, low0, broadcast4(xs + 4 * r));
                        lo = pair_dot(lo, low1, broadcast4(xs + 32 + 4 * r));
                        hi = pair_dot(hi, high0, broadcast4(xs + 16 + 4 * r));
                        hi = pair_dot(hi, high1, broadcast4(xs + 48 + 4 * r));
                        low_sum[r] = _mm256_add_epi32(low_sum[r], widen(lo));
                        high_sum[r] = _mm256_add_epi32(high_sum[r], widen(hi));
                    }
                }
                const __m256 dsc_low = _mm256_mul_ps(d, widen_i8(me + 16 + 16 * b));
                const __m256 dsc_high = _mm256_mul_ps(d, widen_i8(me + 24 + 16 * b));
                const int32_t* zb = zeros + (sb * 8 + b) * 2 * ROW_TILE;
                for (int r = 0; r < R; r++) {
                    const __m256i low = _mm256_sub_epi32(low_sum[r], _mm256_set1_epi32(zb[r]));
                    const __m256i high = _mm256_sub_epi32(high_sum[r], _mm256_set1_epi32(zb[ROW_TILE + r]));
                    const __m256 scale = _mm256_set1_ps(dxb[r]);
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(low), _mm256_mul_ps(dsc_low, scale), acc[r]);
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(high), _mm256_mul_ps(dsc_high, scale), acc[r]);
                }
            }
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

template <typename T>
inline void store_lanes(__m256 v, T* out, int64_t count) {
    alignas(32) float values[LANES];
    _mm256_store_ps(values, v);
    if constexpr (std::is_same_v<T, float>) {
        if (count == LANES) {
            _mm256_storeu_ps(out, v);
            return;
        }
    }
    for (int64_t l = 0; l < count; l++) out[l] = static_cast<T>(values[l]);
}

template <int KIND, typename T>
void multiply(const Activations& a, const uint8_t* codes, const uint8_t* meta, int64_t n_rows, T* out) {
    const int64_t tiles = (n_rows + LANES - 1) / LANES, supers = a.k / SUPER;
    const int64_t cb = supers * (KIND == Q4K ? 1024 : 1536), mb = supers * (KIND == Q4K ? 160 : 144);
    // a thread's share is at least ~128 tile super-blocks (~8 us a row): fewer are not worth a wake-up
    const int64_t grain = std::max<int64_t>(1, 128 / std::max<int64_t>(supers * std::min(a.rows, ROW_CHUNK), 1));
    for (int64_t chunk = 0; chunk < a.rows; chunk += ROW_CHUNK) {
        const int64_t chunk_end = std::min(a.rows, chunk + ROW_CHUNK);
        torch::stable::parallel_for(0, tiles, grain, [&](int64_t begin, int64_t end) {
            __m256 acc[ROW_TILE];
            for (int64_t tile = begin; tile < end; tile++) {
                const uint8_t* c = codes + tile * cb;
                const uint8_t* m = meta + tile * mb;
                const int64_t lanes = std::min(LANES, n_rows - tile * LANES);
                for (int64_t r0 = chunk; r0 < chunk_end; r0 += ROW_TILE) {
                    const int64_t count = std::min(ROW_TILE, chunk_end - r0);
                    const bool first = r0 == chunk;  // streams this tile's weights from memory
                    switch (count + (first ? 0 : 4)) {
                        case 1: tile_dot<KIND, 1, true>(c, m, supers, a, r0 / ROW_TILE, acc); break;
                        case 2: tile_dot<KIND, 2, true>(c, m, supers, a, r0 / ROW_TILE, acc); break;
                        case 3: tile_dot<KIND, 3, true>(c, m, supers, a, r0 / ROW_TILE, acc); break;
                        case 4: tile_dot<KIND, 4, true>(c, m, supers, a, r0 / ROW_TILE, acc); break;
                        case 5: tile_dot<KIND, 1, false>(c, m, supers, a, r0 / ROW_TILE, acc); break;
                        case 6: tile_dot<KIND, 2, false>(c, m, supers, a, r0 / ROW_TILE, acc); break;
                        case 7: tile_dot<KIND, 3, false>(c, m, supers, a, r0 / ROW_TILE, acc); break;
                        default: tile_dot<KIND, 4, false>(c, m, supers, a, r0 / ROW_TILE, acc); break;
                    }
                    for (int64_t r = 0; r < count; r++)
                        store_lanes(acc[r], out + (r0 + r) * n_rows + tile * LANES, lanes);
                }
            }
        });
    }
}
#endif

Tensor ktile_linear(const Tensor& x, const Tensor& codes, const Tensor& meta, int64_t kind, int64_t n_rows) {
    STD_TORCH_CHECK(kind == Q4K || kind == Q6K, "ktile linear: kind is 4 (Q4_K) or 6 (Q6_K)");
    STD_TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "ktile linear: x must be a contiguous [rows, in_features] matrix");
    STD_TORCH_CHECK(x.scalar_type() == ScalarType::Float || x.scalar_type() == ScalarType::BFloat16,
                    "ktile linear: x must be float32 or bfloat16");
    STD_TORCH_CHECK(x.size(1) % SUPER == 0, "ktile linear: in_features must be a multiple of 256");
    const int64_t supers = x.size(1) / SUPER, tiles = (n_rows + LANES - 1) / LANES;
    STD_TORCH_CHECK(codes.scalar_type() == ScalarType::Byte && codes.is_contiguous() && codes.dim() == 2 &&
                        codes.size(0) >= tiles && codes.size(1) == supers * code_bytes(kind),
                    "ktile linear: codes must be uint8 [tiles, the format's bytes a tile]");
    STD_TORCH_CHECK(meta.scalar_type() == ScalarType::Byte && meta.is_contiguous() && meta.dim() == 2 &&
                        meta.size(0) == codes.size(0) && meta.size(1) == supers * meta_bytes(kind),
                    "ktile linear: meta must be uint8 [tiles, the format's meta bytes a tile]");
    Tensor out = empty_rows(x, x.size(0), n_rows, dtype_of(x));
    if (x.size(0) == 0 || n_rows == 0) return out;
#if defined(KTILE_AVX2)
    Activations a(x.size(0), x.size(1));
    const uint8_t* c = static_cast<const uint8_t*>(codes.data_ptr());
    const uint8_t* m = static_cast<const uint8_t*>(meta.data_ptr());
    if (x.scalar_type() == ScalarType::BFloat16) {
        quantize_rows(static_cast<const c10::BFloat16*>(x.data_ptr()), a);
        auto* o = static_cast<c10::BFloat16*>(out.data_ptr());
        if (kind == Q4K) multiply<Q4K>(a, c, m, n_rows, o);
        else multiply<Q6K>(a, c, m, n_rows, o);
    } else {
        quantize_rows(static_cast<const float*>(x.data_ptr()), a);
        auto* o = static_cast<float*>(out.data_ptr());
        if (kind == Q4K) multiply<Q4K>(a, c, m, n_rows, o);
        else multiply<Q6K>(a, c, m, n_rows, o);
    }
#else
    STD_TORCH_CHECK(false, "ktile linear: built without AVX2");
#endif
    return out;
}

/* Sibling linears (q/k/v, gate/up) stacked into one tiled matrix meet here one after another with the
   same input: the first computes the whole product, the others cut their rows from it. As in
   block_dot.cpp's linear_part, the input is compared by its bytes and the matrix by its tensors (held,
   so their memory cannot be reused while remembered). */
struct Identity {
    const void* data = nullptr;
    std::vector<int64_t> sizes;
    ScalarType dtype = ScalarType::Float;

    explicit Identity(const Tensor& t) : data(t.data_ptr()), sizes(t.dim()), dtype(t.scalar_type()) {
        for (int64_t d = 0; d < t.dim(); d++) sizes[d] = t.size(d);
    }
    Identity() = default;
    bool operator==(const Identity& other) const {
        return data == other.data && sizes == other.sizes && dtype == other.dtype;
    }
};

struct LastProduct {
    std::vector<Tensor> matrix;  // codes, meta: held
    Identity codes, meta, input;
    int64_t n_rows = 0;
    std::vector<char> x;
    Tensor out;
};

thread_local LastProduct last;

Tensor ktile_linear_part(const Tensor& x, const Tensor& codes, const Tensor& meta, int64_t kind, int64_t n_rows,
                         int64_t start, int64_t end) {
    STD_TORCH_CHECK(0 <= start && start < end && end <= n_rows, "ktile linear part: rows ", start, "..", end,
                    " outside the matrix's ", n_rows);
    STD_TORCH_CHECK(x.is_contiguous(), "ktile linear part: x must be contiguous");
    const size_t bytes = static_cast<size_t>(x.numel()) * x.element_size();
    const char* data = static_cast<const char*>(x.data_ptr());
    const Identity input(x);
    const bool same = !last.matrix.empty() && last.codes == Identity(codes) && last.meta == Identity(meta) &&
                      last.n_rows == n_rows && last.input.sizes == input.sizes && last.input.dtype == input.dtype &&
                      last.x.size() == bytes && std::memcmp(last.x.data(), data, bytes) == 0;
    if (!same) {
        last.out = ktile_linear(x, codes, meta, kind, n_rows);
        last.matrix = {codes, meta};
        last.codes = Identity(codes);
        last.meta = Identity(meta);
        last.n_rows = n_rows;
        last.input = input;
        last.x.assign(data, data + bytes);
    }
    const int64_t rows = x.size(0), width = end - start;
    Tensor out = empty_rows(x, rows, width, dtype_of(x));
    const size_t item = out.element_size();
    const char* from = static_cast<const char*>(last.out.data_ptr());
    char* to = static_cast<char*>(out.data_ptr());
    for (int64_t r = 0; r < rows; r++)
        std::memcpy(to + r * width * item, from + (r * n_rows + start) * item, width * item);
    return out;
}

void ktile_pack(Tensor raw, Tensor codes, Tensor meta, int64_t kind) { pack(raw, codes, meta, kind); }

Tensor ktile_rows(const Tensor& codes, const Tensor& meta, const Tensor& ids, int64_t kind) {
    STD_TORCH_CHECK(kind == Q4K || kind == Q6K, "ktile rows: kind is 4 (Q4_K) or 6 (Q6_K)");
    return rows_of(codes, meta, ids, kind);
}

/* Which integer dot product this build uses: 2 vpdpbusd (AVX-512 VNNI or AVX-VNNI), 1 AVX2, 0 none
   (the product is unavailable; packing and rows still work). */
int64_t ktile_isa() {
#if defined(KTILE_VNNI)
    return 2;
#elif defined(KTILE_AVX2)
    return 1;
#else
    return 0;
#endif
}

}  // namespace

STABLE_TORCH_LIBRARY(decoda_ktile, m) {
    m.def("linear(Tensor x, Tensor codes, Tensor meta, int kind, int n) -> Tensor");
    m.def("linear_part(Tensor x, Tensor codes, Tensor meta, int kind, int n, int start, int end) -> Tensor");
    m.def("pack(Tensor raw, Tensor(a!) codes, Tensor(b!) meta, int kind) -> ()");
    m.def("rows(Tensor codes, Tensor meta, Tensor ids, int kind) -> Tensor");
    m.def("isa() -> int");
}

STABLE_TORCH_LIBRARY_IMPL(decoda_ktile, CPU, m) {
    m.impl("linear", TORCH_BOX(&ktile_linear));
    m.impl("linear_part", TORCH_BOX(&ktile_linear_part));
    m.impl("pack", TORCH_BOX(&ktile_pack));
    m.impl("rows", TORCH_BOX(&ktile_rows));
}

STABLE_TORCH_LIBRARY_IMPL(decoda_ktile, CompositeExplicitAutograd, m) {
    m.impl("isa", TORCH_BOX(&ktile_isa));
}
