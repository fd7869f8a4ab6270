/* Each packed token's LoRA delta added into its linear's output, in place, in one call:
   out[t] += scale[s] * (x[t] @ A[s]) @ B[s], s = the token's adapter (its stack index; -1: none).

   Why: a decode step carries a few tokens, so each of a model's ~200 wrapped linears multiplies a
   handful of rows by matrices of rank 16. Through torch.mm that is two products, an intermediate
   and their dispatch per linear (~25 us a linear in the engine, measured: one client on SmolLM2's
   gguf weights spent 5.3 ms of a 31.7 ms step there, against a 24 ms step without an adapter),
   most of it waiting on A and B, which the base weights streaming past have pushed out of the
   caches. Here both products run in one pass per adapter over its own contiguous A and B, with
   enough independent accumulators to keep loads in flight: the tokens of one adapter are grouped
   (no gather or scatter of rows), each adapter's matrices are read once for all its tokens, and
   a token without an adapter costs nothing. Prefills (many tokens) keep torch.mm, whose blocking
   wins there (bank.NATIVE_TOKENS).

   Shapes (float32, contiguous): out [T, O], x [T, I], a [S, I, R] (each adapter's A, rank R
   padded with zero columns), b [S, R, O], token_slots [T] int64, scales [S] float32. Threads are
   PyTorch's (parallel_for over groups of tokens for the down product, over output columns for
   the up product, each once a call holds enough work); every output element is summed in the same
   order whatever the thread count or the other tokens of the call. Splitting one token's A rows
   between threads too (partial sums) was measured within noise of one thread, and not kept. */
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

using torch::stable::Tensor;
using torch::headeronly::ScalarType;

constexpr int64_t TOKEN_TILE = 8;   // tokens whose accumulators share one read of A (or of B's columns)
constexpr int64_t UP_TILE = 64;     // output columns one up-product task covers (four 16-lane vectors)
constexpr int64_t UP_TOKENS = 4;    // tokens whose up-product accumulators share one read of B's tile

struct Group {
    int64_t slot;
    std::vector<int64_t> tokens;
};

#if defined(__AVX512F__)

__mmask16 lanes(int64_t remaining) {
    return remaining >= 16 ? static_cast<__mmask16>(0xFFFF)
                           : remaining <= 0 ? static_cast<__mmask16>(0)
                                            : static_cast<__mmask16>((1u << remaining) - 1);
}

/* down[tok] = x[tok] @ A for up to TOKEN_TILE tokens, 16 rank columns at a time; two partial sums per
   token (even and odd rows of A) so one token still has two independent FMA chains. */
void down_tile(const float* x, const float* a, float* down, const int64_t* tokens, int64_t count, int64_t in,
               int64_t rank) {
    for (int64_t c = 0; c < rank; c += 16) {
        const __mmask16 mask = lanes(rank - c);
        __m512 even[TOKEN_TILE], odd[TOKEN_TILE];
        for (int64_t t = 0; t < count; t++) even[t] = odd[t] = _mm512_setzero_ps();
        int64_t i = 0;
        for (; i + 2 <= in; i += 2) {
            const __m512 a0 = _mm512_maskz_loadu_ps(mask, a + i * rank + c);
            const __m512 a1 = _mm512_maskz_loadu_ps(mask, a + (i + 1) * rank + c);
            for (int64_t t = 0; t < count; t++) {
                const float* row = x + tokens[t] * in + i;
                even[t] = _mm512_fmadd_ps(_mm512_set1_ps(row[0]), a0, even[t]);
                odd[t] = _mm512_fmadd_ps(_mm512_set1_ps(row[1]), a1, odd[t]);
            }
        }
        if (i < in) {
            const __m512 a0 = _mm512_maskz_loadu_ps(mask, a + i * rank + c);
            for (int64_t t = 0; t < count; t++)
                even[t] = _mm512_fmadd_ps(_mm512_set1_ps(x[tokens[t] * in + i]), a0, even[t]);
        }
        for (int64_t t = 0; t < count; t++)
            _mm512_mask_storeu_ps(down + tokens[t] * rank + c, mask, _mm512_add_ps(even[t], odd[t]));
    }
}

/* out[tok, o0:o0+64] += scale * down[tok] @ B[:, o0:o0+64] for up to 4 tokens: four column vectors a
   token, so one token has four independent chains over the rank. */
void up_tile(const float* down, const float* b, float* out, const int64_t* tokens, int64_t count, int64_t rank,
             int64_t columns, int64_t o0, float scale) {
    __mmask16 mask[4];
    for (int k = 0; k < 4; k++) mask[k] = lanes(columns - o0 - 16 * k);
    __m512 acc[4][4];
    for (int64_t t = 0; t < count; t++)
        for (int k = 0; k < 4; k++) acc[t][k] = _mm512_setzero_ps();
    for (int64_t r = 0; r < rank; r++) {
        const float* row = b + r * columns + o0;
        __m512 w[4];
        for (int k = 0; k < 4; k++) w[k] = _mm512_maskz_loadu_ps(mask[k], row + 16 * k);
        for (int64_t t = 0; t < count; t++) {
            const __m512 d = _mm512_set1_ps(down[tokens[t] * rank + r]);
            for (int k = 0; k < 4; k++) acc[t][k] = _mm512_fmadd_ps(d, w[k], acc[t][k]);
        }
    }
    const __m512 s = _mm512_set1_ps(scale);
    for (int64_t t = 0; t < count; t++) {
        float* dst = out + tokens[t] * columns + o0;
        for (int k = 0; k < 4; k++) {
            const __m512 now = _mm512_maskz_loadu_ps(mask[k], dst + 16 * k);
            _mm512_mask_storeu_ps(dst + 16 * k, mask[k], _mm512_fmadd_ps(acc[t][k], s, now));
        }
    }
}

#else

void down_tile(const float* x, const float* a, float* down, const int64_t* tokens, int64_t count, int64_t in,
               int64_t rank) {
    for (int64_t t = 0; t < count; t++) {
        float* d = down + tokens[t] * rank;
        const float* row = x + tokens[t] * in;
        std::fill(d, d + rank, 0.0f);
        for (int64_t i = 0; i < in; i++) {
            const float v = row[i];
            const float* a_row = a + i * rank;
            for (int64_t r = 0; r < rank; r++) d[r] += v * a_row[r];
        }
    }
}

void up_tile(const float* down, const float* b, float* out, const int64_t* tokens, int64_t count, int64_t rank,
             int64_t columns, int64_t o0, float scale) {
    const int64_t o1 = std::min(columns, o0 + UP_TILE);
    for (int64_t t = 0; t < count; t++) {
        float acc[UP_TILE] = {};
        const float* d = down + tokens[t] * rank;
        for (int64_t r = 0; r < rank; r++) {
            const float* row = b + r * columns;
            for (int64_t o = o0; o < o1; o++) acc[o - o0] += d[r] * row[o];
        }
        float* dst = out + tokens[t] * columns;
        for (int64_t o = o0; o < o1; o++) dst[o] += scale * acc[o - o0];
    }
}

#endif

void check(const Tensor& t, const char* name, int64_t dims) {
    STD_TORCH_CHECK(t.dim() == dims && t.is_contiguous() && t.scalar_type() == ScalarType::Float,
                    "LoRA deltas: ", name, " must be a contiguous float32 tensor of ", dims, " dimensions");
}

void add_deltas(Tensor out, const Tensor& x, const Tensor& a, const Tensor& b, const Tensor& token_slots,
                const Tensor& scales) {
    check(a, "a", 3);
    check(b, "b", 3);
    check(scales, "scales", 1);
    STD_TORCH_CHECK(out.is_contiguous() && x.is_contiguous() && out.scalar_type() == ScalarType::Float &&
                        x.scalar_type() == ScalarType::Float,
                    "LoRA deltas: out and x must be contiguous float32 tensors");
    const int64_t slots = a.size(0), in = a.size(1), rank = a.size(2), columns = b.size(2);
    STD_TORCH_CHECK(b.size(0) == slots && b.size(1) == rank && scales.size(0) == slots,
                    "LoRA deltas: a, b and scales disagree on the adapters or the rank");
    STD_TORCH_CHECK(token_slots.dim() == 1 && token_slots.is_contiguous() &&
                        token_slots.scalar_type() == ScalarType::Long,
                    "LoRA deltas: token_slots must be a contiguous int64 vector");
    const int64_t tokens = token_slots.size(0);
    STD_TORCH_CHECK(x.numel() == tokens * in && out.numel() == tokens * columns,
                    "LoRA deltas: x and out must hold one row per token of token_slots");
    const int64_t* slot_of = static_cast<const int64_t*>(token_slots.data_ptr());
    std::vector<Group> groups;
    std::vector<int64_t> group_of(slots, -1);
    for (int64_t t = 0; t < tokens; t++) {
        const int64_t s = slot_of[t];
        STD_TORCH_CHECK(s >= -1 && s < slots, "LoRA deltas: token ", t, " names adapter ", s, " of ", slots);
        if (s < 0) continue;
        if (group_of[s] < 0) {
            group_of[s] = static_cast<int64_t>(groups.size());
            groups.push_back({s, {}});
        }
        groups[group_of[s]].tokens.push_back(t);
    }
    if (groups.empty()) return;
    const float* xs = static_cast<const float*>(x.data_ptr());
    const float* as = static_cast<const float*>(a.data_ptr());
    const float* bs = static_cast<const float*>(b.data_ptr());
    const float* scale = static_cast<const float*>(scales.data_ptr());
    float* outs = static_cast<float*>(out.data_ptr());
    std::vector<float> down(tokens * rank);

    struct Task {
        const Group* group;
        int64_t first, count;
    };
    std::vector<Task> downs;
    for (const Group& g : groups)
        for (int64_t first = 0; first < static_cast<int64_t>(g.tokens.size()); first += TOKEN_TILE)
            downs.push_back({&g, first, std::min<int64_t>(TOKEN_TILE, g.tokens.size() - first)});
    // a task is worth a thread from ~16 tokens' work of a 576-wide input at rank 16
    const int64_t down_grain = std::max<int64_t>(1, 150000 / std::max<int64_t>(1, TOKEN_TILE * in * rank));
    torch::stable::parallel_for(0, static_cast<int64_t>(downs.size()), down_grain, [&](int64_t begin, int64_t end) {
        for (int64_t k = begin; k < end; k++) {
            const Task& task = downs[k];
            down_tile(xs, as + task.group->slot * in * rank, down.data(), task.group->tokens.data() + task.first,
                      task.count, in, rank);
        }
    });
    const int64_t tiles = (columns + UP_TILE - 1) / UP_TILE;
    const int64_t up_grain = std::max<int64_t>(1, 150000 / std::max<int64_t>(1, tokens * rank * UP_TILE));
    torch::stable::parallel_for(0, tiles, up_grain, [&](int64_t begin, int64_t end) {
        for (const Group& g : groups) {  // one adapter's B at a time: its rows are the only streams in flight
            const float* bg = bs + g.slot * rank * columns;
            for (int64_t tile = begin; tile < end; tile++)
                for (int64_t first = 0; first < static_cast<int64_t>(g.tokens.size()); first += UP_TOKENS)
                    up_tile(down.data(), bg, outs, g.tokens.data() + first,
                            std::min<int64_t>(UP_TOKENS, g.tokens.size() - first), rank, columns, tile * UP_TILE,
                            scale[g.slot]);
        }
    });
}

}  // namespace

STABLE_TORCH_LIBRARY(decoda_lora, m) {
    m.def("add_deltas(Tensor(a!) out, Tensor x, Tensor a, Tensor b, Tensor token_slots, Tensor scales) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(decoda_lora, CPU, m) {
    m.impl("add_deltas", TORCH_BOX(&add_deltas));
}
