#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <numeric>

#include "memtrain/memory/device_memory.h"
#include "memtrain/train/oom_guard.h"
#include "memtrain/train/roc_auc.h"
#include "memtrain/train/validator.h"
#include "memtrain/util/error.h"
#include "memtrain/util/rank_log.h"
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

// Binary classifiers: the ROC AUC of the whole validation set. Every rank's
// scores (logits; AUC depends on their order only) and labels gathered to
// every rank, exactly (all_gather_rows), and scored on the host.
double validation_auc(
    RunState& run,
    RunCounters& counters,
    const at::Tensor& mine,
    int64_t begin,
    int64_t n) {
  std::vector<double> scores(n);
  std::vector<int64_t> labels(n);
  {
    memory::HostScope host;
    const at::Tensor all =
        run.comm.all_gather_rows(mine, begin, n).cpu().contiguous();
    const double* p = all.data_ptr<double>();
    for (int64_t i = 0; i < n; ++i) {
      scores[i] = p[2 * i];
      labels[i] = p[2 * i + 1] != 0.0 ? 1 : 0;
    }
  }
  const double auc = roc_auc(scores, labels);
  if (std::isnan(auc) && !counters.auc_warned) {
    counters.auc_warned = true;
    int64_t positives = 0;
    for (int64_t y : labels)
      positives += y;
    log_event(
        "warning: val_auc is undefined: data.val '" +
            run.val_data->info().path + "' has " + std::to_string(positives) +
            " row(s) of label 1 and " + std::to_string(n - positives) +
            " of label 0 (AUC needs both); val_auc is written as null",
        /*echo=*/run.comm.rank() == 0);
  }
  return auc;
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
  at::Tensor scored;  // binary: (rows, 2) float64 [logit, label], host
  if (run.binary()) {
    memory::HostScope host;
    scored = torch::zeros({end - begin, 2}, torch::kFloat64);
  }
  const int64_t retries = for_each_val_batch(
      run, counters, rows, [&](const Batch& b, size_t first) {
        const at::Tensor logits = forward(run, b.x, b.context);
        const double batch_loss =
            classification_loss(logits, b.y, run.classification).item<double>();
        const int64_t batch_correct =
            predicted_class(logits, run.binary()).eq(b.y).sum().item<int64_t>();
        if (run.binary()) {
          const at::Tensor s = at::stack(
              {logits.squeeze(1).to(torch::kFloat64), b.y.to(torch::kFloat64)},
              1);
          memory::HostScope host;
          scored.narrow(0, static_cast<int64_t>(first), b.size())
              .copy_(s.cpu());
        }
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
  if (run.binary())
    r.auc = validation_auc(run, counters, scored, begin, n);
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
