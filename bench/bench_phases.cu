// Dependent phases of a decode step: a kernel per phase against one persistent kernel with a grid barrier
// between phases. The question behind issue 14's remaining distance (docs/PERFORMANCE.md, stops 38-46): a
// decode step is ~290 dependent kernels whose boundaries cost ~2.5 us each beyond their bytes, and every
// attempt to remove a boundary inside today's kernels (a producer finishing its consumer's input, a
// consumer recomputing the norm in every block) lost. Would one kernel that walks the phases itself, with
// the next phase's first weights loaded before each barrier, pay less per phase than a PDL kernel boundary?
//
//   bench_phases [--phases 64] [--rows 128,1024,4096,16384] [--k 4096 (at most)] [--reps 10]
//                [--per-sm 1,4,max] [--device 0]
//
// Phase i is a mat-vec of int8 weights W_i [rows][k] (row-major, 16-byte aligned rows, values -7..7) and int8
// activations x_i, as Loom's quantized mat-vecs take them (dp4a, integer sums): x_{i+1}[j] = q(y_i[j % rows]),
// q(v) = clamp(rint(v s), -127, 127) with s = 1 / (4.32 sqrt(k)) (the weights' rms times sqrt(k): the values
// keep their size over the phases). Every output of phase i+1 needs every output of phase i, as a norm or
// attention makes a layer's phases. A warp takes a row at a time, each lane 16 weights and 16 activations a
// load (the activations from L1 / L2: the 4 warps of a block read the same ones), a shuffle tree; integer
// sums, so every mode computes the same bits (checked: the last phase's outputs of every mode against the
// first mode's). Each phase has its own weights and output buffer, 128 bytes aligned (phases x rows x k
// bytes in all: no phase finds its weights in L2 at the larger sizes, a note says when it might). Modes:
//   graph            a kernel per phase (blocks of 4 warps, a row a warp), captured into a CUDA graph, replayed
//   graph+pdl        the same with programmatic edges: each kernel loads its row's weights, then waits
//                    (griddepcontrol.wait), then lets its dependents launch, as Loom's direct mat-vecs do
//   persistent/N     one cooperative launch of N blocks an SM (one wave), warps walking rows, a grid barrier
//                    between phases (an arrival counter that only grows: a block's thread 0 adds one with
//                    release order and spins until it reaches (phase + 1) x blocks with acquire loads)
//   persistent+pre/N the same, each warp loading its first row of the next phase between its block's
//                    arrival and its wait
// Reported: us per phase (median of the repetitions, events around the whole chain, a spin kernel before
// them so that the host's launch is not timed) and the bytes' floor at 4,350 GB/s (the H200's measured
// read bandwidth). rows 128 (128 KB a phase) is the boundary's cost alone.
//
// Exit status: 0 ok, 1 a CUDA error or modes that disagree, 2 bad arguments, 77 no usable GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#define BENCH_NAME "bench_phases"
#include "bench_cuda.h"

namespace {

constexpr int kWarp = 32;
constexpr int kWarps = 4;  // a block
constexpr int kThreads = kWarp * kWarps;
constexpr int kMaxSteps = 8;  // 16-byte loads a lane per row: k <= 16 * 32 * 8 = 4096 (a model's hidden size)

struct Phases {
  const int8_t* w;  // phase i's weights at w + i * rows * k
  int8_t* x;        // phase i's activations' source at x + i * xstride (x_i[j] = x[i * xstride + j % rows])
  int64_t rows, k;
  int64_t xstride;  // rows rounded up to 128 bytes: no two phases' outputs share a line
  int phases;
  float scale;  // s above
};

__device__ __forceinline__ void pdl_wait_and_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// A row's weights for lane `lane`: steps s = 0 .. k / 512 - 1 of 16 bytes at 16 (lane + 32 s).
template <int kSteps>
__device__ __forceinline__ void load_row(const int8_t* row, int lane, int steps, uint4 (&w)[kSteps]) {
#pragma unroll
  for (int s = 0; s < kSteps; ++s)
    if (s < steps) w[s] = __ldg(reinterpret_cast<const uint4*>(row) + lane + kWarp * s);
}

// The row's dot with x_i (prev: phase i's activations' source, written by the phase before: plain coherent
// loads, never ld.global.nc), summed over the warp; every lane gets the sum.
template <int kSteps>
__device__ __forceinline__ int row_dot(const uint4 (&w)[kSteps], int steps, const int8_t* prev, int64_t rows,
                                       int lane) {
  int acc = 0;
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    if (s >= steps) break;
    const int64_t c0 = 16 * (lane + kWarp * static_cast<int64_t>(s));  // rows is a multiple of 16
    const uint4 x = *reinterpret_cast<const uint4*>(prev + c0 % rows);
    acc = __dp4a(static_cast<int>(w[s].x), static_cast<int>(x.x), acc);
    acc = __dp4a(static_cast<int>(w[s].y), static_cast<int>(x.y), acc);
    acc = __dp4a(static_cast<int>(w[s].z), static_cast<int>(x.z), acc);
    acc = __dp4a(static_cast<int>(w[s].w), static_cast<int>(x.w), acc);
  }
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  return acc;
}

__device__ __forceinline__ int8_t quantize(int acc, float s) {
  return static_cast<int8_t>(fminf(fmaxf(rintf(static_cast<float>(acc) * s), -127.0f), 127.0f));
}

// One phase, a row a warp (graph modes). kPdl: the row's weights before the wait.
template <bool kPdl>
__global__ void __launch_bounds__(kThreads) phase_kernel(Phases p, int i) {
  const int lane = threadIdx.x % kWarp;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / kWarp;
  const int steps = static_cast<int>(p.k / (16 * kWarp));
  uint4 w[kMaxSteps];
  const bool mine = r < p.rows;
  if (kPdl && mine) load_row(p.w + (static_cast<int64_t>(i) * p.rows + r) * p.k, lane, steps, w);
  if (kPdl) pdl_wait_and_trigger();
  if (!mine) return;
  if (!kPdl) load_row(p.w + (static_cast<int64_t>(i) * p.rows + r) * p.k, lane, steps, w);
  const int sum = row_dot(w, steps, p.x + static_cast<int64_t>(i) * p.xstride, p.rows, lane);
  if (lane == 0) p.x[static_cast<int64_t>(i + 1) * p.xstride + r] = quantize(sum, p.scale);
}

// A grid barrier for co-resident blocks (a cooperative launch) in two halves, so that loads may go out
// between them: grid_arrive (a block barrier, then thread 0 adds one to the arrival counter with release
// order: the block's stores before it are visible to whoever acquires the count), then grid_wait (thread 0
// spins with acquire loads until the count reaches target, a block barrier releases the block). The counter
// only grows (zeroed before each run), so there is no reset or generation to order.
__device__ __forceinline__ void grid_arrive(unsigned* count) {
  __syncthreads();
  if (threadIdx.x == 0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
#endif
  }
}
__device__ __forceinline__ void grid_wait(const unsigned* count, unsigned target) {
  if (threadIdx.x == 0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    unsigned v = 0;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(count) : "memory");
    } while (v < target);
#endif
  }
  __syncthreads();
}

// Every phase in one launch: a warp walks rows gw, gw + warps, ...; a grid barrier between phases.
// kPre: each warp's first row of the next phase is loaded before the barrier's wait.
template <bool kPre>
__global__ void __launch_bounds__(kThreads) persistent_kernel(Phases p, unsigned* barrier) {
  const int lane = threadIdx.x % kWarp;
  const int64_t gw = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  const int steps = static_cast<int>(p.k / (16 * kWarp));
  uint4 w[kMaxSteps];
  bool have = false;  // w holds this warp's first row of the phase
  for (int i = 0; i < p.phases; ++i) {
    const int8_t* wi = p.w + static_cast<int64_t>(i) * p.rows * p.k;
    for (int64_t r = gw; r < p.rows; r += warps) {
      if (!have) load_row(wi + r * p.k, lane, steps, w);
      have = false;
      const int sum = row_dot(w, steps, p.x + static_cast<int64_t>(i) * p.xstride, p.rows, lane);
      if (lane == 0) p.x[static_cast<int64_t>(i + 1) * p.xstride + r] = quantize(sum, p.scale);
    }
    if (i + 1 == p.phases) break;
    grid_arrive(barrier);
    if (kPre && gw < p.rows) {  // between the halves: weights, which no phase writes
      load_row(wi + p.rows * p.k + gw * p.k, lane, steps, w);
      have = true;
    }
    grid_wait(barrier, static_cast<unsigned>(i + 1) * gridDim.x);
  }
}

enum class Mode { graph, graph_pdl, persistent, persistent_pre };
const char* mode_name(Mode m) {
  switch (m) {
    case Mode::graph: return "graph";
    case Mode::graph_pdl: return "graph+pdl";
    case Mode::persistent: return "persistent";
    case Mode::persistent_pre: return "persistent+pre";
  }
  return "?";
}

struct Options {
  int phases = 64;
  std::vector<int64_t> rows{128, 1024, 4096, 16384};
  std::vector<int> per_sm{1, 4, 0};  // persistent blocks an SM; 0: as many as fit
  int64_t k = 4096;
  int reps = 10;
  int device = 0;
};

bool parse(int argc, char** argv, Options& o) {
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    auto value = [&](const char* name) -> const char* {
      if (arg != name || a + 1 >= argc) return nullptr;
      return argv[++a];
    };
    if (const char* v = value("--phases")) o.phases = std::atoi(v);
    else if (const char* v2 = value("--k")) o.k = std::atoll(v2);
    else if (const char* v3 = value("--reps")) o.reps = std::atoi(v3);
    else if (const char* v4 = value("--device")) o.device = std::atoi(v4);
    else if (const char* v5 = value("--rows")) {
      o.rows.clear();
      for (const char* s = v5; *s;) {
        o.rows.push_back(std::atoll(s));
        const char* c = std::strchr(s, ',');
        if (!c) break;
        s = c + 1;
      }
    } else if (const char* v6 = value("--per-sm")) {
      o.per_sm.clear();
      for (const char* s = v6; *s;) {
        o.per_sm.push_back(std::strncmp(s, "max", 3) == 0 ? 0 : std::atoi(s));
        if (o.per_sm.back() < 0) o.per_sm.back() = -1;
        const char* c = std::strchr(s, ',');
        if (!c) break;
        s = c + 1;
      }
    } else {
      std::fprintf(stderr,
                   "usage: bench_phases [--phases N] [--rows A,B,..] [--k K] [--reps N] [--per-sm A,B,..|max] "
                   "[--device D]\n");
      return false;
    }
  }
  if (o.phases < 2 || o.reps < 1 || o.k < 512 || o.k % 512 != 0 || o.k > 16 * kWarp * kMaxSteps || o.device < 0 ||
      o.rows.empty() || o.per_sm.empty()) {
    std::fprintf(stderr, "bench_phases: phases >= 2, reps >= 1, k a multiple of 512 up to %d, a device, some rows\n",
                 16 * kWarp * kMaxSteps);
    return false;
  }
  for (int64_t r : o.rows)
    if (r < 16 || r % 16 != 0) {
      std::fprintf(stderr, "bench_phases: rows a positive multiple of 16\n");
      return false;
    }
  for (int n : o.per_sm)
    if (n < 0) {
      std::fprintf(stderr, "bench_phases: --per-sm takes positive counts or max\n");
      return false;
    }
  return true;
}

__global__ void spin_kernel(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

__global__ void fill_weights(int8_t* w, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ static_cast<uint32_t>(i >> 32) * 40503u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    w[i] = static_cast<int8_t>(static_cast<int>(h % 15u) - 7);  // -7 .. 7
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, o)) return 2;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count <= o.device) {
    std::fprintf(stderr, "bench_phases: no CUDA device %d\n", o.device);
    return 77;
  }
  CHECK_CUDA(cudaSetDevice(o.device));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, o.device));
  const bool pdl = prop.major >= 9;
  int clock_khz = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, o.device));
  if (!prop.cooperativeLaunch) {
    std::fprintf(stderr, "bench_phases: the device has no cooperative launch\n");
    return 77;
  }
  int per_sm_max = 0;
  CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm_max, persistent_kernel<true>, kThreads, 0));
  int per_sm_plain = 0;
  CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm_plain, persistent_kernel<false>, kThreads, 0));
  per_sm_max = std::min(per_sm_max, per_sm_plain);
  std::vector<int> per_sms;  // the persistent modes' blocks an SM, within what fits
  for (int n : o.per_sm) {
    const int v = n == 0 ? per_sm_max : std::min(n, per_sm_max);
    if (std::find(per_sms.begin(), per_sms.end(), v) == per_sms.end()) per_sms.push_back(v);
  }
  std::printf("bench_phases: %s, %d SMs, up to %d persistent blocks an SM, k %lld, %d phases, %d repetitions\n",
              prop.name, prop.multiProcessorCount, per_sm_max, static_cast<long long>(o.k), o.phases, o.reps);
  std::printf("| rows | MB a phase | floor us | mode | us a phase | over the floor |\n| ---: | ---: | ---: | --- | ---: | ---: |\n");

  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  unsigned* barrier = nullptr;
  CHECK_CUDA(cudaMalloc(&barrier, sizeof(unsigned)));
  int failures = 0;

  for (int64_t rows : o.rows) {
    Phases p{};
    p.rows = rows;
    p.k = o.k;
    p.phases = o.phases;
    p.xstride = (rows + 127) / 128 * 128;
    p.scale = static_cast<float>(1.0 / (4.32 * std::sqrt(static_cast<double>(o.k))));
    const int64_t w_bytes = static_cast<int64_t>(o.phases) * rows * o.k;
    int8_t* w = nullptr;
    int8_t* x = nullptr;
    CHECK_CUDA(cudaMalloc(&w, static_cast<size_t>(w_bytes)));
    CHECK_CUDA(cudaMalloc(&x, static_cast<size_t>(o.phases + 1) * p.xstride));
    fill_weights<<<1024, 256, 0, stream>>>(w, w_bytes, 12345u);
    CHECK_CUDA(cudaGetLastError());
    std::vector<int8_t> first(static_cast<size_t>(rows));
    for (int64_t j = 0; j < rows; ++j) first[static_cast<size_t>(j)] = static_cast<int8_t>((j * 37) % 17 - 8);
    p.w = w;
    p.x = x;
    const double floor_us = static_cast<double>(rows * o.k) / 4350e9 * 1e6;
    if (w_bytes < 4 * static_cast<int64_t>(prop.l2CacheSize))
      std::printf("(rows %lld: %lld MB of weights in all, within 4x the %d MB L2: phases may find theirs there)\n",
                  static_cast<long long>(rows), static_cast<long long>(w_bytes >> 20), prop.l2CacheSize >> 20);
    std::vector<int8_t> reference;
    std::vector<std::pair<Mode, int>> modes{{Mode::graph, 0}};
    if (pdl) modes.push_back({Mode::graph_pdl, 0});
    for (int n : per_sms) modes.push_back({Mode::persistent, n}), modes.push_back({Mode::persistent_pre, n});
    for (const auto& mode : modes) {
      const Mode m = mode.first;
      const int per_sm = mode.second;
      cudaGraphExec_t exec = nullptr;
      if (m == Mode::graph || m == Mode::graph_pdl) {
        cudaGraph_t graph;
        CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        const auto blocks = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
        for (int i = 0; i < o.phases; ++i) {
          cudaLaunchConfig_t cfg{};
          cfg.gridDim = dim3(blocks);
          cfg.blockDim = dim3(kThreads);
          cfg.stream = stream;
          cudaLaunchAttribute attr{};
          attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
          attr.val.programmaticStreamSerializationAllowed = 1;
          if (m == Mode::graph_pdl && i > 0) {
            cfg.attrs = &attr;
            cfg.numAttrs = 1;
          }
          if (m == Mode::graph_pdl) CHECK_CUDA(cudaLaunchKernelEx(&cfg, phase_kernel<true>, p, i));
          else CHECK_CUDA(cudaLaunchKernelEx(&cfg, phase_kernel<false>, p, i));
        }
        CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
        CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
        CHECK_CUDA(cudaGraphDestroy(graph));
      }
      auto run = [&] {
        if (exec) {
          CHECK_CUDA(cudaGraphLaunch(exec, stream));
          return;
        }
        // one wave, but no more blocks than the rows have warps for (idle blocks would still join each barrier)
        const unsigned grid = static_cast<unsigned>(
            std::min<int64_t>(static_cast<int64_t>(per_sm) * prop.multiProcessorCount, (rows + kWarps - 1) / kWarps));
        void* args[] = {&p, &barrier};
        CHECK_CUDA(cudaLaunchCooperativeKernel(
            m == Mode::persistent_pre ? reinterpret_cast<const void*>(persistent_kernel<true>)
                                      : reinterpret_cast<const void*>(persistent_kernel<false>),
            dim3(grid), dim3(kThreads), args, 0, stream));
      };
      std::vector<float> times;
      for (int rep = 0; rep <= o.reps; ++rep) {  // the first run warms up
        CHECK_CUDA(cudaMemcpyAsync(x, first.data(), first.size(), cudaMemcpyHostToDevice, stream));
        CHECK_CUDA(cudaMemsetAsync(x + p.xstride, 0x5a, static_cast<size_t>(o.phases) * p.xstride, stream));
        CHECK_CUDA(cudaMemsetAsync(barrier, 0, sizeof(unsigned), stream));
        // the GPU busy while the host submits the run, so that the host's launch is not in the window
        spin_kernel<<<1, 1, 0, stream>>>(static_cast<long long>(clock_khz) * 50 / 1000);  // ~50 us
        CHECK_CUDA(cudaEventRecord(e0, stream));
        run();
        CHECK_CUDA(cudaEventRecord(e1, stream));
        CHECK_CUDA(cudaEventSynchronize(e1));
        float ms = 0.0f;
        CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        if (rep > 0) times.push_back(ms);
      }
      std::sort(times.begin(), times.end());
      const double us = static_cast<double>(times[times.size() / 2]) * 1e3 / o.phases;
      std::vector<int8_t> last(static_cast<size_t>(rows));
      CHECK_CUDA(cudaMemcpy(last.data(), x + static_cast<int64_t>(o.phases) * p.xstride, last.size(),
                            cudaMemcpyDeviceToHost));
      const char* agree = "";
      if (reference.empty()) {
        reference = last;
      } else if (std::memcmp(reference.data(), last.data(), last.size()) != 0) {
        agree = " (DIFFERS from graph)";
        ++failures;
      }
      const std::string name = per_sm ? std::string(mode_name(m)) + "/" + std::to_string(per_sm) : mode_name(m);
      std::printf("| %lld | %.2f | %.2f | %s | %.2f | %.2f%s |\n", static_cast<long long>(rows),
                  static_cast<double>(rows * o.k) / 1e6, floor_us, name.c_str(), us, us - floor_us, agree);
      if (exec) CHECK_CUDA(cudaGraphExecDestroy(exec));
    }
    CHECK_CUDA(cudaFree(w));
    CHECK_CUDA(cudaFree(x));
  }
  CHECK_CUDA(cudaFree(barrier));
  CHECK_CUDA(cudaEventDestroy(e0));
  CHECK_CUDA(cudaEventDestroy(e1));
  CHECK_CUDA(cudaStreamDestroy(stream));
  return failures ? 1 : 0;
}
