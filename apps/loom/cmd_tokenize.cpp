// `loom tokenize`: token ids of a text, with the tokenizer of a GGUF file.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "commands.h"
#include "generate.h"
#include "loom/text.h"

namespace {

struct TokenizeOptions {
  int n_inputs = 0;  // how many of -f, -p, --vectors were given (an empty -p "" counts)
  bool from_file = false;
  bool from_vectors = false;
  std::string model;
  std::string file;
  std::string prompt;
  std::string vectors;
  bool bos = false;
  bool no_parse_special = false;
  bool pieces = false;
  bool stats = false;
};

int fail(const loom::Status& s) {
  std::fprintf(stderr, "loom: %s\n", s.to_string().c_str());
  return 1;
}

// A piece as a C-style quoted string, so control characters and partial UTF-8 stay visible.
std::string quote(std::string_view s) {
  const bool valid_utf8 = loom::text::utf8_first_invalid(s) == std::string_view::npos;
  std::string q = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      q += '\\';
      q += static_cast<char>(c);
    } else if (c == '\n') {
      q += "\\n";
    } else if (c == '\t') {
      q += "\\t";
    } else if (c < 0x20 || c == 0x7f || (c >= 0x80 && !valid_utf8)) {
      q += fmt::format("\\x{:02x}", c);
    } else {
      q += static_cast<char>(c);
    }
  }
  return q + "\"";
}

int run_tokenize(const TokenizeOptions& o) {
  if (o.n_inputs != 1) {
    std::fprintf(stderr, "loom tokenize: give exactly one of -f FILE, -p TEXT, --vectors FILE.inp\n");
    return 2;
  }
  auto tok = loom::Tokenizer::open(o.model);
  if (!tok) return fail(tok.status());
  for (const auto& w : tok->warnings()) std::fprintf(stderr, "loom: warning: %s\n", w.c_str());
  const bool parse_special = !o.no_parse_special;

  if (o.from_vectors) {
    // One line per test string in the reference .out format: each id preceded by a space.
    auto text = loom::app::read_file(o.vectors);
    if (!text) return fail(text.status());
    auto strings = loom::split_vocab_test_strings(*text, o.vectors);
    if (!strings) return fail(strings.status());
    std::string out;
    for (const std::string& s : *strings) {
      auto ids = tok->encode(s, false, parse_special);
      if (!ids) return fail(ids.status());
      for (loom::TokenId id : *ids) {
        out += ' ';
        out += std::to_string(id);
      }
      out += '\n';
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  }

  std::string text = o.prompt;
  if (o.from_file) {
    auto t = loom::app::read_file(o.file);
    if (!t) return fail(t.status());
    text = std::move(*t);
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto ids = tok->encode(text, false, parse_special);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!ids) return fail(ids.status());
  if (o.bos) {
    if (tok->special().bos == loom::kNoToken) {
      std::fprintf(stderr, "loom tokenize: --bos: %s defines no BOS token\n", o.model.c_str());
      return 1;
    }
    ids->insert(ids->begin(), tok->special().bos);
  }
  if (o.stats)
    fmt::print(stderr, "loom: {} bytes -> {} tokens in {:.3f} ms ({:.2f} MB/s, {} tokenizer, pre '{}')\n",
               text.size(), ids->size(), seconds * 1e3, text.size() / 1e6 / std::max(seconds, 1e-9),
               loom::tokenizer_kind_name(tok->kind()), tok->pre());

  std::string out;
  if (o.pieces) {
    for (loom::TokenId id : *ids) {
      auto piece = tok->token_to_piece(id, true);
      if (!piece) return fail(piece.status());
      out += fmt::format("{}\t{}\n", id, quote(*piece));
    }
  } else {
    for (size_t i = 0; i < ids->size(); ++i) {
      if (i) out += ' ';
      out += std::to_string((*ids)[i]);
    }
    out += '\n';
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace

namespace loom::app {

void add_tokenize_command(CLI::App& app, std::vector<Command>& out) {
  auto opts = std::make_shared<TokenizeOptions>();
  auto* cmd =
      app.add_subcommand("tokenize", "Print the token ids of a text with the tokenizer of a GGUF file");
  cmd->add_option("-m,--model", opts->model, "GGUF file with tokenizer.ggml.* metadata")->required();
  auto* file =
      cmd->add_option("-f,--file", opts->file, "Text file to tokenize (ids on one line, space-separated)");
  auto* prompt = cmd->add_option("-p,--prompt", opts->prompt, "Text to tokenize");
  auto* vectors = cmd->add_option(
      "--vectors", opts->vectors,
      "Test strings separated by __ggml_vocab_test__ lines; prints one line per string in the "
      "reference .out format (each id preceded by a space)");
  cmd->add_flag("--bos", opts->bos, "Put the BOS token first");
  cmd->add_flag("--no-parse-special", opts->no_parse_special,
                "Treat the text of control tokens (e.g. <|endoftext|>) as plain text");
  cmd->add_flag("--pieces", opts->pieces, "Print one token per line: id and the piece it decodes to");
  cmd->add_flag("--stats", opts->stats, "Print the encoding time and speed to stderr");
  out.push_back({cmd, [opts, file, prompt, vectors] {
                   opts->n_inputs = static_cast<int>(file->count() + prompt->count() + vectors->count());
                   opts->from_file = file->count() > 0;
                   opts->from_vectors = vectors->count() > 0;
                   return run_tokenize(*opts);
                 }});
}

}  // namespace loom::app
