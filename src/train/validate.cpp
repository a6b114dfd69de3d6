#include <torch/torch.h>

#include <cstdio>
#include <numeric>

#include "memtrain/train/oom_guard.h"
#include "memtrain/train/validator.h"
#include "memtrain/util/error.h"
#include "run_state.h"

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

// Whole volumes by sliding window (Note [Whole-volume validation]).
ValResult validate_volumes(RunState& run, const std::string& overlays) {
  Validator validator(
      *run.val_data,
      run.cfg.validation,
      run.roi(),
      run.num_classes,
      run.comm,
      run.placement);
  const VolumeValResult v = validator.run(
      [&run](const at::Tensor& windows) {
        return forward(run, windows, at::Tensor());
      },
      overlays);
  ValResult r;
  r.loss = v.loss;
  r.samples = v.volumes;
  r.oom_retries = v.oom_retries;
  r.batch = v.sw_batch;
  r.dice = v.dice;
  r.dice_per_class = v.dice_per_class;
  return r;
}

// Rows: this rank's contiguous share.
ValResult validate_rows(RunState& run, RunCounters& counters) {
  const int64_t n = run.val_data->info().num_samples;
  const int64_t begin = n * run.comm.rank() / run.comm.size();
  const int64_t end = n * (run.comm.rank() + 1) / run.comm.size();
  std::vector<int64_t> rows(end - begin);
  std::iota(rows.begin(), rows.end(), begin);
  double loss_sum = 0.0;
  int64_t correct = 0;
  const int64_t retries =
      for_each_val_batch(run, counters, rows, [&](const Batch& b, size_t) {
        const at::Tensor logits = forward(run, b.x, b.context);
        const double batch_loss =
            torch::nn::functional::cross_entropy(
                logits,
                b.y,
                torch::nn::functional::CrossEntropyFuncOptions().reduction(
                    torch::kSum))
                .item<double>();
        const int64_t batch_correct =
            logits.argmax(1).eq(b.y).sum().item<int64_t>();
        // Counted only once the whole batch succeeded: a retry after an
        // OOM must not count it twice.
        loss_sum += batch_loss;
        correct += batch_correct;
      });
  auto totals = torch::tensor(
      {loss_sum,
       static_cast<double>(correct),
       static_cast<double>(end - begin)},
      torch::kFloat64);
  run.comm.all_reduce_sum(totals);
  const double count = totals[2].item<double>();
  ValResult r;
  r.loss = totals[0].item<double>() / count;
  r.accuracy = totals[1].item<double>() / count;
  r.samples = static_cast<int64_t>(count);
  r.oom_retries = retries;
  r.batch = counters.val_micro;
  return r;
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
  const RowSource source(*run.val_data);
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
  ValResult r = run.episodic() ? validate_episodes(run, counters)
                : run.dual     ? validate_pairs(run, counters)
                : run.volumes()
                    ? validate_volumes(run, overlay_dir(run, overlay_epoch))
                : run.volume_rows() ? validate_volume_rows(
                                          run,
                                          counters,
                                          run.cfg.validation.dump_predictions
                                              ? overlay_dir(run, overlay_epoch)
                                              : "")
                                    : validate_rows(run, counters);
  run.model->train();
  return r;
}

at::Tensor predict_volume(RunState& run, const at::Tensor& volume) {
  MT_CHECK(
      run.volumes(),
      "predict: model.name=",
      run.cfg.model.name,
      " does not segment volumes; predict needs a unet3d config");
  torch::NoGradGuard no_grad;
  run.model->eval();
  int64_t retries = 0;
  int64_t sw_batch = run.cfg.validation.sw_batch;
  at::Tensor probs = volume_probs(
      volume,
      run.num_classes,
      [&run](const at::Tensor& windows) {
        return forward(run, windows, at::Tensor());
      },
      run.cfg.validation,
      run.roi(),
      &sw_batch,
      run.comm.rank(),
      "predict",
      &retries,
      run.placement);
  run.model->train();
  return probs;
}

}  // namespace memtrain
