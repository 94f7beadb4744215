// Backend registry and tensor data helpers.
#include "loom/backend.h"

#include <cstdlib>
#include <dlfcn.h>
#include <unistd.h>

#include <map>
#include <mutex>

namespace loom {

namespace {

struct Registry {
  // Recursive: a backend library loaded under the lock registers itself through register_backend.
  std::recursive_mutex mutex;
  std::map<std::string, BackendFactory, std::less<>> factories;
  bool dynamic_loaded = false;
  std::string load_error;  // why a backend library that exists failed to load
};

Registry& registry() {
  static Registry r;
  return r;
}

// Backend libraries are shared objects loaded at run time, so a binary built with CUDA still runs
// on a machine without a GPU driver. Each exports `loom_backend_register`, which receives this
// program's register_backend: the library links its own copy of loom_core, whose registry is not
// this one, so it must register through the pointer (no reliance on symbol interposition).
// Looked up next to the running program first, then on the loader's path.
using RegisterBackendFn = void (*)(std::string, BackendFactory);
using LibraryRegisterFn = void (*)(RegisterBackendFn);

void load_dynamic_backends(Registry& r) {
  if (r.dynamic_loaded) return;
  r.dynamic_loaded = true;
  std::vector<std::string> candidates;
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    std::string dir(exe, static_cast<size_t>(n));
    dir = dir.substr(0, dir.find_last_of('/') + 1);
    candidates.push_back(dir + "libloom_cuda.so");
    candidates.push_back(dir + "../lib/libloom_cuda.so");
  }
  candidates.push_back("libloom_cuda.so");
  for (const std::string& path : candidates) {
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* err = dlerror();
      if (err && access(path.c_str(), F_OK) == 0) r.load_error = err;  // e.g. a CUDA library missing
      continue;
    }
    auto fn = reinterpret_cast<LibraryRegisterFn>(dlsym(handle, "loom_backend_register"));
    if (fn) fn(&register_backend);
    break;
  }
}

}  // namespace

void register_backend(std::string name, BackendFactory factory) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.factories[std::move(name)] = std::move(factory);
}

std::vector<std::string> backend_names() {
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  load_dynamic_backends(r);
  std::vector<std::string> names;
  for (auto& [name, f] : r.factories) names.push_back(name);
  return names;
}

const char* numerics_name(Numerics n) { return n == Numerics::fast ? "fast" : "exact"; }

Result<Numerics> parse_numerics(std::string_view text, std::string_view what) {
  if (text == "exact") return Numerics::exact;
  if (text == "fast") return Numerics::fast;
  return make_error(StatusCode::invalid_argument, "{}: '{}' is not a numerics mode (exact, fast)", what, text);
}

Result<Numerics> resolve_numerics(std::optional<Numerics> requested, Numerics backend_default) {
  if (requested) return *requested;
  if (const char* env = std::getenv("LOOM_NUMERICS"); env && *env) return parse_numerics(env, "LOOM_NUMERICS");
  return backend_default;
}

bool deterministic_from_env() {
  const char* v = std::getenv("LOOM_DETERMINISTIC");
  return v && *v && std::string_view(v) != "0";
}

bool env_switch(const char* name) {
  const char* v = std::getenv(name);
  return !(v && std::string_view(v) == "0");
}

int64_t env_int(const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  return end && *end == '\0' && n >= lo && n <= hi ? static_cast<int64_t>(n) : fallback;
}

Result<std::unique_ptr<Backend>> create_backend(std::string_view name, const BackendOptions& options) {
  Registry& r = registry();
  BackendFactory factory;
  {
    std::unique_lock lock(r.mutex);
    auto it = r.factories.find(name);
    if (it == r.factories.end()) {
      load_dynamic_backends(r);
      it = r.factories.find(name);
    }
    if (it == r.factories.end()) {
      std::string known;
      for (auto& [n, f] : r.factories) known += (known.empty() ? "" : ", ") + n;
      return make_error(StatusCode::unsupported, "backend '{}' is not available (available: {}){}", name, known,
                        r.load_error.empty() ? std::string() : "; " + r.load_error);
    }
    factory = it->second;
  }
  return factory(options);
}

// ---- tensor data ----------------------------------------------------------------------------------

namespace {
Status check_range(const Tensor* t, size_t offset, size_t n, const char* what) {
  if (!t) return make_error(StatusCode::invalid_argument, "{}: null tensor", what);
  if (!t->buffer || !t->data)
    return make_error(StatusCode::invalid_argument, "{}: tensor {} has no memory", what, describe(*t));
  if (offset + n > t->nbytes() || offset + n < offset)
    return make_error(StatusCode::invalid_argument, "{}: tensor {}: range [{}, {}) exceeds its {} bytes", what,
                      describe(*t), offset, offset + n, t->nbytes());
  return {};
}
size_t buffer_offset(const Tensor* t) {
  return static_cast<size_t>(static_cast<uint8_t*>(t->data) - static_cast<uint8_t*>(t->buffer->base()));
}
}  // namespace

Status tensor_write(Tensor* t, const void* src, size_t offset, size_t n) {
  LOOM_TRY(check_range(t, offset, n, "tensor_write"));
  return t->buffer->write(buffer_offset(t) + offset, src, n);
}

Status tensor_read(const Tensor* t, void* dst, size_t offset, size_t n) {
  LOOM_TRY(check_range(t, offset, n, "tensor_read"));
  return t->buffer->read(buffer_offset(t) + offset, dst, n);
}

Status Buffer::read_rows(size_t offset, size_t src_pitch, void* dst, size_t dst_pitch, size_t width,
                         size_t height) const {
  for (size_t r = 0; r < height; ++r) LOOM_TRY(read(offset + r * src_pitch, static_cast<char*>(dst) + r * dst_pitch, width));
  return {};
}

Status tensor_read_rows(const Tensor* t, void* dst, size_t dst_pitch) {
  LOOM_TRY(check_range(t, 0, 0, "tensor_read_rows"));
  const size_t width = static_cast<size_t>(t->ne[0]) * dtype_type_size(t->type) / static_cast<size_t>(dtype_block_size(t->type));
  const auto rows = static_cast<size_t>(t->ne[1] * t->ne[2] * t->ne[3]);
  if (t->nb[0] != dtype_type_size(t->type) || t->nb[1] < width || t->nb[2] != t->nb[1] * static_cast<size_t>(t->ne[1]) ||
      t->nb[3] != t->nb[2] * static_cast<size_t>(t->ne[2]) || dst_pitch < width)
    return make_error(StatusCode::invalid_argument,
                      "tensor_read_rows: tensor {}: rows not packed, or a pitch of {} bytes below its {} a row",
                      describe(*t), dst_pitch, width);
  if (rows == 0 || width == 0) return {};
  LOOM_TRY(check_range(t, 0, (rows - 1) * t->nb[1] + width, "tensor_read_rows"));
  return t->buffer->read_rows(buffer_offset(t), t->nb[1], dst, dst_pitch, width, rows);
}

Result<std::vector<float>> tensor_to_floats(const Tensor* t) {
  if (!t) return make_error(StatusCode::invalid_argument, "tensor_to_floats: null tensor");
  std::vector<uint8_t> bytes(t->nbytes());
  LOOM_TRY(tensor_read(t, bytes.data(), 0, bytes.size()));
  std::vector<float> out(static_cast<size_t>(t->nelements()));
  const int64_t n0 = t->ne[0];
  const int64_t bs = dtype_block_size(t->type);
  std::vector<uint8_t> row(t->row_size());
  size_t k = 0;
  for (int64_t i3 = 0; i3 < t->ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < t->ne[2]; ++i2)
      for (int64_t i1 = 0; i1 < t->ne[1]; ++i1) {
        const uint8_t* base = bytes.data() + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
        if (t->rows_contiguous()) {
          dequantize_row(t->type, base, out.data() + k, n0);
        } else {
          const size_t ts = dtype_type_size(t->type);
          for (int64_t i0 = 0; i0 < n0 / bs; ++i0) std::memcpy(row.data() + i0 * ts, base + i0 * t->nb[0], ts);
          dequantize_row(t->type, row.data(), out.data() + k, n0);
        }
        k += static_cast<size_t>(n0);
      }
  return out;
}

Status tensor_from_floats(Tensor* t, const float* values, int64_t n) {
  if (!t) return make_error(StatusCode::invalid_argument, "tensor_from_floats: null tensor");
  if (n != t->nelements())
    return make_error(StatusCode::shape_mismatch, "tensor_from_floats: tensor {} has {} elements, got {}",
                      describe(*t), t->nelements(), n);
  std::vector<uint8_t> bytes(t->nbytes());
  if (!t->is_contiguous()) LOOM_TRY(tensor_read(t, bytes.data(), 0, bytes.size()));  // keep the gaps
  const int64_t n0 = t->ne[0];
  const int64_t bs = dtype_block_size(t->type);
  const size_t ts = dtype_type_size(t->type);
  std::vector<uint8_t> row(t->row_size());
  size_t k = 0;
  for (int64_t i3 = 0; i3 < t->ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < t->ne[2]; ++i2)
      for (int64_t i1 = 0; i1 < t->ne[1]; ++i1) {
        uint8_t* base = bytes.data() + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
        quantize_row(t->type, values + k, row.data(), n0);
        for (int64_t i0 = 0; i0 < n0 / bs; ++i0) std::memcpy(base + i0 * t->nb[0], row.data() + i0 * ts, ts);
        k += static_cast<size_t>(n0);
      }
  return tensor_write(t, bytes.data(), 0, bytes.size());
}

Status tensor_bind(Tensor* t, Buffer* buffer, size_t offset) {
  if (!t || !buffer) return make_error(StatusCode::invalid_argument, "tensor_bind: null tensor or buffer");
  if (offset + t->nbytes() > buffer->size())
    return make_error(StatusCode::invalid_argument, "tensor_bind: tensor {} ({} bytes) at offset {} exceeds buffer of {} bytes",
                      describe(*t), t->nbytes(), offset, buffer->size());
  t->buffer = buffer;
  t->data = static_cast<uint8_t*>(buffer->base()) + offset;
  return {};
}

}  // namespace loom
