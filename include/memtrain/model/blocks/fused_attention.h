#pragma once
// LibTorch 2.x's fused attention kernels called as
// scaled_dot_product_attention calls them, with what their backward needs
// kept, so that a selective checkpoint keeps a fused attention's output
// instead of recomputing it (Note [Kept fused attention] in
// fused_attention.cpp). The autograd node that uses it is kept_attention()
// (checkpointed.h).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace memtrain {

// A fused kernel's forward: its output (scaled_dot_product_attention's)
// and what its backward needs besides q, k and v.
struct FusedAttentionForward {
  int64_t backend = 0;          // LibTorch's sdp::SDPBackend
  at::Tensor out;               // (..., L, E)
  std::vector<at::Tensor> aux;  // log-sum-exp; on CUDA the RNG seed, offset
};

// The forward of the kernel scaled_dot_product_attention(q, k, v, bias,
// 0, causal, scale) runs on these inputs with gradients, where its
// backward can run from what is kept: the CPU's flash kernel; on CUDA the
// flash kernel (head sizes a multiple of 8) and the memory-efficient one,
// without a bias. nullopt elsewhere (LibTorch 1.13, the math and cuDNN
// kernels, a bias on CUDA, inputs not in autocast's dtype): the caller
// computes the attention itself.
std::optional<FusedAttentionForward> fused_attention_forward(
    const at::Tensor& q,
    const at::Tensor& k,
    const at::Tensor& v,
    const at::Tensor& bias,
    double scale,
    bool causal);

// fwd.out as an autograd op whose backward is that kernel's own backward
// (what LibTorch's derivative of the kernel calls): the gradients of
// scaled_dot_product_attention bit for bit. It keeps q, k, v, the output
// and fwd.aux.
at::Tensor fused_attention(
    const at::Tensor& q,
    const at::Tensor& k,
    const at::Tensor& v,
    double scale,
    bool causal,
    FusedAttentionForward fwd);

}  // namespace memtrain
