#include "memtrain/train/batch_loader.h"

#include <torch/torch.h>

#include <chrono>

#include "memtrain/data/h5_dataset.h"

namespace memtrain {

int64_t Batch::size() const {
  return y.defined() ? y.size(0) : 0;
}

Batch BatchLoader::load(const std::vector<int64_t>& indices) {
  const auto start = std::chrono::steady_clock::now();
  const auto& info = dataset_.info();
  std::vector<int64_t> shape = {static_cast<int64_t>(indices.size())};
  shape.insert(shape.end(), info.sample_shape.begin(), info.sample_shape.end());
  Batch b;
  b.x = torch::empty(shape, torch::kFloat32);
  b.y = torch::empty({static_cast<int64_t>(indices.size())}, torch::kInt64);
  dataset_.read(indices, b.x.data_ptr<float>(), b.y.data_ptr<int64_t>());
  wait_s_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return b;
}

double BatchLoader::take_wait_seconds() {
  const double w = wait_s_;
  wait_s_ = 0.0;
  return w;
}

}  // namespace memtrain
