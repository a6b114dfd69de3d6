// The transformer block (model/blocks/transformer.h) and model.name=clip's
// structure (model/nets/clip.h); the logits against open_clip itself are
// tests/e2e/clip_open_clip.sh.

#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "memtrain/compat.h"
#include "memtrain/model/blocks/transformer.h"
#include "memtrain/model/nets/clip.h"
#include "memtrain/util/error.h"
#include "reference_attention.h"

using namespace memtrain;

namespace {

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

ModelInput clip_input(int64_t size, int64_t len) {
  ModelInput in;
  in.kind = SampleKind::kImages;
  in.sample_shape = {3, size, size};
  in.context_features = len;
  in.tokens = true;
  in.token_max = 49407;
  return in;
}

std::shared_ptr<ClipModel> tiny_clip() {
  ModelConfig cfg;
  cfg.name = ModelName::kClip;
  cfg.variant = "tiny";
  cfg.seed = 5;
  return make_clip(cfg, clip_input(32, 12));
}

// Token ids as /tokens holds them, read as float: start, ids, end, zeros.
torch::Tensor tokens(int64_t n, int64_t len) {
  torch::Tensor t = torch::zeros({n, len});
  for (int64_t i = 0; i < n; ++i) {
    const int64_t words = 1 + i % (len - 2);
    t[i][0] = 49406;
    t[i].narrow(0, 1, words).copy_(torch::randint(1, 49406, {words}));
    t[i][words + 1] = 49407;
  }
  return t;
}

}  // namespace

// compat::attention without a bias and causal, against an independent
// float64 attention (on LibTorch 2.x scaled_dot_product_attention; on 1.13
// the math), forward and backward, to fp32 rounding.
TEST(Transformer, AttentionAgreesWithAFloat64AttentionCausalAndUnbiased) {
  torch::manual_seed(1);
  for (bool causal : {false, true}) {
    const torch::Tensor q = torch::randn({3, 4, 13, 16}),
                        k = torch::randn({3, 4, 13, 16}),
                        v = torch::randn({3, 4, 13, 16}),
                        g = torch::randn({3, 4, 13, 16});
    const auto err = test::attention_error(
        [causal](const auto& q, const auto& k, const auto& v, const auto&) {
          return compat::attention(q, k, v, {}, 0.25, causal);
        },
        q,
        k,
        v,
        {},
        0.25,
        causal,
        g);
    for (size_t i = 0; i < err.size(); ++i)
      EXPECT_LE(err[i], 1e-5)
          << causal << (i == 0 ? " forward" : " gradient ") << i;
  }
}

// Causal: token i's output is the softmax over tokens 0..i alone, so
// changing the keys and values after i leaves it unchanged.
TEST(Transformer, CausalAttentionSeesNoLaterToken) {
  torch::manual_seed(2);
  const torch::Tensor q = torch::randn({1, 2, 9, 8}), k = torch::randn_like(q),
                      v = torch::randn_like(q);
  const torch::Tensor a = compat::attention(q, k, v, {}, 0.3, true);
  torch::Tensor k2 = k.clone(), v2 = v.clone();
  k2.narrow(2, 5, 4).normal_();
  v2.narrow(2, 5, 4).normal_();
  const torch::Tensor b = compat::attention(q, k2, v2, {}, 0.3, true);
  EXPECT_LE(max_diff(a.narrow(2, 0, 5), b.narrow(2, 0, 5)), 1e-6);
  EXPECT_GT(max_diff(a.narrow(2, 5, 4), b.narrow(2, 5, 4)), 1e-3);
  // Token 3 by hand.
  const torch::Tensor s = torch::softmax(
      0.3 * torch::matmul(k[0][1].narrow(0, 0, 4), q[0][1][3]), 0);
  const torch::Tensor want = torch::matmul(s, v[0][1].narrow(0, 0, 4));
  EXPECT_LE(max_diff(a[0][1][3], want), 1e-5);
}

// MultiheadAttention is nn.MultiheadAttention: LibTorch's own
// torch::nn::MultiheadAttention (sequence first) given the same weights and
// the causal mask as an additive -inf mask gives the same output.
TEST(Transformer, MultiheadAttentionIsLibTorchs) {
  torch::manual_seed(3);
  MultiheadAttention mine(32, 4);
  torch::nn::MultiheadAttention ref(
      torch::nn::MultiheadAttentionOptions(32, 4));
  {
    torch::NoGradGuard no_grad;
    for (auto& p : mine.named_parameters())
      p.value().normal_(0, 0.2);
    auto theirs = ref->named_parameters();
    for (auto& p : mine.named_parameters())
      theirs[p.key()].copy_(p.value());
  }
  const torch::Tensor x = torch::randn({2, 7, 32});
  const torch::Tensor mask =
      torch::full({7, 7}, -std::numeric_limits<float>::infinity()).triu(1);
  for (bool causal : {false, true}) {
    const torch::Tensor xt = x.transpose(0, 1);
    const torch::Tensor want = std::get<0>(ref->forward(
                                               xt,
                                               xt,
                                               xt,
                                               {},
                                               /*need_weights=*/false,
                                               causal ? mask : torch::Tensor()))
                                   .transpose(0, 1);
    EXPECT_LE(max_diff(mine.forward(x, causal), want), 1e-5) << causal;
  }
}

// Every block a checkpoint segment: the same output and gradients.
TEST(Transformer, CheckpointedBlocksGiveTheSameGradients) {
  torch::manual_seed(4);
  Transformer t(24, 3, 3, 4.0, Activation::kQuickGelu);
  const torch::Tensor x = torch::randn({2, 5, 24});
  std::vector<torch::Tensor> grads[2];
  torch::Tensor out[2];
  for (int c = 0; c < 2; ++c) {
    for (auto& p : t.parameters())
      p.mutable_grad() = torch::Tensor();
    out[c] = t.forward(x, true, c == 0 ? 0 : 3, Recompute::kAll);
    out[c].pow(2).sum().backward();
    for (auto& p : t.parameters())
      grads[c].push_back(p.grad().clone());
  }
  EXPECT_TRUE(torch::equal(out[0], out[1]));
  for (size_t i = 0; i < grads[0].size(); ++i)
    EXPECT_LE(max_diff(grads[0][i], grads[1][i]), 1e-6) << i;
}

#if MEMTRAIN_TORCH_AT_LEAST(2, 4)
namespace {

// The attention forwards LibTorch runs while one is alive (every thread):
// scaled_dot_product_attention and its fused kernels' forward ops.
std::atomic<int64_t> g_attention_forwards{0};

struct AttentionCounter {
  AttentionCounter() {
    g_attention_forwards = 0;
    handle = at::addGlobalCallback(
        at::RecordFunctionCallback(
            [](const at::RecordFunction& fn)
                -> std::unique_ptr<at::ObserverContext> {
              const std::string name = fn.name() ? fn.name() : "";
              if (name == "aten::scaled_dot_product_attention" ||
                  name == "aten::_scaled_dot_product_flash_attention_for_cpu" ||
                  name == "aten::_scaled_dot_product_flash_attention" ||
                  name == "aten::_scaled_dot_product_efficient_attention")
                ++g_attention_forwards;
              return nullptr;
            })
            .scopes({at::RecordScope::FUNCTION}));
  }
  ~AttentionCounter() {
    at::removeCallback(handle);
  }
  at::CallbackHandle handle = 0;
};

}  // namespace
#endif

// A selective segment keeps each attention's output (Note [Kept fused
// attention] on LibTorch 2.x, Note [Blocked attention] on 1.13): the
// output and gradients of no checkpointing bit for bit, and on 2.x its
// backward runs no attention forward, where recomputing every block whole
// runs one per block.
TEST(Transformer, SelectiveBlocksKeepTheirAttention) {
  for (const bool causal : {false, true}) {
    torch::manual_seed(4);
    Transformer t(32, 3, 4, 4.0, Activation::kGelu);
    const torch::Tensor x = torch::randn({2, 7, 32});
    struct Run {
      torch::Tensor out;
      std::vector<torch::Tensor> grads;
      int64_t backward_attention = -1;
    };
    const auto run = [&](int64_t checkpointed, Recompute mode) {
      Run r;
      for (auto& p : t.parameters())
        p.mutable_grad() = torch::Tensor();
      r.out = t.forward(x, causal, checkpointed, mode);
      {
#if MEMTRAIN_TORCH_AT_LEAST(2, 4)
        AttentionCounter counter;
#endif
        r.out.pow(2).sum().backward();
#if MEMTRAIN_TORCH_AT_LEAST(2, 4)
        r.backward_attention = g_attention_forwards;
#endif
      }
      for (auto& p : t.parameters())
        r.grads.push_back(p.grad().clone());
      return r;
    };
    const Run none = run(0, Recompute::kAll);
    const Run selective = run(3, Recompute::kSelective);
    const Run all = run(3, Recompute::kAll);
    EXPECT_TRUE(torch::equal(none.out, selective.out)) << causal;
    ASSERT_EQ(none.grads.size(), selective.grads.size());
    for (size_t i = 0; i < none.grads.size(); ++i)
      EXPECT_TRUE(torch::equal(none.grads[i], selective.grads[i]))
          << "parameter " << i << ", causal " << causal;
#if MEMTRAIN_TORCH_AT_LEAST(2, 4)
    EXPECT_EQ(none.backward_attention, 0) << causal;
    EXPECT_EQ(selective.backward_attention, 0) << causal;
    EXPECT_GE(all.backward_attention, 3) << causal;
#endif
  }
}

// open_clip's names, in its state-dict order (the parameters of CLIP
// itself, then visual's, the text transformer's, token_embedding, ln_final),
// and the segments: the image tower's blocks, then the text tower's.
TEST(Clip, OpenClipNamesOrderAndSegments) {
  const auto m = tiny_clip();
  std::vector<std::string> names;
  for (const auto& p : m->named_parameters())
    names.push_back(p.key());
  ASSERT_EQ(names.size(), 3u + 3 + 1 + 2 + 2 * 12 + 2 + 2 * 12 + 1 + 2);
  EXPECT_EQ(names[0], "positional_embedding");
  EXPECT_EQ(names[1], "text_projection");
  EXPECT_EQ(names[2], "logit_scale");
  EXPECT_EQ(names[3], "visual.class_embedding");
  EXPECT_EQ(names[5], "visual.proj");
  EXPECT_EQ(names[6], "visual.conv1.weight");
  EXPECT_EQ(names[9], "visual.transformer.resblocks.0.ln_1.weight");
  EXPECT_EQ(names[11], "visual.transformer.resblocks.0.attn.in_proj_weight");
  EXPECT_EQ(names[20], "visual.transformer.resblocks.0.mlp.c_proj.bias");
  EXPECT_EQ(names.back(), "ln_final.bias");
  EXPECT_EQ(names[names.size() - 3], "token_embedding.weight");
  const auto params = m->named_parameters();
  EXPECT_EQ(
      params["visual.positional_embedding"].sizes(),
      torch::IntArrayRef({17, 64}));
  EXPECT_EQ(
      params["positional_embedding"].sizes(), torch::IntArrayRef({12, 64}));
  EXPECT_EQ(
      params["token_embedding.weight"].sizes(),
      torch::IntArrayRef({49408, 64}));
  EXPECT_EQ(params["text_projection"].sizes(), torch::IntArrayRef({64, 32}));
  EXPECT_NEAR(params["logit_scale"].item<double>(), std::log(1 / 0.07), 1e-6);
  EXPECT_EQ(
      m->segment_names(),
      (std::vector<std::string>{
          "visual.transformer.resblocks.0",
          "visual.transformer.resblocks.1",
          "transformer.resblocks.0",
          "transformer.resblocks.1"}));
}

// The two embeddings of each pair have unit norm; checkpointing every
// block (image tower first, then text) changes neither the output nor the
// gradients beyond rounding.
TEST(Clip, UnitEmbeddingsAndCheckpointing) {
  const auto m = tiny_clip();
  torch::manual_seed(6);
  const torch::Tensor x = torch::randn({3, 3, 32, 32}), t = tokens(3, 12);
  std::vector<torch::Tensor> grads[2];
  torch::Tensor out[2];
  for (int c = 0; c < 2; ++c) {
    m->set_checkpointed(c == 0 ? 0 : m->num_segments());
    for (auto& p : m->parameters())
      p.mutable_grad() = torch::Tensor();
    out[c] = m->forward(x, t);
    (out[c].select(1, 0) * out[c].select(1, 1)).sum().backward();
    for (auto& p : m->parameters())
      grads[c].push_back(
          p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
  }
  EXPECT_EQ(out[0].sizes(), torch::IntArrayRef({3, 2, 32}));
  EXPECT_LE(max_diff(out[0].norm(2, 2), torch::ones({3, 2})), 1e-5);
  EXPECT_TRUE(torch::equal(out[0], out[1]));
  for (size_t i = 0; i < grads[0].size(); ++i)
    EXPECT_LE(max_diff(grads[0][i], grads[1][i]), 1e-6) << i;
}

TEST(Clip, RefusesWhatDoesNotFit) {
  EXPECT_THROW(clip_spec("ViT-L-14"), Error);
  EXPECT_EQ(clip_spec("ViT-B-16-quickgelu").act, Activation::kQuickGelu);
  EXPECT_EQ(clip_spec("ViT-B-16").patch_size, 16);
  ModelConfig cfg;
  cfg.name = ModelName::kClip;
  cfg.variant = "tiny";
  EXPECT_THROW(make_clip(cfg, clip_input(36, 77)), Error);  // not 8k
  ModelInput features = clip_input(32, 77);
  features.tokens = false;
  EXPECT_THROW(make_clip(cfg, features), Error);
  ModelInput big_ids = clip_input(32, 77);
  big_ids.token_max = 49408;
  EXPECT_THROW(make_clip(cfg, big_ids), Error);
}
