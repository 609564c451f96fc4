#include "verify.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace ls {

namespace {

float prob_of(const distribution & p, int32_t id) {
    for (size_t i = 0; i < p.ids.size(); ++i) {
        if (p.ids[i] == id) return p.probs[i];
    }
    return 0.0f;
}

void renormalise(distribution & p) {
    double z = 0.0;
    for (float x : p.probs) z += x;
    if (z <= 0.0) return;
    for (float & x : p.probs) x = float(x / z);
}

}  // namespace

int32_t accept_greedy(const distribution & p, const draft_tree & tree,
                      const std::vector<int32_t> & children) {
    // p is one-hot at the target's argmax: follow the child that drafted it.
    for (int32_t c : children) {
        if (tree.tokens[c] == p.ids[0]) return c;
    }
    return -1;
}

int32_t accept_deterministic(distribution & p, const draft_tree & tree,
                             const std::vector<int32_t> & children, rng & r) {
    for (int32_t c : children) {
        const int32_t x = tree.tokens[c];
        // A draft picked without sampling is a draw from the one-hot q = [x]:
        // accept with min(1, p'(x)/1) = p'(x); the residual max(0, p' - q) is p' without x.
        if (r.uniform() < prob_of(p, x)) return c;
        for (size_t i = 0; i < p.ids.size(); ++i) {
            if (p.ids[i] == x) p.probs[i] = 0.0f;
        }
        renormalise(p);
    }
    return -1;
}

int32_t accept_sampled(distribution & p, const draft_tree & tree,
                       const std::vector<int32_t> & children, rng & r) {
    for (int32_t c : children) {
        const int32_t x  = tree.tokens[c];
        const int32_t q0 = tree.q_offsets[c], q1 = tree.q_offsets[c + 1];
        float qx = 0.0f;
        for (int32_t j = q0; j < q1; ++j) {
            if (tree.q_ids[j] == x) qx = tree.q_probs[j];
        }
        const float px = prob_of(p, x);
        // q(x) >= p(x): accept with p/q; q(x) < p(x): always accept.
        if (qx <= 0.0f || r.uniform() * qx < px) return c;
        // Rejected: continue with norm(max(0, p - q)); mass q puts outside p's support is
        // irrelevant (max(0, 0 - q) = 0), so only p's support is touched.
        distribution residual = p;
        double z = 0.0;
        for (size_t i = 0; i < residual.ids.size(); ++i) {
            float q = 0.0f;
            for (int32_t j = q0; j < q1; ++j) {
                if (tree.q_ids[j] == residual.ids[i]) q = tree.q_probs[j];
            }
            residual.probs[i] = std::max(0.0f, residual.probs[i] - q);
            z += residual.probs[i];
        }
        // p == q exactly leaves nothing; then a rejection had probability 0 and only
        // rounding got here, so p stands.
        if (z > 0.0) {
            p = std::move(residual);
            renormalise(p);
        }
    }
    return -1;
}

verify_result verify_tree(const logits_rows & rows, int32_t n_vocab, const draft_tree & tree,
                          sampler & smp, rng & r, const int32_t * history, int32_t n_history) {
    // Children of each node in tree order (index 0: the root, i + 1: node i).
    std::vector<std::vector<int32_t>> children(tree.n_nodes + 1);
    for (int32_t i = 0; i < tree.n_nodes; ++i) children[tree.parents[i] + 1].push_back(i);

    std::vector<int32_t> hist(history, history + n_history);
    const int32_t window = std::max(0, smp.params().repeat_last_n);
    verify_result res;
    distribution p;
    int32_t cur = -1;  // the root
    for (;;) {
        const row_view row = rows(row_of(tree, cur));
        if (!row.logits) throw missing_row("verify: no logits for batch row " + std::to_string(row_of(tree, cur)));
        if (row.ids) {
            smp.transform(row.ids, row.logits, row.n, p);
        } else {
            const int32_t * h   = hist.data() + std::max<int32_t>(0, int32_t(hist.size()) - window);
            const int32_t   n_h = std::min<int32_t>(int32_t(hist.size()), window);
            smp.transform(row.logits, row.n, h, n_h, p);
        }
        const auto & kids = children[cur + 1];
        int32_t next = -1;
        if (!kids.empty()) {
            next = smp.greedy()       ? accept_greedy(p, tree, kids)
                 : tree.q_offsets     ? accept_sampled(p, tree, kids, r)
                                      : accept_deterministic(p, tree, kids, r);
        }
        if (next < 0) {
            res.next = draw(p, r);  // the correction, or the bonus token after a leaf
            return res;
        }
        res.path.push_back(next);
        hist.push_back(tree.tokens[next]);
        cur = next;
    }
}

verify_result verify_tree(llama_context * ctx, int32_t n_vocab, const draft_tree & tree,
                          sampler & smp, rng & r, const int32_t * history, int32_t n_history) {
    return verify_tree([ctx, n_vocab](int32_t row) { return row_view{llama_get_logits_ith(ctx, row), nullptr, n_vocab}; },
                       n_vocab, tree, smp, r, history, n_history);
}

}  // namespace ls
