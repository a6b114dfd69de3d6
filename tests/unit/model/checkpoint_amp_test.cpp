// Activation checkpointing (gradients equal with and without, RNG and
// autocast replayed, peak memory down) and the fp16 loss scaler's logic.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "memtrain/compat.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/model/blocks/checkpointed.h"
#include "memtrain/model/models.h"
#include "memtrain/model/registry.h"
#include "memtrain/train/state/loss_scaler.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace {

struct Grads {
  std::vector<torch::Tensor> g;
  int64_t peak = 0;
};

// Forward + backward of `model` on a fixed batch, with `segments`
// checkpointed, under bf16 autocast if asked. Returns the gradients and the
// device-domain peak of the step (parameters excluded: they are allocated
// before the peak is reset).
Grads step(
    Classifier& model,
    const torch::Tensor& x,
    const torch::Tensor& y,
    int64_t segments,
    bool bf16,
    uint64_t rng_seed = 7) {
  model.set_checkpointed(segments);
  model.zero_grad();
  torch::manual_seed(rng_seed);  // the same dropout masks in every run
  memory::release_cache();
  memory::reset_peak();
  Grads out;
  {
    memory::DeviceScope device;
    torch::Tensor logits;
    {
      compat::AutocastGuard amp(bf16, /*cuda=*/false, torch::kBFloat16);
      logits = model.forward(x);
    }
    torch::nn::functional::cross_entropy(logits.to(torch::kFloat32), y)
        .backward();
    out.peak = memory::stats().peak_allocated;
    for (const auto& p : model.parameters())
      out.g.push_back(p.grad().clone());
    model.zero_grad();
  }
  return out;
}

double max_diff(const Grads& a, const Grads& b) {
  double m = 0;
  for (size_t i = 0; i < a.g.size(); ++i) {
    m = std::max(m, (a.g[i] - b.g[i]).abs().max().item<double>());
  }
  return m;
}

std::shared_ptr<Classifier> mlp(int64_t depth, int64_t hidden, double dropout) {
  ModelConfig c;
  c.name = ModelName::kMlp;
  c.depth = depth;
  c.hidden = hidden;
  c.dropout = dropout;
  c.norm = Norm::kGroup;
  return make_model(c, {SampleKind::kFeatures, {16}, 4});
}

TEST(Checkpointing, GradientsEqualWithDropoutReplayed) {
  auto model = mlp(4, 32, 0.3);
  torch::manual_seed(1);
  const torch::Tensor x = torch::randn({64, 16});
  const torch::Tensor y = torch::randint(0, 4, {64});
  const Grads off = step(*model, x, y, 0, false);
  const Grads all = step(*model, x, y, 4, false);
  const Grads two = step(*model, x, y, 2, false);
  EXPECT_LT(max_diff(off, all), 1e-6);
  EXPECT_LT(max_diff(off, two), 1e-6);
  // The test can fail: other dropout masks give other gradients.
  const Grads other = step(*model, x, y, 4, false, /*rng_seed=*/8);
  EXPECT_GT(max_diff(off, other), 1e-3);
}

TEST(Checkpointing, CnnStagesGradientsEqual) {
  ModelConfig c;
  c.name = ModelName::kCnn;
  c.hidden = 4;
  c.depth = 3;
  auto model = make_model(c, {SampleKind::kImages, {2, 16, 16}, 3});
  torch::manual_seed(2);
  const torch::Tensor x = torch::randn({8, 2, 16, 16});
  const torch::Tensor y = torch::randint(0, 3, {8});
  EXPECT_LT(
      max_diff(step(*model, x, y, 0, false), step(*model, x, y, 3, false)),
      1e-6);
}

TEST(Checkpointing, AutocastStateIsReplayedInRecompute) {
  auto model = mlp(3, 32, 0.0);
  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({32, 16});
  const torch::Tensor y = torch::randint(0, 4, {32});
  const Grads bf16_off = step(*model, x, y, 0, true);
  const Grads bf16_all = step(*model, x, y, 3, true);
  const Grads fp32 = step(*model, x, y, 0, false);
  // Recomputed in bf16 as the forward was: the same gradients.
  EXPECT_LT(max_diff(bf16_off, bf16_all), 1e-6);
  // ... and bf16 really differs from fp32, so the check means something.
  EXPECT_GT(max_diff(bf16_off, fp32), 1e-5);
}

// With weight updates between steps: casts made during a recompute must not
// outlive the step (autocast caches down-cast weights inside a region).
TEST(Checkpointing, Bf16WithUpdatesMatchesUncheckpointed) {
  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({32, 16});
  const torch::Tensor y = torch::randint(0, 4, {32});
  std::vector<Grads> runs;
  for (int64_t segments : {0, 3}) {
    auto model = mlp(3, 32, 0.0);
    Grads g;
    for (int s = 0; s < 3; ++s) {
      g = step(*model, x, y, segments, true);
      torch::NoGradGuard no_grad;
      auto params = model->parameters();
      for (size_t i = 0; i < params.size(); ++i)
        params[i] -= 0.5 * g.g[i];
    }
    runs.push_back(g);
  }
  EXPECT_LT(max_diff(runs[0], runs[1]), 1e-6);
}

TEST(Checkpointing, DeepModelPeakFallsByMoreThan40Percent) {
  auto model = mlp(16, 64, 0.0);
  torch::manual_seed(4);
  const torch::Tensor x = torch::randn({1024, 16});
  const torch::Tensor y = torch::randint(0, 4, {1024});
  const Grads off = step(*model, x, y, 0, false);
  const Grads all = step(*model, x, y, 16, false);
  EXPECT_LT(max_diff(off, all), 1e-6);
  const double ratio = static_cast<double>(all.peak) / off.peak;
  std::printf(
      "checkpointing all/off peak: %ld / %ld = %.3f\n",
      (long)all.peak,
      (long)off.peak,
      ratio);
  EXPECT_LE(ratio, 0.6);
}

// Note [Checkpoint gradient lifetime]: backward through a checkpointed
// relu(3x) holds, besides x and x's gradient, at most two tensors of x's size
// at once (the recomputed relu output with the incoming gradient, then the
// relu's gradient with x's): the incoming gradient is not kept for the
// whole inner backward. A torch::autograd::Function kept it (3 at once).
TEST(Checkpointing, IncomingGradientIsFreedDuringTheInnerBackward) {
  const int64_t n = 1 << 20;
  const int64_t t = n * 4;  // bytes of one tensor of x's size
  memory::release_cache();
  memory::DeviceScope device;
  const torch::Tensor x = torch::randn({n}).requires_grad_();
  const torch::Tensor c = torch::randn({n});
  torch::Tensor y =
      checkpoint([](const torch::Tensor& v) { return torch::relu(v * 3); }, x);
  torch::Tensor loss = (y * c).sum();
  y.reset();
  const int64_t before = memory::stats().allocated;
  memory::reset_peak();
  loss.backward();
  const int64_t peak = memory::stats().peak_allocated - before;
  std::printf("backward peak %.2f tensors of x's size\n", double(peak) / t);
  EXPECT_LE(peak, 3 * t + 4096);  // x.grad and two working tensors
  EXPECT_TRUE(torch::allclose(x.grad(), 3 * c * (x > 0).to(torch::kFloat)));
}

TEST(Checkpointing, SegmentReturningItsInputOrAnUnusedOutput) {
  const torch::Tensor x = torch::randn({5}).requires_grad_();
  // The input itself comes back as a copy with a history of its own: x's
  // history is untouched and the gradient flows through.
  const torch::Tensor same =
      checkpoint([](const torch::Tensor& v) { return v; }, x);
  EXPECT_FALSE(same.is_same(x));
  EXPECT_TRUE(x.is_leaf());
  (same * 2).sum().backward();
  EXPECT_TRUE(torch::allclose(x.grad(), torch::full({5}, 2.0f)));
  // Of two checkpointed outputs only one passes a gradient back: b reaches
  // the loss through a segment that cuts it (its recomputation detaches), so
  // b's node is called with an undefined gradient and gives none, no error.
  x.mutable_grad().reset();
  const torch::Tensor a =
      checkpoint([](const torch::Tensor& v) { return v * 2; }, x);
  const torch::Tensor b =
      checkpoint([](const torch::Tensor& v) { return v * 5; }, x);
  const torch::Tensor cut =
      checkpoint([](const torch::Tensor& v) { return v.detach() * 0; }, b);
  (a.sum() + cut.sum()).backward();
  EXPECT_TRUE(torch::allclose(x.grad(), torch::full({5}, 2.0f)));
}

TEST(Checkpointing, SecondBackwardIsRefusedByName) {
  const torch::Tensor x = torch::randn({5}).requires_grad_();
  const torch::Tensor y =
      checkpoint([](const torch::Tensor& v) { return v.exp(); }, x);
  const torch::Tensor loss = y.sum();
  loss.backward({}, /*retain_graph=*/true);
  try {
    loss.backward();
    FAIL() << "a second backward through a checkpoint ran";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("a second time"), std::string::npos)
        << e.what();
  }
}

TEST(LossScaler, SkipsAndBacksOffOnOverflowThenGrows) {
  LossScaler s(true, 1024.0, /*growth_interval=*/2);
  torch::Tensor p = torch::zeros({3}, torch::requires_grad());
  // unscale() flags on the device; the window reads the flag with its
  // totals.
  auto unscale_and_check = [&](LossScaler& scaler) {
    const at::Tensor found = torch::zeros({1});
    scaler.unscale({p}, found);
    return found.item<float>() == 0.0f;
  };
  p.mutable_grad() = torch::tensor({2048.0f, -512.0f, 0.0f});
  EXPECT_TRUE(unscale_and_check(s));
  EXPECT_TRUE(torch::equal(p.grad(), torch::tensor({2.0f, -0.5f, 0.0f})));
  s.update(true);
  EXPECT_EQ(s.scale(), 1024.0);
  p.mutable_grad() = torch::tensor({1.0f, INFINITY, 0.0f});
  EXPECT_FALSE(unscale_and_check(s));
  s.update(false);
  EXPECT_EQ(s.scale(), 512.0);
  EXPECT_EQ(s.skipped_steps(), 1);
  p.mutable_grad() = torch::tensor({NAN, 1.0f, 0.0f});
  EXPECT_FALSE(unscale_and_check(s));
  s.update(false);
  EXPECT_EQ(s.scale(), 256.0);
  for (int i = 0; i < 2; ++i) {
    p.mutable_grad() = torch::ones({3});
    EXPECT_TRUE(unscale_and_check(s));
    s.update(true);
  }
  EXPECT_EQ(s.scale(), 512.0);  // two finite steps in a row: grows
  LossScaler off(false, 1024.0, 2);
  EXPECT_EQ(off.scale(), 1.0);
  p.mutable_grad() = torch::tensor({INFINITY, 1.0f, 0.0f});
  EXPECT_TRUE(unscale_and_check(off));  // disabled: no check (bf16, fp32)
}

// Warns in its backward.
struct WarnInBackward : torch::autograd::Function<WarnInBackward> {
  static torch::Tensor forward(
      torch::autograd::AutogradContext* /*ctx*/, const torch::Tensor& t) {
    return t.clone();
  }
  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* /*ctx*/,
      torch::autograd::variable_list g) {
    TORCH_WARN("memtrain test warning in backward");
    return {g[0]};
  }
};

// training.deterministic's warnings: an op without a deterministic
// algorithm warns at every call; after print_warnings_once each distinct
// message is printed once, also when raised in backward (autograd replays
// backward's warnings on the thread that called it).
TEST(Warnings, EachDistinctOnePrintedOnce) {
  compat::print_warnings_once();
  testing::internal::CaptureStderr();
  for (int i = 0; i < 3; ++i) {
    TORCH_WARN("memtrain test warning A");
    TORCH_WARN("memtrain test warning B");
  }
  const torch::Tensor x = torch::ones({2}, torch::requires_grad());
  for (int i = 0; i < 3; ++i)
    WarnInBackward::apply(x).sum().backward();
  const std::string err = testing::internal::GetCapturedStderr();
  auto count = [&](const std::string& s) {
    size_t n = 0;
    for (size_t at = err.find(s); at != std::string::npos;
         at = err.find(s, at + 1))
      ++n;
    return n;
  };
  EXPECT_EQ(
      count("memtrain: warning (printed once): memtrain test warning A"), 1u)
      << err;
  EXPECT_EQ(count("memtrain test warning B"), 1u) << err;
  EXPECT_EQ(count("memtrain test warning in backward"), 1u) << err;
}

}  // namespace
}  // namespace memtrain
