#pragma once
// Tests that need a GPU are named *_CUDA (the test or its suite), as in
// PyTorch's test/cpp. Where no GPU is usable -- a CPU build, or a CUDA build
// on a machine where LibTorch sees no device -- the gtest mains filter them
// out and say so in one line.

#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cstdio>
#include <string>

namespace memtrain::test {

// Call after InitGoogleTest. `report`: print the line (rank 0 of a job).
// --gtest_list_tests runs nothing: it lists the *_CUDA tests too.
inline void filter_gpu_tests(bool report) {
  if (GTEST_FLAG_GET(list_tests))
    return;
  // The kind of skip, as tests/tools/skips.py reads it.
  const char* why = nullptr;
  const char* kind = "build";
  if (!MEMTRAIN_CUDA) {
    why = "this is a CPU build (MEMTRAIN_CUDA=OFF)";
  } else if (!torch::cuda::is_available()) {
    why = "no usable GPU (torch::cuda::is_available() is false)";
    kind = "machine";
  }
  if (why == nullptr)
    return;
  auto cuda_name = [](const char* name) {
    const std::string s(name);
    return s.size() >= 5 && s.compare(s.size() - 5, 5, "_CUDA") == 0;
  };
  const ::testing::UnitTest& all = *::testing::UnitTest::GetInstance();
  int n = 0;
  for (int i = 0; i < all.total_test_suite_count(); ++i) {
    const ::testing::TestSuite& suite = *all.GetTestSuite(i);
    for (int j = 0; j < suite.total_test_count(); ++j)
      n += cuda_name(suite.name()) || cuda_name(suite.GetTestInfo(j)->name());
  }
  std::string filter = GTEST_FLAG_GET(filter);
  filter += filter.find('-') == std::string::npos ? "-" : ":";
  filter += "*_CUDA:*_CUDA.*";
  GTEST_FLAG_SET(filter, filter);
  if (report && n > 0)
    std::printf(
        "SKIP (%s): %d GPU-only test%s (*_CUDA): %s\n",
        kind,
        n,
        n == 1 ? "" : "s",
        why);
}

}  // namespace memtrain::test
