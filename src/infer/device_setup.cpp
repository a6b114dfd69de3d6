#include "memtrain/infer/device_setup.h"

#include <torch/torch.h>

#include "memtrain/compat.h"
#include "memtrain/device/placement.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/model/models.h"
#include "memtrain/model/registry.h"
#include "memtrain/util/error.h"

namespace memtrain {

Budget start_on_device(const TrainConfig& cfg, const Placement& placement) {
  MT_CHECK(
      cfg.training.amp != Amp::kFp16 || placement.is_cuda(),
      "training.amp=fp16 needs a CUDA device (fp16 autocast and the loss "
      "scaler run on GPUs), but this rank's device is ",
      placement.describe(),
      "; use training.amp=bf16 on a CPU");
  compat::set_deterministic(cfg.training.deterministic);
  at::globalContext().setBenchmarkCuDNN(cudnn_benchmark_on(cfg.training));
  Budget budget = budget_of(cfg.memory.budget, cfg.memory.headroom);
  // The budget is the whole process's (Note [A budget is the whole
  // process]): what it holds outside the allocator comes off the cap.
  if (budget.limited()) {
    budget.outside = memory::measure_outside();
    MT_CHECK(
        budget.outside < budget.bytes,
        "memory.budget=",
        cfg.memory.budget.text(),
        " (",
        format_bytes(static_cast<double>(budget.bytes)),
        ") does not even cover what this process holds on ",
        placement.describe(),
        " outside the caching allocator (",
        format_bytes(static_cast<double>(budget.outside)),
        ": the CUDA context, cuBLAS/cuDNN and NCCL, or another process on "
        "this GPU); raise memory.budget, or give this rank a GPU of its own");
  }
  // A run starts from an empty cache and a fresh peak, whatever ran in
  // this process before it.
  memory::release_cache();
  memory::reset_peak();
  memory::set_cap(budget.allocator_cap());
  return budget;
}

bool cudnn_benchmark_on(const TrainingConfig& training) {
  return switch_on(training.cudnn_benchmark, !training.deterministic);
}

bool channels_last_on(const ModelConfig& model, const Placement& placement) {
  return switch_on(
      model.channels_last, placement.is_cuda() && model_row(model.name).conv2d);
}

at::Tensor autocast_forward(
    Classifier& model,
    const TrainingConfig& training,
    const Placement& placement,
    const at::Tensor& x,
    const at::Tensor& context,
    const at::Tensor& origins) {
  compat::AutocastGuard amp(
      training.amp != Amp::kOff,
      placement.is_cuda(),
      training.amp == Amp::kBf16 ? torch::kBFloat16 : torch::kHalf);
  const at::Tensor in = model.channels_last() && x.dim() == 4
                            ? x.contiguous(at::MemoryFormat::ChannelsLast)
                            : x;
  model.set_origins(origins);  // the forward below consumes them
  const at::Tensor logits =
      context.defined() ? model.forward(in, context) : model.forward(in);
  return logits.to(torch::kFloat32);
}

}  // namespace memtrain
