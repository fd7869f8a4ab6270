/* Decode attention through block tables: one query token per row, K/V read in place.

   Why C: PyTorch has no CPU attention that reads a paged cache, and gathering every row's
   blocks into a dense tensor first copies the whole cache once per layer per step (measured 3x
   the attention itself). Here each (row, K/V head) reads its blocks where they lie, once for all
   the query heads of its group. Scores and softmax are float32, as in transformers' sdpa path.
   Work is split over OpenMP threads: the library's DT_NEEDED libgomp.so.1 resolves to the one
   PyTorch already loaded (same soname), so the kernel runs on PyTorch's own thread team. A second
   runtime (or plain pthreads) would fight PyTorch's spinning workers for the cores: measured, a
   pthread kernel made a 1-row step 14 ms slower. Built by decoding/paged_attention.py with the
   system C compiler on first use.

   paged_write_decode is the whole of one layer's cache work at a decode step in one call: the new
   tokens' K/V written into their (block, offset) in the pool's dtype, then the decode rows'
   attention read from the model's own (strided) query and written in its dtype, so the layer
   needs no index_put, no query copy and no output cast in PyTorch (each a dispatched op a layer). */
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

/* bfloat16 <-> float32 as PyTorch converts: widening is exact, narrowing rounds to nearest even. */
static inline float bf16_to_f32(uint16_t h) {
    uint32_t bits = ((uint32_t)h) << 16;
    float f;
    memcpy(&f, &bits, sizeof(float));
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof(float));
    if (f != f) return 0x7FC0;
    return (uint16_t)((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

/* One cached row of head_dim values as float32: in place for float32, widened into buf for bf16. */
static inline const float *row_at(const void *base, int64_t at, int64_t dim, int bf16, float *buf) {
    if (!bf16) return (const float *)base + at;
    const uint16_t *src = (const uint16_t *)base + at;
    for (int64_t d = 0; d < dim; d++) buf[d] = bf16_to_f32(src[d]);
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

static inline float load_at(const void *base, int64_t at, int bf16) {
    return bf16 ? bf16_to_f32(((const uint16_t *)base)[at]) : ((const float *)base)[at];
}

static inline void store_at(void *base, int64_t at, float x, int bf16) {
    if (bf16) ((uint16_t *)base)[at] = f32_to_bf16(x);
    else ((float *)base)[at] = x;
}

/* Strided [heads, tokens, dim] views (the model's [1, heads, tokens, dim] after its transpose):
   element (h, t, d) at h * head_stride + t * token_stride + d. */
typedef struct {
    const void *data;
    int64_t head_stride, token_stride;
    int bf16;
} View;

int paged_write_decode(const void *q, int64_t q_head_stride, int64_t q_token_stride, int q_bf16,
                       const void *k_new, int64_t k_head_stride, int64_t k_token_stride,
                       const void *v_new, int64_t v_head_stride, int64_t v_token_stride, int kv_bf16,
                       void *keys, void *values, int pool_bf16,
                       const int64_t *token_blocks, const int64_t *token_offsets, int64_t num_tokens,
                       const int64_t *tables, const int64_t *lengths, const int64_t *firsts, int64_t rows,
                       void *out, int out_bf16, int64_t heads, int64_t kv_heads, int64_t block, int64_t dim,
                       int64_t table_stride, float scale, int threads) {
    View qv = {q, q_head_stride, q_token_stride, q_bf16};
    View kv[2] = {{k_new, k_head_stride, k_token_stride, kv_bf16}, {v_new, v_head_stride, v_token_stride, kv_bf16}};
    void *pools[2] = {keys, values};
    float *q32 = malloc(sizeof(float) * (size_t)(rows * heads * dim + 1));
    float *out32 = out_bf16 ? malloc(sizeof(float) * (size_t)(rows * heads * dim + 1)) : (float *)out;
    if (q32 == NULL || out32 == NULL) {
        free(q32);
        if (out_bf16) free(out32);
        return 1;
    }
    int64_t units = rows * kv_heads, writes = num_tokens * kv_heads;
    if (threads < 1) threads = 1;
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int64_t w = 0; w < writes; w++) {  /* token t's K/V head h into the pool */
            int64_t t = w / kv_heads, h = w % kv_heads;
            int64_t at = ((token_blocks[t] * kv_heads + h) * block + token_offsets[t]) * dim;
            for (int which = 0; which < 2; which++) {
                const View *src = &kv[which];
                int64_t from = h * src->head_stride + t * src->token_stride;
                if (src->bf16 == pool_bf16) {
                    size_t size = (size_t)dim * (pool_bf16 ? 2 : 4);
                    memcpy((char *)pools[which] + at * (pool_bf16 ? 2 : 4),
                           (const char *)src->data + from * (src->bf16 ? 2 : 4), size);
                } else {
                    for (int64_t d = 0; d < dim; d++) store_at(pools[which], at + d, load_at(src->data, from + d, src->bf16), pool_bf16);
                }
            }
        }
#pragma omp for schedule(static)
        for (int64_t u = 0; u < rows * heads; u++) {  /* the decode rows' queries as float32 */
            int64_t r = u / heads, h = u % heads;
            for (int64_t d = 0; d < dim; d++) q32[u * dim + d] = load_at(qv.data, h * qv.head_stride + r * qv.token_stride + d, qv.bf16);
        }
        /* the implicit barrier above: every write and query is in place before any row attends */
        int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
        Job j = {q32, keys, values, tables, lengths, firsts, out32, rows, heads, kv_heads, block, dim,
                 table_stride, scale, pool_bf16, units * t / n, units * (t + 1) / n};
        run(&j);
        if (out_bf16) {  /* this thread's units are rows r, heads h*group .. h*group+group-1: contiguous */
            int64_t group = heads / kv_heads;
            for (int64_t x = j.begin * group * dim; x < j.end * group * dim; x++) store_at(out, x, out32[x], 1);
        }
    }
    free(q32);
    if (out_bf16) free(out32);
    return 0;
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
