#include "decode.h"

#include "head.h"

#include <vector>

namespace ls {

int32_t decode(llama_context * ctx, int32_t n_tokens, const int32_t * tokens, const int32_t * pos,
               const int32_t * seq_offsets, const int32_t * seq_ids, const int8_t * outputs) {
    // llama_batch only points at arrays; the one thing it needs that the caller's flat
    // layout lacks is a pointer per token into the sequence-id list.
    std::vector<int32_t>        n_seq(n_tokens);
    std::vector<llama_seq_id *> seq(n_tokens);
    for (int32_t i = 0; i < n_tokens; ++i) {
        n_seq[i] = seq_offsets[i + 1] - seq_offsets[i];
        seq[i]   = const_cast<llama_seq_id *>(seq_ids + seq_offsets[i]);
    }
    llama_batch batch = {};
    batch.n_tokens = n_tokens;
    batch.token    = const_cast<llama_token *>(tokens);
    batch.pos      = const_cast<llama_pos *>(pos);
    batch.n_seq_id = n_seq.data();
    batch.seq_id   = seq.data();
    batch.logits   = const_cast<int8_t *>(outputs);
    if (head_hook * head = head_hook::of(ctx)) head->begin(n_tokens, outputs);
    return llama_decode(ctx, batch);
}

}  // namespace ls
