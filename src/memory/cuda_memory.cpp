// Built only with MEMTRAIN_CUDA=ON (LibTorch 2.x with CUDA).
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>

#include "memory_backend.h"
#include "memtrain/compat.h"
#include "memtrain/memory/allocator_conf.h"
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

// Note [A budget is the whole process]
// The per-process fraction bounds the caching allocator only. The CUDA
// context, the cuBLAS/cuDNN handles and the kernels loaded for them, and
// NCCL's buffers live outside it: on an H100, memory.budget=v100-16gb as an
// allocator cap alone would let the process use all of that on top of what
// a real V100 has (issue 24 puts it at up to a GiB; not measured here). So
// start_on_device (a training run's set-up, after its communicator has
// started, and predict's InferenceModel) asks measure_outside(): it
// loads those libraries (a matrix product and a convolution on the device),
// releases what that cached, and returns what the process then holds outside
// the allocator: the device's used bytes (cudaMemGetInfo: total - free) less
// the allocator's reserved bytes. The allocator's cap is the budget less that
// (Budget::outside; memory_plan.json's outside_allocator_bytes and
// allocator_cap_bytes), and at every window boundary the device's used bytes
// are checked against the whole budget (check_device_within), so that what
// grows outside later (kernels loaded lazily) is named, not missed.
// cudaMemGetInfo counts every process on the GPU: with one rank per GPU
// (what NCCL requires) that is this process.
//
// Note [CUDA start-up order]
// LibTorch sets the caching allocator up at CUDA's lazy initialisation,
// which the first CUDA tensor triggers; before it, getDeviceStats and
// resetPeakStats throw ("did you call init?") and setMemoryFraction
// asserts. use_cuda_allocator() applies the allocator settings (read when
// the allocator starts), selects the device and initialises CUDA at once,
// so the budget, the monitor and the planner may ask before any tensor
// exists (start_on_device does).

namespace {

using c10::CachingAllocator::StatType;
namespace cca = c10::cuda::CUDACachingAllocator;

constexpr size_t kAggregate = static_cast<size_t>(StatType::AGGREGATE);

AllocatorSettings& in_force() {
  static AllocatorSettings settings;
  return settings;
}

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
    const DeviceBytes dev = device_bytes();
    MT_CHECK(
        bytes <= dev.total,
        "memory.budget (",
        format_bytes(static_cast<double>(bytes)),
        ") is larger than cuda:",
        device_,
        " (",
        format_bytes(static_cast<double>(dev.total)),
        "); use a smaller budget or none");
    const double fraction =
        bytes > 0 ? static_cast<double>(bytes) / static_cast<double>(dev.total)
                  : 1.0;
    cca::setMemoryFraction(fraction, index());
    std::lock_guard<std::mutex> lock(mu_);
    cap_ = bytes;
  }

  int64_t device_used_bytes() override {
    const DeviceBytes dev = device_bytes();
    return dev.total - dev.free;
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
        {"device_used", device_used_bytes()},
        {"alloc_retries", s.alloc_retries},
        {"num_ooms", s.num_ooms},
        {"segments", segments}};
    const std::string path =
        dir + "/oom-snapshot-cuda" + std::to_string(device_) + ".json";
    write_file_atomically(path, j.dump(1) + "\n");
    return path;
  }

  // Note [A budget is the whole process].
  int64_t measure_outside() override {
    {
      const auto on =
          torch::TensorOptions().device(c10::Device(c10::kCUDA, index()));
      torch::NoGradGuard no_grad;
      const at::Tensor a = torch::ones({64, 64}, on);
      torch::matmul(a, a);
      torch::conv3d(
          torch::ones({1, 1, 8, 8, 8}, on), torch::ones({1, 1, 3, 3, 3}, on));
      c10::cuda::device_synchronize();
    }
    cca::emptyCache();
    const int64_t reserved =
        cca::getDeviceStats(index()).reserved_bytes[kAggregate].current;
    return std::max<int64_t>(0, device_used_bytes() - reserved);
  }

 private:
  c10::DeviceIndex index() const {
    return static_cast<c10::DeviceIndex>(device_);
  }

  struct DeviceBytes {
    int64_t free = 0;
    int64_t total = 0;
  };

  DeviceBytes device_bytes() const {
    size_t free_bytes = 0, total = 0;
    const c10::cuda::CUDAGuard guard(index());
    const cudaError_t rc = cudaMemGetInfo(&free_bytes, &total);
    MT_CHECK(
        rc == cudaSuccess,
        "cudaMemGetInfo on cuda:",
        device_,
        ": ",
        cudaGetErrorString(rc));
    return {static_cast<int64_t>(free_bytes), static_cast<int64_t>(total)};
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
  // memory.allocator_conf merged with the user's exported settings (the
  // environment wins key by key): LibTorch replaces its settings as a
  // whole, so applying the config's alone would drop the user's keys.
  const auto [env_name, env_text] = allocator_conf_from_environment();
  const AllocatorSettings merged =
      merge_allocator_conf(allocator_conf, env_text, env_name);
  // Note [CUDA start-up order]: the settings, then the device, then CUDA's
  // initialisation, which starts the caching allocator.
  try {
    if (!merged.entries.empty())
      compat::set_cuda_allocator_settings(merged.text());
  } catch (const c10::Error& e) {
    throw Error(detail::concat(
        "the CUDA allocator settings '",
        merged.text(),
        "' (memory.allocator_conf",
        env_name.empty() ? "" : " merged with " + env_name,
        ") are refused by LibTorch: ",
        e.what_without_backtrace()));
  }
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device_index));
  compat::init_cuda();
  static CudaCachingBackend* backend = new CudaCachingBackend(device_index);
  activate_backend(backend);
  in_force() = merged;
}

AllocatorSettings cuda_allocator_settings() {
  return in_force();
}

}  // namespace memtrain::memory
