#include "ngram.h"

#include <algorithm>
#include <queue>

namespace ls {

uint64_t ngram_index::key(int32_t end) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the token ids
    for (int32_t i = end - n_min_; i < end; ++i) {
        h = (h ^ uint32_t(toks_[i])) * 1099511628211ull;
    }
    return h;
}

void ngram_index::extend(const int32_t * tokens, int32_t n) {
    for (int32_t i = 0; i < n; ++i) {
        toks_.push_back(tokens[i]);
        const int32_t end = int32_t(toks_.size());
        if (end >= n_min_) {
            index_[key(end)].push_back(end);
        }
    }
}

ngram_draft ngram_index::draft(int32_t max_nodes, int32_t max_depth,
                               int32_t max_occurrences) const {
    ngram_draft out;
    const int32_t len = int32_t(toks_.size());
    std::vector<int32_t> starts;  // where continuations begin, most recent first
    auto it = len >= n_min_ ? index_.find(key(len)) : index_.end();
    if (it != index_.end()) {
        // How far each earlier occurrence of the last n_min tokens matches back (at most
        // n_max): the longest match's most recent occurrences are the starts.
        int32_t best = 0, scanned = 0;
        for (auto p = it->second.rbegin(); p != it->second.rend() && scanned < max_scanned; ++p, ++scanned) {
            const int32_t pos = *p;
            if (pos >= len) continue;  // the suffix itself: nothing follows it yet
            const int32_t reach = std::min(n_max_, pos);
            int32_t m = 0;
            while (m < reach && toks_[pos - 1 - m] == toks_[len - 1 - m]) ++m;
            if (m < n_min_ || m < best) continue;  // a hash collision, or a shorter match
            if (m > best) {
                best = m;
                starts.clear();
            }
            if (int32_t(starts.size()) < max_occurrences) starts.push_back(pos);
            if (best == n_max_ && int32_t(starts.size()) == max_occurrences) break;  // none longer
        }
        out.n_match = best;
    }
    out.n_occurrences = int32_t(starts.size());
    if (starts.empty()) return out;

    // A trie of the continuations, with how many occurrences pass through each node.
    struct trie_node { int32_t token, parent, count, depth; std::vector<int32_t> children; };
    std::vector<trie_node> trie;
    std::unordered_map<uint64_t, int32_t> child_of;  // (parent + 1, token) -> node
    for (int32_t s : starts) {
        int32_t parent = -1;
        for (int32_t d = 0; d < max_depth && s + d < len; ++d) {
            const int32_t t = toks_[s + d];
            const uint64_t k = (uint64_t(uint32_t(parent + 1)) << 32) | uint32_t(t);
            auto it = child_of.find(k);
            int32_t found;
            if (it == child_of.end()) {
                found = int32_t(trie.size());
                trie.push_back({t, parent, 0, d + 1, {}});
                if (parent >= 0) trie[parent].children.push_back(found);
                child_of.emplace(k, found);
            } else {
                found = it->second;
            }
            trie[found].count++;
            parent = found;
        }
    }

    // Best-first by count (a child never outcounts its parent, so parents come first);
    // ties go to the shallower, then the more recent node.
    auto worse = [&](int32_t a, int32_t b) {
        if (trie[a].count != trie[b].count) return trie[a].count < trie[b].count;
        if (trie[a].depth != trie[b].depth) return trie[a].depth > trie[b].depth;
        return a > b;
    };
    std::priority_queue<int32_t, std::vector<int32_t>, decltype(worse)> frontier(worse);
    std::vector<int32_t> out_index(trie.size(), -1);
    for (int32_t j = 0; j < int32_t(trie.size()); ++j) {
        if (trie[j].parent < 0) frontier.push(j);
    }
    while (!frontier.empty() && int32_t(out.tokens.size()) < max_nodes) {
        const int32_t j = frontier.top();
        frontier.pop();
        out_index[j] = int32_t(out.tokens.size());
        out.tokens.push_back(trie[j].token);
        out.parents.push_back(trie[j].parent < 0 ? -1 : out_index[trie[j].parent]);
        out.counts.push_back(trie[j].count);
        for (int32_t c : trie[j].children) frontier.push(c);
    }
    return out;
}

}  // namespace ls
