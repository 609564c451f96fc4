// The acceptance head (Sun et al.): the probability that the target accepts a drafted token,
// from the draft model's final hidden state f and its probability q of the token. Tiny (one
// linear map to a few hundred units, 1-2 residual SiLU blocks, one logit added to q's scaled
// log-odds), so it runs on the CPU beside any backend, once per drafted token, without a graph.
#pragma once

#include <cstdint>
#include <vector>

namespace ls {

struct dense {
    int32_t n_in = 0, n_out = 0;
    std::vector<float> w;  // n_out x n_in, row-major (a torch Linear's weight)
    std::vector<float> b;  // n_out
    void apply(const float * x, float * y) const;
};

class acceptance_head {
public:
    // inp: (d_model + 2) -> hidden; blocks: pairs of hidden -> hidden; out: hidden -> 1.
    acceptance_head(dense inp, std::vector<dense> blocks, dense out, float q_scale);

    int32_t d_model() const { return inp_.n_in - 2; }
    // P(accepted) of tokens with draft probabilities q[i], each under hidden state
    // f[row[i]] (siblings share their parent's state): f is n_rows x d_model.
    std::vector<float> probs(const float * f, const int32_t * row, const float * q, int32_t n) const;

private:
    dense inp_, out_;
    std::vector<dense> blocks_;  // up, down, up, down, ...
    float q_scale_;
};

}  // namespace ls
