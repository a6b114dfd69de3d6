#pragma once
// What every run on a device starts with and runs its model through, a
// training run (set_up_run) or inference (InferenceModel).

#include <ATen/core/Tensor.h>

#include "memtrain/config/train_config.h"
#include "memtrain/memory/budget.h"

namespace memtrain {

class Classifier;
class Placement;

// training.amp checked against the device (fp16 needs CUDA),
// training.deterministic applied, and memory.budget made the caching
// allocator's cap, less what the process holds outside it (Note [A budget
// is the whole process]), with the cache emptied and the peak reset.
// Returns the budget. Throws memtrain::Error.
Budget start_on_device(const TrainConfig& cfg, const Placement& placement);

// training.cudnn_benchmark resolved: auto is on unless
// training.deterministic. start_on_device() applies it (cuDNN only: GPUs).
bool cudnn_benchmark_on(const TrainingConfig& training);
// model.channels_last resolved for `placement`: auto is on for the 2D
// convolutional models on a CUDA device (for cuDNN's NHWC kernels; not
// measured yet); off on a CPU, where it would only change the rounding.
bool channels_last_on(const ModelConfig& model, const Placement& placement);

// model(x), or model(x, context) when `context` is defined, under
// training.amp's autocast (off, fp16, bf16) on `placement`'s device; the
// logits as float32. A channels-last model gets a 4-D x in that order.
// `origins` (model/feature_cache.h; undefined: unknown) say where x's
// samples come from, for the model's feature cache.
at::Tensor autocast_forward(
    Classifier& model,
    const TrainingConfig& training,
    const Placement& placement,
    const at::Tensor& x,
    const at::Tensor& context,
    const at::Tensor& origins = {});

}  // namespace memtrain
