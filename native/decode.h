// One llama_decode over a batch where every token has its own position, its own set of
// sequence ids and an output flag: the shape draft-tree verification needs.
#pragma once

#include <cstdint>

#include "llama.h"

namespace ls {

// Sequence ids of token i are seq_ids[seq_offsets[i] .. seq_offsets[i+1]).
// Returns llama_decode's status (0 = ok).
int32_t decode(llama_context * ctx, int32_t n_tokens, const int32_t * tokens, const int32_t * pos,
               const int32_t * seq_offsets, const int32_t * seq_ids, const int8_t * outputs);

}  // namespace ls
