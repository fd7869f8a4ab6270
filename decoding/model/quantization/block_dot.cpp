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

   Weights, w = d * q + m per 32-column block (scales d and minimums m [N, K/32] in float16 or
   float32), as codes [N, K * bits / 8] uint8 in one of two layouts:
   - 4 bits: ggml's Q4 order: byte i of a block holds column i in its low nibble and column i + 16
     in its high nibble;
   - 8 bits (codes up to 255: GGUF's Q5 and Q8 types; AVX-512 VNNI only, since AVX2's byte
     product saturates): per group of 4 blocks, columns 0..15 of each block (16 bytes a block), then
     columns 16..31, so a group loads as the same two halves the 4-bit codes split into. */
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

/* One call's activations, quantized. Codes per (row, group of 4 blocks): 128 bytes, the low half
   holding columns 0..15 of each block (16 j + i for block j) and the high half columns 16..31, so
   they line up with a 64-byte load of packed codes split into low and high nibbles. */
struct Quantized {
    int64_t rows = 0, blocks = 0, groups = 0;
    std::vector<int8_t> codes;       // [rows, groups, 128]
    std::vector<float> lane_scale;   // [rows, groups, 16]: dx of block j in lanes 4j..4j+3
    std::vector<float> lane_sum;     // [rows, groups, 16]: block j's rounded sum / 4 in lanes 4j..4j+3
};

/* One 32-value block to int8 codes (columns 0..15 into low, 16..31 into high), its scale and the
   sum of its ROUNDED values (scale * sum of codes), as Q8_1 keeps: the minimum term m * sum then
   sees the same activations as the code term, so their rounding errors cancel as they do in the
   product with the whole weight d * q + m. (With the exact sum the code term's error, d * q * e,
   no longer cancels: on SmolLM2 the mean KL to the float model was 0.015 instead of 0.003.)
   Rounding is to nearest even (the vector conversions' default, as nearbyint). */
#if defined(BLOCK_AVX512_VNNI)
inline void quantize_block(const float* v, int8_t* low, int8_t* high, float& scale, float& sum) {
    const __m512 a = _mm512_loadu_ps(v), b = _mm512_loadu_ps(v + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    scale = amax / 127.0f;
    const __m512 inverse = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, inverse));
    const __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, inverse));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(low), _mm512_cvtsepi32_epi8(qa));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(high), _mm512_cvtsepi32_epi8(qb));
    sum = scale * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb)));
}
#elif defined(BLOCK_AVX2)
inline void quantize_block(const float* v, int8_t* low, int8_t* high, float& scale, float& sum) {
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
inline void quantize_block(const float* v, int8_t* low, int8_t* high, float& scale, float& sum) {
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

template <typename T>
void quantize_row(const T* x, int64_t blocks, int64_t groups, int8_t* codes, float* lane_scale, float* lane_sum) {
    std::memset(codes, 0, groups * 128);
    std::fill(lane_scale, lane_scale + groups * 16, 0.0f);
    std::fill(lane_sum, lane_sum + groups * 16, 0.0f);
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
        quantize_block(values, codes + g * 128 + 16 * j, codes + g * 128 + 64 + 16 * j, scale, sum);
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
    const int64_t k = x.size(1);
    torch::stable::parallel_for(0, q.rows, 4, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; r++) {
            int8_t* codes = q.codes.data() + r * q.groups * 128;
            float* lanes = q.lane_scale.data() + r * q.groups * 16;
            float* quarters = q.lane_sum.data() + r * q.groups * 16;
            if (x.scalar_type() == ScalarType::BFloat16)
                quantize_row(static_cast<const c10::BFloat16*>(x.data_ptr()) + r * k, q.blocks, q.groups, codes,
                             lanes, quarters);
            else
                quantize_row(static_cast<const float*>(x.data_ptr()) + r * k, q.blocks, q.groups, codes, lanes,
                             quarters);
        }
    });
    return q;
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

/* Four 16-lane sums at once: [sum a, sum b, sum c, sum d]. */
inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
    auto halves = [](__m512 v) { return _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)); };
    const __m256 ab = _mm256_hadd_ps(halves(a), halves(b));
    const __m256 cd = _mm256_hadd_ps(halves(c), halves(d));
    const __m256 all = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(all), _mm256_extractf128_ps(all, 1));
}

/* W weight rows (from codes/scales/mins, row_bytes and blocks apart) against R activation rows
   (r0..): out[w * 4 + r]. A weight group is loaded and split into nibbles once for the R rows, an
   activation group once for the W rows; a block's minimum term rides in the same lanes as its
   dot product (each of its 4 lanes adds m * sum / 4), so a row ends in one reduction. */
template <int BITS, typename S, int W, int R>
inline void tile_dot(const uint8_t* codes, const S* scales, const S* mins, int64_t row_bytes, int64_t blocks,
                     const Quantized& q, int64_t r0, float* out) {
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    const __m512i spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    __m512 acc[W][R];
    for (int w = 0; w < W; w++)
        for (int r = 0; r < R; r++) acc[w][r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < q.groups; g++) {
        const int64_t count = std::min<int64_t>(GROUP, q.blocks - g * GROUP);
        const __mmask64 mask = count == GROUP ? ~0ULL : (1ULL << (16 * count)) - 1;
        __m512i low[W], high[W];
        __m512 d[W], m[W];
        for (int w = 0; w < W; w++) {
            if constexpr (BITS == 4) {
                const __m512i packed = _mm512_maskz_loadu_epi8(mask, codes + w * row_bytes + g * 64);
                low[w] = _mm512_and_si512(packed, nibble);
                high[w] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), nibble);
            } else {  // a group's low halves, then its high halves (16 bytes a block each)
                const uint8_t* at = codes + w * row_bytes + g * 128;
                low[w] = _mm512_maskz_loadu_epi8(mask, at);
                high[w] = _mm512_maskz_loadu_epi8(mask, at + 16 * count);
            }
            d[w] = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(load4(scales + w * blocks + g * GROUP, count)));
            m[w] = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(load4(mins + w * blocks + g * GROUP, count)));
        }
        for (int r = 0; r < R; r++) {
            const int64_t at = (r0 + r) * q.groups + g;
            const int8_t* x = q.codes.data() + at * 128;
            const __m512i xl = _mm512_loadu_si512(x), xh = _mm512_loadu_si512(x + 64);
            const __m512 dx = _mm512_loadu_ps(q.lane_scale.data() + at * 16);
            const __m512 quarter_sum = _mm512_loadu_ps(q.lane_sum.data() + at * 16);
            for (int w = 0; w < W; w++) {
                __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), low[w], xl);
                dot = _mm512_dpbusd_epi32(dot, high[w], xh);
                acc[w][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d[w], dx), acc[w][r]);
                acc[w][r] = _mm512_fmadd_ps(m[w], quarter_sum, acc[w][r]);
            }
        }
    }
    const __m512 zero = _mm512_setzero_ps();
    for (int r = 0; r < R; r++) {
        float sums[4];
        _mm_storeu_ps(sums, reduce4(acc[0][r], W > 1 ? acc[W > 1 ? 1 : 0][r] : zero,
                                    W > 2 ? acc[W > 2 ? 2 : 0][r] : zero, W > 3 ? acc[W > 3 ? 3 : 0][r] : zero));
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
/* The same tile contract as the AVX-512 path, one weight row at a time (4-bit codes only: AVX2's
   byte product saturates past 4-bit x 8-bit, so wider codes are refused without VNNI). */
template <int BITS, typename S, int W, int R>
inline void tile_dot(const uint8_t* codes, const S* scales, const S* mins, int64_t row_bytes, int64_t blocks,
                     const Quantized& q, int64_t r0, float* out) {
    float dots[R];
    for (int w = 0; w < W; w++) {
        rows_dot<S, R>(codes + w * row_bytes, scales + w * blocks, mins + w * blocks, q, r0, dots);
        for (int r = 0; r < R; r++) out[w * 4 + r] = dots[r];
    }
}
#endif

template <int BITS, typename S, int W>
inline void tile_rows(const uint8_t* c, const S* s, const S* m, int64_t row_bytes, int64_t blocks, const Quantized& q,
                      int64_t r0, int64_t count, float* dots) {
    switch (count) {
        case 1: tile_dot<BITS, S, W, 1>(c, s, m, row_bytes, blocks, q, r0, dots); break;
        case 2: tile_dot<BITS, S, W, 2>(c, s, m, row_bytes, blocks, q, r0, dots); break;
        case 3: tile_dot<BITS, S, W, 3>(c, s, m, row_bytes, blocks, q, r0, dots); break;
        default: tile_dot<BITS, S, W, 4>(c, s, m, row_bytes, blocks, q, r0, dots); break;
    }
}

template <int BITS, typename S, typename T>
void multiply(const Quantized& q, const uint8_t* codes, const S* scales, const S* mins, int64_t n_rows, T* out) {
    const int64_t row_bytes = q.blocks * BITS * 4;
    // a thread's share is at least ~2048 block products (~10 us): fewer rows are not worth a wake-up
    const int64_t grain = std::max<int64_t>(WEIGHT_TILE, 2048 / std::max<int64_t>(q.blocks * q.rows, 1));
    torch::stable::parallel_for(0, n_rows, grain, [&](int64_t begin, int64_t end) {
        float dots[4 * ROW_TILE];
        for (int64_t tile = begin; tile < end; tile += WEIGHT_TILE) {
            const int64_t tile_end = std::min(end, tile + WEIGHT_TILE);
            for (int64_t r0 = 0; r0 < q.rows; r0 += ROW_TILE) {
                const int64_t count = std::min(ROW_TILE, q.rows - r0);
                for (int64_t n = tile; n < tile_end; n += 4) {
                    const int64_t weights = std::min<int64_t>(4, tile_end - n);
                    const uint8_t* c = codes + n * row_bytes;
                    const S* s = scales + n * q.blocks;
                    const S* m = mins + n * q.blocks;
                    switch (weights) {
                        case 1: tile_rows<BITS, S, 1>(c, s, m, row_bytes, q.blocks, q, r0, count, dots); break;
                        case 2: tile_rows<BITS, S, 2>(c, s, m, row_bytes, q.blocks, q, r0, count, dots); break;
                        case 3: tile_rows<BITS, S, 3>(c, s, m, row_bytes, q.blocks, q, r0, count, dots); break;
                        default: tile_rows<BITS, S, 4>(c, s, m, row_bytes, q.blocks, q, r0, count, dots); break;
                    }
                    for (int64_t w = 0; w < weights; w++)
                        for (int64_t r = 0; r < count; r++)
                            out[(r0 + r) * n_rows + n + w] = static_cast<T>(dots[w * 4 + r]);
                }
            }
        }
    });
}

template <int BITS, typename T>
void dispatch_scales(const Quantized& q, const Tensor& codes, const Tensor& scales, const Tensor& mins, T* out) {
    const uint8_t* c = static_cast<const uint8_t*>(codes.data_ptr());
    if (scales.scalar_type() == ScalarType::Half)
        multiply<BITS>(q, c, static_cast<const c10::Half*>(scales.data_ptr()),
                       static_cast<const c10::Half*>(mins.data_ptr()), codes.size(0), out);
    else
        multiply<BITS>(q, c, static_cast<const float*>(scales.data_ptr()), static_cast<const float*>(mins.data_ptr()),
                       codes.size(0), out);
}

template <typename T>
void dispatch_bits(const Quantized& q, const Tensor& codes, const Tensor& scales, const Tensor& mins, int64_t bits,
                   T* out) {
#if defined(BLOCK_AVX512_VNNI)
    if (bits == 8) return dispatch_scales<8>(q, codes, scales, mins, out);
#endif
    dispatch_scales<4>(q, codes, scales, mins, out);
}

Tensor block_linear(const Tensor& x, const Tensor& codes, const Tensor& scales, const Tensor& mins, int64_t bits) {
    STD_TORCH_CHECK(x.dim() == 2 && x.is_contiguous(),
                    "block linear: x must be a contiguous [rows, in_features] matrix");
    STD_TORCH_CHECK(x.scalar_type() == ScalarType::Float || x.scalar_type() == ScalarType::BFloat16,
                    "block linear: x must be float32 or bfloat16");
    STD_TORCH_CHECK(x.size(1) % BLOCK == 0, "block linear: in_features must be a multiple of 32");
    STD_TORCH_CHECK(bits == 4 || bits == 8, "block linear: codes are 4 or 8 bits");
#if !defined(BLOCK_AVX512_VNNI)
    STD_TORCH_CHECK(bits == 4, "block linear: 8-bit codes need AVX-512 VNNI");
#endif
    const int64_t n_rows = codes.size(0), blocks = x.size(1) / BLOCK;
    STD_TORCH_CHECK(codes.scalar_type() == ScalarType::Byte && codes.is_contiguous() && codes.dim() == 2 &&
                    codes.size(1) == blocks * bits * 4,
                    "block linear: codes must be contiguous uint8 [out_features, in_features * bits / 8]");
    STD_TORCH_CHECK(scales.scalar_type() == mins.scalar_type() &&
                    (scales.scalar_type() == ScalarType::Half || scales.scalar_type() == ScalarType::Float),
                    "block linear: scales and mins must both be float16 or both float32");
    STD_TORCH_CHECK(scales.is_contiguous() && mins.is_contiguous() && scales.size(0) == n_rows &&
                    mins.size(0) == n_rows && scales.size(1) == blocks && mins.size(1) == blocks,
                    "block linear: scales and mins must be contiguous [out_features, in_features / 32]");
    Tensor out = empty_rows(x, x.size(0), n_rows);
    if (x.size(0) == 0 || n_rows == 0) return out;
    const Quantized q = quantize(x);
    if (x.scalar_type() == ScalarType::BFloat16)
        dispatch_bits(q, codes, scales, mins, bits, static_cast<c10::BFloat16*>(out.data_ptr()));
    else
        dispatch_bits(q, codes, scales, mins, bits, static_cast<float*>(out.data_ptr()));
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
                         int64_t start, int64_t end) {
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
        last.out = block_linear(x, codes, scales, mins, bits);
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
    m.def("linear(Tensor x, Tensor codes, Tensor scales, Tensor mins, int bits) -> Tensor");
    m.def("linear_part(Tensor x, Tensor codes, Tensor scales, Tensor mins, int bits, int start, int end) -> Tensor");
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
