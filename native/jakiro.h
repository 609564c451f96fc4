// The Jakiro drafter's forward pass on ggml: the drafter GGUF's own tensors plus the token
// embedding and LM-head rows it shares with the target, read from the target's GGUF, on the
// best backend the loaded ggml offers (CPU, CUDA, ROCm, Metal) with no backend code of ours.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ggml-cpp.h"

namespace ls {

struct jakiro_hparams {
    std::string target_name, target_tokenizer;
    int32_t target_vocab = 0, d_model = 0, n_heads = 0, n_experts = 0, top_k = 0, d_expert = 0,
            gamma = 0;
    float rope_theta = 0, norm_eps = 0, beta1 = 0, beta2 = 0;
};

// What one decoder-layer pass returns per position (row-major, position-major):
// u (n × d), every expert's output (n × N × d) and the router logits (n × N).
struct jakiro_step_out {
    std::vector<float> u, experts, router;
};

// Which features of each position the head reads, from u, the router's top-2 experts a and b
// and their softmax scores s renormalised over the two:
//   branches: u + e_a, then u + e_b (the two decoupled branches)
//   cepd:     f_moe = u + s_a e_a + s_b e_b, then f_ctr = u + beta1 e_a - beta2 e_b
//   single:   u + e_0 only (one expert: the EAGLE-style baseline)
enum class head_rows { branches, cepd, single };

// The head's k best tokens for each feature row (the first features of every position, then
// the second ones), picked on the drafter's device: only these come back to the host.
struct jakiro_candidates {
    int32_t rows = 0, k = 0;
    std::vector<int32_t> tokens;  // rows × k target ids, best first
    std::vector<float> probs;     // rows × k: softmax at T = 1 over the draft vocabulary
    std::vector<float> features;  // rows × d, only when asked (an acceptance head reads them)
};

class jakiro_model {
  public:
    // full_vocab: score every target token, whatever draft vocabulary the drafter was trained on.
    jakiro_model(const std::string & drafter_path, const std::string & target_path, int32_t n_ctx,
                 int32_t n_threads, bool full_vocab = false);
    jakiro_model(const jakiro_model &) = delete;
    jakiro_model & operator=(const jakiro_model &) = delete;

    const jakiro_hparams & hparams() const { return hp_; }
    const std::vector<int32_t> & draft_vocab() const { return d2t_; }  // head row -> target id
    int32_t n_cached() const { return n_cached_; }
    const char * device() const { return ggml_backend_name(backend_.get()); }

    // One pass over n positions: features (n × d), the tokens whose embeddings join them,
    // rotary positions, and an additive mask (n × (n_cached + n): 0 attend, -inf not) over the
    // KV slots so far plus these. Their K/V go to slots [n_cached, n_cached + n).
    jakiro_step_out step(const float * feats, const int32_t * tokens, const int32_t * pos,
                         const float * mask, int32_t n);
    // Head logits (m × draft vocab) of m features (m × d).
    std::vector<float> logits(const float * feats, int32_t m);
    // Forget KV slots from n on (rollback after a rejected draft or a new prompt).
    void truncate(int32_t n);

    // Growing a tree on the device. Each call keeps its positions' f_moe in a bank of rows on
    // the device (the features a later pass reads) and returns the head's candidates.
    // root: the layer outputs of one position (u: d, experts: N × d, router: N), from the
    // host; the bank starts again with its f_moe in row 0.
    jakiro_candidates root(const float * u, const float * experts, const float * router,
                           head_rows which, int32_t k, bool features);
    // expand: one layer pass over n positions (as step) whose features are bank rows; their
    // f_moe go to bank rows [bank_rows(), bank_rows() + n).
    jakiro_candidates expand(const int32_t * bank, const int32_t * tokens, const int32_t * pos,
                             const float * mask, int32_t n, head_rows which, int32_t k, bool features);
    int32_t bank_rows() const { return bank_used_; }

  private:
    struct layer_out {
        ggml_tensor *u, *experts, *router;  // [d, n], [d, N, n], [N, n]
    };
    void allocate(ggml_cgraph * graph);
    ggml_context_ptr graph_context() const;
    layer_out layer(ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * feats, const int32_t * tokens,
                    int32_t n, ggml_tensor ** inputs);
    void set_layer_inputs(ggml_tensor ** inputs, const int32_t * tokens, const int32_t * pos,
                          const float * mask, int32_t n);
    jakiro_candidates heads(ggml_context * ctx, ggml_cgraph * gf, layer_out out, int32_t m,
                            head_rows which, int32_t k, bool features,
                            const std::function<void()> & set_inputs);

    jakiro_hparams hp_;
    std::vector<int32_t> d2t_;
    int32_t n_ctx_ = 0, n_cached_ = 0;
    // Members free in reverse order: graph allocator, weights, their context, the backend.
    ggml_backend_ptr backend_;
    ggml_context_ptr weights_ctx_;
    ggml_backend_buffer_ptr weights_buf_;
    ggml_gallocr_ptr galloc_;
    std::vector<uint8_t> graph_mem_;
    // The tree's f_moe rows (d × bank capacity) and how many the current tree has written.
    ggml_tensor * bank_ = nullptr;
    int32_t bank_used_ = 0;
    bool device_top_k_ = true;  // the backend picks the head's top k (else: the host does)
    // Weights; the expert tensors are N of each.
    ggml_tensor *fc_w_ = nullptr, *fc_b_ = nullptr, *wq_ = nullptr, *wk_ = nullptr, *wv_ = nullptr,
                *wo_ = nullptr, *norm_ = nullptr, *router_ = nullptr, *embd_ = nullptr,
                *head_ = nullptr, *k_cache_ = nullptr, *v_cache_ = nullptr;
    std::vector<ggml_tensor *> gate_, up_, down_;
};

}  // namespace ls
