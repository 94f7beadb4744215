// The Tokenizer front end: special-token matching, dispatch to the algorithm, and decoding.
#include <fmt/format.h>

#include <optional>

#include "loom/text.h"
#include "bpe.h"
#include "text_internal.h"
#include "unicode.h"

namespace loom {

using text::TokenizerData;

const char* tokenizer_kind_name(TokenizerKind kind) {
  switch (kind) {
    case TokenizerKind::spm:
      return "spm";
    case TokenizerKind::bpe:
      return "bpe";
    case TokenizerKind::wordpiece:
      return "wordpiece";
  }
  return "invalid";
}

namespace {

constexpr std::string_view kSpaceMark = "\xe2\x96\x81";  // U+2581, SentencePiece's visible space

// Tokens taken out of the text before the algorithm runs, whose neighbours SentencePiece treats as
// the start of a text (see encode).
bool is_matched_special(TokenType t) {
  return t == TokenType::control || t == TokenType::unknown || t == TokenType::user_defined;
}

std::optional<uint8_t> parse_byte_token(std::string_view s) {
  if (s.size() != 6 || s.substr(0, 3) != "<0x" || s[5] != '>') return std::nullopt;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(s[3]), lo = hex(s[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<uint8_t>(hi * 16 + lo);
}

void append_replacing_space_marks(std::string& out, std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, kSpaceMark.size(), kSpaceMark) == 0) {
      out.push_back(' ');
      i += kSpaceMark.size();
    } else {
      out.push_back(s[i++]);
    }
  }
}

void append_piece(const TokenizerData& d, TokenId id, bool render_special, std::string& out) {
  const std::string_view text = d.text(id);
  switch (d.types[id]) {
    case TokenType::control:
    case TokenType::unknown:
    case TokenType::unused:
      if (render_special) out += text;
      return;
    case TokenType::user_defined:
      out += text;  // matched literally in the text, so given back literally
      return;
    case TokenType::byte:
      if (auto b = parse_byte_token(text)) {
        out.push_back(static_cast<char>(*b));
        return;
      }
      break;  // not of the <0xXX> form: decode it as a normal token
    case TokenType::undefined:
    case TokenType::normal:
      break;
  }
  switch (d.kind) {
    case TokenizerKind::spm:
      append_replacing_space_marks(out, text);
      return;
    case TokenizerKind::wordpiece:
      if (text.substr(0, kSpaceMark.size()) == kSpaceMark) {
        out.push_back(' ');
        out += text.substr(kSpaceMark.size());
      } else {
        out += text;
      }
      return;
    case TokenizerKind::bpe:
      for (size_t i = 0; i < text.size();) {
        const size_t start = i;
        const int byte = text::byte_level_byte(text::utf8_next(text, i));
        if (byte >= 0)
          out.push_back(static_cast<char>(byte));
        else
          out += text.substr(start, i - start);  // not a byte-level character: keep it as it is
      }
      return;
  }
}

Status out_of_range(const TokenizerData& d, TokenId id) {
  return make_error(StatusCode::invalid_argument, "{}: token id {} is outside the vocabulary of {} tokens",
                    d.file_name, id, d.size());
}

}  // namespace

Result<Tokenizer> Tokenizer::from_gguf(const GgufFile& file) {
  Result<std::shared_ptr<TokenizerData>> d = text::load_tokenizer_data(file);
  if (!d) return d.status();
  return Tokenizer(std::move(*d));
}

Result<Tokenizer> Tokenizer::open(const std::string& path) {
  Result<GgufFile> f = GgufFile::open(path);
  if (!f) return f.status();
  return from_gguf(*f);
}

TokenizerKind Tokenizer::kind() const { return d_->kind; }
const std::string& Tokenizer::pre() const { return d_->pre; }
const std::vector<std::string>& Tokenizer::warnings() const { return d_->warnings; }
int32_t Tokenizer::n_tokens() const { return d_->size(); }
const SpecialTokens& Tokenizer::special() const { return d_->special; }

std::string_view Tokenizer::token_text(TokenId id) const {
  return id >= 0 && id < d_->size() ? d_->text(id) : std::string_view();
}

TokenType Tokenizer::token_type(TokenId id) const {
  return id >= 0 && id < d_->size() ? d_->types[id] : TokenType::undefined;
}

float Tokenizer::token_score(TokenId id) const {
  return id >= 0 && id < d_->size() && !d_->scores.empty() ? d_->scores[id] : 0.0f;
}

TokenId Tokenizer::find_token(std::string_view text) const { return d_->find(text); }

bool Tokenizer::is_special(TokenId id) const {
  const TokenType t = token_type(id);
  return t == TokenType::control || t == TokenType::unknown || t == TokenType::unused;
}

Result<std::vector<TokenId>> Tokenizer::encode(std::string_view text, bool add_special,
                                               bool parse_special) const {
  const TokenizerData& d = *d_;
  if (size_t bad = text::utf8_first_invalid(text); bad != std::string_view::npos)
    return make_error(StatusCode::invalid_argument, "{}: text to encode is not valid UTF-8 at byte {}",
                      d.file_name, bad);
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 2);
  if (add_special && d.special.add_bos) out.push_back(d.special.bos);

  std::optional<text::BpeSession> bpe;
  // SentencePiece puts its space prefix before the text and, as Hugging Face's and llama.cpp's
  // ("legacy") Llama tokenizers do, after every special token taken out of it.
  bool after_special = true;
  auto encode_plain = [&](std::string_view fragment) -> Status {
    if (fragment.empty()) return {};
    switch (d.kind) {
      case TokenizerKind::spm:
        text::encode_spm(d, fragment, d.add_space_prefix && after_special, out);
        break;
      case TokenizerKind::bpe:
        if (!bpe) bpe.emplace(d);
        LOOM_TRY(bpe->encode(fragment, out));
        break;
      case TokenizerKind::wordpiece:
        text::encode_wordpiece(d, fragment, out);
        break;
    }
    after_special = false;
    return {};
  };

  // Special tokens, leftmost-longest (buckets are sorted longest first), as Hugging Face splits
  // added tokens.
  size_t plain_begin = 0;
  for (size_t i = 0; i < text.size();) {
    TokenId match = kNoToken;
    for (TokenId id : d.special_by_first_byte[static_cast<uint8_t>(text[i])]) {
      if (!parse_special && d.types[id] != TokenType::user_defined) continue;
      if (text.compare(i, d.text(id).size(), d.text(id)) == 0) {
        match = id;
        break;
      }
    }
    if (match == kNoToken) {
      ++i;
      continue;
    }
    LOOM_TRY(encode_plain(text.substr(plain_begin, i - plain_begin)));
    out.push_back(match);
    after_special = true;
    i += d.text(match).size();
    plain_begin = i;
  }
  LOOM_TRY(encode_plain(text.substr(plain_begin)));

  if (add_special && d.special.add_eos) out.push_back(d.special.eos);
  return out;
}

Result<std::string> Tokenizer::token_to_piece(TokenId id, bool render_special) const {
  if (id < 0 || id >= d_->size()) return out_of_range(*d_, id);
  std::string piece;
  append_piece(*d_, id, render_special, piece);
  return piece;
}

Result<std::string> Tokenizer::decode(std::span<const TokenId> ids, bool render_special) const {
  const TokenizerData& d = *d_;
  std::string out;
  bool after_special = true;
  for (TokenId id : ids) {
    if (id < 0 || id >= d.size()) return out_of_range(d, id);
    const size_t piece_begin = out.size();
    append_piece(d, id, render_special, out);
    const bool special = is_matched_special(d.types[id]);
    // Take off the space encode() added: SentencePiece's prefix at the start and after special
    // tokens, WordPiece's word mark on the first word.
    const bool strip = !special && out.size() > piece_begin && out[piece_begin] == ' ' &&
                       ((d.kind == TokenizerKind::spm && d.add_space_prefix && after_special) ||
                        (d.kind == TokenizerKind::wordpiece && piece_begin == 0));
    if (strip) out.erase(piece_begin, 1);
    after_special = special;
  }
  return out;
}

Result<std::vector<std::string>> split_vocab_test_strings(std::string_view file_text, std::string_view name) {
  constexpr std::string_view kSeparator = "\n__ggml_vocab_test__\n";
  std::vector<std::string> strings;
  size_t pos = 0;
  while (pos < file_text.size()) {
    size_t sep = file_text.find(kSeparator, pos);
    size_t next;
    if (sep != std::string_view::npos) {
      next = sep + kSeparator.size();
    } else if (file_text.size() >= pos + kSeparator.size() - 1 &&
               file_text.substr(file_text.size() - (kSeparator.size() - 1)) ==
                   kSeparator.substr(0, kSeparator.size() - 1)) {
      // the last separator line without its final newline
      sep = file_text.size() - (kSeparator.size() - 1);
      next = file_text.size();
    } else {
      return make_error(StatusCode::format_error, "{}: {} bytes after the last __ggml_vocab_test__ line",
                        name, file_text.size() - pos);
    }
    strings.emplace_back(file_text.substr(pos, sep - pos));
    pos = next;
  }
  return strings;
}

}  // namespace loom
