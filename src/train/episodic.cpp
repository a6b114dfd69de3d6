#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>

#include "memtrain/train/episode_source.h"
#include "memtrain/train/oom_guard.h"
#include "memtrain/util/atomic_file.h"
#include "memtrain/util/error.h"
#include "memtrain/util/rank_log.h"
#include "run_state.h"

namespace memtrain {
namespace {

std::string list(const std::vector<int64_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i)
    s += (i ? ", " : "") + std::to_string(ids[i]);
  return "[" + s + "]";
}

}  // namespace

void set_up_episodes(RunState& run) {
  const TrainConfig& cfg = run.cfg;
  const DatasetInfo& ti = run.train_data->info();
  const std::string source = "data.train '" + ti.path + "'";
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
  const EpisodeShape shape = run.episode_shape();
  const bool need_val = cfg.validation.episodes > 0;
  run.class_rows =
      ClassRows::from_labels(ti.row_labels, ti.num_classes, ti.class_names);
  run.class_split = split_classes(
      run.class_rows,
      cfg.data.val_classes.ids,
      cfg.data.val_classes.fraction,
      static_cast<uint64_t>(cfg.data.seed),
      shape,
      need_val,
      source);
  const uint64_t seed = static_cast<uint64_t>(cfg.data.seed);
  run.episodes = std::make_unique<EpisodeSampler>(
      run.class_rows, run.class_split.train, shape, seed, 0);
  run.source = std::make_unique<EpisodeSource>(
      *run.train_data, *run.episodes, -1, &run.train_finite);
  if (need_val) {
    run.val_episodes = std::make_unique<EpisodeSampler>(
        run.class_rows, run.class_split.val, shape, seed, 1);
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
          run.class_split.train.size(),
          " training classes, ",
          run.class_split.val.size(),
          " validation classes ",
          list(run.class_split.val)),
      /*echo=*/run.comm.rank() == 0);
}

void write_episode_classes(const RunState& run, const std::string& path) {
  const EpisodeShape shape = run.episode_shape();
  const nlohmann::json j = {
      {"n_way", shape.n_way},
      {"k_shot", shape.k_shot},
      {"n_query", shape.n_query},
      {"data_seed", run.cfg.data.seed},
      {"train_classes", run.class_split.train},
      {"val_classes", run.class_split.val}};
  write_file_atomically(path, j.dump(2) + "\n");
}

// Episode v of validation.episodes goes to rank v mod world, in batches of
// counters.val_micro episodes; each rank sums correct queries, their
// squares, loss and count, and one all-reduce gives every rank the exact
// totals.
ValResult validate_episodes(RunState& run, RunCounters& counters) {
  const int64_t m = run.cfg.validation.episodes;
  const int rank = run.comm.rank(), world = run.comm.size();
  std::vector<int64_t> mine;
  for (int64_t v = rank; v < m; v += world)
    mine.push_back(v);
  const EpisodeSource val_source(
      *run.val_data, *run.val_episodes, 0, &run.val_finite);
  Prefetcher val_loader(val_source, /*depth=*/0, /*threads=*/0);
  const EpisodeShape shape = run.episode_shape();
  double sum = 0, sum_sq = 0, loss = 0;
  int64_t retries = 0;
  const OomRetry how = validation_oom_retry(run, "one episode");
  for (size_t s = 0; s < mine.size();) {
    retries += retry_on_oom(how, counters.val_micro, [&](int64_t micro) {
      const size_t e = std::min(mine.size(), s + static_cast<size_t>(micro));
      const std::vector<int64_t> ids(mine.begin() + s, mine.begin() + e);
      const Batch b = load_batch(run, val_loader, 0, ids);
      const at::Tensor emb = forward(run, b.x, at::Tensor());
      const at::Tensor logits = run.fewshot->episode_logits(emb, shape);
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
  r.episodes = static_cast<int64_t>(count);
  r.samples = r.episodes;
  const double q = static_cast<double>(shape.queries());
  r.accuracy = totals[0].item<double>() / (count * q);
  r.loss = totals[2].item<double>() / count;
  // Sample standard deviation of the episodes' accuracies; the field's
  // convention reports 1.96 x std / sqrt(M).
  const double mean_sq = totals[1].item<double>() / (q * q);
  const double var =
      count > 1
          ? std::max(
                0.0, (mean_sq - count * r.accuracy * r.accuracy) / (count - 1))
          : 0.0;
  r.accuracy_ci95 = 1.96 * std::sqrt(var) / std::sqrt(count);
  r.oom_retries = retries;
  r.batch = counters.val_micro;
  return r;
}

}  // namespace memtrain
