// Greedy's argmax on the CPU without the output layer's full matmul, exactly.
//
// The output layer (the LM head) is a fifth of a plain step of Qwen2.5-Coder-1.5B on a CPU:
// its Q6_K matrix, 151,936 rows, is read for every token (6.5 ms of 33). Greedy decoding and
// greedy verification need only each row's argmax. So the head stops llama.cpp's graph at the
// final norm (result_norm) and runs a 4-bit copy of the matrix instead (in ggml's repacked
// layout: about half the time), bounds every row's distance from the exact logit, and
// computes exactly, with ggml's own vec_dot on the file's rows as llama.cpp's matmul does,
// only the rows that could still be the largest (a few dozen): the same token, bit for bit.
// The copy's type is the one whose matmul quantizes the hidden row as the exact type's
// vec_dot does (Q4_K for a Q6_K layer, Q4_0 for Q8_0), so the bound holds only the weights'
// error: on a 1.5B's rows a tenth of the rows a Q4_0 copy of its Q6_K layer leaves.
// Hidden states carry much of their energy in a few dimensions (a 1.5B's 32 largest: about
// 40%), where one row's error against its copy is best taken exactly: the rows the first bound
// leaves are bounded again with those dimensions' errors kept (focus()), which leaves a
// fourth to a sixth of them to compute.
#pragma once

#include <cstdint>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

namespace ls {

// A forward's rows through the copy: their hidden states and approximate logits, and each
// row's exact argmax, decided when first asked for (greedy verification reads only the rows
// its walk reaches: a few of a 16-row tree).
struct head_batch {
    head_batch() = default;
    ~head_batch();
    head_batch(const head_batch &) = delete;
    head_batch & operator=(const head_batch &) = delete;

    int64_t n = 0, cap = 0;
    ggml_backend_buffer_t buffer = nullptr;  // cap rows of approximate logits, then cap hidden rows
    float * logits = nullptr;
    float * hidden = nullptr;
    std::vector<int32_t> tokens;  // per row: -2 not decided yet, -1 not a finite row
};

class exact_head {
public:
    // `weights`: the output matrix as its GGUF stores it, n_vocab rows of n_embd of `type`,
    // mapped by the caller for the head's life. Throws std::invalid_argument where the head
    // cannot be exact or cannot pay (a type it does not know, no repacked 4-bit kernel).
    // `copy_type`: Q4_0 or Q4_K for the copy (comparisons); -1: the one that fits `type`.
    exact_head(const uint8_t * weights, ggml_type type, int64_t n_embd, int64_t n_vocab, int32_t n_threads,
               int32_t copy_type = -1);
    ~exact_head();
    exact_head(const exact_head &) = delete;
    exact_head & operator=(const exact_head &) = delete;

    // Appends n rows of hidden states (n_embd floats a row, the output layer's input) to
    // `rows`, with their approximate logits (one matmul over the copy).
    void approximate(head_batch & rows, const float * hidden, int64_t n);
    // Row j's argmax, decided exactly on first ask.
    int32_t token(head_batch & rows, int64_t j);
    // The argmax of each of n rows into out[0..n) (tests, its own timing).
    void argmax(const float * hidden, int64_t n, int32_t * out);
    // Learn from n hidden rows which `dims` dimensions (a multiple of LANES) carry the most
    // energy, and keep each vocabulary row's error against the copy there (the second bound);
    // once, the first call.
    void focus(const float * hidden, int64_t n, int32_t dims = FOCUS_DIMS);
    static constexpr int32_t FOCUS_DIMS = 32, LANES = 8;
    // The logits llama.cpp computes for rows `ids` of one hidden row (its start's check, tests).
    void exact_logits(const float * hidden, const int32_t * ids, int64_t n, float * out) const;

    int64_t n_embd() const { return n_embd_; }
    int32_t copy_type() const { return copy_type_; }  // the copy's ggml type
    size_t  extra_bytes() const;  // the 4-bit copy and the bounds' norms
    double  full_ms = 0.0, approx_ms = 0.0;  // one row's head each way, measured at build
    int64_t rows = 0, rescored = 0;           // rows decided, candidates computed exactly
    double  decide_seconds = 0.0;             // deciding them (after the copy's matmul)

private:
    void release();
    void build_copy(ggml_backend_buffer_type_t buft);
    template <typename F> void each_row(uint8_t * copy, F f) const;
    void time_rows();
    int32_t decide(const float * h, const float * approx);

    const uint8_t * weights_;
    ggml_type type_, dot_type_, copy_type_, copy_dot_type_;
    int64_t n_embd_, n_vocab_;
    size_t row_bytes_;
    int32_t n_threads_;
    // Per vocabulary row: |W_i| and |W_i - A_i| (A the 4-bit copy), for the bound
    std::vector<float> norm_, err_;
    // focus(): the dimensions, and per vocabulary row W_i - A_i there and its norm elsewhere
    std::vector<int32_t> focus_dims_;
    std::vector<float> focus_err_, rest_err_;
    std::vector<int32_t> narrowed(const float * approx, const std::vector<int32_t> & candidates,
                                  const std::vector<float> & h0, double norm_h0, double halfway,
                                  double slack, float alpha, float reach) const;
    ggml_backend_t backend_ = nullptr;
    ggml_context * weight_ctx_ = nullptr;
    ggml_backend_buffer_t weight_buf_ = nullptr;
    ggml_tensor * copy_ = nullptr;
    ggml_context * graph_ctx_ = nullptr;  // the approximate matmul's graph, rebuilt per forward
    head_batch own_;                       // argmax()'s
};

// A context's link to an exact head: llama.cpp's eval callback (set when the context is
// created) stops each forward at result_norm while `on`, and the head decides the rows that
// output; device_token() (step.h) reads them as it reads a sampler's on a GPU.
class head_hook {
public:
    explicit head_hook(exact_head & head) : head_(head) {}
    ~head_hook() { unbind(); }
    head_hook(const head_hook &) = delete;
    head_hook & operator=(const head_hook &) = delete;

    static bool eval(ggml_tensor * t, bool ask, void * self);  // llama.cpp's cb_eval
    // Tie the hook to its context, after checking on a few rows that the head reproduces
    // llama.cpp's logits (its argmax and its values, bit for bit); false where it does not
    // (an architecture whose logits are not the plain matmul of result_norm), unbound.
    bool bind(llama_context * ctx);
    void unbind();
    static head_hook * of(llama_context * ctx);  // the bound hook that is on, or null

    bool on = false;
    // From this many rows (in one ubatch) a forward runs llama.cpp's whole output layer, the rows'
    // argmax read from its logits: its Q6_K matmul reuses each weight across rows, and the
    // 4-bit copy's stops paying (on this CPU, a 1.5B's head: 1 row 7.0 against 4.5 ms, 16
    // rows 53 against 30, 48 rows 89 against 86, 64 rows 101 against 110).
    static constexpr int32_t WHOLE_LAYER_ROWS = 48;
    // Before a forward: which of its n_tokens rows output (null: the last), so that row i's
    // token is found among the head's outputs.
    void begin(int32_t n_tokens, const int8_t * outputs);
    llama_token token(int32_t row);  // -1: none there

private:
    exact_head & head_;
    llama_context * ctx_ = nullptr;
    bool probing_ = false;                 // bind(): keep the rows, run the whole graph
    std::vector<int32_t> output_of_row_;   // -1: the row does not output
    head_batch rows_;                       // the output rows, in order
    bool failed_ = false;                  // a forward's rows were not the head's to read
    bool whole_layer_ = false;             // this forward runs llama.cpp's whole output layer
    std::vector<float> probe_;             // bind()'s hidden rows
};

}  // namespace ls
