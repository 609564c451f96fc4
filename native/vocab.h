// One pass over a vocabulary in native code: what the model load would otherwise ask of
// llama.cpp through ctypes 150k times (a second for Qwen's vocabulary).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "llama.h"

namespace ls {

// Every token's piece with special tokens rendered, each followed by a NUL byte, in id order.
std::string vocab_pieces(const llama_vocab * vocab);

// The ids that end generation (llama_vocab_is_eog).
std::vector<int32_t> eog_tokens(const llama_vocab * vocab);

}  // namespace ls
