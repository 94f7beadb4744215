// A one-line progress indicator on stderr, drawn only when stderr is a terminal (logs and pipes
// get nothing), redrawn at most once per percent.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <string>

namespace loom::llm {

class ProgressLine {
 public:
  ProgressLine(bool wanted, std::string label) : enabled_(wanted && ::isatty(2)), label_(std::move(label)) {}
  ~ProgressLine() { done(); }
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  /// `fraction` in [0, 1].
  void update(double fraction) {
    if (!enabled_) return;
    const int pct = static_cast<int>(fraction * 100.0);
    if (pct == last_pct_) return;
    last_pct_ = pct;
    std::fprintf(stderr, "\r%s %3d%%", label_.c_str(), pct);
    std::fflush(stderr);
  }
  /// Erases the line.
  void done() {
    if (!enabled_ || last_pct_ < 0) return;
    std::fprintf(stderr, "\r%*s\r", static_cast<int>(label_.size()) + 6, "");
    std::fflush(stderr);
    last_pct_ = -1;
  }

 private:
  bool enabled_;
  std::string label_;
  int last_pct_ = -1;
};

}  // namespace loom::llm
