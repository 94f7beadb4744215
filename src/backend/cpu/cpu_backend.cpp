// CPU backend: host buffers and whole-graph compute on a thread pool.
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

#include "cpu_ops.h"
#include "loom/cpu.h"

namespace loom {

namespace {

constexpr size_t kHostAlignment = 64;

class HostBuffer final : public Buffer {
 public:
  HostBuffer(BufferType& type, void* data, size_t size) : type_(type), data_(data), size_(size) {}
  ~HostBuffer() override { std::free(data_); }
  void* base() override { return data_; }
  size_t size() const override { return size_; }
  BufferType& type() const override { return type_; }
  Status write(size_t offset, const void* src, size_t n) override {
    if (offset + n > size_) return make_error(StatusCode::invalid_argument, "host buffer write past its end");
    std::memcpy(static_cast<uint8_t*>(data_) + offset, src, n);
    return {};
  }
  Status read(size_t offset, void* dst, size_t n) const override {
    if (offset + n > size_) return make_error(StatusCode::invalid_argument, "host buffer read past its end");
    std::memcpy(dst, static_cast<const uint8_t*>(data_) + offset, n);
    return {};
  }
  Status fill(size_t offset, uint8_t value, size_t n) override {
    if (offset + n > size_) return make_error(StatusCode::invalid_argument, "host buffer fill past its end");
    std::memset(static_cast<uint8_t*>(data_) + offset, value, n);
    return {};
  }

 private:
  BufferType& type_;
  void* data_;
  size_t size_;
};

class HostBufferType final : public BufferType {
 public:
  const char* name() const override { return "cpu"; }
  size_t alignment() const override { return kHostAlignment; }
  bool is_host() const override { return true; }
  Result<std::unique_ptr<Buffer>> allocate(size_t size) override {
    const size_t rounded = (std::max<size_t>(size, 1) + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
    void* p = std::aligned_alloc(kHostAlignment, rounded);
    if (!p) return make_error(StatusCode::out_of_memory, "cpu: cannot allocate {} bytes of host memory", size);
    return std::unique_ptr<Buffer>(new HostBuffer(*this, p, size));
  }
};

class CpuBackend final : public Backend {
 public:
  CpuBackend(int n_threads, Numerics numerics) : pool_(n_threads), numerics_(numerics) {}
  const char* name() const override { return "cpu"; }
  // Both modes run the same kernels: the CPU backend is the reference, exact in either mode.
  Numerics numerics() const override { return numerics_; }
  BufferType& buffer_type() override { return cpu_buffer_type(); }
  bool supports_op(const Tensor& node) const override { return cpu::supports(node); }

  Status compute(const Graph& g) override {
    if (!g.status().ok()) return g.status();
    const auto& nodes = g.nodes();
    size_t work = 0;
    for (const Tensor* t : nodes) {
      if (!cpu::supports(*t))
        return make_error(StatusCode::unsupported, "cpu: no kernel for {} of {}", op_name(t->op), describe(*t));
      if (!t->data || !t->buffer || !t->buffer->type().is_host())
        return make_error(StatusCode::invalid_argument, "cpu: tensor {} is not in host memory", describe(*t));
      for (const Tensor* s : t->src)
        if (s && (!s->data || !s->buffer || !s->buffer->type().is_host()))
          return make_error(StatusCode::invalid_argument, "cpu: operand {} of {} is not in host memory",
                            describe(*s), op_name(t->op));
      work = std::max(work, cpu::work_size(*t, pool_.size()));
    }
    if (work > work_.size()) {
      try {
        work_.resize(work);
      } catch (const std::bad_alloc&) {
        return make_error(StatusCode::out_of_memory, "cpu: cannot allocate {} bytes of scratch", work);
      }
    }
    pool_.run([&](int ith) {
      cpu::KernelContext ctx;
      ctx.ith = ith;
      ctx.nth = pool_.size();
      ctx.work = work_.data();
      ctx.work_size = work_.size();
      ctx.pool = &pool_;
      for (Tensor* t : nodes) {
        if (t->op == OpKind::view) continue;
        cpu::compute_node(ctx, t);
        pool_.barrier();
      }
    });
    return {};
  }

 private:
  cpu::ThreadPool pool_;
  Numerics numerics_;
  std::vector<uint8_t> work_;
};

int default_threads() {
  unsigned n = std::thread::hardware_concurrency();
  return n ? static_cast<int>(n) : 1;
}

}  // namespace

BufferType& cpu_buffer_type() {
  static HostBufferType type;
  return type;
}

std::unique_ptr<Backend> make_cpu_backend(int n_threads, Numerics numerics) {
  return std::make_unique<CpuBackend>(n_threads > 0 ? n_threads : default_threads(), numerics);
}

void register_cpu_backend() {
  register_backend("cpu", [](const BackendOptions& o) -> Result<std::unique_ptr<Backend>> {
    auto numerics = resolve_numerics(o.numerics, Numerics::exact);
    if (!numerics) return numerics.status();
    return make_cpu_backend(o.n_threads, *numerics);
  });
}

}  // namespace loom
