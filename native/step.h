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
    int32_t pad_seq = -1;                  // the sequence of the padding rows (-1: none)
    double decode_s = 0.0;                 // in llama_decode
};

struct step_result {
    verify_result verdict;
    int32_t       n_cached  = 0;    // accepted nodes the KV cache kept (up to the first gap)
    double        forward_s = 0.0;  // in llama_decode and waiting for its outputs
    // The device handed back no token, or one outside the vocabulary, for a row it should
    // have sampled: nothing was accepted and the batch was dropped (the cache is as before
    // launch), so the caller can decode it again with the argmax on the host.
    bool          device_failed = false;
};

// Where a row's token from the device's argmax is read (llama_get_sampled_token_ith). The
// native module's test surface swaps in a reader that hands back a bad id, as a faulty
// backend would; nothing on the request path branches on it.
using device_token_reader = llama_token (*)(llama_context * ctx, int32_t row);
extern device_token_reader read_device_token;

// A row's token from the device, or -1 where it is missing or outside the vocabulary.
llama_token device_token(llama_context * ctx, int32_t row);

// Sequence 0 holds n_past positions. Decodes `pending` (emitted tokens not yet in the cache;
// the last is the tree's root) at n_past..., then the tree's nodes at n_past + n_pending - 1
// + depth, each in the sequences of the root-to-leaf paths through it (sequences 1.. copy
// sequence 0 first). Rows before the root output only with all_pending_rows (a feature drafter
// reads them). With pad_seq >= 0, rows nobody reads fill the batch up to pad_to rows, in that
// sequence alone (no other row sees them; finish() drops them): batches of a few fixed sizes
// let llama.cpp, and CUDA its captured graph, reuse the last iteration's graph. Returns
// llama_decode's status; on failure the cache is as it was.
int32_t launch(llama_context * ctx, int32_t n_past, const int32_t * pending, int32_t n_pending,
               const draft_tree & tree, bool all_pending_rows, int32_t pad_to, int32_t pad_seq,
               launched & out);

// Greedy acceptance on the device: a greedy sampler attached to every sequence puts an argmax
// over each output row into the forward's own graph, so a batch hands back one token id per
// row instead of its full-vocabulary logits (600 KB a row for Qwen, copied off a GPU and then
// scanned on the host). While attached, the context's rows have no logits to read.
class argmax_on_device {
public:
    explicit argmax_on_device(llama_context * ctx);
    ~argmax_on_device() { detach(); }
    argmax_on_device(const argmax_on_device &) = delete;
    argmax_on_device & operator=(const argmax_on_device &) = delete;

    void detach();  // the rows' logits come back again
    bool attached() const { return !chains_.empty(); }

private:
    llama_context * ctx_;
    std::vector<llama_sampler *> chains_;  // one per sequence
};

// Wait for the batch, verify the tree (q_* of `tree` as launched: sampled drafts' distributions),
// and keep in sequence 0 the pending tokens and the accepted path up to its first gap; every
// other sequence is emptied. Throws if a KV edit fails.
// With argmax_on_device attached (greedy only), the walk reads each row's token id instead; a
// row without a valid one ends it with device_failed set and the batch dropped.
step_result finish(llama_context * ctx, const launched & batch, const int32_t * q_offsets,
                   const int32_t * q_ids, const float * q_probs, sampler & smp, rng & r,
                   const int32_t * history, int32_t n_history, float tie_bound, bool on_device);

// Wait for the batch and drop what it added: the cache is as it was before launch().
void abandon(llama_context * ctx, const launched & batch);

}  // namespace ls
