#include "jakiro_tree.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

namespace ls {

grown_tree grow_jakiro_tree(jakiro_model & model, const float * u, const float * experts,
                            const float * router, int32_t root_pos, const tree_shape & shape) {
    const jakiro_hparams & hp = model.hparams();
    const int32_t N = hp.n_experts, gamma = hp.gamma;
    const int32_t n_context = model.n_cached();
    // One expert: one branch offering twice the tokens, and no CEPD (its contrast needs two).
    const bool single = N == 1, use_cepd = shape.cepd && !single;
    const int32_t per_row = single ? 2 * shape.branch : shape.branch;
    const int32_t last_depth = use_cepd ? gamma - 1 : gamma;

    grown_tree t;
    std::vector<int32_t> feed;  // per node: the bank row of the feature its expansion reads
    std::vector<int32_t> slot;  // per node: its drafter KV slot once expanded
    auto add = [&](int32_t token, int32_t parent, float reach, int32_t f) {
        t.tokens.push_back(token);
        t.parents.push_back(parent);
        t.reach.push_back(reach);
        feed.push_back(f);
        slot.push_back(-1);
        return int32_t(t.tokens.size()) - 1;
    };
    auto rows_at = [&](int32_t depth) {
        return single ? head_rows::single : use_cepd && depth == gamma - 1 ? head_rows::cepd : head_rows::branches;
    };
    const bool head = shape.head != nullptr;

    std::vector<int32_t> frontier = {-1};  // nodes whose children the current candidates are
    int32_t bank_first = 0;                // the bank row of the frontier's first f_moe
    jakiro_candidates c = model.root(u, experts, router, rows_at(1), per_row, head);
    for (int32_t depth = 1; depth <= last_depth; ++depth) {
        const int32_t m = int32_t(frontier.size()), k = c.k;
        const bool cepd = rows_at(depth) == head_rows::cepd;
        auto token = [&](int32_t row, int32_t i) { return c.tokens[size_t(row) * k + i]; };
        std::vector<float> prob(c.probs);
        if (head && !cepd) {
            // From here on a candidate's prob is the head's P(accepted), read from its branch
            // feature (row r of the candidates) and its q.
            std::vector<int32_t> row_of;
            for (int32_t r = 0; r < c.rows; ++r) row_of.insert(row_of.end(), size_t(k), r);
            prob = shape.head->probs(c.features.data(), row_of.data(), c.probs.data(), int32_t(c.probs.size()));
        }
        auto p = [&](int32_t row, int32_t i) { return prob[size_t(row) * k + i]; };

        std::vector<int32_t> added;
        for (int32_t r = 0; r < m; ++r) {
            const int32_t node = frontier[r];
            const float base = node >= 0 ? t.reach[node] : 1.0f;
            const int32_t f_moe = bank_first + r;
            if (cepd) {
                // Step gamma - 1 from f_moe; step gamma from f_ctr of the same forward, under
                // the likeliest step gamma - 1 token.
                int32_t first = -1;
                for (int32_t i = 0; i < k; ++i) {
                    const int32_t n = add(token(r, i), node, base * p(r, i), f_moe);
                    if (first < 0) first = n;
                }
                for (int32_t i = 0; i < k; ++i) add(token(m + r, i), first, t.reach[first] * p(m + r, i), f_moe);
                continue;
            }
            std::unordered_map<int32_t, int32_t> seen;  // token -> node: both experts chose it
            for (int32_t side : {r, m + r}) {
                if (side >= c.rows) break;
                for (int32_t i = 0; i < k; ++i) {
                    auto it = seen.find(token(side, i));
                    if (it != seen.end()) {
                        t.reach[it->second] = std::max(t.reach[it->second], base * p(side, i));
                    } else {
                        seen[token(side, i)] = add(token(side, i), node, base * p(side, i), f_moe);
                        added.push_back(seen[token(side, i)]);
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
        std::vector<float> mask(size_t(n) * n_kv, -INFINITY);
        std::vector<int32_t> tokens, feats, pos(n, root_pos + depth - 1);  // the position of the feature read
        for (int32_t r = 0; r < n; ++r) {
            const int32_t node = added[r];
            float * row = mask.data() + size_t(r) * n_kv;
            std::fill(row, row + n_context, 0.0f);
            for (int32_t a = t.parents[node]; a >= 0; a = t.parents[a]) row[slot[a]] = 0.0f;
            row[n_cached + r] = 0.0f;
            slot[node] = n_cached + r;
            feats.push_back(feed[node]);
            tokens.push_back(t.tokens[node]);
        }
        bank_first = model.bank_rows();
        c = model.expand(feats.data(), tokens.data(), pos.data(), mask.data(), n, rows_at(depth + 1), per_row, head);
        ++t.n_forwards;
        frontier = std::move(added);
    }
    model.truncate(n_context);
    return t;
}

}  // namespace ls
