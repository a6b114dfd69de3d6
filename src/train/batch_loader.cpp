#include "memtrain/train/batch_loader.h"

#include <torch/torch.h>

#include "memtrain/data/h5_dataset.h"

namespace memtrain {
namespace {

at::Tensor host_empty(std::vector<int64_t> shape, at::ScalarType t, bool pin) {
  return at::empty(shape, at::TensorOptions().dtype(t).pinned_memory(pin));
}

}  // namespace

int64_t Batch::size() const {
  return y.defined() ? y.size(0) : 0;
}

Batch RowSource::allocate(int64_t n, bool pinned) const {
  const DatasetInfo& info = data_.info();
  std::vector<int64_t> xs = {n};
  xs.insert(xs.end(), info.sample_shape.begin(), info.sample_shape.end());
  std::vector<int64_t> ys = {n};
  if (info.kind == SampleKind::kVolumes) {
    ys.insert(ys.end(), info.sample_shape.begin() + 1, info.sample_shape.end());
  }
  Batch b;
  b.x = host_empty(xs, at::kFloat, pinned);
  b.y = host_empty(ys, at::kLong, pinned);
  if (info.context_features > 0)
    b.context = host_empty({n, info.context_features}, at::kFloat, pinned);
  return b;
}

void RowSource::read(
    int64_t epoch, const std::vector<int64_t>& ids, Batch& into) const {
  data_.read(
      ids,
      into.x.data_ptr<float>(),
      into.y.data_ptr<int64_t>(),
      into.context.defined() ? into.context.data_ptr<float>() : nullptr);
  if (transform_.active())
    transform_images(transform_, epoch, ids, into.x);
}

Batch PatchSource::allocate(int64_t n, bool pinned) const {
  const auto& p = sampler_.patch();
  const int64_t c = data_.info().sample_shape[0];
  Batch b;
  b.x = host_empty({n, c, p[0], p[1], p[2]}, at::kFloat, pinned);
  b.y = host_empty({n, p[0], p[1], p[2]}, at::kLong, pinned);
  return b;
}

void PatchSource::read(
    int64_t epoch, const std::vector<int64_t>& ids, Batch& into) const {
  const auto& p = sampler_.patch();
  const int64_t voxels = p[0] * p[1] * p[2];
  const int64_t numel = data_.info().sample_shape[0] * voxels;
  float* x = into.x.data_ptr<float>();
  int64_t* y = into.y.data_ptr<int64_t>();
  for (size_t k = 0; k < ids.size(); ++k) {
    const PatchRef r = sampler_.at(epoch, ids[k]);
    data_.read_patch(r.volume, r.corner, p, x + k * numel, y + k * voxels);
    std::vector<int64_t> dims;
    for (int64_t a = 0; a < 3; ++a) {
      if (r.flip[a])
        dims.push_back(a);
    }
    if (!dims.empty()) {  // mirror in place (host memory, reader thread)
      at::Tensor xs = into.x[static_cast<int64_t>(k)];
      at::Tensor ys = into.y[static_cast<int64_t>(k)];
      std::vector<int64_t> xdims;
      for (int64_t a : dims)
        xdims.push_back(a + 1);  // after the channel axis
      xs.copy_(xs.flip(xdims));
      ys.copy_(ys.flip(dims));
    }
  }
}

}  // namespace memtrain
