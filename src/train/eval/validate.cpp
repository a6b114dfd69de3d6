#include "train/eval/validate.h"

#include <torch/torch.h>

#include <cstdio>

#include "memtrain/memory/device_memory.h"
#include "memtrain/train/loop/oom_guard.h"
#include "memtrain/util/error.h"
#include "train/loop/run_state.h"
#include "train/tasks/task.h"

namespace memtrain {
namespace {

// output.dir/val/epoch-XXX (1-based), or "" for none.
std::string overlay_dir(const RunState& run, int64_t epoch) {
  if (epoch < 0)
    return "";
  char name[32];
  std::snprintf(name, sizeof name, "/val/epoch-%03lld", (long long)epoch + 1);
  return run.cfg.output.dir + name;
}

}  // namespace

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

int64_t for_each_val_batch(
    RunState& run,
    RunCounters& counters,
    const std::vector<int64_t>& rows,
    const std::function<void(const Batch&, size_t)>& fn) {
  const RowSource source(*run.val_data, run.images.val, &run.val_finite);
  Prefetcher loader(source, /*depth=*/0, /*threads=*/0);
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

ValResult validate(
    RunState& run, RunCounters& counters, int64_t overlay_epoch) {
  torch::NoGradGuard no_grad;
  run.model->eval();
  ValResult r =
      run.task->validate(run, counters, overlay_dir(run, overlay_epoch));
  run.model->train();
  return r;
}

}  // namespace memtrain
