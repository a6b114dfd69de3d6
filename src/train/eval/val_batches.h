#pragma once
// What the tasks' validation shares (private to the library): how it
// halves its batch on OOM, and the one batch loop of row validation.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "train/state/run_state.h"

namespace memtrain {

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
// The most for_each_val_batch's host buffers hold at once (Note [Host
// plan]), for batches of the validation batch size the run will take
// (data.val_batch_size, else the plan's micro-batch).
int64_t val_batches_host_bytes(const RunState& run);

}  // namespace memtrain
