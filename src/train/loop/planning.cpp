#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <map>

#include "memtrain/compat.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/memory/host_pool.h"
#include "memtrain/util/error.h"
#include "train/state/run_state.h"

namespace memtrain {
namespace {

// The model checkpoints as `tier` says (Note [Planning]).
void set_tier(Classifier& model, const Tier& tier) {
  model.set_checkpointed(tier.segments);
  model.set_recompute(
      tier.selective ? Recompute::kSelective
      : tier.offload ? Recompute::kAllOffload
                     : Recompute::kAll);
}

// cuDNN's benchmark search (the first step of a new shape) tries
// algorithms with workspaces sized from the free memory, not what the
// chosen ones use (Note [Planning]).
bool cudnn_searches(const RunState& run) {
  return run.placement.is_cuda() && at::globalContext().benchmarkCuDNN();
}

// Two forward/backward/optimizer steps at `micro_batch` with `tier` of
// checkpointing, against the usable budget, on the same samples on every
// rank; everything is put back as it was. See Note [Planning].
ProbeResult probe(RunState& run, int64_t micro_batch, const Tier& tier) {
  const int64_t usable = run.budget.usable();
  // Parameters and buffers (batch-norm statistics move in the probes' steps).
  std::vector<at::Tensor> state = run.params;
  state.insert(state.end(), run.buffers.begin(), run.buffers.end());
  std::vector<at::Tensor> saved;
  {
    torch::NoGradGuard no_grad;
    for (const auto& p : state)
      saved.push_back(run.placement.to_host(p.detach()));
  }
  std::vector<int64_t> indices(micro_batch);
  for (int64_t i = 0; i < micro_batch; ++i) {
    indices[i] = i % run.sampler->num_samples();
  }
  set_tier(*run.model, tier);
  memory::set_cap(usable);
  memory::release_cache();
  memory::reset_peak();
  if (run.host_pool)
    run.host_pool->reset_peak();
  bool ran = true, host_exceeded = false;
  double step_s = 0, optimizer_s = 0;
  // With cuDNN searching, the peak is the second step's alone, which finds
  // the choice cached, as every window after it does.
  const bool searched = cudnn_searches(run);
  {
    memory::DeviceScope device;
    auto opt = make_optimizer(run.cfg.training, run.trainable);
    try {
      // Two steps: the second runs with the optimizer state the first
      // created, which is what every later window looks like; it is timed
      // as the device runs it (Note [Window clock]): its forward and
      // backward, and its optimizer step, which a window runs once for
      // the rank's share, not once per micro-batch.
      for (int step = 0; step < 2; ++step) {
        std::unique_ptr<DeviceClock> clock;
        if (step == 1 && searched) {
          memory::release_cache();
          memory::reset_peak();
        }
        if (step == 1)
          clock = run.placement.start_clock();
        run.grad_sync->attach();
        micro_step(
            run,
            0,
            indices,
            1.0 / static_cast<double>(micro_batch),
            zero_loss_sum(run));
        if (clock)
          clock->mark();
        opt->step();
        if (clock) {
          clock->mark();
          const std::vector<double> t = clock->finish();
          step_s = t.at(1);  // t[0]: the start
          optimizer_s = t.at(2) - t.at(1);
        }
      }
    } catch (const c10::OutOfMemoryError&) {
      ran = false;
      drop_failed_backward(run.placement.device());
    } catch (const memory::HostBudgetExceeded&) {
      ran = false;
      host_exceeded = true;
    }
    compat::zero_grad_to_none(*opt);
  }
  const int64_t peak = memory::stats().peak_reserved;
  const int64_t host_bytes =
      run.host_pool ? run.host_pool->stats().peak_in_use : 0;
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < state.size(); ++i)
      state[i].copy_(saved[i]);
  }
  memory::release_cache();
  memory::set_cap(run.budget.allocator_cap());
  // On the CPU device the loader's buffers for this micro-batch take from
  // the same memory (host_deficit).
  const int64_t deficit = host_deficit(run, micro_batch, host_bytes);
  return {
      ran && (usable <= 0 || peak + deficit <= usable),
      peak,
      ran ? step_s / static_cast<double>(micro_batch) +
                optimizer_s / static_cast<double>(run.shape.rank_share)
          : 0.0,
      !ran && !host_exceeded,
      host_bytes,
      host_exceeded};
}

// model.sync_bn: probes run on each rank's own terms (one rank's OOM must
// not leave its peers in a batch-norm all-reduce): local statistics,
// through the same code and so the same memory, for as long as it lives.
class LocalBatchNorm {
 public:
  explicit LocalBatchNorm(Classifier& model)
      : model_(model), saved_(model.batch_norm_sync()) {
    if (saved_)
      model_.set_batch_norm_sync(local_batch_norm_sync(), "");
  }
  ~LocalBatchNorm() {
    if (saved_)
      model_.set_batch_norm_sync(saved_, "");
  }
  LocalBatchNorm(const LocalBatchNorm&) = delete;
  LocalBatchNorm& operator=(const LocalBatchNorm&) = delete;

 private:
  Classifier& model_;
  BatchNormSync saved_;
};

// Runs `fn` (probes) on this rank's own terms -- local batch-norm, the
// generators put back, the probes' reads not counted as data waits --
// then takes every rank's word on it: an error on any rank stops all,
// `what` naming what failed on another.
void locally(RunState& run, const char* what, const std::function<void()>& fn) {
  std::string error;
  const RngState rng = run.placement.rng_state();
  try {
    const LocalBatchNorm local(*run.model);
    fn();
  } catch (const Error& e) {
    error = e.what();
  }
  run.placement.set_rng_state(rng);
  run.loader->take_wait_seconds();
  if (!all_ranks_ok(run.comm, error.empty())) {
    if (error.empty())
      throw PeerError(detail::concat(what, " failed on another rank"));
    throw Error(error);
  }
}

// Note [Planning the extraction chunk]
// A frozen extraction (dinov3's backbone over a micro-batch's slices)
// keeps no activations: its transient grows with the units a call takes,
// not with the micro-batch the head trains on, and more units a call only
// run faster. So with a budget and model.slice_chunk auto, the micro-batch
// and tier are planned with one unit a call (the least the extraction
// holds); then, at the agreed micro-batch and tier, the chunk is doubled
// from 1 while a probe fits and the micro-batch's units are not all in one
// call, and bisected between the last that fit and the first that did
// not. The ranks take the smallest, and its probe's peak, where above the
// micro-batch's, becomes the predicted one (the host plan sizes the CPU
// device from it). A window's smaller micro-batches have fewer units, so
// the chunk fits them too. Not measured: validation runs the chunk on
// validation.roi's slices, which may be wider than the patch's; and the
// micro-batch comes first, so a budget it fills leaves small chunks (more
// backbone calls, slower) -- a fixed data.batch_size trades back. Without
// a budget, or with model.slice_chunk set, nothing is probed.
using ChunkProbes = std::map<int64_t, ProbeResult>;

int64_t plan_chunk(RunState& run, const Tier& tier, ChunkProbes& probes) {
  const int64_t micro = run.plan.micro_batch;
  if (!run.plan.fits)
    return 1;
  return largest_chunk(run.model->chunk_units(micro), [&](int64_t chunk) {
    run.model->set_chunk(chunk);
    const ProbeResult r = probe(run, micro, tier);
    probes[chunk] = r;
    run.plan.probes.push_back(
        {micro,
         tier,
         r.fits,
         r.peak,
         r.seconds_per_sample,
         r.host_bytes,
         chunk});
    return r.fits;
  });
}

}  // namespace

void warm_up_host_plan(RunState& run) {
  if (!run.budget.limited() || run.placement.is_cuda() ||
      run.host_plan.budget <= 0)
    return;
  locally(run, "the host plan's warm-up", [&run] {
    // 2 samples where the share has them: LibTorch 1.13 convolves one 3D
    // sample without oneDNN, whose kernels and caches are the growth.
    // An out-of-memory is caught: it warmed up too.
    probe(run, std::min<int64_t>(2, run.shape.rank_share), Tier{});
  });
  fit_host_before_planning(run);
}

namespace {

// The chunk every rank can run (plan_chunk on each, the smallest), set on
// the model and written into the plan.
void agree_chunk(RunState& run, const Tier& tier) {
  MemoryPlan& plan = run.plan;
  ChunkProbes probes;
  const char* what = "planning model.slice_chunk";
  int64_t chunk = 1;
  locally(run, what, [&] { chunk = plan_chunk(run, tier, probes); });
  auto least = torch::tensor({-chunk}, torch::kInt64);
  run.comm.all_reduce(least, ReduceOp::kMax);
  chunk = -least[0].item<int64_t>();
  // Another rank's smaller chunk, where this rank did not probe it.
  if (plan.fits && probes.count(chunk) == 0) {
    locally(run, what, [&] {
      run.model->set_chunk(chunk);
      probes[chunk] = probe(run, plan.micro_batch, tier);
    });
  }
  if (probes.count(chunk) != 0)
    plan.predicted_peak = std::max(plan.predicted_peak, probes[chunk].peak);
  plan.chunk = chunk;
  plan.chunk_units = run.model->chunk_units(plan.micro_batch);
  run.model->set_chunk(chunk);
  plan.note += detail::concat(
      "; model.slice_chunk auto: ",
      chunk,
      " of the micro-batch's ",
      plan.chunk_units,
      " slices a backbone call");
}

// Note [Planning the faster form]
// A model with a lean and a faster form (Classifier::has_lean_form; the
// U-Net's split or concatenated decoder input, Note [U-Net decoder
// input]) is planned in the lean form, the one that fits most. Then, at
// the agreed micro-batch and tier, the faster form is probed at every
// micro-batch size a window runs; where it fits on every rank, the run
// takes it, and the predicted peak and host bytes become the larger of
// the two forms' (conservative: the lean form's also fit). So a budget
// costs time only where the memory is needed: the faster form never runs
// where it would not fit, and the lean form's larger micro-batch or
// cheaper tier, where the search found one, is kept (the faster form is
// asked about that plan, not about a plan of its own). Without a budget
// nothing is probed and the run takes the faster form.
void agree_form(RunState& run, const Tier& tier) {
  MemoryPlan& plan = run.plan;
  bool fits = plan.fits;
  int64_t peak = 0, host_bytes = 0;
  locally(run, "probing the model's faster form", [&] {
    run.model->set_memory_lean(false);
    std::vector<int64_t> sizes = {plan.micro_batch};
    for (const int64_t k : plan.window_micro_batches) {
      if (std::find(sizes.begin(), sizes.end(), k) == sizes.end())
        sizes.push_back(k);
    }
    for (const int64_t k : sizes) {
      if (!fits)
        break;
      const ProbeResult r = probe(run, k, tier);
      ProbeRecord record{
          k, tier, r.fits, r.peak, r.seconds_per_sample, r.host_bytes};
      record.chunk = plan.chunk;
      record.faster_form = true;
      plan.probes.push_back(record);
      fits = r.fits;
      peak = std::max(peak, r.peak);
      host_bytes = std::max(host_bytes, r.host_bytes);
    }
  });
  fits = all_ranks_ok(run.comm, fits);
  run.model->set_memory_lean(!fits);
  plan.form = fits ? "faster" : "lean";
  if (fits) {  // the larger of the two forms' peaks: the host plan's too
    plan.predicted_peak = std::max(plan.predicted_peak, peak);
    plan.predicted_host_bytes = std::max(plan.predicted_host_bytes, host_bytes);
  }
  plan.note += fits ? "; the model's faster form fits this plan: taken"
                    : "; the model's faster form does not fit this plan: "
                      "the lean form";
}

}  // namespace

void plan_run(RunState& run, bool faster_forms) {
  // Planned in the lean form (Note [Planning the faster form]); a second
  // plan (the host plan's) starts from it again.
  run.model->set_memory_lean(run.budget.limited() || !faster_forms);
  PlanRequest req;
  req.rank_share = run.shape.rank_share;
  // kAuto (0) means search; a fixed micro-batch larger than the rank's share
  // of a window is the share (a micro-batch never spans windows).
  req.fixed_micro = run.cfg.data.batch_size == kAuto
                        ? kAuto
                        : std::min(run.cfg.data.batch_size, req.rank_share);
  req.checkpointing = run.cfg.training.gradient_checkpointing;
  req.num_segments = run.model->num_segments();
  req.window_micro_batches = [&run](int64_t micro) {
    return micro_batch_sizes(run, micro);
  };
  const std::vector<Tier> ladder =
      tier_ladder(req.checkpointing, req.num_segments);
  // Note [Planning the extraction chunk]: one unit a call until the
  // micro-batch is agreed.
  const bool chunked = run.budget.limited() && run.model->chunk_units(1) > 0 &&
                       run.cfg.model.slice_chunk == kAuto;
  if (chunked)
    run.model->set_chunk(1);

  // Plan locally (every rank probes the same samples), then agree: the
  // smallest micro-batch and the most checkpointing any rank needs.
  // Probes run forward passes, which draw from the generators (dropout):
  // locally() puts them back, so that planning does not change what
  // training computes.
  MemoryPlan& plan = run.plan;
  locally(run, "memory planning", [&] {
    if (run.budget.limited()) {
      plan = plan_memory(req, [&](int64_t micro, const Tier& tier) {
        return probe(run, micro, tier);
      });
    } else {
      plan.micro_batch = req.fixed_micro;
      // off, all, selective: their one tier; auto: none.
      plan.tier_index = 0;
      plan.memory_micro_batch = plan.micro_batch;
      plan.memory_tier_index = 0;
      plan.note =
          req.checkpointing == Checkpointing::kAuto
              ? "no memory.budget: checkpointing auto checkpoints nothing"
              : "no memory.budget: nothing measured";
    }
  });
  // The tiers are ordered by depth: the smallest micro-batch and the
  // deepest tier any rank needs. Ranks whose timings (Note [Planning])
  // chose differently take the plan by memory alone, which equal budgets
  // make equal, instead of a mix that no rank measured.
  auto agreed = torch::tensor(
      {-plan.micro_batch,
       plan.tier_index,
       plan.micro_batch,
       -plan.tier_index,
       -plan.memory_micro_batch,
       plan.memory_tier_index},
      torch::kInt64);
  run.comm.all_reduce(agreed, ReduceOp::kMax);
  const auto at = [&](int64_t i) { return agreed[i].item<int64_t>(); };
  if (-at(0) == at(2) && at(1) == -at(3)) {
    plan.micro_batch = at(2);
    plan.tier_index = at(1);
  } else {
    plan.micro_batch = -at(4);
    plan.tier_index = at(5);
    plan.note += "; the ranks' timings chose differently: the plan by memory";
  }
  if (run.budget.limited() && cudnn_searches(run))
    plan.note +=
        "; cuDNN benchmark on: each probe's peak is its second step's, "
        "after the algorithm search of the first";
  const Tier& tier = ladder.at(static_cast<size_t>(plan.tier_index));
  plan.checkpointed_segments = tier.segments;
  plan.selective = tier.selective;
  plan.offload = tier.offload;
  run.shape = run.shape.with_micro(plan.micro_batch);
  plan.window_micro_batches = micro_batch_sizes(run, plan.micro_batch);
  plan.accumulation_steps = run.shape.accumulation_steps;
  set_tier(*run.model, tier);
  if (chunked)
    agree_chunk(run, tier);
  if (run.model->has_lean_form()) {
    if (run.budget.limited() && faster_forms) {
      agree_form(run, tier);
    } else {
      plan.form = faster_forms ? "faster" : "lean";
      plan.note += faster_forms ? "; the model's faster form"
                                : "; the model's lean form (the faster one "
                                  "not asked)";
    }
  }
  // The probes' forward passes are not the first window's phases.
  (void)run.model->take_phase_peaks();
  // The probes' blocks go; training reserves what its micro-steps offload
  // once, in its first (Note [Host offload]).
  if (run.host_pool)
    run.host_pool->trim();
}

}  // namespace memtrain
