// Validation of rows that belong to volumes (Note [Volume rows] in
// ARCHITECTURE.md; docs/data-format.md, "Rows that belong to volumes").

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>

#include "memtrain/data/h5/volume_rows.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/memory/oom_guard.h"
#include "memtrain/metrics/dice_report.h"
#include "memtrain/metrics/seg_metrics.h"
#include "memtrain/train/eval/validator.h"
#include "memtrain/util/error.h"
#include "train/eval/val_batches.h"
#include "train/tasks/volume_rows.h"

namespace memtrain {
namespace {

// One volume's slots of the all-reduced table: the loss sum, rows, correct
// rows, then per class c the rows predicted c and labelled c, predicted c,
// labelled c. Counts are integers (exact in float64).
int64_t slot_width(int64_t k) {
  return 3 + 3 * k;
}

}  // namespace

ValResult validate_volume_rows(
    RunState& run,
    RunCounters& counters,
    const ClassificationLoss& how,
    const std::string& dump_dir) {
  const DatasetInfo& info = run.val_data->info();
  const VolumeRowIndex index = index_volume_rows(info);
  const int64_t k = run.num_classes;
  const int64_t nv = index.volumes();
  const int64_t width = slot_width(k);
  const DiceRule rule = dice_rule(run.cfg.validation);
  const int rank = run.comm.rank();
  const int world = run.comm.size();
  MT_CHECK(
      dump_dir.empty() || k <= 32767,
      "validation.dump_predictions: ",
      k,
      " classes do not fit the int16 prediction grid");

  // This rank's rows: those of volumes rank, rank + world, ..., one volume
  // after the other; batches may span volumes.
  std::vector<int64_t> rows;
  for (int64_t v = rank; v < nv; v += world)
    rows.insert(rows.end(), index.rows[v].begin(), index.rows[v].end());

  // Forward in batches of counters.val_micro (halved on OOM); only the
  // predicted class and the loss of each row come back to host memory.
  std::vector<int64_t> pred(rows.size());
  std::vector<double> loss(rows.size());
  const int64_t retries = for_each_val_batch(
      run, counters, rows, [&](const Batch& b, size_t first) {
        at::Tensor classes, ce;
        {
          const at::Tensor logits = forward(run, b.x, b.context);
          const at::Tensor row_loss =
              classification_loss(logits, b.y, how, /*per_sample=*/true);
          classes = run.placement.to_host(logits.argmax(1));
          ce = run.placement.to_host(row_loss.to(torch::kFloat64));
        }  // the logits and losses leave the device here
        memory::HostScope host;
        const auto c = classes.contiguous();
        const auto l = ce.contiguous();
        const int64_t n = b.size();
        std::copy_n(c.data_ptr<int64_t>(), n, pred.begin() + first);
        std::copy_n(l.data_ptr<double>(), n, loss.begin() + first);
      });

  // Host: this rank's volumes' slots; the others stay zero, so the sum over
  // ranks is every volume's counts exactly, each volume once.
  std::vector<double> table(nv * width, 0.0);
  size_t at = 0;
  for (int64_t v = rank; v < nv; v += world) {
    double* slot = table.data() + v * width;
    const std::vector<int64_t>& vrows = index.rows[v];
    std::vector<int16_t> grid;
    if (!dump_dir.empty())
      grid.assign(index.grid_voxels(v), -1);
    for (size_t i = 0; i < vrows.size(); ++i, ++at) {
      const int64_t r = vrows[i];
      const int64_t p = pred[at];
      const int64_t y = info.row_labels[r];
      slot[0] += loss[at];
      slot[1] += 1;
      slot[2] += p == y;
      slot[3 + 3 * p] += p == y;
      slot[4 + 3 * p] += 1;
      slot[5 + 3 * y] += 1;
      if (!dump_dir.empty()) {
        grid[index.grid_offset(v, info.row_voxel_index[r])] =
            static_cast<int16_t>(p);
      }
    }
    if (!dump_dir.empty()) {
      char name[48];
      std::snprintf(
          name, sizeof name, "/volume-%lld.h5", (long long)index.ids[v]);
      DiceTable one(k, rule);
      one.add(std::to_string(index.ids[v]), dice_counts_of(slot + 3, k));
      write_volume_prediction(
          dump_dir + name,
          index.ids[v],
          one.case_mean(0),
          index.extent[v],
          grid);
    }
  }
  at::Tensor t =
      torch::from_blob(
          table.data(), {static_cast<int64_t>(table.size())}, torch::kFloat64)
          .clone();
  run.comm.all_reduce_sum(t);
  const double* all = t.data_ptr<double>();

  // Every rank scores the same table in the same order: the result does
  // not depend on the number of ranks.
  double loss_sum = 0.0, rows_all = 0.0, correct = 0.0;
  DiceTable dice(k, rule);
  for (int64_t v = 0; v < nv; ++v) {
    const double* slot = all + v * width;
    loss_sum += slot[0];
    rows_all += slot[1];
    correct += slot[2];
    dice.add(std::to_string(index.ids[v]), dice_counts_of(slot + 3, k));
  }
  if (!dump_dir.empty() && rank == 0)
    write_dice_summary(dump_dir, dice);
  const double accuracy = rows_all > 0 ? correct / rows_all : 0.0;
  ValResult r;
  r.loss = rows_all > 0 ? loss_sum / rows_all : 0.0;
  r.samples = static_cast<int64_t>(rows_all);
  r.oom_retries = retries;
  r.batch = counters.val_micro;
  r.metrics = {
      val_metric(
          "val_dice",
          dice.mean(),
          Better::kHigher,
          "val Dice",
          " (" + std::to_string(nv) + " volumes)"),
      val_metric("val_accuracy", accuracy, Better::kHigher, "val accuracy")};
  r.details = nlohmann::json({
                                 {"val_dice_per_class", dice_per_class(dice)},
                                 {"val_cases", dice_cases(dice)},
                                 {"val_volumes", nv},
                                 {"val_samples", r.samples},
                                 {"val_batch", r.batch},
                             })
                  .dump();
  return r;
}

}  // namespace memtrain
