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

// model(x), or model(x, context) when `context` is defined, under
// training.amp's autocast (off, fp16, bf16) on `placement`'s device; the
// logits as float32.
at::Tensor autocast_forward(
    Classifier& model,
    const TrainingConfig& training,
    const Placement& placement,
    const at::Tensor& x,
    const at::Tensor& context);

}  // namespace memtrain
