// Python binding of localspec's native code: thin on purpose, the logic lives in the
// other files of native/.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>

#include "acceptance.h"
#include "decode.h"
#include "head.h"
#include "jakiro.h"
#include "jakiro_tree.h"
#include "ngram.h"
#include "rpc.h"
#include "ggml-rpc.h"
#include "sampling.h"
#include "step.h"
#include "suffix.h"
#include "verify.h"
#include "vocab.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// The test surface's faulty backend (testing_fail_device_token): good reads, then one bad one.
int32_t     good_reads_left = 0;
llama_token bad_token       = -1;

ls::device_token_reader      real_token_reader      = nullptr;
ls::device_candidates_reader real_candidates_reader = nullptr;

void heal() {
    ls::read_device_token = real_token_reader;
    ls::read_device_candidates = real_candidates_reader;
}

llama_token faulty_device_token(llama_context * ctx, int32_t row) {
    if (good_reads_left-- > 0) return real_token_reader(ctx, row);
    heal();
    return bad_token;
}

// A row's candidates: none, or (bad_token an id) one of them replaced by it.
thread_local std::vector<int32_t> bad_ids;
int32_t faulty_device_candidates(llama_context * ctx, int32_t row, const int32_t ** ids, float ** logits) {
    const int32_t n = real_candidates_reader(ctx, row, ids, logits);
    if (good_reads_left-- > 0) return n;
    heal();
    if (bad_token < 0 || n == 0) return 0;
    bad_ids.assign(*ids, *ids + n);
    bad_ids[0] = bad_token;
    *ids = bad_ids.data();
    return n;
}

void fail_device_token(int32_t after, llama_token value) {
    if (!real_token_reader) {
        real_token_reader = ls::read_device_token;
        real_candidates_reader = ls::read_device_candidates;
    }
    good_reads_left = after;
    bad_token = value;
    ls::read_device_token = faulty_device_token;
    ls::read_device_candidates = faulty_device_candidates;
}

template <typename T> using vec_in = nb::ndarray<T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

template <typename T> nb::ndarray<nb::numpy, T, nb::ndim<1>> to_numpy(const std::vector<T> & v) {
    T * data = new T[v.size()];
    std::memcpy(data, v.data(), v.size() * sizeof(T));
    nb::capsule owner(data, [](void * p) noexcept { delete[] static_cast<T *>(p); });
    return nb::ndarray<nb::numpy, T, nb::ndim<1>>(data, {v.size()}, owner);
}

// (tokens, parents, counts, n_match, n_occurrences): a tree of what followed earlier occurrences.
nb::tuple draft_tuple(const ls::ngram_draft & d) {
    return nb::make_tuple(to_numpy(d.tokens), to_numpy(d.parents), to_numpy(d.counts), d.n_match,
                          d.n_occurrences);
}

void check_row(const vec_in<float> & logits, const vec_in<const int32_t> & history) {
    for (size_t i = 0; i < history.shape(0); ++i) {
        if (history(i) < 0 || size_t(history(i)) >= logits.shape(0)) {
            throw nb::value_error("history holds a token id outside the vocabulary");
        }
    }
}

using rows_in = nb::ndarray<float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

// A float array of any shape owning `v`'s data.
nb::ndarray<nb::numpy, float> to_numpy(std::vector<float> && v, std::initializer_list<size_t> shape) {
    auto * owned = new std::vector<float>(std::move(v));
    nb::capsule owner(owned, [](void * p) noexcept { delete static_cast<std::vector<float> *>(p); });
    return nb::ndarray<nb::numpy, float>(owned->data(), shape.size(), shape.begin(), owner);
}

// A draft tree's shape from numpy arrays, checked.
ls::draft_tree tree_of(const vec_in<const int32_t> & tokens, const vec_in<const int32_t> & parents) {
    const size_t n = tokens.shape(0);
    if (parents.shape(0) != n) throw nb::value_error("tree: tokens and parents differ in length");
    for (size_t i = 0; i < n; ++i) {
        if (parents(i) < -1 || parents(i) >= int32_t(i)) {
            throw nb::value_error("tree: every parent must come before its child");
        }
    }
    ls::draft_tree t;
    t.n_nodes = int32_t(n);
    t.tokens  = tokens.data();
    t.parents = parents.data();
    return t;
}

// A draft tree from numpy arrays; q arrays empty = deterministic drafts.
ls::draft_tree make_tree(const vec_in<const int32_t> & tokens, const vec_in<const int32_t> & parents,
                         const vec_in<const int32_t> & q_offsets, const vec_in<const int32_t> & q_ids,
                         const vec_in<const float> & q_probs) {
    ls::draft_tree t = tree_of(tokens, parents);
    const size_t n = tokens.shape(0);
    if (q_offsets.shape(0) > 0) {
        if (q_offsets.shape(0) != n + 1 || size_t(q_offsets(n)) != q_ids.shape(0) ||
            q_ids.shape(0) != q_probs.shape(0)) {
            throw nb::value_error("tree: draft distributions disagree in length");
        }
        t.q_offsets = q_offsets.data();
        t.q_ids     = q_ids.data();
        t.q_probs   = q_probs.data();
    }
    return t;
}

}  // namespace

NB_MODULE(_native, m) {
    m.doc() = "localspec native core: sampling transform and batch decode over llama.cpp";

    nb::class_<ls::sampling_params>(m, "SamplingParams")
        .def(nb::init<>())
        .def_rw("temperature", &ls::sampling_params::temperature)
        .def_rw("top_k", &ls::sampling_params::top_k)
        .def_rw("top_p", &ls::sampling_params::top_p)
        .def_rw("min_p", &ls::sampling_params::min_p)
        .def_rw("repeat_penalty", &ls::sampling_params::repeat_penalty)
        .def_rw("repeat_last_n", &ls::sampling_params::repeat_last_n);

    nb::class_<ls::rng>(m, "Rng").def(nb::init<uint64_t>(), "seed"_a);

    m.def(
        "draw",
        [](vec_in<const int32_t> ids, vec_in<const float> probs, ls::rng & r) {
            if (ids.shape(0) != probs.shape(0) || ids.shape(0) == 0) throw nb::value_error("draw: bad distribution");
            ls::distribution d;
            d.ids.assign(ids.data(), ids.data() + ids.shape(0));
            d.probs.assign(probs.data(), probs.data() + probs.shape(0));
            return ls::draw(d, r);
        },
        "ids"_a, "probs"_a, "rng"_a, "Draw a token from a distribution (ids, probs).");

    m.def(
        "token_logprobs",
        [](vec_in<const float> logits, int32_t token, int32_t k) {
            const int32_t n = int32_t(logits.shape(0));
            if (token < 0 || token >= n || k < 0) throw nb::value_error("token_logprobs: a token outside the row");
            ls::token_logprobs t;
            {
                nb::gil_scoped_release release;
                t = ls::logprobs_of(logits.data(), n, token, k);
            }
            return nb::make_tuple(t.logprob, to_numpy(t.ids), to_numpy(t.logprobs));
        },
        "logits"_a, "token"_a, "k"_a,
        "(token's log-probability, the k likeliest ids, their log-probabilities): the row's\n"
        "softmax at temperature 1, best first.");

    nb::class_<ls::sampler>(m, "Sampler")
        .def(nb::init<const ls::sampling_params &>(), "params"_a)
        .def(
            "distribution",
            [](ls::sampler & s, vec_in<float> logits, vec_in<const int32_t> history) {
                check_row(logits, history);
                ls::distribution d;
                s.transform(logits.data(), int32_t(logits.shape(0)), history.data(),
                            int32_t(history.shape(0)), d);
                return std::make_tuple(to_numpy(d.ids), to_numpy(d.probs));
            },
            "logits"_a, "history"_a,
            "(ids, probs) of the distribution a token is drawn from, best first.")
        .def(
            "sample",
            [](ls::sampler & s, vec_in<float> logits, vec_in<const int32_t> history, ls::rng & r) {
                check_row(logits, history);
                ls::distribution d;
                s.transform(logits.data(), int32_t(logits.shape(0)), history.data(),
                            int32_t(history.shape(0)), d);
                return ls::draw(d, r);
            },
            "logits"_a, "history"_a, "rng"_a, "Transform the row and draw one token.")
        .def(
            "sample_candidates",
            [](ls::sampler & s, vec_in<const int32_t> ids, vec_in<const float> logits, ls::rng & r) {
                if (ids.shape(0) != logits.shape(0) || ids.shape(0) == 0) throw nb::value_error("sample_candidates: bad row");
                ls::distribution d;
                s.transform(ids.data(), logits.data(), int32_t(ids.shape(0)), d);
                return ls::draw(d, r);
            },
            "ids"_a, "logits"_a, "rng"_a, "Transform a row's best candidates (a top-k on the device) and draw one token.");

    m.def(
        "decode",
        [](uintptr_t ctx, vec_in<const int32_t> tokens, vec_in<const int32_t> pos,
           vec_in<const int32_t> seq_offsets, vec_in<const int32_t> seq_ids,
           vec_in<const int8_t> outputs) {
            const size_t n = tokens.shape(0);
            if (pos.shape(0) != n || outputs.shape(0) != n || seq_offsets.shape(0) != n + 1 ||
                size_t(seq_offsets(n)) != seq_ids.shape(0)) {
                throw nb::value_error("decode: batch arrays disagree in length");
            }
            nb::gil_scoped_release release;
            return ls::decode(reinterpret_cast<llama_context *>(ctx), int32_t(n), tokens.data(),
                              pos.data(), seq_offsets.data(), seq_ids.data(), outputs.data());
        },
        "ctx"_a, "tokens"_a, "pos"_a, "seq_offsets"_a, "seq_ids"_a, "outputs"_a,
        "One llama_decode; token i belongs to seq_ids[seq_offsets[i]:seq_offsets[i+1]].");

    nb::class_<ls::launched>(m, "Launched")
        .def_ro("n_past", &ls::launched::n_past)
        .def_ro("n_pending", &ls::launched::n_pending)
        .def_ro("node_rows", &ls::launched::node_rows);  // a flattened tree's: each node's batch row

    m.def(
        "launch",
        [](uintptr_t ctx, int32_t n_past, vec_in<const int32_t> pending, vec_in<const int32_t> tokens,
           vec_in<const int32_t> parents, bool all_pending_rows, int32_t pad_to, int32_t pad_seq, int32_t layout) {
            const ls::draft_tree tree = tree_of(tokens, parents);
            auto * batch = new ls::launched();
            int32_t status;
            {
                nb::gil_scoped_release release;
                status = ls::launch(reinterpret_cast<llama_context *>(ctx), n_past, pending.data(),
                                    int32_t(pending.shape(0)), tree, all_pending_rows, pad_to, pad_seq, *batch,
                                    ls::tree_layout(layout));
            }
            return nb::make_tuple(nb::cast(batch, nb::rv_policy::take_ownership), status);
        },
        "ctx"_a, "n_past"_a, "pending"_a, "tokens"_a, "parents"_a, "all_pending_rows"_a, "pad_to"_a = 0,
        "pad_seq"_a = -1, "layout"_a = 0,
        "Start the target's forward over the pending tokens and a draft tree (a GPU computes it\n"
        "after this returns; layout: native/step.h's tree_layout, 0 shared, 1 flat, 2 every\n"
        "sequence). Returns (the batch in flight, llama_decode's status).");
    m.def(
        "finish",
        [](uintptr_t ctx, const ls::launched & batch, vec_in<const int32_t> q_offsets, vec_in<const int32_t> q_ids,
           vec_in<const float> q_probs, ls::sampler & smp, vec_in<const int32_t> history, ls::rng & r,
           int32_t rows, bool keep_batch) {
            const size_t n = batch.tokens.size();
            const bool sampled = q_offsets.shape(0) > 0;
            if (sampled && (q_offsets.shape(0) != n + 1 || size_t(q_offsets(n)) != q_ids.shape(0) ||
                            q_ids.shape(0) != q_probs.shape(0))) {
                throw nb::value_error("finish: draft distributions disagree in length");
            }
            ls::step_result res;
            {
                nb::gil_scoped_release release;
                res = ls::finish(reinterpret_cast<llama_context *>(ctx), batch, sampled ? q_offsets.data() : nullptr,
                                 sampled ? q_ids.data() : nullptr, sampled ? q_probs.data() : nullptr, smp, r,
                                 history.data(), int32_t(history.shape(0)), ls::rows_from(rows),
                                 keep_batch);
            }
            return nb::make_tuple(res.verdict.path, res.verdict.next, res.n_cached,
                                  res.forward_s, res.device_failed);
        },
        "ctx"_a, "batch"_a, "q_offsets"_a, "q_ids"_a, "q_probs"_a, "sampler"_a, "history"_a, "rng"_a,
        "rows"_a = 0, "keep_batch"_a = false,
        "Wait for a launched batch, verify its tree, keep the accepted path in the KV cache\n"
        "(keep_batch: leave the cache holding the whole batch).\n"
        "Returns (accepted node indices, next token, nodes cached, seconds in the forward,\n"
        "device failed: a row had no valid token from the device; nothing kept, the batch dropped).");
    nb::class_<ls::sampler_on_device>(m, "SamplerOnDevice")
        .def("__init__", [](ls::sampler_on_device * self, uintptr_t ctx, int32_t top_k) {
                 try {
                     new (self) ls::sampler_on_device(reinterpret_cast<llama_context *>(ctx), top_k);
                 } catch (const std::runtime_error & e) {
                     throw nb::value_error(e.what());
                 }
             }, "ctx"_a, "top_k"_a = 0)
        .def("detach", &ls::sampler_on_device::detach)
        .def_prop_ro("attached", &ls::sampler_on_device::attached);
    nb::class_<ls::exact_head>(m, "ExactHead")
        .def("__init__", [](ls::exact_head * self, uintptr_t weights, int32_t type, int64_t n_embd, int64_t n_vocab,
                            int32_t n_threads, int32_t copy_type) {
                 try {
                     nb::gil_scoped_release release;
                     new (self) ls::exact_head(reinterpret_cast<const uint8_t *>(weights), ggml_type(type), n_embd,
                                               n_vocab, n_threads, copy_type);
                 } catch (const std::invalid_argument & e) {
                     throw nb::value_error(e.what());
                 }
             }, "weights"_a, "type"_a, "n_embd"_a, "n_vocab"_a, "n_threads"_a, "copy_type"_a = -1,
             "The output layer's argmax without its full matmul (native/head.h); `weights`: the\n"
             "address of its matrix as the GGUF stores it, kept mapped by the caller; `copy_type`:\n"
             "the 4-bit copy's ggml type (Q4_0 2, Q4_K 12; -1: the one that fits `type`).")
        .def("argmax",
             [](ls::exact_head & h, rows_in hidden) {
                 if (hidden.shape(1) != size_t(h.n_embd())) throw nb::value_error("argmax: rows of another width");
                 std::vector<int32_t> out(hidden.shape(0));
                 nb::gil_scoped_release release;
                 h.argmax(hidden.data(), int64_t(hidden.shape(0)), out.data());
                 return out;
             }, "hidden"_a, "Each row's argmax (-1: not a finite row).")
        .def("focus",
             [](ls::exact_head & h, rows_in hidden, int32_t dims) {
                 if (hidden.shape(1) != size_t(h.n_embd())) throw nb::value_error("focus: rows of another width");
                 if (dims <= 0 || dims % ls::exact_head::LANES) throw nb::value_error("focus: dims must be a positive multiple of 8");
                 nb::gil_scoped_release release;
                 h.focus(hidden.data(), int64_t(hidden.shape(0)), dims);
             }, "hidden"_a, "dims"_a = ls::exact_head::FOCUS_DIMS,
             "Learn the `dims` dimensions these rows' energy is in (once): a second, tighter bound.")
        .def_ro("full_ms", &ls::exact_head::full_ms)
        .def_ro("approx_ms", &ls::exact_head::approx_ms)
        .def_ro("rows", &ls::exact_head::rows)
        .def_ro("rescored", &ls::exact_head::rescored)
        .def_ro("decide_seconds", &ls::exact_head::decide_seconds)
        .def_prop_ro("copy_type", &ls::exact_head::copy_type)
        .def_prop_ro("extra_bytes", &ls::exact_head::extra_bytes);
    nb::class_<ls::head_hook>(m, "HeadHook")
        .def(nb::init<ls::exact_head &>(), "head"_a, nb::keep_alive<1, 2>())
        .def_prop_ro_static("callback", [](nb::handle) { return reinterpret_cast<uintptr_t>(&ls::head_hook::eval); },
                            "The address of llama.cpp's eval callback (a context's cb_eval).")
        .def_prop_ro("address", [](ls::head_hook & h) { return reinterpret_cast<uintptr_t>(&h); },
                     "This hook's address (the context's cb_eval_user_data).")
        .def("bind",
             [](ls::head_hook & h, uintptr_t ctx) {
                 nb::gil_scoped_release release;
                 return h.bind(reinterpret_cast<llama_context *>(ctx));
             }, "ctx"_a, "Check the head against llama.cpp's logits on a few rows, then serve this context.")
        .def("unbind", &ls::head_hook::unbind)
        .def("detach", [](ls::head_hook & h) { h.on = false; }, "The rows' logits come back again.")
        .def_rw("on", &ls::head_hook::on);
    m.def(
        "sampled_candidates",
        [](uintptr_t ctx, int32_t row) {
            const int32_t * ids = nullptr;
            float * logits = nullptr;
            const int32_t n = ls::device_candidates(reinterpret_cast<llama_context *>(ctx), row, &ids, &logits);
            return std::make_tuple(to_numpy(std::vector<int32_t>(ids, ids + n)),
                                   to_numpy(std::vector<float>(logits, logits + n)));
        },
        "ctx"_a, "row"_a, "(ids, logits) of a batch row's best candidates from a top-k sampler on the device (empty: none).");
    m.def(
        "sampled_token",
        [](uintptr_t ctx, int32_t row) { return ls::device_token(reinterpret_cast<llama_context *>(ctx), row); },
        "ctx"_a, "row"_a, "The argmax of a batch row that ArgmaxOnDevice put into the graph (-1: none, or not a token).");
    m.def("testing_fail_device_token", &fail_device_token, "after"_a, "value"_a = -1,
          "Test surface: after `after` good reads, one read of a row's device token hands back\n"
          "`value` (-1: none; or an id outside the vocabulary), as a faulty backend would.");
    m.def(
        "abandon",
        [](uintptr_t ctx, const ls::launched & batch) {
            nb::gil_scoped_release release;
            ls::abandon(reinterpret_cast<llama_context *>(ctx), batch);
        },
        "ctx"_a, "batch"_a, "Wait for a launched batch and drop what it added to the KV cache.");

    m.def(
        "verify_trials",
        [](vec_in<float> root_row, rows_in markov, vec_in<const int32_t> tokens,
           vec_in<const int32_t> parents, vec_in<const int32_t> q_offsets, vec_in<const int32_t> q_ids,
           vec_in<const float> q_probs, ls::sampler & smp, uint64_t seed, int64_t n_trials) {
            ls::draft_tree tree = make_tree(tokens, parents, q_offsets, q_ids, q_probs);
            const int32_t n_vocab = int32_t(root_row.shape(0));
            if (markov.shape(0) != size_t(n_vocab) || markov.shape(1) != size_t(n_vocab)) {
                throw nb::value_error("markov: one logits row per token");
            }
            std::vector<int32_t> out(size_t(n_trials) * 2, -1);
            {
                nb::gil_scoped_release release;
                ls::rng r(seed);
                std::vector<int32_t> drawn(tokens.data(), tokens.data() + tree.n_nodes);
                tree.tokens = drawn.data();
                // A Markov target: the logits after token x are markov[x], whatever came before.
                auto row = [&](int32_t i) {
                    return ls::row_view{i == 0 ? root_row.data() : markov.data() + size_t(drawn[i - 1]) * n_vocab,
                                        nullptr, n_vocab};
                };
                for (int64_t t = 0; t < n_trials; ++t) {
                    if (tree.q_offsets) {  // sampled drafts: draw each node from its q afresh
                        for (int32_t i = 0; i < tree.n_nodes; ++i) {
                            ls::distribution q;
                            q.ids.assign(tree.q_ids + tree.q_offsets[i], tree.q_ids + tree.q_offsets[i + 1]);
                            q.probs.assign(tree.q_probs + tree.q_offsets[i], tree.q_probs + tree.q_offsets[i + 1]);
                            drawn[i] = ls::draw(q, r);
                        }
                    }
                    const ls::verify_result res = ls::verify_tree(row, n_vocab, tree, smp, r, nullptr, 0);
                    std::vector<int32_t> emitted;
                    for (int32_t node : res.path) emitted.push_back(drawn[node]);
                    emitted.push_back(res.next);
                    out[2 * t] = emitted[0];
                    if (emitted.size() > 1) out[2 * t + 1] = emitted[1];
                }
            }
            return to_numpy(out);
        },
        "root_row"_a, "markov"_a, "tokens"_a, "parents"_a, "q_offsets"_a, "q_ids"_a, "q_probs"_a,
        "sampler"_a, "seed"_a, "n_trials"_a,
        "Run the verifier n_trials times against a Markov target (root row, then markov[x] after\n"
        "token x); sampled trees redraw their tokens from q each trial. Returns the first two\n"
        "emitted tokens of each trial, flattened (-1: none). For the distribution tests.");

    nb::class_<ls::ngram_index>(m, "NgramIndex")
        .def(nb::init<int32_t, int32_t>(), "n_min"_a, "n_max"_a)
        .def("extend", [](ls::ngram_index & g, vec_in<const int32_t> t) {
            g.extend(t.data(), int32_t(t.shape(0)));
        })
        .def("reset", &ls::ngram_index::reset)
        .def(
            "draft",
            [](const ls::ngram_index & g, int32_t max_nodes, int32_t max_depth, int32_t max_occurrences) {
                return draft_tuple(g.draft(max_nodes, max_depth, max_occurrences));
            },
            "max_nodes"_a, "max_depth"_a, "max_occurrences"_a = 32,
            "(tokens, parents, counts, n_match, n_occurrences) of a draft tree.");

    nb::class_<ls::suffix_store>(m, "SuffixStore")
        .def(nb::init<>())
        .def_ro_static("depth", &ls::suffix_store::depth)
        .def_prop_ro("n_tokens", &ls::suffix_store::n_tokens)
        .def_prop_ro("n_docs", &ls::suffix_store::n_docs)
        .def_prop_ro("bytes", &ls::suffix_store::bytes)
        .def("add", [](ls::suffix_store & s, vec_in<const int32_t> t) { s.add(t.data(), int32_t(t.shape(0))); })
        .def("keep_newest", &ls::suffix_store::keep_newest, "n_tokens"_a)
        .def("keep_first", &ls::suffix_store::keep_first, "n_docs"_a)
        .def(
            "draft",
            [](const ls::suffix_store & s, vec_in<const int32_t> context, int32_t max_match, int32_t max_nodes,
               int32_t max_depth, float alpha, float min_share, int32_t max_occurrences) {
                return draft_tuple(s.draft(context.data(), int32_t(context.shape(0)), max_match, max_nodes,
                                           max_depth, alpha, min_share, max_occurrences));
            },
            "context"_a, "max_match"_a, "max_nodes"_a, "max_depth"_a, "alpha"_a, "min_share"_a = 0.0f,
            "max_occurrences"_a = 4096,
            "(tokens, parents, counts, n_match, n_occurrences) of a draft tree.")
        .def("corpus", [](const ls::suffix_store & s) { return to_numpy(s.corpus()); })
        .def("sorted", [](ls::suffix_store & s) { return to_numpy(s.sorted()); })
        .def("load", [](ls::suffix_store & s, vec_in<const int32_t> corpus, vec_in<const uint32_t> sorted) {
            try {
                s.load(std::vector<int32_t>(corpus.data(), corpus.data() + corpus.shape(0)),
                       std::vector<uint32_t>(sorted.data(), sorted.data() + sorted.shape(0)));
            } catch (const std::invalid_argument & e) {
                throw nb::value_error(e.what());
            }
        });

    nb::class_<ls::jakiro_model>(m, "JakiroModel")
        .def(nb::init<const std::string &, const std::string &, int32_t, int32_t, bool>(), "drafter"_a,
             "target"_a, "n_ctx"_a, "n_threads"_a, "full_vocab"_a = false)
        .def_prop_ro("n_cached", &ls::jakiro_model::n_cached)
        .def_prop_ro("device", &ls::jakiro_model::device)
        .def("draft_vocab", [](const ls::jakiro_model & j) { return to_numpy(j.draft_vocab()); })
        .def(
            "step",
            [](ls::jakiro_model & j, rows_in feats, vec_in<const int32_t> tokens, vec_in<const int32_t> pos,
               rows_in mask) {
                const size_t n = tokens.shape(0), d = size_t(j.hparams().d_model),
                             N = size_t(j.hparams().n_experts);
                if (feats.shape(0) != n || feats.shape(1) != d || pos.shape(0) != n ||
                    mask.shape(0) != n || mask.shape(1) != size_t(j.n_cached()) + n) {
                    throw nb::value_error("step: feats (n, d), tokens (n), pos (n), mask (n, n_cached + n)");
                }
                ls::jakiro_step_out o = j.step(feats.data(), tokens.data(), pos.data(), mask.data(), int32_t(n));
                return nb::make_tuple(to_numpy(std::move(o.u), {n, d}),
                                      to_numpy(std::move(o.experts), {n, N, d}),
                                      to_numpy(std::move(o.router), {n, N}));
            },
            "feats"_a, "tokens"_a, "pos"_a, "mask"_a,
            "One decoder-layer pass: (u, expert outputs (n, N, d), router logits (n, N)).")
        .def(
            "logits",
            [](ls::jakiro_model & j, rows_in feats) {
                if (feats.shape(1) != size_t(j.hparams().d_model)) throw nb::value_error("logits: feats (m, d)");
                const size_t m = feats.shape(0);
                return to_numpy(j.logits(feats.data(), int32_t(m)), {m, j.draft_vocab().size()});
            },
            "feats"_a, "Head logits over the draft vocabulary, (m, V').")
        .def("truncate", &ls::jakiro_model::truncate, "n"_a)
        .def(
            "grow_tree",
            [](ls::jakiro_model & j, vec_in<const float> u, vec_in<const float> experts,
               vec_in<const float> router, int32_t root_pos, int32_t width, int32_t branch,
               int32_t max_nodes, bool cepd, vec_in<const float> min_reach,
               const ls::acceptance_head * head) {
                const size_t d = size_t(j.hparams().d_model), N = size_t(j.hparams().n_experts);
                if (u.shape(0) != d || experts.shape(0) != N * d || router.shape(0) != N) {
                    throw nb::value_error("grow_tree: u (d), experts (N * d), router (N) of one position");
                }
                if (width < 1 || branch < 1) throw nb::value_error("grow_tree: width and branch must be >= 1");
                ls::tree_shape shape{width, branch, max_nodes, cepd,
                                     std::vector<float>(min_reach.data(), min_reach.data() + min_reach.shape(0)),
                                     head};
                if (head && head->d_model() != j.hparams().d_model) {
                    throw nb::value_error("grow_tree: the head reads features of another width");
                }
                ls::grown_tree t = ls::grow_jakiro_tree(j, u.data(), experts.data(), router.data(), root_pos, shape);
                return nb::make_tuple(to_numpy(t.tokens), to_numpy(t.parents), to_numpy(t.reach), t.n_forwards);
            },
            "u"_a, "experts"_a, "router"_a, "root_pos"_a, "width"_a, "branch"_a, "max_nodes"_a,
            "cepd"_a, "min_reach"_a, "head"_a.none() = nb::none(),
            "Algorithm 1's draft tree under the root at root_pos: (tokens, parents, reach, n_forwards); "
            "with an acceptance head, branch tokens' reach uses its P(accepted).");

    nb::class_<ls::acceptance_head>(m, "AcceptanceHead")
        .def(
            "__init__",
            [](ls::acceptance_head * self, nb::list layers, float q_scale) {
                // layers: (weight (out, in), bias (out)) pairs: input, block ups and downs, output.
                std::vector<ls::dense> ds;
                for (nb::handle item : layers) {
                    auto pair = nb::cast<nb::tuple>(item);
                    auto w = nb::cast<rows_in>(pair[0]);
                    auto b = nb::cast<vec_in<const float>>(pair[1]);
                    ls::dense d{int32_t(w.shape(1)), int32_t(w.shape(0)),
                                std::vector<float>(w.data(), w.data() + w.size()),
                                std::vector<float>(b.data(), b.data() + b.shape(0))};
                    ds.push_back(std::move(d));
                }
                if (ds.size() < 2) throw nb::value_error("acceptance head: needs input and output layers");
                ls::dense inp = std::move(ds.front()), out = std::move(ds.back());
                new (self) ls::acceptance_head(std::move(inp), std::vector<ls::dense>(ds.begin() + 1, ds.end() - 1),
                                               std::move(out), q_scale);
            },
            "layers"_a, "q_scale"_a)
        .def_prop_ro("d_model", &ls::acceptance_head::d_model)
        .def(
            "probs",
            [](const ls::acceptance_head & h, rows_in f, vec_in<const int32_t> row, vec_in<const float> q) {
                const size_t n = q.shape(0);
                if (f.shape(1) != size_t(h.d_model()) || row.shape(0) != n) {
                    throw nb::value_error("probs: f (rows, d_model), row (n), q (n)");
                }
                for (size_t i = 0; i < n; ++i) {
                    if (row(i) < 0 || size_t(row(i)) >= f.shape(0)) throw nb::value_error("probs: row out of range");
                }
                return to_numpy(h.probs(f.data(), row.data(), q.data(), int32_t(n)));
            },
            "f"_a, "row"_a, "q"_a, "P(accepted) of each token q[i] drafted under hidden state f[row[i]].");

    m.def(
        "vocab_pieces",
        [](uintptr_t model) {
            const llama_vocab * v = llama_model_get_vocab(reinterpret_cast<llama_model *>(model));
            std::string pieces;
            {
                nb::gil_scoped_release release;
                pieces = ls::vocab_pieces(v);
            }
            return nb::bytes(pieces.data(), pieces.size());
        },
        "model"_a, "Every token's piece (special tokens rendered), each followed by a NUL byte.");
    m.def(
        "eog_tokens",
        [](uintptr_t model) { return ls::eog_tokens(llama_model_get_vocab(reinterpret_cast<llama_model *>(model))); },
        "model"_a, "The token ids that end generation.");

    m.def("system_info", []() { return std::string(llama_print_system_info()); },
          "llama.cpp's system info, as the linked library reports it.");

    // Devices cross into Python as addresses: a model's NULL-terminated device list is built
    // from them (llama_model_params.devices).
    auto addresses = [](const std::vector<ggml_backend_dev_t> & devices) {
        std::vector<uintptr_t> out;
        for (auto d : devices) out.push_back(reinterpret_cast<uintptr_t>(d));
        return out;
    };
    m.def("gpus", []() {
              std::vector<std::tuple<std::string, size_t, size_t>> out;
              for (ggml_backend_dev_t dev : local_gpus()) {
                  size_t free = 0, total = 0;
                  ggml_backend_dev_memory(dev, &free, &total);
                  out.emplace_back(ggml_backend_dev_description(dev), free, total);
              }
              return out;
          },
          "This machine's GPUs that the linked llama.cpp can use: (description, free bytes, total bytes).");
    m.def("rpc_add_server", [addresses](const std::string & endpoint) { return addresses(rpc_add_server(endpoint)); },
          "endpoint"_a, "Register a running rpc-server's devices; their addresses.");
    m.def("local_gpus", [addresses]() { return addresses(local_gpus()); },
          "Addresses of this machine's GPUs (no RPC devices).");
    m.def("rpc_serve", [](const std::string & endpoint, const std::string & cache_dir, int n_threads) {
              nb::gil_scoped_release unlocked;  // serves until the process ends
              rpc_serve(endpoint, cache_dir, n_threads);
          }, "endpoint"_a, "cache_dir"_a, "n_threads"_a,
          "Serve this machine's devices to RPC clients; returns only if it could not listen.");
    m.def("rpc_keepalive", &rpc_keepalive, "endpoints"_a, "idle"_a, "interval"_a, "count"_a,
          "TCP keepalive on this process's sockets to these endpoints; how many were set.");
    m.def("rpc_exit_cleanly_on_abort", &rpc_exit_cleanly_on_abort,
          "A lost RPC connection ends the process with one line and status 1, not a backtrace.");
    m.attr("rpc_protocol") = nb::make_tuple(RPC_PROTO_MAJOR_VERSION, RPC_PROTO_MINOR_VERSION,
                                            RPC_PROTO_PATCH_VERSION);
    remember_terminal();  // before any full-screen app takes it over
}
