// GGUF reader and writer: round trips of every metadata type and tensor dtype, and malformed files
// (hand-built byte by byte) that must each fail with a Status naming the file and the problem.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "loom/gguf.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

// ---- helpers -------------------------------------------------------------------------------------

// Builds GGUF bytes field by field, so tests can write what no valid writer would.
struct Bytes {
  std::vector<uint8_t> b;

  Bytes& raw(const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    b.insert(b.end(), c, c + n);
    return *this;
  }
  template <typename T>
  Bytes& put(T v) {
    return raw(&v, sizeof v);
  }
  Bytes& u32(uint32_t v) { return put(v); }
  Bytes& u64(uint64_t v) { return put(v); }
  Bytes& str(std::string_view s) { return u64(s.size()).raw(s.data(), s.size()); }
  Bytes& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return raw("GGUF", 4).u32(version).u64(n_tensors).u64(n_kv);
  }
  Bytes& kv_u32(std::string_view key, uint32_t v) { return str(key).u32(4).u32(v); }
  Bytes& kv_str(std::string_view key, std::string_view v) { return str(key).u32(8).str(v); }
  Bytes& tensor(std::string_view name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) u64(d);
    return u32(type).u64(offset);
  }
  Bytes& pad(size_t alignment) {
    while (b.size() % alignment) b.push_back(0);
    return *this;
  }
  // Non-zero, position-dependent filler for tensor data.
  Bytes& data(size_t n) {
    for (size_t i = 0; i < n; ++i) b.push_back(static_cast<uint8_t>(i * 7 + 1));
    return *this;
  }
};

constexpr const char* kName = "t.gguf";

Result<GgufFile> parse(const std::vector<uint8_t>& bytes) { return GgufFile::parse(bytes, kName); }

// The bytes must be rejected with a format error whose message starts with the file name and
// contains every fragment.
void expect_format_error(const std::vector<uint8_t>& bytes,
                         std::initializer_list<std::string_view> fragments) {
  // An exactly sized copy, so a sanitizer build catches reads past the end.
  const std::vector<uint8_t> exact(bytes.begin(), bytes.end());
  Result<GgufFile> f = parse(exact);
  ASSERT_FALSE(f.ok()) << "expected an error containing '" << *fragments.begin() << "'";
  const std::string msg = f.status().message();
  EXPECT_EQ(f.status().code(), StatusCode::format_error) << msg;
  EXPECT_EQ(msg.rfind(std::string(kName) + ": ", 0), 0u) << msg;
  for (std::string_view frag : fragments)
    EXPECT_NE(msg.find(frag), std::string::npos) << "missing '" << frag << "' in: " << msg;
}

std::vector<uint8_t> pattern_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& x : v) x = static_cast<uint8_t>(rng() | 1u);  // never zero
  return v;
}

// A scratch directory removed at the end of each test.
class GgufFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "loom-gguf-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

// ---- round trips ---------------------------------------------------------------------------------

TEST_F(GgufFiles, RoundTripEveryMetadataType) {
  GgufWriter w;
  ASSERT_TRUE(w.add_u8("t.u8", 250).ok());
  ASSERT_TRUE(w.add_i8("t.i8", -120).ok());
  ASSERT_TRUE(w.add_u16("t.u16", 65000).ok());
  ASSERT_TRUE(w.add_i16("t.i16", -32000).ok());
  ASSERT_TRUE(w.add_u32("t.u32", 4000000000u).ok());
  ASSERT_TRUE(w.add_i32("t.i32", -2000000000).ok());
  ASSERT_TRUE(w.add_f32("t.f32", 1.5e-5f).ok());
  ASSERT_TRUE(w.add_bool("t.bool", true).ok());
  ASSERT_TRUE(w.add_string("t.string", std::string_view("h\xc3\xa9llo\0x", 8)).ok());
  ASSERT_TRUE(w.add_u64("t.u64", 18000000000000000000ull).ok());
  ASSERT_TRUE(w.add_i64("t.i64", -9000000000000000000ll).ok());
  ASSERT_TRUE(w.add_f64("t.f64", -2.718281828459045).ok());
  ASSERT_TRUE(w.add_string("t.empty", "").ok());

  const std::vector<uint8_t> a_u8{1, 2, 255};
  const std::vector<int8_t> a_i8{-1, 0, 127};
  const std::vector<uint16_t> a_u16{7, 65535};
  const std::vector<int16_t> a_i16{-32768, 5};
  const std::vector<uint32_t> a_u32{1, 4294967295u, 3};
  const std::vector<int32_t> a_i32{-5, 6, 2147483647};
  const std::vector<float> a_f32{0.25f, -1e30f, 3.0f};
  const bool a_bool[] = {true, false, true, true};
  const std::vector<uint64_t> a_u64{1ull << 63, 9};
  const std::vector<int64_t> a_i64{-(1ll << 62), 42};
  const std::vector<double> a_f64{1e-300, 2.5};  // 1e-300 is 0 as f32
  const std::vector<std::string> a_str{"<s>", "", "\xe2\x96\x81the", "a\nb"};
  const std::vector<std::string_view> a_sv{"x", "yz"};
  const std::vector<int32_t> a_empty;
  ASSERT_TRUE(w.add_array("a.u8", a_u8).ok());
  ASSERT_TRUE(w.add_array("a.i8", a_i8).ok());
  ASSERT_TRUE(w.add_array("a.u16", a_u16).ok());
  ASSERT_TRUE(w.add_array("a.i16", a_i16).ok());
  ASSERT_TRUE(w.add_array("a.u32", a_u32).ok());
  ASSERT_TRUE(w.add_array("a.i32", a_i32).ok());
  ASSERT_TRUE(w.add_array("a.f32", a_f32).ok());
  ASSERT_TRUE(w.add_array("a.bool", std::span<const bool>(a_bool)).ok());
  ASSERT_TRUE(w.add_array("a.u64", a_u64).ok());
  ASSERT_TRUE(w.add_array("a.i64", a_i64).ok());
  ASSERT_TRUE(w.add_array("a.f64", a_f64).ok());
  ASSERT_TRUE(w.add_array("a.str", a_str).ok());
  ASSERT_TRUE(w.add_array("a.sv", a_sv).ok());
  ASSERT_TRUE(w.add_array("a.empty", a_empty).ok());
  ASSERT_EQ(w.kv_count(), 27u);
  ASSERT_TRUE(w.write(path("kv.gguf")).ok());

  Result<GgufFile> r = GgufFile::open(path("kv.gguf"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  const GgufFile& f = *r;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_TRUE(f.tensors().empty());
  ASSERT_EQ(f.kvs().size(), 27u);
  EXPECT_EQ(f.kvs()[0].key, "t.u8");
  EXPECT_EQ(f.kvs()[26].key, "a.empty");

  EXPECT_EQ(*f.get_u32("t.u8"), 250u);
  EXPECT_EQ(f.find("t.u8")->type(), GgufType::u8);
  EXPECT_EQ(*f.get_i32("t.i8"), -120);
  EXPECT_EQ(f.find("t.i8")->type(), GgufType::i8);
  EXPECT_EQ(*f.get_u32("t.u16"), 65000u);
  EXPECT_EQ(*f.get_i32("t.i16"), -32000);
  EXPECT_EQ(*f.get_u32("t.u32"), 4000000000u);
  EXPECT_EQ(*f.get_i32("t.i32"), -2000000000);
  EXPECT_EQ(*f.get_f32("t.f32"), 1.5e-5f);
  EXPECT_EQ(*f.get_bool("t.bool"), true);
  EXPECT_EQ(*f.get_string("t.string"), std::string_view("h\xc3\xa9llo\0x", 8));
  EXPECT_EQ(*f.get_u64("t.u64"), 18000000000000000000ull);
  EXPECT_EQ(*f.get_i64("t.i64"), -9000000000000000000ll);
  EXPECT_EQ(*f.find("t.f64")->as_f64(), -2.718281828459045);
  EXPECT_EQ(*f.get_f32("t.f64"), static_cast<float>(-2.718281828459045));
  EXPECT_EQ(*f.get_string("t.empty"), "");

  auto ints = [&](const char* key) { return *f.get_int_array(key); };
  EXPECT_EQ(ints("a.u8"), (std::vector<int64_t>{1, 2, 255}));
  EXPECT_EQ(ints("a.i8"), (std::vector<int64_t>{-1, 0, 127}));
  EXPECT_EQ(ints("a.u16"), (std::vector<int64_t>{7, 65535}));
  EXPECT_EQ(ints("a.i16"), (std::vector<int64_t>{-32768, 5}));
  EXPECT_EQ(ints("a.u32"), (std::vector<int64_t>{1, 4294967295ll, 3}));
  EXPECT_EQ(ints("a.i32"), (std::vector<int64_t>{-5, 6, 2147483647}));
  EXPECT_EQ(ints("a.i64"), (std::vector<int64_t>{-(1ll << 62), 42}));
  EXPECT_EQ(ints("a.empty"), std::vector<int64_t>{});
  EXPECT_EQ(*f.get_f32_array("a.f32"), a_f32);
  EXPECT_EQ(*f.get_f32_array("a.f64"), (std::vector<float>{0.0f, 2.5f}));
  EXPECT_EQ(*f.find("a.f64")->elements()[0].as_f64(), 1e-300);
  const std::vector<GgufValue> bools = f.find("a.bool")->elements();
  ASSERT_EQ(bools.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(*bools[i].as_bool(), a_bool[i]);
  const std::vector<GgufValue> u64s = f.find("a.u64")->elements();
  ASSERT_EQ(u64s.size(), 2u);
  EXPECT_EQ(*u64s[0].as_u64(), 1ull << 63);
  const std::vector<std::string_view> strs = *f.get_string_array("a.str");
  ASSERT_EQ(strs.size(), a_str.size());
  for (size_t i = 0; i < strs.size(); ++i) EXPECT_EQ(strs[i], a_str[i]);
  EXPECT_EQ(*f.get_string_array("a.sv"), (std::vector<std::string_view>{"x", "yz"}));

  // Display, as `loom info` prints it.
  EXPECT_EQ(f.find("a.u32")->type_string(), "array[u32]");
  EXPECT_EQ(f.find("a.u32")->format(), "[1, 4294967295, 3]");
  EXPECT_EQ(f.find("a.u32")->format(2), "[1, 4294967295, ... (3 elements)]");
  EXPECT_EQ(f.find("a.str")->format(), "[\"<s>\", \"\", \"\\xe2\\x96\\x81the\", \"a\\x0ab\"]");
  EXPECT_EQ(f.find("t.bool")->format(), "true");
  EXPECT_EQ(f.find("t.i64")->format(), "-9000000000000000000");
  EXPECT_EQ(f.find("t.f32")->format(), "1.5e-05");
}

TEST_F(GgufFiles, RoundTripTensorOfEveryDType) {
  struct Case {
    DType type;
    std::vector<int64_t> ne;
    std::vector<uint8_t> data;
  };
  std::vector<Case> cases;
  for (int i = 0; i < kDTypeCount; ++i) {
    const auto t = static_cast<DType>(i);
    const int64_t bs = dtype_block_size(t);
    // Shapes of 1 to 4 dims; byte sizes that are not multiples of the alignment.
    std::vector<int64_t> ne{bs * (i % 3 + 1)};
    for (int d = 1; d <= i % 4; ++d) ne.push_back(d + 1);
    int64_t rows = 1;
    for (size_t d = 1; d < ne.size(); ++d) rows *= ne[d];
    const size_t bytes = dtype_row_size(t, ne[0]) * static_cast<size_t>(rows);
    cases.push_back({t, ne, pattern_bytes(bytes, 100 + i)});
  }
  GgufWriter w;
  ASSERT_TRUE(w.add_string("general.architecture", "test").ok());
  for (const Case& c : cases) {
    const std::string name = std::string("w.") + dtype_name(c.type);
    ASSERT_TRUE(w.add_tensor(name, c.type, c.ne, c.data.data()).ok()) << name;
  }
  // A tensor produced by a callback.
  const std::vector<uint8_t> filled = pattern_bytes(4 * 40, 7);
  const std::vector<int64_t> fill_ne{40};
  ASSERT_TRUE(w.add_tensor("w.fill", DType::f32, fill_ne, [&](std::span<uint8_t> dst) {
                 EXPECT_EQ(dst.size(), filled.size());
                 std::memcpy(dst.data(), filled.data(), dst.size());
                 return Status{};
               }).ok());
  ASSERT_TRUE(w.write(path("w.gguf")).ok());

  Result<GgufFile> r = GgufFile::open(path("w.gguf"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  const GgufFile& f = *r;
  ASSERT_EQ(f.tensors().size(), cases.size() + 1);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  EXPECT_GT(f.data_offset(), 0u);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const GgufTensorInfo& t = f.tensors()[i];
    EXPECT_EQ(t.name, std::string("w.") + dtype_name(c.type));
    ASSERT_TRUE(t.dtype.has_value());
    EXPECT_EQ(*t.dtype, c.type);
    EXPECT_EQ(*f.dtype_of(t), c.type);
    EXPECT_EQ(t.ggml_type, dtype_traits(c.type).gguf_id);
    EXPECT_EQ(t.n_dims, static_cast<int>(c.ne.size()));
    for (int d = 0; d < kMaxDims; ++d) EXPECT_EQ(t.ne[d], d < t.n_dims ? c.ne[d] : 1);
    ASSERT_EQ(t.size, c.data.size());
    EXPECT_EQ(std::memcmp(t.data, c.data.data(), t.size), 0);
    EXPECT_EQ(t.offset % 32, 0u);
    EXPECT_EQ(static_cast<uint64_t>(t.data - f.bytes().data()), f.data_offset() + t.offset);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 32, 0u);  // the mapping is page-aligned
    // The type table agrees with Loom's block layouts.
    EXPECT_EQ(t.type_info->block_size, static_cast<uint32_t>(dtype_block_size(c.type)));
    EXPECT_EQ(t.type_info->type_size, dtype_type_size(c.type));
  }
  Result<const GgufTensorInfo*> fill = f.tensor("w.fill");
  ASSERT_TRUE(fill.ok());
  ASSERT_EQ((*fill)->size, filled.size());
  EXPECT_EQ(std::memcmp((*fill)->data, filled.data(), filled.size()), 0);
  Result<const GgufTensorInfo*> missing = f.tensor("nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("w.gguf: tensor 'nope' is missing"), std::string::npos);
}

TEST_F(GgufFiles, CustomAlignmentPlacesEveryTensor) {
  for (uint32_t alignment : {1u, 8u, 64u, 4096u}) {
    GgufWriter w;
    ASSERT_TRUE(w.add_u32("general.alignment", alignment).ok());
    const std::vector<uint8_t> a = pattern_bytes(4 * 3, 1), b = pattern_bytes(2 * 5, 2);
    const std::vector<int64_t> na{3}, nb{5};
    ASSERT_TRUE(w.add_tensor("a", DType::f32, na, a.data()).ok());
    ASSERT_TRUE(w.add_tensor("b", DType::f16, nb, b.data()).ok());
    Result<std::vector<uint8_t>> bytes = w.serialize();
    ASSERT_TRUE(bytes.ok());
    Result<GgufFile> f = parse(*bytes);
    ASSERT_TRUE(f.ok()) << f.status().message();
    EXPECT_EQ(f->alignment(), alignment);
    EXPECT_EQ(f->data_offset() % alignment, 0u);
    EXPECT_EQ(f->tensors()[1].offset % alignment, 0u);
    EXPECT_GE(f->tensors()[1].offset, 12u);
    EXPECT_EQ(std::memcmp(f->tensors()[1].data, b.data(), b.size()), 0);
  }
}

TEST_F(GgufFiles, FileWithoutTensorsEndsAfterMetadata) {
  // Found by the fuzzer: padding such a file to a huge (valid) alignment cost up to 2 GiB.
  GgufWriter w;
  ASSERT_TRUE(w.add_u32("general.alignment", 1u << 30).ok());
  ASSERT_TRUE(w.add_string("general.name", "vocab").ok());
  Result<std::vector<uint8_t>> bytes = w.serialize();
  ASSERT_TRUE(bytes.ok());
  EXPECT_LT(bytes->size(), 200u);
  Result<GgufFile> f = parse(*bytes);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->alignment(), 1u << 30);
  EXPECT_EQ(f->data_offset(), 1u << 30);  // past the end, which is fine without tensors
  EXPECT_EQ(*f->get_string("general.name"), "vocab");
}

TEST_F(GgufFiles, TypeLoomLacksParsesButIsUnsupported) {
  GgufWriter w;
  const std::vector<uint8_t> iq3s = pattern_bytes(110 * 2, 3);  // two iq3_s blocks
  const std::vector<int64_t> ne{256, 2};
  ASSERT_TRUE(w.add_tensor_ggml("blk.0.ffn_down.weight", 21, ne, iq3s.data()).ok());
  Result<std::vector<uint8_t>> bytes = w.serialize();
  ASSERT_TRUE(bytes.ok());
  Result<GgufFile> f = GgufFile::parse(*bytes, "model.gguf");
  ASSERT_TRUE(f.ok()) << f.status().message();
  const GgufTensorInfo& t = f->tensors()[0];
  EXPECT_FALSE(t.dtype.has_value());
  EXPECT_STREQ(t.type_info->name, "iq3_s");
  EXPECT_EQ(t.size, iq3s.size());
  Result<DType> d = f->dtype_of(t);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::unsupported);
  EXPECT_EQ(d.status().message(),
            "model.gguf: tensor 'blk.0.ffn_down.weight': type iq3_s (ggml id 21) is not supported by Loom");
}

TEST_F(GgufFiles, NestedArraysParseAndCopy) {
  // key "n": array of 2 arrays: [u16: 1, 2, 3] and [string: "ab"]
  Bytes b;
  b.header(0, 2).kv_u32("general.alignment", 8);
  b.str("n").u32(9).u32(9).u64(2);
  b.u32(2).u64(3).put<uint16_t>(1).put<uint16_t>(2).put<uint16_t>(3);
  b.u32(8).u64(1).str("ab");
  Result<GgufFile> f = parse(b.b);
  ASSERT_TRUE(f.ok()) << f.status().message();
  const GgufValue* n = f->find("n");
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->type_string(), "array[array]");
  EXPECT_EQ(n->format(), "[[1, 2, 3], [\"ab\"]]");
  const std::vector<GgufValue> outer = n->elements();
  ASSERT_EQ(outer.size(), 2u);
  EXPECT_EQ(outer[0].array_type(), GgufType::u16);
  EXPECT_EQ(*outer[0].elements()[2].as_u64(), 3u);
  EXPECT_EQ(*outer[1].elements()[0].as_string(), "ab");
  Result<std::vector<int64_t>> not_ints = f->get_int_array("n");
  ASSERT_FALSE(not_ints.ok());
  EXPECT_EQ(not_ints.status().code(), StatusCode::type_mismatch);

  // The writer copies any value as it is.
  GgufWriter w;
  for (const GgufKV& kv : f->kvs()) ASSERT_TRUE(w.add_value(kv.key, kv.value).ok());
  EXPECT_EQ(w.alignment(), 8u);
  Result<std::vector<uint8_t>> copy = w.serialize();
  ASSERT_TRUE(copy.ok());
  Result<GgufFile> g = parse(*copy);
  ASSERT_TRUE(g.ok()) << g.status().message();
  const GgufValue* m = g->find("n");
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(m->raw().size(), n->raw().size());
  EXPECT_EQ(std::memcmp(m->raw().data(), n->raw().data(), n->raw().size()), 0);
}

TEST_F(GgufFiles, GetterErrorsNameFileAndKey) {
  GgufWriter w;
  ASSERT_TRUE(w.add_string("general.name", "m").ok());
  ASSERT_TRUE(w.add_u64("big", 1ull << 40).ok());
  ASSERT_TRUE(w.add_i8("neg", -1).ok());
  ASSERT_TRUE(w.add_u32("u", 7).ok());
  const std::vector<float> fl{1.0f};
  ASSERT_TRUE(w.add_array("floats", fl).ok());
  const std::vector<uint64_t> huge{1ull << 63};
  ASSERT_TRUE(w.add_array("huge", huge).ok());
  Result<std::vector<uint8_t>> bytes = w.serialize();
  ASSERT_TRUE(bytes.ok());
  Result<GgufFile> r = GgufFile::parse(*bytes, "model.gguf");
  ASSERT_TRUE(r.ok());
  const GgufFile& f = *r;

  auto expect = [](const Status& s, StatusCode code, const std::string& msg) {
    EXPECT_EQ(s.code(), code) << s.message();
    EXPECT_EQ(s.message(), msg);
  };
  expect(f.get_u32("general.name").status(), StatusCode::type_mismatch,
         "model.gguf: key 'general.name' has type string, expected u32");
  expect(f.get_string("u").status(), StatusCode::type_mismatch,
         "model.gguf: key 'u' has type u32, expected string");
  expect(f.get_f32("u").status(), StatusCode::type_mismatch,
         "model.gguf: key 'u' has type u32, expected f32");
  expect(f.get_bool("u").status(), StatusCode::type_mismatch,
         "model.gguf: key 'u' has type u32, expected bool");
  expect(f.get_u32("big").status(), StatusCode::invalid_argument,
         "model.gguf: key 'big' = 1099511627776 does not fit in u32");
  expect(f.get_u32("neg").status(), StatusCode::invalid_argument,
         "model.gguf: key 'neg' = -1 does not fit in u32");
  expect(f.get_u32("absent").status(), StatusCode::format_error, "model.gguf: key 'absent' is missing");
  expect(f.get_string_array("floats").status(), StatusCode::type_mismatch,
         "model.gguf: key 'floats' has type array[f32], expected array[string]");
  expect(f.get_f32_array("u").status(), StatusCode::type_mismatch,
         "model.gguf: key 'u' has type u32, expected an array");
  expect(f.get_int_array("huge").status(), StatusCode::invalid_argument,
         "model.gguf: key 'huge' element 0 = 9223372036854775808 does not fit in i64");
  EXPECT_EQ(*f.get_u64("big"), 1ull << 40);
  EXPECT_EQ(*f.get_i32("neg"), -1);
  EXPECT_EQ(*f.get_u32_or("absent", 11), 11u);
  EXPECT_EQ(*f.get_u32_or("u", 11), 7u);
  EXPECT_EQ(*f.get_f32_or("absent", 0.5f), 0.5f);
  EXPECT_EQ(*f.get_bool_or("absent", true), true);
  EXPECT_FALSE(f.get_u32_or("general.name", 11).ok());  // present with the wrong type
}

// ---- malformed files -----------------------------------------------------------------------------

// A small valid file: a few KVs of various kinds and two tensors.
std::vector<uint8_t> small_valid_file() {
  GgufWriter w;
  EXPECT_TRUE(w.add_string("general.architecture", "llama").ok());
  EXPECT_TRUE(w.add_u32("llama.block_count", 2).ok());
  const std::vector<std::string> toks{"<unk>", "a", "bc"};
  EXPECT_TRUE(w.add_array("tokenizer.ggml.tokens", toks).ok());
  const std::vector<float> scores{0.0f, -1.5f, -2.5f};
  EXPECT_TRUE(w.add_array("tokenizer.ggml.scores", scores).ok());
  EXPECT_TRUE(w.add_bool("b", true).ok());
  static const std::vector<uint8_t> a = pattern_bytes(4 * 8, 1), q = pattern_bytes(34 * 2, 2);
  const std::vector<int64_t> na{4, 2}, nq{32, 2};
  EXPECT_TRUE(w.add_tensor("a", DType::f32, na, a.data()).ok());
  EXPECT_TRUE(w.add_tensor("blk.0.attn_q.weight", DType::q8_0, nq, q.data()).ok());
  return *w.serialize();
}

TEST(GgufMalformed, EveryTruncationFailsCleanly) {
  const std::vector<uint8_t> full = small_valid_file();
  Result<GgufFile> ok = parse(full);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  const GgufTensorInfo& last = ok->tensors().back();
  // The writer pads after the last tensor; cutting only that padding leaves a valid file.
  const size_t data_end = ok->data_offset() + last.offset + last.size;
  ASSERT_LT(data_end, full.size());
  size_t truncated_messages = 0;
  for (size_t len = 0; len < full.size(); ++len) {
    const std::vector<uint8_t> prefix(full.begin(), full.begin() + static_cast<ptrdiff_t>(len));
    Result<GgufFile> f = parse(prefix);
    if (len >= data_end) {
      EXPECT_TRUE(f.ok()) << len << ": " << f.status().message();
      continue;
    }
    ASSERT_FALSE(f.ok()) << "prefix of " << len << " bytes parsed";
    EXPECT_EQ(f.status().code(), StatusCode::format_error);
    const std::string msg = f.status().message();
    EXPECT_EQ(msg.rfind("t.gguf: ", 0), 0u) << msg;
    const bool explains =
        msg.find("truncated") != std::string::npos || msg.find("exceeds") != std::string::npos ||
        msg.find("too short") != std::string::npos || msg.find("impossible") != std::string::npos;
    EXPECT_TRUE(explains) << len << ": " << msg;
    truncated_messages += msg.find("truncated") != std::string::npos;
  }
  EXPECT_GT(truncated_messages, 20u);
}

TEST(GgufMalformed, HeaderErrors) {
  expect_format_error({}, {"file is 0 bytes, too short"});
  expect_format_error(Bytes().raw("GGML", 4).u32(3).u64(0).u64(0).b, {"not a GGUF file", "\"GGML\""});
  expect_format_error(Bytes().header(0, 0, 1).b, {"GGUF version 1 is not supported"});
  expect_format_error(Bytes().header(0, 0, 4).b,
                      {"unsupported GGUF version 4 (Loom reads versions 2 and 3)"});
  expect_format_error(Bytes().header(0, 0, 0x03000000).b, {"big-endian"});
  expect_format_error(Bytes().header(0, 1ull << 63).b,
                      {"header", "metadata_kv_count 9223372036854775808 is impossible"});
  expect_format_error(Bytes().header(1ull << 40, 0).data(100).b,
                      {"tensor_count 1099511627776 is impossible"});
  // Version 2 (64-bit counts, like 3) is accepted.
  Result<GgufFile> v2 = parse(Bytes().header(0, 1, 2).kv_u32("k", 1).b);
  ASSERT_TRUE(v2.ok()) << v2.status().message();
  EXPECT_EQ(v2->version(), 2u);
}

TEST(GgufMalformed, MetadataErrors) {
  const uint64_t huge = 1ull << 63;
  expect_format_error(Bytes().header(0, 1).u64(huge).raw("abcdefgh", 8).b,
                      {"key-value #0", "key length 9223372036854775808 exceeds the limit of 65535"});
  expect_format_error(Bytes().header(0, 1).u64(40).raw("abcdefghijklmnop", 16).b,
                      {"key-value #0", "key length 40 exceeds the 16 bytes left"});
  expect_format_error(Bytes().header(0, 1).str("").u32(4).u32(1).b, {"key-value #0: empty key"});
  expect_format_error(Bytes().header(0, 1).str("s").u32(8).u64(huge).data(16).b,
                      {"key 's': string length 9223372036854775808 exceeds the 16 bytes left in the file"});
  expect_format_error(Bytes().header(0, 1).str("arr").u32(9).u32(4).u64(1ull << 60).data(64).b,
                      {"key 'arr': array length 1152921504606846976 of u32 exceeds the 64 bytes left"});
  expect_format_error(Bytes().header(0, 1).str("arr").u32(9).u32(8).u64(3).str("a").u64(huge).data(20).b,
                      {"key 'arr': element [1]: string length 9223372036854775808 exceeds"});
  expect_format_error(Bytes().header(0, 1).str("k").u32(13).u32(0).b, {"key 'k': unknown value type 13"});
  expect_format_error(Bytes().header(0, 1).str("k").u32(9).u32(77).u64(0).b,
                      {"key 'k': unknown array element type 77"});
  expect_format_error(Bytes().header(0, 1).str("k").u32(7).put<uint8_t>(2).data(8).b,
                      {"key 'k': bool value 2", "neither 0 nor 1"});
  expect_format_error(Bytes().header(0, 2).kv_u32("k", 1).kv_u32("k", 2).b,
                      {"key 'k': duplicate key (key-values #0 and #1)"});
  expect_format_error(Bytes().header(0, 1).str("k\x01").u32(4).b, {"key 'k\\x01'", "truncated: u32 value"});
  // Arrays nested deeper than the limit: array of array of ... of u8.
  Bytes deep;
  deep.header(0, 1).str("deep").u32(9);
  for (int i = 0; i < kGgufMaxArrayDepth + 1; ++i) deep.u32(9).u64(1);
  deep.u32(0).u64(0).data(64);
  expect_format_error(deep.b,
                      {"key 'deep': element [0][0][0][0][0][0][0][0]: arrays nest deeper than 8 levels"});
}

TEST(GgufMalformed, AlignmentErrors) {
  expect_format_error(Bytes().header(0, 1).kv_u32("general.alignment", 0).b,
                      {"key 'general.alignment': 0 is not a nonzero power of two"});
  expect_format_error(Bytes().header(0, 1).kv_u32("general.alignment", 3).b,
                      {"key 'general.alignment': 3 is not a nonzero power of two"});
  expect_format_error(Bytes().header(0, 1).str("general.alignment").u32(10).u64(32).b,
                      {"key 'general.alignment': has type u64, expected u32"});
}

// One tensor "w" described by the arguments, default alignment, then `data_bytes` of data.
std::vector<uint8_t> one_tensor(std::vector<uint64_t> dims, uint32_t type, uint64_t offset,
                                size_t data_bytes) {
  Bytes b;
  b.header(1, 0).tensor("w", std::move(dims), type, offset).pad(32).data(data_bytes);
  return b.b;
}

TEST(GgufMalformed, TensorErrors) {
  // The valid baseline: f32 [8, 2] at offset 0 with its 64 bytes.
  ASSERT_TRUE(parse(one_tensor({8, 2}, 0, 0, 64)).ok());
  expect_format_error(one_tensor({8, 2}, 0, 0, 63),
                      {"tensor 'w': data offset 0 + size 64", "exceeds file size"});
  expect_format_error(one_tensor({8, 2}, 0, 1024, 64),
                      {"tensor 'w': data offset 1024 + size 64 (from file offset 96) exceeds file size 160"});
  expect_format_error(one_tensor({8, 2}, 0, 8, 128),
                      {"tensor 'w': offset 8 is not a multiple of the alignment 32"});
  expect_format_error(one_tensor({8, 2}, 0, ~0ull << 5, 64), {"tensor 'w'", "exceeds file size"});
  expect_format_error(
      one_tensor({1ull << 62, 1ull << 62}, 0, 0, 64),
      {"tensor 'w': element count of shape [4611686018427387904, 4611686018427387904] overflows"});
  expect_format_error(one_tensor({1ull << 62}, 0, 0, 64), {"tensor 'w': byte size", "overflows 64 bits"});
  expect_format_error(one_tensor({1ull << 40, 1ull << 20}, 0, 0, 64), {"tensor 'w'", "exceeds file size"});
  expect_format_error(one_tensor({8, 0}, 0, 0, 64), {"tensor 'w': dimension 1 is 0"});
  expect_format_error(one_tensor({~0ull}, 0, 0, 64), {"tensor 'w': dimension 0 is 18446744073709551615"});
  expect_format_error(one_tensor({8, 1, 1, 1, 1}, 0, 0, 64), {"tensor 'w': n_dims 5 is outside 1..4"});
  expect_format_error(one_tensor({}, 0, 0, 64), {"tensor 'w': n_dims 0 is outside 1..4"});
  expect_format_error(one_tensor({8, 2}, 99, 0, 64), {"tensor 'w': unknown ggml type id 99"});
  expect_format_error(one_tensor({32}, 4, 0, 64), {"tensor 'w': unknown ggml type id 4"});  // retired q4_2
  expect_format_error(one_tensor({33, 2}, 8, 0, 128),
                      {"tensor 'w': ne0 = 33 is not a multiple of q8_0's block size 32"});

  Bytes long_name;
  long_name.header(1, 0).str(std::string(65, 'n')).u32(1).u64(8).u32(0).u64(0).pad(32).data(32);
  expect_format_error(long_name.b, {"tensor #0: name length 65 exceeds the limit of 64"});
  Bytes huge_name;
  huge_name.header(1, 0).u64(1ull << 63).data(64);
  expect_format_error(huge_name.b, {"tensor #0: name length 9223372036854775808 exceeds the limit of 64"});
  Bytes dup;
  dup.header(2, 0).tensor("w", {8}, 0, 0).tensor("w", {8}, 0, 32).pad(32).data(64);
  expect_format_error(dup.b, {"tensor 'w': duplicate tensor name (tensors #0 and #1)"});
}

TEST(GgufMalformed, OverlappingTensorsAreRejected) {
  Bytes ok;
  ok.header(2, 0).tensor("a", {8}, 0, 0).tensor("b", {8}, 0, 32).pad(32).data(64);
  ASSERT_TRUE(parse(ok.b).ok());
  Bytes overlap;
  overlap.header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {8}, 0, 32).pad(32).data(64);
  expect_format_error(overlap.b, {"tensor 'b': data at offset 32 overlaps tensor 'a' (offset 0, size 64)"});
  Bytes same;
  same.header(2, 0).tensor("a", {8}, 0, 0).tensor("b", {8}, 0, 0).pad(32).data(32);
  expect_format_error(same.b, {"overlaps tensor"});
}

TEST_F(GgufFiles, OpenErrors) {
  Result<GgufFile> missing = GgufFile::open(path("missing.gguf"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::io_error);
  EXPECT_NE(missing.status().message().find("missing.gguf: cannot open"), std::string::npos);
  Result<GgufFile> dir = GgufFile::open(dir_.string());
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(dir.status().code(), StatusCode::io_error);

  std::ofstream(path("empty.gguf")).close();
  Result<GgufFile> empty = GgufFile::open(path("empty.gguf"));
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().message(),
            path("empty.gguf") + ": file is 0 bytes, too short for a GGUF header (24 bytes)");

  // A truncated file on disk: tensor data cut short.
  const std::vector<uint8_t> full = small_valid_file();
  ASSERT_GT(full.size(), 40u);
  std::ofstream(path("cut.gguf"), std::ios::binary)
      .write(reinterpret_cast<const char*>(full.data()), static_cast<std::streamsize>(full.size() - 40));
  Result<GgufFile> cut = GgufFile::open(path("cut.gguf"));
  ASSERT_FALSE(cut.ok());
  EXPECT_EQ(cut.status().message().rfind(path("cut.gguf") + ": tensor 'blk.0.attn_q.weight': data offset", 0),
            0u)
      << cut.status().message();
}

// ---- writer --------------------------------------------------------------------------------------

TEST_F(GgufFiles, WriterRejectsBadInput) {
  GgufWriter w;
  ASSERT_TRUE(w.add_u32("k", 1).ok());
  EXPECT_EQ(w.add_f32("k", 1.0f).message(), "gguf writer: duplicate key 'k'");
  EXPECT_FALSE(w.add_u32("", 1).ok());
  EXPECT_FALSE(w.add_u32("general.alignment", 3).ok());
  EXPECT_FALSE(w.add_u64("general.alignment", 32).ok());
  EXPECT_FALSE(w.add_value("v", GgufValue()).ok());
  EXPECT_EQ(w.kv_count(), 1u);
  EXPECT_EQ(w.alignment(), 32u);

  const std::vector<uint8_t> data = pattern_bytes(4096, 9);
  const std::vector<int64_t> ok{8}, five{1, 1, 1, 1, 1}, zero{8, 0}, odd{33}, none{};
  ASSERT_TRUE(w.add_tensor("t", DType::f32, ok, data.data()).ok());
  EXPECT_EQ(w.add_tensor("t", DType::f32, ok, data.data()).message(),
            "gguf writer: tensor 't': duplicate tensor name");
  EXPECT_EQ(w.add_tensor("u", DType::f32, five, data.data()).message(),
            "gguf writer: tensor 'u': 5 dimensions, expected 1..4");
  EXPECT_FALSE(w.add_tensor("u", DType::f32, none, data.data()).ok());
  EXPECT_EQ(w.add_tensor("u", DType::f32, zero, data.data()).message(),
            "gguf writer: tensor 'u': dimension 1 is 0");
  EXPECT_EQ(w.add_tensor("u", DType::q8_0, odd, data.data()).message(),
            "gguf writer: tensor 'u': ne0 = 33 is not a multiple of q8_0's block size 32");
  EXPECT_FALSE(w.add_tensor(std::string(65, 'x'), DType::f32, ok, data.data()).ok());
  EXPECT_FALSE(w.add_tensor("u", DType::f32, ok, static_cast<const void*>(nullptr)).ok());
  EXPECT_FALSE(w.add_tensor_ggml("u", 99, ok, data.data()).ok());
  EXPECT_EQ(w.tensor_count(), 1u);
}

TEST_F(GgufFiles, WriteIsAtomic) {
  const std::string target = path("m.gguf");
  std::ofstream(target) << "old contents";
  GgufWriter bad;
  const std::vector<int64_t> ne{16};
  ASSERT_TRUE(
      bad.add_tensor("t", DType::f32, ne,
                     [](std::span<uint8_t>) { return Status(StatusCode::aborted, "producer failed"); })
          .ok());
  Status s = bad.write(target);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "producer failed");
  std::ifstream in(target);
  std::string contents((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(contents, "old contents");  // untouched
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_)) ++entries;
  EXPECT_EQ(entries, 1u);  // no temporary left behind

  GgufWriter good;
  ASSERT_TRUE(good.add_string("general.name", "new").ok());
  ASSERT_TRUE(good.write(target).ok());
  Result<GgufFile> f = GgufFile::open(target);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(*f->get_string("general.name"), "new");

  Status no_dir = good.write(path("no/such/dir/m.gguf"));
  ASSERT_FALSE(no_dir.ok());
  EXPECT_EQ(no_dir.code(), StatusCode::io_error);
}

// ---- real files ----------------------------------------------------------------------------------

// tests/data/tokenizer: llama.cpp's vocabulary-only files (see tests/data/README.md).
fs::path tokenizer_dir() { return fs::path(__FILE__).parent_path().parent_path() / "data" / "tokenizer"; }

TEST(GgufRealFiles, VocabFilesParse) {
  const fs::path dir = tokenizer_dir();
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".gguf") files.push_back(e.path());
  ASSERT_FALSE(ec) << dir << ": " << ec.message();
  EXPECT_GE(files.size(), 6u) << "the vocabularies of tests/data/tokenizer";
  for (const fs::path& p : files) {
    SCOPED_TRACE(p.string());
    Result<GgufFile> r = GgufFile::open(p.string());
    ASSERT_TRUE(r.ok()) << r.status().message();
    const GgufFile& f = *r;
    EXPECT_TRUE(f.version() == 2 || f.version() == 3);
    EXPECT_TRUE(f.tensors().empty());
    Result<std::string_view> model = f.get_string("tokenizer.ggml.model");
    ASSERT_TRUE(model.ok()) << model.status().message();
    EXPECT_TRUE(*model == "llama" || *model == "gpt2" || *model == "bert") << *model;
    Result<std::vector<std::string_view>> tokens = f.get_string_array("tokenizer.ggml.tokens");
    ASSERT_TRUE(tokens.ok()) << tokens.status().message();
    EXPECT_GT(tokens->size(), 1000u);
    EXPECT_LT(tokens->size(), 1000000u);
    size_t non_empty = 0;
    for (std::string_view t : *tokens) non_empty += !t.empty();
    EXPECT_GT(non_empty, tokens->size() * 9 / 10);
    if (f.has("tokenizer.ggml.scores")) {
      EXPECT_EQ(f.get_f32_array("tokenizer.ggml.scores")->size(), tokens->size());
    }
    if (f.has("tokenizer.ggml.token_type")) {
      EXPECT_EQ(f.get_int_array("tokenizer.ggml.token_type")->size(), tokens->size());
    }
    if (f.has("tokenizer.ggml.bos_token_id")) {
      EXPECT_LT(*f.get_u32("tokenizer.ggml.bos_token_id"), tokens->size());
    }
    EXPECT_TRUE(f.get_string("general.architecture").ok());
    for (const GgufKV& kv : f.kvs()) EXPECT_FALSE(kv.value.format().empty());
  }
}

}  // namespace
}  // namespace loom
