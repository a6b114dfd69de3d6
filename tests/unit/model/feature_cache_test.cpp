// model.feature_cache (model/feature_cache.h): the keys are where each
// slice was cut from, the store keeps what comes first within its
// capacity, and dinov3 copies back what it holds instead of extracting it.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "memtrain/config/train_config.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/model/feature_cache.h"
#include "memtrain/model/nets/dinov3_seg.h"
#include "memtrain/model/registry.h"

namespace memtrain {
namespace {

// One origin row: set, volume, corner (D, H, W), flips (D, H, W).
torch::Tensor origin(
    int64_t volume,
    std::vector<int64_t> corner,
    std::vector<int64_t> flip = {0, 0, 0}) {
  std::vector<int64_t> row = {kTrainOrigin, volume};
  row.insert(row.end(), corner.begin(), corner.end());
  row.insert(row.end(), flip.begin(), flip.end());
  return torch::tensor(row, torch::kLong).view({1, kOriginColumns});
}

TEST(FeatureCache, KeysAreWhereEachSliceWasCut) {
  // Across D: slices 5, 6, 7 of volume 3, the plane's corner (1, 2) and
  // sides (16, 32).
  const std::vector<SliceKey> k =
      slice_keys(origin(3, {5, 1, 2}), {3, 16, 32}, 0, 0, 6);
  ASSERT_EQ(k.size(), 3u);
  for (int64_t s = 0; s < 3; ++s) {
    const std::array<int64_t, 11> want = {
        kTrainOrigin, 3, 5 + s, 1, 2, 16, 32, 0, 0, 0, 6};
    EXPECT_EQ(k[s].v, want) << s;
  }
  // Mirrored across the slice axis: the same slices, in reverse order.
  const std::vector<SliceKey> r =
      slice_keys(origin(3, {5, 1, 2}, {1, 0, 0}), {3, 16, 32}, 0, 0, 6);
  EXPECT_EQ(r[0], k[2]);
  EXPECT_EQ(r[2], k[0]);
  // Mirrored in the plane: other keys (another image).
  const std::vector<SliceKey> m =
      slice_keys(origin(3, {5, 1, 2}, {0, 0, 1}), {3, 16, 32}, 0, 0, 6);
  EXPECT_FALSE(m[0] == k[0]);
  EXPECT_EQ(m[0].v[8], 1);
  // Across W: the plane is (D, H); the context view is another key.
  const std::vector<SliceKey> w =
      slice_keys(origin(3, {5, 1, 2}), {16, 16, 2}, 2, 1, 6);
  const std::array<int64_t, 11> w1 = {
      kTrainOrigin, 3, 3, 5, 1, 16, 16, 0, 0, 1, 6};
  EXPECT_EQ(w[1].v, w1);
  // Windows of a validation case.
  const torch::Tensor o = window_origins(
      kValOrigin, 7, torch::tensor(std::vector<int64_t>{4, 5, 6}).view({1, 3}));
  EXPECT_TRUE(torch::equal(
      o,
      torch::tensor(std::vector<int64_t>{kValOrigin, 7, 4, 5, 6, 0, 0, 0})
          .view({1, kOriginColumns})));
}

TEST(FeatureCache, KeepsWhatComesFirstWithinItsCapacity) {
  FeatureCache cache(false);
  const auto key = [](int64_t slice) {
    return SliceKey{{0, 0, slice, 0, 0, 16, 16, 0, 0, 0, 6}};
  };
  const torch::Tensor maps = torch::randn({8, 4, 4});  // 512 B
  // Before planning: nothing kept, nothing counted.
  cache.store(key(0), maps);
  EXPECT_EQ(cache.find(key(0)), nullptr);
  EXPECT_EQ(cache.take_counts(), std::make_pair(int64_t{0}, int64_t{0}));
  // 2 KiB: one block of 2 KiB holds four 512-byte maps.
  cache.set_capacity(FeatureCache::blocks_for(4, 512));
  for (int64_t s = 0; s < 6; ++s)
    cache.store(key(s), maps * static_cast<double>(s));
  EXPECT_EQ(cache.held(), 2048);
  for (int64_t s = 0; s < 4; ++s) {
    const at::Tensor* t = cache.find(key(s));
    ASSERT_NE(t, nullptr) << s;
    EXPECT_TRUE(torch::equal(*t, maps * static_cast<double>(s))) << s;
  }
  EXPECT_EQ(cache.find(key(4)), nullptr);  // full: the first four kept
  EXPECT_EQ(cache.find(key(5)), nullptr);
  EXPECT_EQ(cache.take_counts(), std::make_pair(int64_t{4}, int64_t{2}));
  EXPECT_EQ(cache.take_counts(), std::make_pair(int64_t{0}, int64_t{0}));
  // A second store of a key keeps the first.
  cache.store(key(1), maps * 100.0);
  EXPECT_TRUE(torch::equal(*cache.find(key(1)), maps));
}

// The blocks hold every map, the waste at their ends counted: vits16's
// 384 x 4 layers x 8 x 8 float32 maps (393,216 B) fit 170 to a 64 MiB
// block, so 256 of them take two; what fits in less is whole blocks, or
// one smaller block.
TEST(FeatureCache, BlocksHoldEveryMapWithTheirEndsWasted) {
  const auto blocks = [](int64_t entries, int64_t bytes) {
    const CacheBlocks b = FeatureCache::blocks_for(entries, bytes);
    return std::make_pair(b.block, b.blocks);
  };
  const int64_t mib64 = int64_t{64} << 20;
  EXPECT_EQ(blocks(256, 393216), std::make_pair(mib64, int64_t{2}));
  EXPECT_EQ(blocks(170, 393216), std::make_pair(mib64, int64_t{1}));
  EXPECT_EQ(blocks(171, 393216), std::make_pair(mib64, int64_t{2}));
  EXPECT_EQ(blocks(128, 4096), std::make_pair(int64_t{524288}, int64_t{1}));
  EXPECT_EQ(blocks(288, 1000), std::make_pair(int64_t{524288}, int64_t{1}));
  EXPECT_EQ(blocks(0, 4096), std::make_pair(int64_t{0}, int64_t{0}));
  // 256 maps of 393,216 B, each block filled as far as it goes: 170 + 86.
  FeatureCache cache(false);
  cache.set_capacity(FeatureCache::blocks_for(256, 393216));
  const torch::Tensor maps = torch::zeros({393216 / 4});
  for (int64_t s = 0; s < 256; ++s)
    cache.store(SliceKey{{0, 0, s, 0, 0, 128, 128, 0, 0, 0, 6}}, maps);
  for (int64_t s = 0; s < 256; ++s) {
    EXPECT_NE(
        cache.find(SliceKey{{0, 0, s, 0, 0, 128, 128, 0, 0, 0, 6}}), nullptr)
        << s;
  }
  EXPECT_EQ(cache.held(), 2 * mib64);
  // Capped: whole blocks, or one block of the largest power of two.
  const CacheBlocks want{mib64, 2};
  const CacheBlocks most = FeatureCache::fit(want, 100 << 20);
  EXPECT_EQ(
      std::make_pair(most.block, most.blocks),
      std::make_pair(mib64, int64_t{1}));
  const CacheBlocks less = FeatureCache::fit(want, 40 << 20);
  EXPECT_EQ(
      std::make_pair(less.block, less.blocks),
      std::make_pair(int64_t{32} << 20, int64_t{1}));
  EXPECT_EQ(FeatureCache::fit(want, 100).bytes(), 0);
  EXPECT_EQ(FeatureCache::fit(want, -5).bytes(), 0);
}

std::shared_ptr<Classifier> segmenter(int64_t chunk) {
  ModelConfig cfg;
  cfg.name = ModelName::kDinov3;
  cfg.variant = "tiny";
  cfg.slice_chunk = chunk;
  cfg.context.scale = 2.0;
  ModelInput in;
  in.kind = SampleKind::kVolumes;
  in.sample_shape = {1, 3, 32, 16};
  in.num_classes = 3;
  return make_model(cfg, in);
}

// The second time a slice comes, its maps are the first time's: the same
// logits (to the head's rounding in a batch of another size) with the
// backbone's weights gone (nothing was extracted), and the
// logits of an uncached model for a batch that mixes kept and new slices.
TEST(FeatureCache, Dinov3CopiesBackWhatItKeeps) {
  torch::manual_seed(9);
  auto cached = segmenter(2);
  auto plain = segmenter(2);
  {
    torch::NoGradGuard no_grad;
    const auto a = plain->named_parameters(), b = cached->named_parameters();
    for (const auto& p : a)
      p.value().copy_(b[p.key()]);
  }
  auto cache = std::make_shared<FeatureCache>(false);
  cache->set_capacity({int64_t{1} << 24, 1});
  cached->set_feature_cache(cache);
  torch::NoGradGuard no_grad;
  const torch::Tensor x = torch::randn({3, 1, 3, 32, 16});
  const torch::Tensor c = torch::randn({3, 1, 3, 32, 16});
  const torch::Tensor o = torch::cat(
      {origin(0, {0, 0, 0}), origin(1, {0, 0, 0}), origin(1, {3, 0, 0})});
  cached->set_origins(o.narrow(0, 0, 2));
  const torch::Tensor first =
      cached->forward(x.narrow(0, 0, 2), c.narrow(0, 0, 2));
  // 2 samples x 3 slices x 2 views, none kept before.
  EXPECT_EQ(cache->take_counts(), std::make_pair(int64_t{0}, int64_t{12}));
  EXPECT_TRUE(torch::allclose(
      first, plain->forward(x.narrow(0, 0, 2), c.narrow(0, 0, 2)), 1e-5, 1e-6));
  // Samples 1, 0 and a new one: 12 slices found, 6 extracted, each where
  // its sample is.
  const torch::Tensor order = torch::tensor({1, 0, 2}, torch::kLong);
  cached->set_origins(o.index_select(0, order));
  const torch::Tensor mixed =
      cached->forward(x.index_select(0, order), c.index_select(0, order));
  EXPECT_EQ(cache->take_counts(), std::make_pair(int64_t{12}, int64_t{6}));
  EXPECT_TRUE(torch::allclose(mixed[0], first[1], 1e-6, 1e-7));
  EXPECT_TRUE(torch::allclose(mixed[1], first[0], 1e-6, 1e-7));
  EXPECT_TRUE(torch::allclose(
      mixed[2],
      plain->forward(x.narrow(0, 2, 1), c.narrow(0, 2, 1))[0],
      1e-5,
      1e-6));
  // Without the backbone's weights: the kept slices give the same logits.
  auto& dino = dynamic_cast<Dinov3Segmenter&>(*cached);
  for (auto& p : dino.backbone().parameters())
    p.zero_();
  cached->set_origins(o);
  const torch::Tensor again = cached->forward(x, c);
  EXPECT_EQ(cache->take_counts(), std::make_pair(int64_t{18}, int64_t{0}));
  EXPECT_TRUE(torch::allclose(again.narrow(0, 0, 2), first, 1e-6, 1e-7));
  EXPECT_TRUE(torch::allclose(again[2], mixed[2], 1e-6, 1e-7));
  // Origins are the next forward's only: without them it extracts every
  // slice (with no weights now: other logits), each a miss.
  const torch::Tensor unknown = cached->forward(x, c);
  EXPECT_EQ(cache->take_counts(), std::make_pair(int64_t{0}, int64_t{18}));
  EXPECT_FALSE(torch::allclose(unknown, again, 1e-3, 1e-3));
}

// A hit never raises an extraction's device peak: with every slice in one
// call, a batch that finds one of its 6 slices peaks no higher than the
// same batch extracted whole.
TEST(FeatureCache, AHitDoesNotRaiseTheExtractionsPeak) {
  torch::manual_seed(10);
  auto cached = segmenter(0);
  auto plain = segmenter(0);
  auto cache = std::make_shared<FeatureCache>(false);
  cache->set_capacity({int64_t{1} << 24, 1});
  cached->set_feature_cache(cache);
  torch::NoGradGuard no_grad;
  memory::DeviceScope device;
  const torch::Tensor x = torch::randn({2, 1, 3, 32, 16});
  const torch::Tensor c = torch::randn({2, 1, 3, 32, 16});
  // Slices 0-2 of volume 0 kept; then slices 2-4 (one kept) and 10-12.
  cached->set_origins(origin(0, {0, 0, 0}));
  cached->forward(x.narrow(0, 0, 1), c.narrow(0, 0, 1));
  (void)cached->take_phase_peaks();
  (void)cache->take_counts();
  cached->set_origins(
      torch::cat({origin(0, {2, 0, 0}), origin(0, {10, 0, 0})}));
  cached->forward(x, c);
  EXPECT_EQ(cache->take_counts(), std::make_pair(int64_t{2}, int64_t{10}));
  plain->forward(x, c);  // first-call allocations, before measuring
  (void)plain->take_phase_peaks();
  plain->forward(x, c);
  const auto with = cached->take_phase_peaks(),
             without = plain->take_phase_peaks();
  ASSERT_EQ(with.size(), 2u);
  ASSERT_EQ(without.size(), 2u);
  for (size_t i = 0; i < 2; ++i)
    EXPECT_LE(with[i].second, without[i].second) << with[i].first;
}

}  // namespace
}  // namespace memtrain
