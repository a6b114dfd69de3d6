#include "memtrain/model/blocks/sync_batch_norm.h"

#include <torch/torch.h>

#include <vector>

#include "memtrain/device/host_sync.h"
#include "memtrain/util/error.h"

namespace memtrain {

// Note [Batch-norm and data parallelism]
// By default the ResNets' batch-norm (training mode, not frozen) normalises
// with each micro-batch's own statistics, as PyTorch DDP without
// SyncBatchNorm does. The update then depends on the micro-batch size m and
// not on how the micro-batches are spread over ranks: a window of W ranks x
// K micro-steps x m samples equals one rank running W*K micro-steps of m
// samples (Note [Window weighting] sums the same micro-batch gradients),
// and differs from one step on the window's W*K*m samples at once. Each
// rank's running statistics see its own micro-batches; rank 0's are the
// ones saved (Note [Weights by name]).
//
// model.sync_bn: true computes them over the union of the W ranks'
// concurrent micro-batches (W*m samples), as torch.nn.SyncBatchNorm: in
// forward one sum over ranks of [count, per-channel sum, per-channel sum of
// squares] (float64, [2C + 1]) gives the global mean and variance; in
// backward one sum of [sum of grad_out, sum of grad_out * (x - mean)]
// (float64, [2C]) gives the input's gradient from the global sums:
//   dx = (dy - sum(dy)/n - (x - mean) * invstd^2 * sum(dy (x - mean))/n)
//        * invstd * weight.
// weight's and bias's gradients stay this rank's (the boundary all-reduce
// sums them). The running statistics move by momentum 0.1 towards the
// global mean and the unbiased global variance, the same on every rank.
// So W ranks at micro-batch m with K micro-steps equal one rank at
// micro-batch W*m with K micro-steps (tests/e2e/sync_bn.sh: weights and
// running statistics), at the cost of two small blocking all-reduces per
// batch-norm per micro-step (three with a checkpointed stage's
// recomputation), counted as syncbn_calls/syncbn_bytes, not in the
// gradient's allreduce_*. The sums run on the thread that runs forward and,
// on a CPU, backward (autograd runs CPU backward on the caller's thread),
// interleaved with the gradient buckets' asynchronous all-reduces in the
// order of the graph, which is the same on every rank; they are float64 and
// small, so never on the shared-memory path (float32, >= 64 KiB).
//
// What the pairing of collectives needs (src/train/loop/window.cpp,
// planning.cpp): every rank runs the same number of micro-steps in every
// window (each rank's share cut into ceil(ceil(n / W) / m) near-equal
// micro-batches; a rank whose share of a short last window is empty runs
// empty micro-steps that contribute zeros); the planner's probes run with
// local statistics through the same code (local_batch_norm_sync: the
// same memory, no collective); an out-of-memory error ends the run instead
// of replaying the window at a smaller micro-batch (Note [OOM recovery]: a
// replay re-splits one rank's share). With one rank nothing changes (no
// hook is set). Eval mode and frozen batch-norm use the running
// statistics, as before.

namespace {

struct SyncState : torch::CustomClassHolder {
  BatchNormSync sync;
  at::Tensor running_mean, running_var, num_batches_tracked;
  bool update = false;
  double momentum = 0.1;
  double eps = 1e-5;
};

// All dimensions but the channels'.
std::vector<int64_t> reduce_dims(const at::Tensor& x) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < x.dim(); ++d)
    dims.push_back(d);
  return dims;
}

// (1, C, 1, ...): a per-channel vector broadcast over x.
std::vector<int64_t> channel_shape(const at::Tensor& x) {
  std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
  shape[1] = x.size(1);
  return shape;
}

struct SyncBatchNormFunction
    : public torch::autograd::Function<SyncBatchNormFunction> {
  static torch::Tensor forward(
      torch::autograd::AutogradContext* ctx,
      torch::Tensor x,
      torch::Tensor weight,
      torch::Tensor bias,
      c10::intrusive_ptr<SyncState> s) {
    const int64_t C = x.size(1);
    const std::vector<int64_t> dims = reduce_dims(x);
    const int64_t local = x.numel() / C;
    // [count, per-channel sums, per-channel sums of squares], float64.
    at::Tensor stats =
        torch::zeros({2 * C + 1}, x.options().dtype(at::kDouble));
    if (local > 0) {
      const auto vm = at::var_mean(x, dims, /*unbiased=*/false, false);
      const at::Tensor var = std::get<0>(vm).to(at::kDouble);
      const at::Tensor mean = std::get<1>(vm).to(at::kDouble);
      const double count = static_cast<double>(local);
      stats.narrow(0, 0, 1).fill_(count);
      stats.narrow(0, 1, C).copy_(mean * count);
      stats.narrow(0, 1 + C, C).copy_((var + mean * mean) * count);
    }
    s->sync(stats);
    // The count stays on the device (Note [One host read per window]):
    // with more than one value here the sum has more; only a rank with at
    // most one reads it to check (after `sync`, which waited on the host).
    const at::Tensor n = stats.narrow(0, 0, 1);
    if (local <= 1) {
      const double total = read_to_host(n)[0];
      MT_CHECK(
          total > 1,
          "batch-norm in training mode needs more than one value per "
          "channel, but the micro-batches (of every rank, with "
          "model.sync_bn) hold ",
          total,
          " (input size ",
          x.sizes(),
          " on this rank); use a larger data.batch_size or larger images");
    }
    const at::Tensor mean64 = stats.narrow(0, 1, C) / n;
    const at::Tensor var64 =
        (stats.narrow(0, 1 + C, C) / n - mean64 * mean64).clamp_min(0.0);
    const at::Tensor mean = mean64.to(at::kFloat);
    const at::Tensor invstd = (var64 + s->eps).rsqrt().to(at::kFloat);
    if (s->update) {
      torch::NoGradGuard no_grad;
      const double m = s->momentum;
      s->running_mean.mul_(1.0 - m).add_(mean, m);
      s->running_var.mul_(1.0 - m).add_(
          (var64 * (n / (n - 1))).to(at::kFloat), m);
      if (s->num_batches_tracked.defined())
        s->num_batches_tracked.add_(1);
    }
    // As LibTorch's CPU kernel: y = x * alpha + beta.
    const at::Tensor alpha = invstd * weight;
    const at::Tensor beta = bias - mean * alpha;
    const std::vector<int64_t> shape = channel_shape(x);
    ctx->save_for_backward({x, weight});
    ctx->saved_data["mean"] = mean;
    ctx->saved_data["invstd"] = invstd;
    ctx->saved_data["n"] = n;  // (1,), float64, on the device
    ctx->saved_data["state"] = c10::IValue::make_capsule(s);
    return torch::addcmul(beta.view(shape), x, alpha.view(shape));
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor mean = ctx->saved_data["mean"].toTensor();
    const at::Tensor invstd = ctx->saved_data["invstd"].toTensor();
    const at::Tensor n = ctx->saved_data["n"].toTensor();
    auto s = c10::static_intrusive_pointer_cast<SyncState>(
        ctx->saved_data["state"].toCapsule());
    const int64_t C = x.size(1);
    const std::vector<int64_t> dims = reduce_dims(x);
    const std::vector<int64_t> shape = channel_shape(x);
    at::Tensor dy = grad_out[0];
    if (!dy.defined())
      dy = torch::zeros_like(x);
    // [per-channel sums of dy, of dy * (x - mean)], float64: every rank
    // takes part, an empty micro-batch with zeros.
    at::Tensor sums = torch::zeros({2 * C}, x.options().dtype(at::kDouble));
    at::Tensor xmu, sum_dy, sum_dy_xmu;
    if (x.numel() > 0) {
      xmu = x - mean.view(shape);
      sum_dy = dy.sum(dims);
      sum_dy_xmu = (dy * xmu).sum(dims);
      sums.narrow(0, 0, C).copy_(sum_dy);
      sums.narrow(0, C, C).copy_(sum_dy_xmu);
    } else {
      sum_dy = torch::zeros({C}, x.options());
      sum_dy_xmu = torch::zeros({C}, x.options());
    }
    s->sync(sums);
    at::Tensor dx;
    if (ctx->needs_input_grad(0)) {
      if (x.numel() > 0) {
        const at::Tensor mean_dy = (sums.narrow(0, 0, C) / n).to(at::kFloat);
        const at::Tensor mean_dy_xmu =
            (sums.narrow(0, C, C) / n).to(at::kFloat);
        dx = (dy - mean_dy.view(shape) -
              xmu * (invstd * invstd * mean_dy_xmu).view(shape)) *
             (invstd * weight).view(shape);
      } else {
        dx = torch::zeros_like(x);
      }
    }
    at::Tensor dweight, dbias;
    if (ctx->needs_input_grad(1))
      dweight = sum_dy_xmu * invstd;
    if (ctx->needs_input_grad(2))
      dbias = sum_dy;
    return {dx, dweight, dbias, at::Tensor()};
  }
};

}  // namespace

BatchNormSync local_batch_norm_sync() {
  return [](at::Tensor&) {};
}

at::Tensor sync_batch_norm(
    const at::Tensor& x,
    const at::Tensor& weight,
    const at::Tensor& bias,
    const at::Tensor& running_mean,
    const at::Tensor& running_var,
    const at::Tensor& num_batches_tracked,
    bool update,
    double momentum,
    double eps,
    const BatchNormSync& sync) {
  MT_INTERNAL_ASSERT(
      sync && x.dim() >= 2 && x.size(1) > 0 && x.scalar_type() == at::kFloat &&
          weight.defined() && bias.defined(),
      "sync_batch_norm: float32 (N, C, ...) input, affine, and a sync hook");
  auto s = c10::make_intrusive<SyncState>();
  s->sync = sync;
  s->running_mean = running_mean;
  s->running_var = running_var;
  s->num_batches_tracked = num_batches_tracked;
  s->update = update && running_mean.defined() && running_var.defined();
  s->momentum = momentum;
  s->eps = eps;
  return SyncBatchNormFunction::apply(x, weight, bias, s);
}

}  // namespace memtrain
