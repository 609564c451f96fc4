// One iteration of the target in two native calls: launch() decodes the pending tokens and a
// draft tree as one batch (on a GPU, llama_decode returns while the device computes, so the
// host can do other work meanwhile); finish() waits for it, accepts exactly, and leaves the KV
// cache holding the accepted path. No Python per tree node; the GIL is released in both.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "llama.h"
#include "verify.h"

namespace ls {

// A batch in flight: what finish() needs of it.
struct launched {
    int32_t n_past    = 0;
    int32_t n_pending = 0;
    int32_t n_seqs    = 1;
    std::vector<int32_t> tokens, parents;  // the tree's
    std::vector<int32_t> seq_of;           // per node, one sequence holding it
    double decode_s = 0.0;                 // in llama_decode
};

struct step_result {
    verify_result verdict;
    int32_t       n_cached  = 0;    // accepted nodes the KV cache kept (up to the first gap)
    double        forward_s = 0.0;  // in llama_decode and waiting for its outputs
};

// Sequence 0 holds n_past positions. Decodes `pending` (emitted tokens not yet in the cache;
// the last is the tree's root) at n_past..., then the tree's nodes at n_past + n_pending - 1
// + depth, each in the sequences of the root-to-leaf paths through it (sequences 1.. copy
// sequence 0 first). Rows before the root output only with all_pending_rows (a feature drafter
// reads them). Returns llama_decode's status; on failure the cache is as it was.
int32_t launch(llama_context * ctx, int32_t n_past, const int32_t * pending, int32_t n_pending,
               const draft_tree & tree, bool all_pending_rows, launched & out);

// Wait for the batch, verify the tree (q_* of `tree` as launched: sampled drafts' distributions),
// and keep in sequence 0 the pending tokens and the accepted path up to its first gap; every
// other sequence is emptied. Throws if a KV edit fails.
step_result finish(llama_context * ctx, const launched & batch, const int32_t * q_offsets,
                   const int32_t * q_ids, const float * q_probs, sampler & smp, rng & r,
                   const int32_t * history, int32_t n_history, float tie_bound);

// Wait for the batch and drop what it added: the cache is as it was before launch().
void abandon(llama_context * ctx, const launched & batch);

}  // namespace ls
