// Classifiers of /features and /images rows: softmax cross-entropy, or one
// logit (model.num_classes=1, binary cross-entropy, ROC AUC); validation
// per row, or per volume when data.val's rows belong to volumes (Note
// [Volume rows]).

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>

#include "memtrain/data/h5/volume_rows.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/metrics/roc_auc.h"
#include "memtrain/model/losses.h"
#include "memtrain/train/logs/metrics.h"
#include "memtrain/util/error.h"
#include "memtrain/util/rank_log.h"
#include "train/eval/val_batches.h"
#include "train/tasks/task.h"
#include "train/tasks/volume_rows.h"

namespace memtrain {
namespace {

// A label other than 0 and 1 in a binary run's file: named by its first row.
void check_binary_labels(const DatasetInfo& info, const std::string& role) {
  for (size_t i = 0; i < info.row_labels.size(); ++i) {
    const int64_t y = info.row_labels[i];
    MT_CHECK(
        y == 0 || y == 1,
        role,
        " '",
        info.path,
        "': row ",
        i,
        " has label ",
        y,
        ", but model.num_classes=1 (a binary classifier) needs labels 0 and "
        "1 only; set model.num_classes=0 to train ",
        info.num_classes,
        " classes with a softmax, or write the labels as 0/1");
  }
}

class RowTask : public Task {
 public:
  explicit RowTask(const TrainConfig& cfg) {
    how_.binary = cfg.model.num_classes == 1;
    how_.label_smoothing = cfg.training.label_smoothing;
  }

  void set_up(RunState& run) override {
    const DatasetInfo& ti = run.train_data->info();
    open_val_data(run);
    volume_rows_ = run.val_data && run.val_data->info().has_volume_rows;
    if (how_.binary) {
      check_binary_labels(ti, "data.train");
      if (run.val_data) {
        MT_CHECK(
            !volume_rows_,
            "model.num_classes=1 (a binary classifier): data.val '",
            run.val_data->info().path,
            "' has rows that belong to volumes, which are scored by Dice "
            "per class; use model.num_classes=0 (2 classes) there");
        check_binary_labels(run.val_data->info(), "data.val");
      }
    }
    resolve_num_classes(run, how_.binary);
    run.images = resolve_image_transforms(run.cfg, ti, false);
    run.source = std::make_unique<RowSource>(
        *run.train_data, run.images.train, &run.train_finite);
  }

  at::Tensor loss_sum(
      const at::Tensor& logits, const at::Tensor& y) const override {
    return classification_loss(logits, y, how_);
  }

  std::vector<MetricSpec> metrics() const override {
    if (volume_rows_)
      return {{"val_dice", Better::kHigher}, {"val_accuracy", Better::kHigher}};
    if (how_.binary)
      return {{"val_accuracy", Better::kHigher}, {"val_auc", Better::kHigher}};
    return {{"val_accuracy", Better::kHigher}};
  }

  std::string kind_words() const override {
    return volume_rows_  ? "rows of volumes"
           : how_.binary ? "a binary classifier"
                         : "a classifier; val_auc needs a binary one, "
                           "model.num_classes=1";
  }

  ValResult validate(
      RunState& run,
      RunCounters& counters,
      const std::string& overlay_dir) override {
    if (volume_rows_) {
      return validate_volume_rows(
          run,
          counters,
          how_,
          run.cfg.validation.dump_predictions ? overlay_dir : "");
    }
    return validate_rows(run, counters);
  }

  std::vector<std::string> dice_classes(const RunState& run) const override {
    if (!volume_rows_)
      return {};
    return metrics_class_names(
        run.train_data->info().class_names, run.num_classes);
  }

  bool dumps_predictions() const override {
    return volume_rows_;
  }

  void describe_data(const RunState& run, std::ostream& out) const override {
    if (run.train_data->info().kind == SampleKind::kImages)
      out << "; augment " << run.images.train.describe();
  }

  void describe_val(const RunState& run, std::ostream& out) const override {
    if (volume_rows_) {  // Note [Volume rows]
      out << " rows of "
          << describe_volume_rows(index_volume_rows(run.val_data->info()))
          << ", Dice per volume";
    }
  }

  std::string describe_outputs(const RunState& run) const override {
    return how_.binary ? std::string("1 logit: binary")
                       : std::to_string(run.num_classes) + " classes";
  }

 private:
  ValResult validate_rows(RunState& run, RunCounters& counters);
  // Binary classifiers: the ROC AUC of the whole validation set.
  double validation_auc(
      RunState& run, const at::Tensor& mine, int64_t begin, int64_t n);

  ClassificationLoss how_;
  bool volume_rows_ = false;  // data.val's rows belong to volumes
  bool auc_warned_ = false;   // val_auc undefined (one class): warned once
};

// Every rank's scores (logits; AUC depends on their order only) and labels
// gathered to every rank, exactly (all_gather_rows), and scored on the host.
double RowTask::validation_auc(
    RunState& run, const at::Tensor& mine, int64_t begin, int64_t n) {
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
  if (std::isnan(auc) && !auc_warned_) {
    auc_warned_ = true;
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
ValResult RowTask::validate_rows(RunState& run, RunCounters& counters) {
  const int64_t n = run.val_data->info().num_samples;
  const RowShare share = val_rows_of_rank(run);
  const int64_t begin = share.begin;
  const std::vector<int64_t>& rows = share.rows;
  const int64_t end = begin + static_cast<int64_t>(rows.size());
  double loss_sum = 0.0;
  int64_t correct = 0;
  at::Tensor scored;  // binary: (rows, 2) float64 [logit, label], host
  if (how_.binary) {
    memory::HostScope host;
    scored = torch::zeros({end - begin, 2}, torch::kFloat64);
  }
  const int64_t retries = for_each_val_batch(
      run, counters, rows, [&](const Batch& b, size_t first) {
        const at::Tensor logits = forward(run, b.x, b.context);
        const double batch_loss =
            classification_loss(logits, b.y, how_).item<double>();
        const int64_t batch_correct =
            predicted_class(logits, how_.binary).eq(b.y).sum().item<int64_t>();
        if (how_.binary) {
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
  r.samples = static_cast<int64_t>(count);
  r.oom_retries = retries;
  r.batch = counters.val_micro;
  const double accuracy = totals[1].item<double>() / count;
  r.metrics.push_back(
      val_metric("val_accuracy", accuracy, Better::kHigher, "val accuracy"));
  if (how_.binary) {  // NaN (one class in data.val) is written as null
    const double auc = validation_auc(run, scored, begin, n);
    r.metrics.push_back(val_metric("val_auc", auc, Better::kHigher, "val AUC"));
  }
  r.details = nlohmann::json({{"val_samples", r.samples}}).dump();
  return r;
}

}  // namespace

std::unique_ptr<Task> make_row_task(const TrainConfig& cfg) {
  return std::make_unique<RowTask>(cfg);
}

}  // namespace memtrain
