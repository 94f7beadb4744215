// `loom chat -m MODEL`: an interactive conversation through the model's chat template (without -m,
// the built-in model, as `loom run`).
//
// Each turn renders the whole conversation and tokenizes it, then decodes only what the KV cache
// does not already hold: the cache keeps the tokens of earlier turns (prompts and replies), and
// the new prompt is compared with them token by token. Usually the new tokens just extend the
// cache; where they differ (a reply re-tokenizes differently from how it was generated, a template
// trims the reply) the cache is cut back to the first differing token with kv_cache_seq_rm and
// decoding resumes there.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "commands.h"
#include "generate.h"
#include "loom/chat.h"
#include "loom/llm.h"
#include "loom/llm_sampling.h"
#include "loom/sample.h"
#include "loom/text.h"
#include "loom/text_stream.h"

namespace loom::app {

namespace {

struct ChatOptions {
  GenerateOptions gen;
  std::string template_name;   ///< --chat-template
  std::string template_file;   ///< --chat-template-file
  std::string system_prompt;   ///< -sys
  int n_predict = -1;          ///< -n per reply; -1: until the end of the turn or a full context
};

int fail(const Status& s) {
  std::fflush(stdout);
  std::fprintf(stderr, "\nloom: %s\n", s.to_string().c_str());
  return 1;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Reads one user message: a line, or several when lines end with '\' (the backslash is dropped
// and the lines joined with '\n'). false at end of input.
bool read_message(std::string& out) {
  out.clear();
  std::string line;
  bool any = false;
  while (std::getline(std::cin, line)) {
    any = true;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty() && line.back() == '\\') {
      line.pop_back();
      out += line + "\n";
      continue;
    }
    out += line;
    return true;
  }
  return any;
}

class Chat {
 public:
  Chat(const ChatOptions& o, llm::Context& ctx, const Tokenizer& tok, const ChatFormat& tmpl, Sampler& sampler)
      : o_(o), ctx_(ctx), tok_(tok), tmpl_(tmpl), sampler_(sampler) {
    step_options_.device = !o.gen.host_sampling;
    const SpecialTokens& sp = tok.special();
    // The model's own BOS/EOS spellings, so that the tokenizer matches them as special tokens.
    if (sp.bos != kNoToken) render_.bos_token = std::string(tok.token_text(sp.bos));
    if (sp.eos != kNoToken) render_.eos_token = std::string(tok.token_text(sp.eos));
    // A Jinja template writes the BOS text itself where the model wants it (see tokenize_conversation).
    render_.add_bos = tmpl.jinja.has_value();
    end_of_turn_ = chat_end_of_turn(tmpl, render_);
    for (TokenId id : {sp.eos, sp.eot, tok.find_token(end_of_turn_)})
      if (id != kNoToken) stop_ids_.insert(id);
    reset();
  }

  void reset() {
    messages_.clear();
    if (!o_.system_prompt.empty()) messages_.push_back({"system", o_.system_prompt});
    ctx_.kv_cache_clear();
    cached_.clear();
  }

  /// One exchange: the user's message in, the reply streamed to stdout. An error that leaves the
  /// conversation usable (a prompt too long for the context) is reported and the message dropped.
  Status turn(const std::string& user) {
    ++n_turns_;
    messages_.push_back({"user", user});
    auto prompt = tokenize_conversation();
    if (!prompt) {
      // Most likely the message itself (not valid UTF-8): say so and let the user go on.
      messages_.pop_back();
      fmt::print(stderr, "loom: message dropped: {}\n", prompt.status().to_string());
      return {};
    }
    if (prompt->size() >= static_cast<size_t>(ctx_.n_ctx())) {
      messages_.pop_back();
      fmt::print(
          stderr,
          "loom: the conversation ({} tokens) no longer fits the context of {} (-c); /reset starts over\n",
          prompt->size(), ctx_.n_ctx());
      return {};
    }
    const auto t0 = std::chrono::steady_clock::now();
    size_t reused = 0;
    auto logits = sync_cache(*prompt, reused);
    if (!logits) return logits.status();
    const double prompt_s = seconds_since(t0);
    const size_t n_new = prompt->size() - reused;

    StopFilter out(end_of_turn_, [](std::string_view text) {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    });
    const auto t1 = std::chrono::steady_clock::now();
    int n_gen = 0;
    int n_steps = 0, n_device_steps = 0;  // decode steps, and those whose token the graph sampled
    const char* why = "end of turn";
    // The first token comes from the prompt's logits; each step after that samples in the pass's
    // graph where the chain can run there (decode_and_sample).
    std::optional<int32_t> next;
    while (true) {
      if (o_.n_predict >= 0 && n_gen >= o_.n_predict) {
        why = "-n";
        break;
      }
      if (cached_.size() >= static_cast<size_t>(ctx_.n_ctx())) {
        why = "context full";
        break;
      }
      if (!next) {
        auto first = sampler_.sample(*logits, cached_);
        if (!first) return first.status();
        next = *first;
      }
      const int32_t token = *next;
      if (stop_ids_.count(token)) break;
      ++n_gen;
      auto piece = tok_.token_to_piece(token);
      if (!piece) return piece.status();
      const bool stopped = out.add(*piece);
      // The token is decoded even when it completes the stop string, so the cache holds everything
      // the model wrote; the next turn's prompt re-synchronizes from the first difference anyway.
      // A reply's last token is decoded without sampling a next one, so the sampler draws what it
      // drew before decode_and_sample (a fixed seed gives the same conversation).
      cached_.push_back(token);
      const std::span<const int32_t> step_tokens(&cached_.back(), 1);
      const int pos = static_cast<int>(cached_.size()) - 1;
      const bool last = stopped || (o_.n_predict >= 0 && n_gen >= o_.n_predict) ||
                        cached_.size() >= static_cast<size_t>(ctx_.n_ctx());
      if (last) {
        if (auto step = ctx_.decode(step_tokens, pos); !step) {
          invalidate_cache();
          return step.status();
        }
        if (stopped) break;
        continue;  // the loop's checks say why it ends
      }
      auto step = llm::decode_and_sample(ctx_, sampler_, step_tokens, pos, cached_, step_options_);
      if (!step) {
        invalidate_cache();
        return step.status();
      }
      ++n_steps;
      n_device_steps += step->on_device ? 1 : 0;
      next = step->token;
    }
    out.finish();
    fmt::print("\n");
    std::fflush(stdout);
    const double gen_s = seconds_since(t1);
    messages_.push_back({"assistant", to_valid_utf8(out.text())});
    fmt::print(
        stderr,
        "loom: turn {}: prompt {} tokens ({} from the cache, {} decoded in {:.1f} ms); reply {} tokens in "
        "{:.1f} ms ({:.1f} tokens/s), stopped by {}, sampling {}\n",
        n_turns_, prompt->size(), reused, n_new, prompt_s * 1000.0, n_gen, gen_s * 1000.0,
        n_gen > 0 && gen_s > 0.0 ? n_gen / gen_s : 0.0, why, sampling_where(n_device_steps, n_steps));
    return {};
  }

 private:
  Result<std::vector<int32_t>> tokenize_conversation() const {
    auto text = render_chat(tmpl_, messages_, render_);
    if (!text) return text.status();
    // The rendered text carries no leading BOS (see loom/chat.h): add it as the tokenizer says,
    // without its add_eos, which would end the prompt before the reply.
    auto ids = tok_.encode(*text, /*add_special=*/false, /*parse_special=*/true);
    if (!ids) return ids.status();
    std::vector<int32_t> out;
    const SpecialTokens& sp = tok_.special();
    // A leading BOS the template wrote stays (as its id); otherwise the tokenizer's add_bos decides.
    const bool template_bos = sp.bos != kNoToken && !ids->empty() && ids->front() == sp.bos;
    if (sp.add_bos && sp.bos != kNoToken && !template_bos) out.push_back(sp.bos);
    out.insert(out.end(), ids->begin(), ids->end());
    return out;
  }

  // Brings the cache to `prompt` and returns the logits of its last token.
  Result<std::span<const float>> sync_cache(const std::vector<int32_t>& prompt, size_t& reused) {
    size_t keep = 0;
    while (keep < cached_.size() && keep < prompt.size() && cached_[keep] == prompt[keep]) ++keep;
    // The last prompt token is always decoded again when nothing else is new: its logits are needed.
    if (keep == prompt.size()) --keep;
    if (keep < cached_.size()) {
      if (Status s = ctx_.kv_cache_seq_rm(0, static_cast<int>(keep)); !s.ok()) {
        invalidate_cache();
        return s;
      }
      cached_.resize(keep);
    }
    reused = keep;
    auto logits = ctx_.decode(std::span<const int32_t>(prompt).subspan(keep), static_cast<int>(keep));
    if (!logits) {
      invalidate_cache();
      return logits.status();
    }
    cached_ = prompt;
    return logits;
  }

  // After a failed decode the cache may hold part of a batch: start the next turn from scratch.
  void invalidate_cache() {
    ctx_.kv_cache_clear();
    cached_.clear();
  }

  const ChatOptions& o_;
  llm::Context& ctx_;
  const Tokenizer& tok_;
  const ChatFormat& tmpl_;
  Sampler& sampler_;
  llm::DecodeSampleOptions step_options_;  // --host-sampling turns the graph's sampling off
  ChatRenderOptions render_;
  std::string end_of_turn_;
  std::set<TokenId> stop_ids_;
  std::vector<ChatMessage> messages_;
  std::vector<int32_t> cached_;  // the tokens whose keys and values are in the cache, positions 0..
  int n_turns_ = 0;
};

int run_chat(const ChatOptions& o) {
  // A misspelled --chat-template fails before the model loads.
  if (!o.template_name.empty())
    if (auto t = chat_template_from_name(o.template_name); !t) return fail(t.status());
  std::string backend_name;
  auto session = open_generate_session(o.gen, backend_name);
  if (!session) return fail(session.status());
  auto tok = Tokenizer::from_gguf(session->model->gguf());
  if (!tok) return fail(tok.status());
  auto tmpl = chat_format_for_model(session->model->gguf(), o.template_name, o.template_file);
  if (!tmpl) return fail(tmpl.status());
  auto sampler = make_sampler(o.gen);
  if (!sampler) return fail(sampler.status());

  const bool interactive = ::isatty(STDIN_FILENO) != 0;
  fmt::print(stderr, "loom: chat template {}, context {}, backend {}, seed {}{}\n", tmpl->description,
             session->context->n_ctx(), backend_name, sampler->seed(),
             interactive ? "; /exit quits, /reset starts over, end a line with \\ to go on" : "");
  Chat chat(o, *session->context, *tok, *tmpl, *sampler);
  std::string line;
  while (true) {
    if (interactive) {
      fmt::print("> ");
      std::fflush(stdout);
    }
    if (!read_message(line)) break;
    if (line == "/exit") break;
    if (line == "/reset") {
      chat.reset();
      fmt::print(stderr, "loom: conversation cleared\n");
      continue;
    }
    if (line.empty()) continue;
    if (Status s = chat.turn(line); !s.ok()) return fail(s);
  }
  if (interactive) fmt::print("\n");
  return 0;
}

}  // namespace

void add_chat_command(CLI::App& app, std::vector<Command>& out) {
  auto o = std::make_shared<ChatOptions>();
  auto* cmd =
      app.add_subcommand("chat",
                         "Chat with a model: reads messages from stdin (one per line), streams replies; "
                         "/exit or end of input quits, /reset starts over");
  add_model_flags(*cmd, o->gen);
  cmd->get_option("--model")->description("GGUF model file (default: the built-in Shakespeare model)");
  cmd->add_option("--chat-template", o->template_name,
                  "Built-in chat template (" + chat_template_names() +
                      "); default: the model's own Jinja template (tokenizer.chat_template), chatml without one");
  cmd->add_option("--chat-template-file", o->template_file,
                  "Jinja chat template file to use instead of the model's");
  cmd->add_option("--system-prompt", o->system_prompt, "System message (-sys)");
  cmd->add_option("-n,--n-predict", o->n_predict, "Most tokens per reply (-1: until the end of the turn)")
      ->check(CLI::Range(-1, 1 << 20));
  add_sampling_flags(*cmd, o->gen);
  out.push_back({cmd, [o, cmd] {
                   if (!o->gen.model_path.empty()) return run_chat(*o);
                   ChatOptions builtin = *o;
                   if (!use_builtin_model(*cmd, builtin.gen)) return 1;
                   return run_chat(builtin);
                 }});
}

}  // namespace loom::app
