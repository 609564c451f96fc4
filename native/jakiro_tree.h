// The Jakiro draft tree (the paper's Algorithm 1), grown EAGLE-2 style over the native layer
// and head: from each expanded node the two activated experts' branches each offer their
// `branch` best tokens (steps 1..gamma-2); at step gamma-1 one forward gives f_moe's tokens
// and, in parallel, f_ctr's tokens for step gamma (CEPD), placed under the best f_moe token.
// Each depth expands the `width` likeliest new nodes by cumulative draft probability. Each
// depth is one graph on the drafter's device (jakiro_model::expand): only the candidates come
// back to the host, and the features the next depth reads stay there.
#pragma once

#include <cstdint>
#include <vector>

#include "acceptance.h"
#include "jakiro.h"

namespace ls {

struct tree_shape {
    int32_t width = 4;      // nodes expanded per depth (one layer forward for all of them)
    int32_t branch = 2;     // tokens each branch offers per expanded node
    int32_t max_nodes = 16; // stop growing once the tree holds this many nodes
    bool cepd = true;       // steps gamma-1 and gamma from one forward; off: both as branches
    // Per depth d >= 1 (index d - 1): grow past depth d only while the likeliest node just
    // added there has a higher reach (the caller's cost model: what a node must be worth).
    std::vector<float> min_reach;
    // With a head: a branch token's factor in the reach is the head's P(accepted) from the
    // branch feature and the token's q, not q itself. CEPD's two steps keep q (the head learnt
    // branch features only).
    const acceptance_head * head = nullptr;
};

struct grown_tree {
    std::vector<int32_t> tokens, parents;  // parents before children; -1: child of the root
    std::vector<float> reach;              // drafter's probability of the path to each node
    int32_t n_forwards = 0;                // decoder-layer passes spent growing it
};

// Grows a tree under the root token at context position root_pos, from the layer outputs of
// the position before it (u: d, experts: N × d, router: N). The drafter's KV cache holds the
// context; it is left as it was found.
grown_tree grow_jakiro_tree(jakiro_model & model, const float * u, const float * experts,
                            const float * router, int32_t root_pos, const tree_shape & shape);

}  // namespace ls
