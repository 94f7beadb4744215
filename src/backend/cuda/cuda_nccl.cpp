// NCCL loaded at run time (cuda_nccl.h).
#include "cuda_nccl.h"

#include "cuda_error.h"
#include "kernels/allreduce.cuh"
#include "loom/backend.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>

namespace loom::cuda {

namespace {

// The NCCL entry points Loom calls.
struct NcclApi {
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclCommInitAll) comm_init_all = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
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
      api.error = fmt::format(
          "NCCL is needed for several GPUs but libnccl.so.2 cannot be loaded ({}); install "
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
    sym(api.comm_abort, "ncclCommAbort");
    sym(api.all_reduce, "ncclAllReduce");
    sym(api.error_string, "ncclGetErrorString");
    sym(api.group_start, "ncclGroupStart");
    sym(api.group_end, "ncclGroupEnd");
  });
  return api;
}

// One rank's buffers of the LL all-reduces (kernels/allreduce.cuh), on its device.
struct LLBuffers {
  int device = -1;
  uint64_t* recv = nullptr;
  uint32_t* epoch = nullptr;
  ~LLBuffers() {
    if (device < 0) return;
    (void)cudaSetDevice(device);
    for (void* p : {static_cast<void*>(recv), static_cast<void*>(epoch)})
      if (p) (void)cudaFree(p);
  }
};

// What the ranks of one group share: their communicators, for an abort that reaches them all.
struct NcclGroup {
  std::mutex mutex;
  std::vector<ncclComm_t> comms;
  bool aborted = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, std::shared_ptr<NcclGroup> group)
      : comm_(comm), rank_(rank), size_(size), group_(std::move(group)) {}
  // Not under the group's lock: the ranks' destroys may wait for each other (ModelImpl destroys them
  // on a thread each).
  ~NcclCommunicator() override {
    if (comm_ && !aborted()) (void)nccl().comm_destroy(comm_);  // an abort freed them all
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* kind() const override { return "nccl"; }
  void* native() override { return comm_; }
  // A rank that failed before its collectives: every rank's communicator is aborted, which ends the
  // collectives the others wait in (ncclCommAbort); the group is unusable afterwards.
  void abort() override {
    std::lock_guard lock(group_->mutex);
    if (group_->aborted) return;
    group_->aborted = true;
    for (ncclComm_t c : group_->comms) (void)nccl().comm_abort(c);
  }
  bool aborted() {
    std::lock_guard lock(group_->mutex);
    return group_->aborted;
  }

  // The LL path, when the group set it up (peer access between every pair of GPUs).
  std::unique_ptr<LLBuffers> ll_buffers;
  LLGroup ll;
  bool ll_standalone = false;  // small stand-alone all-reduces by the LL kernel too (LOOM_TP_ALLREDUCE=nccl: not)

 private:
  ncclComm_t comm_;
  const int rank_, size_;
  std::shared_ptr<NcclGroup> group_;
};

// Peer access between every pair of devices and each rank's LL buffers; false (nothing set up) when
// a pair cannot reach each other or an allocation fails.
bool setup_ll(std::span<const int> devices, std::vector<std::unique_ptr<Communicator>>& comms) {
  const int n = static_cast<int>(devices.size());
  if (n > kLLMaxRanks) return false;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      if (i == j) continue;
      int ok = 0;
      if (cudaDeviceCanAccessPeer(&ok, devices[i], devices[j]) != cudaSuccess || !ok) return false;
      if (cudaSetDevice(devices[i]) != cudaSuccess) return false;
      const cudaError_t e = cudaDeviceEnablePeerAccess(devices[j], 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) return false;
      (void)cudaGetLastError();
    }
  std::vector<std::unique_ptr<LLBuffers>> bufs;
  for (int i = 0; i < n; ++i) {
    auto b = std::make_unique<LLBuffers>();
    b->device = devices[i];
    if (cudaSetDevice(devices[i]) != cudaSuccess) return false;
    if (cudaMalloc(&b->recv, ll_recv_bytes(n)) != cudaSuccess || cudaMalloc(&b->epoch, ll_epoch_bytes()) != cudaSuccess ||
        cudaMemset(b->recv, 0, ll_recv_bytes(n)) != cudaSuccess ||
        cudaMemset(b->epoch, 0, ll_epoch_bytes()) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    bufs.push_back(std::move(b));
  }
  const char* mode = std::getenv("LOOM_TP_ALLREDUCE");
  for (int i = 0; i < n; ++i) {
    auto& c = static_cast<NcclCommunicator&>(*comms[static_cast<size_t>(i)]);
    LLGroup& g = c.ll;
    g.rank = i;
    g.n_ranks = n;
    for (int q = 0; q < n; ++q) g.recv[q] = bufs[static_cast<size_t>(q)]->recv;
    g.epoch = bufs[static_cast<size_t>(i)]->epoch;
    c.ll_standalone = !(mode && std::string_view(mode) == "nccl");
  }
  for (int i = 0; i < n; ++i)
    static_cast<NcclCommunicator&>(*comms[static_cast<size_t>(i)]).ll_buffers = std::move(bufs[static_cast<size_t>(i)]);
  return true;
}

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
  auto group = std::make_shared<NcclGroup>();
  group->comms = comms;
  std::vector<std::unique_ptr<Communicator>> out;
  for (size_t i = 0; i < comms.size(); ++i)
    out.push_back(
        std::make_unique<NcclCommunicator>(comms[i], static_cast<int>(i), static_cast<int>(comms.size()), group));
  // The LL buffers over peer access (LOOM_TP_LL=0: none): the fused all-reduce + add + norm of decode
  // steps, and the other all-reduces of up to kLLAllReduceMaxElems floats (LOOM_TP_ALLREDUCE=nccl: those
  // by NCCL); NCCL for larger ones (prefill). 2x H100, 8B Q4_K_M tg128 at -tp 2: NCCL alone 369 t/s,
  // fused 416, fused + stand-alone LL 418 (the embeddings' all-reduce 49 -> 7 us).
  if (env_switch("LOOM_TP_LL"))
    if (!setup_ll(devices, out))
      fmt::print(stderr, "loom: no peer access between the GPUs: every all-reduce goes through NCCL\n");
  return out;
}

CudaError nccl_all_reduce(Communicator& comm, const float* src, float* dst, size_t n, cudaStream_t stream) {
  const NcclApi& api = nccl();
  if (std::string_view(comm.kind()) != "nccl" || !api.all_reduce)
    return CudaError::runtime(cudaErrorInvalidValue, "all_reduce: not an NCCL communicator", __FILE__,
                              __LINE__);
  auto& nc = static_cast<NcclCommunicator&>(comm);  // kind "nccl": made by make_nccl_communicators
  if (nc.aborted())
    return CudaError::runtime(cudaErrorUnknown, "all_reduce: the NCCL group was aborted after a rank failed",
                              __FILE__, __LINE__);
  if (nc.ll_standalone && static_cast<int64_t>(n) <= kLLAllReduceMaxElems && n % 4 == 0 &&
      reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0)
    return launch_ll_all_reduce(nc.ll, src, dst, static_cast<int64_t>(n), stream);
  const ncclResult_t r =
      api.all_reduce(src, dst, n, ncclFloat32, ncclSum, static_cast<ncclComm_t>(comm.native()), stream);
  if (r != ncclSuccess)
    return CudaError::runtime(cudaErrorUnknown, api.error_string(r), __FILE__,
                              __LINE__);  // NCCL's static text
  return {};
}

const LLGroup* ll_group(Communicator& comm) {
  if (std::string_view(comm.kind()) != "nccl") return nullptr;
  auto& nc = static_cast<NcclCommunicator&>(comm);
  return nc.ll_buffers && !nc.aborted() ? &nc.ll : nullptr;
}

}  // namespace loom::cuda
