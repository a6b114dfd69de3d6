#pragma once
// One training step of a model at a checkpointing tier, for the tests that
// compare tiers bit for bit (selective_recompute_test, host_offload_test).

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "memtrain/compat.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/memory/host_pool.h"
#include "memtrain/model/blocks/checkpointed.h"
#include "memtrain/model/losses.h"
#include "memtrain/model/models.h"
#include "memtrain/model/nets/unet3d.h"

namespace memtrain::tier_test {

enum class Tier { kOff, kSelective, kAll, kOffload };

// One-channel volumes (N, 1, D, H, W) from the default generator seeded
// with `seed`, 3-class voxel targets (N, D, H, W) drawn after them, and the
// segmentation loss of a model's logits on them.
struct VolumeBatch {
  VolumeBatch(uint64_t seed, const std::vector<int64_t>& ndhw) {
    torch::manual_seed(seed);
    x = torch::randn({ndhw[0], 1, ndhw[1], ndhw[2], ndhw[3]});
    target = torch::randint(0, 3, ndhw);
  }
  torch::Tensor loss(const torch::Tensor& y) const {
    return dice_ce_loss_sum(y, target);
  }
  torch::Tensor x, target;
};

inline void set_tier(Classifier& net, Tier tier) {
  net.set_checkpointed(tier == Tier::kOff ? 0 : net.num_segments());
  net.set_recompute(
      tier == Tier::kSelective ? Recompute::kSelective
      : tier == Tier::kOffload ? Recompute::kAllOffload
                               : Recompute::kAll);
}

struct Step {
  std::map<std::string, torch::Tensor> grads;
  torch::Tensor out;
  int64_t peak = 0;  // device-domain bytes above what the step started with
  int64_t host_peak = 0;  // the offload pool's, when one is installed
  int64_t copied_in = 0;  // bytes the pool copied back
};

// One forward and backward of `net` at `tier` on (x, loss_of); the
// parameters' gradients, the output and the peaks.
template <typename Loss>
Step step(
    Classifier& net,
    Tier tier,
    const torch::Tensor& x,
    const Loss& loss_of,
    bool bf16 = false) {
  set_tier(net, tier);
  net.zero_grad();
  memory::release_cache();
  memory::reset_peak();
  const std::shared_ptr<memory::HostPool> pool = memory::offload_pool();
  if (pool)
    pool->reset_peak();
  Step s;
  {
    memory::DeviceScope device;
    const int64_t before = memory::stats().allocated;
    torch::Tensor y;
    {
      compat::AutocastGuard amp(bf16, x.is_cuda(), torch::kBFloat16);
      y = net.forward(x);
    }
    loss_of(y.to(torch::kFloat32)).backward();
    s.peak = memory::stats().peak_allocated - before;
    s.out = y.detach();
  }
  if (pool) {
    s.host_peak = pool->stats().peak_in_use;
    s.copied_in = pool->stats().copied_in;
  }
  for (const auto& p : net.named_parameters())
    s.grads[p.key()] = p.value().grad().clone();
  net.zero_grad();
  return s;
}

inline void expect_bitwise(const Step& a, const Step& b, const char* what) {
  EXPECT_TRUE(torch::equal(a.out, b.out)) << what << ": output";
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (const auto& [name, g] : a.grads) {
    const torch::Tensor& h = b.grads.at(name);
    EXPECT_TRUE(torch::equal(g, h)) << what << ": " << name << " differs by "
                                    << (g - h).abs().max().item<double>();
  }
}

inline std::shared_ptr<Classifier> unet(Norm norm, bool lean) {
  ModelConfig cfg;
  cfg.name = ModelName::kUnet3d;
  cfg.depth = 3;
  cfg.norm = norm;
  cfg.feature_size = 4;
  cfg.seed = 7;
  torch::manual_seed(7);
  auto net = make_unet3d(cfg, 1, 3);
  net->set_memory_lean(lean);
  return net;
}

// fn(net) for each form of the U-Net -- instance or group norm, split
// decoder input (lean) or concatenated -- freshly built, traced by name.
template <typename Fn>
void for_each_unet_form(const Fn& fn) {
  for (Norm norm : {Norm::kInstance, Norm::kGroup}) {
    for (bool lean : {true, false}) {
      SCOPED_TRACE(
          std::string(norm == Norm::kInstance ? "instance" : "group") +
          (lean ? ", lean" : ", concatenated"));
      const std::shared_ptr<Classifier> net = unet(norm, lean);
      fn(*net);
    }
  }
}

}  // namespace memtrain::tier_test
