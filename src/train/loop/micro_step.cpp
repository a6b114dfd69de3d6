#include <torch/torch.h>

#include "memtrain/infer/device_setup.h"
#include "memtrain/memory/device_memory.h"
#include "train/state/run_state.h"
#include "train/tasks/task.h"

namespace memtrain {

// Note [Window weighting]
// A window's update must equal one step on its global batch of n samples
// (DESIGN.md semantics 1), however the n samples are split over ranks and
// micro-steps, and whatever size the last micro-batch has. Each micro-step
// therefore back-propagates sum(per-sample loss) / n, with n the window's
// global sample count that every rank knows from the sampler, and the
// boundary all-reduce *sums* over ranks. The sum of all those gradients is
// exactly the gradient of the mean loss over the n samples: the division
// happens once, in the loss, and no rank divides by the world size or by K.
// The same weighting makes OOM recovery exact: a rank that re-splits its
// share into smaller micro-batches produces the same gradient.

Batch load_batch(
    const RunState& run,
    Prefetcher& from,
    int64_t epoch,
    const std::vector<int64_t>& ids) {
  Batch host;
  {
    memory::HostScope host_scope;
    host = from.load(epoch, ids);
  }
  Batch device = to_device(run, host);
  from.recycle(std::move(host), run.placement.copies_done());
  return device;
}

Batch to_device(const RunState& run, const Batch& host) {
  Batch device;
  device.x = run.placement.to_device(host.x);
  device.y = run.placement.to_device(host.y);
  if (host.context.defined())
    device.context = run.placement.to_device(host.context);
  if (host.origin.defined()) {  // stays on the host; `host` is recycled
    memory::HostScope host_scope;
    device.origin = host.origin.clone();
  }
  return device;
}

at::Tensor forward(
    RunState& run,
    const at::Tensor& x,
    const at::Tensor& context,
    const at::Tensor& origins) {
  return autocast_forward(
      *run.model, run.cfg.training, run.placement, x, context, origins);
}

// Everything it creates (batch, context features, logits, loss, graph) is
// freed when it returns; the context tensors as soon as the forward has
// used them (the graph keeps what backward needs).
at::Tensor zero_loss_sum(const RunState& run) {
  return torch::zeros(
      {1}, torch::dtype(torch::kFloat64).device(run.placement.device()));
}

void micro_step(
    RunState& run,
    int64_t epoch,
    const std::vector<int64_t>& indices,
    double weight,
    const at::Tensor& loss_sum) {
  Batch batch = load_batch(run, *run.loader, epoch, indices);
  at::Tensor logits = forward(run, batch.x, batch.context, batch.origin);
  batch.context.reset();
  batch.x.reset();
  at::Tensor loss = run.task->loss_sum(logits, batch.y);  // Note [Tasks]
  logits.reset();  // the graph keeps what backward needs
  // See Note [Window weighting].
  (loss * (weight * run.scaler->scale())).backward();
  torch::NoGradGuard no_grad;
  at::Tensor(loss_sum).add_(loss.detach().to(torch::kFloat64).reshape({1}));
}

}  // namespace memtrain
