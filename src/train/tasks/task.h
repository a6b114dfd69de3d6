#pragma once
// Private to src/train/: what differs between kinds of run (Note [Tasks] in
// ARCHITECTURE.md). The loop, the records and the run files are generic;
// they ask the run's Task, never which kind of run this is.

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "train/state/run_state.h"

namespace memtrain {

// A metric a task reports: its record field and which way it improves
// (validation.best_metric may choose those with a direction).
struct MetricSpec {
  std::string key;
  Better better = Better::kNone;
};

class Task {
 public:
  virtual ~Task() = default;

  // After data.train is open: checks the config against the data, opens
  // data.val if the task validates on it, sets run.num_classes, run.images
  // and run.source. Throws memtrain::Error naming what is wrong.
  virtual void set_up(RunState& run) = 0;
  // The model, on the host (set_up_run moves it to the device); by
  // default make_model() of data.train's samples and run.num_classes
  // outputs.
  virtual std::shared_ptr<Classifier> make_model(const RunState& run);
  // Samples in an epoch: by default data.train's rows; patches, episodes.
  virtual int64_t samples_per_epoch(const RunState& run) const;
  // Sum over the batch of the per-sample loss (Note [Window weighting]):
  // float32 logits (embeddings) of the model, the batch's targets.
  virtual at::Tensor loss_sum(
      const at::Tensor& logits, const at::Tensor& y) const = 0;
  // This rank's micro-batches `batches` of window `wp`, each back-propagated
  // with `weight`; `before_step(k)` runs before micro-step k's forward.
  // Returns the rank's loss sum, a float64 (1,) tensor on the device (no
  // host read: Note [One host read per window]). By default K independent
  // micro-steps (micro_step()); a task whose loss spans the window
  // overrides it.
  virtual at::Tensor accumulate(
      RunState& run,
      const WindowPlan& wp,
      const std::vector<std::vector<int64_t>>& batches,
      double weight,
      const std::function<void(size_t)>& before_step);
  // After each optimizer step.
  virtual void after_update() {}

  // The metrics validate() reports besides val_loss, in their order; the
  // first with a direction is validation.best_metric=auto's choice.
  virtual std::vector<MetricSpec> metrics() const = 0;
  // What the run is, for messages: "a binary classifier".
  virtual std::string kind_words() const = 0;
  // Empty when the run can validate; else why not, and the fix.
  virtual std::string cannot_validate(const RunState& run) const;
  // Collective. One validation, the model in eval mode, no gradient;
  // `overlay_dir` ("" for none) receives per-volume outputs.
  virtual ValResult validate(
      RunState& run, RunCounters& counters, const std::string& overlay_dir) = 0;
  // Classes whose Dice the logs carry per class (val_dice_<name>).
  virtual std::vector<std::string> dice_classes(const RunState&) const {
    return {};
  }
  // Whether validation.dump_predictions applies (rows of volumes).
  virtual bool dumps_predictions() const {
    return false;
  }
  // Note [Host plan]: what the task holds in this rank's host memory
  // beyond the loaders' batches (volumes: validating a whole case), each
  // with its arithmetic and the keys that lower it.
  virtual std::vector<memory::HostHolder> host_holders(const RunState&) const {
    return {};
  }
  // model.feature_cache=host: the slices' maps the model's cache would
  // keep on this rank to hold every slice it can meet, for the host plan's
  // "feature cache" holder, which caps it at what the budget leaves. None:
  // the task has no such slices.
  struct CacheNeed {
    int64_t entries = 0;      // maps (slices x views)
    int64_t entry_bytes = 0;  // the largest map's
    std::string how;          // the arithmetic
  };
  virtual CacheNeed feature_cache_need(const RunState&) const {
    return {};
  }
  // Rank 0, at the start of a run: the task's files in output.dir.
  virtual void write_run_files(const RunState&, const std::string&) const {}

  // The banner (describe_run): the task's part of the data line, of the
  // validation data, the model's width and outputs, and what a sample is.
  virtual void describe_data(const RunState&, std::ostream&) const {}
  virtual void describe_val(const RunState&, std::ostream&) const {}
  virtual std::string describe_width(const RunState& run) const;
  virtual std::string describe_outputs(const RunState& run) const = 0;
  virtual std::string sample_word() const {
    return "";
  }
};

// The task of `cfg` on data.train `train`: the first row of the task table
// (task.cpp) that takes them. Throws memtrain::Error for a choice that does
// not apply to that task (model.num_classes=1, label smoothing).
std::unique_ptr<Task> make_task(
    const TrainConfig& cfg, const DatasetInfo& train);

// --- for the tasks (task.cpp) ------------------------------------------------

// data.val opened into run.val_data (when set), checked against data.train:
// the same kind and sample shape (`channels_only`: the first dimension
// only, as volumes of any size), no more classes.
void open_val_data(RunState& run, bool channels_only = false);
// run.num_classes from model.num_classes and data.train's labels (`binary`:
// one logit); refuses a model.num_classes below the data's classes.
void resolve_num_classes(RunState& run, bool binary);
// The model's input: data.train's sample shape (or `shape`), classes,
// context features.
ModelInput model_input(
    const RunState& run, const std::vector<int64_t>& shape = {});
// This rank's contiguous share of data.val's rows: `rows`, ascending from
// `begin` (empty when the ranks outnumber the rows).
struct RowShare {
  int64_t begin = 0;
  std::vector<int64_t> rows;
};
RowShare val_rows_of_rank(const RunState& run);
// A number of a record; NaN (nothing to score) is written as null
// (records/records.cpp).
nlohmann::json number_or_null(double d);
// A metric of a validation (NaN is written as null); on the progress line
// as `words`, the value, then `more` ("val accuracy 0.75"); empty words:
// not on the line.
ValMetric val_metric(
    const std::string& key,
    double value,
    Better better,
    const std::string& words,
    const std::string& more = "");

// The task table's makers, one per task file.
std::unique_ptr<Task> make_row_task(const TrainConfig& cfg);
std::unique_ptr<Task> make_volume_task(const TrainConfig& cfg);
std::unique_ptr<Task> make_episode_task(const TrainConfig& cfg);
std::unique_ptr<Task> make_pair_task(const TrainConfig& cfg);
std::unique_ptr<Task> make_regression_task(const TrainConfig& cfg);

}  // namespace memtrain
