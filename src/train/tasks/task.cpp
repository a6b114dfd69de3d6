#include "train/tasks/task.h"

#include <torch/torch.h>

#include <cmath>
#include <numeric>
#include <sstream>

#include "memtrain/data/sampling/window_shape.h"
#include "memtrain/model/registry.h"
#include "memtrain/util/error.h"
#include "memtrain/util/rank_log.h"

namespace memtrain {

// Note [Tasks]
// A kind of run -- classifiers of rows, segmentation of volumes, few-shot
// episodes, contrastive pairs, regression of rows -- is one Task: its set-up
// checks and sample source, its model, samples per epoch, loss sum, window
// (when it is not K independent micro-steps), after-update hook, validation and
// the metrics it returns, and its lines of the banner. The table below chooses
// it; the loop, the records and the run files only ask the task. Adding a task
// is its file, a row of the table and its maker's declaration in task.h
// (ARCHITECTURE.md, Note [Tasks], has the whole list).

namespace {

struct TaskRow {
  const char* name;
  // Whether this task takes the config and data.train.
  bool (*takes)(const TrainConfig& cfg, const DatasetInfo& train);
  std::unique_ptr<Task> (*make)(const TrainConfig& cfg);
  // What data.train is trained as, for messages.
  const char* trained_as;
};

const TaskRow kTasks[] = {
    {"episodes",
     [](const TrainConfig& cfg, const DatasetInfo&) {
       return cfg.data.episodes.n_way > 0;
     },
     make_episode_task,
     "few-shot episodes"},
    {"pairs",
     [](const TrainConfig&, const DatasetInfo& t) { return t.paired; },
     make_pair_task,
     "pairs (contrastive)"},
    {"volumes",
     [](const TrainConfig&, const DatasetInfo& t) {
       return t.kind == SampleKind::kVolumes;
     },
     make_volume_task,
     "volumes (segmentation)"},
    {"regression",
     [](const TrainConfig&, const DatasetInfo& t) { return t.targets > 0; },
     make_regression_task,
     "regression (/targets)"},
    {"rows",
     [](const TrainConfig&, const DatasetInfo&) { return true; },
     make_row_task,
     nullptr},
};

}  // namespace

std::unique_ptr<Task> make_task(
    const TrainConfig& cfg, const DatasetInfo& train) {
  for (const TaskRow& row : kTasks) {
    if (!row.takes(cfg, train))
      continue;
    if (row.trained_as) {  // choices of classifiers of rows only
      MT_CHECK(
          cfg.model.num_classes != 1,
          "model.num_classes=1 (a binary classifier) applies to /features "
          "and /images rows, but data.train '",
          train.path,
          "' is trained as ",
          row.trained_as,
          "; set model.num_classes=0 (from the data)");
      MT_CHECK(
          cfg.training.label_smoothing == 0.0,
          "training.label_smoothing=",
          cfg.training.label_smoothing,
          " applies to classifiers of /features and /images rows, but "
          "data.train '",
          train.path,
          "' is trained as ",
          row.trained_as,
          "; set training.label_smoothing=0");
    }
    return row.make(cfg);
  }
  MT_INTERNAL_ASSERT(false, "no task takes this run");
  return nullptr;
}

std::shared_ptr<Classifier> Task::make_model(const RunState& run) {
  return memtrain::make_model(run.cfg.model, model_input(run));
}

int64_t Task::samples_per_epoch(const RunState& run) const {
  return run.train_data->info().num_samples;
}

at::Tensor Task::accumulate(
    RunState& run,
    const WindowPlan& wp,
    const std::vector<std::vector<int64_t>>& batches,
    double weight,
    const std::function<void(size_t)>& before_step) {
  const at::Tensor loss = zero_loss_sum(run);
  for (size_t k = 0; k < batches.size(); ++k) {
    before_step(k);
    micro_step(run, wp.epoch, batches[k], weight, loss);
  }
  return loss;
}

std::string Task::cannot_validate(const RunState& run) const {
  return run.val_data ? ""
                      : "data.val is empty: nothing to validate (set data.val)";
}

std::string Task::describe_width(const RunState& run) const {
  return "hidden " + std::to_string(run.cfg.model.hidden);
}

void open_val_data(RunState& run, bool channels_only) {
  if (run.cfg.data.val.empty())
    return;
  OpenOptions opts;
  opts.intensity_scale = run.cfg.data.intensity_scale;
  opts.intensity_shift = run.cfg.data.intensity_shift;
  run.val_data.emplace(H5Dataset::open(run.cfg.data.val, "data.val", opts));
  const DatasetInfo& ti = run.train_data->info();
  const DatasetInfo& vi = run.val_data->info();
  if (!vi.checksummed) {
    log_event(
        "warning: data.val: " + run.val_data->checksum_warning(),
        /*echo=*/run.comm.rank() == 0);
  }
  const bool same_shape = channels_only
                              ? vi.sample_shape.at(0) == ti.sample_shape.at(0)
                              : vi.sample_shape == ti.sample_shape &&
                                    vi.context_features == ti.context_features;
  MT_CHECK(
      vi.kind == ti.kind && vi.paired == ti.paired && same_shape,
      "data.val: '",
      vi.path,
      "' holds ",
      to_string(vi.kind),
      " of another shape than data.train '",
      ti.path,
      "'; both files must hold the same kind and sample shape");
  MT_CHECK(
      vi.num_classes <= ti.num_classes,
      "data.val: '",
      vi.path,
      "' has ",
      vi.num_classes,
      " classes but data.train '",
      ti.path,
      "' has ",
      ti.num_classes,
      "; the model is sized by data.train");
}

void resolve_num_classes(RunState& run, bool binary) {
  run.num_classes =
      model_num_classes(run.cfg.model, run.train_data->info(), binary);
}

ModelInput model_input(const RunState& run, const std::vector<int64_t>& shape) {
  const DatasetInfo& ti = run.train_data->info();
  return {
      ti.kind,
      shape.empty() ? ti.sample_shape : shape,
      run.num_classes,
      ti.context_features,
      ti.tokens,
      ti.token_max};
}

RowShare val_rows_of_rank(const RunState& run) {
  const auto [begin, end] = rank_slice(
      run.val_data->info().num_samples, run.comm.rank(), run.comm.size());
  RowShare s;
  s.begin = begin;
  s.rows.resize(end - begin);
  std::iota(s.rows.begin(), s.rows.end(), s.begin);
  return s;
}

ValMetric val_metric(
    const std::string& key,
    double value,
    Better better,
    const std::string& words,
    const std::string& more) {
  ValMetric m;
  m.key = key;
  m.value = value;
  m.better = better;
  if (!words.empty()) {
    std::ostringstream text;
    text << words << " " << value << more;
    m.text = text.str();
  }
  return m;
}

}  // namespace memtrain
