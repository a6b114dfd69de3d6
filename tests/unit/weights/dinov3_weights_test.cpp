// DINOv3 weights in Meta's and timm's names into memtrain's backbone
// (weights/dinov3_weights.h), and what each bad file gets. Against timm's
// own models and converter: tests/e2e/dinov3_timm.sh.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "memtrain/model/blocks/dinov3_vit.h"
#include "memtrain/util/error.h"
#include "memtrain/weights/dinov3_weights.h"
#include "memtrain/weights/model_state.h"
#include "memtrain/weights/safetensors.h"
#include "test_support.h"

namespace memtrain {
namespace {

// A tiny backbone with every tensor perturbed and the key bias zero (timm
// has none), and its state in Meta's names, mask_token included.
Dinov3Spec seeded(const std::string& variant, uint64_t seed) {
  torch::manual_seed(seed);
  return dinov3_spec(variant);
}

struct Source {
  Dinov3Vit model{seeded("tiny", 3)};
  NamedTensors meta;
  Source() {
    torch::NoGradGuard no_grad;
    for (const auto& [name, t] : state_tensors(model)) {
      if (name.find("bias_mask") != std::string::npos ||
          name.find("periods") != std::string::npos)
        continue;
      t.add_(0.05 * torch::randn_like(t));
      if (name.find("qkv.bias") != std::string::npos)
        t.narrow(0, 64, 64).zero_();
    }
    meta = state_tensors(model);
    meta.insert(meta.begin() + 2, {"mask_token", torch::zeros({1, 64})});
  }
  // Meta's state in timm's names (with q/v biases or none).
  NamedTensors timm(bool qkvb) const {
    NamedTensors out;
    for (const auto& [name, t] : meta) {
      if (name == "mask_token" || name == "rope_embed.periods" ||
          name.find("bias_mask") != std::string::npos)
        continue;
      std::string n = name;
      if (n == "storage_tokens")
        n = "reg_token";
      for (const char* ls : {".ls1.gamma", ".ls2.gamma"}) {
        const auto at = n.find(ls);
        if (at != std::string::npos)
          n = n.substr(0, at) + (ls[3] == '1' ? ".gamma_1" : ".gamma_2");
      }
      const auto qkv = n.find(".attn.qkv.bias");
      if (qkv != std::string::npos) {
        if (qkvb) {
          const std::string attn = n.substr(0, qkv) + ".attn.";
          out.emplace_back(attn + "q_bias", t.narrow(0, 0, 64).clone());
          out.emplace_back(attn + "v_bias", t.narrow(0, 128, 64).clone());
        }
        continue;
      }
      out.emplace_back(n, t);
    }
    return out;
  }
  at::Tensor features(Dinov3Vit& m, const at::Tensor& x) const {
    torch::NoGradGuard no_grad;
    return m.forward_features(x, {1, 3}).maps[1];
  }
};

std::string refusal(const NamedTensors& file, const std::string& variant) {
  test::TempDir dir("dinov3");
  save_safetensors(dir.file("w.safetensors"), file);
  Dinov3Vit m(dinov3_spec(variant));
  try {
    load_dinov3_weights(m, dir.file("w.safetensors"), true, "model.pretrained");
  } catch (const Error& e) {
    return e.what();
  }
  return "(loaded)";
}

TEST(Dinov3Weights, MetasNamesLoadExactlyWithoutTheMaskToken) {
  Source src;
  test::TempDir dir("dinov3");
  save_safetensors(dir.file("meta.safetensors"), src.meta);
  torch::manual_seed(9);
  Dinov3Vit m(dinov3_spec("tiny"));
  const Dinov3Load r =
      load_dinov3_weights(m, dir.file("meta.safetensors"), true, "w");
  EXPECT_EQ(r.naming, "Meta's DINOv3 names");
  EXPECT_TRUE(r.report.complete());
  EXPECT_EQ(r.report.loaded.size(), src.meta.size() - 1);
  const auto mine = state_tensors(m);
  const auto theirs = state_tensors(src.model);
  for (size_t i = 0; i < mine.size(); ++i)
    EXPECT_TRUE(torch::equal(mine[i].second, theirs[i].second))
        << mine[i].first;
  EXPECT_EQ(r.changes.size(), 1u);
  EXPECT_NE(r.lines("w").at(0).find("Meta's DINOv3 names"), std::string::npos);
}

TEST(Dinov3Weights, PeriodsLoadAsStoredInBfloat16) {
  Source src;
  for (auto& [name, t] : src.meta)
    if (name == "rope_embed.periods")
      t = t.to(torch::kBFloat16);
  test::TempDir dir("dinov3");
  save_safetensors(dir.file("meta.safetensors"), src.meta);
  Dinov3Vit m(dinov3_spec("tiny"));
  load_dinov3_weights(m, dir.file("meta.safetensors"), true, "w");
  const at::Tensor stored =
      src.model.named_buffers()["rope_embed.periods"].to(torch::kBFloat16);
  const at::Tensor loaded = m.named_buffers()["rope_embed.periods"];
  EXPECT_EQ(loaded.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(loaded, stored.to(torch::kFloat32)));
  EXPECT_FALSE(
      torch::equal(loaded, src.model.named_buffers()["rope_embed.periods"]));
}

TEST(Dinov3Weights, TimmsNamesGiveTheSameFeatures) {
  Source src;
  const at::Tensor x = torch::randn({1, 3, 48, 32});
  const at::Tensor want = src.features(src.model, x);
  for (const bool qkvb : {true, false}) {
    if (!qkvb) {  // timm without _qkvb: no q or v bias either
      torch::NoGradGuard no_grad;
      for (const auto& [name, t] : state_tensors(src.model))
        if (name.find("qkv.bias") != std::string::npos &&
            name.find("mask") == std::string::npos)
          t.zero_();
      src.meta = state_tensors(src.model);
    }
    test::TempDir dir("dinov3");
    save_safetensors(dir.file("timm.safetensors"), src.timm(qkvb));
    Dinov3Vit m(dinov3_spec("tiny"));
    const Dinov3Load r =
        load_dinov3_weights(m, dir.file("timm.safetensors"), true, "w");
    EXPECT_TRUE(r.report.complete());
    EXPECT_NE(
        r.naming.find(qkvb ? "q and v biases" : "no qkv bias"),
        std::string::npos)
        << r.naming;
    const auto mine = state_tensors(m);
    const auto theirs = state_tensors(src.model);
    ASSERT_EQ(mine.size(), theirs.size());
    for (size_t i = 0; i < mine.size(); ++i) {
      EXPECT_EQ(mine[i].first, theirs[i].first);
      EXPECT_TRUE(torch::equal(mine[i].second, theirs[i].second))
          << mine[i].first;
    }
    if (qkvb)
      EXPECT_TRUE(torch::equal(src.features(m, x), want));
  }
}

TEST(Dinov3Weights, BadFilesAreRefusedNamed) {
  Source src;
  // A NaN bias mask: Meta's module as created, before init_weights.
  NamedTensors nan = src.meta;
  for (auto& [name, t] : nan)
    if (name == "blocks.2.attn.qkv.bias_mask")
      t = torch::full_like(t, NAN);
  const std::string nan_mask = refusal(nan, "tiny");
  EXPECT_NE(
      nan_mask.find("blocks.2.attn.qkv.bias_mask holds NaN"), std::string::npos)
      << nan_mask;
  // A file of another size: the first shape that differs, and the size.
  Dinov3Vit s(dinov3_spec("vits16"));
  NamedTensors small = state_tensors(s);
  const std::string other = refusal(small, "tiny");
  EXPECT_NE(
      other.find("cls_token [1, 1, 384] in the file, [1, 1, 64] in tiny - "
                 "this looks like vits16"),
      std::string::npos)
      << other;
  // SwiGLU (S+, H+).
  NamedTensors swiglu = src.meta;
  swiglu.emplace_back("blocks.0.mlp.w1.weight", torch::zeros({2, 2}));
  EXPECT_NE(
      refusal(swiglu, "tiny").find("a SwiGLU DINOv3 ('blocks.0.mlp.w1.weight'"),
      std::string::npos);
  // Half of timm's q/v pair.
  NamedTensors half = src.timm(true);
  half.erase(std::find_if(half.begin(), half.end(), [](const auto& p) {
    return p.first == "blocks.1.attn.v_bias";
  }));
  EXPECT_NE(
      refusal(half, "tiny").find("blocks.1.attn.q_bias without v_bias"),
      std::string::npos);
  // Strict: a missing tensor and an unexpected one, named.
  NamedTensors lacking = src.meta;
  lacking.pop_back();  // norm.bias
  lacking.emplace_back("head.weight", torch::zeros({2, 2}));
  const std::string strict = refusal(lacking, "tiny");
  EXPECT_NE(strict.find("norm.bias"), std::string::npos) << strict;
  EXPECT_NE(strict.find("head.weight"), std::string::npos) << strict;
  // Not a DINOv3 state dict at all.
  EXPECT_NE(
      refusal({{"fc.weight", torch::zeros({2, 2})}}, "tiny")
          .find("not a DINOv3 ViT state dict"),
      std::string::npos);
}

}  // namespace
}  // namespace memtrain
