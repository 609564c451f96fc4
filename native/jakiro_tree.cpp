#include "jakiro_tree.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

namespace ls {

namespace {

// Per row of layer outputs, the features the tree reads: the two branches (u + e_a, u + e_b),
// f_moe = u + s_a e_a + s_b e_b and CEPD's f_ctr = u + beta1 e_a - beta2 e_b, where a and b
// are the router's top-2 experts and s their softmax scores renormalised over the two.
struct mixed_rows {
    std::vector<float> left, right, moe, ctr;  // m × d each
};

mixed_rows mix(const jakiro_hparams & hp, const float * u, const float * experts,
               const float * router, int32_t m) {
    const int32_t d = hp.d_model, N = hp.n_experts;
    mixed_rows x;
    for (auto * v : {&x.left, &x.right, &x.moe, &x.ctr}) v->resize(size_t(m) * d);
    for (int32_t r = 0; r < m; ++r) {
        const float * g = router + size_t(r) * N;
        std::vector<int32_t> order(N);
        std::iota(order.begin(), order.end(), 0);
        // Softmax is monotone: rank by logit; ties keep the lower expert.
        std::stable_sort(order.begin(), order.end(), [g](int32_t i, int32_t j) { return g[i] > g[j]; });
        // A single expert (the EAGLE-style baseline) is both "branches" with weight 1.
        const int32_t a = order[0], b = N > 1 ? order[1] : a;
        const float s_a = N > 1 ? 1.0f / (1.0f + std::exp(g[b] - g[a])) : 1.0f;  // softmax over {a, b}
        const float s_b = 1.0f - s_a;
        const float * ur = u + size_t(r) * d;
        const float * ea = experts + (size_t(r) * N + a) * d;
        const float * eb = experts + (size_t(r) * N + b) * d;
        for (int32_t i = 0; i < d; ++i) {
            const size_t o = size_t(r) * d + i;
            x.left[o] = ur[i] + ea[i];
            x.right[o] = ur[i] + eb[i];
            x.moe[o] = ur[i] + s_a * ea[i] + s_b * eb[i];
            x.ctr[o] = ur[i] + hp.beta1 * ea[i] - hp.beta2 * eb[i];
        }
    }
    return x;
}

struct candidate {
    int32_t token;  // target id
    float prob;     // under the drafter, softmax at T = 1 over the draft vocabulary (or, with
                    // an acceptance head, its P(accepted))
};

// The k likeliest tokens of each row of head logits (rows × V), best first.
std::vector<std::vector<candidate>> top_k(const std::vector<float> & logits, int32_t rows, int32_t k,
                                          const std::vector<int32_t> & d2t) {
    const int32_t V = int32_t(d2t.size());
    k = std::min(k, V);
    std::vector<std::vector<candidate>> out(rows);
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
            out[r].push_back({d2t[idx[i]], float(std::exp(double(l[idx[i]] - top)) / z)});
        }
    }
    return out;
}

}  // namespace

grown_tree grow_jakiro_tree(jakiro_model & model, const float * u, const float * experts,
                            const float * router, int32_t root_pos, const tree_shape & shape) {
    const jakiro_hparams & hp = model.hparams();
    const int32_t d = hp.d_model, N = hp.n_experts, gamma = hp.gamma;
    const int32_t n_context = model.n_cached();
    // One expert: one branch offering twice the tokens, and no CEPD (its contrast needs two).
    const bool single = N == 1, use_cepd = shape.cepd && !single;
    const int32_t per_row = single ? 2 * shape.branch : shape.branch;
    const int32_t last_depth = use_cepd ? gamma - 1 : gamma;

    grown_tree t;
    std::vector<std::vector<float>> feed;  // per node: the feature its expansion reads
    std::vector<int32_t> slot;             // per node: its drafter KV slot once expanded
    auto add = [&](int32_t token, int32_t parent, float reach, const float * f) {
        t.tokens.push_back(token);
        t.parents.push_back(parent);
        t.reach.push_back(reach);
        feed.emplace_back(f, f + d);
        slot.push_back(-1);
        return int32_t(t.tokens.size()) - 1;
    };

    std::vector<int32_t> frontier = {-1};  // nodes whose children the current outputs predict
    std::vector<float> cur_u(u, u + d), cur_e(experts, experts + size_t(N) * d), cur_r(router, router + N);
    for (int32_t depth = 1; depth <= last_depth; ++depth) {
        const int32_t m = int32_t(frontier.size());
        const mixed_rows x = mix(hp, cur_u.data(), cur_e.data(), cur_r.data(), m);
        const bool cepd = use_cepd && depth == gamma - 1;
        // One head product for the frontier: rows [first feature of each; second of each].
        std::vector<float> rows(cepd ? x.moe : x.left);
        const std::vector<float> & second = cepd ? x.ctr : x.right;
        if (!single) rows.insert(rows.end(), second.begin(), second.end());
        const int32_t n_rows = single ? m : 2 * m;
        auto cands = top_k(model.logits(rows.data(), n_rows), n_rows, per_row, model.draft_vocab());
        if (shape.head && !cepd) {
            // From here on a candidate's prob is the head's P(accepted), read from its branch
            // feature (row r of `rows`) and its q.
            std::vector<int32_t> row_of;
            std::vector<float> q;
            for (int32_t r = 0; r < n_rows; ++r) {
                for (const candidate & c : cands[r]) row_of.push_back(r), q.push_back(c.prob);
            }
            const std::vector<float> acc = shape.head->probs(rows.data(), row_of.data(), q.data(), int32_t(q.size()));
            size_t i = 0;
            for (auto & row : cands) {
                for (candidate & c : row) c.prob = acc[i++];
            }
        }

        std::vector<int32_t> added;
        for (int32_t r = 0; r < m; ++r) {
            const int32_t node = frontier[r];
            const float base = node >= 0 ? t.reach[node] : 1.0f;
            const float * f_moe = x.moe.data() + size_t(r) * d;
            if (cepd) {
                // Step gamma - 1 from f_moe; step gamma from f_ctr of the same forward, under
                // the likeliest step gamma - 1 token.
                int32_t first = -1;
                for (const candidate & c : cands[r]) {
                    const int32_t i = add(c.token, node, base * c.prob, f_moe);
                    if (first < 0) first = i;
                }
                for (const candidate & c : cands[m + r]) add(c.token, first, t.reach[first] * c.prob, f_moe);
                continue;
            }
            std::unordered_map<int32_t, int32_t> seen;  // token -> node: both experts chose it
            for (int32_t side : {r, m + r}) {
                if (side >= n_rows) break;
                for (const candidate & c : cands[side]) {
                    auto it = seen.find(c.token);
                    if (it != seen.end()) {
                        t.reach[it->second] = std::max(t.reach[it->second], base * c.prob);
                    } else {
                        seen[c.token] = add(c.token, node, base * c.prob, f_moe);
                        added.push_back(seen[c.token]);
                    }
                }
            }
        }
        if (depth == last_depth || int32_t(t.tokens.size()) >= shape.max_nodes) break;

        // Expand the `width` likeliest new nodes in one forward, each seeing its ancestors.
        std::stable_sort(added.begin(), added.end(), [&](int32_t i, int32_t j) { return t.reach[i] > t.reach[j]; });
        if (int32_t(added.size()) > shape.width) added.resize(shape.width);
        const float need = depth - 1 < int32_t(shape.min_reach.size()) ? shape.min_reach[depth - 1] : 0.0f;
        if (added.empty() || t.reach[added[0]] <= need) break;
        const int32_t n = int32_t(added.size()), n_cached = model.n_cached(), n_kv = n_cached + n;
        std::vector<float> mask(size_t(n) * n_kv, -INFINITY), feats;
        std::vector<int32_t> tokens, pos(n, root_pos + depth - 1);  // the position of the feature read
        for (int32_t r = 0; r < n; ++r) {
            const int32_t node = added[r];
            float * row = mask.data() + size_t(r) * n_kv;
            std::fill(row, row + n_context, 0.0f);
            for (int32_t a = t.parents[node]; a >= 0; a = t.parents[a]) row[slot[a]] = 0.0f;
            row[n_cached + r] = 0.0f;
            slot[node] = n_cached + r;
            feats.insert(feats.end(), feed[node].begin(), feed[node].end());
            tokens.push_back(t.tokens[node]);
        }
        jakiro_step_out o = model.step(feats.data(), tokens.data(), pos.data(), mask.data(), n);
        ++t.n_forwards;
        frontier = std::move(added);
        cur_u = std::move(o.u);
        cur_e = std::move(o.experts);
        cur_r = std::move(o.router);
    }
    model.truncate(n_context);
    return t;
}

}  // namespace ls
