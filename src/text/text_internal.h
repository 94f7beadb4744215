// What the tokenizer algorithms share: the vocabulary as loaded from GGUF, and the entry points of
// each algorithm. Everything here trusts TokenizerData, which vocab_load.cpp validated.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "loom/text.h"
#include "flat_index.h"
#include "pretokenize.h"

namespace loom::text {

struct TokenizerData {
  std::string file_name;
  TokenizerKind kind = TokenizerKind::spm;
  std::string pre;
  std::vector<std::string> warnings;

  // ---- vocabulary: token i's text is arena[offsets[i], offsets[i + 1]) ----
  std::string arena;
  std::vector<uint32_t> offsets;
  std::vector<TokenType> types;
  std::vector<float> scores;  // empty when the file has none
  TextIndex index;            // text -> first id with that text
  SpecialTokens special;

  // ---- tokens matched in the text before the model runs (control, unknown, user-defined) ----
  // Indexed by first byte, longest text first, so the first hit is the longest match.
  std::array<std::vector<TokenId>, 256> special_by_first_byte;

  // ---- SentencePiece ----
  bool add_space_prefix = true;
  bool spm_split_words = false;            // no token has a "▁" after another character (see encode_spm)
  std::array<TokenId, 256> byte_tokens{};  // <0xXX>, kNoToken when absent

  // ---- byte-level BPE ----
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  bool ignore_merges = false;  // a word that is itself a token skips the merges (Llama 3)
  MergeTable merges;
  std::array<TokenId, 256> byte_char_tokens{};  // token of each byte's byte-level character

  // ---- WordPiece ----
  size_t max_word_chars = 100;  // longer words become [UNK], as in BERT

  int32_t size() const { return static_cast<int32_t>(types.size()); }
  std::string_view text(TokenId id) const {
    return std::string_view(arena).substr(offsets[id], offsets[id + 1] - offsets[id]);
  }
  TokenId find(std::string_view s) const {
    return index.find(s, [this](TokenId id) { return text(id); });
  }
};

/// Append the tokens of one fragment of plain text (special tokens already taken out). The
/// byte-level BPE lives in bpe.h, because it keeps per-call state.
void encode_spm(const TokenizerData& d, std::string_view fragment, bool add_prefix,
                std::vector<TokenId>& out);
void encode_wordpiece(const TokenizerData& d, std::string_view fragment, std::vector<TokenId>& out);

/// Builds the vocabulary from the file's metadata; defined in vocab_load.cpp.
Result<std::shared_ptr<TokenizerData>> load_tokenizer_data(const GgufFile& file);

}  // namespace loom::text
