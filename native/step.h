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
    // Per leaf sequence, how many of the tree's leading chain (nodes 0, 1, ... each the last's
    // child: the only nodes the cache can keep) its path holds (finish). Empty where finish
    // edits sequence by sequence (a recurrent state).
    std::vector<int32_t> chain_in;
    bool idle_hold_chain = false;          // the sequences without a path hold that chain too
    int32_t n_shared = 1;                  // sequences 0.. that hold the context (every tree's)
    int32_t pad_seq = -1;                  // the sequence of the padding rows (-1: none)
    double decode_s = 0.0;                 // in llama_decode
    // Flattened (a hybrid target's tree: see launch): each node's first row, and the path
    // laid out first (sequence 0's, its nodes root to leaf).
    bool flat = false;
    std::vector<int32_t> node_rows, first_path;
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

// Every sequence but padding's holds the context's n_past positions (Context keeps it so:
// a tree's leaves then need no copy of it). Decodes `pending` (emitted tokens not yet in the cache;
// the last is the tree's root) at n_past..., then the tree's nodes at n_past + n_pending - 1
// + depth, each in the sequences of the root-to-leaf paths through it (the pending tokens in
// every sequence). Rows before the root output only with all_pending_rows (a feature drafter
// reads them). With pad_seq >= 0, rows nobody reads fill the batch up to pad_to rows, in that
// sequence alone (no other row sees them; finish() drops them): batches of a few fixed sizes
// let llama.cpp, and CUDA its captured graph, reuse the last iteration's graph. Returns
// llama_decode's status; on failure the cache is as it was.
// A hybrid target keeps a recurrent state per sequence, and llama.cpp decodes a batch for it
// as sub-batches of equal runs of disjoint sequence sets (a forward each): `layout` says how
// the tree's rows sit in sequences.
// - shared: as above (a node in the sequences of every path through it).
// - flat: each root-to-leaf path in rows of its own, in its leaf's sequence alone (shared nodes
//   repeated); the pending tokens in every sequence, so that one without a path (there must
//   be one) keeps the state after them. Two forwards at least. No padding.
// - every_sequence: a chain, every row in every sequence (one forward); the caller undoes a
//   rejection from a checkpoint (finish's keep_batch).
enum class tree_layout : int32_t { shared = 0, flat = 1, every_sequence = 2 };
int32_t launch(llama_context * ctx, int32_t n_past, const int32_t * pending, int32_t n_pending,
               const draft_tree & tree, bool all_pending_rows, int32_t pad_to, int32_t pad_seq,
               launched & out, tree_layout layout = tree_layout::shared);

// Sampling on the device: a sampler chain attached to every sequence runs inside the
// forward's graph, so a row hands back what acceptance needs instead of its full-vocabulary
// logits (600 KB a row for Qwen, copied off a GPU and then scanned on the host): with top_k 0,
// greedy's argmax (one token id); with top_k k, the row's k best candidates and their logits,
// all that exact acceptance under top-k truncation reads (top-p, min-p and temperature apply
// to them on the host). While attached, the context's rows have no full logits to read.
class sampler_on_device {
public:
    sampler_on_device(llama_context * ctx, int32_t top_k);
    ~sampler_on_device() { detach(); }
    sampler_on_device(const sampler_on_device &) = delete;
    sampler_on_device & operator=(const sampler_on_device &) = delete;

    void detach();  // the rows' logits come back again
    bool attached() const { return !chains_.empty(); }

private:
    llama_context * ctx_;
    std::vector<llama_sampler *> chains_;  // one per sequence
};

// Where a row's candidates from the device's top-k are read: their count (0: none), and where
// the ids and logits lie. The test surface swaps it as it does read_device_token.
using device_candidates_reader = int32_t (*)(llama_context * ctx, int32_t row, const int32_t ** ids,
                                              float ** logits);
extern device_candidates_reader read_device_candidates;
int32_t device_candidates(llama_context * ctx, int32_t row, const int32_t ** ids, float ** logits);

// How finish() reads the rows: their full logits on the host, the device's argmax, or the
// device's top-k candidates.
enum class rows_from : int32_t { host = 0, device_argmax = 1, device_top_k = 2 };

// Wait for the batch, verify the tree (q_* of `tree` as launched: sampled drafts' distributions),
// and keep the pending tokens and the accepted path up to its first gap, in every sequence
// but padding's (which is emptied). Throws if a KV edit fails.
// With a sampler on the device, the walk reads each row's token id or candidates instead; a row
// without valid ones ends it with device_failed set and the batch dropped.
// keep_batch: the cache is not edited at all (a recurrent state that cannot be rolled back,
// which the caller restores from a checkpoint where something was rejected).
// A flattened batch keeps the accepted path where it is the whole of the first path laid out
// (its cells follow the pending tokens', in position order), else only the pending tokens
// (the state of the sequence without a path); then every sequence is that one's copy.
step_result finish(llama_context * ctx, const launched & batch, const int32_t * q_offsets,
                   const int32_t * q_ids, const float * q_probs, sampler & smp, rng & r,
                   const int32_t * history, int32_t n_history, rows_from rows,
                   bool keep_batch = false);

// Wait for the batch and drop what it added: the cache is as it was before launch().
void abandon(llama_context * ctx, const launched & batch);

}  // namespace ls
