// Regression of rows (docs/data-format.md, "Targets"): a /features or /images
// file with /targets [N, T]; the model's T outputs, the mean squared error
// over a row's targets as its loss, validation reporting MAE and RMSE over
// every target of data.val.

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>

#include "memtrain/util/error.h"
#include "train/eval/val_batches.h"
#include "train/tasks/task.h"

namespace memtrain {
namespace {

class RegressionTask : public Task {
 public:
  void set_up(RunState& run) override {
    const DatasetInfo& ti = run.train_data->info();
    open_val_data(run);
    MT_CHECK(
        !run.val_data || run.val_data->info().targets == ti.targets,
        "data.val '",
        run.val_data ? run.val_data->info().path : std::string(),
        "' has ",
        run.val_data ? run.val_data->info().targets : 0,
        " targets a row but data.train '",
        ti.path,
        "' has ",
        ti.targets,
        "; both files need the same /targets width");
    MT_CHECK(
        run.cfg.model.num_classes == 0 ||
            run.cfg.model.num_classes == ti.targets,
        "model.num_classes=",
        run.cfg.model.num_classes,
        " but data.train '",
        ti.path,
        "' has ",
        ti.targets,
        " targets a row (/targets), one output each; set "
        "model.num_classes=0 (from the data)");
    run.num_classes = ti.targets;  // the model's outputs
    run.images = resolve_image_transforms(run.cfg, ti, false);
    run.source = std::make_unique<RowSource>(
        *run.train_data, run.images.train, &run.train_finite);
  }

  // Per row: the mean over its T targets of the squared error.
  at::Tensor loss_sum(
      const at::Tensor& outputs, const at::Tensor& y) const override {
    return (outputs - y).pow(2).mean(1).sum();
  }

  std::vector<MetricSpec> metrics() const override {
    return {{"val_mae", Better::kLower}, {"val_rmse", Better::kLower}};
  }

  std::string kind_words() const override {
    return "a regression";
  }

  // This rank's contiguous share of data.val's rows; sums of |e| and e^2
  // in float64, one all-reduce.
  ValResult validate(
      RunState& run, RunCounters& counters, const std::string&) override {
    const std::vector<int64_t> rows = val_rows_of_rank(run).rows;
    double abs_sum = 0.0, sq_sum = 0.0;
    const int64_t retries =
        for_each_val_batch(run, counters, rows, [&](const Batch& b, size_t) {
          const at::Tensor e =
              (forward(run, b.x, b.context) - b.y).to(torch::kFloat64);
          const double a = e.abs().sum().item<double>();
          const double s = e.pow(2).sum().item<double>();
          // Counted once the whole batch succeeded (an OOM replays it).
          abs_sum += a;
          sq_sum += s;
        });
    auto totals = torch::tensor(
        {abs_sum, sq_sum, static_cast<double>(rows.size())}, torch::kFloat64);
    run.comm.all_reduce_sum(totals);
    const double count = totals[2].item<double>();
    const double values = count * static_cast<double>(run.num_classes);
    const double mse = totals[1].item<double>() / values;
    const double mae = totals[0].item<double>() / values;
    const double rmse = std::sqrt(mse);
    ValResult r;
    r.loss = mse;  // the training loss's mean over rows
    r.samples = static_cast<int64_t>(count);
    r.oom_retries = retries;
    r.batch = counters.val_micro;
    r.metrics = {
        val_metric("val_mae", mae, Better::kLower, "val MAE"),
        val_metric("val_rmse", rmse, Better::kLower, "val RMSE")};
    r.details = nlohmann::json({{"val_samples", r.samples}}).dump();
    return r;
  }

  std::string describe_outputs(const RunState& run) const override {
    return std::to_string(run.num_classes) + " outputs: regression (MSE)";
  }
};

}  // namespace

std::unique_ptr<Task> make_regression_task(const TrainConfig&) {
  return std::make_unique<RegressionTask>();
}

}  // namespace memtrain
