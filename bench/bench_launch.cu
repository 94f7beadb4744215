// Launch overhead of a chain of tiny dependent kernels: what the graph executor saves per kernel.
//
//   bench_launch [--n 1000] [--reps 20] [--warmup 3] [--threads 32] [--device 0] [--json]
//
// Each kernel adds 1 to every element of a small int buffer, so kernel i reads what kernel i-1
// wrote: after the chain the buffer must equal N in every element, which checks that the ordering
// held (a lost dependency shows as a smaller value). Modes:
//   stream            per-kernel <<<>>> launches on one stream
//   stream+pdl        cudaLaunchKernelEx with programmatic stream serialization, not captured
//   graph             the plain chain captured into a CUDA graph, replayed
//   graph+pdl         the PDL chain captured and replayed; kernels wait (griddepcontrol.wait) at
//                     their start and trigger their dependents implicitly, at exit
//   graph+pdl+trigger as graph+pdl, and each kernel triggers its dependent right after its wait
//                     (griddepcontrol.launch_dependents), so the next kernel's launch overlaps
// Reported: GPU µs per kernel (median and min of the repetitions, between events around the
// chain), host µs per launch call (per kernel for stream modes, per graph launch for graph modes)
// and the graph's capture + instantiate time.
//
// Exit status: 0 ok, 1 a CUDA error or a wrong result, 2 bad arguments, 77 no usable GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define BENCH_NAME "bench_launch"
#include "bench_cuda.h"

namespace {

__global__ void add_one(int* buf) { buf[blockIdx.x * blockDim.x + threadIdx.x] += 1; }

// The PDL variant. griddepcontrol.wait blocks until every grid this one programmatically depends on
// has completed and its memory is visible; without such a dependency it returns at once. The
// instructions exist from sm_90; older targets compile the plain kernel (PDL modes are skipped
// there at run time).
template <bool kEarlyTrigger>
__global__ void add_one_pdl(int* buf) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (kEarlyTrigger) asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
  buf[blockIdx.x * blockDim.x + threadIdx.x] += 1;
}

enum class Mode { stream, stream_pdl, graph, graph_pdl, graph_pdl_trigger };

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::stream:
      return "stream";
    case Mode::stream_pdl:
      return "stream+pdl";
    case Mode::graph:
      return "graph";
    case Mode::graph_pdl:
      return "graph+pdl";
    case Mode::graph_pdl_trigger:
      return "graph+pdl+trigger";
  }
  return "?";
}
bool uses_pdl(Mode m) {
  return m == Mode::stream_pdl || m == Mode::graph_pdl || m == Mode::graph_pdl_trigger;
}
bool uses_graph(Mode m) { return m == Mode::graph || m == Mode::graph_pdl || m == Mode::graph_pdl_trigger; }

struct Options {
  int n = 1000;
  int reps = 20;
  int warmup = 3;
  int threads = 32;
  int device = 0;
  bool json = false;
};

struct Result {
  Mode mode = Mode::stream;
  bool ran = false;
  bool ok = true;
  int bad_value = 0;         ///< first wrong element seen (when !ok)
  double us_per_kernel = 0;  ///< median over repetitions
  double us_per_kernel_min = 0;
  double host_us_per_call = 0;  ///< median
  double build_ms = 0;          ///< capture + instantiate (graph modes)
};

// RAII owners of the CUDA objects (errors on destruction are ignored: the process is ending or
// an error has already been reported).
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s); }
};
struct Event {
  cudaEvent_t e = nullptr;
  Event() { CHECK_CUDA(cudaEventCreate(&e)); }
  ~Event() { cudaEventDestroy(e); }
};
struct DeviceInts {
  int* p = nullptr;
  explicit DeviceInts(size_t n) { CHECK_CUDA(cudaMalloc(&p, n * sizeof(int))); }
  ~DeviceInts() { cudaFree(p); }
};
struct GraphExec {
  cudaGraphExec_t g = nullptr;
  ~GraphExec() {
    if (g) cudaGraphExecDestroy(g);
  }
};

// Enqueues the chain of `n` kernels on `stream` (launch calls only).
void enqueue_chain(Mode mode, const Options& o, cudaStream_t stream, int* buf) {
  if (!uses_pdl(mode)) {
    for (int i = 0; i < o.n; ++i) add_one<<<1, o.threads, 0, stream>>>(buf);
    CHECK_CUDA(cudaGetLastError());
    return;
  }
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(1);
  cfg.blockDim = dim3(static_cast<unsigned>(o.threads));
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  auto kernel = mode == Mode::graph_pdl_trigger ? add_one_pdl<true> : add_one_pdl<false>;
  for (int i = 0; i < o.n; ++i) {
    // The first kernel follows a memset or nothing: an ordinary dependency.
    cfg.attrs = i == 0 ? nullptr : &attr;
    cfg.numAttrs = i == 0 ? 0 : 1;
    CHECK_CUDA(cudaLaunchKernelEx(&cfg, kernel, buf));
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

Result run_mode(Mode mode, const Options& o, cudaStream_t stream, int* buf) {
  Result r;
  r.mode = mode;
  r.ran = true;
  using clock = std::chrono::steady_clock;
  GraphExec exec;
  if (uses_graph(mode)) {
    const auto t0 = clock::now();
    cudaGraph_t graph = nullptr;
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    enqueue_chain(mode, o, stream, buf);
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    const cudaError_t inst = cudaGraphInstantiate(&exec.g, graph, 0);
    cudaGraphDestroy(graph);
    if (inst != cudaSuccess) cuda_fail(inst, "cudaGraphInstantiate", __LINE__);
    r.build_ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
  }
  Event start, stop;
  std::vector<double> gpu_us, host_us;
  std::vector<int> host(static_cast<size_t>(o.threads));
  for (int rep = 0; rep < o.warmup + o.reps; ++rep) {
    CHECK_CUDA(cudaMemsetAsync(buf, 0, host.size() * sizeof(int), stream));
    CHECK_CUDA(cudaEventRecord(start.e, stream));
    const auto t0 = clock::now();
    if (exec.g)
      CHECK_CUDA(cudaGraphLaunch(exec.g, stream));
    else
      enqueue_chain(mode, o, stream, buf);
    const double host_call_us = std::chrono::duration<double, std::micro>(clock::now() - t0).count() /
                                (exec.g ? 1.0 : static_cast<double>(o.n));
    CHECK_CUDA(cudaEventRecord(stop.e, stream));
    CHECK_CUDA(cudaEventSynchronize(stop.e));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start.e, stop.e));
    // Every repetition, warm-up included, must leave N in every element.
    CHECK_CUDA(cudaMemcpy(host.data(), buf, host.size() * sizeof(int), cudaMemcpyDeviceToHost));
    for (int v : host)
      if (v != o.n && r.ok) {
        r.ok = false;
        r.bad_value = v;
      }
    if (rep < o.warmup) continue;
    gpu_us.push_back(ms * 1000.0 / o.n);
    host_us.push_back(host_call_us);
  }
  r.us_per_kernel = median(gpu_us);
  r.us_per_kernel_min = *std::min_element(gpu_us.begin(), gpu_us.end());
  r.host_us_per_call = median(host_us);
  return r;
}

bool parse_int(const char* s, int lo, int hi, int& out) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (!end || *end != '\0' || v < lo || v > hi) return false;
  out = static_cast<int>(v);
  return true;
}

int usage(const char* msg) {
  std::fprintf(stderr,
               "bench_launch: %s\nusage: bench_launch [--n N (1000)] [--reps R (20)] [--warmup W (3)] "
               "[--threads T (32, 1..1024)] [--device D (0)] [--json]\n",
               msg);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](int lo, int hi, int& out) { return i + 1 < argc && parse_int(argv[++i], lo, hi, out); };
    if (a == "--json") {
      o.json = true;
    } else if (a == "--n") {
      if (!value(1, 1 << 20, o.n)) return usage("--n takes an integer in 1..1048576");
    } else if (a == "--reps") {
      if (!value(1, 100000, o.reps)) return usage("--reps takes an integer in 1..100000");
    } else if (a == "--warmup") {
      if (!value(0, 100000, o.warmup)) return usage("--warmup takes an integer in 0..100000");
    } else if (a == "--threads") {
      if (!value(1, 1024, o.threads)) return usage("--threads takes an integer in 1..1024");
    } else if (a == "--device") {
      if (!value(0, 1024, o.device)) return usage("--device takes a device ordinal");
    } else if (a == "-h" || a == "--help") {
      usage("launch overhead of a chain of dependent kernels");
      return 0;
    } else {
      return usage(("unknown argument '" + a + "'").c_str());
    }
  }

  int n_devices = 0;
  if (const cudaError_t err = cudaGetDeviceCount(&n_devices); err != cudaSuccess || n_devices == 0) {
    std::fprintf(stderr, "bench_launch: no usable CUDA GPU (%s); nothing to measure\n",
                 err != cudaSuccess ? cudaGetErrorString(err) : "no devices");
    return 77;
  }
  if (o.device >= n_devices) {
    std::fprintf(stderr, "bench_launch: --device %d, but there are %d devices\n", o.device, n_devices);
    return 2;
  }
  CHECK_CUDA(cudaSetDevice(o.device));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, o.device));
  const bool pdl_ok = prop.major >= 9;  // griddepcontrol is sm_90+

  Stream stream;
  DeviceInts buf(static_cast<size_t>(o.threads));
  std::vector<Result> results;
  for (Mode m : {Mode::stream, Mode::stream_pdl, Mode::graph, Mode::graph_pdl, Mode::graph_pdl_trigger}) {
    if (uses_pdl(m) && !pdl_ok) {
      Result r;
      r.mode = m;
      results.push_back(r);
      continue;
    }
    results.push_back(run_mode(m, o, stream.s, buf.p));
  }

  bool all_ok = true;
  for (const auto& r : results) all_ok = all_ok && r.ok;
  if (o.json) {
    std::printf(
        "{\"device\": \"%s\", \"sm\": %d, \"n\": %d, \"threads\": %d, \"reps\": %d, \"warmup\": %d, "
        "\"results\": [",
        prop.name, prop.major * 10 + prop.minor, o.n, o.threads, o.reps, o.warmup);
    bool first = true;
    for (const auto& r : results) {
      if (!r.ran) continue;
      std::printf(
          "%s\n  {\"mode\": \"%s\", \"us_per_kernel\": %.4f, \"us_per_kernel_min\": %.4f, "
          "\"host_us_per_call\": %.4f, \"build_ms\": %.3f, \"ok\": %s}",
          first ? "" : ",", mode_name(r.mode), r.us_per_kernel, r.us_per_kernel_min, r.host_us_per_call,
          r.build_ms, r.ok ? "true" : "false");
      first = false;
    }
    std::printf("\n]}\n");
  } else {
    std::printf(
        "bench_launch: %s (sm_%d%d), chain of %d dependent kernels (1 block x %d threads), "
        "median of %d after %d warm-up\n\n",
        prop.name, prop.major, prop.minor, o.n, o.threads, o.reps, o.warmup);
    std::printf("| %-17s | %12s | %12s | %17s | %8s | %-5s |\n", "mode", "us/kernel", "min us/kern",
                "host us/call", "build ms", "check");
    std::printf("| %-17s | %12s | %12s | %17s | %8s | %-5s |\n", "-----------------",
                "-----------:", "-----------:", "----------------:", "-------:", "-----");
    for (const auto& r : results) {
      if (!r.ran) {
        std::printf("| %-17s | %12s | %12s | %17s | %8s | %-5s |\n", mode_name(r.mode), "n/a (<sm_90)", "",
                    "", "", "");
        continue;
      }
      char build[32] = "-";
      if (uses_graph(r.mode)) std::snprintf(build, sizeof build, "%.2f", r.build_ms);
      char host[32];
      std::snprintf(host, sizeof host, "%.3f %s", r.host_us_per_call,
                    uses_graph(r.mode) ? "(graph)" : "(kern)");
      std::printf("| %-17s | %12.3f | %12.3f | %17s | %8s | %-5s |\n", mode_name(r.mode), r.us_per_kernel,
                  r.us_per_kernel_min, host, build, r.ok ? "ok" : "WRONG");
    }
    std::printf(
        "\nhost us/call: per kernel launch (kern) or per cudaGraphLaunch of the whole chain (graph)\n");
  }
  for (const auto& r : results)
    if (!r.ok)
      std::fprintf(stderr, "bench_launch: %s: wrong result: an element is %d after a chain of %d kernels\n",
                   mode_name(r.mode), r.bad_value, o.n);
  return all_ok ? 0 : 1;
}
