#include "head.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include "ggml-cpu.h"
#include "sampling.h"

namespace ls {

namespace {

// The rows a row's argmax reads are scattered over the file's matrix and cold after a forward:
// each is asked for from memory this many candidates before it is read.
constexpr size_t PREFETCH_AHEAD = 8;
void prefetch_row(const void * row, size_t bytes) {
    for (size_t at = 0; at < bytes; at += 64) __builtin_prefetch(static_cast<const char *>(row) + at);
}
// From this many candidates the exact rows are split over the head's threads (from 1,024 or
// 2,048 a second thread was no faster at the mean and slower in the tail: a thread started per
// row costs what it saves).
constexpr size_t PARALLEL_FROM = 4096;

// Run f(first, last) over [0, n) in n_threads pieces.
template <typename F> void in_parallel(int64_t n, int32_t n_threads, F f) {
    std::vector<std::thread> threads;
    const int64_t step = (n + n_threads - 1) / n_threads;
    for (int64_t a = step; a < n; a += step) threads.emplace_back(f, a, std::min(n, a + step));
    f(int64_t(0), std::min(n, step));
    for (auto & t : threads) t.join();
}

// x as a vec_dot type quantizes it, dequantized: ggml's Q8_K has no to_float of its own.
struct block_q8_K { float d; int8_t qs[256]; int16_t bsums[16]; };  // ggml-common.h's
static_assert(sizeof(ggml_fp16_t) == 2, "ggml's half");

void dequantized(ggml_type type, const uint8_t * q, int64_t n, float * out) {
    if (type != GGML_TYPE_Q8_K) {
        ggml_get_type_traits(type)->to_float(q, out, n);
        return;
    }
    const auto * blocks = reinterpret_cast<const block_q8_K *>(q);
    for (int64_t i = 0; i < n; ++i) out[i] = blocks[i / 256].d * blocks[i / 256].qs[i % 256];
}

// How far another of ggml's quantizations of x to Q8_0 or Q8_K (blocks of `block`) could land
// from the one computed here (the copy's matmul quantizes a batch of four rows with a function
// of its own): each rounds x / d to the nearest integer (d = the block's largest magnitude /
// 127), and only a value halfway between two integers may go either way, by one step d.
double halfway_radius(const float * x, int64_t n, int64_t block) {
    double sum = 0.0;
    for (int64_t b = 0; b + block <= n; b += block) {
        float amax = 0.0f;
        for (int64_t i = b; i < b + block; ++i) amax = std::max(amax, std::fabs(x[i]));
        const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        for (int64_t i = b; i < b + block; ++i) {
            const float v = x[i] * id;
            if (std::fabs(v - std::floor(v) - 0.5f) < 1e-3f) sum += 1.002 * double(d) * d;
        }
    }
    return std::sqrt(sum);
}

// ggml-common.h's Q4_K block: 8 groups of 32 values, each d * scale * q - dmin * min, q in 0..15,
// the groups' 6-bit scales and mins packed in 12 bytes.
struct block_q4_K { ggml_fp16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; };

// A row of Q4_K, quickly: each group's range from its least to its largest value (0 at least),
// where ggml's own quantizer searches twenty scales a group (15 s for a 1.5B's output layer;
// the head builds in about a second with this). The copy need not be the closest: the bound
// takes its error as it is (on a 1.5B's rows 116 rows computed a row, against 75 with ggml's).
void quantize_q4_K(const float * x, block_q4_K * y, int64_t n) {
    for (int64_t b = 0; b < n / 256; ++b, x += 256) {
        float scale[8], lift[8], max_scale = 0.0f, max_lift = 0.0f;  // a group: scale * q - lift
        for (int j = 0; j < 8; ++j) {
            float lo = 0.0f, hi = x[32 * j];
            for (int l = 0; l < 32; ++l) { lo = std::min(lo, x[32 * j + l]); hi = std::max(hi, x[32 * j + l]); }
            scale[j] = std::max(0.0f, hi - lo) / 15.0f;
            lift[j] = -lo;
            max_scale = std::max(max_scale, scale[j]);
            max_lift = std::max(max_lift, lift[j]);
        }
        const float to_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f, to_lift = max_lift > 0 ? 63.0f / max_lift : 0.0f;
        block_q4_K & out = y[b];
        std::memset(&out, 0, sizeof out);
        uint8_t sc[8], mn[8];
        for (int j = 0; j < 8; ++j) {
            sc[j] = uint8_t(std::min(63L, std::lround(to_scale * scale[j])));
            mn[j] = uint8_t(std::min(63L, std::lround(to_lift * lift[j])));
            if (j < 4) {
                out.scales[j] = sc[j];
                out.scales[j + 4] = mn[j];
            } else {
                out.scales[j + 4] = (sc[j] & 0xF) | ((mn[j] & 0xF) << 4);
                out.scales[j - 4] |= (sc[j] >> 4) << 6;
                out.scales[j] |= (mn[j] >> 4) << 6;
            }
        }
        out.d = ggml_fp32_to_fp16(max_scale / 63.0f);
        out.dmin = ggml_fp32_to_fp16(max_lift / 63.0f);
        const float d = ggml_fp16_to_fp32(out.d), dmin = ggml_fp16_to_fp32(out.dmin);
        uint8_t q[256];
        for (int j = 0; j < 8; ++j) {
            const float step = d * sc[j], low = dmin * mn[j];
            for (int l = 0; l < 32; ++l) {
                q[32 * j + l] = step > 0 ? uint8_t(std::clamp(std::lround((x[32 * j + l] + low) / step), 0L, 15L)) : 0;
            }
        }
        for (int j = 0; j < 256; j += 64) {
            for (int l = 0; l < 32; ++l) out.qs[j / 2 + l] = uint8_t(q[j + l] | (q[j + l + 32] << 4));
        }
    }
}

// w as a 4-bit copy of `type` holds it: quantized into q (a row of that type), then back into a.
void copied(ggml_type type, const float * w, uint8_t * q, float * a, int64_t n) {
    if (type == GGML_TYPE_Q4_K) quantize_q4_K(w, reinterpret_cast<block_q4_K *>(q), n);
    else ggml_quantize_chunk(type, w, q, 0, 1, n, nullptr);
    ggml_get_type_traits(type)->to_float(q, a, n);
}

// The copy's type: a 4-bit one whose matmul quantizes h as the exact type's vec_dot does (Q4_K
// for Q8_K, Q4_0 for Q8_0), so that the approximate and exact logits see the same h and differ
// only by the weights (a third of the candidates Q4_0 leaves a Q6_K matrix on a 1.5B's rows);
// else Q4_0.
ggml_type copy_type_for(ggml_type type, ggml_type dot_type, int64_t n_embd) {
    const ggml_type matched = dot_type == GGML_TYPE_Q8_K ? GGML_TYPE_Q4_K : GGML_TYPE_Q4_0;
    if (matched != type && n_embd % ggml_blck_size(matched) == 0) return matched;
    return GGML_TYPE_Q4_0;
}

double distance(const float * a, const float * b, int64_t n) {  // b null: a's norm
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        const double d = double(a[i]) - (b ? b[i] : 0.0f);
        sum += d * d;
    }
    return std::sqrt(sum);
}

double since_ms(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// ggml's CPU buffer type that repacks a Q4_0 matrix for this CPU's wide kernels, if any
// takes a matmul of `w` (as llama.cpp picks a weight's buffer type).
ggml_backend_buffer_type_t repacked_type(ggml_backend_t backend, ggml_tensor * w, ggml_context * ctx) {
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    auto get_extra = (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(
        ggml_backend_dev_backend_reg(dev), "ggml_backend_dev_get_extra_bufts");
    if (!get_extra) return nullptr;
    ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, w->ne[0], 1);
    ggml_tensor * op = ggml_mul_mat(ctx, w, x);
    for (ggml_backend_buffer_type_t * t = get_extra(dev); t && *t; ++t) {
        ggml_backend_buffer_t probe = ggml_backend_buft_alloc_buffer(*t, 0);
        w->buffer = probe;
        const bool ok = ggml_backend_dev_supports_op(dev, op);
        w->buffer = nullptr;
        ggml_backend_buffer_free(probe);
        if (ok) return *t;
    }
    return nullptr;
}

}  // namespace

exact_head::exact_head(const uint8_t * weights, ggml_type type, int64_t n_embd, int64_t n_vocab, int32_t n_threads,
                       int32_t copy_type)
    : weights_(weights), type_(type), n_embd_(n_embd), n_vocab_(n_vocab) {
    const auto * cpu = ggml_get_type_traits_cpu(type);
    const auto * traits = ggml_get_type_traits(type);
    dot_type_ = cpu->vec_dot_type;
    copy_type_ = copy_type < 0 ? copy_type_for(type, dot_type_, n_embd) : ggml_type(copy_type);
    if (copy_type_ != GGML_TYPE_Q4_0 && copy_type_ != GGML_TYPE_Q4_K) {
        throw std::invalid_argument("the copy is Q4_0 or Q4_K");
    }
    if (copy_type_ == GGML_TYPE_Q4_K && ggml_type_size(GGML_TYPE_Q4_K) != sizeof(block_q4_K)) {
        throw std::invalid_argument("this ggml's Q4_K block is not the one the head writes");  // quantize_q4_K
    }
    copy_dot_type_ = ggml_get_type_traits_cpu(copy_type_)->vec_dot_type;
    if (!cpu->vec_dot || cpu->nrows != 1 || !traits->to_float ||
        (dot_type_ != GGML_TYPE_Q8_K && dot_type_ != GGML_TYPE_Q8_0) || type == copy_type_) {
        throw std::invalid_argument(std::string("no exact head for an output layer of type ") + ggml_type_name(type));
    }
    if (n_embd % ggml_blck_size(dot_type_) || n_embd % ggml_blck_size(copy_type_) || n_vocab <= 0) {
        throw std::invalid_argument("no exact head for rows of this width");
    }
    row_bytes_ = ggml_row_size(type, n_embd);
    n_threads = std::max(1, n_threads);
    n_threads_ = n_threads;
    backend_ = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(backend_, n_threads);
    weight_ctx_ = ggml_init({ggml_tensor_overhead() * 4, nullptr, true});
    copy_ = ggml_new_tensor_2d(weight_ctx_, copy_type_, n_embd, n_vocab);
    ggml_backend_buffer_type_t buft = repacked_type(backend_, copy_, weight_ctx_);
    if (!buft) {
        release();
        throw std::invalid_argument("no repacked 4-bit matmul on this CPU: the head would not pay");
    }

    build_copy(buft);
    time_rows();
}

// f(i, w, a) for every vocabulary row i on every thread: w the file's row as floats, a its
// 4-bit copy's (quantized into copy's row i, or a scratch row where copy is null).
template <typename F> void exact_head::each_row(uint8_t * copy, F f) const {
    const int64_t n_embd = n_embd_;
    const size_t copy_row = ggml_row_size(copy_type_, n_embd);
    const auto to_float = ggml_get_type_traits(type_)->to_float;
    in_parallel(n_vocab_, n_threads_, [&](int64_t first, int64_t last) {
        std::vector<float> w(n_embd), a(n_embd);
        std::vector<uint8_t> scratch(copy ? 0 : copy_row);
        for (int64_t i = first; i < last; ++i) {
            to_float(weights_ + i * row_bytes_, w.data(), n_embd);
            copied(copy_type_, w.data(), copy ? copy + i * copy_row : scratch.data(), a.data(), n_embd);
            f(i, w.data(), a.data());
        }
    });
}

// The copy, and each row's norm and distance from it, in double.
void exact_head::build_copy(ggml_backend_buffer_type_t buft) {
    const int64_t n_embd = n_embd_, n_vocab = n_vocab_;
    const size_t copy_row = ggml_row_size(copy_type_, n_embd);
    std::vector<uint8_t> copy(copy_row * n_vocab);
    norm_.resize(n_vocab);
    err_.resize(n_vocab);
    each_row(copy.data(), [&](int64_t i, const float * w, const float * a) {
        double nw = 0.0, ne = 0.0;
        for (int64_t k = 0; k < n_embd; ++k) {
            nw += double(w[k]) * w[k];
            ne += (double(w[k]) - a[k]) * (double(w[k]) - a[k]);
        }
        // rounded up, so the bound stays one
        norm_[i] = float(std::sqrt(nw) * (1.0 + 1e-6));
        err_[i] = float(std::sqrt(ne) * (1.0 + 1e-6));
    });
    weight_buf_ = ggml_backend_alloc_ctx_tensors_from_buft(weight_ctx_, buft);
    ggml_backend_tensor_set(copy_, copy.data(), 0, copy.size());  // repacks it
    copy = {};

}

// What one row costs each way: llama.cpp's matmul over the file's matrix, and this head on a
// row whose argmax is clear (a vocabulary row itself, scaled as hidden states are).
void exact_head::time_rows() {
    const int64_t n_embd = n_embd_, n_vocab = n_vocab_;
    const uint8_t * weights = weights_;
    const auto to_float = ggml_get_type_traits(type_)->to_float;
    std::vector<float> h(n_embd);
    to_float(weights + (n_vocab / 2) * row_bytes_, h.data(), n_embd);
    const float scale = 10.0f / std::max(1e-6f, norm_[n_vocab / 2]);
    for (float & x : h) x *= scale * std::sqrt(float(n_embd));
    ggml_context * ctx = ggml_init({ggml_tensor_overhead() * 4 + ggml_graph_overhead(), nullptr, true});
    ggml_tensor * w = ggml_new_tensor_2d(ctx, type_, n_embd, n_vocab);
    ggml_backend_buffer_t wb = ggml_backend_cpu_buffer_from_ptr(const_cast<uint8_t *>(weights), row_bytes_ * n_vocab);
    ggml_backend_tensor_alloc(wb, w, const_cast<uint8_t *>(weights));
    ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_embd, 1);
    ggml_tensor * y = ggml_mul_mat(ctx, w, x);
    ggml_backend_buffer_t iob = ggml_backend_buft_alloc_buffer(ggml_backend_cpu_buffer_type(),
                                                               (n_embd + n_vocab) * sizeof(float));
    float * io = static_cast<float *>(ggml_backend_buffer_get_base(iob));
    ggml_backend_tensor_alloc(iob, x, io);
    ggml_backend_tensor_alloc(iob, y, io + n_embd);
    std::memcpy(io, h.data(), n_embd * sizeof(float));
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    full_ms = approx_ms = 1e30;
    int32_t token = 0;
    for (int rep = 0; rep < 4; ++rep) {
        auto t0 = std::chrono::steady_clock::now();
        ggml_backend_graph_compute(backend_, gf);
        full_ms = std::min(full_ms, since_ms(t0));
        t0 = std::chrono::steady_clock::now();
        argmax(h.data(), 1, &token);
        approx_ms = std::min(approx_ms, since_ms(t0));
    }
    rows = rescored = 0;
    ggml_backend_buffer_free(iob);
    ggml_backend_buffer_free(wb);
    ggml_free(ctx);
}

exact_head::~exact_head() { release(); }

void exact_head::release() {
    if (graph_ctx_) ggml_free(graph_ctx_);
    if (weight_buf_) ggml_backend_buffer_free(weight_buf_);
    if (weight_ctx_) ggml_free(weight_ctx_);
    if (backend_) ggml_backend_free(backend_);
    weight_buf_ = nullptr;
    graph_ctx_ = weight_ctx_ = nullptr;
    backend_ = nullptr;
}

size_t exact_head::extra_bytes() const {
    return ggml_nbytes(copy_) + (norm_.size() + err_.size() + focus_err_.size() + rest_err_.size()) * sizeof(float);
}

void exact_head::focus(const float * hidden, int64_t n, int32_t dims) {
    const int64_t n_embd = n_embd_, F = dims;
    if (!focus_dims_.empty() || n <= 0 || F <= 0 || F % LANES || n_embd <= F) return;
    std::vector<double> energy(size_t(n_embd), 0.0);
    for (int64_t r = 0; r < n; ++r) {
        for (int64_t k = 0; k < n_embd; ++k) energy[k] += double(hidden[r * n_embd + k]) * hidden[r * n_embd + k];
    }
    std::vector<int32_t> chosen(static_cast<size_t>(n_embd));
    std::iota(chosen.begin(), chosen.end(), 0);
    std::partial_sort(chosen.begin(), chosen.begin() + F, chosen.end(), [&](int32_t a, int32_t b) { return energy[a] > energy[b]; });
    chosen.resize(size_t(F));
    std::sort(chosen.begin(), chosen.end());
    std::vector<char> in_focus(size_t(n_embd), 0);
    for (int32_t d : chosen) in_focus[d] = 1;
    std::vector<float> focus_err(size_t(n_vocab_ * F)), rest_err(static_cast<size_t>(n_vocab_));
    each_row(nullptr, [&](int64_t i, const float * w, const float * a) {
        double rest = 0.0;
        for (int64_t k = 0; k < n_embd; ++k) {
            if (!in_focus[k]) rest += (double(w[k]) - a[k]) * (double(w[k]) - a[k]);
        }
        for (int64_t j = 0; j < F; ++j) focus_err[i * F + j] = w[chosen[j]] - a[chosen[j]];
        rest_err[i] = float(std::sqrt(rest) * (1.0 + 1e-6));  // rounded up, so the bound stays one
    });
    focus_dims_ = std::move(chosen);
    focus_err_ = std::move(focus_err);
    rest_err_ = std::move(rest_err);
}

// Of the candidates, those a second bound still lets reach `reach`: of the error term
// (W_i - A_i) . h0, the focus dimensions' part is computed and the rest bounded by its norms,
// |E_i . h0| <= |E_i,S . h0_S| + |E_i,rest| |h0_rest|, and another rounding of h0 (halfway)
// moves it by at most |E_i| halfway. The focus part is summed in float, LANES at a time (which
// the compiler vectorizes; a double sum it keeps in order): a float sum of F products is off by
// at most (F + 1) 2^-24 sum |e_j h_j| <= (F + 1) 2^-24 |E_i| |h0|, and the float difference
// E_i,S by 2^-24 of itself: (F + 3) 2^-24 |E_i| |h0| is added to the bound (norm_h0 >= |h0|).
std::vector<int32_t> exact_head::narrowed(const float * approx, const std::vector<int32_t> & candidates,
                                          const std::vector<float> & h0, double norm_h0, double halfway,
                                          double slack, float alpha, float reach) const {
    const int64_t F = int64_t(focus_dims_.size());
    std::vector<float> h_focus(static_cast<size_t>(F));
    double rest = 0.0;
    for (int64_t k = 0, j = 0; k < n_embd_; ++k) {
        if (j < F && focus_dims_[j] == k) h_focus[j++] = h0[k];
        else rest += double(h0[k]) * h0[k];
    }
    const double rounding = double(F + 3) * std::ldexp(1.0, -24) * norm_h0;
    const double beta_rest = (std::sqrt(rest) + slack) * (1.0 + 1e-5);
    const double gamma = (halfway + slack + rounding) * (1.0 + 1e-5);
    std::vector<int32_t> kept;
    for (size_t k = 0; k < candidates.size(); ++k) {
        const int32_t i = candidates[k];
        if (k + PREFETCH_AHEAD < candidates.size()) {
            prefetch_row(focus_err_.data() + int64_t(candidates[k + PREFETCH_AHEAD]) * F, F * sizeof(float));
        }
        const float * e = focus_err_.data() + int64_t(i) * F;
        float lanes[LANES] = {};
        for (int64_t j = 0; j < F; j += LANES) {
            for (int l = 0; l < LANES; ++l) lanes[l] += e[j + l] * h_focus[size_t(j + l)];
        }
        double s = 0.0;
        for (float v : lanes) s += v;
        const double bound = double(approx[i]) + double(norm_[i]) * alpha + double(err_[i]) * gamma +
                             double(rest_err_[i]) * beta_rest + std::fabs(s) * (1.0 + 1e-5);
        if (bound >= reach) kept.push_back(i);
    }
    return kept;
}

head_batch::~head_batch() {
    if (buffer) ggml_backend_buffer_free(buffer);
}

void exact_head::approximate(head_batch & rows, const float * hidden, int64_t n) {
    if (n <= 0) return;
    const int64_t total = rows.n + n;
    if (total > rows.cap) {  // grown (keeping the rows it holds: a forward of several ubatches)
        const int64_t cap = std::max<int64_t>(total, 2 * rows.cap);
        ggml_backend_buffer_t buffer = ggml_backend_buft_alloc_buffer(ggml_backend_cpu_buffer_type(),
                                                                      (n_embd_ + n_vocab_) * cap * sizeof(float));
        auto * logits = static_cast<float *>(ggml_backend_buffer_get_base(buffer));
        if (rows.n) {
            std::memcpy(logits, rows.logits, rows.n * n_vocab_ * sizeof(float));
            std::memcpy(logits + n_vocab_ * cap, rows.hidden, rows.n * n_embd_ * sizeof(float));
        }
        if (rows.buffer) ggml_backend_buffer_free(rows.buffer);
        rows.buffer = buffer;
        rows.cap = cap;
        rows.logits = logits;
        rows.hidden = logits + n_vocab_ * cap;
    }
    float * in = rows.hidden + rows.n * n_embd_;
    std::memcpy(in, hidden, n * n_embd_ * sizeof(float));
    if (!graph_ctx_) graph_ctx_ = ggml_init({ggml_tensor_overhead() * 4 + ggml_graph_overhead(), nullptr, true});
    ggml_reset(graph_ctx_);
    ggml_tensor * x = ggml_new_tensor_2d(graph_ctx_, GGML_TYPE_F32, n_embd_, n);
    ggml_tensor * y = ggml_mul_mat(graph_ctx_, copy_, x);
    ggml_backend_tensor_alloc(rows.buffer, x, in);
    ggml_backend_tensor_alloc(rows.buffer, y, rows.logits + rows.n * n_vocab_);
    ggml_cgraph * gf = ggml_new_graph(graph_ctx_);
    ggml_build_forward_expand(gf, y);
    ggml_backend_graph_compute(backend_, gf);
    rows.n = total;
    rows.tokens.resize(size_t(total), -2);
}

int32_t exact_head::token(head_batch & rows, int64_t j) {
    if (j < 0 || j >= rows.n) return -1;
    if (rows.tokens[j] == -2) {
        const auto t0 = std::chrono::steady_clock::now();
        rows.tokens[j] = decide(rows.hidden + j * n_embd_, rows.logits + j * n_vocab_);
        decide_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ++this->rows;
    }
    return rows.tokens[j];
}

void exact_head::argmax(const float * hidden, int64_t n, int32_t * out) {
    own_.n = 0;
    own_.tokens.clear();
    approximate(own_, hidden, n);
    for (int64_t r = 0; r < n; ++r) out[r] = token(own_, r);
}

// A row's exact argmax from its approximate logits. The exact logit of row i is W_i . hq (hq:
// h as the exact type's vec_dot quantizes it, the very function llama.cpp's matmul calls), the
// approximate one A_i . h0 (h0: h as the copy's matmul quantizes it: hq itself where the copy's
// vec_dot type is the exact type's), and
//   W_i . hq - A_i . h0 = W_i . (hq - h0) + (W_i - A_i) . h0,
// so they differ by at most |W_i| |hq - h0| + |W_i - A_i| |h0| (each norm computed here, h0's
// widened by where another rounding of the copy's quantization could differ), plus float
// rounding, far below the 1e-4 relative slack added. Only rows whose bound reaches the exact
// logit of the approximate argmax can be the argmax: those are computed exactly, the lowest id
// winning a tie.
int32_t exact_head::decide(const float * h, const float * approx) {
    std::vector<float> hq(n_embd_), h0(n_embd_);
    std::vector<uint8_t> quantized(ggml_row_size(dot_type_, n_embd_));
    ggml_get_type_traits_cpu(dot_type_)->from_float(h, quantized.data(), n_embd_);
    dequantized(dot_type_, quantized.data(), n_embd_, hq.data());
    if (copy_dot_type_ == dot_type_) {
        h0 = hq;
    } else {
        std::vector<uint8_t> q0(ggml_row_size(copy_dot_type_, n_embd_));
        ggml_get_type_traits_cpu(copy_dot_type_)->from_float(h, q0.data(), n_embd_);
        dequantized(copy_dot_type_, q0.data(), n_embd_, h0.data());
    }
    const double halfway = halfway_radius(h, n_embd_, ggml_blck_size(copy_dot_type_));
    const double apart = distance(hq.data(), h0.data(), n_embd_) + halfway;
    const double norm_h0 = distance(h0.data(), nullptr, n_embd_) + halfway;
    if (!std::isfinite(apart) || !std::isfinite(norm_h0)) return -1;
    const double slack = 1e-4 * (norm_h0 + apart);
    const float alpha = float((apart + slack) * (1.0 + 1e-5));
    const float beta = float((norm_h0 + slack) * (1.0 + 1e-5));
    const auto vec_dot = ggml_get_type_traits_cpu(type_)->vec_dot;
    auto exact = [&](int64_t i) {
        float v;
        vec_dot(int(n_embd_), &v, 0, weights_ + i * row_bytes_, 0, quantized.data(), 0, 1);
        return v;
    };
    const int32_t first = ls::argmax(approx, int32_t(n_vocab_));
    const float first_logit = exact(first);
    if (!std::isfinite(first_logit)) return -1;
    const float reach = first_logit - 1e-6f;
    std::vector<int32_t> candidates;
    auto reaches = [&](int64_t i) { return approx[i] + norm_[i] * alpha + err_[i] * beta >= reach; };
    // A few hundred of 152k rows pass: each run of LANES rows is asked at once (a branch-free
    // test the compiler vectorizes), and its rows one by one only where one passes.
    int64_t i = 0;
    for (; i + LANES <= n_vocab_; i += LANES) {
        bool any = false;
        for (int l = 0; l < LANES; ++l) any |= reaches(i + l);
        if (!any) continue;
        for (int64_t k = i; k < i + LANES; ++k) {
            if (reaches(k) && k != first) candidates.push_back(int32_t(k));
        }
    }
    for (; i < n_vocab_; ++i) {
        if (reaches(i) && i != first) candidates.push_back(int32_t(i));
    }
    if (!focus_err_.empty()) candidates = narrowed(approx, candidates, h0, norm_h0, halfway, slack, alpha, reach);
    rescored += int64_t(candidates.size());
    // The candidates computed exactly: on every thread where they are many (an unsure row's
    // can be a tenth of the vocabulary), each thread's best then the best of those.
    const int32_t n_parts = candidates.size() > PARALLEL_FROM ? n_threads_ : 1;
    std::vector<std::pair<float, int32_t>> best(size_t(n_parts), {first_logit, first});
    const int64_t part = std::max<int64_t>(1, (int64_t(candidates.size()) + n_parts - 1) / n_parts);  // in_parallel's
    in_parallel(int64_t(candidates.size()), n_parts, [&](int64_t a, int64_t b) {
        auto & mine = best[size_t(a / part)];
        for (int64_t k = a; k < b; ++k) {
            const int32_t i = candidates[size_t(k)];
            if (k + int64_t(PREFETCH_AHEAD) < b) prefetch_row(weights_ + candidates[size_t(k) + PREFETCH_AHEAD] * row_bytes_, row_bytes_);
            const float v = exact(i);
            if (v > mine.first || (v == mine.first && i < mine.second)) mine = {v, i};
        }
    });
    auto winner = best[0];
    for (const auto & b : best) {
        if (b.first > winner.first || (b.first == winner.first && b.second < winner.second)) winner = b;
    }
    return winner.second;
}

void exact_head::exact_logits(const float * hidden, const int32_t * ids, int64_t n, float * out) const {
    std::vector<uint8_t> q(ggml_row_size(dot_type_, n_embd_));
    ggml_get_type_traits_cpu(dot_type_)->from_float(hidden, q.data(), n_embd_);
    const auto vec_dot = ggml_get_type_traits_cpu(type_)->vec_dot;
    for (int64_t j = 0; j < n; ++j) {
        vec_dot(int(n_embd_), out + j, 0, weights_ + int64_t(ids[j]) * row_bytes_, 0, q.data(), 0, 1);
    }
}

// --- the hook ------------------------------------------------------------------------------

namespace {
std::mutex hooks_mutex;
std::unordered_map<const llama_context *, head_hook *> hooks;
}  // namespace

bool head_hook::eval(ggml_tensor * t, bool ask, void * self) {
    auto * hook = static_cast<head_hook *>(self);
    if ((!hook->on || hook->whole_layer_) && !hook->probing_) return !ask;  // nothing asked: the graph runs whole
    // The output layer's input: llama.cpp names it result_norm, and result_embd_pooled where
    // the context returns hidden states (the same tensor, unpooled); bind() checks it is.
    if (ask) return std::strcmp(t->name, "result_norm") == 0 || std::strcmp(t->name, "result_embd_pooled") == 0;
    const int64_t n = t->ne[1];
    if (t->type != GGML_TYPE_F32 || t->ne[0] != hook->head_.n_embd() || !ggml_is_contiguous(t) || !t->data) {
        hook->failed_ = true;  // its rows read -1: the caller decodes them again on the whole layer
        return true;
    }
    const float * rows = static_cast<const float *>(t->data);
    if (hook->probing_) {
        hook->probe_.insert(hook->probe_.end(), rows, rows + n * t->ne[0]);
        return true;
    }
    if (n >= head_hook::WHOLE_LAYER_ROWS || hook->whole_layer_) {  // llama.cpp's layer: its logits are read
        hook->failed_ = hook->failed_ || hook->rows_.n > 0;  // (never: one ubatch holds a tree)
        hook->whole_layer_ = true;
        return true;
    }
    hook->head_.approximate(hook->rows_, rows, n);
    return false;  // the rest of the graph is the output layer: skipped
}

void head_hook::begin(int32_t n_tokens, const int8_t * outputs) {
    output_of_row_.assign(size_t(std::max(0, n_tokens)), -1);
    int32_t j = 0;
    for (int32_t i = 0; i < n_tokens; ++i) {
        if (outputs ? outputs[i] != 0 : i == n_tokens - 1) output_of_row_[i] = j++;
    }
    rows_.n = 0;
    rows_.tokens.clear();
    failed_ = whole_layer_ = false;
}

llama_token head_hook::token(int32_t row) {
    const int32_t n = int32_t(output_of_row_.size());
    if (row < 0) row += n;
    if (failed_ || row < 0 || row >= n) return -1;
    if (whole_layer_) {
        const float * logits = llama_get_logits_ith(ctx_, row);
        return logits ? ls::argmax(logits, llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(ctx_)))) : -1;
    }
    // A context that returns hidden states outputs every row, whatever the batch asked for
    // (llama.cpp's rule); else the rows asked for, in order.
    return head_.token(rows_, rows_.n == n ? row : output_of_row_[row]);
}

head_hook * head_hook::of(llama_context * ctx) {
    std::lock_guard<std::mutex> lock(hooks_mutex);
    auto it = hooks.find(ctx);
    return it != hooks.end() && it->second->on ? it->second : nullptr;
}

bool head_hook::bind(llama_context * ctx) {
    unbind();
    const llama_vocab * vocab = llama_model_get_vocab(llama_get_model(ctx));
    const int32_t n_vocab = llama_vocab_n_tokens(vocab), n_rows = 4;
    llama_batch batch = llama_batch_init(n_rows, 0, 1);
    for (int32_t i = 0; i < n_rows; ++i) {
        batch.token[i] = (i * 7919) % n_vocab;
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = n_rows;
    probe_.clear();
    probing_ = true;
    const int32_t status = llama_decode(ctx, batch);
    probing_ = false;
    llama_batch_free(batch);
    const int64_t n_embd = head_.n_embd();
    bool ok = status == 0 && int64_t(probe_.size()) == n_rows * n_embd;
    if (ok) head_.focus(probe_.data(), n_rows);
    for (int32_t r = 0; ok && r < n_rows; ++r) {
        const float * logits = llama_get_logits_ith(ctx, r);
        const float * h = probe_.data() + r * n_embd;
        int32_t mine = -1;
        head_.argmax(h, 1, &mine);
        const int32_t ids[3] = {ls::argmax(logits, n_vocab), 0, n_vocab - 1};
        float values[3];
        head_.exact_logits(h, ids, 3, values);
        ok = logits && mine == ids[0];
        for (int k = 0; ok && k < 3; ++k) ok = std::memcmp(&values[k], &logits[ids[k]], sizeof(float)) == 0;
    }
    llama_memory_clear(llama_get_memory(ctx), true);
    probe_ = {};
    head_.rows = head_.rescored = 0;
    if (ok) {
        std::lock_guard<std::mutex> lock(hooks_mutex);
        hooks[ctx] = this;
        ctx_ = ctx;
    }
    return ok;
}

void head_hook::unbind() {
    on = false;
    if (!ctx_) return;
    std::lock_guard<std::mutex> lock(hooks_mutex);
    hooks.erase(ctx_);
    ctx_ = nullptr;
}

}  // namespace ls
