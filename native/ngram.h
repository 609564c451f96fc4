// Prompt lookup: an n-gram index over the whole context (prompt and generated tokens),
// updated as tokens arrive, that drafts a tree of the continuations that followed earlier
// occurrences of the context's longest matching suffix.
//
// Only the n_min-grams are indexed; a draft reads how far each occurrence of the context's
// last n_min tokens matches further back. One index per length (n_min .. n_max) cost an
// insertion into each of 31 hash maps per token: 685 ms and 90 MiB for a 32k-token prompt,
// and 0.06-0.14 ms an iteration on an edit session, the maps out of the cache after a forward.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace ls {

struct ngram_draft {
    std::vector<int32_t> tokens;
    std::vector<int32_t> parents;  // -1: child of the root; parents[i] < i
    std::vector<int32_t> counts;   // earlier occurrences that continue through this node
    int32_t n_match = 0;           // length of the matched suffix (0: no match)
    int32_t n_occurrences = 0;     // occurrences of that suffix the tree was built from
};

class ngram_index {
public:
    ngram_index(int32_t n_min, int32_t n_max) : n_min_(n_min), n_max_(n_max) {}

    void extend(const int32_t * tokens, int32_t n);
    void reset() { toks_.clear(); index_.clear(); }

    // Branches where earlier occurrences continue differently; nodes best-first by count,
    // at most max_nodes of them, at most max_depth deep, from the most recent
    // max_occurrences occurrences of the longest suffix (n_max .. n_min tokens) seen before
    // (among the max_scanned most recent occurrences of its last n_min tokens: a bound on a
    // draft's time in a text that repeats them thousands of times).
    ngram_draft draft(int32_t max_nodes, int32_t max_depth, int32_t max_occurrences) const;

    static constexpr int32_t max_scanned = 4096;

private:
    uint64_t key(int32_t end) const;  // hash of the n_min-gram toks_[end - n_min, end)

    int32_t n_min_, n_max_;
    std::vector<int32_t> toks_;
    // hash of an n_min-gram -> positions right after its occurrences (oldest first)
    std::unordered_map<uint64_t, std::vector<int32_t>> index_;
};

}  // namespace ls
