#pragma once
// An attention for tests to compare memtrain's against: softmax(q k^T *
// scale + bias) v written out here, meant for float64 inputs, with
// autograd's own gradients. It shares no code with memtrain's attention
// (compat::attention, compat::attention_math, blocked and fused
// attention), so on LibTorch 1.13, where compat::attention is the math,
// a test against it still compares two paths.

#include <torch/torch.h>

#include <limits>
#include <vector>

namespace memtrain::test {

inline torch::Tensor reference_attention(
    const torch::Tensor& q,
    const torch::Tensor& k,
    const torch::Tensor& v,
    const torch::Tensor& bias,
    double scale,
    bool causal) {
  torch::Tensor s = torch::matmul(q, k.transpose(-2, -1)) * scale;
  if (bias.defined())
    s = s + bias;
  if (causal) {
    const int64_t l = q.size(-2);
    s = s.masked_fill(
        torch::ones({l, l}, torch::kBool).triu(1),
        -std::numeric_limits<double>::infinity());
  }
  return torch::matmul(torch::softmax(s, -1), v);
}

// `attend` (float32 q, k, v, bias: an undefined bias is none) against
// reference_attention of their float64 copies, forward and the gradients
// of every operand for the output gradient `g`: the largest absolute
// differences, the forward's first.
template <typename Attend>
std::vector<double> attention_error(
    Attend attend,
    const torch::Tensor& q,
    const torch::Tensor& k,
    const torch::Tensor& v,
    const torch::Tensor& bias,
    double scale,
    bool causal,
    const torch::Tensor& g) {
  std::vector<torch::Tensor> ins = {q, k, v};
  if (bias.defined())
    ins.push_back(bias);
  std::vector<torch::Tensor> ins32, ins64;
  for (const auto& t : ins) {
    ins32.push_back(t.detach().to(torch::kFloat32).requires_grad_());
    ins64.push_back(t.detach().to(torch::kFloat64).requires_grad_());
  }
  const torch::Tensor none;
  const torch::Tensor got =
      attend(ins32[0], ins32[1], ins32[2], bias.defined() ? ins32[3] : none);
  const torch::Tensor want = reference_attention(
      ins64[0],
      ins64[1],
      ins64[2],
      bias.defined() ? ins64[3] : none,
      scale,
      causal);
  const auto got_grads =
      torch::autograd::grad({got}, ins32, {g.to(torch::kFloat32)});
  const auto want_grads =
      torch::autograd::grad({want}, ins64, {g.to(torch::kFloat64)});
  const auto diff = [](const torch::Tensor& a, const torch::Tensor& b) {
    return (a.to(torch::kFloat64) - b).abs().max().item<double>();
  };
  std::vector<double> out = {diff(got, want)};
  for (size_t i = 0; i < ins.size(); ++i)
    out.push_back(diff(got_grads[i], want_grads[i]));
  return out;
}

}  // namespace memtrain::test
