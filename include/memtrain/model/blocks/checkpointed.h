#pragma once
// Activation checkpointing as an autograd node of its own (LibTorch's C++ API
// has none; PyTorch issue 52744). See Note [Checkpointing] in
// checkpointed.cpp.

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <functional>
#include <variant>
#include <vector>

#include "memtrain/compat.h"
#include "memtrain/util/error.h"

namespace memtrain {

using Segment = std::function<at::Tensor(const at::Tensor&)>;

// What a checkpointed segment's backward recomputes (Note [Selective
// recompute] in checkpointed.cpp). kAll: everything, only the inputs are
// kept. kSelective: the outputs of its kept_conv() and kept_linear() calls
// (its matrix products) are kept through the forward too, and backward
// recomputes only what lies between them (normalisation, activations,
// additions, pooling, attention's softmax). kAllOffload: as kAll,
// and the inputs wait in the host pool (memory/host_pool.h,
// memory::offload_pool()) from the forward to the backward, out of device
// memory (Note [Host offload]).
enum class Recompute { kAll, kSelective, kAllOffload };

// Returns segment(x) without keeping the segment's activations: only `x` is
// saved. In backward, the segment runs again with the RNG state (so dropout
// draws the same mask) and the autocast state of the forward, and the
// gradient flows through the recomputation; parameters used inside the
// segment get their gradients then. `segment` must be a pure function of `x`
// and parameters; it is kept alive until backward.
at::Tensor checkpoint(
    Segment segment, const at::Tensor& x, Recompute mode = Recompute::kAll);

// The same for a segment of several inputs (all saved; the gradient flows
// to each that requires it), e.g. a U-Net decoder block of the upsampled
// tensor and the skip connection.
using SegmentN = std::function<at::Tensor(const std::vector<at::Tensor>&)>;
at::Tensor checkpoint(
    SegmentN segment,
    const std::vector<at::Tensor>& xs,
    Recompute mode = Recompute::kAll);

// A convolution (torch::conv1d/2d/3d of these arguments, zero padding) that
// a selective checkpoint keeps: inside one's forward its output is kept, and
// in its recomputation that output is handed back, with a gradient node of
// the convolution's own backward (at::convolution_backward of the same
// arguments, so the gradients are those of torch::convNd bit for bit).
// Elsewhere it is torch::convNd.
at::Tensor kept_conv(
    const at::Tensor& x,
    const at::Tensor& weight,
    const at::Tensor& bias,
    c10::IntArrayRef stride,
    c10::IntArrayRef padding,
    c10::IntArrayRef dilation,
    int64_t groups);

// A sum of convolutions of the same arguments, conv(x0, w0, b0) +
// conv(x1, w1, b1) + ..., added in that order in place on the first (the
// U-Net decoder's conv1 on the two parts of its input, Note [U-Net decoder
// input]), kept by a selective checkpoint as one output. Its gradients are
// those of the convolutions and in-place additions bit for bit.
struct ConvTerm {
  at::Tensor x, weight, bias;  // bias may be undefined
};
at::Tensor kept_conv_sum(
    const std::vector<ConvTerm>& terms,
    c10::IntArrayRef stride,
    c10::IntArrayRef padding,
    c10::IntArrayRef dilation,
    int64_t groups);

// The same for a torch::nn::Conv1d/2d/3d module with numeric zero padding
// (what memtrain's models build).
template <typename ConvHolder>
at::Tensor kept_conv(ConvHolder& conv, const at::Tensor& x) {
  const auto& o = conv->options;
  MT_INTERNAL_ASSERT(
      o.padding().index() == 0 && o.padding_mode().index() == 0,
      "kept_conv: numeric zero padding only");
  return kept_conv(
      x,
      conv->weight,
      conv->bias,
      c10::IntArrayRef(o.stride()),
      c10::IntArrayRef(compat::variant_get<0>(o.padding())),
      c10::IntArrayRef(o.dilation()),
      o.groups());
}

// A linear map, x W^T + b over x's last axis (what torch::linear
// computes), that a selective checkpoint keeps, as kept_conv keeps a
// convolution. It is always computed in one form, the same inside and
// outside a checkpoint: x flattened to rows, at::addmm(b, x, W^T) (or
// at::mm without a bias), the rows viewed back; in a recomputation its
// kept output comes back with a node of addmm's own backward formulas
// (Note [Kept matrix products]), so the gradients are those of no
// checkpointing bit for bit. `bias` may be undefined.
at::Tensor kept_linear(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

// The same for a torch::nn::Linear module.
template <typename LinearHolder>
at::Tensor kept_linear(LinearHolder& linear, const at::Tensor& x) {
  return kept_linear(x, linear->weight, linear->bias);
}

// Attention, softmax(q k^T * scale + bias) v (compat::attention's
// arguments), whose output a selective checkpoint keeps where the
// attention gives what its backward needs, so that a recomputation runs
// no attention forward: on LibTorch 1.13, and on the CPU with a bias on
// 2.x (which LibTorch's CPU flash kernel does not take), it is
// blocked_attention (blocked_attention.h; the output and its softmax's
// log-denominators kept); otherwise compat::attention, LibTorch's
// scaled_dot_product_attention, whose fused kernel's output and
// log-sum-exp a selective checkpoint keeps where fused_attention.h can
// run its backward from them (Note [Kept fused attention]) and otherwise
// recomputes like the cheap ops.
at::Tensor kept_attention(
    const at::Tensor& q,
    const at::Tensor& k,
    const at::Tensor& v,
    const at::Tensor& bias,
    double scale,
    bool causal = false);

// Whether a selective checkpoint's forward or recomputation is running on
// this thread: a segment must then not modify a kept output in place
// (the kept tensor would change with it).
bool keeping_outputs();

}  // namespace memtrain
