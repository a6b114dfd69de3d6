// Built only with MEMTRAIN_CUDA=ON (LibTorch 2.x with CUDA).
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <mutex>

#include "memory_backend.h"
#include "memtrain/compat.h"
#include "memtrain/util/atomic_file.h"
#include "memtrain/util/error.h"

namespace memtrain::memory {

// Note [CUDA memory backend]
// On a CUDA device the budget, the monitor, the planner and the OOM guard
// read and drive LibTorch's own CUDA caching allocator, so nothing of the
// memory machinery is switched off on a GPU:
// - the cap is the allocator's per-process memory fraction (budget bytes /
//   the GPU's total): past it the allocator frees its cache, retries, then
//   throws the c10::OutOfMemoryError the OOM guard already handles;
// - allocator settings (memory.allocator_conf, PYTORCH_CUDA_ALLOC_CONF
//   syntax; expandable_segments:True by default, which keeps a long run
//   from fragmenting) are applied before the process's first CUDA
//   allocation: they are read once, when the allocator starts;
// - stats are the allocator's aggregate counters (allocated, reserved,
//   their peaks, allocation retries after a cache flush, OOMs);
// - release_cache() is emptyCache(), which synchronises the device: the
//   trainer calls it only as Note [Cache policy] says;
// - on an OOM that exhausts the retries the allocator's segments and
//   blocks are written as JSON to output.dir (write_snapshot).

namespace {

using c10::CachingAllocator::StatType;
namespace cca = c10::cuda::CUDACachingAllocator;

constexpr size_t kAggregate = static_cast<size_t>(StatType::AGGREGATE);

class CudaCachingBackend final : public MemoryBackend {
 public:
  explicit CudaCachingBackend(int device) : device_(device) {}

  std::string name() const override {
    return "cuda-caching";
  }

  Stats stats() override {
    const auto d = cca::getDeviceStats(index());
    Stats s;
    s.allocated = d.allocated_bytes[kAggregate].current;
    s.reserved = d.reserved_bytes[kAggregate].current;
    s.peak_allocated = d.allocated_bytes[kAggregate].peak;
    s.peak_reserved = d.reserved_bytes[kAggregate].peak;
    s.num_ooms = d.num_ooms;
    s.alloc_retries = d.num_alloc_retries;
    std::lock_guard<std::mutex> lock(mu_);
    s.cap = cap_;
    s.cache_releases = releases_;
    s.cache_release_seconds = release_seconds_;
    return s;
  }

  void reset_peak() override {
    cca::resetPeakStats(index());
  }

  int64_t release_cache() override {
    const auto start = std::chrono::steady_clock::now();
    const int64_t before = stats().reserved;
    cca::emptyCache();
    const int64_t freed = before - stats().reserved;
    std::lock_guard<std::mutex> lock(mu_);
    if (freed > 0) {
      ++releases_;
      release_seconds_ += std::chrono::duration<double>(
                              std::chrono::steady_clock::now() - start)
                              .count();
    }
    return freed;
  }

  void set_cap(int64_t bytes) override {
    size_t free_bytes = 0, total = 0;
    const cudaError_t rc = cudaMemGetInfo(&free_bytes, &total);
    MT_CHECK(
        rc == cudaSuccess,
        "cudaMemGetInfo on cuda:",
        device_,
        ": ",
        cudaGetErrorString(rc));
    MT_CHECK(
        bytes <= static_cast<int64_t>(total),
        "memory.budget (",
        format_bytes(static_cast<double>(bytes)),
        ") is larger than cuda:",
        device_,
        " (",
        format_bytes(static_cast<double>(total)),
        "); use a smaller budget or none");
    const double fraction =
        bytes > 0 ? static_cast<double>(bytes) / static_cast<double>(total)
                  : 1.0;
    cca::setMemoryFraction(fraction, index());
    std::lock_guard<std::mutex> lock(mu_);
    cap_ = bytes;
  }

  std::string write_snapshot(const std::string& dir) override {
    const auto snap = cca::snapshot();
    nlohmann::json segments = nlohmann::json::array();
    for (const auto& seg : snap.segments) {
      if (seg.device != index())
        continue;
      nlohmann::json blocks = nlohmann::json::array();
      for (const auto& b : seg.blocks) {
        blocks.push_back(
            {{"size", b.size},
             {"requested_size", b.requested_size},
             {"allocated", b.allocated},
             {"active", b.active}});
      }
      segments.push_back(
          {{"address", seg.address},
           {"total_size", seg.total_size},
           {"allocated_size", seg.allocated_size},
           {"active_size", seg.active_size},
           {"is_large", seg.is_large},
           {"is_expandable", seg.is_expandable},
           {"blocks", blocks}});
    }
    const Stats s = stats();
    const nlohmann::json j = {
        {"device", device_},
        {"allocated", s.allocated},
        {"reserved", s.reserved},
        {"peak_allocated", s.peak_allocated},
        {"peak_reserved", s.peak_reserved},
        {"cap", s.cap},
        {"alloc_retries", s.alloc_retries},
        {"num_ooms", s.num_ooms},
        {"segments", segments}};
    const std::string path =
        dir + "/oom-snapshot-cuda" + std::to_string(device_) + ".json";
    write_file_atomically(path, j.dump(1) + "\n");
    return path;
  }

 private:
  c10::DeviceIndex index() const {
    return static_cast<c10::DeviceIndex>(device_);
  }

  const int device_;
  std::mutex mu_;
  int64_t cap_ = 0;
  int64_t releases_ = 0;
  double release_seconds_ = 0.0;
};

}  // namespace

void use_cuda_allocator(int device_index, const std::string& allocator_conf) {
  MT_CHECK(
      device_index >= 0 &&
          device_index < static_cast<int>(c10::cuda::device_count()),
      "cuda:",
      device_index,
      " does not exist (",
      static_cast<int>(c10::cuda::device_count()),
      " CUDA device(s) visible)");
  // Read by the allocator once, when it starts: before the first CUDA
  // allocation of the process, which nothing has made yet (the placement is
  // chosen before any tensor exists).
  if (!allocator_conf.empty())
    compat::set_cuda_allocator_settings(allocator_conf);
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device_index));
  static CudaCachingBackend* backend = new CudaCachingBackend(device_index);
  activate_backend(backend);
}

}  // namespace memtrain::memory
