#pragma once
// Synchronised batch-norm (model.sync_bn): training-mode batch-norm whose
// statistics are those of the union of every rank's concurrent
// micro-batch, as torch.nn.SyncBatchNorm under DDP. See Note [Batch-norm
// and data parallelism] in src/model/blocks/sync_batch_norm.cpp.
//
// The model layer does not talk to dist/: it gets a BatchNormSync, a
// function that sums a small tensor over the ranks in place (the trainer
// passes Communicator::all_reduce_batch_norm). It is a collective: every
// rank must call it the same number of times, in the same order, with
// tensors of the same shape and dtype.

#include <ATen/core/Tensor.h>

#include <functional>

namespace memtrain {

// Sums `t` (a small float64 tensor on the input's device) over the ranks,
// in place. Empty: no synchronisation (each micro-batch's own statistics).
using BatchNormSync = std::function<void(at::Tensor& t)>;

// A BatchNormSync that sums over one rank: does nothing. With it
// sync_batch_norm computes each micro-batch's own statistics through the
// same code (the planner's probes: local, and the same memory).
BatchNormSync local_batch_norm_sync();

// Batch-norm of x (N, C, ...) float32 in training mode, with statistics
// over every rank's concurrent x: per channel, the count, sum and sum of
// squares ([2C + 1] float64) go through `sync` once in forward; in
// backward the per-channel sums of grad_out and grad_out * (x - mean)
// ([2C] float64) go through it once, and the input's gradient is computed
// from the global sums (SyncBatchNorm's backward). weight's and bias's
// gradients are this rank's own sums (the gradient all-reduce adds the
// ranks'). With `update`, running_mean and running_var move towards the
// global mean and the unbiased global variance by `momentum`, and
// num_batches_tracked (when defined) counts one more batch. A rank whose
// x has N = 0 takes part with zeros. Throws memtrain::Error when the ranks'
// micro-batches hold at most one value per channel together.
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
    const BatchNormSync& sync);

}  // namespace memtrain
