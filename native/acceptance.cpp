#include "acceptance.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace ls {

void dense::apply(const float * x, float * y) const {
    for (int32_t o = 0; o < n_out; ++o) {
        const float * w_row = w.data() + size_t(o) * n_in;
        float s = b.empty() ? 0.0f : b[o];
        for (int32_t i = 0; i < n_in; ++i) s += w_row[i] * x[i];
        y[o] = s;
    }
}

static float silu(float x) { return x / (1.0f + std::exp(-x)); }

acceptance_head::acceptance_head(dense inp, std::vector<dense> blocks, dense out, float q_scale)
    : inp_(std::move(inp)), out_(std::move(out)), blocks_(std::move(blocks)), q_scale_(q_scale) {
    const int32_t h = inp_.n_out;
    auto fits = [](const dense & d, int32_t n_in, int32_t n_out) {
        return d.n_in == n_in && d.n_out == n_out && d.w.size() == size_t(n_in) * n_out &&
               (d.b.empty() || d.b.size() == size_t(n_out));
    };
    bool ok = inp_.n_in > 2 && fits(inp_, inp_.n_in, h) && fits(out_, h, 1) && blocks_.size() % 2 == 0;
    for (const dense & d : blocks_) ok = ok && fits(d, h, h);
    if (!ok) throw std::invalid_argument("acceptance head: layer shapes do not chain");
}

std::vector<float> acceptance_head::probs(const float * f, const int32_t * row, const float * q,
                                          int32_t n) const {
    const int32_t d = d_model(), h = inp_.n_out;
    std::vector<float> x(d + 2), z(h), t(h), u(h), out(n);
    for (int32_t i = 0; i < n; ++i) {
        std::copy(f + size_t(row[i]) * d, f + size_t(row[i] + 1) * d, x.begin());
        // As head_inputs in train/acceptance_net.py: q and log q after the hidden state.
        const float qc = std::max(q[i], 1e-6f);
        x[d] = qc;
        x[d + 1] = std::log(qc);
        inp_.apply(x.data(), z.data());
        for (size_t b = 0; b < blocks_.size(); b += 2) {
            blocks_[b].apply(z.data(), t.data());
            for (float & v : t) v = silu(v);
            blocks_[b + 1].apply(t.data(), u.data());
            for (int32_t k = 0; k < h; ++k) z[k] += u[k];
        }
        for (float & v : z) v = silu(v);
        float logit;
        out_.apply(z.data(), &logit);
        const float qo = std::min(qc, 1.0f - 1e-6f);
        logit += q_scale_ * std::log(qo / (1.0f - qo));
        out[i] = 1.0f / (1.0f + std::exp(-logit));
    }
    return out;
}

}  // namespace ls
