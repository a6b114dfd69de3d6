#pragma once
// Classifier: what every model is (stem -> segments -> head; every segment
// can run checkpointed, see blocks/checkpointed.h) and ModelInput, what a
// model is built for. The models themselves are in nets/, made through the
// registry (registry.h). Parameter names are the modules' own
// ("input.weight", "blocks.0.fc1.weight", ...) and are what
// model.safetensors stores.

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "memtrain/config/train_config.h"
#include "memtrain/data/h5/h5_dataset.h"
#include "memtrain/model/blocks/checkpointed.h"
#include "memtrain/model/blocks/sync_batch_norm.h"

namespace memtrain {

class FeatureCache;  // feature_cache.h

class Classifier : public torch::nn::Module {
 public:
  // x: (N, F) or (N, C, H, W) float32 -> logits (N, num_classes);
  // (N, C, D, H, W) -> voxel logits (N, num_classes, D, H, W) for unet3d.
  // The default runs stem -> segments -> head.
  virtual torch::Tensor forward(torch::Tensor x);
  // With a second input (/context_features): models that fuse context
  // override it; the default refuses.
  virtual torch::Tensor forward(torch::Tensor x, torch::Tensor context);

  int64_t num_segments() const {
    return static_cast<int64_t>(segment_names_.size());
  }
  const std::vector<std::string>& segment_names() const {
    return segment_names_;
  }
  // Checkpoints the first `count` segments (0: none, num_segments(): all),
  // in the model's preference order: the segments with the largest
  // activations first.
  virtual void set_checkpointed(int64_t count);
  int64_t checkpointed() const {
    return checkpointed_;
  }
  // What the checkpointed segments' backward recomputes (Note [Selective
  // recompute]): kSelective keeps the outputs of the models' convolutions
  // and matrix products (kept_conv, kept_linear: a transformer's
  // projections and MLP linears) and recomputes the rest. Models of
  // sub-models pass it on.
  virtual void set_recompute(Recompute mode) {
    recompute_ = mode;
  }
  Recompute recompute() const {
    return recompute_;
  }

  // model.sync_bn (sync_batch_norm.h): with a non-empty `sync`, batch-norm
  // in training mode (not frozen) computes its statistics over every rank's
  // concurrent micro-batch, summed through `sync`; empty: each
  // micro-batch's own (the default). Throws memtrain::Error, naming
  // `model`, for a non-empty `sync` on a model without batch-norm.
  void set_batch_norm_sync(BatchNormSync sync, const std::string& model);
  const BatchNormSync& batch_norm_sync() const {
    return batch_norm_sync_;
  }

  // model.channels_last: every 4-D parameter and buffer in channels-last
  // (NHWC) memory order, the same values; autocast_forward() gives the
  // model its 4-D inputs in that order too. Call on the device, before the
  // gradient buckets and the optimizer state exist.
  void to_channels_last();
  bool channels_last() const {
    return channels_last_;
  }

  // Where a model can trade training speed for memory (the U-Net's decoder
  // input, Note [U-Net decoder input]): `lean` (the default) saves memory,
  // otherwise the faster form. Without memory.budget a run takes the
  // faster; with one, the faster where it fits the plan (Note [Planning
  // the faster form]). The parameters and the function are the same
  // either way. has_lean_form: whether set_memory_lean changes anything.
  virtual bool has_lean_form() const {
    return false;
  }
  virtual void set_memory_lean(bool lean) {
    (void)lean;
  }

  // A frozen extraction run in chunks (dinov3: the backbone over slices,
  // model.slice_chunk): how many units a micro-batch of `micro` samples
  // has (0: the model has no such extraction), and how many go in one
  // call (0: all at once). The planner chooses it under a budget (Note
  // [Planning the extraction chunk] in planning.cpp).
  virtual int64_t chunk_units(int64_t micro) const {
    (void)micro;
    return 0;
  }
  virtual void set_chunk(int64_t units) {
    (void)units;
  }

  // Where the samples of the next forward() come from ((n, kOriginColumns)
  // int64 host rows, feature_cache.h; undefined: unknown), for a model
  // that keeps what a frozen part computed from them (model.feature_cache).
  // That forward consumes them. Other models ignore them.
  virtual void set_origins(const torch::Tensor& origins) {
    (void)origins;
  }
  // model.feature_cache=host: the cache the model keeps its frozen
  // extraction's outputs in (the rules refuse the key for other models).
  virtual void set_feature_cache(std::shared_ptr<FeatureCache> cache) {
    (void)cache;
  }

  // The device peaks of the model's own phases since the last call, by
  // phase ("backbone", "context": dinov3's extractions), for the window
  // record's mem_peak_<phase>; empty for models without any.
  virtual std::vector<std::pair<std::string, int64_t>> take_phase_peaks() {
    return {};
  }

 protected:
  // The sequential structure forward() runs by default. Models that
  // override forward() need not implement them.
  virtual torch::Tensor stem(torch::Tensor x);
  virtual torch::Tensor segment(int64_t i, torch::Tensor x);
  virtual torch::Tensor head(torch::Tensor x);

  // Segments (checkpointed as set_checkpointed() says), then head.
  torch::Tensor body(torch::Tensor x);

  // Models whose batch-norm reads batch_norm_sync_ say so.
  virtual bool has_batch_norm() const {
    return false;
  }

  std::vector<std::string> segment_names_;
  BatchNormSync batch_norm_sync_;

 private:
  int64_t checkpointed_ = 0;
  Recompute recompute_ = Recompute::kAll;
  bool channels_last_ = false;
};

// GroupNorm's group count for `channels`: the largest <= 8 that divides it.
int64_t groups_for(int64_t channels);

struct ModelInput {
  SampleKind kind = SampleKind::kFeatures;
  std::vector<int64_t> sample_shape;  // [F], [C, H, W] or [C, D, H, W]
  int64_t num_classes = 0;
  int64_t context_features = 0;  // F2 of /context_features (0: none)
  // Pairs of /images and /tokens (DatasetInfo::tokens): context_features
  // is the context length, token_max the largest id in the file.
  bool tokens = false;
  int64_t token_max = 0;
};

// The model's outputs for data.train `ti`: 1 for a binary classifier's
// logit, else model.num_classes (0: the data's classes), which must cover
// the data's classes. Throws memtrain::Error naming both.
int64_t model_num_classes(
    const ModelConfig& cfg, const DatasetInfo& ti, bool binary);

}  // namespace memtrain
