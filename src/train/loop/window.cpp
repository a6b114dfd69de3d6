#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <set>

#include "memtrain/compat.h"
#include "memtrain/device/host_sync.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/memory/host_figures.h"
#include "memtrain/memory/oom_guard.h"
#include "memtrain/train/state/lr_schedule.h"
#include "memtrain/train/state/optimizers.h"
#include "memtrain/train/state/stop_request.h"
#include "memtrain/train/state/window_totals.h"
#include "memtrain/util/clock.h"
#include "memtrain/util/error.h"
#include "memtrain/util/rank_log.h"
#include "train/state/run_state.h"
#include "train/tasks/task.h"

namespace memtrain {
namespace {

// memory.test_oom_rank: that rank runs out once, in its first micro-step
// or in the last micro-step's backward with a bucket in flight.
void inject_test_oom(RunState& run, RunCounters& c) {
  if (run.cfg.memory.test_oom_rank != run.comm.rank() || c.test_oom_done)
    return;
  c.test_oom_done = true;
  if (run.cfg.memory.test_oom_in == TestOomIn::kBoundaryBackward) {
    run.grad_sync->inject_oom_after_launches(1);
    return;
  }
  TORCH_CHECK_WITH(OutOfMemoryError, false, "memory.test_oom_rank: injected");
}

// 1. This rank's micro-steps: forward and backward on each micro-batch of
//    its share, gradients accumulating locally; no communication (see
//    Note [All-reduce only at the accumulation boundary]). An OOM replays
//    the whole share at a smaller micro-batch (Note [OOM recovery]).
//    Returns the share's loss sum, on the device.
at::Tensor accumulate(
    RunState& run,
    RunCounters& c,
    const WindowPlan& wp,
    const WindowPlan* next,
    WindowResult& r) {
  const double weight = 1.0 / static_cast<double>(wp.global_samples);
  at::Tensor loss;
  OomRetry how;
  how.what = "micro-batch";
  how.where =
      detail::concat("epoch ", wp.epoch + 1, ", window ", wp.window + 1);
  how.replay = "the window";
  how.rank = run.comm.rank();
  // model.sync_bn: a replay would re-split this rank's share alone, and
  // batch-norm's collectives would no longer pair up: no replay.
  how.max_retries = run.sync_bn ? 0 : run.cfg.memory.max_oom_retries;
  how.in_use_cap = std::max<int64_t>(1, wp.rank_indices.size());
  how.snapshot_dir = run.cfg.output.dir;
  // Batch-norm running statistics (ResNets): a replay starts from the
  // window's own, so that it equals a run at the smaller micro-batch.
  std::vector<at::Tensor> buffers_before;
  for (const auto& b : run.buffers)
    buffers_before.push_back(b.detach().clone());
  how.cleanup = [&] {
    drop_failed_backward(run.placement.device());
    compat::zero_grad_to_none(*run.optimizer);
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < buffers_before.size(); ++i)
      run.buffers[i].copy_(buffers_before[i]);
  };
  how.give_up = [&](int64_t micro, int64_t retries, int64_t peak) {
    if (run.sync_bn) {
      return detail::concat(
          "out of device memory at micro-batch ",
          micro,
          " within memory.budget=",
          run.budget.spec,
          " (",
          format_bytes(static_cast<double>(run.budget.bytes)),
          "; measured peak ",
          format_bytes(static_cast<double>(peak)),
          "), and model.sync_bn=true disables the OOM replay at a smaller "
          "micro-batch (one rank's re-split micro-batches would no longer "
          "pair with the others' batch-norm all-reduces). Set a smaller "
          "data.batch_size (or data.batch_size=auto with a memory.budget), "
          "a larger memory.budget, or training.gradient_checkpointing=all");
    }
    return detail::concat(
        "out of device memory: the window does not fit memory.budget=",
        run.budget.spec,
        " (",
        format_bytes(static_cast<double>(run.budget.bytes)),
        ") even at micro-batch ",
        micro,
        " after ",
        retries,
        " retries (memory.max_oom_retries=",
        run.cfg.memory.max_oom_retries,
        "); measured peak ",
        format_bytes(static_cast<double>(peak)),
        ". Raise memory.budget, set training.gradient_checkpointing=all or "
        "training.amp=bf16, or use a smaller model");
  };
  int64_t micro = run.shape.micro_batch;
  r.oom_retries = retry_on_oom(how, micro, [&](int64_t m) {
    loss = at::Tensor();
    r.micro_steps = 0;
    r.micro_step_start_bytes.clear();
    run.grad_sync->attach();
    const auto batches = micro_batches(run, wp, m);
    run.loader->expect(wp.epoch, batches);
    const auto before_step = [&](size_t k) {
      r.micro_step_start_bytes.push_back(memory::stats().allocated);
      inject_test_oom(run, c);
      // The last micro-step's backward starts the buckets' all-reduces
      // (Note [Overlapping the boundary all-reduce]).
      if (k + 1 == batches.size() && run.cfg.dist.overlap)
        run.grad_sync->arm();
      ++r.micro_steps;
    };
    // K micro-steps, or the task's own window (Note [Tasks]).
    loss = run.task->accumulate(run, wp, batches, weight, before_step);
  });
  if (micro != run.shape.micro_batch)
    run.shape = run.shape.with_micro(micro);  // for the rest of the run
  // Read the next window while this one's gradient is all-reduced.
  if (next) {
    run.loader->expect_more(
        next->epoch, micro_batches(run, *next, run.shape.micro_batch));
  }
  return loss;
}

// The host's floats `v` as a float32 tensor on the device, without a
// host wait (a page-locked copy on CUDA).
at::Tensor floats_to_device(
    const Placement& placement, const std::vector<float>& v) {
  at::Tensor host;
  {
    memory::HostScope scope;
    host = torch::empty(
        {static_cast<int64_t>(v.size())},
        torch::dtype(torch::kFloat32)
            .pinned_memory(placement.pinned_host_buffers()));
  }
  std::copy(v.begin(), v.end(), host.data_ptr<float>());
  return placement.to_device(host);
}

// What the boundary tells the host, in its one read.
struct Boundary {
  WindowTotals totals;
  bool finite = true;  // loss and gradients (fp16: the scaler's check)
};

// 2. The boundary: one bucketed all-reduce of the gradient, with the
//    window's totals riding in the last bucket (the loss sum straight from
//    the device). Memory is read here, so every rank's figures travel with
//    it. Then the inf/NaN check of the summed gradients (fp16: the
//    scaler's unscale and check) on the device, and one host read of the
//    totals and that verdict (Note [One host read per window]).
Boundary exchange(
    RunState& run,
    RunCounters& c,
    const WindowPlan& wp,
    const at::Tensor& loss,
    const WindowResult& r) {
  const memory::WindowMemory m = c.monitor.end_window();
  // The budget is the whole process's (Note [A budget is the whole
  // process]): what grew outside the allocator since start-up is named here.
  memory::check_device_within(
      run.budget.bytes, run.budget.outside, "memory.budget=" + run.budget.spec);
  c.monitor.begin_window();  // the optimizer step counts in the next window
  RankWindowMemory mine{
      m.allocated, m.reserved, m.peak, m.peak_reserved, r.oom_retries};
  if (run.host_pool) {
    const memory::HostPoolStats h = run.host_pool->stats();
    mine.host_reserved = h.reserved;
    mine.host_peak = h.peak_in_use;
    run.host_pool->reset_peak();
  }
  const memory::HostFigures host = memory::read_host_figures();
  mine.rss = host.rss;
  mine.rss_file = host.rss_file;
  mine.counted = host.counted;
  mine.malloc_free = host.malloc_free;
  mine.malloc_used = host.malloc_used;
  mine.counted_host = host.counted_host;
  mine.rss_peak = host.rss_peak;
  at::Tensor extras = floats_to_device(
      run.placement,
      WindowTotals::pack(
          static_cast<int64_t>(wp.rank_indices.size()),
          stop_signal() != 0,
          mine,
          run.comm.rank(),
          run.comm.size()));
  {
    torch::NoGradGuard no_grad;
    extras.narrow(0, WindowTotals::kLossSlot, 1).copy_(loss);
  }
  const at::Tensor summed = run.grad_sync->sync(extras);
  const at::Tensor found = torch::zeros({1}, summed.options());
  if (run.scaler->enabled()) {
    run.scaler->unscale(run.trainable, found);
  } else {
    run.grad_sync->flag_nonfinite(found);
  }
  // The window's one read, watching the all-reduce for a dead peer.
  const std::vector<double> read = read_to_host(
      torch::cat({summed, found}), [&](const std::function<bool()>& done) {
        run.comm.wait_for_device(done);
      });
  Boundary b;
  b.totals = WindowTotals::unpack(
      std::vector<float>(read.begin(), read.end() - 1), run.comm.size());
  MT_INTERNAL_ASSERT(
      b.totals.samples == wp.global_samples,
      "ranks disagree on the window's samples");
  b.finite = read.back() == 0.0 &&
             (run.scaler->enabled() || std::isfinite(b.totals.loss_sum));
  return b;
}

// 3. The update, unless a loss or gradient is inf/NaN (fp16: the scaler's
//    check); then the gradients are dropped.
void update(
    RunState& run,
    RunCounters& c,
    const WindowPlan& wp,
    bool finite,
    WindowResult& r) {
  LossScaler& scaler = *run.scaler;
  r.loss_scale = scaler.scale();
  // training.lr_schedule: the rate of this window, from its position alone.
  const int64_t wpe = run.sampler->windows_per_epoch();
  r.lr = lr_at(
      run.cfg.training,
      wp.epoch * wpe + wp.window,
      run.cfg.training.epochs * wpe);
  for (auto& group : run.optimizer->param_groups())
    group.options().set_lr(r.lr);
  if (finite) {
    if (run.cfg.training.grad_clip_norm > 0)
      clip_gradients(run.trainable, run.cfg.training.grad_clip_norm);
    run.optimizer->step();
    run.task->after_update();
  }
  r.skipped = !finite;
  scaler.update(finite);
  c.nonfinite_in_a_row = finite ? 0 : c.nonfinite_in_a_row + 1;
  if (!finite) {
    log_event(detail::concat(
        "non-finite loss or gradient in epoch ",
        wp.epoch + 1,
        ", window ",
        wp.window + 1,
        ": update skipped"));
  }
  if (!scaler.enabled() && !finite) {
    ++c.nonfinite_skips;
    MT_CHECK(
        run.cfg.training.nonfinite == Nonfinite::kSkip &&
            c.nonfinite_in_a_row <= run.cfg.training.max_nonfinite_skips,
        "non-finite loss or gradient (NaN/Inf) in epoch ",
        wp.epoch + 1,
        ", window ",
        wp.window + 1,
        " (",
        c.nonfinite_in_a_row,
        " window(s) in a row; training.nonfinite=",
        run.cfg.training.nonfinite,
        ", max_nonfinite_skips=",
        run.cfg.training.max_nonfinite_skips,
        "). The parameters were not updated; the last checkpoint in ",
        run.cfg.output.dir,
        "/checkpoints is the resume point. Check the data "
        "for NaN/Inf values and the learning rate.");
  }
  compat::zero_grad_to_none(*run.optimizer);
}

// The window's record of what every rank saw.
void note_totals(const WindowTotals& t, WindowResult& r) {
  r.loss = t.loss_sum / static_cast<double>(t.samples);
  r.stop_requested = t.stop_requests > 0;  // the same on every rank
  r.mem_allocated = t.max_of(&RankWindowMemory::allocated).value;
  const auto reserved = t.max_of(&RankWindowMemory::reserved);
  r.mem_reserved = reserved.value;
  r.mem_reserved_rank = reserved.rank;
  const auto peak = t.max_of(&RankWindowMemory::peak);
  r.mem_peak = peak.value;
  r.mem_peak_rank = peak.rank;
  r.mem_peak_reserved = t.max_of(&RankWindowMemory::peak_reserved).value;
  r.host_reserved = t.max_of(&RankWindowMemory::host_reserved).value;
  r.host_peak = t.max_of(&RankWindowMemory::host_peak).value;
  const auto rss = t.max_of(&RankWindowMemory::rss);
  const RankWindowMemory& most = t.ranks[static_cast<size_t>(rss.rank)];
  r.host_rss = most.rss;
  r.rss_rank = rss.rank;
  r.host_rss_file = most.rss_file;
  r.host_counted = most.counted;
  r.host_malloc_free = most.malloc_free;
  r.host_malloc_used = most.malloc_used;
  r.host_counted_host = most.counted_host;
  r.host_pool_reserved = most.host_reserved;
  r.host_rss_peak = t.max_of(&RankWindowMemory::rss_peak).value;
  const auto retries = t.max_of(&RankWindowMemory::oom_retries);
  r.oom_retries_max = retries.value;
  r.oom_retries_rank = retries.rank;
  r.oom_retries_total = t.sum_of(&RankWindowMemory::oom_retries);
}

}  // namespace

std::vector<std::vector<int64_t>> micro_batches(
    const RunState& run, const WindowPlan& wp, int64_t micro) {
  if (!run.sync_bn)
    return split_micro_batches(wp.rank_indices, micro);
  // Every rank's batch-norm meets its peers' in every micro-step: the
  // same count on every rank, from what every rank knows (Note
  // [Batch-norm and data parallelism]).
  return split_micro_batches_evenly(
      wp.rank_indices,
      micro_steps_for(wp.global_samples, run.comm.size(), micro));
}

std::vector<int64_t> micro_batch_sizes(const RunState& run, int64_t micro) {
  const ShardedSampler& sampler = *run.sampler;
  const int world = run.comm.size();
  const int64_t e = sampler.effective_batch();
  std::set<int64_t, std::greater<>> sizes;
  for (const int64_t w : {int64_t{0}, sampler.windows_per_epoch() - 1}) {
    WindowPlan wp;
    wp.global_samples = std::min(e, sampler.num_samples() - w * e);
    std::set<int64_t> shares;  // the ranks' slices have at most two lengths
    for (int r = 0; r < world; ++r) {
      const auto [begin, end] = rank_slice(wp.global_samples, r, world);
      shares.insert(end - begin);
    }
    for (const int64_t share : shares) {
      wp.rank_indices.assign(static_cast<size_t>(share), 0);
      for (const auto& mb : micro_batches(run, wp, micro)) {
        if (!mb.empty())
          sizes.insert(static_cast<int64_t>(mb.size()));
      }
    }
  }
  return {sizes.begin(), sizes.end()};
}

// Note [Cache policy]
// Cached blocks are what makes the next window's allocations cheap, and
// releasing them synchronises a CUDA device: so no unconditional
// empty_cache() in the loop. With memory.release_cache=auto they are
// released only when the cached bytes (reserved - allocated) pass
// memory.release_threshold x the budget, and before validation (which
// allocates differently shaped tensors). Count and time are recorded.
void release_cache_if_due(const RunState& run, bool before_validation) {
  if (run.cfg.memory.release_cache != ReleaseCache::kAuto)
    return;
  const memory::Stats s = memory::stats();
  if (before_validation ||
      (run.budget.limited() && static_cast<double>(s.reserved - s.allocated) >
                                   run.cfg.memory.release_threshold *
                                       static_cast<double>(run.budget.bytes))) {
    memory::release_cache();
  }
}

WindowResult run_window(
    RunState& run,
    RunCounters& counters,
    const WindowPlan& wp,
    const WindowPlan* next) {
  const auto start = Clock::now();
  // Note [Host reads seen by the dispatcher] (host_sync.cpp).
  const HostReadWatching watching = host_read_watching();
  const HostReadWatch watch(watching != HostReadWatching::kOff);
  const std::unique_ptr<DeviceClock> clock = run.placement.start_clock();
  const int64_t syncs_before = host_syncs();
  const CommStats before = run.comm.stats();
  WindowResult r;
  r.epoch = wp.epoch;
  r.window = wp.window;
  r.samples = wp.global_samples;

  const at::Tensor loss = accumulate(run, counters, wp, next, r);  // 1.
  clock->mark();
  const Boundary b = exchange(run, counters, wp, loss, r);  // 2.
  clock->mark();
  r.buckets_early = run.grad_sync->launched_early();
  note_totals(b.totals, r);
  update(run, counters, wp, b.finite, r);  // 3.
  clock->mark();
  // Each phase's time as the device ran it (Note [Window clock]).
  const std::vector<double> at = clock->finish();
  r.compute_s = at[1];
  r.comm_exposed_s = at[2] - at[1];
  r.optimizer_s = at[3] - at[2];
  r.host_syncs = host_syncs() - syncs_before;
  if (watch.on()) {
    r.host_syncs_seen = watch.seen();
    const std::string bare = watch.bare();
    if (!bare.empty()) {
      const std::string what = "window " + std::to_string(wp.window) +
                               " of epoch " + std::to_string(wp.epoch) +
                               " read the device from the host outside "
                               "read_to_host(): " +
                               bare;
      MT_CHECK(
          watching != HostReadWatching::kStrict,
          what,
          " (MEMTRAIN_WATCH_HOST_READS=strict). Each is a host sync on a "
          "GPU: keep the value on the device and read it with the window's "
          "totals (Note [One host read per window])");
      log_event("host reads: " + what, /*echo=*/true);
    }
  }

  if (run.cfg.memory.test_leak_kib_per_window > 0) {
    counters.test_leak.push_back(torch::empty(
        {run.cfg.memory.test_leak_kib_per_window * 256},
        torch::TensorOptions().device(run.placement.device())));
  }
  release_cache_if_due(run, /*before_validation=*/false);
  counters.measured_peak =
      std::max(counters.measured_peak, r.mem_peak_reserved);
  r.micro_batch = run.shape.micro_batch;
  r.cache_releases =
      memory::stats().cache_releases - counters.releases_at_start;
  r.allreduce_calls = run.comm.stats().allreduce_calls - before.allreduce_calls;
  r.allreduce_bytes = run.comm.stats().allreduce_bytes - before.allreduce_bytes;
  r.allgather_calls = run.comm.stats().allgather_calls - before.allgather_calls;
  r.allgather_bytes = run.comm.stats().allgather_bytes - before.allgather_bytes;
  r.syncbn_calls = run.comm.stats().syncbn_calls - before.syncbn_calls;
  r.syncbn_bytes = run.comm.stats().syncbn_bytes - before.syncbn_bytes;
  r.data_wait_s = run.loader->take_wait_seconds();
  r.seconds = seconds_since(start);
  return r;
}

}  // namespace memtrain
