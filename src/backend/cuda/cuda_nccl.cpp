// NCCL loaded at run time (cuda_nccl.h).
#include "cuda_nccl.h"

#include "cuda_error.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <mutex>
#include <string>

namespace loom::cuda {

namespace {

// The NCCL entry points Loom calls.
struct NcclApi {
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclCommInitAll) comm_init_all = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  std::string error;  // why it could not be loaded; empty when loaded
};

const NcclApi& nccl() {
  static NcclApi api;
  static std::once_flag once;
  std::call_once(once, [] {
    // Every connection made when the communicators are: a collective recorded into a CUDA graph
    // cannot set one up (NCCL's lazy connection fails inside a stream capture).
    setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
    void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* why = dlerror();
      api.error = fmt::format("NCCL is needed for several GPUs but libnccl.so.2 cannot be loaded ({}); install "
                              "NCCL (Debian: libnccl2) or add its directory to LD_LIBRARY_PATH",
                              why ? why : "not found");
      return;
    }
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (!fn && api.error.empty()) api.error = fmt::format("libnccl.so.2 has no {}", name);
    };
    sym(api.get_version, "ncclGetVersion");
    sym(api.comm_init_all, "ncclCommInitAll");
    sym(api.comm_destroy, "ncclCommDestroy");
    sym(api.all_reduce, "ncclAllReduce");
    sym(api.error_string, "ncclGetErrorString");
    sym(api.group_start, "ncclGroupStart");
    sym(api.group_end, "ncclGroupEnd");
  });
  return api;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}
  ~NcclCommunicator() override {
    if (comm_) (void)nccl().comm_destroy(comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* kind() const override { return "nccl"; }
  void* native() override { return comm_; }

 private:
  ncclComm_t comm_;
  const int rank_, size_;
};

}  // namespace

Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_communicators(std::span<const int> devices) {
  const NcclApi& api = nccl();
  if (!api.error.empty()) return make_error(StatusCode::unsupported, "{}", api.error);
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  const ncclResult_t r = api.comm_init_all(comms.data(), static_cast<int>(devices.size()), devices.data());
  if (r != ncclSuccess)
    return make_error(StatusCode::device_error, "ncclCommInitAll over {} GPUs: {}", devices.size(),
                      api.error_string(r));
  // One small all-reduce on every rank, outside any capture, so whatever NCCL sets up on first use
  // (buffers, channels) exists before the first pass is recorded into a graph.
  auto destroy_all = [&] {
    for (ncclComm_t c : comms) (void)api.comm_destroy(c);
  };
  std::vector<float*> bufs(devices.size(), nullptr);
  std::vector<cudaStream_t> streams(devices.size(), nullptr);
  cudaError_t ce = cudaSuccess;
  for (size_t i = 0; i < devices.size() && ce == cudaSuccess; ++i) {
    ce = cudaSetDevice(devices[i]);
    if (ce == cudaSuccess) ce = cudaMalloc(&bufs[i], 256 * sizeof(float));
    if (ce == cudaSuccess) ce = cudaMemset(bufs[i], 0, 256 * sizeof(float));
    if (ce == cudaSuccess) ce = cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking);
  }
  ncclResult_t wr = ncclSuccess;
  if (ce == cudaSuccess) {
    wr = api.group_start();
    for (size_t i = 0; i < devices.size() && wr == ncclSuccess; ++i)
      wr = api.all_reduce(bufs[i], bufs[i], 256, ncclFloat32, ncclSum, comms[i], streams[i]);
    const ncclResult_t end = api.group_end();
    if (wr == ncclSuccess) wr = end;
  }
  for (size_t i = 0; i < devices.size(); ++i) {
    if (!streams[i]) continue;
    (void)cudaSetDevice(devices[i]);
    if (ce == cudaSuccess && wr == ncclSuccess) ce = cudaStreamSynchronize(streams[i]);
    (void)cudaStreamDestroy(streams[i]);
  }
  for (size_t i = 0; i < devices.size(); ++i)
    if (bufs[i]) {
      (void)cudaSetDevice(devices[i]);
      (void)cudaFree(bufs[i]);
    }
  if (ce != cudaSuccess || wr != ncclSuccess) {
    (void)cudaGetLastError();
    destroy_all();
    return make_error(StatusCode::device_error, "first all-reduce over {} GPUs: {}", devices.size(),
                      ce != cudaSuccess ? cudaGetErrorString(ce) : api.error_string(wr));
  }
  std::vector<std::unique_ptr<Communicator>> out;
  for (size_t i = 0; i < comms.size(); ++i)
    out.push_back(std::make_unique<NcclCommunicator>(comms[i], static_cast<int>(i), static_cast<int>(comms.size())));
  return out;
}

CudaError nccl_all_reduce(Communicator& comm, const float* src, float* dst, size_t n, cudaStream_t stream) {
  const NcclApi& api = nccl();
  if (std::string_view(comm.kind()) != "nccl" || !api.all_reduce)
    return CudaError::runtime(cudaErrorInvalidValue, "all_reduce: not an NCCL communicator", __FILE__, __LINE__);
  const ncclResult_t r =
      api.all_reduce(src, dst, n, ncclFloat32, ncclSum, static_cast<ncclComm_t>(comm.native()), stream);
  if (r != ncclSuccess)
    return CudaError::runtime(cudaErrorUnknown, api.error_string(r), __FILE__, __LINE__);  // NCCL's static text
  return {};
}

}  // namespace loom::cuda
