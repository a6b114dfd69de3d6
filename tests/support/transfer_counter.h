#pragma once
// Counts the operator calls that cross between host and device on a GPU, or
// would there, so that a hidden host sync fails a test on either build.

#include <cstdint>
#include <string>

namespace memtrain::test {

// While one is alive, counts this process's calls (every thread: autograd's
// device threads too) of
// - aten::to given another device than its tensor's, or given a device
//   and no dtype (a plain move: on the CPU build, the call that a CUDA
//   build runs as a blocking copy from pageable host memory; a dtype
//   conversion naming its own device, as toType does, is not counted),
// - aten::copy_ between tensors on different devices,
// - aten::_local_scalar_dense (item(): a device value read on the host),
// through LibTorch's RecordFunction callbacks. One at a time.
class TransferCounter {
 public:
  TransferCounter();
  ~TransferCounter();
  TransferCounter(const TransferCounter&) = delete;
  TransferCounter& operator=(const TransferCounter&) = delete;

  int64_t count() const;
  // The counted calls in order, comma separated, each with its devices
  // ("aten::to(cpu -> cuda:0)", "aten::_local_scalar_dense(cuda:0)").
  std::string calls() const;
};

}  // namespace memtrain::test
