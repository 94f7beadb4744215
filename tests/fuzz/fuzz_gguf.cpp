// libFuzzer target for the GGUF reader. Besides "no crash, no sanitizer report", it checks two
// properties: every rejection names the file, and every accepted file survives a round trip through
// GgufWriter (copied metadata and tensors parse again to the same values and bytes).
//
// Built with -fsanitize=fuzzer,address when LOOM_FUZZ=ON (tests/fuzz/CMakeLists.txt), and without
// libFuzzer into loom-fuzz-replay, which runs the corpus as a CTest test.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "loom/gguf.h"

namespace {

constexpr const char* kName = "fuzz.gguf";

#define FUZZ_CHECK(cond)                                                                \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "fuzz_gguf: check failed: %s (line %d)\n", #cond, __LINE__); \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)

// Reads every value through every accessor; sanitizers catch any read outside the input.
void touch_value(const loom::GgufValue& v, int depth) {
  (void)v.type_string();
  (void)v.format(4);
  (void)v.as_u64();
  (void)v.as_i64();
  (void)v.as_f64();
  (void)v.as_bool();
  if (auto s = v.as_string()) FUZZ_CHECK(s->size() + 8 == v.raw().size());
  if (!v.is_array()) return;
  const std::vector<loom::GgufValue> elems = v.elements();
  FUZZ_CHECK(elems.size() == v.array_size());
  for (const loom::GgufValue& e : elems) {
    FUZZ_CHECK(e.type() == v.array_type());
    FUZZ_CHECK(e.raw().data() >= v.raw().data() &&
               e.raw().data() + e.raw().size() <= v.raw().data() + v.raw().size());
    touch_value(e, depth + 1);
  }
  FUZZ_CHECK(depth <= loom::kGgufMaxArrayDepth);
}

void touch_file(const loom::GgufFile& f) {
  FUZZ_CHECK(f.version() == 2 || f.version() == 3);
  FUZZ_CHECK(f.alignment() != 0 && (f.alignment() & (f.alignment() - 1)) == 0);
  FUZZ_CHECK(f.data_offset() % f.alignment() == 0);
  for (const loom::GgufKV& kv : f.kvs()) {
    FUZZ_CHECK(f.find(kv.key) == &kv.value);
    touch_value(kv.value, 0);
    // Every getter must answer with a value or a Status, whatever the stored type.
    (void)f.get_u32(kv.key);
    (void)f.get_i32(kv.key);
    (void)f.get_u64(kv.key);
    (void)f.get_i64(kv.key);
    (void)f.get_f32(kv.key);
    (void)f.get_bool(kv.key);
    (void)f.get_string(kv.key);
    (void)f.get_string_array(kv.key);
    (void)f.get_int_array(kv.key);
    (void)f.get_f32_array(kv.key);
  }
  uint64_t tensor_bytes = 0;
  for (const loom::GgufTensorInfo& t : f.tensors()) {
    tensor_bytes += t.size;
    FUZZ_CHECK(tensor_bytes <= f.file_size());  // tensors never overlap
    FUZZ_CHECK(f.find_tensor(t.name) == &t);
    FUZZ_CHECK(t.size > 0 && t.type_info != nullptr);
    FUZZ_CHECK(t.data >= f.bytes().data() && t.data + t.size <= f.bytes().data() + f.bytes().size());
    FUZZ_CHECK(t.offset % f.alignment() == 0);
    // First and last byte: out of bounds would be a sanitizer report.
    volatile uint8_t sink = t.data[0] ^ t.data[t.size - 1];
    (void)sink;
    (void)f.dtype_of(t);
  }
}

// What the reader accepts, the writer must reproduce.
void round_trip(const loom::GgufFile& f) {
  loom::GgufWriter w;
  for (const loom::GgufKV& kv : f.kvs()) FUZZ_CHECK(w.add_value(kv.key, kv.value).ok());
  for (const loom::GgufTensorInfo& t : f.tensors())
    FUZZ_CHECK(
        w.add_tensor_ggml(t.name, t.ggml_type, std::span<const int64_t>(t.ne.data(), t.n_dims), t.data).ok());
  loom::Result<std::vector<uint8_t>> bytes = w.serialize();
  FUZZ_CHECK(bytes.ok());
  loom::Result<loom::GgufFile> g = loom::GgufFile::parse(*bytes, "copy.gguf");
  if (!g.ok()) std::fprintf(stderr, "fuzz_gguf: copy rejected: %s\n", g.status().message().c_str());
  FUZZ_CHECK(g.ok());
  FUZZ_CHECK(g->kvs().size() == f.kvs().size() && g->tensors().size() == f.tensors().size());
  FUZZ_CHECK(g->alignment() == f.alignment());
  for (size_t i = 0; i < f.kvs().size(); ++i) {
    const loom::GgufKV& a = f.kvs()[i];
    const loom::GgufKV& b = g->kvs()[i];
    FUZZ_CHECK(a.key == b.key && a.value.type() == b.value.type());
    FUZZ_CHECK(a.value.raw().size() == b.value.raw().size());
    FUZZ_CHECK(std::memcmp(a.value.raw().data(), b.value.raw().data(), a.value.raw().size()) == 0);
  }
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const loom::GgufTensorInfo& a = f.tensors()[i];
    const loom::GgufTensorInfo& b = g->tensors()[i];
    FUZZ_CHECK(a.name == b.name && a.ggml_type == b.ggml_type && a.ne == b.ne && a.n_dims == b.n_dims);
    FUZZ_CHECK(a.size == b.size && std::memcmp(a.data, b.data, a.size) == 0);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  loom::Result<loom::GgufFile> f = loom::GgufFile::parse(std::span<const uint8_t>(data, size), kName);
  if (!f.ok()) {
    const std::string msg = f.status().message();
    FUZZ_CHECK(f.status().code() == loom::StatusCode::format_error);
    FUZZ_CHECK(msg.rfind(std::string(kName) + ": ", 0) == 0);
    return 0;
  }
  touch_file(*f);
  round_trip(*f);
  return 0;
}
