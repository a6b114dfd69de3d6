#pragma once
// BatchLoader: reads a micro-batch of samples from an H5Dataset straight
// into tensors (no intermediate copy), and times how long the caller waited.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace memtrain {

class H5Dataset;

struct Batch {
  at::Tensor x;  // (n, F) or (n, C, H, W) float32
  at::Tensor y;  // (n,) int64
  int64_t size() const;
};

class BatchLoader {
 public:
  explicit BatchLoader(const H5Dataset& dataset) : dataset_(dataset) {}

  // Blocking read of `indices` (dataset rows, in that order).
  Batch load(const std::vector<int64_t>& indices);

  // Seconds spent inside load() since the last call of take_wait_seconds().
  double take_wait_seconds();

 private:
  const H5Dataset& dataset_;
  double wait_s_ = 0.0;
};

}  // namespace memtrain
