#include "memtrain/input/batch_loader.h"

#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <sstream>

#include "data/h5/layout.h"
#include "memtrain/data/h5/h5_dataset.h"
#include "memtrain/model/feature_cache.h"
#include "memtrain/util/error.h"
#include "memtrain/util/rank_log.h"

namespace memtrain {
namespace {

at::Tensor host_empty(std::vector<int64_t> shape, at::ScalarType t, bool pin) {
  return at::empty(shape, at::TensorOptions().dtype(t).pinned_memory(pin));
}

// "a, b, c and 4 more" for the first items of `total`.
std::string joined(const std::vector<std::string>& items, size_t total) {
  std::string s;
  for (size_t i = 0; i < items.size(); ++i)
    s += (i ? ", " : "") + items[i];
  if (total > items.size())
    s += " and " + std::to_string(total - items.size()) + " more";
  return s;
}

}  // namespace

void FiniteCheck::check(
    const std::string& file,
    const std::string& dataset,
    const at::Tensor& x,
    int64_t epoch,
    const std::function<std::string(int64_t)>& where) const {
  if (!x.defined() || x.numel() == 0 || (!stop_ && told_.load()))
    return;
  const float* p = x.data_ptr<float>();
  const int64_t n = x.size(0);
  const int64_t per = x.numel() / n;
  std::vector<std::string> bad;
  size_t count = 0;
  int64_t first_k = -1, first_e = 0;
  float first_v = 0;
  for (int64_t k = 0; k < n; ++k) {
    const float* row = p + k * per;
    bool finite = true;
    for (int64_t e = 0; e < per; ++e)
      finite = finite && std::isfinite(row[e]);
    if (finite)
      continue;
    if (first_k < 0) {
      first_k = k;
      while (std::isfinite(row[first_e]))
        ++first_e;
      first_v = row[first_e];
    }
    if (bad.size() < 8)
      bad.push_back(where(k));
    ++count;
  }
  if (count == 0)
    return;
  std::ostringstream what;
  what << role_ << " '" << file << "' dataset '" << dataset
       << "': " << where(first_k) << " holds " << first_v << " (element "
       << first_e << ")";
  if (count > 1) {
    what << ", and so do " << count - 1 << " more of this batch ("
         << joined(
                std::vector<std::string>(bad.begin() + 1, bad.end()), count - 1)
         << ")";
  }
  what << ", read in epoch " << epoch + 1
       << "; training.nonfinite=" << (stop_ ? "stop" : "skip");
  if (stop_) {
    throw Error(
        what.str() +
        ": stopped before any update from it. Fix or drop those samples "
        "(or set training.nonfinite=skip to skip the windows they reach)");
  }
  if (told_.exchange(true))
    return;
  const std::string line = what.str() +
                           ": the windows they reach are skipped (said once; "
                           "training.nonfinite=stop stops at the first)";
  log_event("warning: " + line);
  std::fprintf(stderr, "memtrain: warning: %s\n", line.c_str());
  std::fflush(stderr);
}

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
  b.y = info.targets > 0 ? host_empty({n, info.targets}, at::kFloat, pinned)
                         : host_empty(ys, at::kLong, pinned);
  if (info.context_features > 0)
    b.context = host_empty({n, info.context_features}, at::kFloat, pinned);
  return b;
}

void RowSource::read(
    int64_t epoch, const std::vector<int64_t>& ids, Batch& into) const {
  const DatasetInfo& info = data_.info();
  const bool targets = info.targets > 0;  // regression: float targets
  data_.read(
      ids,
      into.x.data_ptr<float>(),
      targets ? nullptr : into.y.data_ptr<int64_t>(),
      into.context.defined() ? into.context.data_ptr<float>() : nullptr,
      targets ? into.y.data_ptr<float>() : nullptr);
  if (finite_ != nullptr) {
    const auto row = [&](int64_t k) { return "row " + std::to_string(ids[k]); };
    finite_->check(info.path, info.sample_dataset, into.x, epoch, row);
    if (targets)
      finite_->check(
          info.path, layout::path(layout::kTargets), into.y, epoch, row);
    if (into.context.defined()) {
      finite_->check(
          info.path, info.context_dataset(), into.context, epoch, row);
    }
  }
  if (transform_.active())
    transform_images(transform_, epoch, ids, into.x);
}

Batch PatchSource::allocate(int64_t n, bool pinned) const {
  const auto& p = sampler_.patch();
  const int64_t c = data_.info().sample_shape[0];
  Batch b;
  b.x = host_empty({n, c, p[0], p[1], p[2]}, at::kFloat, pinned);
  b.y = host_empty({n, p[0], p[1], p[2]}, at::kLong, pinned);
  if (context_.on())
    b.context = host_empty({n, c, p[0], p[1], p[2]}, at::kFloat, pinned);
  if (origins_)
    b.origin = host_empty({n, kOriginColumns}, at::kLong, false);
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
    if (origins_) {
      int64_t* o = into.origin.data_ptr<int64_t>() + k * kOriginColumns;
      o[kOriginSet] = kTrainOrigin;
      o[kOriginVolume] = r.volume;
      for (int64_t a = 0; a < 3; ++a) {
        o[kOriginCorner + a] = r.corner[a];
        o[kOriginFlip + a] = r.flip[a] ? 1 : 0;
      }
    }
    if (context_.on()) {
      const Box box = context_box(r.corner, p, context_);
      const int64_t c = data_.info().sample_shape[0];
      const at::Tensor crop =
          at::empty({c, box.size[0], box.size[1], box.size[2]}, at::kFloat);
      data_.read_patch(
          r.volume, box.corner, box.size, crop.data_ptr<float>(), nullptr);
      into.context[static_cast<int64_t>(k)].copy_(
          resize_context(crop, p, context_));
    }
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
      if (context_.on()) {
        at::Tensor cs = into.context[static_cast<int64_t>(k)];
        cs.copy_(cs.flip(xdims));
      }
    }
  }
  if (finite_ != nullptr) {
    const auto patch_at = [&](int64_t k) {
      const PatchRef r = sampler_.at(epoch, ids[k]);
      return "volume " + std::to_string(r.volume) + "'s patch at (" +
             std::to_string(r.corner[0]) + ", " + std::to_string(r.corner[1]) +
             ", " + std::to_string(r.corner[2]) + ")";
    };
    const std::string& file = data_.info().path;
    const std::string dataset = layout::path(layout::kVolumes);
    finite_->check(file, dataset, into.x, epoch, patch_at);
    if (context_.on()) {  // the crop reaches voxels the patch does not
      finite_->check(file, dataset, into.context, epoch, [&](int64_t k) {
        return "the context crop (model.context.scale) around " + patch_at(k);
      });
    }
  }
}

}  // namespace memtrain
