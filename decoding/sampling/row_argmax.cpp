/* The index of each row's largest float32 value, as torch.argmax(dim=-1) gives it (the first of equal
   maxima; a NaN counts as the largest, the first NaN wins).

   Why: greedy decoding takes one argmax per row and step over the whole vocabulary. torch.argmax's
   CPU reduction keeps an (index, value) pair per lane and reaches ~0.5 ms on one row of Gemma 3's
   262,144 logits, 20x what a plain vectorized max takes (torch.amax: ~0.02 ms), and ~5 ms on 16 rows:
   a few percent of a one-row step at llama.cpp's speed. Here a row is read twice: a max (and a NaN
   check) at memory speed, then a search for the first position holding it; the row is in cache by
   then (1 MB). Rows run in parallel (PyTorch's threads). */
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

using torch::stable::Tensor;
using torch::headeronly::ScalarType;

/* The first index of the row's maximum (the first NaN when there is one). */
int64_t row_argmax(const float* v, int64_t n) {
    float top = -std::numeric_limits<float>::infinity();
    int64_t i = 0;
#if defined(__AVX512F__)
    __m512 best = _mm512_set1_ps(top);
    __mmask16 nan = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(v + i);
        nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
        best = _mm512_max_ps(best, x);
    }
    if (nan) {
        for (int64_t j = 0; j < n; j++)
            if (std::isnan(v[j])) return j;
    }
    top = _mm512_reduce_max_ps(best);
#endif
    for (; i < n; i++) {
        if (std::isnan(v[i])) {
            for (int64_t j = 0; j < n; j++)
                if (std::isnan(v[j])) return j;
        }
        top = v[i] > top ? v[i] : top;
    }
    int64_t j = 0;
#if defined(__AVX512F__)
    const __m512 target = _mm512_set1_ps(top);
    for (; j + 16 <= n; j += 16) {
        const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_loadu_ps(v + j), target, _CMP_EQ_OQ);
        if (hit) return j + __builtin_ctz(static_cast<unsigned>(hit));
    }
#endif
    for (; j < n; j++)
        if (v[j] == top) return j;
    return 0;  // an all -inf row: torch.argmax answers 0 as well
}

Tensor argmax_rows(const Tensor& scores) {
    STD_TORCH_CHECK(scores.dim() == 2 && scores.is_contiguous() && scores.scalar_type() == ScalarType::Float,
                    "row argmax: scores must be a contiguous float32 [rows, vocabulary] matrix");
    STD_TORCH_CHECK(scores.size(1) > 0, "row argmax: an empty row has no argmax");
    const int64_t rows = scores.size(0), n = scores.size(1);
    int32_t dtype = 0;
    STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_dtype(scores.get(), &dtype));
    const int64_t sizes[1] = {rows}, strides[1] = {1};
    AtenTensorHandle handle = nullptr;
    STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(1, sizes, strides, aoti_torch_dtype_int64(),
                                                           aoti_torch_device_type_cpu(), 0, &handle));
    Tensor out(handle);
    const float* data = static_cast<const float*>(scores.data_ptr());
    int64_t* index = static_cast<int64_t*>(out.data_ptr());
    torch::stable::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; r++) index[r] = row_argmax(data + r * n, n);
    });
    return out;
}

}  // namespace

STABLE_TORCH_LIBRARY(decoda_sampling, m) {
    m.def("argmax_rows(Tensor scores) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(decoda_sampling, CPU, m) {
    m.impl("argmax_rows", TORCH_BOX(&argmax_rows));
}
