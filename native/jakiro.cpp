#include "jakiro.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <functional>
#include <numeric>
#include <memory>
#include <stdexcept>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "ggml.h"
#include "gguf.h"
#include "rpc.h"

namespace ls {

namespace {

constexpr int64_t BANK_ROWS = 1024;  // f_moe rows one draft tree may keep: nodes expanded, and the root

struct gguf_file {
    std::string path;
    gguf_context_ptr g;
    ggml_context_ptr meta;  // tensor descriptions only (no data)

    explicit gguf_file(const std::string & p) : path(p) {
        ggml_context * m = nullptr;
        gguf_init_params params{/*no_alloc=*/true, /*ctx=*/&m};
        g.reset(gguf_init_from_file(p.c_str(), params));
        meta.reset(m);
        if (!g) throw std::runtime_error("cannot read GGUF file: " + p);
    }
    // The key's id, checked to hold `type`: ggml aborts the process on a mistyped read.
    int64_t key(const std::string & k, gguf_type type) const {
        const int64_t id = gguf_find_key(g.get(), k.c_str());
        if (id < 0) throw std::runtime_error(path + ": missing metadata " + k);
        if (gguf_get_kv_type(g.get(), id) != type) {
            throw std::runtime_error(path + ": metadata " + k + " is a " +
                                     gguf_type_name(gguf_get_kv_type(g.get(), id)) + ", not a " +
                                     gguf_type_name(type));
        }
        return id;
    }
    uint32_t u32(const std::string & k) const { return gguf_get_val_u32(g.get(), key(k, GGUF_TYPE_UINT32)); }
    double f64(const std::string & k) const { return gguf_get_val_f64(g.get(), key(k, GGUF_TYPE_FLOAT64)); }
    std::string str(const std::string & k) const { return gguf_get_val_str(g.get(), key(k, GGUF_TYPE_STRING)); }
    ggml_tensor * tensor(const std::string & name) const {
        ggml_tensor * t = ggml_get_tensor(meta.get(), name.c_str());
        if (!t) throw std::runtime_error(path + ": missing tensor " + name);
        return t;
    }
    // Read `size` bytes of tensor `name` starting `offset` bytes into its data.
    void read(const std::string & name, size_t offset, void * dst, size_t size) const {
        const int64_t id = gguf_find_tensor(g.get(), name.c_str());
        std::unique_ptr<FILE, int (*)(FILE *)> f(std::fopen(path.c_str(), "rb"), std::fclose);
        const size_t at = gguf_get_data_offset(g.get()) + gguf_get_tensor_offset(g.get(), id) + offset;
        if (!f || std::fseek(f.get(), long(at), SEEK_SET) != 0 ||
            std::fread(dst, 1, size, f.get()) != size) {
            throw std::runtime_error("cannot read tensor " + name + " from " + path);
        }
    }
};

ggml_tensor * like(ggml_context * ctx, const ggml_tensor * t, const std::string & name) {
    ggml_tensor * out = ggml_new_tensor(ctx, t->type, ggml_n_dims(t), t->ne);
    ggml_set_name(out, name.c_str());
    return out;
}

void upload(const gguf_file & file, const std::string & name, ggml_tensor * dst) {
    std::vector<uint8_t> buf(ggml_nbytes(dst));
    file.read(name, 0, buf.data(), buf.size());
    ggml_backend_tensor_set(dst, buf.data(), 0, buf.size());
}

void set_threads(ggml_backend_t backend, int32_t n_threads) {
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    ggml_backend_reg_t reg = dev ? ggml_backend_dev_backend_reg(dev) : nullptr;
    auto fn = reg ? (ggml_backend_set_n_threads_t) ggml_backend_reg_get_proc_address(
                        reg, "ggml_backend_set_n_threads")
                  : nullptr;
    if (fn && n_threads > 0) fn(backend, n_threads);
}

}  // namespace

jakiro_model::jakiro_model(const std::string & drafter_path, const std::string & target_path,
                           int32_t n_ctx, int32_t n_threads, bool full_vocab)
    : n_ctx_(n_ctx) {
    gguf_file drafter(drafter_path), target(target_path);
    if (drafter.str("general.architecture") != "jakiro") {
        throw std::runtime_error(drafter_path + " is not a Jakiro drafter");
    }
    const std::string a = "jakiro.";
    hp_.target_name = drafter.str(a + "target.name");
    hp_.target_tokenizer = drafter.str(a + "target.tokenizer_hash");
    hp_.target_vocab = int32_t(drafter.u32(a + "target.vocab_size"));
    hp_.d_model = int32_t(drafter.u32(a + "embedding_length"));
    hp_.n_heads = int32_t(drafter.u32(a + "attention.head_count"));
    hp_.n_experts = int32_t(drafter.u32(a + "expert_count"));
    hp_.top_k = int32_t(drafter.u32(a + "expert_used_count"));
    hp_.d_expert = int32_t(drafter.u32(a + "expert_feed_forward_length"));
    hp_.gamma = int32_t(drafter.u32(a + "draft_steps"));
    hp_.rope_theta = float(drafter.f64(a + "rope.freq_base"));
    hp_.norm_eps = float(drafter.f64(a + "attention.layer_norm_rms_epsilon"));
    hp_.beta1 = float(drafter.f64(a + "contrastive.beta1"));
    hp_.beta2 = float(drafter.f64(a + "contrastive.beta2"));

    const ggml_tensor * t_embd = target.tensor("token_embd.weight");
    const std::string head_name =
        gguf_find_tensor(target.g.get(), "output.weight") >= 0 ? "output.weight" : "token_embd.weight";
    const ggml_tensor * t_head = target.tensor(head_name);
    if (t_embd->ne[0] != hp_.d_model || t_embd->ne[1] != hp_.target_vocab) {
        throw std::runtime_error("drafter made for " + hp_.target_name + " (vocab " +
                                 std::to_string(hp_.target_vocab) + ", hidden " +
                                 std::to_string(hp_.d_model) + ") cannot draft for " + target_path);
    }
    const ggml_tensor * t_d2t = drafter.tensor("d2t");
    d2t_.resize(size_t(t_d2t->ne[0]));
    drafter.read("d2t", 0, d2t_.data(), d2t_.size() * sizeof(int32_t));
    for (int32_t id : d2t_) {
        if (id < 0 || id >= hp_.target_vocab) throw std::runtime_error("d2t holds an id outside the vocabulary");
    }
    if (full_vocab) {  // score every target token (measures what the reduced head costs in tau)
        d2t_.resize(size_t(hp_.target_vocab));
        std::iota(d2t_.begin(), d2t_.end(), 0);
    }

    backend_.reset(local_best_backend());  // the drafter stays local with --rpc
    if (!backend_) throw std::runtime_error("no ggml backend available");
    set_threads(backend_.get(), n_threads);

    const int32_t N = hp_.n_experts;
    ggml_init_params wp{ggml_tensor_overhead() * size_t(17 + 3 * N), nullptr, /*no_alloc=*/true};
    weights_ctx_.reset(ggml_init(wp));
    auto take = [&](const std::string & name) { return like(weights_ctx_.get(), drafter.tensor(name), name); };
    fc_w_ = take("fc.weight");
    fc_b_ = take("fc.bias");
    wq_ = take("attn_q.weight");
    wk_ = take("attn_k.weight");
    wv_ = take("attn_v.weight");
    wo_ = take("attn_output.weight");
    norm_ = take("ffn_norm.weight");
    router_ = take("ffn_gate_inp.weight");
    for (int32_t j = 0; j < N; ++j) {
        gate_.push_back(take("ffn_gate." + std::to_string(j) + ".weight"));
        up_.push_back(take("ffn_up." + std::to_string(j) + ".weight"));
        down_.push_back(take("ffn_down." + std::to_string(j) + ".weight"));
    }
    embd_ = like(weights_ctx_.get(), t_embd, "token_embd");
    head_ = ggml_new_tensor_2d(weights_ctx_.get(), t_head->type, hp_.d_model, int64_t(d2t_.size()));
    k_cache_ = ggml_new_tensor_2d(weights_ctx_.get(), GGML_TYPE_F32, hp_.d_model, n_ctx);
    v_cache_ = ggml_new_tensor_2d(weights_ctx_.get(), GGML_TYPE_F32, hp_.d_model, n_ctx);
    bank_ = ggml_new_tensor_2d(weights_ctx_.get(), GGML_TYPE_F32, hp_.d_model, BANK_ROWS);
    weights_buf_.reset(ggml_backend_alloc_ctx_tensors(weights_ctx_.get(), backend_.get()));
    if (!weights_buf_) throw std::runtime_error("cannot allocate the drafter's weights");

    for (ggml_tensor * t : {fc_w_, fc_b_, wq_, wk_, wv_, wo_, norm_, router_}) upload(drafter, t->name, t);
    for (int32_t j = 0; j < N; ++j) {
        for (ggml_tensor * t : {gate_[j], up_[j], down_[j]}) upload(drafter, t->name, t);
    }
    upload(target, "token_embd.weight", embd_);
    // The head keeps the draft vocabulary's rows, still quantized: blocks never span rows.
    const size_t row = ggml_row_size(t_head->type, hp_.d_model);
    std::vector<uint8_t> rows(row * d2t_.size());
    std::vector<uint8_t> all(ggml_nbytes(t_head));
    target.read(head_name, 0, all.data(), all.size());
    for (size_t i = 0; i < d2t_.size(); ++i) std::memcpy(&rows[i * row], &all[size_t(d2t_[i]) * row], row);
    ggml_backend_tensor_set(head_, rows.data(), 0, rows.size());

    galloc_.reset(ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend_.get())));
    graph_mem_.resize(ggml_tensor_overhead() * 512 + ggml_graph_overhead_custom(1024, false));

    // CUDA without CUB has no top-k over rows this long: the host picks there.
    ggml_context_ptr probe = graph_context();
    ggml_tensor * logits = ggml_new_tensor_2d(probe.get(), GGML_TYPE_F32, int64_t(d2t_.size()), 2);
    device_top_k_ = ggml_backend_supports_op(backend_.get(), ggml_top_k(probe.get(), logits, 2));
}

void jakiro_model::allocate(ggml_cgraph * graph) {
    if (!ggml_gallocr_alloc_graph(galloc_.get(), graph)) throw std::runtime_error("cannot allocate the drafter's graph");
}

ggml_context_ptr jakiro_model::graph_context() const {
    ggml_init_params ip{graph_mem_.size(), const_cast<uint8_t *>(graph_mem_.data()), /*no_alloc=*/true};
    return ggml_context_ptr(ggml_init(ip));
}

jakiro_model::layer_out jakiro_model::layer(ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * feats,
                                            const int32_t * tokens, int32_t n, ggml_tensor ** inputs) {
    const int32_t d = hp_.d_model, H = hp_.n_heads, hd = d / H, N = hp_.n_experts;
    const int32_t n_kv = n_cached_ + n;
    if (n <= 0 || n_kv > n_ctx_) throw std::runtime_error("drafter KV cache full");
    for (int32_t i = 0; i < n; ++i) {
        if (tokens[i] < 0 || tokens[i] >= hp_.target_vocab) throw std::runtime_error("token id outside the vocabulary");
    }
    ggml_tensor * in_tok = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n);
    ggml_tensor * in_pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n);
    ggml_tensor * in_mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_kv, n);
    for (ggml_tensor * t : {in_tok, in_pos, in_mask}) ggml_set_input(t);
    inputs[0] = in_tok, inputs[1] = in_pos, inputs[2] = in_mask;

    ggml_tensor * x = ggml_concat(ctx, ggml_get_rows(ctx, embd_, in_tok), feats, 0);  // [emb; f]
    ggml_tensor * h = ggml_add(ctx, ggml_mul_mat(ctx, fc_w_, x), fc_b_);
    auto rope = [&](ggml_tensor * t) {
        return ggml_rope_ext(ctx, ggml_reshape_3d(ctx, t, hd, H, n), in_pos, nullptr, hd,
                             GGML_ROPE_TYPE_NEOX, 0, hp_.rope_theta, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
    };
    ggml_tensor * q = rope(ggml_mul_mat(ctx, wq_, h));
    ggml_tensor * k = rope(ggml_mul_mat(ctx, wk_, h));
    ggml_tensor * v = ggml_mul_mat(ctx, wv_, h);
    // New K/V into their slots first: the attention below reads them from the cache.
    const size_t slot = k_cache_->nb[1];
    ggml_build_forward_expand(gf, ggml_cpy(ctx, ggml_reshape_2d(ctx, k, d, n),
                                           ggml_view_2d(ctx, k_cache_, d, n, slot, n_cached_ * slot)));
    ggml_build_forward_expand(gf, ggml_cpy(ctx, v, ggml_view_2d(ctx, v_cache_, d, n, slot, n_cached_ * slot)));
    ggml_tensor * K = ggml_view_3d(ctx, k_cache_, hd, H, n_kv, hd * sizeof(float), slot, 0);
    ggml_tensor * V = ggml_view_3d(ctx, v_cache_, hd, H, n_kv, hd * sizeof(float), slot, 0);
    ggml_tensor * kq = ggml_mul_mat(ctx, ggml_permute(ctx, K, 0, 2, 1, 3), ggml_permute(ctx, q, 0, 2, 1, 3));
    kq = ggml_soft_max_ext(ctx, kq, in_mask, 1.0f / std::sqrt(float(hd)), 0.0f);  // [n_kv, n, H]
    ggml_tensor * kqv = ggml_mul_mat(ctx, ggml_cont(ctx, ggml_permute(ctx, V, 1, 2, 0, 3)), kq);  // [hd, n, H]
    ggml_tensor * attn = ggml_cont_2d(ctx, ggml_permute(ctx, kqv, 0, 2, 1, 3), d, n);
    ggml_tensor * u = ggml_add(ctx, h, ggml_mul_mat(ctx, wo_, attn));
    ggml_tensor * xn = ggml_mul(ctx, ggml_rms_norm(ctx, u, hp_.norm_eps), norm_);
    ggml_tensor * router = ggml_mul_mat(ctx, router_, xn);  // [N, n]
    ggml_tensor * experts = nullptr;  // [d, N, n]: expert j's output for position i at (:, j, i)
    for (int32_t j = 0; j < N; ++j) {
        ggml_tensor * act = ggml_mul(ctx, ggml_silu(ctx, ggml_mul_mat(ctx, gate_[j], xn)),
                                     ggml_mul_mat(ctx, up_[j], xn));
        ggml_tensor * e = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, down_[j], act), d, 1, n);
        experts = experts ? ggml_concat(ctx, experts, e, 1) : e;
    }
    return {u, experts, router};
}

void jakiro_model::set_layer_inputs(ggml_tensor ** inputs, const int32_t * tokens, const int32_t * pos,
                                    const float * mask, int32_t n) {
    ggml_backend_tensor_set(inputs[0], tokens, 0, ggml_nbytes(inputs[0]));
    ggml_backend_tensor_set(inputs[1], pos, 0, ggml_nbytes(inputs[1]));
    ggml_backend_tensor_set(inputs[2], mask, 0, ggml_nbytes(inputs[2]));
}

jakiro_step_out jakiro_model::step(const float * feats, const int32_t * tokens, const int32_t * pos,
                                   const float * mask, int32_t n) {
    const int32_t d = hp_.d_model, N = hp_.n_experts;
    ggml_context_ptr holder = graph_context();
    ggml_context * ctx = holder.get();
    ggml_cgraph * gf = ggml_new_graph_custom(ctx, 1024, false);
    ggml_tensor * in_feats = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, d, n);
    ggml_set_input(in_feats);
    ggml_tensor * inputs[3];
    const layer_out o = layer(ctx, gf, in_feats, tokens, n, inputs);
    for (ggml_tensor * t : {o.u, o.experts, o.router}) {
        ggml_set_output(t);
        ggml_build_forward_expand(gf, t);
    }
    allocate(gf);
    ggml_backend_tensor_set(in_feats, feats, 0, ggml_nbytes(in_feats));
    set_layer_inputs(inputs, tokens, pos, mask, n);
    if (ggml_backend_graph_compute(backend_.get(), gf) != GGML_STATUS_SUCCESS) {
        throw std::runtime_error("drafter forward failed");
    }
    n_cached_ += n;  // the pass's K/V are in their slots
    jakiro_step_out out;
    out.u.resize(size_t(n) * d);
    out.router.resize(size_t(n) * N);
    out.experts.resize(size_t(n) * N * d);
    ggml_backend_tensor_get(o.u, out.u.data(), 0, ggml_nbytes(o.u));
    ggml_backend_tensor_get(o.router, out.router.data(), 0, ggml_nbytes(o.router));
    ggml_backend_tensor_get(o.experts, out.experts.data(), 0, ggml_nbytes(o.experts));
    return out;
}

namespace {

// The k likeliest tokens of each row of head logits (rows × V), best first: the host's pick,
// where the backend has no top-k for rows this long.
void host_top_k(const std::vector<float> & logits, int32_t rows, int32_t k, jakiro_candidates & c) {
    const int32_t V = int32_t(logits.size() / size_t(rows));
    std::vector<int32_t> idx(V);
    for (int32_t r = 0; r < rows; ++r) {
        const float * l = logits.data() + size_t(r) * V;
        std::iota(idx.begin(), idx.end(), 0);
        std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                          [l](int32_t i, int32_t j) { return l[i] > l[j] || (l[i] == l[j] && i < j); });
        const float top = l[idx[0]];
        double z = 0.0;
        for (int32_t v = 0; v < V; ++v) z += std::exp(double(l[v] - top));
        for (int32_t i = 0; i < k; ++i) {
            c.tokens[size_t(r) * k + i] = idx[i];
            c.probs[size_t(r) * k + i] = float(std::exp(double(l[idx[i]] - top)) / z);
        }
    }
}

}  // namespace

jakiro_candidates jakiro_model::heads(ggml_context * ctx, ggml_cgraph * gf, layer_out o, int32_t m,
                                      head_rows which, int32_t k, bool features,
                                      const std::function<void()> & set_inputs) {
    const int32_t d = hp_.d_model, N = hp_.n_experts, V = int32_t(d2t_.size());
    if (bank_used_ + m > bank_->ne[1]) throw std::runtime_error("the draft tree outgrew the drafter's feature bank");
    k = std::min(k, V);
    // The router's top-2 experts a, b of each position, best first, and s over the two.
    ggml_tensor *e_a, *e_b, *s_a = nullptr, *s_b = nullptr;
    if (N == 1) {
        e_a = e_b = ggml_reshape_2d(ctx, o.experts, d, m);
    } else {
        ggml_tensor * ab = ggml_cont(ctx, ggml_argsort_top_k(ctx, o.router, 2));  // [2, m]
        ggml_tensor * g = ggml_get_rows(ctx, ggml_reshape_3d(ctx, o.router, 1, N, m), ab);  // [1, 2, m]
        ggml_tensor * s = ggml_soft_max(ctx, ggml_reshape_2d(ctx, g, 2, m));
        s_a = ggml_cont(ctx, ggml_view_2d(ctx, s, 1, m, s->nb[1], 0));
        s_b = ggml_cont(ctx, ggml_view_2d(ctx, s, 1, m, s->nb[1], sizeof(float)));
        ggml_tensor * e = ggml_get_rows(ctx, o.experts, ab);  // [d, 2, m]
        e_a = ggml_cont(ctx, ggml_view_2d(ctx, e, d, m, e->nb[2], 0));
        e_b = ggml_cont(ctx, ggml_view_2d(ctx, e, d, m, e->nb[2], e->nb[1]));
    }
    ggml_tensor * moe = N == 1 ? ggml_add(ctx, o.u, e_a)
                               : ggml_add(ctx, o.u, ggml_add(ctx, ggml_mul(ctx, e_a, s_a), ggml_mul(ctx, e_b, s_b)));
    ggml_tensor * rows = nullptr;  // [d, rows]: the first features of every position, then the second
    if (N == 1) {  // head_rows::single
        rows = moe;
    } else if (which == head_rows::cepd) {
        ggml_tensor * ctr = ggml_add(ctx, o.u, ggml_sub(ctx, ggml_scale(ctx, e_a, hp_.beta1), ggml_scale(ctx, e_b, hp_.beta2)));
        rows = ggml_concat(ctx, moe, ctr, 1);
    } else {
        rows = ggml_concat(ctx, ggml_add(ctx, o.u, e_a), ggml_add(ctx, o.u, e_b), 1);
    }
    const int32_t n_rows = int32_t(rows->ne[1]);
    const size_t bank_row = bank_->nb[1];
    ggml_build_forward_expand(gf, ggml_cpy(ctx, moe, ggml_view_2d(ctx, bank_, d, m, bank_row, bank_used_ * bank_row)));

    ggml_tensor * logits = ggml_mul_mat(ctx, head_, rows);  // [V, n_rows]
    ggml_tensor *ids = nullptr, *probs = nullptr;
    if (device_top_k_) {
        ids = ggml_top_k(ctx, logits, k);  // [k, n_rows], in no particular order
        probs = ggml_get_rows(ctx, ggml_reshape_3d(ctx, ggml_soft_max(ctx, logits), 1, V, n_rows), ids);
    }
    std::vector<ggml_tensor *> outs = device_top_k_ ? std::vector<ggml_tensor *>{ids, probs}
                                                    : std::vector<ggml_tensor *>{logits};
    if (features) outs.push_back(rows);
    for (ggml_tensor * t : outs) {
        ggml_set_output(t);
        ggml_build_forward_expand(gf, t);
    }
    allocate(gf);
    set_inputs();
    if (ggml_backend_graph_compute(backend_.get(), gf) != GGML_STATUS_SUCCESS) {
        throw std::runtime_error("drafter forward failed");
    }
    bank_used_ += m;

    jakiro_candidates c;
    c.rows = n_rows, c.k = k;
    c.tokens.resize(size_t(n_rows) * k);
    c.probs.resize(size_t(n_rows) * k);
    if (device_top_k_) {
        ggml_backend_tensor_get(ids, c.tokens.data(), 0, ggml_nbytes(ids));
        ggml_backend_tensor_get(probs, c.probs.data(), 0, ggml_nbytes(probs));
        for (int32_t r = 0; r < n_rows; ++r) {  // best first; ties keep the lower draft id
            std::vector<std::pair<float, int32_t>> row(static_cast<size_t>(k));
            for (int32_t i = 0; i < k; ++i) row[i] = {c.probs[size_t(r) * k + i], c.tokens[size_t(r) * k + i]};
            std::sort(row.begin(), row.end(), [](const auto & x, const auto & y) {
                return x.first > y.first || (x.first == y.first && x.second < y.second);
            });
            for (int32_t i = 0; i < k; ++i) c.probs[size_t(r) * k + i] = row[i].first, c.tokens[size_t(r) * k + i] = row[i].second;
        }
    } else {
        std::vector<float> l(size_t(n_rows) * V);
        ggml_backend_tensor_get(logits, l.data(), 0, ggml_nbytes(logits));
        host_top_k(l, n_rows, k, c);
    }
    for (int32_t & t : c.tokens) t = d2t_[size_t(t)];
    if (features) {
        c.features.resize(size_t(n_rows) * d);
        ggml_backend_tensor_get(rows, c.features.data(), 0, ggml_nbytes(rows));
    }
    return c;
}

jakiro_candidates jakiro_model::root(const float * u, const float * experts, const float * router,
                                     head_rows which, int32_t k, bool features) {
    const int32_t d = hp_.d_model, N = hp_.n_experts;
    ggml_context_ptr holder = graph_context();
    ggml_context * ctx = holder.get();
    ggml_cgraph * gf = ggml_new_graph_custom(ctx, 256, false);
    layer_out o{ggml_new_tensor_2d(ctx, GGML_TYPE_F32, d, 1), ggml_new_tensor_3d(ctx, GGML_TYPE_F32, d, N, 1),
                ggml_new_tensor_2d(ctx, GGML_TYPE_F32, N, 1)};
    for (ggml_tensor * t : {o.u, o.experts, o.router}) ggml_set_input(t);
    bank_used_ = 0;
    return heads(ctx, gf, o, 1, which, k, features, [&] {
        ggml_backend_tensor_set(o.u, u, 0, ggml_nbytes(o.u));
        ggml_backend_tensor_set(o.experts, experts, 0, ggml_nbytes(o.experts));
        if (N > 1) ggml_backend_tensor_set(o.router, router, 0, ggml_nbytes(o.router));  // one expert: unread
    });
}

jakiro_candidates jakiro_model::expand(const int32_t * bank, const int32_t * tokens, const int32_t * pos,
                                       const float * mask, int32_t n, head_rows which, int32_t k, bool features) {
    for (int32_t i = 0; i < n; ++i) {
        if (bank[i] < 0 || bank[i] >= bank_used_) throw std::runtime_error("a feature row the bank does not hold");
    }
    ggml_context_ptr holder = graph_context();
    ggml_context * ctx = holder.get();
    ggml_cgraph * gf = ggml_new_graph_custom(ctx, 1024, false);
    ggml_tensor * in_bank = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n);
    ggml_set_input(in_bank);
    ggml_tensor * inputs[3];
    const layer_out o = layer(ctx, gf, ggml_get_rows(ctx, bank_, in_bank), tokens, n, inputs);
    jakiro_candidates c = heads(ctx, gf, o, n, which, k, features, [&] {
        ggml_backend_tensor_set(in_bank, bank, 0, ggml_nbytes(in_bank));
        set_layer_inputs(inputs, tokens, pos, mask, n);
    });
    n_cached_ += n;  // the pass's K/V are in their slots
    return c;
}

std::vector<float> jakiro_model::logits(const float * feats, int32_t m) {
    const int32_t d = hp_.d_model;
    ggml_context_ptr holder = graph_context();
    ggml_context * ctx = holder.get();
    ggml_cgraph * gf = ggml_new_graph_custom(ctx, 16, false);
    ggml_tensor * in = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, d, m);
    ggml_set_input(in);
    ggml_tensor * out = ggml_mul_mat(ctx, head_, in);  // [V', m]
    ggml_set_output(out);
    ggml_build_forward_expand(gf, out);
    allocate(gf);
    ggml_backend_tensor_set(in, feats, 0, ggml_nbytes(in));
    if (ggml_backend_graph_compute(backend_.get(), gf) != GGML_STATUS_SUCCESS) {
        throw std::runtime_error("drafter head failed");
    }
    std::vector<float> result(size_t(m) * d2t_.size());
    ggml_backend_tensor_get(out, result.data(), 0, ggml_nbytes(out));
    return result;
}

void jakiro_model::truncate(int32_t n) {
    if (n < 0 || n > n_cached_) throw std::runtime_error("truncate beyond the drafter's cache");
    n_cached_ = n;
}

}  // namespace ls
