#include "memtrain/input/episode_source.h"

#include <torch/torch.h>

#include "memtrain/data/h5/h5_dataset.h"
#include "memtrain/util/error.h"

namespace memtrain {

Batch EpisodeSource::allocate(int64_t n, bool pinned) const {
  const DatasetInfo& info = data_.info();
  const int64_t rows = sampler_.shape().rows();
  std::vector<int64_t> xs = {n * rows};
  xs.insert(xs.end(), info.sample_shape.begin(), info.sample_shape.end());
  const auto opts = [&](at::ScalarType t) {
    return at::TensorOptions().dtype(t).pinned_memory(pinned);
  };
  Batch b;
  b.x = at::empty(xs, opts(at::kFloat));
  b.y = at::empty({n, rows}, opts(at::kLong));
  return b;
}

void EpisodeSource::read(
    int64_t epoch, const std::vector<int64_t>& ids, Batch& into) const {
  const EpisodeShape& shape = sampler_.shape();
  const int64_t e = fixed_epoch_ >= 0 ? fixed_epoch_ : epoch;
  std::vector<int64_t> rows;
  std::vector<std::vector<int64_t>> classes(ids.size());
  rows.reserve(ids.size() * shape.rows());
  for (size_t k = 0; k < ids.size(); ++k) {
    const std::vector<int64_t> r = sampler_.rows(e, ids[k], &classes[k]);
    rows.insert(rows.end(), r.begin(), r.end());
  }
  int64_t* y = into.y.data_ptr<int64_t>();
  data_.read(rows, into.x.data_ptr<float>(), y);
  if (finite_ != nullptr) {
    finite_->check(
        data_.info().path,
        data_.info().sample_dataset,
        into.x,
        e,
        [&](int64_t k) { return "row " + std::to_string(rows[k]); });
  }
  // The file's labels -> episode labels (and a check of the layout).
  for (size_t k = 0; k < ids.size(); ++k) {
    const std::vector<int64_t>& cls = classes[k];
    for (int64_t p = 0; p < shape.rows(); ++p) {
      int64_t& label = y[k * shape.rows() + p];
      MT_INTERNAL_ASSERT(label == cls[shape.label_at(p)]);
      label = shape.label_at(p);
    }
  }
}

}  // namespace memtrain
