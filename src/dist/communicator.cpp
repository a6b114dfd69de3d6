#include "memtrain/dist/communicator.h"

#include <torch/torch.h>

#include "memtrain/compat.h"

namespace memtrain {

bool all_ranks_ok(Communicator& comm, bool ok) {
  auto failures = torch::tensor({ok ? int64_t{0} : int64_t{1}});
  comm.all_reduce_sum(failures);
  return failures.item<int64_t>() == 0;
}

namespace compat {

void zero_grad_to_none(torch::optim::Optimizer& optimizer) {
#if MEMTRAIN_TORCH_AT_LEAST(2, 0)
  optimizer.zero_grad(/*set_to_none=*/true);
#else
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      p.mutable_grad() = torch::Tensor();
    }
  }
#endif
}

}  // namespace compat
}  // namespace memtrain
