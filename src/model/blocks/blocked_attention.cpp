#include "memtrain/model/blocks/blocked_attention.h"

#include <ATen/ExpandUtils.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <string>

#include "memtrain/util/error.h"

namespace memtrain {

// Note [Blocked attention]
// LibTorch 1.13 has no fused attention: compat::attention_math writes
// softmax(q k^T * scale + bias) v out, and autograd then keeps the
// (..., L, S) probabilities of every attention call until backward --
// for SwinUNETR (windows x heads, 343, 343) floats per block; at 64³ every
// checkpointed tier peaked alike, in the first stage's recomputed
// attention (docs/benchmarks.md). Here the forward runs `rows` queries at a
// time (a block's float32 scores within kAttentionBlockBytes) and keeps, per
// query, the log of its softmax's denominator (lse); backward recomputes
// each block's probabilities as exp(s - lse) and takes the gradients as
// flash attention's backward does (dV = P^T dO; dS = P (dO V^T - D), D =
// rowsum(dO * O); dQ = dS K scale; dK = dS^T Q scale; the bias's gradient
// dS summed over its broadcast axes). What stays from forward to backward
// is q, k, v, the bias, the output and lse: no scores. The arithmetic is
// attention_math's -- scores in q's dtype, softmax in float32, cast to v's
// dtype for the product -- so the output agrees with it to float32
// rounding (the softmax as exp(s - lse) instead of exp(s - max) / sum),
// and both against a float64 reference (blocked_attention_test). Autocast is
// excluded inside: the inputs come in the dtypes autocast gave the
// projections that made them.

namespace {

// Autocast off for the node's own arithmetic (its inputs' dtypes rule).
struct NoAutocast {
  c10::impl::ExcludeDispatchKeyGuard guard{c10::autocast_dispatch_keyset};
  at::NoGradGuard no_grad;
};

// The bias rows of queries [i, i + r) (all of them when it broadcasts
// over the queries).
at::Tensor bias_rows(const at::Tensor& bias, int64_t i, int64_t r) {
  return bias.size(-2) == 1 ? bias : bias.narrow(-2, i, r);
}

// The float32 scores of queries [i, i + r): (q * scale) k^T + bias, or
// -inf above the diagonal when causal, as attention_math computes them.
at::Tensor block_scores(
    const at::Tensor& q,
    const at::Tensor& kt,
    const at::Tensor& bias,
    double scale,
    bool causal,
    int64_t i,
    int64_t r) {
  at::Tensor s = at::matmul(q.narrow(-2, i, r) * scale, kt);
  if (bias.defined())
    s = s + bias_rows(bias, i, r).to(s.scalar_type());
  if (causal) {
    const int64_t keys = kt.size(-1);
    const auto opts = at::TensorOptions().dtype(at::kLong).device(q.device());
    s.masked_fill_(
        at::arange(keys, opts).gt(at::arange(i, i + r, opts).unsqueeze(1)),
        -std::numeric_limits<double>::infinity());
  }
  return s.to(at::kFloat);
}

void check_operands(
    const at::Tensor& q,
    const at::Tensor& k,
    const at::Tensor& v,
    const at::Tensor& bias,
    bool causal) {
  MT_INTERNAL_ASSERT(
      q.dim() >= 2 && k.dim() == q.dim() && v.dim() == q.dim() &&
          q.sizes().slice(0, q.dim() - 2) == k.sizes().slice(0, k.dim() - 2) &&
          k.sizes().slice(0, k.dim() - 1) == v.sizes().slice(0, v.dim() - 1) &&
          q.size(-1) == k.size(-1),
      "blocked attention: q ",
      q.sizes(),
      ", k ",
      k.sizes(),
      ", v ",
      v.sizes());
  MT_INTERNAL_ASSERT(
      !(causal && bias.defined()), "attention: a bias or causal, not both");
  MT_INTERNAL_ASSERT(
      !bias.defined() || (bias.dim() >= 2 &&
                          (bias.size(-2) == 1 || bias.size(-2) == q.size(-2))),
      "blocked attention: a bias of ",
      bias.sizes(),
      " for ",
      q.size(-2),
      " queries");
}

}  // namespace

int64_t attention_block_rows(const at::Tensor& q, int64_t keys) {
  const int64_t queries = q.size(-2);
  const int64_t batch =
      queries * q.size(-1) == 0 ? 0 : q.numel() / (queries * q.size(-1));
  const int64_t row_bytes = std::max<int64_t>(1, batch * keys * 4);
  return std::clamp<int64_t>(
      kAttentionBlockBytes / row_bytes, 1, std::max<int64_t>(1, queries));
}

AttentionRows blocked_attention_forward(
    const at::Tensor& q,
    const at::Tensor& k,
    const at::Tensor& v,
    const at::Tensor& bias,
    double scale,
    bool causal,
    int64_t rows) {
  check_operands(q, k, v, bias, causal);
  NoAutocast plain;
  const int64_t queries = q.size(-2);
  std::vector<int64_t> sizes = q.sizes().vec();
  sizes.back() = v.size(-1);
  AttentionRows fwd;
  fwd.out = at::empty(sizes, v.options());
  sizes.back() = 1;
  fwd.lse = at::empty(sizes, q.options().dtype(at::kFloat));
  const at::Tensor kt = k.transpose(-2, -1);
  for (int64_t i = 0; i < queries; i += rows) {
    const int64_t r = std::min(rows, queries - i);
    at::Tensor p = block_scores(q, kt, bias, scale, causal, i, r);
    const at::Tensor lse = at::logsumexp(p, -1, /*keepdim=*/true);
    p.sub_(lse).exp_();
    fwd.out.narrow(-2, i, r).copy_(at::matmul(p.to(v.scalar_type()), v));
    fwd.lse.narrow(-2, i, r).copy_(lse);
  }
  return fwd;
}

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
    std::array<bool, 4> needed) {
  NoAutocast plain;
  needed[3] = needed[3] && bias.defined();
  const bool scores = needed[0] || needed[1] || needed[3];
  const int64_t queries = q.size(-2);
  const at::Tensor g = grad.to(v.scalar_type());
  const auto f32 = q.options().dtype(at::kFloat);
  at::Tensor dq, dk, dv, dbias, d;
  if (needed[0])
    dq = at::empty(q.sizes(), q.options());
  if (needed[1])
    dk = at::zeros(k.sizes(), f32);
  if (needed[2])
    dv = at::zeros(v.sizes(), f32);
  if (needed[3]) {  // accumulated only when it is broadcast over queries
    dbias = bias.size(-2) == 1 ? at::zeros(bias.sizes(), f32)
                               : at::empty(bias.sizes(), bias.options());
  }
  if (scores)  // D = rowsum(dO * O)
    d = (g.to(at::kFloat) * fwd.out.to(at::kFloat)).sum(-1, /*keepdim=*/true);
  const at::Tensor kt = k.transpose(-2, -1), vt = v.transpose(-2, -1);
  for (int64_t i = 0; i < queries; i += rows) {
    const int64_t r = std::min(rows, queries - i);
    at::Tensor p = block_scores(q, kt, bias, scale, causal, i, r);
    p.sub_(fwd.lse.narrow(-2, i, r)).exp_();
    const at::Tensor gb = g.narrow(-2, i, r);
    if (needed[2])
      dv.add_(at::matmul(p.to(v.scalar_type()).transpose(-2, -1), gb));
    if (!scores)
      continue;
    at::Tensor ds = at::matmul(gb, vt).to(at::kFloat);
    ds.sub_(d.narrow(-2, i, r)).mul_(p);
    if (needed[3]) {
      const at::Tensor db = at::sum_to(ds, bias_rows(bias, i, r).sizes());
      if (bias.size(-2) == 1)
        dbias.add_(db);
      else
        dbias.narrow(-2, i, r).copy_(db);
    }
    const at::Tensor dsq = ds.to(q.scalar_type());
    if (needed[0])
      dq.narrow(-2, i, r).copy_(at::matmul(dsq, k).mul_(scale));
    if (needed[1]) {
      dk.add_(at::matmul(dsq.transpose(-2, -1), q.narrow(-2, i, r) * scale));
    }
  }
  return {
      dq,
      needed[1] ? dk.to(k.scalar_type()) : dk,
      needed[2] ? dv.to(v.scalar_type()) : dv,
      needed[3] ? dbias.to(bias.scalar_type()) : dbias};
}

namespace {

struct BlockedAttentionBackward : torch::autograd::Node {
  torch::autograd::SavedVariable q, k, v, bias, out;  // edges: q, k, v, bias
  at::Tensor lse;
  double scale = 1;
  bool causal = false;
  int64_t rows = 1;

  std::string name() const override {
    return "memtrain::BlockedAttentionBackward";
  }

  void release_variables() override {
    q.reset_data();
    k.reset_data();
    v.reset_data();
    bias.reset_data();
    out.reset_data();
    lse.reset();
  }

  torch::autograd::variable_list apply(
      torch::autograd::variable_list&& grads) override {
    torch::autograd::variable_list result(4);
    if (grads.empty() || !grads[0].defined())
      return result;
    MT_CHECK(
        !torch::GradMode::is_enabled(),
        "attention: a gradient of its gradient (create_graph) is not "
        "supported by the blocked attention");
    const std::shared_ptr<Node> self = shared_from_this();
    const AttentionRows fwd{out.unpack(self), lse};
    const auto g = blocked_attention_backward(
        grads[0],
        q.unpack(),
        k.unpack(),
        v.unpack(),
        bias.unpack(),
        fwd,
        scale,
        causal,
        rows,
        {should_compute_output(0),
         should_compute_output(1),
         should_compute_output(2),
         should_compute_output(3)});
    for (size_t i = 0; i < 4; ++i)
      result[i] = g[i];
    return result;
  }
};

}  // namespace

at::Tensor blocked_attention(
    const at::Tensor& q,
    const at::Tensor& k,
    const at::Tensor& v,
    const at::Tensor& bias,
    double scale,
    bool causal,
    AttentionRows fwd) {
  const int64_t rows = attention_block_rows(q, k.size(-2));
  if (!fwd.out.defined())
    fwd = blocked_attention_forward(q, k, v, bias, scale, causal, rows);
  const bool any = q.requires_grad() || k.requires_grad() ||
                   v.requires_grad() ||
                   (bias.defined() && bias.requires_grad());
  at::Tensor out = fwd.out.detach();
  if (!torch::GradMode::is_enabled() || !any)
    return out;
  auto node = std::shared_ptr<BlockedAttentionBackward>(
      new BlockedAttentionBackward(), torch::autograd::deleteNode);
  node->q = torch::autograd::SavedVariable(q, /*is_output=*/false);
  node->k = torch::autograd::SavedVariable(k, /*is_output=*/false);
  node->v = torch::autograd::SavedVariable(v, /*is_output=*/false);
  node->bias = torch::autograd::SavedVariable(bias, /*is_output=*/false);
  node->lse = fwd.lse;
  node->scale = scale;
  node->causal = causal;
  node->rows = rows;
  node->set_next_edges(torch::autograd::collect_next_edges(q, k, v, bias));
  torch::autograd::set_history(out, node);
  node->out = torch::autograd::SavedVariable(out, /*is_output=*/true);
  return out;
}

}  // namespace memtrain
