#include "memtrain/dist/communicator.h"

#include <thread>

#include <torch/torch.h>

#include "memtrain/util/error.h"

namespace memtrain {

CollectiveWork::~CollectiveWork() = default;

void Communicator::wait_for_device(const std::function<bool()>& done) {
  while (!done())
    std::this_thread::yield();
}

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

at::Tensor Communicator::all_gather_rows(
    const at::Tensor& mine, int64_t offset, int64_t total) {
  MT_INTERNAL_ASSERT(
      mine.dim() >= 1 && offset >= 0 && offset + mine.size(0) <= total,
      "all_gather_rows: rows out of range");
  std::vector<int64_t> shape = mine.sizes().vec();
  shape[0] = total;
  at::Tensor all = at::zeros(shape, mine.options());
  all.narrow(0, offset, mine.size(0)).copy_(mine);
  sum_counted_as(all, stats_.allgather_calls, stats_.allgather_bytes);
  return all;
}

void Communicator::all_reduce_batch_norm(at::Tensor& t) {
  sum_counted_as(t, stats_.syncbn_calls, stats_.syncbn_bytes);
}

void Communicator::sum_counted_as(
    at::Tensor& t, int64_t& calls, int64_t& bytes) {
  const CommStats before = stats_;
  all_reduce(t, ReduceOp::kSum);
  stats_.allreduce_calls = before.allreduce_calls;
  stats_.allreduce_bytes = before.allreduce_bytes;
  ++calls;
  bytes += static_cast<int64_t>(t.nbytes());
}

bool all_ranks_ok(Communicator& comm, bool ok) {
  auto failures = torch::tensor({ok ? int64_t{0} : int64_t{1}});
  comm.all_reduce_sum(failures);
  return failures.item<int64_t>() == 0;
}

}  // namespace memtrain
