#include "jakiro.h"

#include <cmath>
#include <cstdio>
#include <cstring>
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
    ggml_init_params wp{ggml_tensor_overhead() * size_t(16 + 3 * N), nullptr, /*no_alloc=*/true};
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
}

void jakiro_model::allocate(ggml_cgraph * graph) {
    if (!ggml_gallocr_alloc_graph(galloc_.get(), graph)) throw std::runtime_error("cannot allocate the drafter's graph");
}

jakiro_step_out jakiro_model::step(const float * feats, const int32_t * tokens, const int32_t * pos,
                                   const float * mask, int32_t n) {
    const int32_t d = hp_.d_model, H = hp_.n_heads, hd = d / H, N = hp_.n_experts;
    const int32_t n_kv = n_cached_ + n;
    if (n <= 0 || n_kv > n_ctx_) throw std::runtime_error("drafter KV cache full");
    for (int32_t i = 0; i < n; ++i) {
        if (tokens[i] < 0 || tokens[i] >= hp_.target_vocab) throw std::runtime_error("token id outside the vocabulary");
    }
    ggml_init_params ip{graph_mem_.size(), graph_mem_.data(), /*no_alloc=*/true};
    ggml_context_ptr holder(ggml_init(ip));
    ggml_context * ctx = holder.get();
    ggml_cgraph * gf = ggml_new_graph_custom(ctx, 1024, false);

    ggml_tensor * in_feats = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, d, n);
    ggml_tensor * in_tok = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n);
    ggml_tensor * in_pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n);
    ggml_tensor * in_mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_kv, n);
    for (ggml_tensor * t : {in_feats, in_tok, in_pos, in_mask}) ggml_set_input(t);

    ggml_tensor * x = ggml_concat(ctx, ggml_get_rows(ctx, embd_, in_tok), in_feats, 0);  // [emb; f]
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
    std::vector<ggml_tensor *> experts;
    for (int32_t j = 0; j < N; ++j) {
        ggml_tensor * act = ggml_mul(ctx, ggml_silu(ctx, ggml_mul_mat(ctx, gate_[j], xn)),
                                     ggml_mul_mat(ctx, up_[j], xn));
        experts.push_back(ggml_mul_mat(ctx, down_[j], act));
    }
    for (ggml_tensor * t : {u, router}) {
        ggml_set_output(t);
        ggml_build_forward_expand(gf, t);
    }
    for (ggml_tensor * t : experts) {
        ggml_set_output(t);
        ggml_build_forward_expand(gf, t);
    }

    allocate(gf);
    ggml_backend_tensor_set(in_feats, feats, 0, ggml_nbytes(in_feats));
    ggml_backend_tensor_set(in_tok, tokens, 0, ggml_nbytes(in_tok));
    ggml_backend_tensor_set(in_pos, pos, 0, ggml_nbytes(in_pos));
    ggml_backend_tensor_set(in_mask, mask, 0, ggml_nbytes(in_mask));
    if (ggml_backend_graph_compute(backend_.get(), gf) != GGML_STATUS_SUCCESS) {
        throw std::runtime_error("drafter forward failed");
    }
    n_cached_ = n_kv;

    jakiro_step_out out;
    out.u.resize(size_t(n) * d);
    out.router.resize(size_t(n) * N);
    out.experts.resize(size_t(n) * N * d);
    ggml_backend_tensor_get(u, out.u.data(), 0, ggml_nbytes(u));
    ggml_backend_tensor_get(router, out.router.data(), 0, ggml_nbytes(router));
    std::vector<float> e(size_t(n) * d);
    for (int32_t j = 0; j < N; ++j) {
        ggml_backend_tensor_get(experts[j], e.data(), 0, ggml_nbytes(experts[j]));
        for (int32_t i = 0; i < n; ++i) {
            std::memcpy(&out.experts[(size_t(i) * N + j) * d], &e[size_t(i) * d], d * sizeof(float));
        }
    }
    return out;
}

std::vector<float> jakiro_model::logits(const float * feats, int32_t m) {
    const int32_t d = hp_.d_model;
    ggml_init_params ip{graph_mem_.size(), graph_mem_.data(), /*no_alloc=*/true};
    ggml_context_ptr holder(ggml_init(ip));
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
