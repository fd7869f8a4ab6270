/* Decode attention through block tables: one query token per row, K/V read in place.

   Why C: PyTorch has no CPU attention that reads a paged cache, and gathering every row's
   blocks into a dense tensor first copies the whole cache once per layer per step (measured 3x
   the attention itself). Here each (row, K/V head) reads its blocks where they lie, once for all
   the query heads of its group. Scores and softmax are float32, as in transformers' sdpa path.
   Work is split over OpenMP threads: the library's DT_NEEDED libgomp.so.1 resolves to the one
   PyTorch already loaded (same soname), so the kernel runs on PyTorch's own thread team. A second
   runtime (or plain pthreads) would fight PyTorch's spinning workers for the cores: measured, a
   pthread kernel made a 1-row step 14 ms slower. Built by decoding/paged_attention.py with the
   system C compiler on first use. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const float *q;          /* [rows, heads, dim] float32 */
    const void *keys;        /* [blocks, kv_heads, block, dim] in dtype */
    const void *values;
    const int64_t *tables;   /* [rows, table_stride] */
    const int64_t *lengths;  /* [rows]: positions 0..length-1 are attended */
    const int64_t *firsts;   /* [rows]: first attended position (sliding window), 0 otherwise */
    float *out;              /* [rows, heads, dim] float32 */
    int64_t rows, heads, kv_heads, block, dim, table_stride;
    float scale;
    int bf16;
    int64_t begin, end;      /* this thread's (row, kv head) units */
} Job;

/* One cached row of head_dim values as float32: in place for float32, widened into buf for bf16. */
static inline const float *row_at(const void *base, int64_t at, int64_t dim, int bf16, float *buf) {
    if (!bf16) return (const float *)base + at;
    const uint16_t *src = (const uint16_t *)base + at;
    for (int64_t d = 0; d < dim; d++) {
        uint32_t bits = ((uint32_t)src[d]) << 16;
        memcpy(&buf[d], &bits, sizeof(float));
    }
    return buf;
}

static void *run(void *arg) {
    Job *j = (Job *)arg;
    int64_t group = j->heads / j->kv_heads;
    int64_t max_len = 0;
    for (int64_t r = 0; r < j->rows; r++) if (j->lengths[r] > max_len) max_len = j->lengths[r];
    float *scores = malloc(sizeof(float) * (size_t)(group * (max_len > 0 ? max_len : 1)));
    float *row_k = malloc(sizeof(float) * (size_t)j->dim);
    for (int64_t unit = j->begin; unit < j->end; unit++) {
        int64_t r = unit / j->kv_heads, h = unit % j->kv_heads;
        int64_t len = j->lengths[r], first = j->firsts[r];
        const int64_t *table = j->tables + r * j->table_stride;
        const float *q = j->q + (r * j->heads + h * group) * j->dim;
        for (int64_t p = first; p < len; p++) {
            int64_t base = ((table[p / j->block] * j->kv_heads + h) * j->block + p % j->block) * j->dim;
            const float *k = row_at(j->keys, base, j->dim, j->bf16, row_k);
            for (int64_t g = 0; g < group; g++) {
                const float *qg = q + g * j->dim;
                float s = 0.0f;
#pragma omp simd reduction(+ : s)
                for (int64_t d = 0; d < j->dim; d++) s += qg[d] * k[d];
                scores[g * len + p] = s * j->scale;
            }
        }
        for (int64_t g = 0; g < group; g++) {
            float *sg = scores + g * len;
            float top = -INFINITY, total = 0.0f;
            for (int64_t p = first; p < len; p++) if (sg[p] > top) top = sg[p];
            for (int64_t p = first; p < len; p++) { sg[p] = expf(sg[p] - top); total += sg[p]; }
            for (int64_t p = first; p < len; p++) sg[p] /= total;
            float *o = j->out + (r * j->heads + h * group + g) * j->dim;
            memset(o, 0, sizeof(float) * (size_t)j->dim);
        }
        for (int64_t p = first; p < len; p++) {
            int64_t base = ((table[p / j->block] * j->kv_heads + h) * j->block + p % j->block) * j->dim;
            const float *v = row_at(j->values, base, j->dim, j->bf16, row_k);
            for (int64_t g = 0; g < group; g++) {
                float w = scores[g * len + p];
                float *o = j->out + (r * j->heads + h * group + g) * j->dim;
#pragma omp simd
                for (int64_t d = 0; d < j->dim; d++) o[d] += w * v[d];
            }
        }
    }
    free(row_k);
    free(scores);
    return NULL;
}

int paged_decode(const float *q, const void *keys, const void *values, const int64_t *tables,
                 const int64_t *lengths, const int64_t *firsts, float *out, int64_t rows, int64_t heads,
                 int64_t kv_heads, int64_t block, int64_t dim, int64_t table_stride, float scale, int bf16,
                 int threads) {
    int64_t units = rows * kv_heads;
    if (threads < 1) threads = 1;
    if (threads > units) threads = (int)units;
#pragma omp parallel num_threads(threads)
    {
        int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
        Job j = {q, keys, values, tables, lengths, firsts, out, rows, heads, kv_heads, block, dim,
                 table_stride, scale, bf16, units * t / n, units * (t + 1) / n};
        run(&j);
    }
    return 0;
}
