// Regex pre-tokenizers of byte-level BPE vocabularies, named by `tokenizer.ggml.pre`. Each is a
// list of regexes applied in turn, as Hugging Face's Split pre-tokenizer with behavior "Isolated":
// every piece from the previous step is cut at each match, and both the matches and the text
// between them become pieces. Regexes run on PCRE2 (UTF + UCP, JIT when available).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "loom/status.h"

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;
struct pcre2_real_match_context_8;
struct pcre2_real_jit_stack_8;

namespace loom::text {

/// A named pre-tokenizer: its regexes (PCRE2 syntax) and whether a word that is itself in the
/// vocabulary skips the BPE merges (Hugging Face's `ignore_merges`, set by Llama 3).
struct PreTokenizerSpec {
  std::string_view name;
  std::vector<std::string_view> regexes;
  bool ignore_merges = false;
};

/// The spec for a `tokenizer.ggml.pre` value (aliases included), or nullptr when unknown.
const PreTokenizerSpec* find_pre_tokenizer(std::string_view name);
/// Every canonical pre-tokenizer name, for error messages and tests.
std::vector<std::string_view> pre_tokenizer_names();

/// A piece of the text being split: [begin, begin + size).
struct TextSpan {
  size_t begin;
  size_t size;
};

/// Match state of one thread; the compiled regexes are shared, this is not.
class RegexScratch {
 public:
  RegexScratch();
  ~RegexScratch();
  RegexScratch(const RegexScratch&) = delete;
  RegexScratch& operator=(const RegexScratch&) = delete;

 private:
  friend class PreTokenizer;
  pcre2_real_match_data_8* match_data_ = nullptr;
  pcre2_real_match_context_8* context_ = nullptr;  // created with a larger JIT stack on demand
  pcre2_real_jit_stack_8* jit_stack_ = nullptr;
};

/// Compiled regexes of one spec. Immutable after create(); split() may run on many threads, each
/// with its own RegexScratch.
class PreTokenizer {
 public:
  static Result<std::unique_ptr<PreTokenizer>> create(const PreTokenizerSpec& spec);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  /// Replaces `pieces` with the pieces of `text` (valid UTF-8: the caller checked it).
  Status split(std::string_view text, RegexScratch& scratch, std::vector<TextSpan>& pieces) const;

 private:
  PreTokenizer() = default;
  Status split_one(const pcre2_real_code_8* re, size_t index, std::string_view text, TextSpan piece,
                   RegexScratch& scratch, std::vector<TextSpan>& out) const;
  std::string name_;
  std::vector<pcre2_real_code_8*> regexes_;
};

}  // namespace loom::text
