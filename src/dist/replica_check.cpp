#include "memtrain/dist/replica_check.h"

#include <torch/torch.h>

#include <cstring>

#include "memtrain/dist/communicator.h"
#include "memtrain/util/fnv.h"

namespace memtrain {

uint64_t parameter_checksum(const std::vector<at::Tensor>& tensors) {
  uint64_t h = kFnvOffset;
  for (const auto& t : tensors) {
    const at::Tensor c = t.detach().to(torch::kCPU).contiguous();
    h = fnv1a(
        h, c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
  }
  return h;
}

bool replicas_identical(
    Communicator& comm,
    const std::vector<at::Tensor>& tensors,
    uint64_t* checksum) {
  const uint64_t mine = parameter_checksum(tensors);
  if (checksum)
    *checksum = mine;
  int64_t as_signed;
  std::memcpy(&as_signed, &mine, sizeof(mine));
  auto root = torch::tensor({as_signed}, torch::kInt64);
  comm.broadcast(root, 0);
  return all_ranks_ok(comm, root.item<int64_t>() == as_signed);
}

}  // namespace memtrain
