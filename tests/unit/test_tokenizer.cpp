// Tokenizers: small vocabularies built in memory (merge order, byte fallback, special tokens,
// WordPiece rules, every error path), the pre-tokenizer regexes on known splits, and the real
// vocabularies of tests/data/tokenizer: round trips, special tokens, long inputs.
// The reference vectors (.inp/.out) are checked by the CTest tests tokenizer-vectors-*.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "loom/gguf.h"
#include "loom/text.h"
#include "text/pretokenize.h"
#include "text/unicode.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

constexpr const char* kName = "t.gguf";
const std::string kMark = "\xe2\x96\x81";  // ▁

// ---- building vocabularies -----------------------------------------------------------------------

struct Piece {
  std::string text;
  float score = 0.0f;
  TokenType type = TokenType::normal;
};

// A GGUF file in memory; load() parses it and builds the tokenizer.
class VocabFile {
 public:
  GgufWriter w;

  void tokens(const std::vector<Piece>& pieces, bool with_scores = true, bool with_types = true) {
    std::vector<std::string> texts;
    std::vector<float> scores;
    std::vector<int32_t> types;
    for (const Piece& p : pieces) {
      texts.push_back(p.text);
      scores.push_back(p.score);
      types.push_back(static_cast<int32_t>(p.type));
    }
    EXPECT_TRUE(w.add_array("tokenizer.ggml.tokens", std::span<const std::string>(texts)).ok());
    if (with_scores) {
      EXPECT_TRUE(w.add_array("tokenizer.ggml.scores", std::span<const float>(scores)).ok());
    }
    if (with_types) {
      EXPECT_TRUE(w.add_array("tokenizer.ggml.token_type", std::span<const int32_t>(types)).ok());
    }
  }

  Result<Tokenizer> load() {
    Result<std::vector<uint8_t>> bytes = w.serialize();
    if (!bytes) return bytes.status();
    bytes_ = std::move(*bytes);
    Result<GgufFile> f = GgufFile::parse(bytes_, kName);
    if (!f) return f.status();
    return Tokenizer::from_gguf(*f);
  }

 private:
  std::vector<uint8_t> bytes_;
};

// <unk>, <s>, </s>, optionally the 256 byte tokens, then `pieces`.
std::vector<Piece> spm_pieces(const std::vector<Piece>& pieces, bool byte_tokens = true) {
  std::vector<Piece> all = {
      {"<unk>", 0, TokenType::unknown}, {"<s>", 0, TokenType::control}, {"</s>", 0, TokenType::control}};
  if (byte_tokens)
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      all.push_back({name, 0, TokenType::byte});
    }
  all.insert(all.end(), pieces.begin(), pieces.end());
  return all;
}

Tokenizer load_spm(const std::vector<Piece>& pieces, bool byte_tokens = true) {
  VocabFile v;
  EXPECT_TRUE(v.w.add_string("tokenizer.ggml.model", "llama").ok());
  v.tokens(spm_pieces(pieces, byte_tokens));
  EXPECT_TRUE(v.w.add_u32("tokenizer.ggml.unknown_token_id", 0).ok());
  EXPECT_TRUE(v.w.add_u32("tokenizer.ggml.bos_token_id", 1).ok());
  EXPECT_TRUE(v.w.add_u32("tokenizer.ggml.eos_token_id", 2).ok());
  Result<Tokenizer> t = v.load();
  EXPECT_TRUE(t.ok()) << t.status().message();
  return std::move(t).value();
}

// Token texts of an encoding, for readable expectations.
std::vector<std::string> texts_of(const Tokenizer& t, const std::vector<TokenId>& ids) {
  std::vector<std::string> out;
  for (TokenId id : ids) out.emplace_back(t.token_text(id));
  return out;
}

std::vector<std::string> encode_texts(const Tokenizer& t, std::string_view s, bool parse_special = true) {
  Result<std::vector<TokenId>> ids = t.encode(s, false, parse_special);
  EXPECT_TRUE(ids.ok()) << ids.status().message();
  return ids.ok() ? texts_of(t, *ids) : std::vector<std::string>{};
}

void expect_error(Result<Tokenizer> r, StatusCode code, std::initializer_list<std::string_view> fragments) {
  ASSERT_FALSE(r.ok());
  const std::string msg = r.status().message();
  EXPECT_EQ(r.status().code(), code) << msg;
  for (std::string_view f : fragments)
    EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
}

// ---- SentencePiece -------------------------------------------------------------------------------

TEST(TokenizerSpm, MergesBestScoreFirst) {
  // "▁abc": the pairs score ▁a -2, ab -1, bc -0.5. Best first gives ▁a + bc; merging left to
  // right, or by length, would give ▁ab + c.
  Tokenizer t = load_spm({{kMark, -10},
                          {"a", -10},
                          {"b", -10},
                          {"c", -10},
                          {"ab", -1},
                          {"bc", -0.5f},
                          {kMark + "a", -2},
                          {kMark + "ab", -0.1f}});
  EXPECT_EQ(t.kind(), TokenizerKind::spm);
  EXPECT_EQ(encode_texts(t, "abc"), (std::vector<std::string>{kMark + "a", "bc"}));
  // Spaces become ▁ and the text gets one in front.
  EXPECT_EQ(encode_texts(t, "c ab"), (std::vector<std::string>{kMark, "c", kMark + "ab"}));
  EXPECT_TRUE(encode_texts(t, "").empty());
}

TEST(TokenizerSpm, EqualScoresMergeLeftmostFirst) {
  // "▁aaa": both "aa" pairs score -1; the left one merges, then nothing else can.
  Tokenizer t = load_spm({{kMark, -10}, {"a", -10}, {"aa", -1}, {kMark + "a", -2}});
  EXPECT_EQ(encode_texts(t, "aaa"), (std::vector<std::string>{kMark, "aa", "a"}));
}

TEST(TokenizerSpm, ByteFallbackAndRoundTrip) {
  Tokenizer t = load_spm({{kMark, -10}, {"a", -10}});
  // é (C3 A9) and 🦙 (F0 9F A6 99) are not in the vocabulary: their UTF-8 bytes are.
  EXPECT_EQ(encode_texts(t, "a\xc3\xa9 \xf0\x9f\xa6\x99"),
            (std::vector<std::string>{kMark, "a", "<0xC3>", "<0xA9>", kMark, "<0xF0>", "<0x9F>", "<0xA6>",
                                      "<0x99>"}));
  for (std::string_view s : {"a\xc3\xa9 \xf0\x9f\xa6\x99", " a  a\n\ta ", "\xe4\xb8\x96"}) {
    Result<std::vector<TokenId>> ids = t.encode(s, false, true);
    ASSERT_TRUE(ids.ok());
    Result<std::string> back = t.decode(*ids);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, s);
  }
  Result<std::string> piece = t.token_to_piece(t.find_token("<0x41>"));
  ASSERT_TRUE(piece.ok());
  EXPECT_EQ(*piece, "A");
  EXPECT_EQ(t.token_type(t.find_token("<0x41>")), TokenType::byte);
}

TEST(TokenizerSpm, UnknownWithoutByteTokens) {
  Tokenizer t = load_spm({{kMark, -10}, {"a", -10}}, /*byte_tokens=*/false);
  EXPECT_EQ(encode_texts(t, "a\xc3\xa9x"), (std::vector<std::string>{kMark, "a", "<unk>", "<unk>"}));
}

TEST(TokenizerSpm, SpecialTokensAndAddSpecial) {
  Tokenizer t = load_spm({{kMark, -10},
                          {"a", -10},
                          {"s", -10},
                          {"<", -10},
                          {">", -10},
                          {kMark + "a", -1},
                          {"<|user|>", 0, TokenType::user_defined}});
  EXPECT_TRUE(t.special().add_bos);  // SentencePiece default
  EXPECT_FALSE(t.special().add_eos);
  // Control tokens only with parse_special; the prefix space returns after each special token.
  EXPECT_EQ(encode_texts(t, "a<s>a", true), (std::vector<std::string>{kMark + "a", "<s>", kMark + "a"}));
  EXPECT_EQ(encode_texts(t, "a<s>a", false), (std::vector<std::string>{kMark + "a", "<", "s", ">", "a"}));
  // User-defined tokens always.
  EXPECT_EQ(encode_texts(t, "<|user|>a", false), (std::vector<std::string>{"<|user|>", kMark + "a"}));

  Result<std::vector<TokenId>> ids = t.encode("a", true, true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<TokenId>{1, t.find_token(kMark + "a")}));
  EXPECT_TRUE(t.is_special(1));
  Result<std::string> plain = t.decode(*ids);
  Result<std::string> rendered = t.decode(*ids, true);
  ASSERT_TRUE(plain.ok() && rendered.ok());
  EXPECT_EQ(*plain, "a");
  EXPECT_EQ(*rendered, "<s>a");
  // decode undoes the prefix after special tokens too.
  Result<std::vector<TokenId>> mixed = t.encode("a<s>a<|user|> a", false, true);
  ASSERT_TRUE(mixed.ok());
  Result<std::string> back = t.decode(*mixed, true);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, "a<s>a<|user|> a");
}

TEST(TokenizerSpm, LongInputIsNotQuadratic) {
  // One 256 KiB "word" of a/b: a quadratic merge loop would take minutes here.
  Tokenizer t = load_spm({{kMark, -10}, {"a", -10}, {"b", -10}, {"ab", -1}, {"abab", -2}, {"abababab", -3}});
  std::string s;
  for (int i = 0; i < (1 << 17); ++i) s += "ab";
  Result<std::vector<TokenId>> ids = t.encode(s, false, true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->size(), 1u + (1u << 17) / 4);  // "▁" then "abababab" each
  Result<std::string> back = t.decode(*ids);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, s);
}

// ---- byte-level BPE ------------------------------------------------------------------------------

// All 256 byte-level characters, then `extra` tokens; `merges` as "left right".
Result<Tokenizer> load_bpe(const std::vector<std::string>& extra, const std::vector<std::string>& merges,
                           const char* pre = "gpt-2") {
  VocabFile v;
  EXPECT_TRUE(v.w.add_string("tokenizer.ggml.model", "gpt2").ok());
  if (pre) {
    EXPECT_TRUE(v.w.add_string("tokenizer.ggml.pre", pre).ok());
  }
  std::vector<Piece> pieces;
  for (int b = 0; b < 256; ++b)
    pieces.push_back({std::string(text::byte_level_char(static_cast<uint8_t>(b)))});
  for (const std::string& e : extra) pieces.push_back({e});
  pieces.push_back({"<|endoftext|>", 0, TokenType::control});
  v.tokens(pieces, /*with_scores=*/false);
  EXPECT_TRUE(v.w.add_array("tokenizer.ggml.merges", std::span<const std::string>(merges)).ok());
  return v.load();
}

TEST(TokenizerBpe, MergesLowestRankFirst) {
  // (b,c) ranks before (a,b), so "abc" is a + bc -> abc; rank order the other way gives ab + c.
  Result<Tokenizer> t = load_bpe({"bc", "ab", "abc"}, {"b c", "a b", "a bc"});
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->kind(), TokenizerKind::bpe);
  EXPECT_EQ(t->pre(), "gpt-2");
  EXPECT_EQ(encode_texts(*t, "abc"), (std::vector<std::string>{"abc"}));
  Result<Tokenizer> t2 = load_bpe({"bc", "ab", "abc"}, {"a b", "b c", "a bc"});
  ASSERT_TRUE(t2.ok());
  EXPECT_EQ(encode_texts(*t2, "abc"), (std::vector<std::string>{"ab", "c"}));
  // Words are merged separately: " abc" is one word with its space (Ġ), not merged here.
  EXPECT_EQ(encode_texts(*t, "abc abc"), (std::vector<std::string>{"abc", "\xc4\xa0", "abc"}));
}

TEST(TokenizerBpe, IgnoreMergesTakesWholeWords) {
  // Llama 3: a word that is a token is taken whole even with no merges leading to it.
  Result<Tokenizer> llama3 = load_bpe({"xyz"}, {}, "llama-bpe");
  Result<Tokenizer> gpt2 = load_bpe({"xyz"}, {}, "gpt-2");
  ASSERT_TRUE(llama3.ok() && gpt2.ok());
  EXPECT_EQ(encode_texts(*llama3, "xyz"), (std::vector<std::string>{"xyz"}));
  EXPECT_EQ(encode_texts(*gpt2, "xyz"), (std::vector<std::string>{"x", "y", "z"}));
}

TEST(TokenizerBpe, RoundTripsAnyUtf8AndLongWords) {
  Result<Tokenizer> t = load_bpe({"aa", "aaaa"}, {"a a", "aa aa"});
  ASSERT_TRUE(t.ok());
  std::string long_word(1 << 20, 'a');  // one pre-tokenizer piece of 1 MiB
  for (std::string_view s :
       {std::string_view("Hello,\tw\xc3\xb6rld \xf0\x9f\xa6\x99\r\n  x"), std::string_view(long_word)}) {
    Result<std::vector<TokenId>> ids = t->encode(s, false, true);
    ASSERT_TRUE(ids.ok());
    Result<std::string> back = t->decode(*ids);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, s);
  }
  Result<std::vector<TokenId>> ids = t->encode(long_word, false, true);
  EXPECT_EQ(ids->size(), long_word.size() / 4);
  // A piece may be part of a UTF-8 character: "ö" is two byte-level tokens.
  Result<std::vector<TokenId>> o = t->encode("\xc3\xb6", false, true);
  ASSERT_TRUE(o.ok());
  ASSERT_EQ(o->size(), 2u);
  EXPECT_EQ(*t->token_to_piece((*o)[0]), "\xc3");
}

TEST(TokenizerBpe, ControlTokensOnlyWithParseSpecial) {
  Result<Tokenizer> t = load_bpe({}, {});
  ASSERT_TRUE(t.ok());
  const TokenId eot = t->find_token("<|endoftext|>");
  Result<std::vector<TokenId>> on = t->encode("a<|endoftext|>b", false, true);
  Result<std::vector<TokenId>> off = t->encode("a<|endoftext|>b", false, false);
  ASSERT_TRUE(on.ok() && off.ok());
  EXPECT_EQ(texts_of(*t, *on), (std::vector<std::string>{"a", "<|endoftext|>", "b"}));
  EXPECT_EQ(std::count(off->begin(), off->end(), eot), 0);
  EXPECT_EQ(*t->decode(*on), "ab");
  EXPECT_EQ(*t->decode(*on, true), "a<|endoftext|>b");
  EXPECT_EQ(*t->decode(*off), "a<|endoftext|>b");
}

TEST(TokenizerBpe, InvalidUtf8TokenTextsAreHarmless) {
  // Token texts come from the file: a truncated sequence must not be read past its end, and a
  // user-defined token that is not UTF-8 must not cut the text inside a character.
  VocabFile v;
  ASSERT_TRUE(v.w.add_string("tokenizer.ggml.model", "gpt2").ok());
  ASSERT_TRUE(v.w.add_string("tokenizer.ggml.pre", "gpt-2").ok());
  std::vector<Piece> pieces;
  for (int b = 0; b < 256; ++b)
    pieces.push_back({std::string(text::byte_level_char(static_cast<uint8_t>(b)))});
  pieces.push_back({"\xc4"});                               // half of "Ġ"
  pieces.push_back({"\xa9x", 0, TokenType::user_defined});  // starts inside "é"
  v.tokens(pieces, false);
  const std::vector<std::string> merges;
  ASSERT_TRUE(v.w.add_array("tokenizer.ggml.merges", std::span<const std::string>(merges)).ok());
  Result<Tokenizer> t = v.load();
  ASSERT_TRUE(t.ok()) << t.status().message();
  Result<std::string> half = t->token_to_piece(256);
  ASSERT_TRUE(half.ok());
  EXPECT_EQ(*half, "\xc4");
  Result<std::vector<TokenId>> ids = t->encode("\xc3\xa9x", false, true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->size(), 3u);  // three bytes, no user-defined match
  EXPECT_EQ(*t->decode(*ids), "\xc3\xa9x");
}

// ---- pre-tokenizers ------------------------------------------------------------------------------

std::vector<std::string> split(std::string_view pre, std::string_view s) {
  const text::PreTokenizerSpec* spec = text::find_pre_tokenizer(pre);
  EXPECT_NE(spec, nullptr) << pre;
  if (!spec) return {};
  Result<std::unique_ptr<text::PreTokenizer>> p = text::PreTokenizer::create(*spec);
  EXPECT_TRUE(p.ok()) << p.status().message();
  text::RegexScratch scratch;
  std::vector<text::TextSpan> spans;
  EXPECT_TRUE((*p)->split(s, scratch, spans).ok());
  std::vector<std::string> out;
  for (const text::TextSpan& sp : spans) out.emplace_back(s.substr(sp.begin, sp.size));
  return out;
}

using Pieces = std::vector<std::string>;

TEST(PreTokenizer, KnownSplits) {
  EXPECT_EQ(split("gpt-2", "Hello world's  123"), (Pieces{"Hello", " world", "'s", " ", " 123"}));
  EXPECT_EQ(split("llama-bpe", "12345 Hello\n\nworld"), (Pieces{"123", "45", " Hello", "\n\n", "world"}));
  EXPECT_EQ(split("qwen2", "x123"), (Pieces{"x", "1", "2", "3"}));
  EXPECT_EQ(split("deepseek-coder", "ied 4 \xc2\xbd months"),
            (Pieces{"ied", " ", "4", " ", "\xc2\xbd", " months"}));
  EXPECT_EQ(split("deepseek-llm",
                  "Hello \xe4\xb8\x96\xe7\x95\x8c"
                  "123"),
            (Pieces{"Hello", " ", "\xe4\xb8\x96\xe7\x95\x8c", "123"}));
  EXPECT_EQ(split("falcon", "a+b=1234"), (Pieces{"a", "+", "b", "=", "123", "4"}));
  EXPECT_EQ(split("starcoder", "x12 y"), (Pieces{"x", "1", "2", " y"}));
  EXPECT_EQ(split("gpt-4o", "HelloWorld don't"), (Pieces{"Hello", "World", " don't"}));
  EXPECT_TRUE(split("gpt-2", "").empty());
}

TEST(PreTokenizer, EveryNameCompilesAndAliasesResolve) {
  for (std::string_view name : text::pre_tokenizer_names()) {
    const text::PreTokenizerSpec* spec = text::find_pre_tokenizer(name);
    ASSERT_NE(spec, nullptr) << name;
    EXPECT_TRUE(text::PreTokenizer::create(*spec).ok()) << name;
  }
  EXPECT_EQ(text::find_pre_tokenizer("mpt")->name, "gpt-2");
  EXPECT_EQ(text::find_pre_tokenizer("llama3")->name, "llama-bpe");
  EXPECT_EQ(text::find_pre_tokenizer("refact")->name, "starcoder");
  EXPECT_EQ(text::find_pre_tokenizer("no-such-pre"), nullptr);
}

// Random text from many scripts and classes: every pre-tokenizer's pieces must tile the text
// exactly, and byte-level BPE must give it back.
TEST(PreTokenizer, RandomTextIsTiledExactly) {
  const uint32_t pool[] = {'a',    'Z',    '7',     ' ',     ' ',    '\t',   '\n',   '\r',   '\'',
                           's',    '!',    '$',     '/',     0xa0,   0xe9,   0x301,  0x3a3,  0x416,
                           0x5d0,  0x627,  0x966,   0xe01,   0x1780, 0x17c9, 0x2028, 0x3000, 0x4e16,
                           0xac00, 0xff5e, 0x1f999, 0x1d7d8, 0x200d, 0xfe0f, 0x2163};
  std::mt19937 rng(1234);
  std::vector<std::string> texts;
  for (int n = 0; n < 200; ++n) {
    std::string s;
    const int len = static_cast<int>(rng() % 40);
    for (int i = 0; i < len; ++i) text::utf8_append(s, pool[rng() % std::size(pool)]);
    texts.push_back(s);
  }
  for (std::string_view name : text::pre_tokenizer_names()) {
    for (const std::string& s : texts) {
      const Pieces pieces = split(name, s);
      std::string joined;
      for (const std::string& p : pieces) {
        EXPECT_FALSE(p.empty()) << name;
        joined += p;
      }
      ASSERT_EQ(joined, s) << name;
    }
  }
  Result<Tokenizer> t = load_bpe({}, {}, "gpt-4o");
  ASSERT_TRUE(t.ok());
  for (const std::string& s : texts) EXPECT_EQ(*t->decode(*t->encode(s, false, true)), s);
}

// ---- WordPiece -----------------------------------------------------------------------------------

Tokenizer load_wordpiece() {
  VocabFile v;
  EXPECT_TRUE(v.w.add_string("tokenizer.ggml.model", "bert").ok());
  v.tokens({{"[PAD]", 0, TokenType::control},
            {"[UNK]", 0, TokenType::control},
            {"[CLS]", 0, TokenType::control},
            {"[SEP]", 0, TokenType::control},
            {kMark + "un"},
            {"aff"},
            {"able"},
            {kMark + "cafe"},
            {kMark + "!"},
            {kMark + "a"},
            {kMark + "\xe4\xb8\x96"}},
           false);
  EXPECT_TRUE(v.w.add_u32("tokenizer.ggml.unknown_token_id", 1).ok());
  EXPECT_TRUE(v.w.add_u32("tokenizer.ggml.cls_token_id", 2).ok());
  EXPECT_TRUE(v.w.add_u32("tokenizer.ggml.seperator_token_id", 3).ok());
  Result<Tokenizer> t = v.load();
  EXPECT_TRUE(t.ok()) << t.status().message();
  return std::move(t).value();
}

TEST(TokenizerWordPiece, NormalizesAndSplits) {
  Tokenizer t = load_wordpiece();
  EXPECT_EQ(t.kind(), TokenizerKind::wordpiece);
  EXPECT_EQ(encode_texts(t, "Unaffable"), (Pieces{kMark + "un", "aff", "able"}));
  // Upper case and accents go (É is E + U+0301 after NFD); punctuation and CJK stand alone;
  // control characters (U+200B is Cf) are dropped.
  EXPECT_EQ(encode_texts(t, " CAF\xc3\x89!\xe4\xb8\x96 a\xe2\x80\x8b"),
            (Pieces{kMark + "cafe", kMark + "!", kMark + "\xe4\xb8\x96", kMark + "a"}));
  // A word that cannot be spelt, or is too long, is one [UNK].
  EXPECT_EQ(encode_texts(t, "unx a"), (Pieces{"[UNK]", kMark + "a"}));
  EXPECT_EQ(encode_texts(t, std::string(101, 'a')), (Pieces{"[UNK]"}));
  EXPECT_TRUE(encode_texts(t, " \t\n").empty());
}

TEST(TokenizerWordPiece, AddsClsAndSepAndDecodes) {
  Tokenizer t = load_wordpiece();
  EXPECT_TRUE(t.special().add_bos && t.special().add_eos);
  Result<std::vector<TokenId>> ids = t.encode("unaffable!", true, true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(texts_of(t, *ids), (Pieces{"[CLS]", kMark + "un", "aff", "able", kMark + "!", "[SEP]"}));
  EXPECT_EQ(*t.decode(*ids), "unaffable !");
}

// ---- loading errors ------------------------------------------------------------------------------

TEST(TokenizerLoad, Errors) {
  {
    VocabFile v;  // no tokenizer at all
    ASSERT_TRUE(v.w.add_string("general.architecture", "llama").ok());
    expect_error(v.load(), StatusCode::format_error, {kName, "tokenizer.ggml.model"});
  }
  {
    VocabFile v;
    ASSERT_TRUE(v.w.add_string("tokenizer.ggml.model", "t5").ok());
    v.tokens(spm_pieces({}));
    expect_error(v.load(), StatusCode::unsupported, {kName, "tokenizer.ggml.model", "'t5'"});
  }
  {
    VocabFile v;
    ASSERT_TRUE(v.w.add_u32("tokenizer.ggml.model", 1).ok());
    expect_error(v.load(), StatusCode::type_mismatch, {kName, "tokenizer.ggml.model"});
  }
  {
    VocabFile v;
    ASSERT_TRUE(v.w.add_string("tokenizer.ggml.model", "llama").ok());
    expect_error(v.load(), StatusCode::format_error, {kName, "tokenizer.ggml.tokens"});
  }
  {
    VocabFile v;
    ASSERT_TRUE(v.w.add_string("tokenizer.ggml.model", "llama").ok());
    ASSERT_TRUE(v.w.add_u32("tokenizer.ggml.tokens", 3).ok());
    expect_error(v.load(), StatusCode::type_mismatch, {kName, "tokenizer.ggml.tokens"});
  }
  {
    VocabFile v;  // "llama" needs scores
    ASSERT_TRUE(v.w.add_string("tokenizer.ggml.model", "llama").ok());
    v.tokens(spm_pieces({}), /*with_scores=*/false);
    expect_error(v.load(), StatusCode::format_error, {kName, "tokenizer.ggml.scores"});
  }
  {
    VocabFile v;
    ASSERT_TRUE(v.w.add_string("tokenizer.ggml.model", "llama").ok());
    v.tokens(spm_pieces({}), false);
    const std::vector<std::string> bad = {"x"};
    ASSERT_TRUE(v.w.add_array("tokenizer.ggml.scores", std::span<const std::string>(bad)).ok());
    expect_error(v.load(), StatusCode::type_mismatch, {kName, "tokenizer.ggml.scores"});
  }
  {
    VocabFile v;  // lengths differ
    ASSERT_TRUE(v.w.add_string("tokenizer.ggml.model", "llama").ok());
    v.tokens(spm_pieces({}), true, false);
    const std::vector<int32_t> types = {1, 1};
    ASSERT_TRUE(v.w.add_array("tokenizer.ggml.token_type", std::span<const int32_t>(types)).ok());
    expect_error(v.load(), StatusCode::format_error,
                 {kName, "tokenizer.ggml.token_type", "2 entries for 259"});
  }
  {
    VocabFile v;  // a token type outside 0..6
    ASSERT_TRUE(v.w.add_string("tokenizer.ggml.model", "llama").ok());
    std::vector<Piece> p = spm_pieces({});
    p[5].type = static_cast<TokenType>(9);
    v.tokens(p);
    expect_error(v.load(), StatusCode::format_error,
                 {kName, "tokenizer.ggml.token_type", "token 5 has type 9"});
  }
  {
    VocabFile v;  // "gpt2" needs merges
    ASSERT_TRUE(v.w.add_string("tokenizer.ggml.model", "gpt2").ok());
    v.tokens({{"a"}, {"b"}}, false);
    expect_error(v.load(), StatusCode::format_error, {kName, "tokenizer.ggml.merges"});
  }
  expect_error(load_bpe({}, {}, "no-such-pre"), StatusCode::unsupported,
               {kName, "tokenizer.ggml.pre", "'no-such-pre'", "gpt-2", "llama-bpe"});
  {
    VocabFile v;
    ASSERT_TRUE(v.w.add_string("tokenizer.ggml.model", "llama").ok());
    v.tokens(spm_pieces({}));
    ASSERT_TRUE(v.w.add_string("tokenizer.ggml.add_bos_token", "yes").ok());
    expect_error(v.load(), StatusCode::type_mismatch, {kName, "tokenizer.ggml.add_bos_token"});
  }
  {
    VocabFile v;
    ASSERT_TRUE(v.w.add_string("tokenizer.ggml.model", "llama").ok());
    v.tokens(spm_pieces({}));
    ASSERT_TRUE(v.w.add_f32("tokenizer.ggml.bos_token_id", 1.0f).ok());
    expect_error(v.load(), StatusCode::type_mismatch, {kName, "tokenizer.ggml.bos_token_id"});
  }
}

TEST(TokenizerLoad, WarningsForRecoverableProblems) {
  {
    VocabFile v;  // an id outside the vocabulary is dropped
    ASSERT_TRUE(v.w.add_string("tokenizer.ggml.model", "llama").ok());
    v.tokens(spm_pieces({}));
    ASSERT_TRUE(v.w.add_u32("tokenizer.ggml.bos_token_id", 100000).ok());
    Result<Tokenizer> t = v.load();
    ASSERT_TRUE(t.ok()) << t.status().message();
    EXPECT_EQ(t->special().bos, kNoToken);
    EXPECT_FALSE(t->special().add_bos);
    ASSERT_FALSE(t->warnings().empty());
    EXPECT_NE(t->warnings()[0].find("tokenizer.ggml.bos_token_id"), std::string::npos);
  }
  {
    Result<Tokenizer> t = load_bpe({"ab"}, {"a b", "q z", "a"}, nullptr);  // no pre; bad merges
    ASSERT_TRUE(t.ok()) << t.status().message();
    EXPECT_EQ(t->pre(), "gpt-2");
    ASSERT_EQ(t->warnings().size(), 2u);
    EXPECT_NE(t->warnings()[0].find("tokenizer.ggml.pre"), std::string::npos);
    EXPECT_NE(t->warnings()[1].find("2 of 3 merges"), std::string::npos);
    EXPECT_EQ(encode_texts(*t, "ab"), (Pieces{"ab"}));
  }
}

TEST(TokenizerApi, BadInputs) {
  Tokenizer t = load_spm({{kMark, -10}, {"a", -10}});
  Result<std::vector<TokenId>> bad = t.encode("ab\xc3(", false, true);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(bad.status().message().find("UTF-8 at byte 2"), std::string::npos) << bad.status().message();
  const TokenId ids[] = {3, t.n_tokens()};
  Result<std::string> d = t.decode(ids);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::invalid_argument);
  EXPECT_FALSE(t.token_to_piece(-1).ok());
  EXPECT_EQ(t.token_text(-1), "");
  EXPECT_EQ(t.find_token("not a token"), kNoToken);
}

TEST(VocabTestStrings, SplitsOnSeparatorLines) {
  auto s = split_vocab_test_strings(
      "a\n__ggml_vocab_test__\n\n__ggml_vocab_test__\n\n\n__ggml_vocab_test__\n", "f");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, (Pieces{"a", "", "\n"}));
  auto no_final_newline = split_vocab_test_strings("x y\n__ggml_vocab_test__", "f");
  ASSERT_TRUE(no_final_newline.ok());
  EXPECT_EQ(*no_final_newline, (Pieces{"x y"}));
  auto trailing = split_vocab_test_strings("a\n__ggml_vocab_test__\nrest", "f.inp");
  ASSERT_FALSE(trailing.ok());
  EXPECT_NE(trailing.status().message().find("f.inp"), std::string::npos);
  EXPECT_TRUE(split_vocab_test_strings("", "f")->empty());
}

// ---- the real vocabularies in tests/data/tokenizer --------------------------------------------

// tests/data, next to this file's folder (llama.cpp's vocabularies; see tests/data/README.md).
fs::path test_data() { return fs::path(__FILE__).parent_path().parent_path() / "data"; }

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Shakespeare's text the project keeps (the held-out split of tiny shakespeare, ASCII, 111,540 bytes).
std::string shakespeare_text() {
  std::string text = read_all(test_data() / "shakespeare_heldout.txt");
  EXPECT_GT(text.size(), 100000u) << "tests/data/shakespeare_heldout.txt is missing or short";
  return text;
}

// The tokenizer of tests/data/tokenizer/ggml-vocab-NAME.gguf; a missing file fails the test.
#define LOAD_VOCAB(var, name)                                                                            \
  const fs::path var##_path = test_data() / "tokenizer" / ("ggml-vocab-" + std::string(name) + ".gguf"); \
  Result<Tokenizer> var##_r = Tokenizer::open(var##_path.string());                                      \
  ASSERT_TRUE(var##_r.ok()) << var##_r.status().message();                                               \
  const Tokenizer& var = *var##_r

class RealVocab : public ::testing::TestWithParam<std::string> {};

TEST_P(RealVocab, RoundTripsTestStringsAndShakespeare) {
  LOAD_VOCAB(t, GetParam());
  EXPECT_TRUE(t.warnings().empty()) << t.warnings()[0];
  Result<std::vector<std::string>> strings =
      split_vocab_test_strings(read_all(fs::path(t_path.string() + ".inp")), "inp");
  ASSERT_TRUE(strings.ok()) << strings.status().message();
  EXPECT_EQ(strings->size(), 46u);
  const std::string shakespeare = shakespeare_text();
  strings->push_back(shakespeare);
  for (const std::string& s : *strings) {
    Result<std::vector<TokenId>> ids = t.encode(s, false, true);
    ASSERT_TRUE(ids.ok()) << ids.status().message();
    Result<std::string> back = t.decode(*ids);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, s) << "round trip of a " << s.size() << "-byte string";
    // Piece by piece gives the same bytes.
    std::string pieces;
    for (TokenId id : *ids) pieces += *t.token_to_piece(id);
    if (t.kind() == TokenizerKind::bpe) {
      EXPECT_EQ(pieces, s);
    }
  }
  EXPECT_LT(t.encode(shakespeare, false, true)->size(), shakespeare.size() / 2);  // it does compress
}

INSTANTIATE_TEST_SUITE_P(Vocabs, RealVocab,
                         ::testing::Values("gpt-2", "mpt", "deepseek-coder", "llama-spm", "phi-3"));

TEST(RealVocabSpecial, Gpt2EndOfText) {
  LOAD_VOCAB(t, "gpt-2");
  EXPECT_EQ(t.pre(), "gpt-2");
  const TokenId eot = t.find_token("<|endoftext|>");
  ASSERT_NE(eot, kNoToken);
  EXPECT_EQ(t.special().eos, eot);
  EXPECT_EQ(t.token_type(eot), TokenType::control);
  Result<std::vector<TokenId>> on = t.encode("Hi<|endoftext|>Hi", false, true);
  Result<std::vector<TokenId>> off = t.encode("Hi<|endoftext|>Hi", false, false);
  ASSERT_TRUE(on.ok() && off.ok());
  EXPECT_EQ(*on, (std::vector<TokenId>{t.find_token("Hi"), eot, t.find_token("Hi")}));
  EXPECT_EQ(std::count(off->begin(), off->end(), eot), 0);
  EXPECT_EQ(*t.decode(*off), "Hi<|endoftext|>Hi");
  EXPECT_EQ(*t.decode(*on, true), "Hi<|endoftext|>Hi");
  EXPECT_FALSE(t.special().add_bos);
}

TEST(RealVocabSpecial, LlamaSpmBosAndByteFallback) {
  LOAD_VOCAB(t, "llama-spm");
  EXPECT_EQ(t.kind(), TokenizerKind::spm);
  EXPECT_TRUE(t.special().add_bos);
  Result<std::vector<TokenId>> ids = t.encode("\xf0\x9f\xa6\x99", true, true);  // 🦙
  ASSERT_TRUE(ids.ok());
  const std::vector<TokenId> expected = {t.special().bos,        t.find_token(kMark),
                                         t.find_token("<0xF0>"), t.find_token("<0x9F>"),
                                         t.find_token("<0xA6>"), t.find_token("<0x99>")};
  EXPECT_EQ(*ids, expected);
  EXPECT_EQ(t.token_text(t.special().bos), "<s>");
  EXPECT_EQ(*t.decode(*ids), "\xf0\x9f\xa6\x99");
  Result<std::vector<TokenId>> special = t.encode("<s>Hello</s>", false, true);
  ASSERT_TRUE(special.ok());
  EXPECT_EQ(*special,
            (std::vector<TokenId>{t.special().bos, t.find_token(kMark + "Hello"), t.special().eos}));
}

TEST(RealVocabSpecial, Phi3UserDefinedAlwaysMatched) {
  LOAD_VOCAB(t, "phi-3");
  const TokenId end = t.find_token("</s>");
  const TokenId user = t.find_token("<|user|>");
  ASSERT_EQ(t.token_type(end), TokenType::user_defined);
  ASSERT_EQ(t.token_type(user), TokenType::control);
  Result<std::vector<TokenId>> off = t.encode("a</s><|user|>", false, false);
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(std::count(off->begin(), off->end(), end), 1);
  EXPECT_EQ(std::count(off->begin(), off->end(), user), 0);
  Result<std::vector<TokenId>> on = t.encode("a</s><|user|>", false, true);
  EXPECT_EQ(on->back(), user);
}

TEST(RealVocabSpecial, BertClsSep) {
  LOAD_VOCAB(t, "bert-bge");
  EXPECT_EQ(t.kind(), TokenizerKind::wordpiece);
  Result<std::vector<TokenId>> ids = t.encode("Hello, World!", true, true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(texts_of(t, *ids),
            (Pieces{"[CLS]", kMark + "hello", kMark + ",", kMark + "world", kMark + "!", "[SEP]"}));
  EXPECT_EQ(*t.decode(*ids), "hello , world !");
}

TEST(RealVocabSpecial, LongInputsAndThreads) {
  LOAD_VOCAB(t, "gpt-2");
  // A 1 MiB word and a 1 MiB run of spaces: one piece each for the merge loop and the regex.
  for (const std::string& s :
       {std::string(1 << 20, 'x'), std::string(1 << 20, ' '), std::string(1 << 20, '\n')}) {
    Result<std::vector<TokenId>> ids = t.encode(s, false, true);
    ASSERT_TRUE(ids.ok()) << ids.status().message();
    EXPECT_LE(ids->size(), s[0] == 'x' ? s.size() / 2 : s.size());  // GPT-2 has no "ĠĠ" merge
    EXPECT_EQ(*t.decode(*ids), s);
  }
  // encode is const and shares nothing mutable: threads get what one thread gets.
  const std::string text = shakespeare_text();
  const std::vector<TokenId> want = *t.encode(text, false, true);
  std::vector<std::vector<TokenId>> got(4);
  std::vector<std::thread> threads;
  for (auto& g : got) threads.emplace_back([&] { g = *t.encode(text, false, true); });
  for (auto& th : threads) th.join();
  for (const auto& g : got) EXPECT_EQ(g, want);
}

}  // namespace
}  // namespace loom
