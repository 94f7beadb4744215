// Collectives for tensor parallelism: a Communicator is one rank's handle on a group of backends
// that sum a tensor together (the all_reduce op). Backends make their own kind (NCCL on CUDA, a
// shared-memory group on the CPU); the core only passes handles to the op.
#pragma once

#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "loom/status.h"

namespace loom {

class Backend;

/// One rank of a group of `size()` ranks. Every rank must take part in every collective, in the
/// same order, or they all wait.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// "host" (the CPU group below), "nccl" (CUDA).
  virtual const char* kind() const = 0;
  /// The backend library's own handle (ncclComm_t for "nccl"), nullptr for "host".
  virtual void* native() { return nullptr; }
  /// Host ranks: sums `n` floats at `src` over the ranks into `dst` (host memory; may equal src),
  /// the ranks' values added in rank order in double and rounded once, so every rank gets the same
  /// bits. Blocks until every rank has called it. An error once any rank has called abort().
  virtual Status all_reduce_host(const float* src, float* dst, size_t n);
  /// Wakes every rank waiting in a collective with an error (a rank that failed before taking part).
  virtual void abort() {}
};

/// A group of `n` host ranks (threads of one process; each rank called from its own thread).
std::vector<std::unique_ptr<Communicator>> make_host_communicators(int n);

/// What a backend offers to make communicators over several backends of its kind (its
/// extension<Collectives>()): one rank per backend, rank i for backends[i].
class Collectives {
 public:
  static constexpr std::string_view kExtensionId = "loom.collectives";
  virtual ~Collectives() = default;
  virtual Result<std::vector<std::unique_ptr<Communicator>>> make_communicators(
      std::span<Backend* const> backends) = 0;
};

/// Communicators for these backends: a host group when they all compute on host memory, else their
/// Collectives extension (every backend must be of the same kind); an error naming the backends
/// otherwise.
Result<std::vector<std::unique_ptr<Communicator>>> make_communicators(std::span<Backend* const> backends);

}  // namespace loom
