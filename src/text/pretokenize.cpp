#include "pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>

namespace loom::text {

namespace {

// The regexes are those of the Hugging Face tokenizer.json of each model family. Two deliberate
// rewrites: "(?i:'s|'t|...)" is spelled "'[sS]|'[tT]|..." because PCRE2's caseless matching folds
// with Unicode rules ('s' would also match U+017F, 'k' the Kelvin sign), which the ASCII-only
// contractions never meant; and non-ASCII characters are written as \x{...} escapes.

// GPT-2, and GPT-NeoX-style vocabularies that reuse it (MPT, OLMo, ...). Falcon and StarCoder
// configure it without the final "\s+"; with Isolated splitting that makes no difference, since
// the whitespace that alternative would take becomes a piece of its own all the same.
constexpr std::string_view kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Llama 3 (tiktoken cl100k-style): digits in groups of at most three, newlines kept apart.
constexpr std::string_view kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Qwen2: as Llama 3 but every digit alone.
constexpr std::string_view kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// GPT-4o (o200k): words split before capitals, contractions attached, "/" kept with punctuation.
constexpr std::string_view kGpt4o =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// CJK ideographs, the block from U+0800 up to them, and Hangul (DeepSeek).
constexpr std::string_view kDeepseekCjk = R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";

// DeepSeek LLM: the cased letters of many scripts, spelled out as ranges.
constexpr std::string_view kDeepseekLlmLetters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293})"
    R"(\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A})"
    R"(\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556})"
    R"(\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF})"
    R"(\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D})"
    R"(\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D})"
    R"(\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3})"
    R"(\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107})"
    R"(\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D})"
    R"(\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184})"
    R"(\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D})"
    R"(\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF})"
    R"(\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F})"
    R"(\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2})"
    R"(\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)";

struct Alias {
  std::string_view alias;
  std::string_view name;
};

const std::vector<PreTokenizerSpec>& specs() {
  static const std::vector<PreTokenizerSpec> s = {
      {"gpt-2", {kGpt2}, false},
      {"llama-bpe", {kLlama3}, true},
      {"dbrx", {kLlama3}, false},
      {"qwen2", {kQwen2}, false},
      {"deepseek-llm",
       {R"([\r\n])", kDeepseekLlmLetters,
        R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)", R"(\s+$)",
        kDeepseekCjk, R"(\p{N}+)"},
       false},
      {"deepseek-coder", {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kDeepseekCjk, R"(\p{N})"}, false},
      {"falcon", {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, R"([0-9][0-9][0-9])"}, false},
      {"starcoder", {R"(\p{N})", kGpt2}, false},
      {"gpt-4o", {kGpt4o}, false},
  };
  return s;
}

// Other names converters write for the same splitting.
constexpr Alias kAliases[] = {
    {"default", "gpt-2"},  // a "gpt2" model that names no pre-tokenizer of its own
    {"gpt2", "gpt-2"},          {"mpt", "gpt-2"},        {"olmo", "gpt-2"},          {"jais", "gpt-2"},
    {"roberta-bpe", "gpt-2"},   {"llama3", "llama-bpe"}, {"llama-v3", "llama-bpe"},  {"falcon3", "llama-bpe"},
    {"smaug-bpe", "dbrx"},      {"stablelm2", "qwen2"},  {"megrez", "qwen2"},        {"refact", "starcoder"},
    {"command-r", "starcoder"}, {"smollm", "starcoder"}, {"codeshell", "starcoder"}, {"exaone", "starcoder"},
};

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof buf) < 0) return "error " + std::to_string(code);
  return std::string(reinterpret_cast<const char*>(buf));
}

}  // namespace

const PreTokenizerSpec* find_pre_tokenizer(std::string_view name) {
  for (const Alias& a : kAliases)
    if (a.alias == name) {
      name = a.name;
      break;
    }
  for (const PreTokenizerSpec& s : specs())
    if (s.name == name) return &s;
  return nullptr;
}

std::vector<std::string_view> pre_tokenizer_names() {
  std::vector<std::string_view> names;
  for (const PreTokenizerSpec& s : specs()) names.push_back(s.name);
  for (const Alias& a : kAliases) names.push_back(a.alias);
  return names;
}

RegexScratch::RegexScratch() : match_data_(pcre2_match_data_create(1, nullptr)) {}

RegexScratch::~RegexScratch() {
  pcre2_match_data_free(match_data_);
  pcre2_match_context_free(context_);
  pcre2_jit_stack_free(jit_stack_);
}

PreTokenizer::~PreTokenizer() {
  for (pcre2_code* re : regexes_) pcre2_code_free(re);
}

Result<std::unique_ptr<PreTokenizer>> PreTokenizer::create(const PreTokenizerSpec& spec) {
  std::unique_ptr<PreTokenizer> p(new PreTokenizer());
  p->name_ = std::string(spec.name);
  for (std::string_view pattern : spec.regexes) {
    int err = 0;
    PCRE2_SIZE err_offset = 0;
    pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &err_offset, nullptr);
    if (!re)
      return make_error(StatusCode::internal, "pre-tokenizer '{}': regex does not compile at offset {}: {}",
                        spec.name, err_offset, pcre2_message(err));
    // Without JIT (a platform PCRE2 lacks it for) matching falls back to the interpreter.
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    p->regexes_.push_back(re);
  }
  return p;
}

Status PreTokenizer::split_one(const pcre2_code* re, size_t index, std::string_view text, TextSpan piece,
                               RegexScratch& scratch, std::vector<TextSpan>& out) const {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + piece.begin);
  size_t pos = 0;   // where the next search starts
  size_t kept = 0;  // end of what was already emitted
  while (pos < piece.size) {
    // The caller validated the whole text, so PCRE2 need not re-check the piece on every call
    // (which would cost a pass over the rest of the piece per match).
    int rc =
        pcre2_match(re, subject, piece.size, pos, PCRE2_NO_UTF_CHECK, scratch.match_data_, scratch.context_);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !scratch.jit_stack_) {
      // The default 32 KiB JIT stack is too small for some long runs; 8 MiB is ample.
      scratch.jit_stack_ = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
      scratch.context_ = pcre2_match_context_create(nullptr);
      if (!scratch.jit_stack_ || !scratch.context_)
        return make_error(StatusCode::out_of_memory, "pre-tokenizer '{}': no memory for a regex stack",
                          name_);
      pcre2_jit_stack_assign(scratch.context_, nullptr, scratch.jit_stack_);
      continue;
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0)
      return make_error(StatusCode::internal, "pre-tokenizer '{}': regex {} failed on a {}-byte piece: {}",
                        name_, index, piece.size, pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.match_data_);
    const size_t m_begin = ov[0], m_end = ov[1];
    if (m_end == m_begin) {
      // None of the regexes matches empty text; step over one character should one ever do so.
      pos = m_end + 1;
      while (pos < piece.size && (subject[pos] & 0xc0) == 0x80) ++pos;
      continue;
    }
    if (m_begin > kept) out.push_back({piece.begin + kept, m_begin - kept});
    out.push_back({piece.begin + m_begin, m_end - m_begin});
    kept = pos = m_end;
  }
  if (kept < piece.size) out.push_back({piece.begin + kept, piece.size - kept});
  return {};
}

Status PreTokenizer::split(std::string_view text, RegexScratch& scratch,
                           std::vector<TextSpan>& pieces) const {
  pieces.clear();
  if (text.empty()) return {};
  if (!scratch.match_data_)
    return make_error(StatusCode::out_of_memory, "pre-tokenizer: no memory for match data");
  pieces.push_back({0, text.size()});
  std::vector<TextSpan> next;
  for (size_t i = 0; i < regexes_.size(); ++i) {
    next.clear();
    for (const TextSpan& piece : pieces) LOOM_TRY(split_one(regexes_[i], i, text, piece, scratch, next));
    pieces.swap(next);
  }
  return {};
}

}  // namespace loom::text
