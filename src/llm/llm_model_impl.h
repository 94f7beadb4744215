// What a Model holds; shared by the loader (llm_model.cpp) and the Context.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "llm_arch.h"
#include "loom/comm.h"
#include "loom/gguf.h"
#include "loom/llm.h"

namespace loom::llm::detail {

/// One rank of a tensor-parallel model (ModelLoadOptions::tensor_parallel).
struct Shard {
  Backend* backend = nullptr;
  /// The rank's share of the model: n_head, n_head_kv, n_ff, n_ff_exp divided by the rank count,
  /// n_vocab the rows of its output slice.
  HParams hp;
  ModelWeights w;  // its tensors, in `buffer`
  std::unique_ptr<Buffer> buffer;
  Communicator* comm = nullptr;
  int64_t vocab_begin = 0;  // the first vocabulary row of its output slice
};

struct ModelImpl {
  explicit ModelImpl(GgufFile f) : file(std::move(f)) {}
  ~ModelImpl();

  GgufFile file;
  HParams hp;
  const Architecture* arch = nullptr;
  Backend* backend = nullptr;
  // Layers [n_layer - n_offload, n_layer), output_norm and output run on `offload_backend`.
  Backend* offload_backend = nullptr;
  int n_offload = 0;
  Graph weight_tensors;  // owns the weights' Tensor objects (leafs, never computed)
  ModelWeights w;
  std::unique_ptr<Buffer> buffer;          // a view of the mapping (host) or a device copy
  std::unique_ptr<Buffer> offload_buffer;  // the offloaded weights, copied into offload memory
  uint64_t n_params = 0;
  uint64_t n_bytes = 0;
  uint64_t offload_bytes = 0;  // weights in offload memory, with the copies of shared ones
  std::vector<std::pair<std::string, int>> type_counts;  // most frequent first
  // Tensor parallelism: the ranks (empty: not split; then `w` and `buffer` hold the model). When
  // split, `w` holds the whole tensors as the file has them, unbound, and the ranks compute.
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<Shard> shards;

  int first_offload_layer() const { return static_cast<int>(hp.n_layer) - n_offload; }
};

/// Host memory the kernel says is available (MemAvailable), 0 when it cannot be read.
uint64_t host_memory_available();
/// "1.50 GiB", "812.3 MiB".
std::string format_bytes(uint64_t bytes);

}  // namespace loom::llm::detail
