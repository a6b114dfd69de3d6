// Few-shot episodes (data.episodes.n_way > 0; Note [Episodes]): the
// classes of data.train split into training and validation classes, an
// episode is the sample, the head's query cross-entropy its loss.

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <sstream>

#include "memtrain/data/sampling/episodes.h"
#include "memtrain/input/episode_source.h"
#include "memtrain/memory/oom_guard.h"
#include "memtrain/model/blocks/fewshot_head.h"
#include "memtrain/model/registry.h"
#include "memtrain/util/atomic_file.h"
#include "memtrain/util/error.h"
#include "memtrain/util/rank_log.h"
#include "train/eval/val_batches.h"
#include "train/tasks/task.h"

namespace memtrain {
namespace {

std::string list(const std::vector<int64_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i)
    s += (i ? ", " : "") + std::to_string(ids[i]);
  return "[" + s + "]";
}

class EpisodeTask : public Task {
 public:
  explicit EpisodeTask(const TrainConfig& cfg)
      : shape_{
            cfg.data.episodes.n_way,
            cfg.data.episodes.k_shot,
            cfg.data.episodes.n_query} {}

  void set_up(RunState& run) override;

  std::shared_ptr<Classifier> make_model(const RunState& run) override {
    fewshot_ = make_fewshot_model(run.cfg.model, model_input(run), shape_);
    return fewshot_;
  }

  int64_t samples_per_epoch(const RunState& run) const override {
    return run.cfg.data.episodes.per_epoch;
  }

  // The mean query cross-entropy per episode (an episode is the sample);
  // logits: the embeddings, y: the episode labels.
  at::Tensor loss_sum(
      const at::Tensor& logits, const at::Tensor& y) const override {
    return episode_loss_sum(
        fewshot_->episode_logits(logits, shape_), query_labels(y, shape_));
  }

  std::vector<MetricSpec> metrics() const override {
    return {
        {"val_accuracy", Better::kHigher},
        {"val_accuracy_ci95", Better::kNone}};
  }

  std::string kind_words() const override {
    return "few-shot episodes";
  }

  std::string cannot_validate(const RunState& run) const override {
    return run.val_data ? ""
                        : "validation.episodes=0: no validation episodes to "
                          "run (set validation.episodes)";
  }

  ValResult validate(
      RunState& run, RunCounters& counters, const std::string&) override;

  void write_run_files(
      const RunState& run, const std::string& dir) const override;

  std::string describe_outputs(const RunState& run) const override {
    return to_string(run.cfg.model.head) + std::string(" head on a ") +
           std::to_string(run.cfg.model.embed_dim) + "-wide embedding";
  }

  std::string sample_word() const override {
    return " episodes";
  }

 private:
  const EpisodeShape shape_;
  ClassRows class_rows_;
  ClassSplit class_split_;
  std::unique_ptr<EpisodeSampler> episodes_, val_episodes_;
  std::shared_ptr<FewShotModel> fewshot_;
};

}  // namespace

void EpisodeTask::set_up(RunState& run) {
  const TrainConfig& cfg = run.cfg;
  const DatasetInfo& ti = run.train_data->info();
  const std::string source = "data.train '" + ti.path + "'";
  resolve_num_classes(run, /*binary=*/false);
  run.images = resolve_image_transforms(cfg, ti, /*episodes_or_pairs=*/true);
  MT_CHECK(
      ti.kind != SampleKind::kVolumes,
      "data.episodes: ",
      source,
      " holds volumes; few-shot episodes are drawn from labelled /features "
      "or /images rows");
  MT_CHECK(
      ti.context_features == 0,
      "data.episodes: ",
      source,
      " has /context_features, which few-shot episodes do not use; use a "
      "file without them");
  const EpisodeShape& shape = shape_;
  const bool need_val = cfg.validation.episodes > 0;
  class_rows_ =
      ClassRows::from_labels(ti.row_labels, ti.num_classes, ti.class_names);
  class_split_ = split_classes(
      class_rows_,
      cfg.data.val_classes.ids,
      cfg.data.val_classes.fraction,
      static_cast<uint64_t>(cfg.data.seed),
      shape,
      need_val,
      source);
  const uint64_t seed = static_cast<uint64_t>(cfg.data.seed);
  episodes_ = std::make_unique<EpisodeSampler>(
      class_rows_, class_split_.train, shape, seed, 0);
  run.source = std::make_unique<EpisodeSource>(
      *run.train_data, *episodes_, -1, &run.train_finite);
  if (need_val) {
    val_episodes_ = std::make_unique<EpisodeSampler>(
        class_rows_, class_split_.val, shape, seed, 1);
    // A handle of its own for validation's reads; data.val is not read.
    OpenOptions opts;
    run.val_data.emplace(H5Dataset::open(cfg.data.train, "data.train", opts));
  }
  log_event(
      detail::concat(
          "few-shot: ",
          shape.n_way,
          "-way ",
          shape.k_shot,
          "-shot, ",
          shape.n_query,
          " queries per class, head ",
          cfg.model.head,
          "; ",
          class_split_.train.size(),
          " training classes, ",
          class_split_.val.size(),
          " validation classes ",
          list(class_split_.val)),
      /*echo=*/run.comm.rank() == 0);
}

void EpisodeTask::write_run_files(
    const RunState& run, const std::string& dir) const {
  const EpisodeShape& shape = shape_;
  const nlohmann::json j = {
      {"n_way", shape.n_way},
      {"k_shot", shape.k_shot},
      {"n_query", shape.n_query},
      {"data_seed", run.cfg.data.seed},
      {"train_classes", class_split_.train},
      {"val_classes", class_split_.val}};
  write_file_atomically(dir + "/episodes.json", j.dump(2) + "\n");
}

// Episode v of validation.episodes goes to rank v mod world, in batches of
// counters.val_micro episodes; each rank sums correct queries, their
// squares, loss and count, and one all-reduce gives every rank the exact
// totals.
ValResult EpisodeTask::validate(
    RunState& run, RunCounters& counters, const std::string&) {
  const int64_t m = run.cfg.validation.episodes;
  const int rank = run.comm.rank(), world = run.comm.size();
  std::vector<int64_t> mine;
  for (int64_t v = rank; v < m; v += world)
    mine.push_back(v);
  const EpisodeSource val_source(
      *run.val_data, *val_episodes_, 0, &run.val_finite);
  Prefetcher val_loader(val_source, /*depth=*/0, /*threads=*/0);
  const EpisodeShape& shape = shape_;
  double sum = 0, sum_sq = 0, loss = 0;
  int64_t retries = 0;
  const OomRetry how = validation_oom_retry(run, "one episode");
  for (size_t s = 0; s < mine.size();) {
    retries += retry_on_oom(how, counters.val_micro, [&](int64_t micro) {
      const size_t e = std::min(mine.size(), s + static_cast<size_t>(micro));
      const std::vector<int64_t> ids(mine.begin() + s, mine.begin() + e);
      const Batch b = load_batch(run, val_loader, 0, ids);
      const at::Tensor emb = forward(run, b.x, at::Tensor());
      const at::Tensor logits = fewshot_->episode_logits(emb, shape);
      const at::Tensor labels = query_labels(b.y, shape);
      const at::Tensor correct = episode_correct(logits, labels).cpu();
      const double batch_loss = episode_loss_sum(logits, labels).item<double>();
      // Counted once the whole batch succeeded (an OOM retry redoes it).
      // Integer counts: the sums are exact whatever the rank split.
      sum += static_cast<double>(correct.sum().item<int64_t>());
      sum_sq += static_cast<double>(correct.pow(2).sum().item<int64_t>());
      loss += batch_loss;
      s = e;
    });
  }
  auto totals = torch::tensor(
      {sum, sum_sq, loss, static_cast<double>(mine.size())}, torch::kFloat64);
  run.comm.all_reduce_sum(totals);
  const double count = totals[3].item<double>();
  ValResult r;
  const int64_t episodes = static_cast<int64_t>(count);
  r.samples = episodes;
  const double q = static_cast<double>(shape.queries());
  const double accuracy = totals[0].item<double>() / (count * q);
  r.loss = totals[2].item<double>() / count;
  // Sample standard deviation of the episodes' accuracies; the field's
  // convention reports 1.96 x std / sqrt(M).
  const double mean_sq = totals[1].item<double>() / (q * q);
  const double var =
      count > 1
          ? std::max(0.0, (mean_sq - count * accuracy * accuracy) / (count - 1))
          : 0.0;
  const double ci95 = 1.96 * std::sqrt(var) / std::sqrt(count);
  r.oom_retries = retries;
  r.batch = counters.val_micro;
  // The mean over episodes +- its 95% interval.
  std::ostringstream more;
  more << " +- " << ci95 << " (95%, " << episodes << " episodes)";
  r.metrics = {
      val_metric(
          "val_accuracy",
          accuracy,
          Better::kHigher,
          "val accuracy",
          more.str()),
      val_metric("val_accuracy_ci95", ci95, Better::kNone, "")};
  r.details =
      nlohmann::json({{"val_samples", r.samples}, {"val_episodes", episodes}})
          .dump();
  return r;
}

std::unique_ptr<Task> make_episode_task(const TrainConfig& cfg) {
  return std::make_unique<EpisodeTask>(cfg);
}

}  // namespace memtrain
