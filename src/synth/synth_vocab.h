// The vocabulary of synthetic models: a byte-level BPE vocabulary in the GPT-2 layout, so a "gpt2"
// tokenizer (tokenizer.ggml.model = "gpt2", pre = "default") loads it like a real Llama 3 or Qwen
// vocabulary:
//   ids 0..255     the 256 byte tokens, id = byte value, each spelled with GPT-2's byte-to-unicode
//                  mapping (printable Latin-1 bytes stand for themselves, the others for U+0100 + k),
//                  token type 1 (normal);
//   then           merged tokens, trained by BPE on a built-in English text (pairs seen at least
//                  twice), with their merges "left right" in tokenizer.ggml.merges, type 1;
//   then           fillers "<synth_N>" up to the vocabulary size, type 5 (unused): no merge
//                  produces them, so they never come out of tokenization;
//   last two ids   "<|begin_of_text|>" (bos) and "<|end_of_text|>" (eos), type 3 (control).
// Every text tokenizes (any byte has a token) and detokenizes back to itself.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::llm {

struct SynthVocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> token_types;  ///< llama.cpp token types: 1 normal, 3 control, 5 unused
  std::vector<std::string> merges;   ///< "left right", in merge priority order
  int32_t bos = -1;
  int32_t eos = -1;
};

/// GPT-2's printable stand-in for byte `b`, UTF-8 encoded.
std::string gpt2_byte_to_unicode(uint8_t b);

/// A vocabulary of exactly `n_vocab` tokens (at least 258: bytes and the two specials).
SynthVocab make_synth_vocab(int n_vocab);

}  // namespace loom::llm
