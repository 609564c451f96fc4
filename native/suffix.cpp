#include "suffix.h"

#include <algorithm>
#include <cmath>
#include <queue>
#include <stdexcept>

namespace ls {

int suffix_store::compare(uint32_t a, uint32_t b) const {
    for (int32_t i = 0; i < depth; ++i) {
        const int32_t x = corpus_[a + i], y = corpus_[b + i];
        if (x != y) return x < y ? -1 : 1;
        if (x < 0) return 0;  // both documents end here
    }
    return 0;
}

int suffix_store::compare(uint32_t pos, const int32_t * pattern, int32_t m) const {
    for (int32_t i = 0; i < m; ++i) {
        const int32_t x = corpus_[pos + i];  // -1 (a document's end) sorts before every token
        if (x != pattern[i]) return x < pattern[i] ? -1 : 1;
    }
    return 0;
}

void suffix_store::add(const int32_t * tokens, int32_t n) {
    if (n <= 0) return;
    const uint32_t start = uint32_t(corpus_.size());
    starts_.push_back(start);
    corpus_.insert(corpus_.end(), tokens, tokens + n);
    corpus_.push_back(-1);
    std::vector<uint32_t> level(n);
    for (int32_t i = 0; i < n; ++i) level[i] = start + i;
    std::sort(level.begin(), level.end(), [&](uint32_t a, uint32_t b) { return compare(a, b) < 0; });
    levels_.push_back(std::move(level));
    while (levels_.size() >= 2 && levels_[levels_.size() - 2].size() <= 2 * levels_.back().size()) {
        merge_last();
    }
}

void suffix_store::merge_last() {
    std::vector<uint32_t> b = std::move(levels_.back());
    levels_.pop_back();
    std::vector<uint32_t> & a = levels_.back();
    std::vector<uint32_t> out(a.size() + b.size());
    std::merge(a.begin(), a.end(), b.begin(), b.end(), out.begin(),
               [&](uint32_t x, uint32_t y) { return compare(x, y) < 0; });
    a = std::move(out);
}

void suffix_store::filter(uint32_t lo, uint32_t hi) {
    for (auto & level : levels_) {
        size_t k = 0;
        for (uint32_t pos : level) {
            if (pos >= lo && pos < hi) level[k++] = pos - lo;
        }
        level.resize(k);
    }
    levels_.erase(std::remove_if(levels_.begin(), levels_.end(), [](auto & l) { return l.empty(); }),
                  levels_.end());
}

void suffix_store::keep_newest(int64_t n_tokens) {
    size_t drop = 0;  // documents to evict, oldest first
    for (int64_t held = this->n_tokens(); drop < starts_.size() && held > n_tokens; ++drop) {
        const size_t end = drop + 1 < starts_.size() ? starts_[drop + 1] : corpus_.size();
        held -= int64_t(end - starts_[drop]) - 1;
    }
    if (drop == 0) return;
    const uint32_t cut = drop < starts_.size() ? starts_[drop] : uint32_t(corpus_.size());
    filter(cut, uint32_t(corpus_.size()));
    corpus_.erase(corpus_.begin(), corpus_.begin() + cut);
    starts_.erase(starts_.begin(), starts_.begin() + drop);
    for (auto & s : starts_) s -= cut;
}

void suffix_store::keep_first(int64_t n_docs) {
    if (n_docs >= int64_t(starts_.size())) return;
    const uint32_t cut = n_docs > 0 ? starts_[n_docs] : 0;
    filter(0, cut);
    corpus_.resize(cut);
    starts_.resize(n_docs);
}

int64_t suffix_store::bytes() const {
    int64_t n = int64_t(corpus_.size() * sizeof(int32_t) + starts_.size() * sizeof(uint32_t));
    for (auto & level : levels_) n += int64_t(level.size() * sizeof(uint32_t));
    return n;
}

std::vector<uint32_t> suffix_store::sorted() {
    while (levels_.size() >= 2) merge_last();
    return levels_.empty() ? std::vector<uint32_t>() : levels_[0];
}

void suffix_store::load(std::vector<int32_t> corpus, std::vector<uint32_t> sorted) {
    if (!corpus.empty() && corpus.back() != -1) throw std::invalid_argument("corpus does not end a document");
    std::vector<uint32_t> starts;
    size_t n_tokens = 0;
    for (size_t i = 0; i < corpus.size(); ++i) {
        if (i == 0 || corpus[i - 1] == -1) starts.push_back(uint32_t(i));
        if (corpus[i] != -1) ++n_tokens;
        else if (i == 0 || corpus[i - 1] == -1) throw std::invalid_argument("empty document");
    }
    if (sorted.size() != n_tokens) throw std::invalid_argument("suffix array does not cover the corpus");
    for (uint32_t pos : sorted) {
        if (pos >= corpus.size() || corpus[pos] == -1) throw std::invalid_argument("bad suffix position");
    }
    corpus_ = std::move(corpus);
    starts_ = std::move(starts);
    levels_.clear();
    if (!sorted.empty()) levels_.push_back(std::move(sorted));
    const size_t n = levels_.empty() ? 0 : levels_[0].size();
    for (size_t i = 1; i < n; ++i) {
        if (compare(levels_[0][i - 1], levels_[0][i]) > 0) {
            levels_.clear();
            throw std::invalid_argument("suffix array out of order");
        }
    }
}

std::vector<suffix_store::range> suffix_store::find(const int32_t * pattern, int32_t m) const {
    std::vector<range> out;
    for (int32_t l = 0; l < int32_t(levels_.size()); ++l) {
        const auto & sa = levels_[l];
        auto lo = std::lower_bound(sa.begin(), sa.end(), 0, [&](uint32_t pos, int) { return compare(pos, pattern, m) < 0; });
        auto hi = std::upper_bound(lo, sa.end(), 0, [&](int, uint32_t pos) { return compare(pos, pattern, m) > 0; });
        if (lo != hi) out.push_back({l, uint32_t(lo - sa.begin()), uint32_t(hi - sa.begin())});
    }
    return out;
}

ngram_draft suffix_store::draft(const int32_t * context, int32_t n, int32_t max_match, int32_t max_nodes,
                                int32_t max_depth, float alpha, float min_share, int32_t max_occurrences) const {
    ngram_draft out;
    // Occurrence is monotone in the suffix's length: search for the longest that occurs.
    int32_t lo = 0, hi = std::min({max_match, n, depth - 1});
    std::vector<range> matched;
    while (lo < hi) {
        const int32_t m = (lo + hi + 1) / 2;
        auto r = find(context + n - m, m);
        if (r.empty()) {
            hi = m - 1;
        } else {
            lo = m;
            matched = std::move(r);
        }
    }
    if (lo == 0) return out;
    out.n_match = lo;
    int32_t total = 0;
    for (auto & r : matched) total += int32_t(r.hi - r.lo);
    out.n_occurrences = total;
    // A pattern this common says little about what follows, and listing its continuations
    // would take milliseconds: no draft.
    if (total > max_occurrences) {
        out.n_occurrences = 0;
        return out;
    }
    max_depth = std::min({max_depth, depth - lo, std::max(1, int32_t(std::ceil(alpha * lo)))});

    // A node of the suffix tree: its token, where it hangs in the output, and its ranges.
    struct node { int32_t token, parent, count, depth; std::vector<range> ranges; };
    std::vector<node> nodes;

    // Children of a node: per level, the sub-ranges of suffixes by their token at `offset`
    // (sorted within the range, since all of them share the tokens before it). Only children
    // of at least min_count suffixes are wanted, and such a child holds at least
    // min_count / ranges of them in some range: looking only at the child under every
    // stride-th suffix of each range finds it (a common pattern's hundreds of rare
    // continuations are stepped over), and its parts in every range are then searched for.
    const int32_t min_count = std::max(1, int32_t(std::ceil(min_share * total)));
    struct by_token {  // suffixes in a range sorted by their token at `offset`
        const std::vector<int32_t> & corpus;
        int32_t offset;
        bool operator()(uint32_t pos, int32_t t) const { return corpus[pos + offset] < t; }
        bool operator()(int32_t t, uint32_t pos) const { return t < corpus[pos + offset]; }
    };
    auto children = [&](const std::vector<range> & ranges, int32_t offset, int32_t parent, int32_t d) {
        const by_token order{corpus_, offset};
        const uint32_t stride = std::max<uint32_t>(1, uint32_t(min_count) / uint32_t(ranges.size()));
        std::vector<int32_t> found;
        for (auto & r : ranges) {
            const auto & sa = levels_[r.level];
            for (uint32_t i = r.lo; i < r.hi;) {
                const int32_t t = corpus_[sa[i] + offset];
                const auto end = std::upper_bound(sa.begin() + i, sa.begin() + r.hi, t, order);
                if (t >= 0 && std::find(found.begin(), found.end(), t) == found.end()) found.push_back(t);
                // Children wholly between two looked-at suffixes are smaller than the stride.
                const uint32_t j = uint32_t(end - sa.begin());
                const uint32_t next = r.lo + (j - r.lo + stride - 1) / stride * stride;
                if (next >= r.hi) break;
                i = uint32_t(std::lower_bound(end, sa.begin() + next, corpus_[sa[next] + offset], order) - sa.begin());
            }
        }
        std::vector<node> kids;
        for (int32_t t : found) {
            node k{t, parent, 0, d, {}};
            for (auto & r : ranges) {
                const auto & sa = levels_[r.level];
                const auto [a, b] = std::equal_range(sa.begin() + r.lo, sa.begin() + r.hi, t, order);
                if (a != b) {
                    k.count += int32_t(b - a);
                    k.ranges.push_back({r.level, uint32_t(a - sa.begin()), uint32_t(b - sa.begin())});
                }
            }
            if (k.count >= min_count) kids.push_back(std::move(k));
        }
        return kids;
    };

    auto worse = [&](int32_t a, int32_t b) {
        if (nodes[a].count != nodes[b].count) return nodes[a].count < nodes[b].count;
        if (nodes[a].depth != nodes[b].depth) return nodes[a].depth > nodes[b].depth;
        return a > b;
    };
    std::priority_queue<int32_t, std::vector<int32_t>, decltype(worse)> frontier(worse);
    auto push_children = [&](const std::vector<range> & ranges, int32_t parent, int32_t d) {
        if (d > max_depth) return;
        for (auto & k : children(ranges, lo + d - 1, parent, d)) {
            nodes.push_back(std::move(k));
            frontier.push(int32_t(nodes.size()) - 1);
        }
    };
    push_children(matched, -1, 1);
    while (!frontier.empty() && int32_t(out.tokens.size()) < max_nodes) {
        const int32_t j = frontier.top();
        frontier.pop();
        const int32_t here = int32_t(out.tokens.size());
        out.tokens.push_back(nodes[j].token);
        out.parents.push_back(nodes[j].parent);
        out.counts.push_back(nodes[j].count);
        std::vector<range> ranges = std::move(nodes[j].ranges);
        push_children(ranges, here, nodes[j].depth + 1);
    }
    return out;
}

}  // namespace ls
