// Options and entry point of text generation (`loom run -m MODEL`), with llama.cpp's flag names.
#pragma once

#include <cstdint>
#include <string>

#include "loom/sample.h"

namespace loom::app {

struct GenerateOptions {
  std::string model_path;    ///< -m
  std::string prompt = "Once upon a time";  ///< -p
  std::string prompt_file;   ///< -f
  int n_predict = 64;        ///< -n
  int n_ctx = 0;             ///< -c (0: the model's, at most 4096)
  int n_threads = 0;         ///< -t
  int n_batch = 512;         ///< -ub
  float temperature = 0.8f;  ///< --temp
  int top_k = 40;            ///< --top-k
  float top_p = 0.95f;       ///< --top-p
  float min_p = 0.05f;       ///< --min-p
  float repeat_penalty = 1.0f;  ///< --repeat-penalty
  uint32_t seed = kRandomSeed;  ///< -s
  int n_gpu_layers = 0;      ///< -ngl
  std::string backend;       ///< --backend overrides -ngl's choice
  std::string dump_logits;   ///< --dump-logits: all prompt logits (f32) to this file, ids to FILE.tokens
};

int run_generate(const GenerateOptions& o);

}  // namespace loom::app
