/* Decode attention through block tables: one query token per row, K/V read in place.

   Why native: PyTorch has no CPU attention that reads a paged cache, and gathering every row's
   blocks into a dense tensor first copies the whole cache once per layer per step (measured 3x
   the attention itself). Here each (row, K/V head) reads its blocks where they lie, once for all
   the query heads of its group. Scores and softmax are float32, as in transformers' sdpa path.
   Work is split over OpenMP threads: the library's DT_NEEDED libgomp.so.1 resolves to the one
   PyTorch already loaded (same soname), so the kernel runs on PyTorch's own thread team. A second
   runtime (or plain pthreads) would fight PyTorch's spinning workers for the cores: measured, a
   pthread kernel made a 1-row step 14 ms slower.

   It is a PyTorch operator library (STABLE_TORCH_LIBRARY decoda_paged), built with the system C++
   compiler against the installed torch on first use (decoding/kv/paged_attention.py), so a compiled
   graph calls it through the dispatcher, with no Python in between. It is written against PyTorch's
   stable C ABI (torch/csrc/stable) rather than ATen's C++ API: its headers are a third of ATen's
   and it has no unboxing templates to instantiate, so the first start builds it in ~3 s where the
   ATen version took ~7.5 (a machine's first start with --compile waits for it):

   - write_decode is the whole of one layer's cache work at a decode step in one call: the new
     tokens' K/V written into their (block, offset) in the pool's dtype, then the decode rows'
     attention read from the model's own (strided) query and written in its dtype, so the layer
     needs no index_put, no query copy and no output cast in PyTorch (each a dispatched op a layer);
   - decode is the attention alone (the path for K/V the fused call cannot write);
   - set_step / step_attention / clear_step: a compiled one-token forward cannot take the step's
     block tables as an argument of every layer's attention without threading them through the
     model, so the runner publishes them once a step (set_step, this thread's state) and each layer
     calls step_attention with only its tensors and its layer index. That call writes the pool as
     write_decode does; its schema declares no mutation on purpose, as the Python custom op it
     replaces did: the pool is no input of the graph, and nothing in the graph reads it. */
#include <omp.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using torch::stable::Tensor;
using torch::headeronly::ScalarType;

struct Job {
    const float *q;          /* [rows, heads, dim] float32 */
    const void *keys;        /* [blocks, kv_heads, block, dim] in dtype */
    const void *values;
    const int64_t *tables;   /* [rows, table_stride] */
    const int64_t *lengths;  /* [rows]: positions 0..length-1 are attended */
    const int64_t *firsts;   /* [rows]: first attended position (sliding window), 0 otherwise */
    int64_t window;          /* > 0: firsts are length - window (clamped), firsts is unused */
    float *out;              /* [rows, heads, dim] float32 */
    int64_t rows, heads, kv_heads, block, dim, table_stride;
    float scale;
    int bf16;
    int64_t parts;           /* slices each (row, kv head)'s query heads are cut into: 1, or the group */
    int64_t begin, end;      /* this thread's units: (row, kv head, slice), in that order */
};

/* How many slices a (row, kv head)'s query heads are cut into: the whole group at once (its K/V read
   once for all of them) unless there are too few (row, kv head) pairs to keep every thread busy,
   as at one row (SmolLM2: 3 K/V heads on 2 threads, one thread did 2 of the 3). */
inline int64_t parts_for(int64_t rows, int64_t kv_heads, int64_t group, int threads) {
    return rows * kv_heads < 2 * threads ? group : 1;
}

/* The first query head (row-major over rows, heads) unit u attends: units cover them in order. */
inline int64_t first_head(const Job &j, int64_t u) {
    const int64_t group = j.heads / j.kv_heads, pair = u / j.parts, part = u % j.parts;
    return pair * group + part * group / j.parts;
}

/* bfloat16 <-> float32 as PyTorch converts: widening is exact, narrowing rounds to nearest even. */
inline float bf16_to_f32(uint16_t h) {
    uint32_t bits = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof(float));
    return f;
}

inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof(float));
    if (f != f) return 0x7FC0;
    return static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

/* One cached row of head_dim values as float32: in place for float32, widened into buf for bf16. */
inline const float *row_at(const void *base, int64_t at, int64_t dim, int bf16, float *buf) {
    if (!bf16) return static_cast<const float *>(base) + at;
    const uint16_t *src = static_cast<const uint16_t *>(base) + at;
    for (int64_t d = 0; d < dim; d++) buf[d] = bf16_to_f32(src[d]);
    return buf;
}

inline int64_t first_of(const Job &j, int64_t r) {
    if (j.window > 0) return j.lengths[r] > j.window ? j.lengths[r] - j.window : 0;
    return j.firsts == nullptr ? 0 : j.firsts[r];
}

void run(const Job &j) {
    int64_t group = j.heads / j.kv_heads;
    int64_t max_len = 1;
    for (int64_t r = 0; r < j.rows; r++) max_len = std::max(max_len, j.lengths[r]);
    std::vector<float> scores_buffer(static_cast<size_t>(group * max_len)), row_buffer(static_cast<size_t>(j.dim));
    float *scores = scores_buffer.data(), *row_k = row_buffer.data();
    for (int64_t unit = j.begin; unit < j.end; unit++) {
        const int64_t pair = unit / j.parts, part = unit % j.parts;
        const int64_t r = pair / j.kv_heads, h = pair % j.kv_heads;
        const int64_t g0 = part * group / j.parts, g1 = (part + 1) * group / j.parts;
        int64_t len = j.lengths[r], first = first_of(j, r);
        const int64_t *table = j.tables + r * j.table_stride;
        const float *q = j.q + (r * j.heads + h * group) * j.dim;
        for (int64_t p = first; p < len; p++) {
            int64_t base = ((table[p / j.block] * j.kv_heads + h) * j.block + p % j.block) * j.dim;
            const float *k = row_at(j.keys, base, j.dim, j.bf16, row_k);
            for (int64_t g = g0; g < g1; g++) {
                const float *qg = q + g * j.dim;
                float s = 0.0f;
#pragma omp simd reduction(+ : s)
                for (int64_t d = 0; d < j.dim; d++) s += qg[d] * k[d];
                scores[g * len + p] = s * j.scale;
            }
        }
        for (int64_t g = g0; g < g1; g++) {
            float *sg = scores + g * len;
            float top = -INFINITY, total = 0.0f;
            for (int64_t p = first; p < len; p++) if (sg[p] > top) top = sg[p];
            for (int64_t p = first; p < len; p++) { sg[p] = std::exp(sg[p] - top); total += sg[p]; }
            for (int64_t p = first; p < len; p++) sg[p] /= total;
            float *o = j.out + (r * j.heads + h * group + g) * j.dim;
            std::memset(o, 0, sizeof(float) * static_cast<size_t>(j.dim));
        }
        for (int64_t p = first; p < len; p++) {
            int64_t base = ((table[p / j.block] * j.kv_heads + h) * j.block + p % j.block) * j.dim;
            const float *v = row_at(j.values, base, j.dim, j.bf16, row_k);
            for (int64_t g = g0; g < g1; g++) {
                float w = scores[g * len + p];
                float *o = j.out + (r * j.heads + h * group + g) * j.dim;
#pragma omp simd
                for (int64_t d = 0; d < j.dim; d++) o[d] += w * v[d];
            }
        }
    }
}

inline float load_at(const void *base, int64_t at, int bf16) {
    return bf16 ? bf16_to_f32(static_cast<const uint16_t *>(base)[at]) : static_cast<const float *>(base)[at];
}

inline void store_at(void *base, int64_t at, float x, int bf16) {
    if (bf16) static_cast<uint16_t *>(base)[at] = f32_to_bf16(x);
    else static_cast<float *>(base)[at] = x;
}

bool is_bf16(const Tensor &t) { return t.scalar_type() == ScalarType::BFloat16; }

const int64_t *ints(const Tensor &t) { return static_cast<const int64_t *>(t.data_ptr()); }

bool same_sizes(const Tensor &a, const Tensor &b) {
    if (a.dim() != b.dim()) return false;
    for (int64_t d = 0; d < a.dim(); d++)
        if (a.size(d) != b.size(d)) return false;
    return true;
}

/* A new contiguous CPU tensor of like's dtype, through one C call into torch (empty_strided): the
   stable ABI's new_empty goes through the dispatcher twice, ~1 us a call more (30 calls a step). */
Tensor empty_as(const Tensor &like, std::vector<int64_t> sizes) {
    int32_t dtype = 0;
    STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_dtype(like.get(), &dtype));
    std::vector<int64_t> strides(sizes.size(), 1);
    for (size_t d = sizes.size(); d-- > 1;) strides[d - 1] = strides[d] * sizes[d];
    AtenTensorHandle handle = nullptr;
    STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(static_cast<int64_t>(sizes.size()), sizes.data(),
                                                           strides.data(), dtype, aoti_torch_device_type_cpu(), 0,
                                                           &handle));
    return Tensor(handle);
}

int num_threads() { return std::max(1, static_cast<int>(torch::stable::get_num_threads())); }

void check_float(const Tensor &t, const char *name) {
    STD_TORCH_CHECK(t.is_cpu() && (t.scalar_type() == ScalarType::Float || is_bf16(t)),
                    "paged attention: ", name, " must be a float32 or bfloat16 CPU tensor");
}

void check_index(const Tensor &t, const char *name, int64_t dims) {
    STD_TORCH_CHECK(t.is_cpu() && t.scalar_type() == ScalarType::Long && t.dim() == dims && t.is_contiguous(),
                    "paged attention: ", name, " must be a contiguous int64 CPU tensor of ", dims, " dimensions");
}

void check_pools(const Tensor &keys, const Tensor &values) {
    check_float(keys, "the key pool");
    check_float(values, "the value pool");
    STD_TORCH_CHECK(keys.dim() == 4 && keys.is_contiguous() && values.is_contiguous() && same_sizes(keys, values) &&
                    keys.scalar_type() == values.scalar_type(),
                    "paged attention: the pools must be contiguous [blocks, kv_heads, block, dim] of one dtype");
}

/* Strided [heads, tokens, dim] views of the model's tensors ([1, heads, tokens, dim] after its
   transpose, read in place: no view op dispatched): element (h, t, d) at
   h * head_stride + t * token_stride + d. */
struct View {
    const void *data;
    int64_t heads, tokens, dim, head_stride, token_stride;
    int bf16;
};

View view_of(const Tensor &t, const char *name) {  // [heads, tokens, dim] or [1, heads, tokens, dim]
    check_float(t, name);
    const int64_t lead = t.dim() - 3;
    STD_TORCH_CHECK((lead == 0 || (lead == 1 && t.size(0) == 1)) && t.stride(t.dim() - 1) == 1, "paged attention: ",
                    name, " must be [heads, tokens, dim] (or [1, heads, tokens, dim]) with unit last stride");
    return View{t.data_ptr(), t.size(lead), t.size(lead + 1), t.size(lead + 2), t.stride(lead), t.stride(lead + 1),
                is_bf16(t)};
}

/* Every token's K/V into the pool, then the first `rows` tokens' attention over their tables, into
   `out` (contiguous, rows x heads x dim, in the query's dtype). `window` > 0 replaces firsts (then null). */
void write_and_attend(const View &qv, const View (&kv)[2], const Tensor &keys, const Tensor &values,
                      const Tensor &token_blocks, const Tensor &token_offsets, const Tensor &tables,
                      const Tensor &lengths, const int64_t *firsts, int64_t window, double scale, const Tensor &out) {
    check_pools(keys, values);
    STD_TORCH_CHECK(kv[0].bf16 == kv[1].bf16, "paged attention: key and value must share a dtype");
    check_index(token_blocks, "token_blocks", 1);
    check_index(token_offsets, "token_offsets", 1);
    check_index(tables, "tables", 2);
    check_index(lengths, "lengths", 1);
    const int64_t heads = qv.heads, dim = qv.dim, kv_heads = keys.size(1), block = keys.size(2);
    const int64_t num_tokens = token_blocks.size(0), rows = tables.size(0);
    STD_TORCH_CHECK(kv[0].heads == kv_heads && kv[1].heads == kv_heads && kv[0].dim == dim && kv[1].dim == dim &&
                    keys.size(3) == dim && heads % kv_heads == 0,
                    "paged attention: query, key, value and pool head sizes disagree");
    STD_TORCH_CHECK(kv[0].tokens >= num_tokens && kv[1].tokens >= num_tokens && token_offsets.size(0) == num_tokens &&
                    qv.tokens >= rows && lengths.size(0) == rows && out.numel() == rows * heads * dim,
                    "paged attention: token and row counts disagree");
    const int pool_bf16 = is_bf16(keys), out_bf16 = qv.bf16;
    void *pools[2] = {keys.data_ptr(), values.data_ptr()};
    const int64_t *blocks_at = ints(token_blocks), *offsets_at = ints(token_offsets);
    std::vector<float> q32(static_cast<size_t>(rows * heads * dim + 1));
    std::vector<float> out_buffer(out_bf16 ? static_cast<size_t>(rows * heads * dim + 1) : 0);
    float *out32 = out_bf16 ? out_buffer.data() : static_cast<float *>(out.data_ptr());
    const int threads = num_threads();
    const int64_t group = heads / kv_heads, parts = parts_for(rows, kv_heads, group, threads);
    const int64_t units = rows * kv_heads * parts, writes = num_tokens * kv_heads;
    Job base{q32.data(), pools[0], pools[1], ints(tables), ints(lengths), firsts,
             window, out32, rows, heads, kv_heads, block, dim, tables.size(1), static_cast<float>(scale),
             pool_bf16, parts, 0, 0};
    void *out_data = out.data_ptr();
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int64_t w = 0; w < writes; w++) {  /* token t's K/V head h into the pool */
            int64_t t = w / kv_heads, h = w % kv_heads;
            int64_t at = ((blocks_at[t] * kv_heads + h) * block + offsets_at[t]) * dim;
            for (int which = 0; which < 2; which++) {
                const View *src = &kv[which];
                int64_t from = h * src->head_stride + t * src->token_stride;
                if (src->bf16 == pool_bf16) {
                    size_t size = static_cast<size_t>(dim) * (pool_bf16 ? 2 : 4);
                    std::memcpy(static_cast<char *>(pools[which]) + at * (pool_bf16 ? 2 : 4),
                                static_cast<const char *>(src->data) + from * (src->bf16 ? 2 : 4), size);
                } else {
                    for (int64_t d = 0; d < dim; d++)
                        store_at(pools[which], at + d, load_at(src->data, from + d, src->bf16), pool_bf16);
                }
            }
        }
#pragma omp for schedule(static)
        for (int64_t u = 0; u < rows * heads; u++) {  /* the decode rows' queries as float32 */
            int64_t r = u / heads, h = u % heads;
            for (int64_t d = 0; d < dim; d++)
                q32[u * dim + d] = load_at(qv.data, h * qv.head_stride + r * qv.token_stride + d, qv.bf16);
        }
        /* the implicit barrier above: every write and query is in place before any row attends */
        int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
        Job j = base;
        j.begin = units * t / n;
        j.end = units * (t + 1) / n;
        run(j);
        if (out_bf16) {  /* this thread's units attend one contiguous range of (row, query head) */
            const int64_t end = first_head(j, j.end) * dim;
            for (int64_t x = first_head(j, j.begin) * dim; x < end; x++) store_at(out_data, x, out32[x], 1);
        }
    }
}

Tensor write_decode(const Tensor &query, const Tensor &key, const Tensor &value, const Tensor &keys,
                    const Tensor &values, const Tensor &token_blocks, const Tensor &token_offsets,
                    const Tensor &tables, const Tensor &lengths, const Tensor &firsts, double scale) {
    check_index(firsts, "firsts", 1);
    STD_TORCH_CHECK(firsts.size(0) == tables.size(0), "paged attention: one first position per row");
    const View qv = view_of(query, "query"), kv[2] = {view_of(key, "key"), view_of(value, "value")};
    Tensor out = empty_as(query, {tables.size(0), qv.heads, qv.dim});
    write_and_attend(qv, kv, keys, values, token_blocks, token_offsets, tables, lengths, ints(firsts), 0, scale, out);
    return out;
}

Tensor decode(const Tensor &query, const Tensor &keys, const Tensor &values, const Tensor &tables,
              const Tensor &lengths, const Tensor &firsts, double scale) {
    check_float(query, "query");
    check_pools(keys, values);
    STD_TORCH_CHECK(query.dim() == 3, "paged attention: query must be [rows, heads, dim]");
    check_index(tables, "tables", 2);
    check_index(lengths, "lengths", 1);
    check_index(firsts, "firsts", 1);
    const int64_t rows = query.size(0), heads = query.size(1), dim = query.size(2), kv_heads = keys.size(1);
    STD_TORCH_CHECK(keys.size(3) == dim && heads % kv_heads == 0 && tables.size(0) == rows &&
                    lengths.size(0) == rows && firsts.size(0) == rows,
                    "paged attention: query, pool and table sizes disagree");
    const Tensor q = torch::stable::contiguous(torch::stable::to(query, ScalarType::Float));
    Tensor out = empty_as(q, {rows, heads, dim});
    const int64_t group = heads / kv_heads, parts = parts_for(rows, kv_heads, group, num_threads());
    const int64_t units = rows * kv_heads * parts;
    const int threads = static_cast<int>(std::min<int64_t>(num_threads(), std::max<int64_t>(1, units)));
    Job base{static_cast<const float *>(q.data_ptr()), keys.data_ptr(), values.data_ptr(), ints(tables), ints(lengths),
             ints(firsts), 0, static_cast<float *>(out.data_ptr()), rows, heads, kv_heads, keys.size(2), dim,
             tables.size(1), static_cast<float>(scale), is_bf16(keys), parts, 0, 0};
#pragma omp parallel num_threads(threads)
    {
        int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
        Job j = base;
        j.begin = units * t / n;
        j.end = units * (t + 1) / n;
        run(j);
    }
    return torch::stable::to(out, query.scalar_type());
}

/* What a compiled one-token forward's layers read: published once a step by the runner's thread. */
struct Step {
    std::vector<Tensor> keys, values;  // the pool, one tensor a layer
    std::vector<Tensor> tensors;       // token_blocks, token_offsets, tables, lengths
    bool set = false;
};

thread_local Step step;

void set_step(std::vector<Tensor> keys, std::vector<Tensor> values, Tensor token_blocks, Tensor token_offsets,
              Tensor tables, Tensor lengths) {
    STD_TORCH_CHECK(keys.size() == values.size(), "paged attention: one key and one value pool a layer");
    step.keys = std::move(keys);
    step.values = std::move(values);
    step.tensors = {std::move(token_blocks), std::move(token_offsets), std::move(tables), std::move(lengths)};
    step.set = true;
}

void clear_step() { step = Step(); }

/* query [1, heads, tokens, dim], key/value [1, kv_heads, tokens, dim] (the model's strided views) ->
   [1, rows, heads, dim]: the layer's K/V written, its decode rows attended (window <= 0: none). */
Tensor step_attention(const Tensor &query, const Tensor &key, const Tensor &value, const Tensor &layer, double scale,
                      int64_t window) {
    STD_TORCH_CHECK(step.set, "paged attention: step_attention called with no step published (set_step)");
    STD_TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4,
                    "paged attention: step_attention takes [1, heads, tokens, dim] tensors");
    STD_TORCH_CHECK(layer.scalar_type() == ScalarType::Long && layer.numel() == 1 && layer.is_cpu(),
                    "paged attention: layer must be one int64 CPU value");
    const int64_t index = *ints(layer);
    STD_TORCH_CHECK(index >= 0 && index < static_cast<int64_t>(step.keys.size()), "paged attention: no layer ",
                    index);
    const Tensor &token_blocks = step.tensors[0], &token_offsets = step.tensors[1], &tables = step.tensors[2],
                 &lengths = step.tensors[3];
    STD_TORCH_CHECK(tables.size(0) == token_blocks.size(0),
                    "paged attention: step_attention serves steps of decode rows only");
    const View qv = view_of(query, "query"), kv[2] = {view_of(key, "key"), view_of(value, "value")};
    Tensor out = empty_as(query, {1, tables.size(0), qv.heads, qv.dim});
    write_and_attend(qv, kv, step.keys[index], step.values[index], token_blocks, token_offsets, tables, lengths,
                     nullptr, window > 0 ? window : 0, scale, out);
    return out;
}

}  // namespace

STABLE_TORCH_LIBRARY(decoda_paged, m) {
    m.def("write_decode(Tensor query, Tensor key, Tensor value, Tensor(a!) keys, Tensor(b!) values, "
          "Tensor token_blocks, Tensor token_offsets, Tensor tables, Tensor lengths, Tensor firsts, float scale) "
          "-> Tensor");
    m.def("decode(Tensor query, Tensor keys, Tensor values, Tensor tables, Tensor lengths, Tensor firsts, "
          "float scale) -> Tensor");
    m.def("set_step(Tensor[] keys, Tensor[] values, Tensor token_blocks, Tensor token_offsets, Tensor tables, "
          "Tensor lengths) -> ()");
    m.def("clear_step() -> ()");
    m.def("step_attention(Tensor query, Tensor key, Tensor value, Tensor layer, float scale, int window) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(decoda_paged, CPU, m) {
    m.impl("write_decode", TORCH_BOX(&write_decode));
    m.impl("decode", TORCH_BOX(&decode));
    m.impl("step_attention", TORCH_BOX(&step_attention));
}

/* set_step and clear_step hold and drop references: no device work, so one kernel for any backend. */
STABLE_TORCH_LIBRARY_IMPL(decoda_paged, CompositeExplicitAutograd, m) {
    m.impl("set_step", TORCH_BOX(&set_step));
    m.impl("clear_step", TORCH_BOX(&clear_step));
}
