// Reads the `tokenizer.ggml.*` metadata into TokenizerData, checking every key before use.
#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "text_internal.h"
#include "unicode.h"

namespace loom::text {

namespace {

constexpr std::string_view kModelKey = "tokenizer.ggml.model";
constexpr std::string_view kTokensKey = "tokenizer.ggml.tokens";
constexpr std::string_view kTypesKey = "tokenizer.ggml.token_type";
constexpr std::string_view kScoresKey = "tokenizer.ggml.scores";
constexpr std::string_view kMergesKey = "tokenizer.ggml.merges";
constexpr std::string_view kPreKey = "tokenizer.ggml.pre";

Status key_error(const GgufFile& f, std::string_view key, StatusCode code, std::string_view what) {
  return make_error(code, "{}: key '{}': {}", f.name(), key, what);
}

// An optional special-token id: absent or negative (some converters write -1) means none; an id
// outside the vocabulary is dropped with a warning rather than failing the whole model.
Status read_special_id(const GgufFile& f, std::string_view key, TokenizerData& d, TokenId& id) {
  if (!f.has(key)) return {};
  Result<int64_t> v = f.get_i64(key);
  if (!v) return v.status();
  if (*v < 0) return {};
  if (*v >= d.size()) {
    d.warnings.push_back(
        fmt::format("{}: key '{}': token id {} is outside the vocabulary of {} tokens; ignored", f.name(),
                    key, *v, d.size()));
    return {};
  }
  id = static_cast<TokenId>(*v);
  return {};
}

Status read_vocabulary(const GgufFile& f, TokenizerData& d) {
  Result<std::vector<std::string_view>> tokens = f.get_string_array(kTokensKey);
  if (!tokens) return tokens.status();
  if (tokens->empty()) return key_error(f, kTokensKey, StatusCode::format_error, "the vocabulary is empty");
  if (tokens->size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    return key_error(f, kTokensKey, StatusCode::format_error,
                     fmt::format("{} tokens exceed 2^31 - 1", tokens->size()));
  size_t bytes = 0;
  for (std::string_view t : *tokens) bytes += t.size();
  if (bytes > std::numeric_limits<uint32_t>::max())
    return key_error(f, kTokensKey, StatusCode::format_error, "token texts exceed 4 GiB");

  const size_t n = tokens->size();
  d.arena.reserve(bytes);
  d.offsets.reserve(n + 1);
  for (std::string_view t : *tokens) {
    d.offsets.push_back(static_cast<uint32_t>(d.arena.size()));
    d.arena += t;
  }
  d.offsets.push_back(static_cast<uint32_t>(d.arena.size()));

  d.types.assign(n, TokenType::normal);
  if (f.has(kTypesKey)) {
    Result<std::vector<int64_t>> types = f.get_int_array(kTypesKey);
    if (!types) return types.status();
    if (types->size() != n)
      return key_error(f, kTypesKey, StatusCode::format_error,
                       fmt::format("{} entries for {} tokens", types->size(), n));
    for (size_t i = 0; i < n; ++i) {
      const int64_t t = (*types)[i];
      if (t < 0 || t > static_cast<int64_t>(TokenType::byte))
        return key_error(f, kTypesKey, StatusCode::format_error,
                         fmt::format("token {} has type {}, not one of 0..6", i, t));
      d.types[i] = t == 0 ? TokenType::normal : static_cast<TokenType>(t);
    }
  }

  if (f.has(kScoresKey)) {
    Result<std::vector<float>> scores = f.get_f32_array(kScoresKey);
    if (!scores) return scores.status();
    if (scores->size() != n)
      return key_error(f, kScoresKey, StatusCode::format_error,
                       fmt::format("{} entries for {} tokens", scores->size(), n));
    d.scores = std::move(*scores);
  }

  // The map's keys view the arena, which no longer changes. The first id of a text wins: the
  // added tokens that converters append after the base vocabulary must not shadow it.
  d.index.build(d.size(), [&d](TokenId id) { return d.text(id); });
  return {};
}

Status read_special_tokens(const GgufFile& f, TokenizerData& d) {
  SpecialTokens& s = d.special;
  LOOM_TRY(read_special_id(f, "tokenizer.ggml.bos_token_id", d, s.bos));
  LOOM_TRY(read_special_id(f, "tokenizer.ggml.eos_token_id", d, s.eos));
  LOOM_TRY(read_special_id(f, "tokenizer.ggml.eot_token_id", d, s.eot));
  LOOM_TRY(read_special_id(f, "tokenizer.ggml.unknown_token_id", d, s.unk));
  // GGUF spells it "seperator"; accept the dictionary spelling too.
  LOOM_TRY(read_special_id(f, "tokenizer.ggml.seperator_token_id", d, s.sep));
  LOOM_TRY(read_special_id(f, "tokenizer.ggml.separator_token_id", d, s.sep));
  LOOM_TRY(read_special_id(f, "tokenizer.ggml.padding_token_id", d, s.pad));
  LOOM_TRY(read_special_id(f, "tokenizer.ggml.cls_token_id", d, s.cls));
  LOOM_TRY(read_special_id(f, "tokenizer.ggml.mask_token_id", d, s.mask));

  const bool wordpiece = d.kind == TokenizerKind::wordpiece;
  if (wordpiece) {
    // BERT frames a text as [CLS] ... [SEP].
    if (s.bos == kNoToken) s.bos = s.cls;
    if (s.eos == kNoToken) s.eos = s.sep;
    if (s.unk == kNoToken) s.unk = d.find("[UNK]");
  }
  Result<bool> add_bos = f.get_bool_or("tokenizer.ggml.add_bos_token", d.kind != TokenizerKind::bpe);
  if (!add_bos) return add_bos.status();
  Result<bool> add_eos = f.get_bool_or("tokenizer.ggml.add_eos_token", wordpiece);
  if (!add_eos) return add_eos.status();
  s.add_bos = *add_bos;
  s.add_eos = *add_eos;
  if (s.add_bos && s.bos == kNoToken) {
    d.warnings.push_back(
        fmt::format("{}: BOS should be added but the file defines no BOS token; not added", f.name()));
    s.add_bos = false;
  }
  if (s.add_eos && s.eos == kNoToken) {
    d.warnings.push_back(
        fmt::format("{}: EOS should be added but the file defines no EOS token; not added", f.name()));
    s.add_eos = false;
  }

  for (TokenId id = 0; id < d.size(); ++id) {
    const TokenType t = d.types[id];
    const std::string_view text = d.text(id);
    // Only texts that are valid UTF-8 (so they start a character): a match then always cuts the
    // text at character boundaries, and the fragments between stay valid for the regexes.
    if (text.empty() || utf8_first_invalid(text) != std::string_view::npos) continue;
    if (t == TokenType::control || t == TokenType::unknown || t == TokenType::user_defined)
      d.special_by_first_byte[static_cast<uint8_t>(text[0])].push_back(id);
  }
  for (auto& bucket : d.special_by_first_byte)
    std::stable_sort(bucket.begin(), bucket.end(),
                     [&](TokenId a, TokenId b) { return d.text(a).size() > d.text(b).size(); });
  return {};
}

Status read_spm(const GgufFile& f, TokenizerData& d) {
  if (d.scores.empty())
    return key_error(f, kScoresKey, StatusCode::format_error,
                     "missing (a \"llama\" vocabulary needs scores)");
  Result<bool> prefix = f.get_bool_or("tokenizer.ggml.add_space_prefix", true);
  if (!prefix) return prefix.status();
  d.add_space_prefix = *prefix;
  constexpr std::string_view mark = "\xe2\x96\x81";  // U+2581
  d.spm_split_words = true;
  for (TokenId id = 0; id < d.size() && d.spm_split_words; ++id) {
    const std::string_view t = d.text(id);
    for (size_t i = t.find(mark, 1); i != std::string_view::npos; i = t.find(mark, i + 1))
      if (i < mark.size() || t.compare(i - mark.size(), mark.size(), mark) != 0) {
        d.spm_split_words = false;
        break;
      }
  }
  d.byte_tokens.fill(kNoToken);
  for (int b = 0; b < 256; ++b) {
    const TokenId id = d.find(fmt::format("<0x{:02X}>", b));
    if (id != kNoToken && (d.types[id] == TokenType::byte || !f.has(kTypesKey))) d.byte_tokens[b] = id;
  }
  return {};
}

Status read_bpe(const GgufFile& f, TokenizerData& d) {
  const PreTokenizerSpec* spec = nullptr;
  if (f.has(kPreKey)) {
    Result<std::string_view> pre = f.get_string(kPreKey);
    if (!pre) return pre.status();
    spec = find_pre_tokenizer(*pre);
    if (!spec)
      return key_error(f, kPreKey, StatusCode::unsupported,
                       fmt::format("unknown pre-tokenizer '{}' (known: {})", *pre,
                                   fmt::join(pre_tokenizer_names(), ", ")));
  } else {
    spec = find_pre_tokenizer("gpt-2");
    d.warnings.push_back(
        fmt::format("{}: no '{}' key; splitting words with the GPT-2 regex", f.name(), kPreKey));
  }
  d.pre = std::string(spec->name);
  d.ignore_merges = spec->ignore_merges;
  Result<std::unique_ptr<PreTokenizer>> pt = PreTokenizer::create(*spec);
  if (!pt) return pt.status();
  d.pre_tokenizer = std::move(*pt);

  for (int b = 0; b < 256; ++b) d.byte_char_tokens[b] = d.find(byte_level_char(static_cast<uint8_t>(b)));

  Result<std::vector<std::string_view>> merges = f.get_string_array(kMergesKey);
  if (!merges) return merges.status();
  if (merges->size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    return key_error(f, kMergesKey, StatusCode::format_error, "more than 2^31 - 1 merges");
  d.merges.reserve(merges->size());
  size_t unusable = 0;
  std::string joined;
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const std::string_view m = (*merges)[rank];
    const size_t space = m.find(' ');
    if (space == std::string_view::npos) {
      ++unusable;
      continue;
    }
    const std::string_view left = m.substr(0, space), right = m.substr(space + 1);
    joined.assign(left).append(right);
    const TokenId l = d.find(left), r = d.find(right), result = d.find(joined);
    if (l == kNoToken || r == kNoToken || result == kNoToken) {
      ++unusable;
      continue;
    }
    d.merges.add(l, r, BpeMerge{static_cast<int32_t>(rank), result});  // the first rank of a pair wins
  }
  if (unusable > 0)
    d.warnings.push_back(
        fmt::format("{}: key '{}': {} of {} merges are not 'left right' over vocabulary tokens; ignored",
                    f.name(), kMergesKey, unusable, merges->size()));
  return {};
}

}  // namespace

Result<std::shared_ptr<TokenizerData>> load_tokenizer_data(const GgufFile& f) {
  auto d = std::make_shared<TokenizerData>();
  d->file_name = f.name();
  Result<std::string_view> model = f.get_string(kModelKey);
  if (!model) return model.status();
  if (*model == "llama") {
    d->kind = TokenizerKind::spm;
  } else if (*model == "gpt2") {
    d->kind = TokenizerKind::bpe;
  } else if (*model == "bert") {
    d->kind = TokenizerKind::wordpiece;
  } else {
    return key_error(
        f, kModelKey, StatusCode::unsupported,
        fmt::format("tokenizer model '{}' is not supported (supported: llama, gpt2, bert)", *model));
  }
  LOOM_TRY(read_vocabulary(f, *d));
  LOOM_TRY(read_special_tokens(f, *d));
  if (d->kind == TokenizerKind::spm) LOOM_TRY(read_spm(f, *d));
  if (d->kind == TokenizerKind::bpe) LOOM_TRY(read_bpe(f, *d));
  return d;
}

}  // namespace loom::text
