// The suffix store: every earlier answer (and file the user indexed) for one tokenizer,
// searchable by suffix, in the spirit of SuffixDecoding (Oliaro et al., 2025). Instead of a
// suffix tree it keeps suffix arrays, 4 bytes per token beside the tokens themselves: a
// suffix tree's node for a pattern is the range of sorted suffixes that begin with it, its
// children the sub-ranges by the next token, its count the range's size.
//
// Documents arrive one at a time, so the arrays are log-structured: each new document gets
// its own small sorted array, and neighbouring arrays merge while the older is not more than
// twice the newer's size, which keeps O(log n) arrays and merges each token O(log n) times.
#pragma once

#include <cstdint>
#include <vector>

#include "ngram.h"

namespace ls {

class suffix_store {
public:
    // Suffixes are ordered by their first `depth` tokens only: a matched pattern and the
    // draft that continues it fit within that many.
    static constexpr int32_t depth = 96;

    void add(const int32_t * tokens, int32_t n);  // one document, searchable at once
    void keep_newest(int64_t n_tokens);           // evict the oldest documents down to this
    void keep_first(int64_t n_docs);              // forget the newest documents (rollback)

    // A draft tree continuing `context`: the longest suffix of it (at most max_match tokens)
    // that occurs in the store, then what followed its occurrences, best-first by count, at
    // most max_nodes nodes and min(max_depth, alpha * match length) deep, each followed by at
    // least min_share of the occurrences; none when the suffix occurs more than
    // max_occurrences times.
    ngram_draft draft(const int32_t * context, int32_t n, int32_t max_match, int32_t max_nodes,
                      int32_t max_depth, float alpha, float min_share = 0.0f,
                      int32_t max_occurrences = 4096) const;

    int64_t n_tokens() const { return int64_t(corpus_.size() - starts_.size()); }
    int64_t n_docs() const { return int64_t(starts_.size()); }
    int64_t bytes() const;  // what it holds in memory

    // Snapshots: the documents (tokens, each followed by -1) and one array of every suffix.
    const std::vector<int32_t> & corpus() const { return corpus_; }
    std::vector<uint32_t> sorted();  // merges every array into one first
    void load(std::vector<int32_t> corpus, std::vector<uint32_t> sorted);  // throws if inconsistent

private:
    struct range { int32_t level; uint32_t lo, hi; };

    int compare(uint32_t a, uint32_t b) const;  // two suffixes, over their first `depth` tokens
    int compare(uint32_t pos, const int32_t * pattern, int32_t m) const;  // a suffix and a prefix
    std::vector<range> find(const int32_t * pattern, int32_t m) const;  // non-empty ranges only
    void merge_last();
    void filter(uint32_t lo, uint32_t hi);  // keep suffixes in [lo, hi), shifted by -lo

    std::vector<int32_t> corpus_;             // documents, each followed by -1
    std::vector<uint32_t> starts_;            // where each document begins, oldest first
    std::vector<std::vector<uint32_t>> levels_;  // sorted suffix positions, oldest level first
};

}  // namespace ls
