#pragma once
// What a training run reports: each window's figures (WindowResult), each
// validation's (ValResult: the loss and the task's named metrics), and the
// run's summary (TrainSummary). The records area writes them
// (metrics.jsonl, metrics.csv, TensorBoard); Trainer::run() returns them.
// No LibTorch here.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace memtrain {

struct WindowResult {
  int64_t epoch = 0;
  int64_t window = 0;       // within the epoch
  int64_t step = 0;         // windows run so far in this run, this one included
  double loss = 0.0;        // mean loss over the window's global samples
  int64_t samples = 0;      // global samples in the window
  int64_t micro_steps = 0;  // micro-batches this rank ran
  int64_t allreduce_calls = 0;  // collectives in this window
  int64_t allreduce_bytes = 0;  // bytes all-reduced in this window
  // Exact contrastive windows: the all-gather of the window's embeddings
  // (Note [Exact contrastive accumulation]).
  int64_t allgather_calls = 0;
  int64_t allgather_bytes = 0;
  // model.sync_bn: batch-norm's all-reduces (forward and backward, every
  // micro-step), not counted in allreduce_*.
  int64_t syncbn_calls = 0;
  int64_t syncbn_bytes = 0;
  double seconds = 0.0;
  double data_wait_s = 0.0;
  int64_t micro_batch = 0;     // this rank's micro-batch when the window ended
  int64_t oom_retries = 0;     // this rank's window replays after OOM
  int64_t cache_releases = 0;  // cached-block releases so far in this run
  bool skipped = false;  // non-finite loss or gradients: no optimizer step
  bool stop_requested = false;  // a rank got SIGTERM/SIGUSR1/SIGINT
  double loss_scale = 1.0;
  double lr = 0.0;  // the learning rate of this window's update
  // What every rank saw, from the window's all-reduce (window_totals.h):
  // the largest value over ranks and the lowest rank that had it. Device
  // bytes at the boundary, and peaks since the previous boundary (the
  // previous window's optimizer step, then this window's micro-steps).
  int64_t mem_allocated = 0;
  int64_t mem_reserved = 0;
  int mem_reserved_rank = 0;
  int64_t mem_peak = 0;
  int mem_peak_rank = 0;
  int64_t mem_peak_reserved = 0;
  // The host offload pool, largest rank (Note [Host offload]).
  int64_t host_reserved = 0;
  int64_t host_peak = 0;
  // The host figures (memory/host_figures.h) of the rank with the largest
  // resident set at the boundary.
  int64_t host_rss = 0;
  int rss_rank = 0;
  int64_t host_rss_file = 0;
  int64_t host_counted = 0;
  int64_t host_malloc_free = 0;
  int64_t host_malloc_used = 0;
  int64_t host_counted_host = 0;   // the host domain's part of host_counted
  int64_t host_pool_reserved = 0;  // that rank's offload pool
  // The largest resident set any rank has had since it started (VmHWM).
  int64_t host_rss_peak = 0;
  int64_t oom_retries_max = 0;
  int oom_retries_rank = 0;
  int64_t oom_retries_total = 0;
  // Seconds as the device ran them (Note [Window clock]): the micro-steps
  // (forward, backward, data waits included); the boundary after backward
  // ended (the collectives' wait, the inf/NaN check, the totals' read);
  // the update (clipping, the optimizer step).
  double compute_s = 0.0;
  double comm_exposed_s = 0.0;
  double optimizer_s = 0.0;
  // Device-to-host reads and waits of the window (Note [One host read per
  // window]): 2, whatever the accumulation steps.
  int64_t host_syncs = 0;
  // The same as the dispatcher saw them on the window's thread (Note [Host
  // reads seen by the dispatcher]); -1: not watched.
  int64_t host_syncs_seen = -1;
  // Gradient buckets whose all-reduce started during backward (overlap).
  int64_t buckets_early = 0;
  // Device bytes allocated at the start of each micro-step (the last try).
  std::vector<int64_t> micro_step_start_bytes;
  // The model's own phases' device peaks on this rank since the previous
  // window (dinov3: "backbone" and "context", its two extractions): the
  // record's mem_peak_<phase>.
  std::vector<std::pair<std::string, int64_t>> phase_peaks;
  // model.feature_cache=host (-1: off): this rank's slices found in the
  // cache and extracted since the previous window, and the bytes it holds.
  int64_t feature_cache_hits = -1;
  int64_t feature_cache_misses = -1;
  int64_t feature_cache_bytes = -1;
};

// Which way a validation metric improves. validation.best_metric chooses
// among those with a direction.
enum class Better { kHigher, kLower, kNone };

// "higher", "lower", "none": the validation record's val_metrics[].better.
inline const char* to_string(Better b) {
  return b == Better::kHigher  ? "higher"
         : b == Better::kLower ? "lower"
                               : "none";
}

// One named figure of a validation (Note [Tasks]): the epoch and
// validation records' field `key` (null when NaN), the metrics.csv column
// `key`, the TensorBoard tag val/<key without "val_">, and `text` on the
// progress line (empty: none).
struct ValMetric {
  std::string key;
  double value = 0.0;
  Better better = Better::kNone;
  std::string text;
};

struct ValResult {
  int64_t epoch = 0;
  double loss = 0.0;
  int64_t samples = 0;      // samples, volumes or episodes
  int64_t oom_retries = 0;  // validation batch halvings on this rank
  int64_t batch = 0;  // this rank's validation batch (sw_batch) at the end
  int64_t device_peak = 0;  // device-domain peak bytes of the validation
  // Host-domain peak bytes of the validation above what the host domain
  // held when it started (what the host plan's validation holder bounds).
  int64_t host_peak = 0;
  double seconds = 0.0;
  // The task's metrics besides the loss, in its order.
  std::vector<ValMetric> metrics;
  // The validation record's task-specific fields (per class, per volume,
  // counts): a JSON object's text, or "" for none.
  std::string details;
  // The value of metric `key` (val_loss included). Throws memtrain::Error
  // when this validation does not report it.
  double metric(const std::string& key) const;
};

struct TrainSummary {
  int64_t windows = 0;
  int64_t oom_retries = 0;
  int64_t skipped_steps = 0;
  bool stopped = false;  // ended early on a stop request (checkpoint written)
  std::vector<std::string> leak_warnings;
  std::vector<WindowResult> window_results;
  std::vector<ValResult> validations;  // one per validation
  uint64_t checksum = 0;               // of this rank's final parameters
};

}  // namespace memtrain
