#include "sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

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

}  // namespace

void sampler::transform(float * logits, int32_t n_vocab, const int32_t * history,
                        int32_t n_history, distribution & out) {
    const sampling_params & p = params_;
    apply_penalty(logits, history, n_history, p, saved_);
    out.ids.clear();
    out.probs.clear();

    if (greedy()) {
        int32_t best = 0;
        for (int32_t i = 1; i < n_vocab; ++i) {
            if (logits[i] > logits[best]) best = i;
        }
        restore(logits, saved_);
        out.ids.push_back(best);
        out.probs.push_back(1.0f);
        return;
    }

    // top-k: keep the k best (logit, id) pairs; all of them when top-k is off.
    const int32_t k = (p.top_k <= 0 || p.top_k >= n_vocab) ? n_vocab : p.top_k;
    scratch_.resize(n_vocab);
    for (int32_t i = 0; i < n_vocab; ++i) scratch_[i] = {logits[i], i};
    restore(logits, saved_);
    std::partial_sort(scratch_.begin(), scratch_.begin() + k, scratch_.end(), before);
    scratch_.resize(k);

    // top-p and min-p act on the temperature-1 softmax of what top-k kept.
    const float max_logit = scratch_[0].first;
    double sum = 0.0;
    std::vector<float> & w = out.probs;
    w.resize(k);
    for (int32_t i = 0; i < k; ++i) {
        w[i] = std::exp(scratch_[i].first - max_logit);
        sum += w[i];
    }
    int32_t n_keep = k;
    if (p.top_p < 1.0f) {
        // Smallest prefix whose mass reaches top_p (at least one token).
        double cum = 0.0;
        for (int32_t i = 0; i < k; ++i) {
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

int32_t sampler::draw(const distribution & dist, rng & r) const {
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
