#pragma once
// Validation in the loop (validate.cpp; private to the library): the
// task's validation with the batch halved on OOM, and the one batch loop
// of row validation the tasks share.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "train/loop/run_state.h"

namespace memtrain {

// Collective. The task's validation (Task::validate), the model in eval
// mode; halves the batch on OOM (counters.val_micro). With overlay_epoch >=
// 0 each rank writes its volumes' overlays into
// output.dir/val/epoch-<overlay_epoch + 1> (Note [Validation overlays]).
ValResult validate(
    RunState& run, RunCounters& counters, int64_t overlay_epoch = -1);
// How validation halves its batch on OOM; the message names `least`, the
// smallest batch ("batch 1", "one episode").
OomRetry validation_oom_retry(const RunState& run, const std::string& least);
// The one batch loop of row validation: `rows` of data.val read in order in
// batches of counters.val_micro (halved on OOM, the batch replayed), each
// copied to the device and handed to `fn(batch, first)` with `first` its
// position in `rows`. `fn` must keep what it computes only once it
// returns (an OOM inside replays it); what it keeps belongs in host memory.
// Returns this rank's OOM retries.
int64_t for_each_val_batch(
    RunState& run,
    RunCounters& counters,
    const std::vector<int64_t>& rows,
    const std::function<void(const Batch&, size_t)>& fn);

}  // namespace memtrain
