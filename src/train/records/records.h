#pragma once
// Private to src/train/: the run's records -- the metrics.jsonl schema of
// every record type (pretrained, window, validation, epoch, checkpoint,
// warning), memory_plan.json, and the launch banner's description of the
// run. Each takes what it reports; MetricsLog writes them.

#include <nlohmann/json.hpp>

#include <string>

#include "memtrain/train/state/results.h"
#include "train/state/run_state.h"
#include "train/tasks/task.h"

namespace memtrain {

struct LoadReport;

// A `type: "pretrained"` record: what model.pretrained loaded.
nlohmann::json pretrained_record(const LoadReport& r, bool strict);

// A `type: "window"` record.
nlohmann::json window_record(
    const RunState& run, const RunCounters& counters, const WindowResult& r);

// A `type: "validation"` record, and the validation fields of the epoch
// record `epoch_rec`; `line` gets the progress line's part.
// The task's metrics (ValResult::metrics) go to both records, its details
// to the validation record.
nlohmann::json validation_record(
    const ValResult& v, nlohmann::json& epoch_rec, std::string& line);

// What an epoch's end reports besides its validation.
struct EpochFacts {
  int64_t epoch = 0;
  int64_t windows = 0;
  double train_loss = 0.0;
  int64_t mem_held = 0;  // allocated after the last window
  int64_t oom_retries = 0;
  const uint64_t* checksum = nullptr;  // the replicas'; null: not checked
  int64_t mem_peak = 0;
  int64_t mem_reserved = 0;
  int64_t cache_releases = 0;
  double seconds = 0.0;
};

// A `type: "epoch"` record: `facts` and the validation's fields `val`
// (what validation_record put in its `epoch_rec`; empty: none).
nlohmann::json epoch_record(const EpochFacts& facts, const nlohmann::json& val);

// A `type: "checkpoint"` record.
nlohmann::json checkpoint_record(
    int64_t step, int64_t epoch, const std::string& path, double seconds);

// A `type: "warning"` record (the leak detector's).
nlohmann::json leak_warning_record(int64_t epoch, const std::string& warning);

// validation.best_metric resolved for this run: a metric of the task's
// with a direction, "val_loss", or "" for none; auto: the task's first
// metric with a direction. Throws memtrain::Error when the run does not
// report it.
std::string best_metric(const RunState& run);

// Whether `v` beats the best so far (`counters.best_value`, NaN: none) by
// validation.best_metric in validation.best_mode; if so, records it at
// `step`. A NaN value never wins.
bool improve_best(
    const RunState& run,
    RunCounters& counters,
    const ValResult& v,
    int64_t step);

// memory_plan.json.
nlohmann::json plan_json(const RunState& run, const RunCounters& counters);

// Data, model, window shape and memory plan, for the banner and the logs.
std::string describe_run(const RunState& run);

// "00000000deadbeef"
std::string hex(uint64_t v);

}  // namespace memtrain
