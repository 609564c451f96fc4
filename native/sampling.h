// The one sampling transform of localspec: a row of llama.cpp logits -> the exact
// distribution a token is drawn from. Plain generation and every verifier use it.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace ls {

struct sampling_params {
    float temperature    = 0.0f;  // <= 0: greedy (argmax, lowest id wins a tie)
    int   top_k          = 40;    // <= 0 or >= n_vocab: off
    float top_p          = 0.95f; // >= 1: off
    float min_p          = 0.05f; // <= 0: off
    float repeat_penalty = 1.0f;  // 1: off; applied to tokens seen in the last repeat_last_n
    int   repeat_last_n  = 64;
};

// Candidates in descending probability (ties: ascending id); probs sum to 1.
struct distribution {
    std::vector<int32_t> ids;
    std::vector<float>   probs;
};

// Uniform draws that are the same on every platform for the same seed
// (std::uniform_real_distribution is implementation-defined).
class rng {
public:
    explicit rng(uint64_t seed) : gen_(seed) {}
    double uniform() { return double(gen_() >> 11) * 0x1.0p-53; }  // [0, 1)
private:
    std::mt19937_64 gen_;
};

class sampler {
public:
    explicit sampler(const sampling_params & params) : params_(params) {}

    const sampling_params & params() const { return params_; }
    bool greedy() const { return params_.temperature <= 0.0f; }

    // The order is llama.cpp's default chain: penalties, top-k, top-p, min-p, temperature.
    // `logits` is read in place; penalised entries are patched and restored before return.
    void transform(float * logits, int32_t n_vocab, const int32_t * history, int32_t n_history,
                   distribution & out);

    // The same from a row's best candidates (ids and their logits, any order) rather than the
    // whole row: what a top-k sampler in the forward's graph hands back. Exact when they are
    // the row's top_k best (or more) and no penalty applies (neither needs the whole row).
    void transform(const int32_t * ids, const float * logits, int32_t n, distribution & out);

private:
    // From scratch_ (candidates best first) on: top-p, min-p, temperature, the softmax.
    void finish(float max_logit, double sum, distribution & out);

    sampling_params params_;
    std::vector<std::pair<int32_t, float>> saved_;   // penalised entries to restore
    std::vector<std::pair<float, int32_t>> scratch_; // (logit, id) candidates
};

// The id of the largest logit (the lowest such id on a tie).
int32_t argmax(const float * logits, int32_t n_vocab);

// A token's log-probability in a row of logits (their softmax at temperature 1), and the k
// likeliest tokens' (best first; ties: the lower id): what a request that asks for
// log-probabilities is handed per generated token.
struct token_logprobs {
    double               logprob = 0.0;
    std::vector<int32_t> ids;
    std::vector<double>  logprobs;  // (doubles: the token's own is the same number where it is one of them)
};
token_logprobs logprobs_of(const float * logits, int32_t n_vocab, int32_t token, int32_t k);

// Draw from a distribution: the first id whose cumulative probability exceeds a uniform u.
int32_t draw(const distribution & dist, rng & r);

}  // namespace ls
