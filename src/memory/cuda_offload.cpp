// Built only with MEMTRAIN_CUDA=ON (LibTorch 2.x with CUDA).
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/torch.h>

#include <memory>

#include "memtrain/util/error.h"
#include "offload_mover.h"

namespace memtrain::memory {
namespace {

// Note [Host offload], on CUDA: page-locked blocks, a copy stream, events;
// the host waits only in synchronize().
class CudaMover final : public OffloadMover {
 public:
  explicit CudaMover(c10::Device device)
      : device_(device),
        copy_(c10::cuda::getStreamFromPool(
            /*isHighPriority=*/false, device.index())) {}

  at::Tensor new_block(int64_t bytes) override {
    void* p = nullptr;
    const cudaError_t rc =
        cudaHostAlloc(&p, static_cast<size_t>(bytes), cudaHostAllocDefault);
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();  // clear the (not sticky) error
      throw Error(detail::concat(
          "host offload: could not page-lock ",
          format_bytes(static_cast<double>(bytes)),
          " of host memory (",
          cudaGetErrorString(rc),
          "); lower memory.host_budget, or raise the node's locked-memory "
          "limit (ulimit -l)"));
    }
    return at::from_blob(
        p,
        {bytes},
        [](void* q) { (void)cudaFreeHost(q); },
        at::TensorOptions().dtype(at::kByte));
  }

  void copy_out(const at::Tensor& x, void* host, int64_t bytes) override {
    c10::cuda::CUDAGuard guard(device_);
    const c10::cuda::CUDAStream compute =
        c10::cuda::getCurrentCUDAStream(device_.index());
    at::cuda::CUDAEvent produced;
    produced.record(compute);
    produced.block(copy_);
    C10_CUDA_CHECK(cudaMemcpyAsync(
        host,
        x.data_ptr(),
        static_cast<size_t>(bytes),
        cudaMemcpyDeviceToHost,
        copy_.stream()));
    // x's block is not handed out again before the copy has read it.
    c10::cuda::CUDACachingAllocator::recordStream(
        x.storage().data_ptr(), copy_);
  }

  at::Tensor copy_in(
      const void* host,
      int64_t bytes,
      c10::IntArrayRef sizes,
      c10::IntArrayRef strides,
      const at::TensorOptions& options,
      std::shared_ptr<void>* copied) override {
    c10::cuda::CUDAGuard guard(device_);
    const c10::cuda::CUDAStream compute =
        c10::cuda::getCurrentCUDAStream(device_.index());
    // Allocated on the compute stream, which uses it (one pool for the
    // loop); its block may have been freed by work still queued there, so
    // the copy waits for that work.
    at::Tensor out = at::empty_strided(sizes, strides, options);
    at::cuda::CUDAEvent allocated;
    allocated.record(compute);
    allocated.block(copy_);
    C10_CUDA_CHECK(cudaMemcpyAsync(
        out.data_ptr(),
        host,
        static_cast<size_t>(bytes),
        cudaMemcpyHostToDevice,
        copy_.stream()));
    // The copy stream writes it: its block is not handed out again before
    // the copy is done.
    c10::cuda::CUDACachingAllocator::recordStream(
        out.storage().data_ptr(), copy_);
    auto done = std::make_shared<at::cuda::CUDAEvent>();
    done->record(copy_);
    *copied = std::move(done);
    return out;
  }

  void ready(const std::shared_ptr<void>& copied) override {
    c10::cuda::CUDAGuard guard(device_);
    static_cast<at::cuda::CUDAEvent*>(copied.get())
        ->block(c10::cuda::getCurrentCUDAStream(device_.index()));
  }

  void synchronize() override {
    c10::cuda::CUDAGuard guard(device_);
    copy_.synchronize();
  }

 private:
  c10::Device device_;
  c10::cuda::CUDAStream copy_;
};

}  // namespace

std::unique_ptr<OffloadMover> make_cuda_mover(c10::Device device) {
  return std::make_unique<CudaMover>(device);
}

}  // namespace memtrain::memory
