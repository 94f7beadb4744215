// Runs the fuzz target over corpus files without libFuzzer, so the corpus is a regression test in
// every build (CTest: gguf-fuzz-corpus). Besides the target's own checks, files named "valid-*" must
// parse and files named "bad-*" must be rejected.
//
//   loom-fuzz-replay DIR_OR_FILE...
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "loom/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR_OR_FILE...\n", argv[0]);
    return 2;
  }
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    const fs::path p = argv[i];
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      for (const fs::directory_entry& e : fs::directory_iterator(p, ec))
        if (e.is_regular_file()) files.push_back(e.path());
    } else if (fs::is_regular_file(p, ec)) {
      files.push_back(p);
    } else {
      std::fprintf(stderr, "%s: not a file or directory\n", p.c_str());
      return 2;
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::fprintf(stderr, "no corpus files found\n");
    return 2;
  }
  int failures = 0, accepted = 0;
  for (const fs::path& p : files) {
    std::ifstream in(p, std::ios::binary);
    // Exactly sized, so a sanitizer build flags any read past the end.
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    bytes.shrink_to_fit();
    LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
    loom::Result<loom::GgufFile> f = loom::GgufFile::parse(bytes, p.filename().string());
    accepted += f.ok();
    const std::string name = p.filename().string();
    if (name.rfind("valid-", 0) == 0 && !f.ok()) {
      std::fprintf(stderr, "FAIL %s: expected to parse, got: %s\n", name.c_str(),
                   f.status().message().c_str());
      ++failures;
    } else if (name.rfind("bad-", 0) == 0 && f.ok()) {
      std::fprintf(stderr, "FAIL %s: expected a format error, but it parsed\n", name.c_str());
      ++failures;
    } else if (!f.ok() && std::getenv("LOOM_REPLAY_VERBOSE")) {
      std::printf("%s\n", f.status().message().c_str());
    }
  }
  std::printf("replayed %zu files: %d accepted, %zu rejected, %d unexpected\n", files.size(), accepted,
              files.size() - accepted, failures);
  return failures == 0 ? 0 : 1;
}
