#include "memtrain/model/models.h"

#include <algorithm>

#include "memtrain/model/registry.h"
#include "memtrain/util/error.h"

namespace memtrain {

torch::Tensor Classifier::forward(torch::Tensor x) {
  return body(stem(x));
}

torch::Tensor Classifier::body(torch::Tensor x) {
  for (int64_t i = 0; i < num_segments(); ++i) {
    if (i < checkpointed_) {
      x = checkpoint(
          [this, i](const at::Tensor& t) { return segment(i, t); },
          x,
          recompute_);
    } else {
      x = segment(i, x);
    }
  }
  return head(x);
}

torch::Tensor Classifier::forward(torch::Tensor x, torch::Tensor context) {
  throw InternalError("this model takes no context features");
}

torch::Tensor Classifier::stem(torch::Tensor x) {
  throw InternalError("stem(): not a sequential model");
}
torch::Tensor Classifier::segment(int64_t i, torch::Tensor x) {
  throw InternalError("segment(): not a sequential model");
}
torch::Tensor Classifier::head(torch::Tensor x) {
  throw InternalError("head(): not a sequential model");
}

void Classifier::set_checkpointed(int64_t count) {
  MT_INTERNAL_ASSERT(count >= 0 && count <= num_segments());
  checkpointed_ = count;
}

void Classifier::set_batch_norm_sync(
    BatchNormSync sync, const std::string& model) {
  MT_CHECK(
      !sync || has_batch_norm(),
      "model.sync_bn: true needs a model with batch-norm (",
      models_with(&ModelRow::batch_norm),
      "); model.name=",
      model,
      " has none");
  batch_norm_sync_ = std::move(sync);
}

void Classifier::to_channels_last() {
  torch::NoGradGuard no_grad;
  for (auto& t : parameters()) {
    if (t.dim() == 4)
      t.set_data(t.contiguous(at::MemoryFormat::ChannelsLast));
  }
  for (auto& t : buffers()) {
    if (t.dim() == 4)
      t.set_data(t.contiguous(at::MemoryFormat::ChannelsLast));
  }
  channels_last_ = true;
}

int64_t groups_for(int64_t channels) {
  for (int64_t g = 8; g > 1; --g) {
    if (channels % g == 0)
      return g;
  }
  return 1;
}

int64_t model_num_classes(
    const ModelConfig& cfg, const DatasetInfo& ti, bool binary) {
  const int64_t asked = cfg.num_classes;
  MT_CHECK(
      binary || asked == 0 || asked >= ti.num_classes,
      "model.num_classes=",
      asked,
      " but data.train '",
      ti.path,
      "' has labels up to ",
      ti.num_classes - 1,
      " (",
      ti.num_classes,
      " classes); set model.num_classes to at least ",
      ti.num_classes,
      " or 0 (from the data)");
  return binary ? 1 : std::max(ti.num_classes, asked);
}

}  // namespace memtrain
