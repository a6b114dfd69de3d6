#pragma once
// Private to the row task: validation of rows that belong to volumes.

#include <string>

#include "memtrain/model/losses.h"
#include "train/tasks/task.h"

namespace memtrain {

// Collective. Note [Volume rows]: volume v (of the distinct ids, ascending)
// on rank v mod world; per-volume Dice, its means, loss (`how`) and
// accuracy over rows, exact over ranks. With `dump_dir`, each rank writes
// its volumes' prediction grids there (docs/data-format.md).
ValResult validate_volume_rows(
    RunState& run,
    RunCounters& counters,
    const ClassificationLoss& how,
    const std::string& dump_dir);

}  // namespace memtrain
