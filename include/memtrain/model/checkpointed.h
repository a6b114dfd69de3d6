#pragma once
// Activation checkpointing as an autograd node of its own (LibTorch's C++ API
// has none; PyTorch issue 52744). See Note [Checkpointing] in
// checkpointed.cpp.

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace memtrain {

using Segment = std::function<at::Tensor(const at::Tensor&)>;

// Returns segment(x) without keeping the segment's activations: only `x` is
// saved. In backward, the segment runs again with the RNG state (so dropout
// draws the same mask) and the autocast state of the forward, and the
// gradient flows through the recomputation; parameters used inside the
// segment get their gradients then. `segment` must be a pure function of `x`
// and parameters; it is kept alive until backward.
at::Tensor checkpoint(Segment segment, const at::Tensor& x);

// The same for a segment of several inputs (all saved; the gradient flows
// to each that requires it), e.g. a U-Net decoder block of the upsampled
// tensor and the skip connection.
using SegmentN = std::function<at::Tensor(const std::vector<at::Tensor>&)>;
at::Tensor checkpoint(SegmentN segment, const std::vector<at::Tensor>& xs);

}  // namespace memtrain
