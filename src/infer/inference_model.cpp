#include "memtrain/infer/inference_model.h"

#include <torch/torch.h>

#include "memtrain/device/placement.h"
#include "memtrain/infer/device_setup.h"
#include "memtrain/infer/sliding_window.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/model/models.h"
#include "memtrain/model/registry.h"
#include "memtrain/model/volume_model.h"
#include "memtrain/util/error.h"
#include "memtrain/weights/model_state.h"

namespace memtrain {

TrainedOn trained_on(const TrainConfig& cfg, const std::string& cmd) {
  MT_CHECK(
      trains_on(cfg.model.name, kOnVolumes),
      cmd,
      ": model.name=",
      cfg.model.name,
      "; ",
      cmd,
      " segments volumes with a ",
      models_on(kOnVolumes),
      " config");
  check_model_config(cfg);
  TrainedOn on;
  on.data = H5Dataset::open(cfg.data.train, "data.train").info();
  check_model_fits(
      cfg.model.name,
      on.data.kind,
      on.data.paired,
      "data.train '" + on.data.path + "'");
  check_volume_model(cfg, on.data);
  on.num_classes = model_num_classes(cfg.model, on.data, /*binary=*/false);
  return on;
}

struct InferenceModel::Impl {
  const TrainConfig& cfg;
  const Placement& placement;
  TrainedOn on;
  std::shared_ptr<Classifier> model;
  int64_t sw_batch = 0;  // halved on running out of device memory
};

InferenceModel::InferenceModel(
    const TrainConfig& cfg, const TrainedOn& on, const Placement& placement)
    : impl_(new Impl{cfg, placement, on, nullptr, cfg.validation.sw_batch}) {
  const Budget budget = start_on_device(cfg, placement);
  memory::DeviceScope device;
  try {
    impl_->model =
        make_model(cfg.model, volume_model_input(cfg, on.data, on.num_classes));
    impl_->model->to(placement.device());
  } catch (const c10::OutOfMemoryError&) {
    throw Error(detail::concat(
        "the model's parameters do not fit in ",
        budget.limited() ? "memory.budget=" + cfg.memory.budget.text()
                         : placement.describe(),
        " (",
        format_bytes(double(memory::stats().reserved)),
        " allocated when it ran out); raise memory.budget or use a device "
        "with more memory"));
  }
  impl_->model->eval();
}

InferenceModel::~InferenceModel() = default;

void InferenceModel::load_weights(
    const std::string& path, const std::string& what) {
  load_weights_file(*impl_->model, path, /*strict=*/true, what);
}

const TrainedOn& InferenceModel::trained_on() const {
  return impl_->on;
}

const TrainConfig& InferenceModel::config() const {
  return impl_->cfg;
}

at::Tensor InferenceModel::predict_volume(
    const at::Tensor& volume, const std::string& where, int rank) {
  Impl& m = *impl_;
  torch::NoGradGuard no_grad;
  memory::DeviceScope device;
  int64_t retries = 0;  // the halvings are in the log (retry_on_oom)
  return volume_probs(
      volume,
      m.on.num_classes,
      [&m](
          const at::Tensor& windows,
          const at::Tensor& context,
          const at::Tensor&) {
        return autocast_forward(
            *m.model, m.cfg.training, m.placement, windows, context);
      },
      m.cfg.validation,
      validation_roi(m.cfg),
      context_view(m.cfg.model),
      &m.sw_batch,
      rank,
      where,
      &retries,
      m.placement);
}

}  // namespace memtrain
