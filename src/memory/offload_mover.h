#pragma once
// Private: how the host pool's bytes cross between a device and its blocks
// (Note [Host offload] in host_pool.cpp). One mover per device type.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

namespace memtrain::memory {

class OffloadMover {
 public:
  virtual ~OffloadMover() = default;
  // A host block of `bytes` (uint8, 1-D).
  virtual at::Tensor new_block(int64_t bytes) = 0;
  // The `bytes` of dense `x` into `host`, after the work queued on the
  // current stream; `x` is not reused before the copy has read it.
  virtual void copy_out(const at::Tensor& x, void* host, int64_t bytes) = 0;
  // A new dense tensor of `sizes`, `strides` and `options` holding the
  // `bytes` of `host`, for the current stream; `copied` gets what ready()
  // waits for.
  virtual at::Tensor copy_in(
      const void* host,
      int64_t bytes,
      c10::IntArrayRef sizes,
      c10::IntArrayRef strides,
      const at::TensorOptions& options,
      std::shared_ptr<void>* copied) = 0;
  // The current stream waits for `copied` (copy_in's result).
  virtual void ready(const std::shared_ptr<void>& copied) = 0;
  // The host waits until every copy has finished (before blocks are freed).
  virtual void synchronize() = 0;
};

// The mover for tensors on the CPU: memcpy; blocks in the host domain.
std::unique_ptr<OffloadMover> make_cpu_mover();
// CUDA builds: pinned blocks, a copy stream of the device's, events.
std::unique_ptr<OffloadMover> make_cuda_mover(c10::Device device);

}  // namespace memtrain::memory
