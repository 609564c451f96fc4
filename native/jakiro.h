// The Jakiro drafter's forward pass on ggml: the drafter GGUF's own tensors plus the token
// embedding and LM-head rows it shares with the target, read from the target's GGUF, on the
// best backend the loaded ggml offers (CPU, CUDA, ROCm, Metal) with no backend code of ours.
#pragma once

#include <cstdint>
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

  private:
    void allocate(ggml_cgraph * graph);

    jakiro_hparams hp_;
    std::vector<int32_t> d2t_;
    int32_t n_ctx_ = 0, n_cached_ = 0;
    // Members free in reverse order: graph allocator, weights, their context, the backend.
    ggml_backend_ptr backend_;
    ggml_context_ptr weights_ctx_;
    ggml_backend_buffer_ptr weights_buf_;
    ggml_gallocr_ptr galloc_;
    std::vector<uint8_t> graph_mem_;
    // Weights; the expert tensors are N of each.
    ggml_tensor *fc_w_ = nullptr, *fc_b_ = nullptr, *wq_ = nullptr, *wk_ = nullptr, *wv_ = nullptr,
                *wo_ = nullptr, *norm_ = nullptr, *router_ = nullptr, *embd_ = nullptr,
                *head_ = nullptr, *k_cache_ = nullptr, *v_cache_ = nullptr;
    std::vector<ggml_tensor *> gate_, up_, down_;
};

}  // namespace ls
