#pragma once
// Attention in query blocks, forward and backward, in ATen ops (Note
// [Blocked attention] in blocked_attention.cpp): the written-out math of
// compat::attention_math without ever holding more than one block of
// scores, for LibTorch 1.13, which has no fused attention. The autograd
// node that uses it is kept_attention() (checkpointed.h).

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>

namespace memtrain {

// What backward needs besides the inputs: the output and, per query, the
// log of its softmax's denominator (float32, the inputs' shape with a
// last axis of 1).
struct AttentionRows {
  at::Tensor out, lse;
};

// Query rows per block for q (..., L, E) against S keys: a block's float32
// scores stay within kAttentionBlockBytes (at least one row).
constexpr int64_t kAttentionBlockBytes = int64_t{32} << 20;
int64_t attention_block_rows(const at::Tensor& q, int64_t keys);

// softmax(q k^T * scale + bias) v, as compat::attention_math computes it
// (the scores in q's dtype, the softmax in float32, cast to v's dtype),
// `rows` queries at a time. q, k, v: (..., L|S, E) with the same leading
// axes; bias: broadcastable to (..., L, S), or undefined; causal: query i
// sees keys <= i (not with a bias). Autocast is not applied inside: the
// inputs' dtypes are the computation's.
AttentionRows blocked_attention_forward(
    const at::Tensor& q,
    const at::Tensor& k,
    const at::Tensor& v,
    const at::Tensor& bias,
    double scale,
    bool causal,
    int64_t rows);

// The gradients of q, k, v and bias (undefined where `needed` is false or
// there is no bias) from the output's gradient `grad`, recomputing each
// block's probabilities from `lse`.
std::array<at::Tensor, 4> blocked_attention_backward(
    const at::Tensor& grad,
    const at::Tensor& q,
    const at::Tensor& k,
    const at::Tensor& v,
    const at::Tensor& bias,
    const AttentionRows& fwd,
    double scale,
    bool causal,
    int64_t rows,
    std::array<bool, 4> needed);

// blocked_attention_forward's output as an autograd op whose backward is
// blocked_attention_backward (it keeps q, k, v, the bias, the output and
// lse). `fwd`: that forward's result when it was already computed (a kept
// output handed back, checkpointed.cpp), otherwise computed here.
at::Tensor blocked_attention(
    const at::Tensor& q,
    const at::Tensor& k,
    const at::Tensor& v,
    const at::Tensor& bias,
    double scale,
    bool causal,
    AttentionRows fwd = {});

}  // namespace memtrain
