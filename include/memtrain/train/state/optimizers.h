#pragma once
// training.optimizer's SGD and AdamW, stepping every parameter of a group
// at once (Note [Multi-tensor optimizers] in src/train/state/optimizers.cpp).
// They are LibTorch's own classes with step() replaced: the same options,
// the same per-parameter state (SGDParamState, AdamWParamState) and so the
// same archive, byte for byte: checkpoints written before them resume.
// step() spends the gradients: it keeps its intermediates in them.

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <vector>

namespace memtrain {

// How a step runs: _foreach_* operations over the whole group (every
// LibTorch), or LibTorch's fused SGD/AdamW kernels (LibTorch >= 2.4, the
// CUDA build's).
enum class StepKernel { kForeach, kFused };

// Whether this build's LibTorch has the fused kernels.
bool have_fused_kernels();

// The kernel a run's optimizer uses: fused for CUDA parameters where the
// build has it, else foreach.
StepKernel step_kernel_for(const c10::Device& device);

// The gradients of `params` that are defined, in order.
std::vector<at::Tensor> gradients_of(const std::vector<at::Tensor>& params);

// training.grad_clip_norm: scales the gradients of `params` so that their
// total 2-norm is at most max_norm (coefficient max_norm / (norm + 1e-6),
// at most 1), as torch::nn::utils::clip_grad_norm_ does, without reading
// the norm on the host: _foreach_norm, and the coefficient applied on the
// device. Returns the total norm, a 0-d tensor on the gradients' device
// (undefined when no parameter has a gradient).
at::Tensor clip_gradients(
    const std::vector<at::Tensor>& params, double max_norm);

// LibTorch's optimizer Base (with its Options) whose step() runs over a
// whole group at once with `kernel`.
template <class Base, class Options>
class MultiTensor : public Base {
 public:
  MultiTensor(
      const std::vector<at::Tensor>& params,
      const Options& options,
      StepKernel kernel);
  at::Tensor step(typename Base::LossClosure closure = nullptr) override;

 private:
  // One group's step: its parameters that have a gradient, and those.
  void step_group(
      const Options& o,
      std::vector<at::Tensor>& params,
      std::vector<at::Tensor>& grads);
  StepKernel kernel_;
};

using MultiTensorSGD = MultiTensor<torch::optim::SGD, torch::optim::SGDOptions>;
using MultiTensorAdamW =
    MultiTensor<torch::optim::AdamW, torch::optim::AdamWOptions>;

template <>
void MultiTensorSGD::step_group(
    const torch::optim::SGDOptions& o,
    std::vector<at::Tensor>& params,
    std::vector<at::Tensor>& grads);
template <>
void MultiTensorAdamW::step_group(
    const torch::optim::AdamWOptions& o,
    std::vector<at::Tensor>& params,
    std::vector<at::Tensor>& grads);

extern template class MultiTensor<torch::optim::SGD, torch::optim::SGDOptions>;
extern template class MultiTensor<
    torch::optim::AdamW,
    torch::optim::AdamWOptions>;

}  // namespace memtrain
