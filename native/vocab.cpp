#include "vocab.h"

namespace ls {

std::string vocab_pieces(const llama_vocab * vocab) {
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    std::string out, piece(64, '\0');
    for (int32_t t = 0; t < n_vocab; ++t) {
        int32_t n = llama_token_to_piece(vocab, t, piece.data(), int32_t(piece.size()), 0, true);
        if (n < 0) {
            piece.resize(size_t(-n));
            n = llama_token_to_piece(vocab, t, piece.data(), int32_t(piece.size()), 0, true);
        }
        out.append(piece.data(), size_t(n > 0 ? n : 0));
        out.push_back('\0');
    }
    return out;
}

std::vector<int32_t> eog_tokens(const llama_vocab * vocab) {
    std::vector<int32_t> out;
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    for (int32_t t = 0; t < n_vocab; ++t) {
        if (llama_vocab_is_eog(vocab, t)) out.push_back(t);
    }
    return out;
}

}  // namespace ls
