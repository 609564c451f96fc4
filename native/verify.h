// Exact acceptance of a draft tree against the target's logits, read in place from
// llama.cpp's output buffer after one llama_decode of [root, node 0, node 1, ...].
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <vector>

#include "llama.h"
#include "sampling.h"

namespace ls {

// A draft tree in flat arrays. Node i's parent is parents[i] < i (-1: the root, i.e. the last
// accepted token). Batch rows: the root's logits are row `root_row`, node i's root_row + 1 + i,
// or node_rows[i] where the batch laid the tree out otherwise (each path in rows of its own).
struct draft_tree {
    int32_t         n_nodes  = 0;
    int32_t         root_row = 0;
    const int32_t * tokens   = nullptr;
    const int32_t * parents = nullptr;
    const int32_t * node_rows = nullptr;
    // Sampled drafts: node i was drawn from the draft distribution
    // q_ids/q_probs[q_offsets[i] .. q_offsets[i+1]). Null: drafts were picked deterministically.
    const int32_t * q_offsets = nullptr;
    const int32_t * q_ids     = nullptr;
    const float   * q_probs   = nullptr;
};

// The batch row of node `node` (-1: the root).
inline int32_t row_of(const draft_tree & tree, int32_t node) {
    return node < 0 ? tree.root_row : tree.node_rows ? tree.node_rows[node] : tree.root_row + 1 + node;
}

struct verify_result {
    std::vector<int32_t> path;          // accepted node indices, root to leaf
    int32_t              next = -1;     // the token drawn after the path (bonus or correction)
};

// A batch row's logits: the whole vocabulary's (ids null), or its best candidates' (ids[i]'s
// logit is logits[i]: a top-k sampler in the forward's graph handed them back). No logits:
// the row had none.
struct row_view {
    float         * logits = nullptr;
    const int32_t * ids    = nullptr;
    int32_t         n      = 0;
};
using logits_rows = std::function<row_view(int32_t)>;

// Walk the tree from the root, computing the target distribution only at the nodes the walk
// visits, with the same sampling transform plain generation uses. `history` is the
// penalty window before the root (the root included).
verify_result verify_tree(const logits_rows & rows, int32_t n_vocab, const draft_tree & tree,
                          sampler & smp, rng & r, const int32_t * history, int32_t n_history);

// The same, reading llama.cpp's output buffer in place (its full rows).
verify_result verify_tree(llama_context * ctx, int32_t n_vocab, const draft_tree & tree,
                          sampler & smp, rng & r, const int32_t * history, int32_t n_history);

// A row the verifier needs has no logits (from the device: no candidates came back for it).
struct missing_row : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The three acceptance rules, one step each: given the target distribution p at a node and
// that node's children, return the accepted child or -1. On -1, p holds the distribution to
// draw the correction from. Exposed for the distribution tests.

// Greedy: the child whose token is the target's argmax (p is one-hot).
int32_t accept_greedy(const distribution & p, const draft_tree & tree,
                      const std::vector<int32_t> & children);

// T > 0, deterministic drafts: test siblings in turn, accepting x with probability p'(x);
// after a rejection p'(x) = 0 and p' is renormalised.
int32_t accept_deterministic(distribution & p, const draft_tree & tree,
                             const std::vector<int32_t> & children, rng & r);

// T > 0, sampled drafts (SpecInfer's multi-branch rule): accept x ~ q with probability
// min(1, p(x)/q(x)); after a rejection p = norm(max(0, p - q)).
int32_t accept_sampled(distribution & p, const draft_tree & tree,
                       const std::vector<int32_t> & children, rng & r);

}  // namespace ls
