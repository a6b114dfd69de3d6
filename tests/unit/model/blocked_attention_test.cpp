// Blocked attention (Note [Blocked attention]) and kept_attention: against
// an independent float64 softmax attention (reference_attention.h), forward and
// the gradients of q, k, v and the bias, in one block and in many; what it
// keeps for backward; and a selective checkpoint's handing back of its
// output.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "memtrain/compat.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/model/blocks/blocked_attention.h"
#include "memtrain/model/blocks/checkpointed.h"
#include "reference_attention.h"

namespace memtrain {
namespace {

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64))
      .abs()
      .max()
      .item<double>();
}

using test::reference_attention;

struct Case {
  std::string name;
  std::vector<int64_t> qshape;  // (..., L, E); k and v the same
  std::vector<int64_t> bias;    // empty: none
  bool causal = false;
};

// Forward and every gradient within 1e-6 of the float64 reference, whether
// the queries run in one block or in blocks of 1, 3 and 5 rows (the last
// one short).
TEST(BlockedAttention, AgreesWithAFloat64SoftmaxInAnyBlocks) {
  const std::vector<Case> cases = {
      {"plain", {2, 3, 11, 8}, {}, false},
      {"causal", {2, 3, 11, 8}, {}, true},
      {"bias per head", {2, 3, 11, 8}, {3, 11, 11}, false},
      {"bias per batch and head", {2, 3, 11, 8}, {2, 3, 11, 11}, false},
      {"bias over all queries", {2, 3, 11, 8}, {3, 1, 11}, false},
      {"one batch axis", {6, 11, 8}, {11, 11}, false},
  };
  for (const Case& c : cases) {
    torch::manual_seed(7);
    const torch::Tensor q64 = torch::randn(c.qshape, torch::kFloat64),
                        k64 = torch::randn(c.qshape, torch::kFloat64),
                        v64 = torch::randn(c.qshape, torch::kFloat64);
    const torch::Tensor b64 = c.bias.empty()
                                  ? torch::Tensor()
                                  : torch::randn(c.bias, torch::kFloat64);
    std::vector<torch::Tensor> ins64 = {q64, k64, v64};
    if (b64.defined())
      ins64.push_back(b64);
    for (auto& t : ins64)
      t.requires_grad_(true);
    const torch::Tensor want =
        reference_attention(q64, k64, v64, b64, 0.3, c.causal);
    const torch::Tensor g64 = torch::randn_like(want);
    const auto want_grads = torch::autograd::grad({want}, ins64, {g64});
    const torch::Tensor q = q64.detach().to(torch::kFloat32),
                        k = k64.detach().to(torch::kFloat32),
                        v = v64.detach().to(torch::kFloat32);
    const torch::Tensor b =
        b64.defined() ? b64.detach().to(torch::kFloat32) : torch::Tensor();
    const torch::Tensor g = g64.to(torch::kFloat32);
    for (const int64_t rows :
         {int64_t{11}, int64_t{1}, int64_t{3}, int64_t{5}}) {
      const AttentionRows fwd =
          blocked_attention_forward(q, k, v, b, 0.3, c.causal, rows);
      EXPECT_LE(max_diff(fwd.out, want), 1e-6) << c.name << " rows " << rows;
      const auto grads = blocked_attention_backward(
          g, q, k, v, b, fwd, 0.3, c.causal, rows, {true, true, true, true});
      for (size_t i = 0; i < want_grads.size(); ++i) {
        EXPECT_LE(max_diff(grads[i], want_grads[i]), 1e-5)
            << c.name << " rows " << rows << " operand " << i;
      }
      if (!b.defined()) {
        EXPECT_FALSE(grads[3].defined()) << c.name;
      }
    }
  }
}

// As an autograd op (blocked_attention, what kept_attention is on
// LibTorch 1.13): the same gradients through autograd.
TEST(BlockedAttention, AutogradOpGivesTheGradients) {
  torch::manual_seed(3);
  const torch::Tensor q = torch::randn({2, 2, 9, 4}, torch::requires_grad()),
                      k = torch::randn({2, 2, 9, 4}, torch::requires_grad()),
                      v = torch::randn({2, 2, 9, 4});
  const torch::Tensor y = blocked_attention(q, k, v, {}, 0.5, true);
  const torch::Tensor g = torch::randn_like(y);
  const auto got = torch::autograd::grad({y}, {q, k}, {g});
  const torch::Tensor q64 = q.detach().to(torch::kFloat64).requires_grad_(),
                      k64 = k.detach().to(torch::kFloat64).requires_grad_();
  const torch::Tensor want =
      reference_attention(q64, k64, v.to(torch::kFloat64), {}, 0.5, true);
  const auto want_grads =
      torch::autograd::grad({want}, {q64, k64}, {g.to(torch::kFloat64)});
  EXPECT_LE(max_diff(y, want), 1e-6);
  EXPECT_LE(max_diff(got[0], want_grads[0]), 1e-5);
  EXPECT_LE(max_diff(got[1], want_grads[1]), 1e-5);
}

// attention_math's arithmetic, a block at a time: the output within
// float32 rounding of it (the softmax as exp(s - lse), not exp(s - max) /
// sum), with a bias over windows and heads as SwinUNETR's.
TEST(BlockedAttention, AgreesWithTheWrittenOutMath) {
  torch::manual_seed(8);
  const torch::Tensor q = torch::randn({2, 6, 49, 8}),
                      k = torch::randn({2, 6, 49, 8}),
                      v = torch::randn({2, 6, 49, 8}),
                      bias = torch::randn({6, 49, 49});
  const torch::Tensor want = compat::attention_math(q, k, v, bias, 0.35);
  for (const int64_t rows : {int64_t{49}, int64_t{4}}) {
    const AttentionRows fwd =
        blocked_attention_forward(q, k, v, bias, 0.35, false, rows);
    EXPECT_LE(max_diff(fwd.out, want), 1e-6) << rows;
  }
}

// What stays from forward to backward is q, k, v, the output and lse, not
// the (.., L, L) scores: the bytes held after the forward, beyond the
// inputs, are the output's and lse's alone.
TEST(BlockedAttention, KeepsNoScoresForBackward) {
  torch::manual_seed(4);
  const torch::Tensor q = torch::randn({4, 2, 64, 8}, torch::requires_grad()),
                      k = torch::randn({4, 2, 64, 8}, torch::requires_grad()),
                      v = torch::randn({4, 2, 64, 8}, torch::requires_grad());
  memory::release_cache();
  memory::DeviceScope device;
  const int64_t before = memory::stats().allocated;
  torch::Tensor y = blocked_attention(q, k, v, {}, 0.3, false);
  const int64_t held = memory::stats().allocated - before;
  const int64_t out_bytes = y.numel() * 4, lse_bytes = 4 * 2 * 64 * 4;
  EXPECT_EQ(held, out_bytes + lse_bytes);
  EXPECT_LT(held, 4 * 2 * 64 * 64 * 4) << "less than one copy of the scores";
  y.sum().backward();
  EXPECT_TRUE(q.grad().defined() && k.grad().defined() && v.grad().defined());
}

// attention_block_rows: one block's float32 scores within
// kAttentionBlockBytes, at least one row, at most all of them.
TEST(BlockedAttention, BlockRowsKeepOneBlockWithinItsBytes) {
  const torch::Tensor q = torch::empty({1029, 343, 16});
  const int64_t rows = attention_block_rows(q, 343);
  EXPECT_LE(rows * 1029 * 343 * 4, kAttentionBlockBytes);
  EXPECT_GT((rows + 1) * 1029 * 343 * 4, kAttentionBlockBytes);
  EXPECT_EQ(attention_block_rows(torch::empty({2, 5, 8}), 5), 5);
  EXPECT_EQ(attention_block_rows(torch::empty({1 << 20, 4, 8}), 4096), 1);
}

// In a selective segment kept_attention's output comes back to the
// recomputation (on 1.13 with its lse: no attention forward runs again):
// output and gradients those of no checkpointing bit for bit.
TEST(BlockedAttention, KeptAttentionInASelectiveSegmentIsBitwise) {
  torch::manual_seed(9);
  const torch::Tensor bias = torch::randn({3, 10, 10}, torch::requires_grad());
  const auto segment = [&](const at::Tensor& x) {
    const torch::Tensor h = torch::tanh(x);
    return kept_attention(h, h * 0.5, h.cos(), bias, 0.4).sin();
  };
  const torch::Tensor x0 = torch::randn({2, 3, 10, 6});
  torch::Tensor out[2], gx[2], gb[2];
  for (int c = 0; c < 2; ++c) {
    bias.mutable_grad() = torch::Tensor();
    const torch::Tensor x = x0.clone().requires_grad_(true);
    out[c] =
        c == 0 ? segment(x) : checkpoint(segment, x, Recompute::kSelective);
    out[c].pow(2).sum().backward();
    gx[c] = x.grad().clone();
    gb[c] = bias.grad().clone();
  }
  EXPECT_TRUE(torch::equal(out[0], out[1]));
  EXPECT_TRUE(torch::equal(gx[0], gx[1]));
  EXPECT_TRUE(torch::equal(gb[0], gb[1]));
}

}  // namespace
}  // namespace memtrain
