#include "memtrain/dist/communicator.h"

#include <torch/torch.h>

namespace memtrain {

CollectiveWork::~CollectiveWork() = default;

bool all_ranks_ok(Communicator& comm, bool ok) {
  auto failures = torch::tensor({ok ? int64_t{0} : int64_t{1}});
  comm.all_reduce_sum(failures);
  return failures.item<int64_t>() == 0;
}

}  // namespace memtrain
