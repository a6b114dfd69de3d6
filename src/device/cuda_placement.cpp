// Built only with MEMTRAIN_CUDA=ON (LibTorch 2.x with CUDA).
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <sstream>
#include <vector>

#include "memtrain/device/host_sync.h"
#include "memtrain/device/placement.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace {

// Note [Window clock], on CUDA: timing events on the current stream.
class CudaClock final : public DeviceClock {
 public:
  explicit CudaClock(c10::DeviceIndex device) : device_(device) {
    mark();
  }
  void mark() override {
    marks_.push_back(std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault));
    marks_.back()->record(c10::cuda::getCurrentCUDAStream(device_));
  }
  std::vector<double> finish() override {
    const HostSync sync;
    marks_.back()->synchronize();
    std::vector<double> out;
    for (const auto& m : marks_)
      out.push_back(marks_.front()->elapsed_time(*m) / 1000.0);
    return out;
  }

 private:
  c10::DeviceIndex device_;
  std::vector<std::unique_ptr<at::cuda::CUDAEvent>> marks_;
};

// A CUDA device: batches come from page-locked host buffers over a copy
// stream of their own. The compute (current) stream waits for a copy
// through an event, never through a host sync; the prefetcher waits for
// the copies (copies_done(), on a reader thread) before it reads into a
// buffer again, which the GPU overlaps with the kernels already queued on
// the compute stream.
class CudaPlacement final : public Placement {
 public:
  explicit CudaPlacement(int index)
      : Placement(
            c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index))),
        copy_stream_(c10::cuda::getStreamFromPool(
            /*isHighPriority=*/false, static_cast<c10::DeviceIndex>(index))) {}

  std::string describe() const override {
    cudaDeviceProp prop{};
    const cudaError_t rc = cudaGetDeviceProperties(&prop, device().index());
    std::ostringstream out;
    out << "cuda:" << static_cast<int>(device().index());
    if (rc == cudaSuccess) {
      out << " (" << prop.name << ", "
          << format_bytes(static_cast<double>(prop.totalGlobalMem)) << ")";
    }
    return out.str();
  }

  bool pinned_host_buffers() const override {
    return true;
  }

  at::Tensor to_device(const at::Tensor& host) const override {
    c10::cuda::CUDAGuard guard(device());
    const c10::cuda::CUDAStream compute =
        c10::cuda::getCurrentCUDAStream(device().index());
    at::Tensor out;
    auto copied = std::make_shared<at::cuda::CUDAEvent>();
    {
      // The result is allocated for, and first used on, the compute
      // stream: record it there so the caching allocator does not hand
      // its block to another stream while the copy writes it.
      c10::cuda::CUDAStreamGuard on_copy(copy_stream_);
      out = host.to(device(), /*non_blocking=*/host.is_pinned(), /*copy=*/true);
      copied->record(copy_stream_);
    }
    c10::cuda::CUDACachingAllocator::recordStream(
        out.storage().data_ptr(), compute);
    copied->block(compute);  // the compute stream waits, the host does not
    last_copy_ = std::move(copied);
    return out;
  }

  std::function<void()> copies_done() const override {
    // The copy stream runs its copies in order: the last one's event
    // completes after all of them.
    std::shared_ptr<at::cuda::CUDAEvent> last = last_copy_;
    if (!last)
      return {};
    // Run on a reader thread: the guard keeps the runtime from making a
    // context on GPU 0 there.
    return [last, device = device()] {
      c10::cuda::CUDAGuard guard(device);
      last->synchronize();
    };
  }

  std::unique_ptr<DeviceClock> start_clock() const override {
    return std::make_unique<CudaClock>(device().index());
  }

 private:
  c10::cuda::CUDAStream copy_stream_;
  mutable std::shared_ptr<at::cuda::CUDAEvent> last_copy_;
};

}  // namespace

namespace {

// A CUDA version as "major.minor" (CUDA's integers are 1000 * major +
// 10 * minor).
std::string version(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

}  // namespace

// placement.h's probe_devices(), the CUDA part; NCCL's version as its code.
std::string probe_cuda_devices() {
  std::ostringstream out;
  int runtime = 0, driver = 0, nccl = 0, count = 0;
  out << "cuda_build "
      << (cudaRuntimeGetVersion(&runtime) == cudaSuccess ? version(runtime)
                                                         : "unknown")
      << "\n";
  out << "cuda_driver "
      << (cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0
              ? version(driver)
              : "none")
      << "\n";
  if (ncclGetVersion(&nccl) == ncclSuccess) {
    // 2.19 and later: 10000 * major + 100 * minor + patch.
    out << "nccl " << nccl / 10000 << "." << (nccl % 10000) / 100 << "."
        << nccl % 100 << "\n";
  } else {
    out << "nccl unknown\n";
  }
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    out << "devices 0 (" << cudaGetErrorString(rc) << ")\n";
    cudaGetLastError();  // not sticky: clear it
    return out.str();
  }
  out << "devices " << count << "\n";
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess)
      continue;
    out << "device " << i << ": " << prop.name << ", sm_" << prop.major
        << prop.minor << ", " << prop.totalGlobalMem << " B\n";
  }
  return out.str();
}

// placement.cpp's auto_fallback_reason(): what the runtime says where it
// sees no device, with the versions that decide it.
std::string cuda_no_device_reason() {
  int runtime = 0, driver = 0, count = 0;
  cudaRuntimeGetVersion(&runtime);
  const bool has_driver =
      cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  std::ostringstream out;
  out << (rc == cudaSuccess ? std::string("no device")
                            : std::string(cudaGetErrorString(rc)))
      << "; CUDA runtime " << version(runtime) << ", ";
  if (has_driver)
    out << "driver for CUDA " << version(driver);
  else
    out << "no driver found";
  cudaGetLastError();  // not sticky: clear it
  return out.str();
}

std::unique_ptr<Placement> make_cuda_placement(
    int index, const std::string& allocator_conf) {
  memory::use_cuda_allocator(index, allocator_conf);
  return std::make_unique<CudaPlacement>(index);
}

}  // namespace memtrain
