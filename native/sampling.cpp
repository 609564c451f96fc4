#include "sampling.h"

#include <algorithm>
#include <cmath>

namespace ls {

namespace {

// Descending logit, then ascending id: a total order, so ties never depend on the sort.
bool before(const std::pair<float, int32_t> & a, const std::pair<float, int32_t> & b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
}

void apply_penalty(float * logits, const int32_t * history, int32_t n_history,
                   const sampling_params & p, std::vector<std::pair<int32_t, float>> & saved) {
    saved.clear();
    if (p.repeat_penalty == 1.0f || p.repeat_last_n == 0 || n_history == 0) return;
    const int32_t n = p.repeat_last_n < 0 ? n_history : std::min(n_history, p.repeat_last_n);
    for (int32_t i = n_history - n; i < n_history; ++i) {
        const int32_t id = history[i];
        bool seen = false;
        for (const auto & s : saved) seen |= s.first == id;
        if (seen) continue;  // each distinct token is penalised once, as llama.cpp does
        saved.emplace_back(id, logits[id]);
        float & l = logits[id];
        l = l > 0.0f ? l / p.repeat_penalty : l * p.repeat_penalty;
    }
}

void restore(float * logits, const std::vector<std::pair<int32_t, float>> & saved) {
    for (const auto & s : saved) logits[s.first] = s.second;
}

// The k best (logit, id) pairs, best first: one pass over the row with a bounded heap
// whose front is the worst candidate kept so far.
void select_top_k(const float * logits, int32_t n_vocab, int32_t k,
                  std::vector<std::pair<float, int32_t>> & out) {
    out.clear();
    for (int32_t i = 0; i < n_vocab; ++i) {
        const std::pair<float, int32_t> c{logits[i], i};
        if (int32_t(out.size()) < k) {
            out.push_back(c);
            std::push_heap(out.begin(), out.end(), before);
        } else if (before(c, out.front())) {
            std::pop_heap(out.begin(), out.end(), before);
            out.back() = c;
            std::push_heap(out.begin(), out.end(), before);
        }
    }
    std::sort_heap(out.begin(), out.end(), before);
}

}  // namespace

token_logprobs logprobs_of(const float * logits, int32_t n_vocab, int32_t token, int32_t k) {
    const float peak = logits[argmax(logits, n_vocab)];
    double sum = 0.0;
    for (int32_t i = 0; i < n_vocab; ++i) sum += std::exp(logits[i] - peak);
    const double norm = double(peak) + std::log(sum);
    token_logprobs out;
    out.logprob = double(logits[token]) - norm;
    std::vector<std::pair<float, int32_t>> best;
    if (k > 0) select_top_k(logits, n_vocab, std::min(k, n_vocab), best);
    for (const auto & [logit, id] : best) {
        out.ids.push_back(id);
        out.logprobs.push_back(double(logit) - norm);
    }
    return out;
}

int32_t argmax(const float * logits, int32_t n_vocab) {
    // The row is read once per accepted token of every iteration (152k floats for Qwen): one
    // pass in independent lanes, each keeping its largest logit and where it was first seen,
    // which the compiler turns into vector compares and blends. A branchy single pass runs
    // several times slower.
    constexpr int32_t lanes = 16;
    float   best[lanes];
    int32_t at[lanes];
    for (int32_t j = 0; j < lanes; ++j) { best[j] = -INFINITY; at[j] = j; }
    const int32_t n_full = n_vocab / lanes * lanes;
    for (int32_t i = 0; i < n_full; i += lanes) {
        for (int32_t j = 0; j < lanes; ++j) {
            const bool more = logits[i + j] > best[j];  // NaN never is: it is skipped
            best[j] = more ? logits[i + j] : best[j];
            at[j]   = more ? i + j : at[j];
        }
    }
    float   b  = -INFINITY;
    int32_t id = 0;
    for (int32_t j = 0; j < lanes; ++j) {  // the largest, and the lowest id on a tie
        if (best[j] > b || (best[j] == b && at[j] < id)) { b = best[j]; id = at[j]; }
    }
    for (int32_t i = n_full; i < n_vocab; ++i) {
        if (logits[i] > b) { b = logits[i]; id = i; }
    }
    return id;
}

void sampler::transform(float * logits, int32_t n_vocab, const int32_t * history,
                        int32_t n_history, distribution & out) {
    const sampling_params & p = params_;
    apply_penalty(logits, history, n_history, p, saved_);
    out.ids.clear();
    out.probs.clear();

    if (greedy()) {
        const int32_t best = argmax(logits, n_vocab);
        restore(logits, saved_);
        out.ids.push_back(best);
        out.probs.push_back(1.0f);
        return;
    }

    // Candidates best first, and `sum`, the temperature-1 softmax normaliser over everything
    // top-k kept: top-p measures mass against it.
    const int32_t k = (p.top_k <= 0 || p.top_k >= n_vocab) ? n_vocab : p.top_k;
    float  max_logit;
    double sum = 0.0;
    if (k < n_vocab) {
        select_top_k(logits, n_vocab, k, scratch_);
        max_logit = scratch_[0].first;
        for (const auto & c : scratch_) sum += std::exp(c.first - max_logit);
    } else {
        // Top-p and min-p both keep a prefix of the sorted order, so a token min-p will cut
        // need not be sorted at all: only the survivors are.
        max_logit = *std::max_element(logits, logits + n_vocab);
        scratch_.clear();
        for (int32_t i = 0; i < n_vocab; ++i) {
            const float e = std::exp(logits[i] - max_logit);
            sum += e;
            if (e >= p.min_p) scratch_.emplace_back(logits[i], i);
        }
        std::sort(scratch_.begin(), scratch_.end(), before);
    }
    restore(logits, saved_);

    if (scratch_.empty()) {
        // Only non-finite logits (a broken model or penalty): no distribution to draw from.
        scratch_.emplace_back(0.0f, int32_t(std::max_element(logits, logits + n_vocab) - logits));
        max_logit = 0.0f;
        sum = 1.0;
    }
    finish(max_logit, sum, out);
}

void sampler::transform(const int32_t * ids, const float * logits, int32_t n, distribution & out) {
    const sampling_params & p = params_;
    out.ids.clear();
    out.probs.clear();
    scratch_.clear();
    for (int32_t i = 0; i < n; ++i) scratch_.emplace_back(logits[i], ids[i]);
    std::sort(scratch_.begin(), scratch_.end(), before);
    if (greedy()) {
        out.ids.push_back(scratch_[0].second);
        out.probs.push_back(1.0f);
        return;
    }
    if (p.top_k > 0 && p.top_k < n) scratch_.resize(p.top_k);
    const float max_logit = scratch_[0].first;
    double sum = 0.0;
    for (const auto & c : scratch_) sum += std::exp(c.first - max_logit);
    finish(max_logit, sum, out);
}

void sampler::finish(float max_logit, double sum, distribution & out) {
    const sampling_params & p = params_;
    const int32_t n_cand = int32_t(scratch_.size());
    std::vector<float> & w = out.probs;
    w.resize(n_cand);
    for (int32_t i = 0; i < n_cand; ++i) w[i] = std::exp(scratch_[i].first - max_logit);
    int32_t n_keep = n_cand;
    if (p.top_p < 1.0f) {
        // Smallest prefix whose mass reaches top_p (at least one token).
        double cum = 0.0;
        for (int32_t i = 0; i < n_cand; ++i) {
            cum += w[i] / sum;
            if (cum >= p.top_p) { n_keep = i + 1; break; }
        }
    }
    if (p.min_p > 0.0f) {
        // p_i >= min_p * p_max  <=>  w_i >= min_p, since w_max = 1.
        int32_t n = 1;
        while (n < n_keep && w[n] >= p.min_p) ++n;
        n_keep = n;
    }

    // Temperature last, then the softmax that defines the drawn distribution.
    double z = 0.0;
    for (int32_t i = 0; i < n_keep; ++i) {
        w[i] = std::exp((scratch_[i].first - max_logit) / p.temperature);
        z += w[i];
    }
    w.resize(n_keep);
    out.ids.resize(n_keep);
    for (int32_t i = 0; i < n_keep; ++i) {
        w[i] = float(w[i] / z);
        out.ids[i] = scratch_[i].second;
    }
}

int32_t draw(const distribution & dist, rng & r) {
    if (dist.ids.size() == 1) return dist.ids[0];
    const double u = r.uniform();
    double cum = 0.0;
    for (size_t i = 0; i < dist.ids.size(); ++i) {
        cum += dist.probs[i];
        if (u < cum) return dist.ids[i];
    }
    return dist.ids.back();  // rounding left u above the float sum
}

}  // namespace ls
