#include "memtrain/device/placement.h"

#include <torch/torch.h>
#include <torch/version.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "memtrain/device/host_sync.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/util/error.h"

namespace memtrain {

// Note [Placement]
// One object decides where a rank's tensors live, so that no code path
// has to guess: the model, its gradients (the gradient buckets), the
// optimizer state and each batch are on placement.device(); host buffers
// are page-locked only for a CUDA device; autocast uses the device's type;
// the generators are the device's. The CPU placement is also what makes
// memory observable without a GPU: its device memory is the accounted
// domain of the CPU allocator (Note [CPU accounting allocator]). On CUDA
// the same calls reach the CUDA caching allocator (Note [CUDA memory
// backend]) and copies run on a stream of their own (cuda_placement.cpp).

uint64_t rank_seed(uint64_t seed, int rank) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(rank) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (z ^ (z >> 31)) & 0x7FFFFFFFFFFFFFFFull;  // LibTorch seeds are < 2^63
}

namespace {

// Note [Window clock], on the CPU: the host's clock.
class HostClock final : public DeviceClock {
 public:
  HostClock() {
    mark();
  }
  void mark() override {
    marks_.push_back(std::chrono::steady_clock::now());
  }
  std::vector<double> finish() override {
    const HostSync sync;
    std::vector<double> out;
    for (const auto& m : marks_)
      out.push_back(std::chrono::duration<double>(m - marks_.front()).count());
    return out;
  }

 private:
  std::vector<std::chrono::steady_clock::time_point> marks_;
};

class CpuPlacement final : public Placement {
 public:
  CpuPlacement() : Placement(c10::Device(c10::kCPU)) {}
  std::string describe() const override {
    return "cpu";
  }
  bool pinned_host_buffers() const override {
    return false;
  }
  at::Tensor to_device(const at::Tensor& host) const override {
    memory::DeviceScope scope;
    return host.to(device(), /*non_blocking=*/false, /*copy=*/true);
  }
};

}  // namespace

#if MEMTRAIN_CUDA
// cuda_placement.cpp
std::unique_ptr<Placement> make_cuda_placement(
    int index, const std::string& allocator_conf);
std::string probe_cuda_devices();
std::string cuda_no_device_reason();
#endif

std::string probe_devices() {
  std::string out = std::string("torch ") + TORCH_VERSION + "\n";
#if MEMTRAIN_CUDA
  out += probe_cuda_devices();
#else
  out += "cuda_build none\ncuda_driver none\nnccl none\ndevices 0\n";
#endif
  return out;
}

std::unique_ptr<Placement> Placement::cpu() {
  memory::install_cpu_accounting();
  return std::make_unique<CpuPlacement>();
}

std::unique_ptr<Placement> Placement::choose(
    DeviceChoice spec, int local_rank, const std::string& allocator_conf) {
  if (spec == DeviceChoice::kCpu)
    return cpu();
  const int gpus = static_cast<int>(torch::cuda::device_count());
  if (spec == DeviceChoice::kAuto && (!MEMTRAIN_CUDA || gpus == 0)) {
    const std::string why = auto_fallback_reason();
    if (!why.empty() && local_rank == 0)
      std::fprintf(stderr, "memtrain: %s\n", why.c_str());
    return cpu();
  }
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  MT_CHECK(
      MEMTRAIN_CUDA,
      "dist.device=cuda, but this memtrain is a CPU build (MEMTRAIN_CUDA=0, "
      "LibTorch ",
      TORCH_VERSION,
      "): rebuild with -DMEMTRAIN_CUDA=ON against a CUDA LibTorch "
      "(docs/build.md: the CUDA configuration), or use dist.device=cpu");
  MT_CHECK(
      gpus > 0,
      "dist.device=cuda, but LibTorch ",
      TORCH_VERSION,
      " (CUDA build) sees no CUDA device on this machine "
      "(CUDA_VISIBLE_DEVICES=",
      visible ? visible : "(unset)",
      "; check nvidia-smi and the driver), or use dist.device=cpu");
#if MEMTRAIN_CUDA
  return make_cuda_placement(local_rank % gpus, allocator_conf);
#else
  (void)local_rank;
  (void)allocator_conf;
  MT_INTERNAL_ASSERT(false, "unreachable");
#endif
}

std::string Placement::auto_fallback_reason() {
#if MEMTRAIN_CUDA
  if (torch::cuda::device_count() > 0)
    return "";
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return detail::concat(
      "dist.device=auto: this CUDA build of memtrain sees no usable GPU (",
      cuda_no_device_reason(),
      "; CUDA_VISIBLE_DEVICES=",
      visible ? visible : "(unset)",
      "): training on the CPU. Check nvidia-smi and the driver, set "
      "dist.device=cuda to make this an error, or dist.device=cpu to say "
      "the CPU is meant");
#else
  return "";
#endif
}

std::unique_ptr<DeviceClock> Placement::start_clock() const {
  return std::make_unique<HostClock>();
}

at::Tensor Placement::to_host(const at::Tensor& t) const {
  const HostSync sync;
  memory::HostScope host;
  return t.to(c10::Device(c10::kCPU), /*non_blocking=*/false, /*copy=*/true);
}

void Placement::seed_rng(uint64_t seed, int rank) const {
  const uint64_t s = rank_seed(seed, rank);
  at::Generator cpu = at::globalContext().defaultGenerator(c10::kCPU);
  {
    std::lock_guard<std::mutex> lock(cpu.mutex());
    cpu.set_current_seed(s);
  }
  if (is_cuda()) {
    at::Generator gpu = at::globalContext().defaultGenerator(device());
    std::lock_guard<std::mutex> lock(gpu.mutex());
    gpu.set_current_seed(s);
  }
}

RngState Placement::rng_state() const {
  memory::HostScope host;  // bookkeeping, not device memory
  RngState r;
  r.cpu = at::globalContext().defaultGenerator(c10::kCPU).get_state();
  if (is_cuda())
    r.device = at::globalContext().defaultGenerator(device()).get_state();
  return r;
}

void Placement::set_rng_state(const RngState& state) const {
  at::Generator cpu = at::globalContext().defaultGenerator(c10::kCPU);
  cpu.set_state(state.cpu);
  if (is_cuda() && state.device.defined()) {
    at::Generator gpu = at::globalContext().defaultGenerator(device());
    gpu.set_state(state.device);
  }
}

}  // namespace memtrain
