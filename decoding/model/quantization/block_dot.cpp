/* Low-bit block weights times int8 activations with integer dot products: llama.cpp's Q4_1 x Q8_1.

   Why: at one token a step is a matrix-vector product per linear, bound by how fast the weights
   stream from memory. PyTorch's int4 kernel (_weight_int4pack_mm_for_cpu) widens every weight to
   bfloat16 and multiplies in floating point, reaching about half the memory bandwidth on small
   matrices. Here the activations are quantized once per call to int8 per 32-column block (scale
   max|x|/127, as llama.cpp's Q8_1), and each 4-bit weight block meets its activation block in
   one integer dot product: AVX-512 VNNI's vpdpbusd (64 unsigned x signed byte products an
   instruction) or AVX2's vpmaddubsw where VNNI is missing, and plain C elsewhere. The float work
   left is a scale per block: y[n] = sum_b d[n,b] * dx[b] * sum_i q[n,i] * qx[i] + m[n,b] * sx[b],
   with sx = dx[b] * sum_i qx[i], the block's rounded activations summed (Q8_1's s).

   It is a PyTorch operator (STABLE_TORCH_LIBRARY), not a ctypes function, so a compiled graph calls
   it through the dispatcher rather than through Python. It is written against PyTorch's stable C
   ABI (torch/csrc/stable), not ATen's C++ API, so it builds in ~5.5 s at a machine's first
   start instead of ~10 (ATen's headers and unboxing templates were most of that). Threads are
   PyTorch's own (its parallel_for over output rows). Each output depends only on its own
   activation row, so a row's result does not change with how many rows share the call.

   Weights, w = d * q + m per 32-column block, or w = d * (q - zero) for a symmetric type (GGUF's
   Q4_0, Q5_0, Q8_0, Q6_K: no minimums stored; the zero is subtracted inside the integer dot
   product, each lane starting at -zero times its activation codes' sum). Scales d (and minimums m)
   are [N, K/32] float16 or float32; Q6_K has a scale per 16 columns ([N, K/16]). Codes are
   [N, row_bytes_of(bits, K/32)] uint8 in one of three layouts:
   - 4 bits: ggml's Q4 order: byte i of a block holds column i in its low nibble and column i + 16
     in its high nibble;
   - 5 and 6 bits (Q5_0, Q5_1, Q5_K, Q6_K): those nibbles, then per group of 4 blocks one or two
     bit planes (a 64-bit mask for the low halves' bytes of the group's 64-byte nibble load and one
     for the high halves'), added into the widened nibbles with masked byte adds: 5.5 and 6.5 bits
     a weight with their scales, as in the file, instead of a byte each;
   - 8 bits (Q8_0): per group of 4 blocks, columns 0..15 of each block (16 bytes a block), then
     columns 16..31, so a group loads as the same two halves the 4-bit codes split into.
   Wider than 4 bits needs AVX-512 VNNI (AVX2's byte product saturates), as do symmetric types
   without minimums: on AVX2 the caller gives every type its minimums.

   At one activation row the product streams the weights once: the first activation tile
   prefetches the weight rows PREFETCH_ROWS ahead, which took Gemma 3's 262,144 x 640 Q8_0 head from
   ~13 ms to ~7.2 ms a token on a 2-core Sapphire Rapids (25 GB/s, the machine's streaming rate). */
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__)
#define BLOCK_AVX512_VNNI 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define BLOCK_AVX2 1
#endif

namespace {

using torch::stable::Tensor;
using torch::headeronly::ScalarType;

/* A new contiguous CPU tensor of x's dtype. One C call into torch (empty_strided): the stable ABI's
   new_empty goes through the dispatcher twice (new_empty, then empty), ~1 us a call more, and a
   one-row step makes ~150 of these calls. */
Tensor empty_rows(const Tensor& x, int64_t rows, int64_t cols) {
    int32_t dtype = 0;
    STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_dtype(x.get(), &dtype));
    const int64_t sizes[2] = {rows, cols}, strides[2] = {cols, 1};
    AtenTensorHandle handle = nullptr;
    STABLE_TORCH_ERROR_CODE_CHECK(
        aoti_torch_empty_strided(2, sizes, strides, dtype, aoti_torch_device_type_cpu(), 0, &handle));
    return Tensor(handle);
}

constexpr int64_t BLOCK = 32;  // columns sharing one scale, in the weights and the activations
constexpr int64_t GROUP = 4;   // blocks a 64-byte load of packed codes covers
constexpr int64_t ROW_TILE = 4;     // activation rows sharing one load of a weight group
constexpr int64_t WEIGHT_TILE = 8;  // weight rows kept in L1 while every activation tile passes
constexpr int64_t PREFETCH_ROWS = 8;  // how far ahead (in weight rows) the weights are prefetched

/* One call's activations, quantized. Codes per (row, group of 4 blocks): 128 bytes, the low half
   holding columns 0..15 of each block (16 j + i for block j) and the high half columns 16..31, so
   they line up with a 64-byte load of packed codes split into low and high nibbles. Lane L of a
   group (a 32-bit lane of the dot product) covers codes 4L..4L+3 of each half: block L / 4. */
struct Quantized {
    int64_t rows = 0, blocks = 0, groups = 0;
    std::vector<int8_t> codes;       // [rows, groups, 128]
    std::vector<float> lane_scale;   // [rows, groups, 16]: dx of block j in lanes 4j..4j+3
    std::vector<float> lane_sum;     // [rows, groups, 16]: block j's rounded sum / 4 in lanes 4j..4j+3
    std::vector<int32_t> lane_low;   // [rows, groups, 16]: each lane's 4 low-half codes summed
    std::vector<int32_t> lane_high;  // [rows, groups, 16]: each lane's 4 high-half codes summed
};

/* One 32-value block to int8 codes (columns 0..15 into low, 16..31 into high), its scale, the
   sum of its ROUNDED values (scale * sum of codes), as Q8_1 keeps, and each lane's code sums: the
   minimum term (m * sum, or -zero * sum of codes for a symmetric type) then sees the same
   activations as the code term, so their rounding errors cancel as they do in the product with
   the whole weight d * q + m. (With the exact sum the code term's error, d * q * e, no longer
   cancels: on SmolLM2 the mean KL to the float model was 0.015 instead of 0.003.)
   Rounding is to nearest even (the vector conversions' default, as nearbyint). */
#if defined(BLOCK_AVX512_VNNI)
inline void quantize_block(const float* v, int8_t* low, int8_t* high, float& scale, float& sum, int32_t* low_lanes,
                           int32_t* high_lanes) {
    const __m512 a = _mm512_loadu_ps(v), b = _mm512_loadu_ps(v + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    scale = amax / 127.0f;
    const __m512 inverse = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, inverse));
    const __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, inverse));
    const __m128i la = _mm512_cvtsepi32_epi8(qa), lb = _mm512_cvtsepi32_epi8(qb);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(low), la);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(high), lb);
    const __m128i ones = _mm_set1_epi8(1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(low_lanes), _mm_dpbusd_epi32(_mm_setzero_si128(), ones, la));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(high_lanes), _mm_dpbusd_epi32(_mm_setzero_si128(), ones, lb));
    sum = scale * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb)));
}
#else
/* Without VNNI every type takes its minimums (block_linear refuses a zero code there): the lanes'
   code sums are not read, and stay zero. */
#if defined(BLOCK_AVX2)
inline void quantize_block(const float* v, int8_t* low, int8_t* high, float& scale, float& sum, int32_t* low_lanes,
                           int32_t* high_lanes) {
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
    alignas(32) int32_t codes[32];
    for (int i = 0; i < 4; i++)
        _mm256_store_si256(reinterpret_cast<__m256i*>(codes + 8 * i),
                           _mm256_cvtps_epi32(_mm256_mul_ps(parts[i], inverse)));
    int32_t total = 0;
    for (int i = 0; i < 16; i++) {
        low[i] = static_cast<int8_t>(codes[i]);
        high[i] = static_cast<int8_t>(codes[16 + i]);
        total += codes[i] + codes[16 + i];
    }
    sum = scale * static_cast<float>(total);
}
#else
inline void quantize_block(const float* v, int8_t* low, int8_t* high, float& scale, float& sum, int32_t* low_lanes,
                           int32_t* high_lanes) {
    float amax = 0.0f;
    for (int64_t i = 0; i < BLOCK; i++) amax = std::max(amax, std::fabs(v[i]));
    scale = amax / 127.0f;
    const float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
    int32_t total = 0;
    for (int64_t i = 0; i < 16; i++) {
        low[i] = static_cast<int8_t>(std::nearbyint(v[i] * inverse));
        high[i] = static_cast<int8_t>(std::nearbyint(v[16 + i] * inverse));
        total += low[i] + high[i];
    }
    sum = scale * static_cast<float>(total);
}
#endif
#endif

template <typename T>
void quantize_row(const T* x, int64_t blocks, int64_t groups, int8_t* codes, float* lane_scale, float* lane_sum,
                  int32_t* lane_low, int32_t* lane_high) {
    std::memset(codes, 0, groups * 128);
    std::fill(lane_scale, lane_scale + groups * 16, 0.0f);
    std::fill(lane_sum, lane_sum + groups * 16, 0.0f);
    std::fill(lane_low, lane_low + groups * 16, 0);
    std::fill(lane_high, lane_high + groups * 16, 0);
    float widened[BLOCK];
    for (int64_t b = 0; b < blocks; b++) {
        const float* values;
        if constexpr (std::is_same_v<T, float>) {
            values = x + b * BLOCK;
        } else {
            for (int64_t i = 0; i < BLOCK; i++) widened[i] = static_cast<float>(x[b * BLOCK + i]);
            values = widened;
        }
        const int64_t g = b / GROUP, j = b % GROUP;
        float scale, sum;
        quantize_block(values, codes + g * 128 + 16 * j, codes + g * 128 + 64 + 16 * j, scale, sum,
                       lane_low + g * 16 + 4 * j, lane_high + g * 16 + 4 * j);
        for (int64_t lane = 0; lane < 4; lane++) {
            lane_scale[g * 16 + 4 * j + lane] = scale;
            lane_sum[g * 16 + 4 * j + lane] = sum * 0.25f;  // exact: a power of two
        }
    }
}

Quantized quantize(const Tensor& x) {
    Quantized q;
    q.rows = x.size(0);
    q.blocks = x.size(1) / BLOCK;
    q.groups = (q.blocks + GROUP - 1) / GROUP;
    q.codes.resize(q.rows * q.groups * 128);
    q.lane_scale.resize(q.rows * q.groups * 16);
    q.lane_sum.resize(q.rows * q.groups * 16);
    q.lane_low.resize(q.rows * q.groups * 16);
    q.lane_high.resize(q.rows * q.groups * 16);
    const int64_t k = x.size(1);
    torch::stable::parallel_for(0, q.rows, 4, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; r++) {
            const int64_t at = r * q.groups;
            int8_t* codes = q.codes.data() + at * 128;
            float* lanes = q.lane_scale.data() + at * 16;
            float* quarters = q.lane_sum.data() + at * 16;
            int32_t* low = q.lane_low.data() + at * 16;
            int32_t* high = q.lane_high.data() + at * 16;
            if (x.scalar_type() == ScalarType::BFloat16)
                quantize_row(static_cast<const c10::BFloat16*>(x.data_ptr()) + r * k, q.blocks, q.groups, codes,
                             lanes, quarters, low, high);
            else
                quantize_row(static_cast<const float*>(x.data_ptr()) + r * k, q.blocks, q.groups, codes, lanes,
                             quarters, low, high);
        }
    });
    return q;
}

/* A symmetric product starts each lane's dot product at -zero times its activation codes' sum: set
   once a call here (lane_low, and lane_high for a scale per 16 columns; without one lane_low holds
   both halves' start), so the tiles only load it. */
void start_at_zero(Quantized& q, int64_t zero, bool half) {
    const int32_t minus = static_cast<int32_t>(-zero);
    for (size_t i = 0; i < q.lane_low.size(); i++) {
        if (half) {
            q.lane_low[i] *= minus;
            q.lane_high[i] *= minus;
        } else {
            q.lane_low[i] = minus * (q.lane_low[i] + q.lane_high[i]);
        }
    }
}

/* Bytes of one weight row: 4-bit codes are nibbles (16 bytes a block); 5- and 6-bit codes are those
   nibbles, then per group of 4 blocks one or two planes of their fifth and sixth bits (16 bytes a
   plane: 64 bits for the low halves' bytes of the group's 64-byte nibble load, 64 for the high
   halves'); 8-bit codes a byte each (32 a block). */
int64_t row_bytes_of(int64_t bits, int64_t blocks) {
    const int64_t groups = (blocks + GROUP - 1) / GROUP;
    if (bits == 8) return blocks * 32;
    return blocks * 16 + groups * (bits - 4) * 16;
}

#if defined(BLOCK_AVX512_VNNI)
template <typename S>
inline __m128 load4(const S* p, int64_t count) {
    if constexpr (std::is_same_v<S, float>) {
        return _mm_maskz_loadu_ps(static_cast<__mmask8>((1u << count) - 1), p);
    } else {
        return _mm_cvtph_ps(_mm_maskz_loadu_epi16(static_cast<__mmask8>((1u << count) - 1), p));
    }
}

template <typename S>
inline __m256 load8(const S* p, int64_t count) {
    const __mmask8 k = static_cast<__mmask8>((1u << count) - 1);
    if constexpr (std::is_same_v<S, float>) {
        return _mm256_maskz_loadu_ps(k, p);
    } else {
        return _mm256_cvtph_ps(_mm_maskz_loadu_epi16(k, p));
    }
}

/* Four 16-lane sums at once: [sum a, sum b, sum c, sum d]. */
inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
    auto halves = [](__m512 v) { return _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)); };
    const __m256 ab = _mm256_hadd_ps(halves(a), halves(b));
    const __m256 cd = _mm256_hadd_ps(halves(c), halves(d));
    const __m256 all = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(all), _mm256_extractf128_ps(all, 1));
}

/* W weight rows (from codes/scales/mins, row_bytes and a row's scales apart) against R activation
   rows (r0..): out[w * 4 + r]. A weight group is loaded and widened once for the R rows, an
   activation group once for the W rows. The minimum term rides in the same lanes as the dot
   product: an asymmetric type adds m * sum / 4 in each of a block's 4 lanes; a symmetric one
   (w = d * (q - zero), no minimums stored) starts each lane's integer dot product at -zero times
   its activation codes' sum, so the block's integer result is already sum (q - zero) * x. HALF:
   a scale per 16 columns (Q6_K), the low and high halves' dot products kept apart. */
template <int BITS, bool HALF, bool SYM, typename S, int W, int R>
inline void tile_dot(const uint8_t* codes, const S* scales, const S* mins, int64_t row_bytes, int64_t blocks,
                     int32_t zero, const Quantized& q, int64_t r0, float* out) {
    static_assert(!HALF || SYM, "a scale per 16 columns comes with symmetric codes (Q6_K)");
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    const __m512i spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m512i spread_low = _mm512_set_epi32(6, 6, 6, 6, 4, 4, 4, 4, 2, 2, 2, 2, 0, 0, 0, 0);
    const __m512i spread_high = _mm512_set_epi32(7, 7, 7, 7, 5, 5, 5, 5, 3, 3, 3, 3, 1, 1, 1, 1);
    const int64_t scale_row = HALF ? 2 * blocks : blocks;
    const int64_t nibble_bytes = blocks * 16;
    __m512 acc[W][R];
    for (int w = 0; w < W; w++)
        for (int r = 0; r < R; r++) acc[w][r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < q.groups; g++) {
        const int64_t count = std::min<int64_t>(GROUP, q.blocks - g * GROUP);
        const __mmask64 mask = count == GROUP ? ~0ULL : (1ULL << (16 * count)) - 1;
        __m512i low[W], high[W];
        __m512 d[W], dh[W], m[W];
        for (int w = 0; w < W; w++) {
            const uint8_t* row = codes + w * row_bytes;
            if (r0 == 0) {  // the first activation tile streams the weights: ask for the next rows ahead
                const char* ahead = reinterpret_cast<const char*>(row + PREFETCH_ROWS * row_bytes + g * BITS * 16);
                _mm_prefetch(ahead, _MM_HINT_T0);
                if constexpr (BITS == 8) _mm_prefetch(ahead + 64, _MM_HINT_T0);
            }
            if constexpr (BITS == 8) {  // a group's low halves, then its high halves (16 bytes a block each)
                const uint8_t* at = row + g * 128;
                low[w] = _mm512_maskz_loadu_epi8(mask, at);
                high[w] = _mm512_maskz_loadu_epi8(mask, at + 16 * count);
            } else {
                const __m512i packed = _mm512_maskz_loadu_epi8(mask, row + g * 64);
                low[w] = _mm512_and_si512(packed, nibble);
                high[w] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), nibble);
                if constexpr (BITS > 4) {  // the planes' bits added where set (the nibbles leave them clear)
                    const uint8_t* planes = row + nibble_bytes + g * (BITS - 4) * 16;
                    for (int p = 0; p < BITS - 4; p++) {
                        uint64_t bits[2];
                        std::memcpy(bits, planes + 16 * p, 16);
                        const __m512i bit = _mm512_set1_epi8(static_cast<char>(16 << p));
                        low[w] = _mm512_mask_add_epi8(low[w], _cvtu64_mask64(bits[0]), low[w], bit);
                        high[w] = _mm512_mask_add_epi8(high[w], _cvtu64_mask64(bits[1]), high[w], bit);
                    }
                }
            }
            if constexpr (HALF) {
                const __m512 pairs = _mm512_castps256_ps512(load8(scales + w * scale_row + g * 2 * GROUP, 2 * count));
                d[w] = _mm512_permutexvar_ps(spread_low, pairs);
                dh[w] = _mm512_permutexvar_ps(spread_high, pairs);
            } else {
                d[w] = _mm512_permutexvar_ps(spread,
                                             _mm512_castps128_ps512(load4(scales + w * scale_row + g * GROUP, count)));
            }
            if constexpr (!SYM)
                m[w] = _mm512_permutexvar_ps(spread,
                                             _mm512_castps128_ps512(load4(mins + w * blocks + g * GROUP, count)));
        }
        for (int r = 0; r < R; r++) {
            const int64_t at = (r0 + r) * q.groups + g;
            const int8_t* x = q.codes.data() + at * 128;
            const __m512i xl = _mm512_loadu_si512(x), xh = _mm512_loadu_si512(x + 64);
            const __m512 dx = _mm512_loadu_ps(q.lane_scale.data() + at * 16);
            if constexpr (HALF) {
                const __m512i start_low = _mm512_loadu_si512(q.lane_low.data() + at * 16);  // -zero * sums
                const __m512i start_high = _mm512_loadu_si512(q.lane_high.data() + at * 16);
                for (int w = 0; w < W; w++) {
                    const __m512i dot_low = _mm512_dpbusd_epi32(start_low, low[w], xl);
                    const __m512i dot_high = _mm512_dpbusd_epi32(start_high, high[w], xh);
                    acc[w][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot_low), _mm512_mul_ps(d[w], dx), acc[w][r]);
                    acc[w][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot_high), _mm512_mul_ps(dh[w], dx), acc[w][r]);
                }
            } else if constexpr (SYM) {
                const __m512i start = _mm512_loadu_si512(q.lane_low.data() + at * 16);  // -zero * both halves' sums
                for (int w = 0; w < W; w++) {
                    __m512i dot = _mm512_dpbusd_epi32(start, low[w], xl);
                    dot = _mm512_dpbusd_epi32(dot, high[w], xh);
                    acc[w][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d[w], dx), acc[w][r]);
                }
            } else {
                const __m512 quarter_sum = _mm512_loadu_ps(q.lane_sum.data() + at * 16);
                for (int w = 0; w < W; w++) {
                    __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), low[w], xl);
                    dot = _mm512_dpbusd_epi32(dot, high[w], xh);
                    acc[w][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d[w], dx), acc[w][r]);
                    acc[w][r] = _mm512_fmadd_ps(m[w], quarter_sum, acc[w][r]);
                }
            }
        }
    }
    const __m512 zero_lanes = _mm512_setzero_ps();
    for (int r = 0; r < R; r++) {
        float sums[4];
        _mm_storeu_ps(sums, reduce4(acc[0][r], W > 1 ? acc[W > 1 ? 1 : 0][r] : zero_lanes,
                                    W > 2 ? acc[W > 2 ? 2 : 0][r] : zero_lanes,
                                    W > 3 ? acc[W > 3 ? 3 : 0][r] : zero_lanes));
        for (int w = 0; w < W; w++) out[w * 4 + r] = sums[w];
    }
}
#elif defined(BLOCK_AVX2)
template <typename S>
inline __m128 load4(const S* p, int64_t count) {
    if (count == 4) {
        if constexpr (std::is_same_v<S, float>) return _mm_loadu_ps(p);
        else return _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    }
    if constexpr (std::is_same_v<S, float>) {
        float f[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        std::memcpy(f, p, count * sizeof(float));
        return _mm_loadu_ps(f);
    } else {
        uint16_t h[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        std::memcpy(h, p, count * sizeof(uint16_t));
        return _mm_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
    }
}

template <typename S, int R>
inline void rows_dot(const uint8_t* codes, const S* scales, const S* mins, const Quantized& q, int64_t r0,
                     float* out) {
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i spread[2] = {_mm256_set_epi32(1, 1, 1, 1, 0, 0, 0, 0), _mm256_set_epi32(3, 3, 3, 3, 2, 2, 2, 2)};
    __m256 acc[R];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < q.groups; g++) {
        const int64_t count = std::min<int64_t>(GROUP, q.blocks - g * GROUP);
        const __m256 d4 = _mm256_castps128_ps256(load4(scales + g * GROUP, count));
        const __m256 m4 = _mm256_castps128_ps256(load4(mins + g * GROUP, count));
        for (int half = 0; half < 2 && 2 * half < count; half++) {
            const uint8_t* p = codes + g * 64 + 32 * half;
            const __m256i packed = 2 * half + 1 < count
                ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                : _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
            const __m256i low = _mm256_and_si256(packed, nibble);
            const __m256i high = _mm256_and_si256(_mm256_srli_epi16(packed, 4), nibble);
            const __m256 d = _mm256_permutevar8x32_ps(d4, spread[half]);
            const __m256 m = _mm256_permutevar8x32_ps(m4, spread[half]);
            for (int r = 0; r < R; r++) {
                const int64_t row = r0 + r;
                const int8_t* x = q.codes.data() + (row * q.groups + g) * 128 + 32 * half;
                const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
                const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 64));
                // |q x| <= 15 * 127: a pair sums to at most 3810 and two pairs to 7620, inside int16
                const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(low, xl), _mm256_maddubs_epi16(high, xh));
                const __m256i dot = _mm256_madd_epi16(pairs, ones);
                const int64_t lanes = (row * q.groups + g) * 16 + 8 * half;
                const __m256 dx = _mm256_loadu_ps(q.lane_scale.data() + lanes);
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d, dx), acc[r]);
                acc[r] = _mm256_fmadd_ps(m, _mm256_loadu_ps(q.lane_sum.data() + lanes), acc[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) {
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc[r]), _mm256_extractf128_ps(acc[r], 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        s = _mm_add_ss(s, _mm_movehdup_ps(s));
        out[r] = _mm_cvtss_f32(s);
    }
}
#else
template <typename S, int R>
inline void rows_dot(const uint8_t* codes, const S* scales, const S* mins, const Quantized& q, int64_t r0,
                     float* out) {
    for (int r = 0; r < R; r++) {
        const int64_t row = r0 + r;
        float total = 0.0f;
        for (int64_t b = 0; b < q.blocks; b++) {
            const int64_t g = b / GROUP, j = b % GROUP;
            const int8_t* x = q.codes.data() + (row * q.groups + g) * 128 + 16 * j;
            int32_t dot = 0;
            for (int64_t i = 0; i < 16; i++) {
                const uint8_t byte = codes[b * 16 + i];
                dot += static_cast<int32_t>(byte & 0x0F) * x[i] + static_cast<int32_t>(byte >> 4) * x[64 + i];
            }
            const float dx = q.lane_scale[(row * q.groups + g) * 16 + 4 * j];
            const float sum = 4.0f * q.lane_sum[(row * q.groups + g) * 16 + 4 * j];  // exact
            total += static_cast<float>(scales[b]) * dx * static_cast<float>(dot) + static_cast<float>(mins[b]) * sum;
        }
        out[r] = total;
    }
}

#endif

#if !defined(BLOCK_AVX512_VNNI)
/* The same tile contract as the AVX-512 path, one weight row at a time (4-bit codes with minimums
   only: AVX2's byte product saturates past 4-bit x 8-bit, so wider codes are refused without VNNI,
   and the caller gives a symmetric type its minimums). */
template <int BITS, bool HALF, bool SYM, typename S, int W, int R>
inline void tile_dot(const uint8_t* codes, const S* scales, const S* mins, int64_t row_bytes, int64_t blocks,
                     int32_t zero, const Quantized& q, int64_t r0, float* out) {
    static_assert(BITS == 4 && !HALF && !SYM, "without AVX-512 VNNI only 4-bit codes with minimums");
    float dots[R];
    for (int w = 0; w < W; w++) {
        rows_dot<S, R>(codes + w * row_bytes, scales + w * blocks, mins + w * blocks, q, r0, dots);
        for (int r = 0; r < R; r++) out[w * 4 + r] = dots[r];
    }
}
#endif

template <int BITS, bool HALF, bool SYM, typename S, int W>
inline void tile_rows(const uint8_t* c, const S* s, const S* m, int64_t row_bytes, int64_t blocks, int32_t zero,
                      const Quantized& q, int64_t r0, int64_t count, float* dots) {
    switch (count) {
        case 1: tile_dot<BITS, HALF, SYM, S, W, 1>(c, s, m, row_bytes, blocks, zero, q, r0, dots); break;
        case 2: tile_dot<BITS, HALF, SYM, S, W, 2>(c, s, m, row_bytes, blocks, zero, q, r0, dots); break;
        case 3: tile_dot<BITS, HALF, SYM, S, W, 3>(c, s, m, row_bytes, blocks, zero, q, r0, dots); break;
        default: tile_dot<BITS, HALF, SYM, S, W, 4>(c, s, m, row_bytes, blocks, zero, q, r0, dots); break;
    }
}

template <int BITS, bool HALF, bool SYM, typename S, typename T>
void multiply(const Quantized& q, const uint8_t* codes, const S* scales, const S* mins, int32_t zero, int64_t n_rows,
              T* out) {
    const int64_t row_bytes = row_bytes_of(BITS, q.blocks);
    const int64_t scale_row = HALF ? 2 * q.blocks : q.blocks;
    // a thread's share is at least ~2048 block products (~10 us): fewer rows are not worth a wake-up
    const int64_t grain = std::max<int64_t>(WEIGHT_TILE, 2048 / std::max<int64_t>(q.blocks * q.rows, 1));
    torch::stable::parallel_for(0, n_rows, grain, [&](int64_t begin, int64_t end) {
        float dots[16];  // [4 weight rows][4 activation rows] at most
        for (int64_t tile = begin; tile < end; tile += WEIGHT_TILE) {
            const int64_t tile_end = std::min(end, tile + WEIGHT_TILE);
            for (int64_t r0 = 0; r0 < q.rows; r0 += ROW_TILE) {
                const int64_t count = std::min(ROW_TILE, q.rows - r0);
                for (int64_t n = tile; n < tile_end; n += 4) {
                    const int64_t weights = std::min<int64_t>(4, tile_end - n);
                    const uint8_t* c = codes + n * row_bytes;
                    const S* s = scales + n * scale_row;
                    const S* m = SYM ? nullptr : mins + n * q.blocks;
                    switch (weights) {
                        case 1: tile_rows<BITS, HALF, SYM, S, 1>(c, s, m, row_bytes, q.blocks, zero, q, r0, count, dots); break;
                        case 2: tile_rows<BITS, HALF, SYM, S, 2>(c, s, m, row_bytes, q.blocks, zero, q, r0, count, dots); break;
                        case 3: tile_rows<BITS, HALF, SYM, S, 3>(c, s, m, row_bytes, q.blocks, zero, q, r0, count, dots); break;
                        default: tile_rows<BITS, HALF, SYM, S, 4>(c, s, m, row_bytes, q.blocks, zero, q, r0, count, dots); break;
                    }
                    for (int64_t w = 0; w < weights; w++)
                        for (int64_t r = 0; r < count; r++)
                            out[(r0 + r) * n_rows + n + w] = static_cast<T>(dots[w * 4 + r]);
                }
            }
        }
    });
}

template <int BITS, bool HALF, bool SYM, typename T>
void dispatch_scales(const Quantized& q, const Tensor& codes, const Tensor& scales, const Tensor& mins, int32_t zero,
                     T* out) {
    const uint8_t* c = static_cast<const uint8_t*>(codes.data_ptr());
    if (scales.scalar_type() == ScalarType::Half)
        multiply<BITS, HALF, SYM>(q, c, static_cast<const c10::Half*>(scales.data_ptr()),
                                  SYM ? nullptr : static_cast<const c10::Half*>(mins.data_ptr()), zero, codes.size(0),
                                  out);
    else
        multiply<BITS, HALF, SYM>(q, c, static_cast<const float*>(scales.data_ptr()),
                                  SYM ? nullptr : static_cast<const float*>(mins.data_ptr()), zero, codes.size(0),
                                  out);
}

/* The formats built: every width with minimums or symmetric, and a scale per 16 columns only as
   Q6_K has it (6-bit, symmetric). */
template <typename T>
void dispatch_format(const Quantized& q, const Tensor& codes, const Tensor& scales, const Tensor& mins, int64_t bits,
                     int64_t zero, int64_t scale_columns, T* out) {
#if defined(BLOCK_AVX512_VNNI)
    const int32_t z = static_cast<int32_t>(zero);
    const bool sym = zero >= 0;
    if (scale_columns == 16) return dispatch_scales<6, true, true>(q, codes, scales, mins, z, out);
    switch (bits) {
        case 4: return sym ? dispatch_scales<4, false, true>(q, codes, scales, mins, z, out)
                           : dispatch_scales<4, false, false>(q, codes, scales, mins, z, out);
        case 5: return sym ? dispatch_scales<5, false, true>(q, codes, scales, mins, z, out)
                           : dispatch_scales<5, false, false>(q, codes, scales, mins, z, out);
        case 6: return sym ? dispatch_scales<6, false, true>(q, codes, scales, mins, z, out)
                           : dispatch_scales<6, false, false>(q, codes, scales, mins, z, out);
        default: return sym ? dispatch_scales<8, false, true>(q, codes, scales, mins, z, out)
                            : dispatch_scales<8, false, false>(q, codes, scales, mins, z, out);
    }
#else
    dispatch_scales<4, false, false>(q, codes, scales, mins, 0, out);
#endif
}

Tensor block_linear(const Tensor& x, const Tensor& codes, const Tensor& scales, const Tensor& mins, int64_t bits,
                    int64_t zero, int64_t scale_columns) {
    STD_TORCH_CHECK(x.dim() == 2 && x.is_contiguous(),
                    "block linear: x must be a contiguous [rows, in_features] matrix");
    STD_TORCH_CHECK(x.scalar_type() == ScalarType::Float || x.scalar_type() == ScalarType::BFloat16,
                    "block linear: x must be float32 or bfloat16");
    STD_TORCH_CHECK(x.size(1) % BLOCK == 0, "block linear: in_features must be a multiple of 32");
    STD_TORCH_CHECK(bits == 4 || bits == 5 || bits == 6 || bits == 8, "block linear: codes are 4, 5, 6 or 8 bits");
    STD_TORCH_CHECK(scale_columns == 32 || (scale_columns == 16 && bits == 6 && zero >= 0),
                    "block linear: a scale per 32 columns, or per 16 for symmetric 6-bit codes");
    STD_TORCH_CHECK(zero < (1 << bits), "block linear: the zero code must be a code");
#if !defined(BLOCK_AVX512_VNNI)
    STD_TORCH_CHECK(bits == 4 && zero < 0, "block linear: without AVX-512 VNNI only 4-bit codes with minimums");
#endif
    const int64_t n_rows = codes.size(0), blocks = x.size(1) / BLOCK;
    const int64_t scale_row = scale_columns == 16 ? 2 * blocks : blocks;
    STD_TORCH_CHECK(codes.scalar_type() == ScalarType::Byte && codes.is_contiguous() && codes.dim() == 2 &&
                    codes.size(1) == row_bytes_of(bits, blocks),
                    "block linear: codes must be contiguous uint8 [out_features, the format's bytes a row]");
    STD_TORCH_CHECK(scales.scalar_type() == ScalarType::Half || scales.scalar_type() == ScalarType::Float,
                    "block linear: scales must be float16 or float32");
    STD_TORCH_CHECK(scales.is_contiguous() && scales.dim() == 2 && scales.size(0) == n_rows &&
                    scales.size(1) == scale_row,
                    "block linear: scales must be contiguous [out_features, in_features / scale_columns]");
    if (zero < 0)
        STD_TORCH_CHECK(mins.scalar_type() == scales.scalar_type() && mins.is_contiguous() && mins.dim() == 2 &&
                        mins.size(0) == n_rows && mins.size(1) == blocks,
                        "block linear: mins must be contiguous [out_features, in_features / 32] of the scales' dtype");
    Tensor out = empty_rows(x, x.size(0), n_rows);
    if (x.size(0) == 0 || n_rows == 0) return out;
    Quantized q = quantize(x);
    if (zero >= 0) start_at_zero(q, zero, scale_columns == 16);
    if (x.scalar_type() == ScalarType::BFloat16)
        dispatch_format(q, codes, scales, mins, bits, zero, scale_columns, static_cast<c10::BFloat16*>(out.data_ptr()));
    else
        dispatch_format(q, codes, scales, mins, bits, zero, scale_columns, static_cast<float*>(out.data_ptr()));
    return out;
}

/* What identifies a tensor's contents while it is held: where its data starts, its shape and its
   dtype. A stable tensor handle is a new object each call, so identity is not comparable; holding
   the tensor keeps its memory from being reused, so another tensor starting at the same address with
   the same shape and dtype is a view of the same data. */
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

/* The last fused product of this thread: sibling linears (q/k/v, gate/up) whose weights are one
   matrix, read once for all of them, meet here one after another with the same input. Holding the
   matrix's tensors keeps their memory from being reused by another matrix while remembered. */
struct LastProduct {
    std::vector<Tensor> matrix;  // codes, scales, mins: held (empty until the first product)
    Identity codes, scales, mins, input;
    std::vector<char> x;  // the input's bytes
    Tensor out;
};

thread_local LastProduct last;

/* Rows start..end-1 of the product x @ W.T with W the (fused) matrix: the whole product is computed
   when the input differs from the last call's (bytes compared) or the matrix does, else the last
   one is cut; the output is a fresh tensor either way. */
Tensor block_linear_part(const Tensor& x, const Tensor& codes, const Tensor& scales, const Tensor& mins, int64_t bits,
                         int64_t zero, int64_t scale_columns, int64_t start, int64_t end) {
    STD_TORCH_CHECK(0 <= start && start < end && end <= codes.size(0), "block linear part: rows ", start, "..", end,
                    " outside the matrix's ", codes.size(0));
    STD_TORCH_CHECK(x.is_contiguous(), "block linear part: x must be contiguous");
    const size_t bytes = static_cast<size_t>(x.numel()) * x.element_size();
    const char* data = static_cast<const char*>(x.data_ptr());
    const Identity input(x);
    const bool same = !last.matrix.empty() && last.codes == Identity(codes) && last.scales == Identity(scales) &&
                      last.mins == Identity(mins) && last.input.sizes == input.sizes &&
                      last.input.dtype == input.dtype && last.x.size() == bytes &&
                      std::memcmp(last.x.data(), data, bytes) == 0;
    if (!same) {
        last.out = block_linear(x, codes, scales, mins, bits, zero, scale_columns);
        last.matrix = {codes, scales, mins};
        last.codes = Identity(codes);
        last.scales = Identity(scales);
        last.mins = Identity(mins);
        last.input = input;
        last.x.assign(data, data + bytes);
    }
    const int64_t rows = x.size(0), width = end - start, total = codes.size(0);
    Tensor out = empty_rows(x, rows, width);
    const size_t item = out.element_size();
    const char* from = static_cast<const char*>(last.out.data_ptr());
    char* to = static_cast<char*>(out.data_ptr());
    for (int64_t r = 0; r < rows; r++)
        std::memcpy(to + r * width * item, from + (r * total + start) * item, width * item);
    return out;
}

/* Which integer dot product this build uses: 2 AVX-512 VNNI, 1 AVX2, 0 plain C. */
int64_t block_isa() {
#if defined(BLOCK_AVX512_VNNI)
    return 2;
#elif defined(BLOCK_AVX2)
    return 1;
#else
    return 0;
#endif
}

}  // namespace

STABLE_TORCH_LIBRARY(decoda_blocks, m) {
    m.def("linear(Tensor x, Tensor codes, Tensor scales, Tensor mins, int bits, int zero, int scale_columns) -> Tensor");
    m.def("linear_part(Tensor x, Tensor codes, Tensor scales, Tensor mins, int bits, int zero, int scale_columns, "
          "int start, int end) -> Tensor");
    m.def("isa() -> int");
}

STABLE_TORCH_LIBRARY_IMPL(decoda_blocks, CPU, m) {
    m.impl("linear", TORCH_BOX(&block_linear));
    m.impl("linear_part", TORCH_BOX(&block_linear_part));
}

/* isa takes no tensor: one kernel for any backend. */
STABLE_TORCH_LIBRARY_IMPL(decoda_blocks, CompositeExplicitAutograd, m) {
    m.impl("isa", TORCH_BOX(&block_isa));
}
