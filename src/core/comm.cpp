// Communicators: the host group (threads of one process meeting at a barrier) and the choice of a
// backend's own kind (loom/comm.h).
#include "loom/comm.h"

#include <condition_variable>
#include <cstring>
#include <mutex>

#include "loom/backend.h"

namespace loom {

Status Communicator::all_reduce_host(const float*, float*, size_t) {
  return make_error(StatusCode::unsupported, "{} communicator: no host all-reduce", kind());
}

namespace {

// What the ranks of a host group share: each rank's source, a generation-counting barrier, and
// whether a rank gave up.
struct HostGroup {
  explicit HostGroup(int n) : n(n), src(static_cast<size_t>(n)) {}

  // Waits for every rank; false once the group is aborted.
  bool barrier() {
    std::unique_lock lock(mutex);
    if (aborted) return false;
    const uint64_t gen = generation;
    if (++arrived == n) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return true;
    }
    cv.wait(lock, [&] { return generation != gen || aborted; });
    return !aborted;
  }

  void abort() {
    std::lock_guard lock(mutex);
    aborted = true;
    cv.notify_all();
  }

  const int n;
  std::vector<const float*> src;
  std::mutex mutex;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  bool aborted = false;
};

class HostCommunicator final : public Communicator {
 public:
  HostCommunicator(std::shared_ptr<HostGroup> group, int rank) : group_(std::move(group)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->n; }
  const char* kind() const override { return "host"; }
  void abort() override { group_->abort(); }

  // Every rank sums all sources into a scratch of its own between two barriers (dst may alias a
  // source another rank still reads), then copies it out.
  Status all_reduce_host(const float* src, float* dst, size_t n) override {
    group_->src[static_cast<size_t>(rank_)] = src;
    if (!group_->barrier()) return aborted();
    sum_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      double s = 0.0;
      for (const float* p : group_->src) s += p[i];
      sum_[i] = static_cast<float>(s);
    }
    if (!group_->barrier()) return aborted();
    std::memcpy(dst, sum_.data(), n * sizeof(float));
    return {};
  }

 private:
  Status aborted() const {
    return make_error(StatusCode::aborted, "all-reduce (rank {} of {}): another rank failed", rank_,
                      group_->n);
  }
  std::shared_ptr<HostGroup> group_;
  const int rank_;
  std::vector<float> sum_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_host_communicators(int n) {
  auto group = std::make_shared<HostGroup>(n);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<HostCommunicator>(group, r));
  return out;
}

Result<std::vector<std::unique_ptr<Communicator>>> make_communicators(std::span<Backend* const> backends) {
  if (backends.empty()) return make_error(StatusCode::invalid_argument, "communicators: no backends");
  bool all_host = true;
  for (Backend* b : backends) {
    if (!b) return make_error(StatusCode::invalid_argument, "communicators: a backend is null");
    all_host = all_host && b->buffer_type().is_host();
  }
  if (all_host) return make_host_communicators(static_cast<int>(backends.size()));
  for (Backend* b : backends)
    if (std::string_view(b->name()) != backends[0]->name())
      return make_error(StatusCode::unsupported, "communicators: backends {} and {} cannot reduce together",
                        backends[0]->name(), b->name());
  auto* collectives = backends[0]->extension<Collectives>();
  if (!collectives)
    return make_error(StatusCode::unsupported, "communicators: the {} backend has no collectives",
                      backends[0]->name());
  return collectives->make_communicators(backends);
}

}  // namespace loom
