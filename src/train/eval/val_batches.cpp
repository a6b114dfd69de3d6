#include "train/eval/val_batches.h"

#include <torch/torch.h>

#include "memtrain/memory/device_memory.h"
#include "memtrain/memory/oom_guard.h"
#include "memtrain/util/error.h"
#include "train/state/run_state.h"

namespace memtrain {

OomRetry validation_oom_retry(const RunState& run, const std::string& least) {
  OomRetry how;
  how.what = "validation batch";
  how.where = "validation";
  how.replay = "the batch";
  how.rank = run.comm.rank();
  how.give_up = [&run, least](int64_t, int64_t, int64_t peak) {
    return detail::concat(
        "out of device memory in validation even at ",
        least,
        " within memory.budget=",
        run.budget.spec,
        " (measured peak ",
        format_bytes(static_cast<double>(peak)),
        ")");
  };
  return how;
}

namespace {

// The validation rows' loader: read in place, on the calling thread.
Prefetcher val_loader(const RowSource& source) {
  return Prefetcher(source, /*depth=*/0, /*threads=*/0);
}

}  // namespace

int64_t val_batches_host_bytes(const RunState& run) {
  const RowSource source(*run.val_data, run.images.val, &run.val_finite);
  const int64_t micro = run.cfg.data.val_batch_size > 0
                            ? run.cfg.data.val_batch_size
                            : run.plan.micro_batch;
  return val_loader(source).host_bytes_bound(micro);
}

int64_t for_each_val_batch(
    RunState& run,
    RunCounters& counters,
    const std::vector<int64_t>& rows,
    const std::function<void(const Batch&, size_t)>& fn) {
  const RowSource source(*run.val_data, run.images.val, &run.val_finite);
  Prefetcher loader = val_loader(source);
  const OomRetry how = validation_oom_retry(run, "batch 1");
  int64_t retries = 0;
  for (size_t s = 0; s < rows.size();) {
    retries += retry_on_oom(how, counters.val_micro, [&](int64_t micro) {
      const size_t e = std::min(rows.size(), s + static_cast<size_t>(micro));
      const std::vector<int64_t> idx(rows.begin() + s, rows.begin() + e);
      fn(load_batch(run, loader, 0, idx), s);
      s = e;  // only once the whole batch succeeded
    });
  }
  return retries;
}

}  // namespace memtrain
