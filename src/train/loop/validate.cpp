#include "train/loop/validate.h"

#include <torch/torch.h>

#include <cstdio>

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
