// Tokenizers built from a GGUF file's metadata alone (the `tokenizer.ggml.*` keys):
// - "llama": SentencePiece-style BPE that merges the best-scoring pair first, with byte fallback
//   (<0xXX> tokens) for characters the vocabulary lacks;
// - "gpt2": byte-level BPE over `tokenizer.ggml.merges`, after splitting the text with the
//   pre-tokenizer regexes that `tokenizer.ggml.pre` names;
// - "bert": WordPiece (lower-casing, accent stripping, greedy longest match).
// The reference is the Hugging Face tokenizer each vocabulary came from: for the vocabularies in
// ../shared/data/tokenizer, encode(text, false, true) reproduces the published vectors exactly.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loom/gguf.h"
#include "loom/status.h"

namespace loom {

/// A token id: an index into the vocabulary.
using TokenId = int32_t;
/// "No such token" (a special id the file does not define, a text not in the vocabulary).
inline constexpr TokenId kNoToken = -1;

/// The tokenizer algorithm, from `tokenizer.ggml.model`.
enum class TokenizerKind {
  spm,        ///< "llama": SentencePiece BPE with scores and byte fallback
  bpe,        ///< "gpt2": byte-level BPE with merges and a regex pre-tokenizer
  wordpiece,  ///< "bert": WordPiece
};
/// "spm", "bpe", "wordpiece".
const char* tokenizer_kind_name(TokenizerKind kind);

/// Token types, numbered as in `tokenizer.ggml.token_type`.
enum class TokenType : uint8_t {
  undefined = 0,  ///< treated as normal
  normal = 1,
  unknown = 2,       ///< the <unk> token (and placeholders some converters mark so)
  control = 3,       ///< <s>, </s>, <|endoftext|>: matched in text only when parse_special is on
  user_defined = 4,  ///< added tokens: always matched in text, decoded as their literal text
  unused = 5,
  byte = 6,  ///< <0x41>: one raw byte (SentencePiece byte fallback)
};

/// Special token ids (kNoToken where the file defines none) and whether encode(add_special=true)
/// adds BOS at the start and EOS at the end. For WordPiece, bos/eos default to cls/sep and both
/// flags default to true (BERT's "[CLS] text [SEP]").
struct SpecialTokens {
  TokenId bos = kNoToken;
  TokenId eos = kNoToken;
  TokenId eot = kNoToken;  ///< end of turn (chat models), `tokenizer.ggml.eot_token_id`
  TokenId unk = kNoToken;
  TokenId sep = kNoToken;
  TokenId pad = kNoToken;
  TokenId cls = kNoToken;
  TokenId mask = kNoToken;
  bool add_bos = false;
  bool add_eos = false;
};

namespace text {
struct TokenizerData;

/// Offset of the first byte that does not start a well-formed UTF-8 sequence (overlong forms,
/// surrogates and code points above U+10FFFF are ill-formed), or npos when `s` is valid.
size_t utf8_first_invalid(std::string_view s);
}

/// An immutable tokenizer. Cheap to copy (the vocabulary is shared); encode and decode are const
/// and safe to call from several threads at once. It keeps no reference to the GgufFile.
class Tokenizer {
 public:
  /// Reads the `tokenizer.ggml.*` keys. Errors name the file and key: a missing required key
  /// (model, tokens; scores for "llama"; merges for "gpt2"), a key of the wrong type, arrays whose
  /// length differs from the token count, an unknown model or pre-tokenizer name, a bad token type.
  /// A "gpt2" file without `tokenizer.ggml.pre` uses the GPT-2 regex and records a warning;
  /// special ids outside the vocabulary are dropped with a warning.
  static Result<Tokenizer> from_gguf(const GgufFile& file);
  /// Opens `path` and calls from_gguf.
  static Result<Tokenizer> open(const std::string& path);

  TokenizerKind kind() const;
  /// The pre-tokenizer name in use ("gpt-2", "llama-bpe", ...); empty for spm and wordpiece.
  const std::string& pre() const;
  /// Notes about the file that did not stop loading (fallbacks, ignored keys).
  const std::vector<std::string>& warnings() const;

  int32_t n_tokens() const;
  /// The token's text as stored in the vocabulary ("▁Hello", "Ġworld", "<0x0A>"); empty when out
  /// of range.
  std::string_view token_text(TokenId id) const;
  /// TokenType::undefined when out of range.
  TokenType token_type(TokenId id) const;
  /// The SentencePiece score (0 for vocabularies without scores or ids out of range).
  float token_score(TokenId id) const;
  /// The id whose stored text is exactly `text`, or kNoToken.
  TokenId find_token(std::string_view text) const;
  /// Control, unknown and unused tokens: decode() leaves them out unless render_special is set.
  bool is_special(TokenId id) const;
  const SpecialTokens& special() const;

  /// Token ids of `text`, which must be valid UTF-8 (an error names the offset of the first bad
  /// byte). add_special: BOS/EOS (CLS/SEP for WordPiece) as the file's add_* flags say.
  /// parse_special: control and unknown tokens written in the text (e.g. "<|endoftext|>") become
  /// their ids; user-defined tokens are always matched. Matching is leftmost-longest.
  Result<std::vector<TokenId>> encode(std::string_view text, bool add_special = false,
                                      bool parse_special = true) const;

  /// The bytes one token stands for: "▁" becomes a space (SPM, WordPiece), byte-level characters
  /// become their bytes (BPE: a piece may be part of a UTF-8 character), <0xXX> its byte.
  /// Special tokens (see is_special) give "" unless render_special. invalid_argument when out of
  /// range.
  Result<std::string> token_to_piece(TokenId id, bool render_special = false) const;

  /// The text of a token sequence: the pieces joined, and the space that encode() put in front of
  /// the text (SentencePiece's prefix, WordPiece's word marker) taken off again, so that
  /// decode(encode(x)) == x for byte-level BPE and for SentencePiece (unless x holds "▁" itself).
  Result<std::string> decode(std::span<const TokenId> ids, bool render_special = false) const;

 private:
  explicit Tokenizer(std::shared_ptr<const text::TokenizerData> d) : d_(std::move(d)) {}
  std::shared_ptr<const text::TokenizerData> d_;
};

/// Splits a test-vector file in the llama.cpp format: every test string is followed by a line
/// holding "__ggml_vocab_test__" (so the file is s1 "\n__ggml_vocab_test__\n" s2 ...; the last
/// separator line may lack its newline). Text after the last separator is a format_error naming
/// `name`.
Result<std::vector<std::string>> split_vocab_test_strings(std::string_view file_text, std::string_view name);

}  // namespace loom
