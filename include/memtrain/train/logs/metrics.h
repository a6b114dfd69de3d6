#pragma once
// MetricsLog: the one place every record goes through (Note [Logs] in
// ARCHITECTURE.md). Rank 0's log writes
//   output.dir/metrics.jsonl  one JSON object a line, written whole and
//                             flushed (a crash leaves every earlier record);
//   output.dir/metrics.csv    one row per window record (metrics_csv_header);
//                             the epoch's columns on the row of its last
//                             window, which is therefore written when the
//                             epoch record or the next window arrives (or
//                             the log closes);
//   output.dir/tb/            a TensorBoard events file per run start;
//   output.dir/progress.png   redrawn on another thread after each epoch
//                             record (gnuplot; one warning when it cannot).
// No LibTorch.

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace memtrain {

namespace tb {
class EventWriter;
}

struct MetricsOutputs {
  std::string dir;  // output.dir; empty: a log that drops every record
  // Resumed from the checkpoint of window `resume_step` in epoch
  // `resume_epoch`: metrics.jsonl is trimmed to what that checkpoint covers
  // (the run reads as one), appended to, and metrics.csv is rebuilt from
  // it. Every run's new events file starts with a SessionLog START at
  // resume_step + 1 (0 when not resumed).
  bool resumed = false;
  int64_t resume_step = 0;
  int64_t resume_epoch = 0;
  // The task's validation metrics (ValMetric::key), in its order: CSV
  // columns after val_loss, TensorBoard tags val/<key without "val_">.
  std::vector<std::string> val_metrics;
  // Names of the classes whose validation Dice is logged per class
  // (val_dice_per_class); empty for none. metrics_class_names() gives them.
  std::vector<std::string> dice_classes;
  int64_t budget_bytes = 0;  // 0: no budget
  bool draw_progress = true;
};

// Calls fn(record, line) for each record of a metrics.jsonl file, skipping
// lines cut short by a crash. False when the file cannot be opened.
bool for_each_record(
    const std::string& path,
    const std::function<void(const nlohmann::json&, const std::string&)>& fn);

// One CSV field: quoted (with "" for ") when it holds , " or a newline.
std::string csv_field(const std::string& s);

// The dataset's class names, or the class index where it has none.
std::vector<std::string> metrics_class_names(
    const std::vector<std::string>& names, int64_t num_classes);

// metrics.csv's columns: the window's, train_loss, val_loss, the task's
// metrics, then val_dice_<class> for these Dice classes.
std::vector<std::string> metrics_csv_header(
    const std::vector<std::string>& val_metrics,
    const std::vector<std::string>& dice_classes);

class MetricsLog {
 public:
  // A log that drops every record.
  MetricsLog();
  // Opens (or, not resumed, truncates) the files in out.dir. Throws
  // memtrain::Error if it cannot.
  explicit MetricsLog(const MetricsOutputs& out);
  // Writes the CSV's last row and waits for a drawing in progress.
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  void write(const nlohmann::json& record);

  class Csv;  // the CSV rows of a record stream (metrics.cpp)

 private:
  void write_tb(const nlohmann::json& record);
  void start_drawing();

  MetricsOutputs out_;
  std::FILE* jsonl_ = nullptr;
  std::FILE* csv_ = nullptr;
  std::unique_ptr<Csv> rows_;
  std::unique_ptr<tb::EventWriter> tb_;
  int64_t last_step_ = 0;  // of the last window record: epoch values go there
  std::thread drawing_;
  bool gnuplot_failed_ = false;  // written by drawing_, read after a join
};

}  // namespace memtrain
