#include "step.h"

#include "head.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "decode.h"

namespace ls {

namespace {

using clock_type = std::chrono::steady_clock;

double since(clock_type::time_point t0) {
    return std::chrono::duration<double>(clock_type::now() - t0).count();
}

void seq_rm(llama_memory_t mem, llama_seq_id seq, llama_pos p0, llama_pos p1) {
    if (!llama_memory_seq_rm(mem, seq, p0, p1)) {
        throw std::runtime_error("cannot remove positions of sequence " + std::to_string(seq));
    }
}

// The tree's leading chain: nodes 0, 1, ... each the last one's child (the only nodes the
// cache can keep, see finish).
int32_t leading_chain(const draft_tree & tree) {
    int32_t n = 0;
    while (n < tree.n_nodes && tree.parents[n] == n - 1) ++n;
    return n;
}

// The tree-attention mask as sequence sets: one sequence per leaf (numbered in node order),
// and every node in the sequences of the leaves below it. Where `chain_in` is given,
// chain_in[s] is how many of the leading chain (its first `chain` nodes) leaf s's path
// holds, and with `idle_hold_chain` that chain is in the sequences without a path too
// (n_leaves .. n_shared - 1, after the leaves': a row's mask is its first sequence's, so no
// row sees them).
int32_t path_sequences(const draft_tree & tree, int32_t n_shared, std::vector<std::vector<int32_t>> & seqs,
                       std::vector<int32_t> * chain_in, int32_t chain, bool idle_hold_chain) {
    const int32_t n = tree.n_nodes;
    std::vector<bool> has_child(n, false);
    for (int32_t i = 0; i < n; ++i) {
        if (tree.parents[i] >= 0) has_child[tree.parents[i]] = true;
    }
    seqs.assign(n, {});
    int32_t n_leaves = 0;
    for (int32_t i = 0; i < n; ++i) {
        if (!has_child[i]) seqs[i].push_back(n_leaves++);
    }
    for (int32_t i = n - 1; i >= 0; --i) {  // children come after parents: push sets upwards
        const int32_t p = tree.parents[i];
        if (p >= 0) seqs[p].insert(seqs[p].end(), seqs[i].begin(), seqs[i].end());
    }
    if (chain_in) {
        std::vector<int32_t> held(n);  // per node, the leading chain's nodes on its path
        chain_in->assign(n_leaves, 0);
        for (int32_t i = 0; i < n; ++i) {
            held[i] = i < chain ? i + 1 : tree.parents[i] < 0 ? 0 : held[tree.parents[i]];
            if (!has_child[i]) (*chain_in)[seqs[i][0]] = held[i];
            if (idle_hold_chain && i < chain) {
                for (int32_t s = n_leaves; s < n_shared; ++s) seqs[i].push_back(s);
            }
        }
    }
    return n_leaves;
}

// Everything the batch added sits at positions from n_past on, in whatever sequence.
void drop(llama_memory_t mem, const launched & b) {
    seq_rm(mem, -1, b.n_past, -1);
}

// The batch's first rows: the pending tokens, in every one of n_shared sequences (as the
// context before them); the root's row outputs, and the others' with all_pending_rows.
void pending_rows(int32_t n_past, const int32_t * pending, int32_t n_pending, bool all_pending_rows, int32_t n_shared,
                  std::vector<int32_t> & tokens, std::vector<int32_t> & pos, std::vector<int8_t> & outputs,
                  std::vector<int32_t> & offsets, std::vector<int32_t> & flat) {
    for (int32_t i = 0; i < n_pending; ++i) {
        tokens[i] = pending[i];
        pos[i] = n_past + i;
        outputs[i] = all_pending_rows || i == n_pending - 1;
        for (int32_t s = 0; s < n_shared; ++s) flat.push_back(s);
        offsets[i + 1] = int32_t(flat.size());
    }
}

// The rows of a flattened tree (see launch): each leaf's path, root to leaf, leaves in
// sequence order; per row its node and sequence.
void flat_rows(const draft_tree & tree, std::vector<int32_t> & nodes, std::vector<int32_t> & seqs) {
    std::vector<bool> has_child(tree.n_nodes, false);
    for (int32_t i = 0; i < tree.n_nodes; ++i) {
        if (tree.parents[i] >= 0) has_child[tree.parents[i]] = true;
    }
    int32_t seq = 0;
    for (int32_t leaf = 0; leaf < tree.n_nodes; ++leaf) {
        if (has_child[leaf]) continue;
        const size_t start = nodes.size();
        for (int32_t i = leaf; i >= 0; i = tree.parents[i]) nodes.push_back(i);
        std::reverse(nodes.begin() + start, nodes.end());
        seqs.resize(nodes.size(), seq++);
    }
}

int32_t launch_flat(llama_context * ctx, int32_t n_past, const int32_t * pending, int32_t n_pending,
                    const draft_tree & tree, bool all_pending_rows, launched & out) {
    std::vector<int32_t> nodes, seq_of_row;
    flat_rows(tree, nodes, seq_of_row);
    out.n_past = n_past;
    out.n_pending = n_pending;
    out.n_seqs = seq_of_row.empty() ? 0 : seq_of_row.back() + 1;
    out.n_shared = int32_t(llama_n_seq_max(ctx));
    if (out.n_seqs >= out.n_shared) {
        throw std::invalid_argument("launch: a flattened tree needs a sequence more than it has leaves");
    }
    out.tokens.assign(tree.tokens, tree.tokens + tree.n_nodes);
    out.parents.assign(tree.parents, tree.parents + tree.n_nodes);
    out.seq_of.assign(tree.n_nodes, -1);
    out.node_rows.assign(tree.n_nodes, -1);
    out.flat = true;
    out.first_path.clear();

    const int32_t n_rows = n_pending + int32_t(nodes.size()), root = n_pending - 1;
    std::vector<int32_t> tokens(n_rows), pos(n_rows), offsets(n_rows + 1, 0), flat, depth(tree.n_nodes);
    std::vector<int8_t>  outputs(n_rows, 0);
    pending_rows(n_past, pending, n_pending, all_pending_rows, out.n_shared, tokens, pos, outputs, offsets, flat);
    for (int32_t i = 0; i < tree.n_nodes; ++i) depth[i] = tree.parents[i] < 0 ? 1 : depth[tree.parents[i]] + 1;
    for (size_t k = 0; k < nodes.size(); ++k) {
        const int32_t node = nodes[k], row = n_pending + int32_t(k), seq = seq_of_row[k];
        tokens[row] = tree.tokens[node];
        pos[row] = n_past + root + depth[node];
        outputs[row] = 1;
        flat.push_back(seq);
        offsets[row + 1] = int32_t(flat.size());
        if (out.node_rows[node] < 0) {
            out.node_rows[node] = row;
            out.seq_of[node] = seq;
        }
        if (seq == 0) out.first_path.push_back(node);
    }
    const auto t0 = clock_type::now();
    const int32_t status = decode(ctx, n_rows, tokens.data(), pos.data(), offsets.data(), flat.data(),
                                  outputs.data());
    out.decode_s = since(t0);
    return status;  // (llama_decode leaves a hybrid's cache as it was where it fails)
}

// After a flattened batch, every sequence as the first path's (n_kept > 0: its nodes kept)
// or as the first one without a path (the state after the pending tokens, which every
// sequence without a path shares), touching no cell before the tree's.
void keep_flat(llama_memory_t mem, const launched & b, int32_t n_kept) {
    const llama_pos first = b.n_past + b.n_pending;
    const int32_t idle = b.n_seqs;  // the first sequence without a path
    // A path's sequence back to the state after the pending tokens (a copy with an empty range
    // copies no cells: llama.cpp's recurrent copy takes the whole state whatever the range),
    // which lets its path's cells go (a recurrent state refuses a cut before its end).
    for (int32_t s = n_kept ? 1 : 0; s < b.n_seqs; ++s) {
        llama_memory_seq_cp(mem, idle, s, first, first);
        seq_rm(mem, s, first, -1);
    }
    // The first path kept whole: every other sequence gains its cells and its state.
    for (int32_t s = 1; n_kept && s < b.n_shared; ++s) llama_memory_seq_cp(mem, 0, s, first, first + n_kept);
}

}  // namespace

int32_t launch(llama_context * ctx, int32_t n_past, const int32_t * pending, int32_t n_pending,
               const draft_tree & tree, bool all_pending_rows, int32_t pad_to, int32_t pad_seq,
               launched & out, tree_layout layout) {
    if (n_pending < 1) throw std::invalid_argument("launch: the root must be pending");
    if (layout == tree_layout::flat) return launch_flat(ctx, n_past, pending, n_pending, tree, all_pending_rows, out);
    std::vector<std::vector<int32_t>> seqs;
    out.n_past = n_past;
    out.n_pending = n_pending;
    out.n_shared = pad_seq >= 0 ? pad_seq : int32_t(llama_n_seq_max(ctx));
    // A recurrent state takes no removal across sequences (finish edits it sequence by sequence).
    const llama_model * model = llama_get_model(ctx);
    const bool by_chain = layout == tree_layout::shared && !llama_model_is_recurrent(model) &&
                          !llama_model_is_hybrid(model);
    // The sequences without a path hold the leading chain from the start where copying the
    // kept nodes into each afterwards would cost more: a copy scans every cell of the cache
    // (about 1 ns a cell here), a cell in one more sequence costs llama.cpp's bookkeeping
    // about 0.2 µs kept or not, and about half the batches keep something (docs/benchmarks.md,
    // session 24: at 4,096 cells level for a chain of 8).
    const int32_t chain = leading_chain(tree);
    out.idle_hold_chain = by_chain && int64_t(llama_n_ctx(ctx)) >= 400 * int64_t(chain);
    out.n_seqs = std::max(1, path_sequences(tree, out.n_shared, seqs, by_chain ? &out.chain_in : nullptr, chain,
                                            out.idle_hold_chain));
    if (out.n_seqs > out.n_shared) {
        throw std::invalid_argument("launch: the tree has more leaves than the context has sequences");
    }
    out.tokens.assign(tree.tokens, tree.tokens + tree.n_nodes);
    out.parents.assign(tree.parents, tree.parents + tree.n_nodes);
    out.seq_of.resize(tree.n_nodes);

    // Rows: pending tokens (in every sequence, as the context before them), then the nodes at
    // the root's position + depth, then any padding.
    const int32_t n_real = n_pending + tree.n_nodes, root = n_pending - 1;
    const int32_t n_rows = pad_seq >= 0 ? std::max(n_real, pad_to) : n_real;
    out.pad_seq = n_rows > n_real ? pad_seq : -1;
    std::vector<int32_t> tokens(n_rows), pos(n_rows), offsets(n_rows + 1, 0), flat, depth(tree.n_nodes);
    std::vector<int8_t>  outputs(n_rows, 0);
    pending_rows(n_past, pending, n_pending, all_pending_rows, out.n_shared, tokens, pos, outputs, offsets, flat);
    for (int32_t i = 0; i < tree.n_nodes; ++i) {
        const int32_t p = tree.parents[i], row = n_pending + i;
        depth[i] = p < 0 ? 1 : depth[p] + 1;
        tokens[row] = tree.tokens[i];
        pos[row] = n_past + root + depth[i];
        outputs[row] = 1;
        if (layout == tree_layout::every_sequence) {
            for (int32_t s = 0; s < out.n_shared; ++s) flat.push_back(s);
        } else {
            flat.insert(flat.end(), seqs[i].begin(), seqs[i].end());
        }
        offsets[row + 1] = int32_t(flat.size());
        out.seq_of[i] = seqs[i][0];
    }
    for (int32_t row = n_real; row < n_rows; ++row) {  // outputs too: the batch's outputs keep their count
        tokens[row] = pending[root];
        pos[row] = n_past + root + 1 + (row - n_real);
        outputs[row] = 1;
        flat.push_back(pad_seq);
        offsets[row + 1] = int32_t(flat.size());
    }
    const auto t0 = clock_type::now();
    const int32_t status = decode(ctx, n_rows, tokens.data(), pos.data(), offsets.data(), flat.data(),
                                  outputs.data());
    out.decode_s = since(t0);
    if (status != 0) drop(llama_get_memory(ctx), out);
    return status;
}

sampler_on_device::sampler_on_device(llama_context * ctx, int32_t top_k) : ctx_(ctx) {
    for (uint32_t s = 0; s < llama_n_seq_max(ctx); ++s) {
        llama_sampler * chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
        llama_sampler_chain_add(chain, top_k > 0 ? llama_sampler_init_top_k(top_k) : llama_sampler_init_greedy());
        chains_.push_back(chain);
        if (!llama_set_sampler(ctx, llama_seq_id(s), chain)) {
            detach();
            throw std::runtime_error("this llama.cpp backend cannot take the sampler into its graph");
        }
    }
}

void sampler_on_device::detach() {
    for (size_t s = 0; s < chains_.size(); ++s) {
        llama_set_sampler(ctx_, llama_seq_id(s), nullptr);
        llama_sampler_free(chains_[s]);
    }
    chains_.clear();
}

namespace {

int32_t llama_candidates(llama_context * ctx, int32_t row, const int32_t ** ids, float ** logits) {
    const int32_t n = int32_t(llama_get_sampled_logits_count_ith(ctx, row));
    if (n <= 0 || int32_t(llama_get_sampled_candidates_count_ith(ctx, row)) != n) return 0;
    *ids = llama_get_sampled_candidates_ith(ctx, row);
    *logits = llama_get_sampled_logits_ith(ctx, row);
    return *ids && *logits ? n : 0;
}

}  // namespace

device_candidates_reader read_device_candidates = llama_candidates;

int32_t device_candidates(llama_context * ctx, int32_t row, const int32_t ** ids, float ** logits) {
    const int32_t n = read_device_candidates(ctx, row, ids, logits);
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(ctx)));
    for (int32_t i = 0; i < n; ++i) {
        if ((*ids)[i] < 0 || (*ids)[i] >= n_vocab) return 0;
    }
    return n;
}

namespace {

// A row's argmax from the CPU's exact head where one is on (head.h), else from llama.cpp's
// sampler in the graph.
llama_token sampled_token(llama_context * ctx, int32_t row) {
    if (head_hook * head = head_hook::of(ctx)) return head->token(row);
    return llama_get_sampled_token_ith(ctx, row);
}

}  // namespace

device_token_reader read_device_token = sampled_token;

llama_token device_token(llama_context * ctx, int32_t row) {
    const llama_token t = read_device_token(ctx, row);
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(ctx)));
    return t >= 0 && t < n_vocab ? t : -1;
}

namespace {

// Greedy verification from the rows' argmax tokens: follow the child that drafted the row's
// token, as accept_greedy does with the one-hot distribution. False: a row had no valid token.
bool verify_greedy_on_device(llama_context * ctx, const draft_tree & tree, verify_result & res) {
    std::vector<std::vector<int32_t>> children(tree.n_nodes + 1);
    for (int32_t i = 0; i < tree.n_nodes; ++i) children[tree.parents[i] + 1].push_back(i);
    for (int32_t cur = -1;;) {
        const llama_token best = device_token(ctx, row_of(tree, cur));
        if (best < 0) return false;
        int32_t next = -1;
        for (int32_t c : children[cur + 1]) {
            if (tree.tokens[c] == best) { next = c; break; }
        }
        if (next < 0) {
            res.next = best;
            return true;
        }
        res.path.push_back(next);
        cur = next;
    }
}

}  // namespace

step_result finish(llama_context * ctx, const launched & b, const int32_t * q_offsets,
                   const int32_t * q_ids, const float * q_probs, sampler & smp, rng & r,
                   const int32_t * history, int32_t n_history, rows_from rows,
                   bool keep_batch) {
    step_result res;
    const auto t0 = clock_type::now();
    llama_synchronize(ctx);  // GPU and RPC backends return from llama_decode before they finish
    res.forward_s = b.decode_s + since(t0);

    draft_tree tree;
    tree.n_nodes   = int32_t(b.tokens.size());
    tree.root_row  = b.n_pending - 1;
    tree.tokens    = b.tokens.data();
    tree.parents   = b.parents.data();
    tree.q_offsets = q_offsets;
    tree.q_ids     = q_ids;
    tree.q_probs   = q_probs;
    tree.node_rows = b.flat ? b.node_rows.data() : nullptr;
    llama_memory_t mem = llama_get_memory(ctx);
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(ctx)));
    bool ok = true;
    if (rows == rows_from::device_argmax) {
        ok = verify_greedy_on_device(ctx, tree, res.verdict);
    } else if (rows == rows_from::device_top_k) {
        auto candidates = [ctx](int32_t row) {
            row_view v;
            const int32_t * ids = nullptr;
            v.n = device_candidates(ctx, row, &ids, &v.logits);
            v.ids = ids;
            if (v.n == 0) v.logits = nullptr;
            return v;
        };
        try {
            res.verdict = verify_tree(candidates, n_vocab, tree, smp, r, history, n_history);
        } catch (const missing_row &) {
            ok = false;
        }
    } else {
        res.verdict = verify_tree(ctx, n_vocab, tree, smp, r, history, n_history);
    }
    if (!ok) {
        res.verdict = {};
        res.device_failed = true;
        if (!keep_batch && !b.flat) drop(mem, b);  // (a flattened one the caller undoes)
        return res;
    }
    if (b.flat) {
        const auto & path = res.verdict.path;
        if (!b.tokens.empty()) {  // (an empty tree left every sequence as the others)
            res.n_cached = path == b.first_path ? int32_t(path.size()) : 0;
            keep_flat(mem, b, res.n_cached);
        }
        return res;
    }

    // Keep the accepted path up to its first gap: node i sits in the i-th cell after the root
    // (see verify.py on why a token placed in a rejected node's hole would not be exact).
    const auto & path = res.verdict.path;
    while (res.n_cached < int32_t(path.size()) && path[res.n_cached] == res.n_cached) ++res.n_cached;
    if (keep_batch) return res;
    // Every sequence holds the context and the pending tokens (launch): only the tree's
    // positions change. Each llama.cpp call scans every cell of the cache (0.005 ms at 4,096
    // cells here, 0.03-0.05 at 32,768), so the calls are as few as the tree allows, and none
    // touches the context's own cells, whose sequence sets (llama.cpp keeps a position map per
    // sequence) a copy of the whole context would rewrite every iteration.
    const int32_t c = res.n_cached;
    const llama_pos first = b.n_past + b.n_pending;  // the tree's first position
    if (!b.chain_in.empty()) {
        // Past the cached nodes nothing stays, in any sequence: one call. The cached nodes
        // are the leading chain's first c; a leaf's sequence that left the chain before c
        // loses its own nodes there and gains the chain's, and the sequences without a path
        // gain them unless they hold the chain already (launch).
        seq_rm(mem, -1, first + c, -1);
        if (!c) return res;
        if (b.pad_seq >= 0) seq_rm(mem, b.pad_seq, first, first + c);
        const int32_t src = b.seq_of[path[c - 1]], n_leaves = int32_t(b.chain_in.size());
        for (int32_t s = 0; s < n_leaves; ++s) {
            const int32_t held = b.chain_in[s];
            if (held >= c) continue;
            seq_rm(mem, s, first + held, first + c);
            llama_memory_seq_cp(mem, src, s, first + held, first + c);
        }
        for (int32_t s = n_leaves; !b.idle_hold_chain && s < b.n_shared; ++s) {
            llama_memory_seq_cp(mem, src, s, first, first + c);
        }
        return res;
    }
    // A recurrent state: the other leaves' paths go, then `seq`'s past the cached nodes, and
    // the cached nodes join every sequence.
    const int32_t seq = c ? b.seq_of[path[c - 1]] : 0;
    if (b.pad_seq >= 0) seq_rm(mem, b.pad_seq, 0, -1);
    for (int32_t s = 0; s < b.n_seqs; ++s) {
        if (s != seq) seq_rm(mem, s, first, -1);
    }
    seq_rm(mem, seq, first + c, -1);
    if (c) {
        for (int32_t s = 0; s < b.n_shared; ++s) {
            if (s != seq) llama_memory_seq_cp(mem, seq, s, first, first + c);
        }
    }
    return res;
}

void abandon(llama_context * ctx, const launched & b) {
    llama_synchronize(ctx);
    drop(llama_get_memory(ctx), b);
}

}  // namespace ls
