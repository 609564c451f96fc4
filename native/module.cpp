// Python binding of localspec's native code: thin on purpose, the logic lives in the
// other files of native/.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cstring>

#include "decode.h"
#include "sampling.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

template <typename T> using vec_in = nb::ndarray<T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

template <typename T> nb::ndarray<nb::numpy, T, nb::ndim<1>> to_numpy(const std::vector<T> & v) {
    T * data = new T[v.size()];
    std::memcpy(data, v.data(), v.size() * sizeof(T));
    nb::capsule owner(data, [](void * p) noexcept { delete[] static_cast<T *>(p); });
    return nb::ndarray<nb::numpy, T, nb::ndim<1>>(data, {v.size()}, owner);
}

void check_row(const vec_in<float> & logits, const vec_in<const int32_t> & history) {
    for (size_t i = 0; i < history.shape(0); ++i) {
        if (history(i) < 0 || size_t(history(i)) >= logits.shape(0)) {
            throw nb::value_error("history holds a token id outside the vocabulary");
        }
    }
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

    nb::class_<ls::rng>(m, "Rng")
        .def(nb::init<uint64_t>(), "seed"_a)
        .def("uniform", &ls::rng::uniform);

    nb::class_<ls::sampler>(m, "Sampler")
        .def(nb::init<const ls::sampling_params &>(), "params"_a)
        .def_prop_ro("greedy", &ls::sampler::greedy)
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
                return s.draw(d, r);
            },
            "logits"_a, "history"_a, "rng"_a, "Transform the row and draw one token.");

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

    m.def("system_info", []() { return std::string(llama_print_system_info()); },
          "llama.cpp's system info, as the linked library reports it.");
}
