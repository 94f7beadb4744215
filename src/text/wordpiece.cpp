// WordPiece as BERT's uncased tokenizers run it (Hugging Face BertNormalizer + BertPreTokenizer +
// WordPiece): drop control characters, NFD and drop non-spacing marks (accents), lower-case; split
// at whitespace, and isolate every punctuation mark and CJK ideograph; then cut each word greedily
// into the longest vocabulary pieces. GGUF stores word-initial pieces with a "▁" prefix and
// continuations bare (BERT's "##" removed), so the first piece is looked up as "▁" + text.
#include <utf8proc.h>

#include <string>
#include <vector>

#include "text_internal.h"
#include "unicode.h"

namespace loom::text {

namespace {

constexpr std::string_view kWordMark = "\xe2\x96\x81";  // U+2581

// Unicode White_Space (what Rust's char::is_whitespace tests), less the controls removed before.
bool is_bert_whitespace(uint32_t cp) {
  switch (cp) {
    case '\t':
    case '\n':
    case '\r':
    case ' ':
    case 0xa0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202f:
    case 0x205f:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200a;
  }
}

// BERT drops "other" characters (Cc, Cf, Cn, Co, Cs) except the three it treats as whitespace.
bool is_bert_control(uint32_t cp, utf8proc_category_t cat) {
  if (cp == '\t' || cp == '\n' || cp == '\r') return false;
  return cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF || cat == UTF8PROC_CATEGORY_CN ||
         cat == UTF8PROC_CATEGORY_CO || cat == UTF8PROC_CATEGORY_CS;
}

// All ASCII symbols count as punctuation for BERT ("$", "+", "^" ...), as do Unicode P* marks.
bool is_bert_punct(uint32_t cp, utf8proc_category_t cat) {
  if ((cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) || (cp >= 123 && cp <= 126))
    return true;
  return cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO;
}

// The CJK Unified Ideographs blocks BERT isolates (not Hangul, Kana, or CJK punctuation).
bool is_cjk_ideograph(uint32_t cp) {
  return (cp >= 0x4e00 && cp <= 0x9fff) || (cp >= 0x3400 && cp <= 0x4dbf) ||
         (cp >= 0x20000 && cp <= 0x2a6df) || (cp >= 0x2a700 && cp <= 0x2b73f) ||
         (cp >= 0x2b740 && cp <= 0x2b81f) || (cp >= 0x2b920 && cp <= 0x2ceaf) ||
         (cp >= 0xf900 && cp <= 0xfaff) || (cp >= 0x2f800 && cp <= 0x2fa1f);
}

// Canonical decomposition with canonical ordering of combining marks (NFD).
std::vector<utf8proc_int32_t> nfd(std::string_view s) {
  std::vector<utf8proc_int32_t> buf(s.size() + 16);
  for (;;) {
    const utf8proc_ssize_t n = utf8proc_decompose(
        reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
        buf.data(), static_cast<utf8proc_ssize_t>(buf.size()),
        static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE));
    LOOM_ASSERT(n >= 0);  // the caller validated the UTF-8
    if (static_cast<size_t>(n) <= buf.size()) {
      buf.resize(static_cast<size_t>(n));
      return buf;
    }
    buf.resize(static_cast<size_t>(n));
  }
}

void encode_word(const TokenizerData& d, const std::string& word, std::vector<TokenId>& out) {
  std::vector<size_t> bounds;  // offsets of character starts, and the end
  for (size_t i = 0; i < word.size(); i += utf8_seq_len(static_cast<uint8_t>(word[i]))) bounds.push_back(i);
  const size_t n_chars = bounds.size();
  bounds.push_back(word.size());
  if (n_chars > d.max_word_chars) {
    if (d.special.unk != kNoToken) out.push_back(d.special.unk);
    return;
  }
  const size_t out_begin = out.size();
  std::string key;
  for (size_t start = 0; start < n_chars;) {
    TokenId found = kNoToken;
    size_t end = n_chars;
    for (; end > start; --end) {
      key.clear();
      if (start == 0) key += kWordMark;
      key.append(word, bounds[start], bounds[end] - bounds[start]);
      found = d.find(key);
      if (found != kNoToken) break;
    }
    if (found == kNoToken) {
      // A word that cannot be spelt becomes one [UNK] (its pieces found so far are dropped).
      out.resize(out_begin);
      if (d.special.unk != kNoToken) out.push_back(d.special.unk);
      return;
    }
    out.push_back(found);
    start = end;
  }
}

}  // namespace

void encode_wordpiece(const TokenizerData& d, std::string_view fragment, std::vector<TokenId>& out) {
  std::string word;
  auto flush = [&] {
    if (!word.empty()) encode_word(d, word, out);
    word.clear();
  };
  for (utf8proc_int32_t cp_signed : nfd(fragment)) {
    const auto cp = static_cast<uint32_t>(cp_signed);
    const utf8proc_category_t cat = utf8proc_category(cp_signed);
    if (cat == UTF8PROC_CATEGORY_MN) continue;  // accents, after NFD split them off their letters
    if (cp == 0 || cp == 0xfffd || is_bert_control(cp, cat)) continue;
    if (is_bert_whitespace(cp)) {
      flush();
      continue;
    }
    const auto lower = static_cast<uint32_t>(utf8proc_tolower(cp_signed));
    if (is_bert_punct(cp, cat) || is_cjk_ideograph(cp)) {
      flush();
      utf8_append(word, lower);
      flush();
      continue;
    }
    utf8_append(word, lower);
  }
  flush();
}

}  // namespace loom::text
