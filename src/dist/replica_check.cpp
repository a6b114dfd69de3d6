#include "memtrain/dist/replica_check.h"

#include <torch/torch.h>

#include <cstring>

#include "memtrain/dist/communicator.h"

namespace memtrain {

uint64_t parameter_checksum(const std::vector<at::Tensor>& tensors) {
  uint64_t h = 14695981039346656037ull;
  for (const auto& t : tensors) {
    const at::Tensor c = t.detach().to(torch::kCPU).contiguous();
    const auto* bytes = static_cast<const unsigned char*>(c.data_ptr());
    const size_t n = static_cast<size_t>(c.numel()) * c.element_size();
    for (size_t i = 0; i < n; ++i) {
      h = (h ^ bytes[i]) * 1099511628211ull;
    }
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
