#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "memtrain/data/sampling/sharded_sampler.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace {

TEST(ShardedSampler, PermutationIsAPermutationAndIndependentOfWorld) {
  ShardedSampler a(100, 8, 0, 1, 7, false);
  ShardedSampler b(100, 8, 3, 4, 7, false);
  const auto p = a.permutation(3);
  EXPECT_EQ(p, b.permutation(3));
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 100; ++i)
    EXPECT_EQ(sorted[i], i);
  EXPECT_NE(p, a.permutation(4)) << "epochs must differ";
  ShardedSampler c(100, 8, 0, 1, 8, false);
  EXPECT_NE(p, c.permutation(3)) << "seeds must differ";
}

// Semantics: the global sample set of window w is perm[w*B, (w+1)*B),
// whatever the world size and the micro-batch split.
TEST(ShardedSampler, WindowIsTheSliceOfThePermutationForEverySplit) {
  const int64_t n = 103;
  for (int world = 1; world <= 5; ++world) {
    for (int64_t micro : {1, 2, 3}) {
      for (int64_t accum : {1, 2, 4}) {
        const int64_t b = world * micro * accum;
        ShardedSampler probe(n, b, 0, world, 11, false);
        const auto perm = probe.permutation(2);
        ASSERT_EQ(probe.windows_per_epoch(), (n + b - 1) / b);
        for (int64_t w = 0; w < probe.windows_per_epoch(); ++w) {
          std::vector<int64_t> gathered;
          int64_t total = 0;
          for (int r = 0; r < world; ++r) {
            ShardedSampler s(n, b, r, world, 11, false);
            const WindowPlan p = s.plan(2, w);
            const auto micro_batches =
                split_micro_batches(p.rank_indices, micro);
            EXPECT_LE(static_cast<int64_t>(micro_batches.size()), accum);
            int64_t count = 0;
            for (const auto& mb : micro_batches) {
              EXPECT_GE(static_cast<int64_t>(mb.size()), 1);
              EXPECT_LE(static_cast<int64_t>(mb.size()), micro);
              gathered.insert(gathered.end(), mb.begin(), mb.end());
              count += static_cast<int64_t>(mb.size());
            }
            EXPECT_EQ(count, static_cast<int64_t>(p.rank_indices.size()));
            total = p.global_samples;
          }
          const int64_t begin = w * b;
          const int64_t end = std::min(n, begin + b);
          EXPECT_EQ(total, end - begin);
          EXPECT_EQ(
              gathered,
              std::vector<int64_t>(perm.begin() + begin, perm.begin() + end))
              << "world " << world << " micro " << micro << " accum " << accum
              << " window " << w;
        }
      }
    }
  }
}

TEST(ShardedSampler, ShortLastWindowSplitsNearEvenly) {
  // 13 samples, B = 8: window 1 has 5 samples over 2 ranks -> 2 and 3.
  ShardedSampler r0(13, 8, 0, 2, 0, false);
  ShardedSampler r1(13, 8, 1, 2, 0, false);
  EXPECT_EQ(r0.windows_per_epoch(), 2);
  EXPECT_EQ(r0.plan(0, 1).rank_indices.size(), 2u);
  EXPECT_EQ(r1.plan(0, 1).rank_indices.size(), 3u);
  const auto mb = split_micro_batches(r1.plan(0, 1).rank_indices, 2);
  EXPECT_EQ(mb.size(), 2u);
  EXPECT_EQ(mb[1].size(), 1u);
  // 9 samples over 4 ranks x 1 x 2 (B = 8): window 1 has one sample, so
  // three ranks have an empty share but still run the window.
  int empty = 0;
  for (int r = 0; r < 4; ++r) {
    ShardedSampler s(9, 8, r, 4, 0, false);
    EXPECT_EQ(s.windows_per_epoch(), 2);
    empty += s.plan(0, 1).rank_indices.empty() ? 1 : 0;
  }
  EXPECT_EQ(empty, 3);
}

TEST(ShardedSampler, DropLastAndTooFewSamples) {
  ShardedSampler s(13, 8, 0, 2, 0, true);
  EXPECT_EQ(s.windows_per_epoch(), 1);
  try {
    ShardedSampler(7, 8, 0, 2, 0, true);
    FAIL() << "no window should be an error";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("fewer than one accumulation window"),
        std::string::npos);
  }
}

}  // namespace
}  // namespace memtrain
