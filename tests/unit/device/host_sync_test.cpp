#include "memtrain/device/host_sync.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <thread>

#include "memtrain/util/error.h"

namespace memtrain {
namespace {

// Note [Host reads seen by the dispatcher]: a bare read is seen and named,
// a read inside a HostSync span is the span's, other threads' calls are
// not the watch's, and a watch that is off sees nothing.
TEST(HostReadWatch, SeesBareReadsAndTheSpans) {
  const torch::Tensor t = torch::arange(4, torch::kFloat32);
  // Its device where LibTorch has CUDA (the watch boxes the inputs there).
  const std::string item = at::hasCUDA() ? "aten::_local_scalar_dense(cpu)"
                                         : "aten::_local_scalar_dense";
  const int64_t before = host_syncs();
  HostReadWatch watch(true);
  ASSERT_TRUE(watch.on());
  (void)t.sum().item<float>();  // bare
  EXPECT_EQ(watch.seen(), 1);
  EXPECT_EQ(watch.bare(), item);
  EXPECT_EQ(host_syncs(), before) << "a bare read is not counted by the code";
  EXPECT_EQ(read_to_host(t.sum()), std::vector<double>{6.0});
  EXPECT_EQ(watch.seen(), 2) << "read_to_host is one span";
  {
    const HostSync sync;
    (void)t.max().item<float>();  // inside a span: the span's own
  }
  EXPECT_EQ(watch.seen(), 3);
  EXPECT_EQ(host_syncs(), before + 2);
  EXPECT_EQ(watch.bare(), item);
  (void)t.sum().gt(0).is_nonzero();  // bool(t): bare
  EXPECT_EQ(watch.seen(), 4);
  std::thread other([&t] { (void)t.min().item<float>(); });
  other.join();
  EXPECT_EQ(watch.seen(), 4) << "another thread's read is not this watch's";
  EXPECT_EQ(watch.bare(), item + ", " + item);
}

TEST(HostReadWatch, OffSeesNothingAndOneAtATime) {
  const torch::Tensor t = torch::ones({2});
  {
    HostReadWatch off(false);
    EXPECT_FALSE(off.on());
    (void)t.sum().item<float>();
    EXPECT_EQ(off.seen(), 0);
    EXPECT_EQ(off.bare(), "");
  }
  HostReadWatch watch(true);
  EXPECT_THROW(HostReadWatch second(true), Error);
  (void)t.sum().item<float>();
  EXPECT_EQ(watch.seen(), 1);
}

TEST(HostReadWatch, TheEnvironmentSaysHowAndABadValueIsRefused) {
  const char* was = std::getenv("MEMTRAIN_WATCH_HOST_READS");
  const std::string saved = was == nullptr ? "" : was;
  ::unsetenv("MEMTRAIN_WATCH_HOST_READS");
  EXPECT_EQ(host_read_watching(), HostReadWatching::kOff);
  ::setenv("MEMTRAIN_WATCH_HOST_READS", "0", 1);
  EXPECT_EQ(host_read_watching(), HostReadWatching::kOff);
  ::setenv("MEMTRAIN_WATCH_HOST_READS", "1", 1);
  EXPECT_EQ(host_read_watching(), HostReadWatching::kRecord);
  ::setenv("MEMTRAIN_WATCH_HOST_READS", "strict", 1);
  EXPECT_EQ(host_read_watching(), HostReadWatching::kStrict);
  ::setenv("MEMTRAIN_WATCH_HOST_READS", "yes", 1);
  try {
    host_read_watching();
    ADD_FAILURE() << "yes was taken";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("MEMTRAIN_WATCH_HOST_READS=\"yes\""),
        std::string::npos)
        << e.what();
  }
  if (was == nullptr)
    ::unsetenv("MEMTRAIN_WATCH_HOST_READS");
  else
    ::setenv("MEMTRAIN_WATCH_HOST_READS", saved.c_str(), 1);
}

}  // namespace
}  // namespace memtrain
