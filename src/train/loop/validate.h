#pragma once
// Validation in the loop (private to the library): the task's validation,
// the model in eval mode.

#include <cstdint>

#include "train/state/run_state.h"

namespace memtrain {

// Collective. The task's validation (Task::validate), the model in eval
// mode; halves the batch on OOM (counters.val_micro). With overlay_epoch >=
// 0 each rank writes its volumes' overlays into
// output.dir/val/epoch-<overlay_epoch + 1> (Note [Validation overlays]).
ValResult validate(
    RunState& run, RunCounters& counters, int64_t overlay_epoch = -1);

}  // namespace memtrain
