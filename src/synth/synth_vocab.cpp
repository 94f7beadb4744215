#include "synth_vocab.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

#include <fmt/format.h>

namespace loom::llm {

namespace {

// Training text for the merges: ordinary English so the merged tokens look like real subwords.
constexpr const char* kCorpus =
    "The river runs past the old mill and under the stone bridge before it turns toward the sea. "
    "In the morning the fishermen walk down to the water with their nets, and in the evening they "
    "come back with baskets of silver fish. The children of the village play on the bridge and count "
    "the boats as they pass. When the weather is warm, the market in the square is full of people "
    "selling bread, cheese, apples and flowers. The baker opens his shop before the sun rises, and "
    "the smell of fresh bread fills the street. Everyone in the village knows the baker, and the "
    "baker knows everyone. In the winter the river freezes near the banks, and the mill stops turning. "
    "Then the people stay inside by their fires, telling stories about the summers that were and the "
    "summers that will be. A traveller who came to the village many years ago wrote that it was the "
    "quietest place he had ever seen, and that the river sang to him every night. He stayed for three "
    "weeks, then for three months, and then he never left. Today his house stands at the end of the "
    "road, and his garden is the most beautiful in the valley. Numbers matter too: 1, 2, 3, 10, 20, "
    "100, 2024 and 3.14 appear in the records of the mill, which counted 1200 sacks of grain in a good "
    "year and 800 in a bad one. Questions are asked: what is the time? where is the road? who built the "
    "bridge? The answers are written in the book that the teacher keeps in the school by the church. "
    "Learning to read and to write, the children of the village learn about the world beyond the "
    "river, about the cities and the mountains, and about the people who live there. "
    "Computers read text as numbers. A tokenizer cuts the text into pieces, and each piece has a "
    "number in a vocabulary. Common words become single pieces, while rare words are split into "
    "smaller parts, so that any sentence can be written with the pieces that the vocabulary holds. "
    "The model then reads the numbers, one after another, and predicts which piece should come next. "
    "It does this again and again, writing a sentence, a paragraph, or a whole story. Training such a "
    "model takes a great deal of text and a great deal of time, but running it is simpler: the weights "
    "are loaded into memory, the prompt is read, and the next pieces are generated one by one. "
    "Engineers measure how many pieces per second a machine can produce, how much memory the weights "
    "need, and how the quality changes when the weights are stored with fewer bits. Smaller numbers "
    "save memory and time, but they also lose some of the information that the model learned. "
    "Testing therefore compares the results of the small and the large versions, and the differences "
    "are written down in tables that everyone can read.";

// GPT-2 keeps printable Latin-1 bytes as themselves and moves the rest to U+0100 and up.
bool printable(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); }

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// GPT-2-like pre-tokenization (ASCII approximation): an optional space, then a run of letters, of
// digits, or of other non-space characters.
std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> words;
  size_t i = 0;
  auto cls = [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return std::isalpha(u) ? 0 : std::isdigit(u) ? 1 : std::isspace(u) ? 2 : 3;
  };
  while (i < text.size()) {
    size_t start = i;
    if (text[i] == ' ' && i + 1 < text.size() && cls(text[i + 1]) != 2) ++i;
    const int c = cls(text[i]);
    while (i < text.size() && cls(text[i]) == c) ++i;
    words.push_back(text.substr(start, i - start));
  }
  return words;
}

}  // namespace

std::string gpt2_byte_to_unicode(uint8_t b) {
  if (printable(b)) return utf8(b);
  int k = 0;
  for (int x = 0; x < b; ++x)
    if (!printable(x)) ++k;
  return utf8(256 + k);
}

SynthVocab make_synth_vocab(int n_vocab) {
  SynthVocab v;
  const int n_special = 2;
  n_vocab = std::max(n_vocab, 256 + n_special);
  std::set<std::string> known;
  for (int b = 0; b < 256; ++b) {
    v.tokens.push_back(gpt2_byte_to_unicode(static_cast<uint8_t>(b)));
    v.token_types.push_back(1);
    known.insert(v.tokens.back());
  }

  // BPE training: words as symbol sequences with counts; merge the most frequent pair (ties by
  // the pair's spelling, so the result is deterministic) until no pair repeats or the slots run out.
  std::map<std::string, int> word_counts;
  for (const std::string& w : split_words(kCorpus)) ++word_counts[w];
  std::vector<std::pair<std::vector<std::string>, int>> words;
  for (const auto& [w, n] : word_counts) {
    std::vector<std::string> syms;
    for (unsigned char ch : w) syms.push_back(gpt2_byte_to_unicode(ch));
    words.emplace_back(std::move(syms), n);
  }
  const int max_merges = n_vocab - 256 - n_special;
  while (static_cast<int>(v.merges.size()) < max_merges) {
    std::map<std::pair<std::string, std::string>, int> pairs;
    for (const auto& [syms, n] : words)
      for (size_t i = 0; i + 1 < syms.size(); ++i) pairs[{syms[i], syms[i + 1]}] += n;
    auto best = pairs.end();
    for (auto it = pairs.begin(); it != pairs.end(); ++it)
      if (best == pairs.end() || it->second > best->second) best = it;
    if (best == pairs.end() || best->second < 2) break;
    const auto [left, right] = best->first;
    const std::string merged = left + right;
    v.merges.push_back(left + " " + right);
    if (known.insert(merged).second) {
      v.tokens.push_back(merged);
      v.token_types.push_back(1);
    }
    for (auto& [syms, n] : words) {
      std::vector<std::string> out;
      for (size_t i = 0; i < syms.size(); ++i) {
        if (i + 1 < syms.size() && syms[i] == left && syms[i + 1] == right) {
          out.push_back(merged);
          ++i;
        } else {
          out.push_back(syms[i]);
        }
      }
      syms = std::move(out);
    }
  }
  for (int k = 0; static_cast<int>(v.tokens.size()) < n_vocab - n_special; ++k) {
    v.tokens.push_back(fmt::format("<synth_{}>", k));
    v.token_types.push_back(5);
  }
  v.bos = static_cast<int32_t>(v.tokens.size());
  v.tokens.push_back("<|begin_of_text|>");
  v.token_types.push_back(3);
  v.eos = static_cast<int32_t>(v.tokens.size());
  v.tokens.push_back("<|end_of_text|>");
  v.token_types.push_back(3);
  return v;
}

}  // namespace loom::llm
