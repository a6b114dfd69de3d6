#include "memtrain/dist/communicator.h"

#include <torch/torch.h>

namespace memtrain {

CollectiveWork::~CollectiveWork() = default;

namespace {

// The reduction of a staged copy; the result goes back at wait().
class StagedWork final : public CollectiveWork {
 public:
  StagedWork(
      at::Tensor target,
      at::Tensor staged,
      std::unique_ptr<CollectiveWork> inner)
      : target_(std::move(target)),
        staged_(std::move(staged)),
        inner_(std::move(inner)) {}
  ~StagedWork() override {
    inner_.reset();  // waits for the collective, if nobody did
  }
  void wait() override {
    if (copied_)
      return;
    inner_->wait();
    target_.copy_(staged_);
    copied_ = true;
  }
  bool test() override {
    return inner_->test();
  }

 private:
  at::Tensor target_;
  at::Tensor staged_;
  std::unique_ptr<CollectiveWork> inner_;
  bool copied_ = false;
};

}  // namespace

std::unique_ptr<CollectiveWork> staged_all_reduce(
    Communicator& comm, at::Tensor& t, ReduceOp op, const c10::Device& device) {
  at::Tensor staged = t.to(device, /*non_blocking=*/false, /*copy=*/true);
  auto inner = comm.all_reduce_async(staged, op);
  return std::make_unique<StagedWork>(t, staged, std::move(inner));
}

void staged_broadcast(
    Communicator& comm, at::Tensor& t, int root, const c10::Device& device) {
  at::Tensor staged = t.to(device, /*non_blocking=*/false, /*copy=*/true);
  comm.broadcast(staged, root);
  t.copy_(staged);
}

bool all_ranks_ok(Communicator& comm, bool ok) {
  auto failures = torch::tensor({ok ? int64_t{0} : int64_t{1}});
  comm.all_reduce_sum(failures);
  return failures.item<int64_t>() == 0;
}

}  // namespace memtrain
